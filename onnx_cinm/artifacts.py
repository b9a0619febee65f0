"""The ``<model>.cinm/`` folder: every device kernel of an optimized model, plus a manifest.

Layout (for ``out.onnx``)::

    out.cinm/
      manifest.json              format, version, and per kernel: node, op, device, files + sha256
      memristor/0007_fc1.xbar    crossbar command files (weights: the model's tensors they name)
      upmem/0012_relu/           host.c, dpu.c, Makefile and data per UPMEM kernel

A node's ``kernel`` attribute is its kernel's path relative to this folder. The folder is built
under a temporary name beside the destination and renamed into place, so a reader sees the old
folder or the new one, never a partial one; :func:`save` writes the model and the folder as one
unit (both replaced or neither), with SIGINT/SIGTERM held off during the renames. The model
records the digest of its kernel set (:data:`DIGEST_KEY` in its ``metadata_props``), and
:func:`check_pair` refuses a folder whose manifest does not have that digest, so a model never
runs with kernels that are not its own, even after a SIGKILL between the renames.

The hashes catch accidents -- a stale, partial or swapped folder -- not tampering: whoever can
edit the folder can edit its manifest and the model too. A kernel folder is untrusted input:
every path it names must stay inside it (:func:`verify`, and the crossbar simulator for the
``.npy`` files an ``.xbar`` file names), and the UPMEM emulator compiles only code regenerated
from the model's plan, never the folder's C as it stands.

The emission reaches devices only through the registry (:mod:`onnx_cinm.devices`).
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shutil
import signal
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path, PureWindowsPath
from typing import Callable

import onnx
from onnx import numpy_helper

from . import devices, frontend
from .analysis import op_info, tensor_infos
from .dialects import cinm
from .errors import CinmError
from .text import printable

MANIFEST = "manifest.json"
FORMAT = "onnx-cinm-artifacts"
VERSION = 1
#: The ``metadata_props`` key under which a model records :func:`kernel_digest` of its kernels.
DIGEST_KEY = "onnx_cinm.kernels_sha256"


def beside(model_path, suffix: str) -> Path:
    """The path of a folder that belongs to the model file ``model_path``, ``suffix`` (e.g.
    ``".cinm"``) marking what it holds: an ``.onnx`` extension is replaced, ``out.onnx`` ->
    ``out.cinm``; any other name keeps its whole name, ``out.v1`` -> ``out.v1.cinm``, ``x.npz``
    -> ``x.npz.cinm``, ``model`` -> ``model.cinm``, ``m.ONNX`` -> ``m.ONNX.cinm`` (the
    extension's case counts, as it does for the file names: ``m.ONNX`` and ``m.onnx`` are two
    files and get two folders). So outputs whose names differ in anything else never share a
    folder; the one pair that does, ``X.onnx`` and ``X``, is refused by ``optimize``
    (:func:`shared_with`)."""
    p = Path(model_path)
    if p.suffix == ".onnx":
        return p.with_suffix(suffix)
    return p.with_name(p.name + suffix)


def artifact_dir(model_path) -> Path:
    """The kernel folder of a model file (:func:`beside`): ``out.onnx`` -> ``out.cinm``,
    ``out.v1`` -> ``out.v1.cinm``."""
    return beside(model_path, ".cinm")


def shared_with(model_path) -> Path:
    """The other model file name whose kernel folder is ``model_path``'s too: ``X`` for
    ``X.onnx``, ``X.onnx`` for ``X`` (and for any name without the ``.onnx`` extension)."""
    p = Path(model_path)
    if p.suffix == ".onnx":
        return p.with_suffix("")
    return p.with_name(p.name + ".onnx")


def legacy_artifact_dir(model_path) -> Path:
    """The kernel folder earlier onnx-cinm named for a model file: its last extension,
    whatever it was, replaced by ``.cinm`` (``out.v1`` -> ``out.cinm``). Read only, for models
    written then (:func:`find_artifact_dir`)."""
    p = Path(model_path)
    return p.with_suffix(".cinm") if p.suffix else p.with_name(p.name + ".cinm")


def find_artifact_dir(model_path) -> Path:
    """The kernel folder to read for a model file: :func:`artifact_dir`, or, when that does
    not exist and the model's name has an extension other than ``.onnx``, the folder older
    onnx-cinm wrote for it (:func:`legacy_artifact_dir`) if that exists. Whichever it is,
    :func:`check_pair` then checks that it is the model's own."""
    root = artifact_dir(model_path)
    if not root.exists():
        old = legacy_artifact_dir(model_path)
        if old != root and old.is_dir():
            return old
    return root


