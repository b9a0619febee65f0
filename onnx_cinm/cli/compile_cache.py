"""Compiled code of the source text and regular expressions the standard library compiles at
every import, kept across processes of the command line, as Python keeps a module's bytecode.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ... as Python source
and compiles it with ``exec`` every time the class is defined, that is at every import: the
compiler runs on some 280 small functions per ``optimize`` (onnx-cinm's 52 dataclasses and
onnx_ir's). ``collections.namedtuple`` compiles its ``__new__`` with ``eval`` (23 per
``optimize``), and ``typing`` compiles every forward reference (112: the options' type hints,
Jinja's, ...). Measured on the build machine (valgrind, importing the 485 modules one
``optimize -q --check 0`` of light DenseNet121 imports): 1,297 M instructions, 1,030 M
with this cache. ``re`` parses and compiles each pattern (117 per ``optimize``: Jinja's
lexer, email's, the passes' own, ...) in pure Python before handing the result to its C
engine (``_sre.compile``); the cache keeps what it handed, by pattern text and flags, and
hands it again (:func:`_regex`; Python 3.11 on). Whole ``optimize -q --check 0`` processes
(valgrind, second run): light DenseNet121 4,917 -> 4,641 M, a one-MatMul model 1,217 ->
957 M.

:func:`install` gives each of these modules its own ``exec``, ``eval`` or ``compile``
(:data:`_HOOKS`; a module global, found before the builtin): source text compiled before is
looked up by its text and the code object run as the builtin would have run the text
(compiled the same way, the text and the mode alone determine the code); new text is
compiled and added. The code is read from and written to
``$XDG_CACHE_HOME/onnx-cinm/compiled/<interpreter tag>.marshal`` (``~/.cache`` when
XDG_CACHE_HOME is unset or empty), headed by the interpreter's bytecode magic number
(:data:`importlib.util.MAGIC_NUMBER`, as a ``.pyc`` is) and the regular-expression engine's
(``_sre.MAGIC``): a file another interpreter wrote,
a damaged or unreadable file, or one that cannot be written is ignored, never an error.
Only the command line installs it (:mod:`onnx_cinm.cli`); ``import onnx_cinm`` as a library
leaves the interpreter's modules as they are.
"""
from __future__ import annotations

import atexit
import builtins
import collections
import dataclasses
import marshal
import os
import re
import sys
import threading
import types
import typing
from importlib.util import MAGIC_NUMBER

import _sre

#: Source text (prefixed with ``mode\\0`` unless compiled for ``exec``) -> code object: read
#: from the file, then added to as this process compiles.
_code: dict = {}
#: The texts looked up in this process (what a file grown past :data:`MAX_ENTRIES` keeps).
_used: set = set()
#: How many texts and patterns this process compiled (none when all were in the file).
compiled = 0
#: How many of them were source text (not patterns): the file is written only when some were.
#: A pattern alone may be made from the command's own arguments (artifacts' pattern of the
#: output's leftover temporaries names the output file), a new one every run: written for
#: itself, it would rewrite the whole file after every command.
compiled_text = 0
#: Entries beyond which the file is written again with this process's entries only (the
#: classes of older versions of the code are dropped): about 280 are used per command.
MAX_ENTRIES = 4000
_path: str | None = None
#: A cache file's first bytes: the interpreter's bytecode and regular-expression code versions
_HEADER = MAGIC_NUMBER + _sre.MAGIC.to_bytes(4, "little")


def cache_file() -> str:
    """The path of the cache file for this interpreter (see the module's docstring)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = getattr(sys.implementation, "cache_tag", None) or "python"
    return os.path.join(base, "onnx-cinm", "compiled", tag + ".marshal")


def _code_of(source: str, mode: str):
    """The code ``compile(source, "<string>", mode)`` gives, from the table or compiled and
    added: as the builtins compile text for the modules hooked here (file ``'<string>'``, no
    future features inherited from this module: those modules' own code has none)."""
    global compiled, compiled_text
    key = source if mode == "exec" else f"{mode}\0{source}"
    code = _code.get(key)
    if code is None:
        code = _code[key] = compile(source, "<string>", mode, dont_inherit=True)
        compiled += 1
        compiled_text += 1
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


#: The arguments ``re``'s compiler last handed to ``_sre.compile`` in this thread.
_sre_args = threading.local()


def _sre_compile(*args):
    """``_sre.compile`` for ``re``'s compiler: its arguments recorded (:func:`_regex`)."""
    _sre_args.last = args
    return _sre.compile(*args)


def _regex(pattern, flags=0):
    """``re._compiler.compile`` (what ``re.compile`` runs for a pattern not in its own
    cache): the arguments its parser and compiler, pure Python, hand to ``_sre.compile`` for
    a pattern text and flags are looked up and handed again; a new pattern is compiled by
    ``re``'s compiler and the arguments it hands on recorded."""
    global compiled
    if type(pattern) not in (str, bytes) or type(flags) is not int or flags & re.DEBUG:
        return _re_compile(pattern, flags)
    key = ("re", pattern, flags)
    args = _code.get(key)
    if args is not None:
        _used.add(key)
        return _sre.compile(*args)
    _sre_args.last = None
    compiled_pattern = _re_compile(pattern, flags)
    last = _sre_args.last
    if last is not None and last[0] is pattern:
        # as plain values: the compiler's opcodes are int subclasses, which marshal refuses
        _code[key] = (pattern, int(last[1]), [int(c) for c in last[2]], int(last[3]),
                      dict(last[4]), tuple(last[5]))
        _used.add(key)
        compiled += 1
    return compiled_pattern


#: ``re``'s compiler module (Python 3.11 on; None before, where patterns are not cached), its
#: own ``compile``, and a copy of its ``_sre`` module whose ``compile`` records
_re_compiler = getattr(re, "_compiler", None)
_re_compile = getattr(_re_compiler, "compile", None)
_sre_recording = types.ModuleType(_sre.__name__)
vars(_sre_recording).update(vars(_sre))
_sre_recording.compile = _sre_compile

#: The modules given their own builtin (a module global is found before the builtin).
_HOOKS = ((dataclasses, "exec", _exec), (collections, "eval", _eval),
          (typing, "compile", _compile))


def install() -> None:
    """Read the cache file and route the compiling of :data:`_HOOKS` through it, once per
    process; the new entries are written when the process exits (``atexit``)."""
    global _path
    if _path is not None:
        return
    _path = cache_file()
    _code.update(_read(_path))
    for module, name, hook in _HOOKS:
        if name not in vars(module):  # never over another program's own hook
            setattr(module, name, hook)
    if _re_compile is not None and getattr(_re_compiler, "_sre", None) is _sre:
        _re_compiler._sre = _sre_recording
        _re_compiler.compile = _regex
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
    return {k: v for k, v in table.items()
            if type(k) is str and type(v) is types.CodeType
            or type(k) is tuple and len(k) == 3 and k[0] == "re" and type(v) is tuple
            and len(v) == 6}


def _save() -> None:
    """Write the cache file if this process compiled source text (:data:`compiled_text`),
    atomically (a temporary file in the same folder, renamed over it); failures are
    ignored."""
    if not compiled_text or _path is None:
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
