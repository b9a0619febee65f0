"""The command line's cache of the code ``@dataclass``, ``namedtuple`` and ``typing``
compile (onnx_cinm.cli.compile_cache):
a second process compiles nothing, the classes behave as Python's own, and a damaged,
foreign or unwritable cache is ignored."""
from __future__ import annotations

import marshal
import os
import subprocess
import sys
from importlib.util import MAGIC_NUMBER


import pytest

# the command line's `devices` listing in a child process; prints how many dataclass methods
# that process compiled (stderr's last line) after its own output
_DEVICES = """
import sys
from onnx_cinm.cli import main, compile_cache
compile_cache.install()  # as the console script's main() does before the subcommand's imports
status = main(["devices"])
print(compile_cache.compiled, file=sys.stderr)
sys.exit(status)
"""

# a dataclass with every generated method kind, a namedtuple, forward references and regular
# expressions (str and bytes, groups, flags, an error), made where
# the cache is installed; the expected lines below are what Python gives (written out by hand)
_BEHAVIOUR = r"""
import collections, dataclasses, inspect, sys, typing
from onnx_cinm.cli import compile_cache
compile_cache.install()

@dataclasses.dataclass(frozen=True, order=True)
class P:
    x: int
    y: list = dataclasses.field(default_factory=list)

print(repr(P(1)))
print(P(1) == P(1, []), P(1) < P(2), hash(P(3, ())) == hash(P(3, ())))
print(inspect.signature(P))
try:
    P(1).x = 2
except dataclasses.FrozenInstanceError as e:
    print("frozen", e)
N = collections.namedtuple("N", "a b")
print(N(1, b=2), N._make([3, 4]))
def f(x: "int") -> "list[str]": pass
print(typing.get_type_hints(f))
try:
    typing.ForwardRef("1 +")
except SyntaxError as e:
    print(e)
import re
p = re.compile(r"(?P<word>[a-z]+)-(\d+)(x)?", re.IGNORECASE)
m = p.search("..ab-12 cd-3x")
print(p.groups, p.groupindex["word"], p.flags == re.IGNORECASE | re.UNICODE, m.groups())
print(re.compile(rb"\x00+(.)").findall(b"a\x00\x00b\x00c"), re.sub(r"(\w)(\w*)", r"\2\1", "ab cd"))
try:
    re.compile("(unclosed")
except re.error as e:
    print(e)
print(compile_cache.compiled > 0, file=sys.stderr)
"""

_EXPECTED = ("P(x=1, y=[])\nTrue True True\n(x: int, y: list = <factory>) -> None\n"
             "frozen cannot assign to field 'x'\nN(a=1, b=2) N(a=3, b=4)\n"
             "{'x': <class 'int'>, 'return': list[str]}\n"
             "Forward reference must be an expression -- got '1 +'\n"
             "3 1 True ('ab', '12', None)\n[b'b', b'c'] ba dc\n"
             "missing ), unterminated subpattern at position 0\n")


def _child(code: str, cache, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, check=False)


def _file(cache):
    return cache / "onnx-cinm" / "compiled" / f"{sys.implementation.cache_tag}.marshal"


def _compiled(run: subprocess.CompletedProcess) -> int:
    assert run.returncode == 0, run.stderr
    return int(run.stderr.split()[-1])


def test_second_process_compiles_no_dataclass(tmp_path):
    first, second = (_child(_DEVICES, tmp_path) for _ in range(2))
    # onnx-cinm's own 52 dataclasses each get an __init__ at least
    assert _compiled(first) >= 52
    assert _compiled(second) == 0
    assert first.stdout == second.stdout and "memristor" in first.stdout
    assert _file(tmp_path).read_bytes().startswith(_HEADER)


