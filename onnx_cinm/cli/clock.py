"""Where a command's wall time starts: the process's start as the OS records it, so the
``wall:`` line of ``optimize`` also counts the start-up before the command's own code runs
(the interpreter, the imports, building the argument parser: about 0.4 s, s24 trial #6) -
unless the process ran something else first: a shell that ``exec``s its last command
(``bash -c "pip install ... && onnx-cinm optimize ..."``, an ``exec`` wrapper, a container's
``sh -c`` entry point) hands its process, and the time since it started, to the interpreter
(a fresh user, s35: 'start-up 17.93 s', the pip install's)."""
from __future__ import annotations

import os
import time

#: ``time.perf_counter()`` at the start of the process (console script) or at :func:`main`'s
#: entry (called with arguments, or where the OS does not say); set by :func:`mark`
origin: float | None = None

#: Seconds the interpreter may take from the process's start to the first line of the
#: ``onnx_cinm`` package (its own start-up, ``site``, the console script's shim: 20-30 ms
#: measured here, with room for a cold disk). A process older than that when the package
#: started ran something else before the interpreter: its start is not the command's.
INTERPRETER_MAX_S = 0.5


def process_age() -> float | None:
    """Seconds since this process started, from Linux's ``/proc/self/stat`` field 22
    (``starttime``, clock ticks since boot; proc(5)) against ``/proc/uptime`` (seconds since
    boot) and ``os.sysconf('SC_CLK_TCK')`` ticks per second: a resolution of one tick
    (10 ms at the usual 100 Hz) on each side. None where these are missing (not Linux) or
    unreadable, or the figure is negative."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        # field 2 (the command name, in parentheses) may hold spaces: count after its ')'
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None


def mark(process: bool) -> None:
    """Set :data:`origin`: the process's start when ``process`` (the console script, whose
    process runs this one command) and the OS tells it, else now (the command line's first
    line, e.g. :func:`onnx_cinm.cli.main` called with arguments from another program). A
    process that was more than :data:`INTERPRETER_MAX_S` old when the ``onnx_cinm`` package's
    first line ran had run another program before (see the module's docstring): the clock
    starts at that first line then, leaving out the interpreter's own start-up."""
    global origin
    import onnx_cinm

    now = time.perf_counter()
    age = process_age() if process else None
    first = now - onnx_cinm._FIRST_LINE  # seconds since the package's first line
    if age is not None and age - first > INTERPRETER_MAX_S:
        age = first
    origin = now - age if age is not None else now