def kernel_folder_in(path) -> Path | None:
    """The kernel folder (a ``*.cinm`` path component) that ``path`` names or lies inside,
    as written or once symbolic links are resolved (``link/x.onnx`` with ``link`` leading to
    ``some.cinm``), or None. Outputs must not go there: ``optimize`` replaces kernel folders
    whole."""
    p = Path(os.path.abspath(path))
    real = Path(os.path.realpath(p))
    for q in (p, *p.parents, *((real, *real.parents) if real != p else ())):
        if q.suffix == ".cinm":
            return q
    return None


def check_output_outside_kernels(path, option: str) -> None:
    """Raise CinmError if ``path`` (written by ``option``) is a kernel folder or lies in one,
    also through a symbolic link (the message then names the folder it leads to)."""
    k = kernel_folder_in(path)
    if k is not None:
        p = Path(os.path.abspath(path))
        where = "is" if k in (p, Path(os.path.realpath(p))) else "lies inside"
        via = "" if k == p or k in p.parents else " (through a symbolic link)"
        raise CinmError(f"{option} '{path}' {where} the kernel folder '{k}'{via} (*.cinm folders "
                        "belong to their model and are replaced whole); choose another path")


def check_output_replaceable(path, option: str) -> None:
    """Raise CinmError if ``path`` (written by ``option``) is an existing regular file, not
    empty, that is not an ONNX model: a notes file given as ``-o`` by mistake was replaced by
    the model without a word. A file whose name ends in ``.onnx`` is taken as a model without
    reading it; another is read (``onnx.load`` without external data: an earlier output named
    ``out.v1``). A missing file, an empty one and anything not a regular file (``/dev/null``)
    pass."""
    import stat

    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or p.suffix.lower() == ".onnx":
        return
    import onnx

    try:  # (protobuf parses many a short text as unknown fields: a model has a graph)
        is_model = onnx.load(str(p), load_external_data=False).HasField("graph")
    except Exception:  # noqa: BLE001 - anything that does not parse is not a model
        is_model = False
    if not is_model:
        raise CinmError(f"{option} '{path}' exists and is not an ONNX model; not overwritten: "
                        "remove it or choose another path")


