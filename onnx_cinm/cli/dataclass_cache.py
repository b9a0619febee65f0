"""Compiled code of the methods ``@dataclass`` generates, kept across processes of the command
line, as Python keeps a module's bytecode.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ... as Python source
and compiles it with ``exec`` every time the class is defined, that is at every import: the
compiler runs on some 280 small functions per ``optimize`` (onnx-cinm's 52 dataclasses and
onnx_ir's). Measured on the build machine (valgrind, importing the 485 modules one
``optimize -q --check 0`` of light DenseNet121 imports): 1,297 M instructions, 1,092 M with
the compiled code loaded from this cache, so about 4% of that whole command
(4,917 M), and 17% of one on a single-MatMul model (1,217 M).

:func:`install` gives the ``dataclasses`` module its own ``exec`` (a module global, found
before the builtin one): source text it has compiled before is looked up by its text and the
code object run as ``exec`` would have run the text (compiled the same way, the text alone
determines the code); new text is compiled and added. The code is read from and written to
``$XDG_CACHE_HOME/onnx-cinm/dataclasses/<interpreter tag>.marshal`` (``~/.cache`` when
XDG_CACHE_HOME is unset or empty), headed by the interpreter's bytecode magic number
(:data:`importlib.util.MAGIC_NUMBER`, as a ``.pyc`` is): a file another interpreter wrote,
a damaged or unreadable file, or one that cannot be written is ignored, never an error.
Only the command line installs it (:mod:`onnx_cinm.cli`); ``import onnx_cinm`` as a library
leaves the interpreter's modules as they are.
"""
from __future__ import annotations

import atexit
import builtins
import dataclasses
import marshal
import os
import sys
import types
from importlib.util import MAGIC_NUMBER

#: Source text -> code object: read from the file, then added to as classes are defined.
_code: dict = {}
#: The texts looked up in this process (what a file grown past :data:`MAX_ENTRIES` keeps).
_used: set = set()
#: How many texts this process compiled (none when every class was in the file).
compiled = 0
#: Entries beyond which the file is written again with this process's entries only (the
#: classes of older versions of the code are dropped): about 280 are used per command.
MAX_ENTRIES = 4000
_path: str | None = None


def cache_file() -> str:
    """The path of the cache file for this interpreter (see the module's docstring)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = getattr(sys.implementation, "cache_tag", None) or "python"
    return os.path.join(base, "onnx-cinm", "dataclasses", tag + ".marshal")


def _exec(source, globals=None, locals=None, /):  # noqa: A002 - exec's own parameter names
    """``exec`` for the ``dataclasses`` module: source text compiled once per machine."""
    global compiled
    if type(source) is str:
        code = _code.get(source)
        if code is None:
            # what exec compiles text with: file '<string>', and no future features inherited
            # from this module (dataclasses' own code has none)
            code = _code[source] = compile(source, "<string>", "exec", dont_inherit=True)
            compiled += 1
        _used.add(source)
        source = code
    return builtins.exec(source, globals, locals)


def install() -> None:
    """Read the cache file and route ``dataclasses``' compiling through it, once per process;
    the new entries are written when the process exits (``atexit``)."""
    global _path
    if _path is not None or getattr(dataclasses, "exec", builtins.exec) is not builtins.exec:
        return
    _path = cache_file()
    _code.update(_read(_path))
    dataclasses.exec = _exec
    atexit.register(_save)


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC_NUMBER):
            return {}
        table = marshal.loads(data[len(MAGIC_NUMBER):])
    except Exception:  # noqa: BLE001 - missing, unreadable or damaged: compile afresh
        return {}
    if type(table) is not dict:
        return {}
    return {k: v for k, v in table.items()
            if type(k) is str and type(v) is types.CodeType}


def _save() -> None:
    """Write the cache file if this process compiled anything (atomically: a temporary file in
    the same folder, renamed over it); failures are ignored."""
    if not compiled or _path is None:
        return
    table = _code if len(_code) <= MAX_ENTRIES else {k: _code[k] for k in _used if k in _code}
    temporary = f"{_path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(_path), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(MAGIC_NUMBER + marshal.dumps(table))
        os.replace(temporary, _path)
    except (OSError, ValueError):
        try:
            os.remove(temporary)
        except OSError:
            pass