def test_cached_dataclasses_behave_as_compiled_ones(tmp_path):
    runs = [_child(_BEHAVIOUR, tmp_path) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout == _EXPECTED
    assert [r.stderr.split()[-1] for r in runs] == ["True", "False"]  # compiled, then cached


_HEADER = MAGIC_NUMBER


@pytest.mark.parametrize("content", [
    b"", _HEADER, _HEADER + b"\x01garbage", _HEADER + marshal.dumps(["not", "a", "dict"]),
    b"\x00\x00\r\n" + marshal.dumps({"x = 1": compile("x = 1", "<string>", "exec")}),
    (int.from_bytes(MAGIC_NUMBER[:2], "little") + 1).to_bytes(2, "little") + MAGIC_NUMBER[2:]
    + marshal.dumps({})])
def test_damaged_or_foreign_cache_is_compiled_afresh(tmp_path, content):
    """Empty, cut short, not a table, or another interpreter's magic number (two): ignored,
    and the file is written anew with what this process compiled."""
    _file(tmp_path).parent.mkdir(parents=True)
    _file(tmp_path).write_bytes(content)
    first = _child(_DEVICES, tmp_path)
    assert _compiled(first) >= 52
    data = _file(tmp_path).read_bytes()
    assert data.startswith(_HEADER)
    assert len(marshal.loads(data[len(_HEADER):])) == _compiled(first)
    assert _compiled(_child(_DEVICES, tmp_path)) == 0


def test_unwritable_cache_is_ignored(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("a file, not a folder")
    runs = [_child(_DEVICES, cache) for _ in range(2)]
    assert _compiled(runs[0]) >= 52 and _compiled(runs[1]) == _compiled(runs[0])
    assert runs[0].stdout == runs[1].stdout


def test_console_script_installs_the_cache_and_main_argv_does_not(tmp_path):
    """Reviewer s29: importing onnx_cinm.cli installed the cache in any process (pytest, a
    program calling main(argv)); only the console script's process (main() without argv)
    does."""
    run = _child("import dataclasses, sys; from onnx_cinm.cli import main; "
                 "s = main(['devices']); print('exec' in vars(dataclasses)); sys.exit(s)", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "False" and not _file(tmp_path).exists()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "onnx_cinm.cli", "devices"], capture_output=True,
                         text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    assert _file(tmp_path).read_bytes().startswith(_HEADER)


def test_no_known_home_caches_nothing(tmp_path):
    """Reviewer s29: without HOME and a passwd entry, expanduser('~') stays '~' and every
    command made a folder '~/.cache/...' in the working directory; now nothing is cached."""
    run = subprocess.run(
        [sys.executable, "-c", "import os; os.path.expanduser = lambda p: p; "
         "from onnx_cinm.cli import compile_cache; compile_cache.install(); "
         "from onnx_cinm import usercache; print(compile_cache._path, usercache.cache_dir('x'))"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
        env={k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "None None\n" and not list(tmp_path.iterdir())


def test_library_import_leaves_dataclasses_alone(tmp_path):
    run = _child("import collections, dataclasses, re, typing, onnx_cinm.pipeline; "
                 "print('exec' in vars(dataclasses), 'eval' in vars(collections), "
                 "'compile' in vars(typing))", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "False False False\n"
    assert not _file(tmp_path).exists()


def test_grown_cache_keeps_only_this_process_entries(tmp_path, monkeypatch):
    from onnx_cinm.cli import compile_cache as dc

    path = tmp_path / "c.marshal"
    code = {f"x = {i}": compile(f"x = {i}", "<string>", "exec") for i in range(5)}
    monkeypatch.setattr(dc, "_path", str(path))
    monkeypatch.setattr(dc, "_code", dict(code))
    monkeypatch.setattr(dc, "_used", {"x = 1", "x = 3"})
    monkeypatch.setattr(dc, "compiled", 1)
    monkeypatch.setattr(dc, "MAX_ENTRIES", 5)
    dc._save()  # 5 entries: all kept
    assert sorted(dc._read(str(path))) == sorted(code)
    monkeypatch.setattr(dc, "MAX_ENTRIES", 4)
    dc._save()  # past the limit: only the two used here
    assert sorted(dc._read(str(path))) == ["x = 1", "x = 3"]
    monkeypatch.setattr(dc, "compiled", 0)
    path.unlink()
    dc._save()  # nothing compiled: nothing written
    assert not path.exists()
