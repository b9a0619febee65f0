"""Hostile kernel manifests and placement configs through the CLI.

``onnx-cinm run`` trusts nothing in ``<model>.cinm/manifest.json`` beyond what it checks: a
manifest with the right format and version but a broken structure, or a file path leaving the
kernel folder (absolute, ``..``, a symlink), is refused with exit 1 and one line naming the
manifest and what is wrong -- never an internal error, and never opening or hashing a file
outside the folder. ``optimize --place-config FILE`` reads ``.toml`` as TOML and everything else
as JSON, and a file that is not UTF-8 text is a one-line error too, with nothing written.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import onnx
import pytest

from onnx_cinm import artifacts, optimize
from onnx_cinm.cli import main
from onnx_cinm.errors import CinmError
from onnx_cinm.examples import get_example


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """LeNet optimized with the heuristic (kernels on memristor and UPMEM) and saved."""
    d = tmp_path_factory.mktemp("built")
    res = optimize(get_example("lenet"), placement="heuristic")
    artifacts.save(res.model, d / "h.onnx")
    return d


@pytest.fixture
def model(built, tmp_path) -> Path:
    """A private copy of the built model and its kernel folder, free to spoil."""
    shutil.copy(built / "h.onnx", tmp_path / "h.onnx")
    shutil.copytree(built / "h.cinm", tmp_path / "h.cinm", symlinks=True)
    return tmp_path / "h.onnx"


def _manifest(model: Path) -> dict:
    return json.loads((model.with_suffix(".cinm") / "manifest.json").read_text())


def _write_manifest(model: Path, data) -> None:
    (model.with_suffix(".cinm") / "manifest.json").write_text(json.dumps(data))


def _run_fails(model: Path, capsys, *phrases: str) -> str:
    """``onnx-cinm run model`` exits 1 with one stderr line holding every phrase; returns it."""
    capsys.readouterr()
    assert main(["run", str(model)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for phrase in phrases:
        assert phrase in err, err
    return err


def test_the_intact_copy_runs(model, capsys):
    """The control: the unspoilt manifest passes, so every failure below is the spoiling's."""
    assert main(["run", str(model)]) == 0
    assert capsys.readouterr().err == ""
    m = _manifest(model)
    assert m["format"] == "onnx-cinm-artifacts" and m["version"] == 1
    assert {k["device"] for k in m["kernels"]} == {"memristor", "upmem"}
    assert all(len(k["files"]) >= 1 for k in m["kernels"])


def _del(d: dict, key):
    del d[key]


