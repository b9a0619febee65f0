"""The kernel folder's manifest lists every file with its size and SHA-256, whether a device
wrote it through :func:`onnx_cinm.devices.write_kernel_file` (hashed from the bytes in memory)
or on its own (read back from disk): checked here against the files as they are on disk,
hashed independently with hashlib."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from onnx_cinm import artifacts, optimize
from onnx_cinm.devices import json_text, recorded_writes, write_kernel_file
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


def test_write_kernel_file_takes_a_string_path(tmp_path):
    with recorded_writes() as log:
        p = write_kernel_file(os.fspath(tmp_path / "s.txt"), "text")
    assert p == tmp_path / "s.txt" and isinstance(p, Path)
    assert log == {os.fspath(p): (4, hashlib.sha256(b"text").hexdigest())}


@pytest.mark.parametrize("value", [
    {}, [], (), {"a": [], "b": {}, "c": ()}, [[], [{}], [[[]]]], "x", 7, None, True,
    {"s": "quote \" backslash \\ newline \n tab \t nul \x00 bidi \u202e é 😀", "n": -12345678901234567890},
    {"f": [0.1, -0.0, 1e300, 5e-324, float("nan"), float("inf"), float("-inf")], "b": [True, False]},
    {"kernels": [{"node": "conv/1", "files": [{"path": "upmem/0001_x/host.c", "bytes": 10,
                                               "sha256": "ab" * 32}]}]},
    {1: "int key"}, {"outer": {2.5: "float key", None: 0}},  # keys json converts: its own text
])
def test_json_text_is_json_dumps_with_indent_1(value):
    """The manifest and kernel.json text: json's own, written by json.dumps(indent=1)."""
    assert json_text(value) == json.dumps(value, indent=1) + "\n"


def test_json_text_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        json_text({"a": np.int64(1)})


def test_manifest_paths_of_unnormalized_strings(lenet, tmp_path, monkeypatch):
    """A device may return its paths as strings, not normalized (``dir/./file``): the manifest
    lists each file by its normalized path in the folder, as for a Path."""
    from onnx_cinm.devices import memristor

    def dotted(path, data):
        write_kernel_file(path, data)
        head, tail = os.path.split(os.fspath(path))
        return os.path.join(head, ".", tail)

    recorded = artifacts.emit(lenet, tmp_path / "a")
    monkeypatch.setattr(memristor, "write_kernel_file", dotted)
    assert artifacts.emit(lenet, tmp_path / "b") == recorded


def _copy(model):
    import onnx
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def test_save_writes_the_model_a_straight_write_gives(lenet, tmp_path):
    """save writes the model before its kernels, with a stand-in digest written over once
    they are: the file is byte for byte what writing the finished model gives."""
    import onnx

    from onnx_cinm import frontend
    model = _copy(lenet)
    manifest = artifacts.save(model, tmp_path / "a.onnx")
    frontend.save_model(model, tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert artifacts.recorded_digest(onnx.load(tmp_path / "a.onnx")) == \
        artifacts.kernel_digest(manifest) == artifacts.kernel_digest(
            artifacts.load_manifest(tmp_path / "a.cinm"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.cinm", "a.onnx", "b.onnx"]


def test_save_writes_again_when_the_stand_in_is_not_found_once(lenet, tmp_path):
    """A model that holds the stand-in's bytes itself (here in another metadata entry) cannot
    be patched: it is written again, whole, with its digest."""
    import onnx

    from onnx_cinm import frontend
    model = _copy(lenet)
    model.metadata_props.add(key="copy", value=artifacts._digest_entry(artifacts._PENDING).decode())
    manifest = artifacts.save(model, tmp_path / "a.onnx")
    frontend.save_model(model, tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert artifacts.recorded_digest(onnx.load(tmp_path / "a.onnx")) == \
        artifacts.kernel_digest(manifest)


def _save_failing_in_emit(model, tmp_path, monkeypatch) -> None:
    """``artifacts.save`` of ``model`` to ``tmp_path/a.onnx`` with its kernel emit failing:
    the one-line CinmError."""
    from onnx_cinm.errors import CinmError

    def fail(*args):
        raise CinmError("emit failed")

    monkeypatch.setattr(artifacts, "_emit", fail)
    with pytest.raises(CinmError, match="emit failed"):
        artifacts.save(model, tmp_path / "a.onnx")


def test_a_failed_save_leaves_no_file_and_the_model_as_given(lenet, tmp_path, monkeypatch):
    model = _copy(lenet)
    given = model.SerializeToString()

    _save_failing_in_emit(model, tmp_path, monkeypatch)
    assert list(tmp_path.iterdir()) == []  # no model, no folder, no temporaries
    assert model.SerializeToString() == given


def test_a_failed_save_keeps_a_saved_models_metadata_in_its_order(lenet, tmp_path, monkeypatch):
    """A model saved before records its digest between other metadata entries: after a save
    that fails, its metadata_props are the very entries they were, in their order (the digest
    was put back last)."""
    model = _copy(lenet)
    entries = [(p.key, p.value) for p in model.metadata_props]
    del model.metadata_props[:]
    for key, value in [("before", "1"), (artifacts.DIGEST_KEY, "a" * 64), ("after", "2"), *entries]:
        model.metadata_props.add(key=key, value=value)
    given = model.SerializeToString()

    _save_failing_in_emit(model, tmp_path, monkeypatch)
    assert [(p.key, p.value) for p in model.metadata_props][:3] == \
        [("before", "1"), (artifacts.DIGEST_KEY, "a" * 64), ("after", "2")]
    assert model.SerializeToString() == given


def test_constants_answer_in_without_converting(monkeypatch):
    """A device asks ``name in consts`` for every input: answered from the names, the weight
    converted to numpy only when read."""
    from onnx import numpy_helper
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    consts = artifacts._Constants({"w": w, "other": w}, ["x", "w", "w"])
    converted, to_array = [], numpy_helper.to_array
    monkeypatch.setattr(artifacts.numpy_helper, "to_array",
                        lambda t: converted.append(t.name) or to_array(t))
    assert "w" in consts and "x" not in consts and "other" not in consts
    assert converted == [] and list(consts) == ["w"] and len(consts) == 1
    assert consts["w"].tolist() == [[0, 1, 2], [3, 4, 5]] and converted == ["w"]