def kernel_digest(manifest: dict) -> str:
    """SHA-256 of a manifest's kernel list (node, op, device, kernel, files with their hashes)
    in canonical JSON, paths normalized (``upmem/../upmem/x`` is ``upmem/x``): the identity of
    a kernel set."""
    kernels = [{**k, "kernel": posixpath.normpath(k["kernel"]),
                "files": [{**f, "path": posixpath.normpath(f["path"])} for f in k["files"]]}
               for k in manifest.get("kernels", [])]
    text = json.dumps(kernels, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def recorded_digest(model: onnx.ModelProto) -> str | None:
    """The kernel digest ``model`` records (``metadata_props[DIGEST_KEY]``), or None."""
    return next((p.value for p in model.metadata_props if p.key == DIGEST_KEY), None)


#: The digest :func:`save` writes the model with before its kernels are written: as long as a
#: SHA-256 in hex, so the real one is written over it in the file (it matches no kernel set)
_PENDING = "pending-" + "0" * 56


def _digest_entry(digest: str) -> bytes:
    """The serialized ``metadata_props`` entry recording ``digest``."""
    return onnx.StringStringEntryProto(key=DIGEST_KEY, value=digest).SerializeToString()


def _record_digest(model: onnx.ModelProto, digest: str | None) -> None:
    for p in [p for p in model.metadata_props if p.key == DIGEST_KEY]:
        model.metadata_props.remove(p)
    if digest is not None:
        model.metadata_props.add(key=DIGEST_KEY, value=digest)


def check_pair(model: onnx.ModelProto, root, model_label: str = "the model",
               own=None) -> dict:
    """Check the kernel folder ``root`` (:func:`verify`: its paths stay inside it, its files
    have their listed hashes) and that it is ``model``'s own: its manifest's
    :func:`kernel_digest` equals the digest the model records. Nothing of the folder is built
    or run before this. Returns the manifest. Raises CinmError (one line) otherwise.

    ``own``: the folder the model's file name gives (:func:`artifact_dir`) when ``root`` is the
    older name's folder found in its absence (:func:`find_artifact_dir`). A folder there whose
    manifest reads but records another kernel digest (``m.cinm`` of ``m.onnx`` beside
    ``m.v1``) is no stale folder of the model's but another model's, and the error says the
    model's own folder ``own`` is missing; a folder whose manifest cannot be read gets
    :func:`verify`'s own error (a damaged folder, whoever wrote it)."""
    root = Path(root)
    want = recorded_digest(model)
    if own is not None and Path(own) != root:
        try:
            theirs = kernel_digest(load_manifest(root))
        except CinmError:
            theirs = None
        if want is not None and theirs is not None and theirs != want:
            raise CinmError(f"the model's kernel folder '{own}/' is missing: copy it along with "
                            f"the model (its device kernels are read from there; '{root}' beside "
                            "it, the name older onnx-cinm used, holds another model's kernels)")
    manifest = verify(root)
    if want is None:
        raise CinmError(f"{model_label} has device kernels but records no kernel digest (written "
                        "by an older onnx-cinm, or not by 'onnx-cinm optimize'); re-run "
                        "onnx-cinm optimize")
    if kernel_digest(manifest) != want:
        raise CinmError(f"the kernel folder '{root}' is not the one {model_label} was written "
                        "with (its kernel digest differs: an interrupted or failed optimize, or a "
                        "folder of another model); re-run onnx-cinm optimize")
    return manifest


def sha256(path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Constants(Mapping):
    """``{name: array}`` of a node's inputs that are initializers, each converted to numpy when a
    device reads it: a crossbar kernel names its weights instead of copying them (only a bias's
    shape is read), so converting every weight of the model up front was a full copy of the
    weights for nothing (light VGG19: 550 MB)."""

    def __init__(self, inits: dict, names):
        self._inits = inits
        self._names = [n for n in dict.fromkeys(names) if n in inits]

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(name)
        return numpy_helper.to_array(self._inits[name])

    def __contains__(self, name) -> bool:  # Mapping's converts the array to find out
        return name in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def kernel_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The cinm nodes that have a ``kernel`` attribute: the main graph's, then those compiled
    into If branches (:mod:`onnx_cinm.passes.control_flow`)."""
    return _walk(model.graph)[0]


def _walk(graph: onnx.GraphProto, nodes: list | None = None, graphs: list | None = None):
    """``(kernel nodes, graphs)``: :func:`kernel_nodes` of the model whose graph is ``graph`` and
    :func:`frontend.iter_graphs <onnx_cinm.frontend.iter_graphs>` (the same graphs, in the same
    order), from one walk that reads no attribute of a cinm node other than its names (a planned
    node has some 20, and no cinm op takes a graph)."""
    if nodes is None:
        nodes, graphs = [], []
    graphs.append(graph)
    for node in graph.node[:]:  # a slice: see frontend.subgraphs
        if node.domain == cinm.DOMAIN:
            if any(a.name == "kernel" for a in node.attribute[:]):
                nodes.append(node)
        else:
            for sub in frontend.subgraphs(node):
                _walk(sub, nodes, graphs)
    return nodes, graphs


def emit(model: onnx.ModelProto, root, log: Callable[[str], None] = lambda m: None) -> dict:
    """Write every kernel of ``model`` and the manifest into the folder ``root`` (created).

    Returns the manifest as a dict. Raises CinmError if a device cannot emit a node or two
    nodes name the same kernel.
    """
    return _emit(model, _walk(model.graph), root, log)


def _emit(model: onnx.ModelProto, walked: tuple, root, log: Callable[[str], None]) -> dict:
    """:func:`emit` of the kernel nodes and graphs ``walked`` (:func:`_walk` of ``model``'s
    graph)."""
    nodes, graphs = walked
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    base = os.fspath(root) + os.sep
    inits = {i.name: i for g in graphs
             for i in g.initializer[:]}  # a weight lowered in an If branch is the branch's
    # the infos of the kernels' own tensors only (op_info reads no others)
    names = {t for n in nodes for t in (*n.input[:], *n.output[:])}
    infos = tensor_infos(model, infer=False, names=names) if nodes else {}
    if nodes and not any(n.output[0] in infos for n in nodes):
        infos = tensor_infos(model, names=names)
    kernels, seen = [], set()
    with devices.recorded_writes() as written:
        for k, node in enumerate(nodes, 1):
            op = op_info(node, infos)
            at = dict(op.attrs)  # a cinm node's attributes, decoded once (by op_info)
            rel = at["kernel"]
            if rel in seen:
                raise CinmError(f"two nodes name the kernel '{rel}'")
            seen.add(rel)
            dev = devices.get_device(at.get("device", "host"))
            consts = _Constants(inits, node.input)
            paths = dev.emit(op, at, consts, root)
            if not paths:
                raise CinmError(f"node '{node.name}' has a kernel but device '{dev.name}' emits "
                                "no code")
            files = []
            for p in paths:
                name = os.fspath(p)
                # written through devices.write_kernel_file: hashed in memory; else read back
                size, digest = written.get(name) or (os.stat(name).st_size, sha256(name))
                # the path in the folder, from the string (pathlib's relative_to: 2 ms a model)
                inside = (name[len(base):].replace(os.sep, "/") if name.startswith(base)
                          and os.path.normpath(name) == name else
                          Path(p).relative_to(root).as_posix())
                files.append({"path": inside, "bytes": size, "sha256": digest})
            kernels.append({"node": node.name, "op_type": node.op_type, "device": dev.name,
                            "kernel": rel, "files": files})
            log(f"emit [{k}/{len(nodes)}] {node.name} -> {rel}")
    manifest = {"format": FORMAT, "version": VERSION, "kernels": kernels}
    (root / MANIFEST).write_text(devices.json_text(manifest))
    return manifest


def _show(value, limit: int | None = 80) -> str:
    """A value quoted for a one-line message: control and bidi characters escaped
    (:func:`onnx_cinm.text.printable`), shortened to ``limit`` characters."""
    text = printable(value if isinstance(value, str) else json.dumps(value))
    if limit is not None and len(text) > limit:
        text = text[:limit - 3] + "..."
    return "'" + text + "'"


def _kind(value) -> str:
    """The JSON name of a value's type."""
    if value is None:
        return "null"
    for typ, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"),
                      (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, typ):
            return name
    return type(value).__name__


#: The fields of one kernel and of one of its files: name -> (check, what it must be).
_KERNEL_FIELDS = {
    "node": (lambda v: isinstance(v, str), "a string"),
    "op_type": (lambda v: isinstance(v, str), "a string"),
    "device": (lambda v: isinstance(v, str), "a string"),
    "kernel": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "files": (lambda v: isinstance(v, list), "a list"),
}
_FILE_FIELDS = {
    "path": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "bytes": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "a non-negative integer"),
    "sha256": (lambda v: isinstance(v, str) and len(v) == 64
               and not v.strip("0123456789abcdef"), "64 lowercase hex digits"),
}


def _escapes(rel: str) -> bool:
    """Whether a manifest path leaves its folder on its face: absolute (POSIX or Windows, or
    with a drive) or climbing above the folder with ``..``."""
    # a drive (``C:``) needs a colon; UNC and device paths start with a separator, refused above
    if rel.startswith(("/", "\\")) or ":" in rel and PureWindowsPath(rel).drive:
        return True
    depth = 0
    for part in rel.replace("\\", "/").split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _fields(obj, fields: dict, where: str, bad: Callable[[str], None]) -> None:
    if not isinstance(obj, dict):
        bad(f"{where} must be an object, not {_kind(obj)}")
    for name, (ok, what) in fields.items():
        if name not in obj:
            bad(f"{where} has no '{name}'")
        if not ok(obj[name]):
            value = obj[name]
            shown = f" {_show(value)}" if isinstance(value, (str, int, float)) else ""
            bad(f"{where}.{name} must be {what}, not {_kind(value)}{shown}")


def check_manifest(data, path) -> dict:
    """Check the structure of a manifest read from ``path`` (for messages); return it.

    Every kernel is an object with the strings ``node``, ``op_type``, ``device`` and ``kernel``
    and a list ``files`` of objects with ``path``, ``bytes`` and ``sha256``; ``kernel`` and each
    file path are relative and stay inside the kernel folder. Raises CinmError naming the first
    thing that is wrong.
    """
    def bad(what: str):
        raise CinmError(f"'{path}' is malformed: {what}")

    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CinmError(f"'{path}' is not an onnx-cinm kernel manifest")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version != VERSION:
        raise CinmError(f"kernel manifest '{path}' has version {_show(version)}, "
                        f"this onnx-cinm reads {VERSION}")
    if "kernels" not in data:
        bad("it has no 'kernels' list")
    if not isinstance(data["kernels"], list):
        bad(f"kernels must be a list, not {_kind(data['kernels'])}")
    for i, k in enumerate(data["kernels"]):
        _fields(k, _KERNEL_FIELDS, f"kernels[{i}]", bad)
        if _escapes(k["kernel"]):
            bad(f"kernels[{i}].kernel {_show(k['kernel'])} is a path outside the kernel folder")
        for j, f in enumerate(k["files"]):
            _fields(f, _FILE_FIELDS, f"kernels[{i}].files[{j}]", bad)
            if "\0" in f["path"]:
                bad(f"kernels[{i}].files[{j}].path {_show(f['path'])} contains a NUL character")
            if _escapes(f["path"]):
                bad(f"kernels[{i}].files[{j}].path {_show(f['path'])} is a path outside the "
                    "kernel folder")
    return data


def load_manifest(root) -> dict:
    """Read and check ``root/manifest.json``. Raises CinmError if missing, malformed or foreign
    (the folder ``root`` itself missing: a model copied without its kernel folder)."""
    path = Path(root) / MANIFEST
    if not os.path.lexists(root):
        raise CinmError(f"the model's kernel folder '{root}/' is missing: copy it along with the "
                        "model (its device kernels are read from there)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CinmError(f"cannot read kernel manifest '{path}': {e.strerror}") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise CinmError(f"kernel manifest '{path}' is not valid JSON: "
                        f"{str(e).splitlines()[0]}") from None
    except RecursionError:
        raise CinmError(f"kernel manifest '{path}' is not valid JSON: nested too deeply") from None
    return check_manifest(data, path)


def _inside(root: Path, rel: str, what: str, where: str) -> Path:
    """``root / rel``; raises CinmError unless it stays inside ``root`` once symlinks are
    resolved (the manifest's entry ``where`` names it; :func:`check_manifest` already refused
    paths that leave on their face, so what leaves here leaves through a symbolic link on disk,
    and the message says so rather than blame the manifest). ``what``: ``"file"`` or
    ``"folder"``."""
    try:
        real_root = root.resolve()
        target = (root / rel).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, say
        why = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise CinmError(f"kernel {what} {_show(str(root / rel), None)} ({where}): cannot resolve "
                        f"the path: {why}") from None
    if target == real_root or not target.is_relative_to(real_root):
        raise CinmError(f"kernel {what} {_show(str(root / rel), None)} ({where}) is a symbolic link "
                        f"(or lies under one) leading outside the kernel folder, to "
                        f"{_show(str(target), None)}: refused (replace it by the file itself, or "
                        "re-run onnx-cinm optimize)")
    return root / rel


def _symlinks(root: Path) -> bool:
    """Whether the folder ``root`` or anything under it is a symbolic link (one walk of the
    folder: a few hundred directory entries, no path resolved)."""
    if root.is_symlink():
        return True
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    if e.is_symlink():
                        return True
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            return True  # unreadable: let the resolving checks name it
    return False


def verify(root, manifest: dict | None = None) -> dict:
    """Check every file of the manifest exists with its recorded hash; return the manifest.

    Paths stay inside the folder: :func:`check_manifest` refuses absolute and climbing ones on
    their face, and when the folder holds a symbolic link every path is resolved as well (a
    folder without links, the normal case, needs no resolution: one walk of the folder decides).

    Raises CinmError naming the first malformed entry, file or folder that leads outside the
    folder through a symbolic link, or missing or stale file.
    """
    root = Path(root)
    where = root / MANIFEST
    manifest = load_manifest(root) if manifest is None else check_manifest(manifest, where)
    resolve = _symlinks(root)
    for i, k in enumerate(manifest["kernels"]):
        if resolve:
            _inside(root, k["kernel"], "folder", f"kernels[{i}].kernel of {MANIFEST}")
        for j, f in enumerate(k["files"]):
            p = _inside(root, f["path"], "file", f"kernels[{i}].files[{j}].path of {MANIFEST}") \
                if resolve else root / f["path"]
            try:
                digest = sha256(p)
            except OSError as e:
                shown, node = _show(str(p), None), _show(k["node"])
                if not p.is_file():
                    raise CinmError(f"kernel file {shown} of node {node} is missing") from None
                raise CinmError(f"cannot read kernel file {shown} of node {node}: "
                                f"{e.strerror}") from None
            if digest != f["sha256"]:
                raise CinmError(f"kernel file {_show(str(p), None)} of node {_show(k['node'])} "
                                "is stale: its hash differs from the manifest (re-run onnx-cinm "
                                "optimize)")
    return manifest


@contextmanager
def _signals_held():
    """Defer SIGINT/SIGTERM for the duration (main thread only), delivering them afterwards."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    except (ValueError, OSError):  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _our_manifest(path: Path) -> dict | None:
    """The manifest of the folder ``path`` as read (JSON, not yet checked) when it is one of
    ours (its ``format`` is :data:`FORMAT`), else None."""
    try:
        data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        return data if data.get("format") == FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None


def _foreign_files(path: Path, data: dict) -> list[str]:
    """Files in our kernel folder ``path`` that its manifest ``data`` (:func:`_our_manifest`)
    does not list (someone else's: replacing the folder would delete them), as paths relative
    to ``path``; a malformed manifest lists none. (The manifest is read once for both: a
    DenseNet121 folder's is 60 kB of JSON.)"""
    try:
        manifest = check_manifest(data, path / MANIFEST)
        listed = {f["path"] for k in manifest["kernels"] for f in k["files"]}
    except CinmError:
        listed = set()
    listed.add(MANIFEST)
    found = []
    for top, dirs, files in os.walk(path):  # one walk, strings only (3,000 entries: 0.4 s
        rel = os.path.relpath(top, path)     # through pathlib before)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        found += [prefix + f for f in files]
    return sorted(f for f in found if f not in listed)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _remove_leftovers(folder: Path, names: list[str]) -> None:
    """Remove the hidden temporaries a killed ``save`` left beside ``names`` in ``folder``:
    ``.NAME.PID.*.tmp`` (files or folders) and ``.NAME.old.PID`` whose process ``PID`` is gone.
    Those of a live process (a concurrent save) are left alone."""
    pattern = re.compile(r"^\.(" + "|".join(re.escape(n) for n in names)
                         + r")(?:\.data)?\.(?:old\.(\d+)|(\d+)\..*\.tmp)$")
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        m = pattern.match(e.name)
        if not m or _alive(int(m.group(2) or m.group(3))):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)
        except OSError:
            pass


def save(model: onnx.ModelProto, path, log: Callable[[str], None] = lambda m: None) -> dict | None:
    """Write ``model`` to ``path`` and its kernels to :func:`artifact_dir` ``(path)``, as one unit.

    Everything is built under temporary names in the destination folder, then renamed into place
    with signals held: the kernel folder first, then the model; if the model cannot be written,
    the old kernel folder is put back. The model is written first (:func:`frontend.stage_model
    <onnx_cinm.frontend.stage_model>`), with a stand-in digest of the same length written over
    in the file once the kernels are written, so that its flush to disk runs meanwhile. On any error or interrupt the temporaries are removed and
    the old files stay as they were. An old kernel folder (one with our manifest) is replaced; a
    model without kernels removes it, since it belonged to the model being replaced (a kernel
    folder that is a symbolic link: the link is replaced, the folder it leads to left as it
    was). Hidden
    temporaries a killed earlier save left for this output are removed first. ``model`` gets
    the digest of its kernel set in its ``metadata_props`` (:data:`DIGEST_KEY`; removed when it
    has no kernels), which :func:`check_pair` compares.

    Returns the manifest, or None when the model has no device kernels.

    Raises:
        CinmError: the destination is not writable, is or lies in a kernel folder, or a folder
            that is not ours sits where the kernel folder goes.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if folder.exists() and not folder.is_dir():
        raise CinmError(f"cannot write '{path}': '{folder}' is a file, not a folder "
                        "(Not a directory)")
    if not folder.is_dir():
        raise CinmError(f"cannot write '{path}': folder '{folder}' does not exist")
    check_output_outside_kernels(path, "the model path")
    dest = artifact_dir(path)
    _remove_leftovers(folder, [path.name, dest.name])
    data = _our_manifest(dest) if dest.is_dir() else None
    ours = data is not None
    foreign = _foreign_files(dest, data) if ours else []
    if foreign:
        raise CinmError(f"cannot replace the kernel folder '{dest}': it also holds files onnx-cinm "
                        f"did not write ({', '.join(foreign[:3])}); move them or choose another "
                        "output")
    if not ours and dest.exists():
        raise CinmError(f"cannot write kernels to '{dest}': it exists and is not an onnx-cinm "
                        "kernel folder; move it away or choose another output name")
    if dest.is_symlink() and not dest.exists():  # a folder cannot be renamed over it
        raise CinmError(f"cannot write kernels to '{dest}': it is a symbolic link to a missing "
                        f"folder ('{os.readlink(dest)}'); remove the link or choose another "
                        "output name")
    tmp = old = staged = None
    manifest = None
    given = []  # the model's metadata as it was given (copies: the entries get replaced)
    for entry in model.metadata_props:
        given.append(onnx.StringStringEntryProto())
        given[-1].CopyFrom(entry)
    try:
        walked = _walk(model.graph)
        nodes = walked[0]
        try:
            if nodes:
                try:
                    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{os.getpid()}.",
                                                suffix=".tmp", dir=folder))
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the folder is not
                except OSError as e:
                    raise CinmError(f"cannot write kernels next to '{path}': {e.strerror}") from None
                # the model goes to disk first, with a stand-in digest of the same length: its
                # flush (fsync, 15-30 ms on DenseNet121) runs while the kernels are written, and
                # the digest is written over the stand-in once it is known
                _record_digest(model, _PENDING)
                staged = frontend.stage_model(model, path)
                manifest = _emit(model, walked, tmp, log)
                digest = kernel_digest(manifest)
                _record_digest(model, digest)
                if not staged.patch(_digest_entry(_PENDING), _digest_entry(digest)):
                    staged.discard()  # the stand-in is not there once: the model written again
                    staged = frontend.stage_model(model, path)
            else:
                _record_digest(model, None)
                staged = frontend.stage_model(model, path)
        except BaseException:  # the model as it was given: its entries in their order
            del model.metadata_props[:]
            model.metadata_props.extend(given)
            raise
        with _signals_held():
            placed = False
            try:
                if dest.exists():
                    hidden = dest.with_name(f".{dest.name}.old.{os.getpid()}")
                    os.replace(dest, hidden)
                    old = hidden
                if tmp is not None:
                    os.replace(tmp, dest)
                    placed = True
                staged.place()  # atomic by itself: old model or new
            except BaseException:  # both replaced or neither: put the old folder back
                try:
                    if placed:
                        os.replace(dest, tmp)
                    if old is not None:
                        os.replace(old, dest)
                        old = None
                except OSError:
                    pass  # the digest check keeps run from pairing the wrong halves
                raise
    except OSError as e:
        raise CinmError(f"cannot write kernels to '{dest}': {e.strerror}") from None
    finally:
        if staged is not None:
            staged.discard()
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            if old.is_symlink():  # rmtree refuses a link (and ignore_errors hid that)
                try:
                    old.unlink()
                except OSError:
                    pass
            else:
                shutil.rmtree(old, ignore_errors=True)
    return manifest
