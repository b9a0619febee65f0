"""The kernel folder's manifest lists every file with its size and SHA-256, whether a device
wrote it through :func:`onnx_cinm.devices.write_kernel_file` (hashed from the bytes in memory)
or on its own (read back from disk): checked here against the files as they are on disk,
hashed independently with hashlib."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from onnx_cinm import artifacts, optimize
from onnx_cinm.devices import recorded_writes, write_kernel_file
from onnx_cinm.examples import get_example


@pytest.fixture(scope="module")
def lenet():
    """LeNet optimized with the heuristic: kernels on the memristor and on UPMEM."""
    return optimize(get_example("lenet"), placement="heuristic").model


def _on_disk(root: Path) -> dict:
    """``{relative path: (bytes, sha256)}`` of every file under ``root`` but the manifest."""
    out = {}
    for p in root.rglob("*"):
        if p.is_file() and p.name != artifacts.MANIFEST:
            data = p.read_bytes()
            out[p.relative_to(root).as_posix()] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def _listed(manifest: dict) -> dict:
    return {f["path"]: (f["bytes"], f["sha256"]) for k in manifest["kernels"] for f in k["files"]}


def test_manifest_matches_the_files_on_disk(lenet, tmp_path):
    manifest = artifacts.emit(lenet, tmp_path / "k")
    devices = {k["device"] for k in manifest["kernels"]}
    assert {"memristor", "upmem"} <= devices  # both devices' writers are covered
    assert _listed(manifest) == _on_disk(tmp_path / "k")


def test_files_a_device_writes_on_its_own_are_read_back(lenet, tmp_path, monkeypatch):
    """A device that writes without write_kernel_file (a plugin, say) gets the same manifest:
    its files are hashed from disk."""
    from onnx_cinm.devices import memristor
    from onnx_cinm.devices.upmem.codegen import common

    def plain(path, data):  # writes, records nothing
        path = Path(path)
        path.write_bytes(data.encode() if isinstance(data, str) else bytes(memoryview(data)))
        return path

    recorded = artifacts.emit(lenet, tmp_path / "a")
    monkeypatch.setattr(memristor, "write_kernel_file", plain)
    monkeypatch.setattr(common, "write_kernel_file", plain)
    read_back = artifacts.emit(lenet, tmp_path / "b")
    assert read_back == recorded
    assert _listed(read_back) == _on_disk(tmp_path / "b")


def test_write_kernel_file_records_what_it_wrote(tmp_path):
    text, raw = "ünïcode line\n", np.arange(5, dtype=np.int64)
    with recorded_writes() as log:
        a = write_kernel_file(tmp_path / "a.txt", text)
        b = write_kernel_file(tmp_path / "b.bin", raw.reshape(-1).view(np.uint8))
        write_kernel_file(tmp_path / "c.bin", b"first")
        write_kernel_file(tmp_path / "c.bin", b"second!")  # the last write wins
    write_kernel_file(tmp_path / "d.bin", b"outside")  # not recorded
    assert a.read_bytes() == text.encode("utf-8")
    assert b.read_bytes() == raw.tobytes()
    assert log == {os.fspath(tmp_path / n): (len(d), hashlib.sha256(d).hexdigest())
                   for n, d in (("a.txt", text.encode("utf-8")), ("b.bin", raw.tobytes()),
                                ("c.bin", b"second!"))}
