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
    {"shape": [1, 2, 3], "names": ["a", "b"], "mixed": [1, "x", None, 2.5, [3], True, -7, ""]},
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


@pytest.mark.parametrize("data", ["", "ünïcode line\n" * 300, b"\x00\xff" * 5000, bytearray(b"ba"),
                                  np.arange(7, dtype=np.float32).view(np.uint8)])
def test_write_kernel_file_writes_what_open_writes(tmp_path, data):
    """Written through the descriptor: the bytes and the permissions ``open(path, "wb")``
    gives, over a longer file too (truncated)."""
    raw = data.encode() if isinstance(data, str) else bytes(memoryview(data))
    (tmp_path / "old").write_bytes(b"x" * 20000)
    for name in ("new", "old"):
        write_kernel_file(tmp_path / name, data)
        with open(tmp_path / f"{name}.ref", "wb") as f:
            f.write(raw)
        assert (tmp_path / name).read_bytes() == raw
        assert os.stat(tmp_path / name).st_mode == os.stat(tmp_path / f"{name}.ref").st_mode


def test_write_kernel_file_raises_what_open_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_kernel_file(tmp_path / "missing" / "f", "x")
    with pytest.raises(IsADirectoryError):
        write_kernel_file(tmp_path, "x")


def test_write_kernel_file_stops_on_a_write_that_makes_no_progress(tmp_path, monkeypatch):
    """``os.write`` returning 0 (never on a regular file) is an OSError, not an endless loop;
    a short write is continued until every byte is written."""
    from onnx_cinm.devices import base

    real = os.write
    monkeypatch.setattr(base.os, "write", lambda fd, b: real(fd, bytes(b)[:3]))
    write_kernel_file(tmp_path / "short", "abcdefgh")
    assert (tmp_path / "short").read_bytes() == b"abcdefgh"
    monkeypatch.setattr(base.os, "write", lambda fd, b: 0)
    with pytest.raises(OSError, match="no bytes written"):
        write_kernel_file(tmp_path / "stuck", "abc")