# (mutation of the manifest dict, phrase the one-line error must hold)
MALFORMED = {
    "no kernels": (lambda m: _del(m, "kernels"), "is malformed: it has no 'kernels' list"),
    "kernels null": (lambda m: m.update(kernels=None), "is malformed: kernels must be a list, not null"),
    "kernels object": (lambda m: m.update(kernels={"a": 1}),
                       "kernels must be a list, not an object"),
    "kernel is 7": (lambda m: m["kernels"].__setitem__(0, 7),
                    "kernels[0] must be an object, not a number"),
    "files is a string": (lambda m: m["kernels"][0].update(files="abc"),
                          "is malformed: kernels[0].files must be a list, not a string 'abc'"),
    "files null": (lambda m: m["kernels"][2].update(files=None),
                   "kernels[2].files must be a list, not null"),
    "no files": (lambda m: _del(m["kernels"][1], "files"), "kernels[1] has no 'files'"),
    "no node": (lambda m: _del(m["kernels"][0], "node"), "kernels[0] has no 'node'"),
    "node a list": (lambda m: m["kernels"][0].update(node=["x"]),
                    "kernels[0].node must be a string, not a list"),
    "kernel number": (lambda m: m["kernels"][0].update(kernel=3),
                      "kernels[0].kernel must be a non-empty string, not a number '3'"),
    "kernel empty": (lambda m: m["kernels"][0].update(kernel=""),
                     "kernels[0].kernel must be a non-empty string"),
    "file is a string": (lambda m: m["kernels"][0]["files"].__setitem__(1, "host.c"),
                         "kernels[0].files[1] must be an object, not a string"),
    "no sha256": (lambda m: _del(m["kernels"][0]["files"][0], "sha256"),
                  "kernels[0].files[0] has no 'sha256'"),
    "sha256 null": (lambda m: m["kernels"][0]["files"][0].update(sha256=None),
                    "kernels[0].files[0].sha256 must be 64 lowercase hex digits, not null"),
    "sha256 short": (lambda m: m["kernels"][0]["files"][0].update(sha256="abc"),
                     "kernels[0].files[0].sha256 must be 64 lowercase hex digits"),
    "path null": (lambda m: m["kernels"][0]["files"][0].update(path=None),
                  "kernels[0].files[0].path must be a non-empty string, not null"),
    "path a dict": (lambda m: m["kernels"][0]["files"][0].update(path={"a": "b"}),
                    "kernels[0].files[0].path must be a non-empty string, not an object"),
    "bytes negative": (lambda m: m["kernels"][0]["files"][0].update(bytes=-1),
                       "kernels[0].files[0].bytes must be a non-negative integer"),
    "bytes boolean": (lambda m: m["kernels"][0]["files"][0].update(bytes=True),
                      "kernels[0].files[0].bytes must be a non-negative integer, not a boolean"),
    "version true": (lambda m: m.update(version=True), "has version 'true'"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_manifest_is_one_line_error(model, capsys, case):
    spoil, phrase = MALFORMED[case]
    m = _manifest(model)
    spoil(m)
    _write_manifest(model, m)
    err = _run_fails(model, capsys, phrase)
    assert f"'{model.with_suffix('.cinm') / 'manifest.json'}'" in err


@pytest.mark.parametrize("content, phrase", [
    (b"[1, 2]", "is not an onnx-cinm kernel manifest"),
    (b'{"format": "onnx-cinm-artifacts", "version": 1, "kernels": [', "is not valid JSON"),
    (b'{"format": "onnx-cinm-artifacts", "version": 1, "kernels": ["\xff"]}',
     "is not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "is not valid JSON"),
], ids=["list", "truncated", "not-utf8", "deep"])
def test_unreadable_manifest_is_one_line_error(model, capsys, content, phrase):
    (model.with_suffix(".cinm") / "manifest.json").write_bytes(content)
    _run_fails(model, capsys, "manifest.json", phrase)


@pytest.fixture
def outside(model) -> tuple[Path, str]:
    """A file beside the kernel folder (outside it) and its true SHA-256: a manifest entry
    pointing there with that hash would pass the hash check, so only the path check stops it."""
    f = model.parent / "outside.c"
    f.write_text("int secret = 42;\n")
    return f, hashlib.sha256(f.read_bytes()).hexdigest()


@pytest.mark.parametrize("where", ["absolute", "dotdot", "deep-dotdot", "backslash-abs"])
def test_file_path_outside_the_folder_is_refused(model, capsys, outside, where):
    f, digest = outside
    rel = {"absolute": str(f), "dotdot": "../outside.c",
           "deep-dotdot": "upmem/../../outside.c", "backslash-abs": "\\outside.c"}[where]
    m = _manifest(model)
    m["kernels"][0]["files"][0].update(path=rel, sha256=digest, bytes=f.stat().st_size)
    _write_manifest(model, m)
    _run_fails(model, capsys, "is malformed: kernels[0].files[0].path",
               "path outside the kernel folder")


def test_symlink_out_of_the_folder_is_refused(model, capsys, outside):
    """A path that looks inside but is a symlink to a file outside: refused once resolved."""
    f, digest = outside
    m = _manifest(model)
    k = m["kernels"][0]
    link = model.with_suffix(".cinm") / k["kernel"] / "evil.c"
    link.symlink_to(f)
    rel = f"{k['kernel']}/evil.c"
    k["files"].append({"path": rel, "bytes": f.stat().st_size, "sha256": digest})
    _write_manifest(model, m)
    # the manifest is fine, the file on disk leaves the folder: the message says which (the
    # trial saw "manifest.json is malformed")
    err = _run_fails(model, capsys, f"kernel file '{link}' (kernels[0].files[{len(k['files']) - 1}].path "
                     "of manifest.json) is a symbolic link", f"outside the kernel folder, to '{f.resolve()}'")
    assert "malformed" not in err
    # a symlinked kernel folder pointing outside is refused as well
    m = _manifest(model)
    m["kernels"][0]["files"].pop()
    _write_manifest(model, m)
    link.unlink()
    kdir = model.with_suffix(".cinm") / k["kernel"]
    moved = model.parent / "moved_kernel"
    kdir.rename(moved)
    kdir.symlink_to(moved, target_is_directory=True)
    err = _run_fails(model, capsys, f"kernel folder '{kdir}' (kernels[0].kernel of manifest.json) is a "
                     "symbolic link", f"to '{moved.resolve()}'")
    assert "malformed" not in err


def test_kernel_path_outside_the_folder_is_refused(model, capsys):
    m = _manifest(model)
    m["kernels"][1]["kernel"] = "../elsewhere"
    _write_manifest(model, m)
    _run_fails(model, capsys, "kernels[1].kernel '../elsewhere'", "path outside the kernel folder")


def test_dotdot_that_stays_inside_is_accepted(model, capsys):
    """``..`` is not refused on sight: ``upmem/../upmem/x`` names a file inside the folder."""
    m = _manifest(model)
    f = m["kernels"][0]["files"][0]
    top = f["path"].split("/")[0]
    f["path"] = f"{top}/../{f['path']}"
    _write_manifest(model, m)
    assert main(["run", str(model)]) == 0
    assert capsys.readouterr().err == ""


def test_control_characters_stay_on_one_line(model, capsys):
    m = _manifest(model)
    m["kernels"][0]["files"][0]["path"] = "up\nmem/x.c"
    m["kernels"][0]["node"] = "a\nb"
    _write_manifest(model, m)
    _run_fails(model, capsys, "up\\nmem/x.c", "of node 'a\\nb' is missing")


def test_verify_checks_a_given_manifest(model):
    """``verify(root, manifest)`` checks a manifest passed in, not only one it reads."""
    root = model.with_suffix(".cinm")
    good = _manifest(model)
    assert artifacts.verify(root, good) == good
    with pytest.raises(CinmError, match=r"kernels\[0\]\.files must be a list"):
        artifacts.verify(root, {**good, "kernels": [{**good["kernels"][0], "files": "abc"}]})
    with pytest.raises(CinmError, match="kernels must be a list, not null"):
        artifacts.verify(root, {**good, "kernels": None})


# ------------------------------------------------------------------ --place-config

def _optimize_with_config(tmp_path: Path, cfg: Path) -> int:
    return main(["optimize", "--example", "lenet", "-o", str(tmp_path / "o.onnx"),
                 "--place-config", str(cfg), "-q"])


@pytest.mark.parametrize("name, content, phrase", [
    ("cfg.json", b'{"place": {"fc1\xff": "host"}}',
     "is not valid JSON: it is not UTF-8 text (byte 0xff at offset 15)"),
    ("cfg.toml", b'[place]\n"fc1" = "ho\xc3st"\n', "is not valid TOML: it is not UTF-8 text"),
    ("g.onnx", b"garbage\n", "is not valid JSON: Expecting value: line 1 column 1"),
    ("cfg", b"\x08\x01\x12\x00", "is not valid JSON"),
    ("g.toml", b"place = [\n", "is not valid TOML"),
    ("g.yaml", b"place:\n  fc1: host\n", "is not valid JSON"),
    ("noplace.json", b'{"other": 1}', "needs a 'place' table"),
    ("unknown.json", b'{"place": {"fc1": "tpu"}}', "unknown device 'tpu'"),
], ids=["json-not-utf8", "toml-not-utf8", "onnx-ext-garbage", "no-ext-binary", "toml-garbage",
        "yaml-ext", "no-place", "unknown-device"])
def test_bad_place_config_is_one_line_error(tmp_path, capsys, name, content, phrase):
    cfg = tmp_path / name
    cfg.write_bytes(content)
    assert _optimize_with_config(tmp_path, cfg) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert f"placement config '{cfg}'" in err or "unknown device" in err, err
    assert phrase in err, err
    assert "valid onnx" not in err and "valid yaml" not in err
    assert not (tmp_path / "o.onnx").exists() and not (tmp_path / "o.cinm").exists()


@pytest.mark.parametrize("name, content", [
    ("hints.txt", b'{"place": {"fc1*": "host"}}'),  # any extension but .toml is JSON
    ("hints.json", b'\xef\xbb\xbf{"place": {"fc1*": "host"}}'),  # a byte-order mark is fine
    ("hints.toml", b'[place]\n"fc1*" = "host"\n'),
], ids=["txt-is-json", "json-with-bom", "toml"])
def test_good_place_config_is_applied(tmp_path, capsys, name, content):
    cfg = tmp_path / name
    cfg.write_bytes(content)
    assert _optimize_with_config(tmp_path, cfg) == 0
    assert capsys.readouterr().err == ""
    out = onnx.load(tmp_path / "o.onnx")
    placed = {n.name: {a.name: a.s.decode() for a in n.attribute if a.name == "device"}
              .get("device") for n in out.graph.node}
    fc1 = {k: v for k, v in placed.items() if k.startswith("fc1")}
    assert fc1 and set(fc1.values()) == {"host"}, placed
    # without the hint the heuristic puts fc1's matrix product on the crossbar (of the CINM
    # paper's chip: 48,000 MACs are more than its 64 x 64 tile holds)
    assert main(["optimize", "--example", "lenet", "-o", str(tmp_path / "p.onnx"), "-q",
                 "--placement", "heuristic", "--cim-preset", "pcm-occ"]) == 0
    plain = onnx.load(tmp_path / "p.onnx")
    assert "memristor" in {a.s.decode() for n in plain.graph.node if n.name.startswith("fc1")
                           for a in n.attribute if a.name == "device"}


def test_a_model_copied_without_its_kernel_folder_says_so(model, tmp_path, capsys):
    """Only the .onnx copied elsewhere: the folder named, and what to do, in one line (it said
    "cannot read kernel manifest '.../manifest.json': No such file or directory")."""
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.copy(model, moved / "moved.onnx")
    err = _run_fails(moved / "moved.onnx", capsys,
                     f"the model's kernel folder '{moved / 'moved.cinm'}/' is missing: copy it "
                     "along with the model")
    assert "manifest.json" not in err
    # the folder there but its manifest gone: the manifest is what is named
    shutil.copytree(model.with_suffix(".cinm"), moved / "moved.cinm")
    (moved / "moved.cinm" / "manifest.json").unlink()
    _run_fails(moved / "moved.onnx", capsys, "cannot read kernel manifest", "No such file")
