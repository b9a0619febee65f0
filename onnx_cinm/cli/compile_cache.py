"""Compiled code of the source text the standard library compiles at every import, kept across
processes of the command line, as Python keeps a module's bytecode.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ... as Python source
and compiles it with ``exec`` every time the class is defined, that is at every import: the
compiler runs on some 280 small functions per ``optimize`` (onnx-cinm's 52 dataclasses and
onnx_ir's). ``collections.namedtuple`` compiles its ``__new__`` with ``eval`` (23 per
``optimize``), and ``typing`` compiles every forward reference (112: the options' type hints,
Jinja's, ...). Whole ``optimize -q --check 0`` processes (valgrind, second run, session 29):
light DenseNet121 4,917 -> about 4,690 M instructions, a one-MatMul model 1,217 -> about 1,000 M.
(Regular expressions were cached too in a first version, for about 1% more; replaying ``re``'s
compiler output skipped its parse-time warnings, so it was dropped.)

:func:`install` gives each of these modules its own ``exec``, ``eval`` or ``compile``
(:data:`_HOOKS`; a module global, found before the builtin): source text compiled before is
looked up by its text and the code object run as the builtin would have run the text
(compiled the same way, the text and the mode alone determine the code); new text is
compiled and added. The code is read from and written to
``$XDG_CACHE_HOME/onnx-cinm/compiled/<interpreter tag>.marshal``
(:func:`onnx_cinm.usercache.cache_dir`; nothing is cached without a known home), headed by
the interpreter's bytecode magic number (:data:`importlib.util.MAGIC_NUMBER`, as a ``.pyc``
is): a file another interpreter wrote, a damaged or unreadable file, or one that cannot be
written is ignored, never an error. Only the console script's process installs it
(:func:`onnx_cinm.cli.main` without ``argv``); ``import onnx_cinm`` or ``main(argv)`` in
another program leaves the interpreter's modules as they are.
"""
from __future__ import annotations

import atexit
import builtins
import collections
import dataclasses
import marshal
import os
import sys
import types
import typing
from importlib.util import MAGIC_NUMBER

from .. import usercache

#: Source text (prefixed with ``mode\\0`` unless compiled for ``exec``) -> code object: read
#: from the file, then added to as this process compiles.
_code: dict = {}
#: The texts looked up in this process (what a file grown past :data:`MAX_ENTRIES` keeps).
_used: set = set()
#: How many texts this process compiled (none when all were in the file).
compiled = 0
#: Entries beyond which the file is written again with this process's entries only (the
#: classes of older versions of the code are dropped): about 420 are used per command.
MAX_ENTRIES = 4000
_path: str | None = None
_installed = False
#: A cache file's first bytes: the interpreter's bytecode version.
_HEADER = MAGIC_NUMBER


def cache_file() -> str | None:
    """The path of the cache file for this interpreter (see the module's docstring), None
    without a known home (:func:`onnx_cinm.usercache.cache_dir`: nothing is cached)."""
    folder = usercache.cache_dir("compiled")
    tag = getattr(sys.implementation, "cache_tag", None) or "python"
    return None if folder is None else os.path.join(folder, tag + ".marshal")


def _code_of(source: str, mode: str):
    """The code ``compile(source, "<string>", mode)`` gives, from the table or compiled and
    added: as the builtins compile text for the modules hooked here (file ``'<string>'``, no
    future features inherited from this module: those modules' own code has none)."""
    global compiled
    key = source if mode == "exec" else f"{mode}\0{source}"
    code = _code.get(key)
    if code is None:
        code = _code[key] = compile(source, "<string>", mode, dont_inherit=True)
        compiled += 1
    _used.add(key)
    return code


def _exec(source, globals=None, locals=None, /):  # noqa: A002 - exec's own parameter names
    """``exec`` for ``dataclasses`` (its generated methods)."""
    if type(source) is str:
        source = _code_of(source, "exec")
    return builtins.exec(source, globals, locals)


def _eval(source, globals=None, locals=None, /):  # noqa: A002 - eval's own parameter names
    """``eval`` for ``collections`` (``namedtuple``'s ``__new__``)."""
    if type(source) is str:
        source = _code_of(source, "eval")
    return builtins.eval(source, globals, locals)


def _compile(source, filename, mode, flags=0, dont_inherit=False, optimize=-1, **kwargs):
    """``compile`` for ``typing`` (a forward reference, ``compile(text, '<string>', 'eval')``):
    any other call is compiled as the builtin would for that module."""
    if (type(source) is str and filename == "<string>" and not flags and optimize == -1
            and not kwargs):
        return _code_of(source, mode)
    return builtins.compile(source, filename, mode, flags, True, optimize, **kwargs)


#: The modules given their own builtin (a module global is found before the builtin).
_HOOKS = ((dataclasses, "exec", _exec), (collections, "eval", _eval),
          (typing, "compile", _compile))


def install() -> None:
    """Read the cache file and route the compiling of :data:`_HOOKS` through it, once per
    process; the new entries are written when the process exits (``atexit``). Without a
    cache folder (:func:`cache_file` None) nothing is hooked."""
    global _path, _installed
    if _installed:
        return
    _installed = True
    _path = cache_file()
    if _path is None:  # nowhere to keep it: Python compiles as it always does
        return
    _code.update(_read(_path))
    for module, name, hook in _HOOKS:
        if name not in vars(module):  # never over another program's own hook
            setattr(module, name, hook)
    atexit.register(_save)


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(_HEADER):
            return {}
        table = marshal.loads(data[len(_HEADER):])
    except Exception:  # noqa: BLE001 - missing, unreadable or damaged: compile afresh
        return {}
    if type(table) is not dict:
        return {}
    return {k: v for k, v in table.items() if type(k) is str and type(v) is types.CodeType}


def _save() -> None:
    """Write the cache file if this process compiled anything (:data:`compiled`), atomically
    (a temporary file in the same folder, renamed over it); failures are ignored."""
    if not compiled or _path is None:
        return
    table = _code if len(_code) <= MAX_ENTRIES else {k: _code[k] for k in _used if k in _code}
    temporary = f"{_path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(_path), exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(_HEADER + marshal.dumps(table))
        os.replace(temporary, _path)
    except (OSError, ValueError):
        try:
            os.remove(temporary)
        except OSError:
            pass
