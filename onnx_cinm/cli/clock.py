"""Where a command's wall time starts: the process's start as the OS records it, so the
``wall:`` line of ``optimize`` also counts the start-up before the command's own code runs
(the interpreter, the imports, building the argument parser: about 0.4 s, s24 trial #6)."""
from __future__ import annotations

import os
import time

#: ``time.perf_counter()`` at the start of the process (console script) or at :func:`main`'s
#: entry (called with arguments, or where the OS does not say); set by :func:`mark`
origin: float | None = None


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
    line, e.g. :func:`onnx_cinm.cli.main` called with arguments from another program)."""
    global origin
    now = time.perf_counter()
    age = process_age() if process else None
    origin = now - age if age is not None else now