_UPMEM_KERNELS = [  # (kind, dtype, shapes, params): varied templates, dtypes and broadcasts
    ("binary", "float32", [(2, 3, 4), (3, 1)], {"op": "Add"}),
    ("binary", "int32", [(2, 3, 4), (2, 3, 4)], {"op": "Max"}),
    ("binary", "int8", [(5, 1), (1, 6)], {"op": "Div"}),
    ("unary", "float32", [(4, 5)], {"op": "Relu"}),
    ("unary", "float32", [(4, 6)], {"op": "Relu"}),
    ("unary", "float32", [(64,)], {"op": "Clip", "min": -1.0, "max": 2.5}),
    ("unary", "int64", [(9,)], {"op": "Clip", "min": 0, "max": 4}),
    ("unary", "float32", [(3, 7)], {"op": "Exp"}),
    ("gemm", "float32", [(2, 3, 4), (2, 4, 5)], {}),
    ("gemm", "int32", [(6, 4), (4, 5)], {"relu": True}),
    ("reduce", "float32", [(4, 6)], {"reduce": "max", "axes": [1], "keepdims": 1}),
    ("transpose", "int32", [(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}),
    ("softmax", "float32", [(3, 10)], {}),
]


def _emit_upmem_kernels(root: Path, dpus: int) -> dict:
    from onnx_cinm.devices.upmem import codegen

    for i, (kind, dtype, shapes, params) in enumerate(_UPMEM_KERNELS * 2):
        codegen.emit_kernel(kind, dtype, shapes, dpus=dpus, tasklets=4, block_bytes=256,
                            outdir=root / f"{i:02d}", **params)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_upmem_templates_render_as_jinja_renders_them(tmp_path, monkeypatch):
    """Rendered through devices.render and looked up by context (every kernel twice: the second
    time from the memo): the files Jinja's own Template.render gives, unmemoized."""
    from onnx_cinm.devices.upmem.codegen import common

    fast = {d: _emit_upmem_kernels(tmp_path / f"fast{d}", d) for d in (1, 3)}
    monkeypatch.setattr(common, "render", lambda template, **context: template.render(**context))
    monkeypatch.setattr(common, "_context_key", lambda k: None)
    monkeypatch.setattr(common, "_RENDERED", {})
    for d in (1, 3):
        slow = _emit_upmem_kernels(tmp_path / f"slow{d}", d)
        assert len(slow) > 4 * len(_UPMEM_KERNELS) and fast[d] == slow


def test_crossbar_kernels_render_as_jinja_renders_them(lenet, tmp_path, monkeypatch):
    from onnx_cinm.devices.memristor import codegen

    fast = artifacts.emit(lenet, tmp_path / "a")
    monkeypatch.setattr(codegen, "render_template",
                        lambda template, **context: template.render(**context))
    assert artifacts.emit(lenet, tmp_path / "b") == fast


def test_render_raises_what_jinja_raises():
    import jinja2

    from onnx_cinm.devices import base

    t = base.template_environment().from_string("{{ a.b }} {{ range(2) | list }}")
    assert base.render(t, a={"b": 1}) == t.render(a={"b": 1}) == "1 [0, 1]"
    with pytest.raises(jinja2.UndefinedError) as fast:
        base.render(t, a=None)
    with pytest.raises(jinja2.UndefinedError) as slow:
        t.render(a=None)
    assert str(fast.value) == str(slow.value)


def test_crossbar_params_from_options_remembered_as_computed():
    """params_from_options answers from its memo what it computes afresh, per base."""
    from onnx_cinm.devices import memristor
    from onnx_cinm.devices.memristor import presets

    cases = [({}, presets.DEFAULT), ({"cim_crossbars": 8}, presets.DEFAULT),
             ({"cim_rows": 128, "cim_cols": 32}, presets.DEFAULT),
             ({"cim_preset": "reram-isaac", "cim_crossbars": 2}, presets.DEFAULT),
             ({"cim_crossbars": 8}, presets.RERAM_ISAAC), ({"cim_rows": 256}, presets.RERAM_ISAAC)]
    first = [memristor.params_from_options(o, b) for o, b in cases]
    again = [memristor.params_from_options(dict(o), b) for o, b in cases]
    memristor._PARAMS.clear()
    fresh = [memristor.params_from_options(o, b) for o, b in cases]
    assert first == again == fresh
    assert fresh[1].crossbars == 8 and fresh[4].crossbars == 8 and fresh[4] != fresh[1]
    assert (fresh[2].rows, fresh[2].cols, fresh[5].rows) == (128, 32, 256)


@pytest.mark.parametrize("bias", [None, "model:c%20"])
def test_crossbar_text_filled_in_is_the_text_rendered_with_the_names(bias):
    """codegen.render (the fixed text rendered once with stand-ins, the names put in) gives
    what Jinja renders with the names themselves, for names that look like the stand-ins."""
    from onnx_cinm.devices.memristor import PCM_OCC, codegen
    from onnx_cinm.paradigms.cim.schedule import plan

    for p, name, src in [(plan(5, 300, 70, PCM_OCC, "weight_stationary", groups=2), "k 1", "w"),
                         (plan(3, 9, 4, PCM_OCC, "naive", m_block=2), "\0name\0", "\0bias\0"),
                         (plan(1, 9, 4, PCM_OCC, "weight_stationary"), "{{ x }}", "model:a#b")]:
        slow = codegen.template("memristor/kernel.xbar.j2").render(
            version=codegen.FORMAT_VERSION, name=name, plan=p, cost_lines="".join(
                f"cost {k} {float(getattr(PCM_OCC, k))!r}\n" for k in codegen.COST_KEYS),
            load_lines="".join(f"PROGRAM {t['x']} W {t['g']} {t['k']} {t['n']}\n"
                               for t in codegen.schedule_rounds(p)[0]),
            round_lines="".join("".join(f"PROGRAM {t['x']} W {t['g']} {t['k']} {t['n']}\n"
                                        f"MVM {t['x']} X {t['g']} {t['k']}\n"
                                        f"ACC Y {t['g']} {t['n']} {t['x']}\n" for t in r)
                                + "BARRIER\n" for r in codegen.schedule_rounds(p)[1]),
            order="fixed" if p.loop_order == "naive" or p.resident else "serpentine",
            residency="off" if p.loop_order == "naive" else "on",
            loop_rows=p.m_block if p.loop_order == "naive" else 0, weight_file=src,
            bias={"name": "C", "file": bias} if bias else None, dtype="float32",
            mode_lines="".join(f"{k} {v}\n" for k, v in codegen.IDEAL.header_items()))
        assert codegen.render(p, PCM_OCC, name, src, bias) == slow


def test_crossbar_kernels_planned_once_per_shape_emit_what_each_alone_emits(lenet, tmp_path,
                                                                           monkeypatch):
    """A save plans and renders each crossbar shape once (its memo): the files are those
    of kernels planned and rendered one by one (no memo)."""
    from onnx_cinm.devices import memristor

    fast = artifacts.emit(lenet, tmp_path / "a")
    monkeypatch.setattr(memristor, "emit_memo", lambda owner: {})
    assert artifacts.emit(lenet, tmp_path / "b") == fast
    assert any(k["device"] == "memristor" for k in fast["kernels"])


def test_emit_memo_lives_for_one_recorded_writes_context():
    from onnx_cinm.devices import emit_memo

    emit_memo("x")["k"] = 1
    assert emit_memo("x") == {}  # outside a context: nothing kept
    with recorded_writes():
        emit_memo("x")["k"] = 1
        assert emit_memo("x") == {"k": 1} and emit_memo("y") == {}
    with recorded_writes():
        assert emit_memo("x") == {}


def test_crossbar_plans_of_one_text_key_render_one_text():
    """Plans that differ only in the rows streamed (not written in the file) have one
    text_key and one text; plans that differ in what is written have different keys."""
    from onnx_cinm.devices.memristor import PCM_OCC, codegen
    from onnx_cinm.paradigms.cim.schedule import plan

    for order, kw in (("weight_stationary", {}), ("naive", {"m_block": 4})):
        for shared in (False, True):
            for K, N, G in ((9, 4, 1), (300, 70, 2), (1200, 32, 1)):
                ps = [plan(m, K, N, PCM_OCC, order, groups=G, shared=shared, **kw)
                      for m in (1, 7, 64, 3136)]
                texts = {codegen.render(p, PCM_OCC, "k", "w", "c") for p in ps}
                keys = {codegen.text_key(p) for p in ps}
                assert len(keys) == len(texts)
    a, b = (plan(7, 300, 70, PCM_OCC, "weight_stationary", crossbars=c) for c in (2, 64))
    assert codegen.text_key(a) != codegen.text_key(b)
