"""The ``onnx-cinm`` command line: :func:`main` parses the arguments (:mod:`.args`) and runs one
subcommand module (``cmd_*``), turning every failure into one line and an exit status."""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import signal
import sys
import threading
import traceback

from ..errors import CinmError
from . import clock, compile_cache
from .args import _parser, join_negative_values  # noqa: F401 (tests build the parser)


def _interrupted(args: argparse.Namespace) -> int:
    written = getattr(args, "written", None)
    print(f"onnx-cinm: interrupted after writing {written} (complete)" if written
          else "onnx-cinm: interrupted; nothing was written", file=sys.stderr)
    return 130


def _caused_by_interrupt(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``onnx-cinm`` console script; returns the exit status. Called
    without ``argv`` (the console script, ``python -m onnx_cinm.cli``), the process ends in
    here once the command is done (:func:`_end_process`)."""
    clock.mark(process=argv is None)
    if argv is None:
        _process_gc()
        # before the compiler's modules (imported by the subcommand) define their dataclasses
        # and compile their patterns; a caller's process (main(argv)) is left as it is
        compile_cache.install()
    status = _main(argv)
    if argv is None:
        _end_process(status)
    return status


#: Allocations between collections of the youngest generation, and collections of each
#: generation between collections of the next, in a command's process (Python's defaults:
#: 700, 10, 10). See :func:`_process_gc`.
GC_THRESHOLDS = (50_000, 20, 20)


def _process_gc() -> None:
    """Collect cyclic garbage less often in the console script's process, which runs one
    command and ends: a compile allocates millions of short-lived objects (protobuf and
    onnx_ir nodes, attributes, cost records), and with Python's thresholds about 300 young
    and 25 older collections plus 2 full ones walked them during one ``optimize`` of light
    DenseNet121, 0.12-0.15 s of its 1.3 s of CPU (measured with ``gc.callbacks``). With
    :data:`GC_THRESHOLDS` the same run makes about 30 young collections and no full one, and
    its peak RSS is unchanged (DenseNet121 180 MB, VGG19 1.1 GB, a 1000-layer MLP 564 MB:
    the weights are freed by reference counting, not by the collector). Only the console
    script sets them; :func:`main` called with ``argv`` (tests, another program) leaves the
    caller's process as it is."""
    gc.set_threshold(*GC_THRESHOLDS)


def _end_process(status: int) -> None:
    """End the process with ``status`` now that the command is done and its output flushed,
    after the ``atexit`` handlers, without Python's interpreter teardown: that frees every
    module and every object one at a time and took 0.1-0.5 s after ``optimize`` had finished
    (light ResNet50, measured from the last write to the process's end), more than some
    whole passes. Returns (a normal exit follows) while another thread runs, whose end the
    teardown would wait for, or when the output cannot be flushed (a closed pipe: the usual
    exit reports it), or under a profiler or tracer (``python -m cProfile``, coverage), which
    writes its results after the command returns."""
    if threading.active_count() > 1 or sys.getprofile() is not None or sys.gettrace() is not None:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()  # what the teardown would run first (multiprocessing's clean-up)
    os._exit(status)


def _quiet(argv: list[str]) -> bool:
    """Whether the command line asks for ``-q``/``--quiet`` (before any ``--``), known before
    the parser exists (building it loads the device plugins, whose failures are warnings)."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    return "-q" in head or "--quiet" in head


def _main(argv: list[str] | None) -> int:
    devices = None
    try:
        from .. import devices

        argv = join_negative_values(sys.argv[1:] if argv is None else list(argv))
        # the parser loads the device plugins (their options are flags), before the arguments
        # are parsed: a plugin's failure is printed as it happens, before a usage error or the
        # help that may concern its options, unless -q asks for nothing but errors
        devices.echo_plugin_errors(not _quiet(argv))
        parser = _parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the subcommand they were given to
            getattr(args, "command_parser", parser).error(
                f"unrecognized arguments: {' '.join(extra)}")
    except KeyboardInterrupt:  # Ctrl-C while starting up
        return _interrupted(argparse.Namespace())
    except Exception as e:  # Ctrl-C inside a C extension's import (numpy's): an ImportError
        if _caused_by_interrupt(e):
            return _interrupted(argparse.Namespace())
        raise
    finally:
        if devices is not None:
            devices.echo_plugin_errors(True)
    try:  # SIGTERM unwinds like Ctrl-C, so temporary files are removed on the way out
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (embedded use)
        return _dispatch(args, parser)
    try:
        return _dispatch(args, parser)
    except KeyboardInterrupt:  # landed after the command had finished and reported
        print("onnx-cinm: interrupted after the command finished", file=sys.stderr)
        return 130
    finally:
        if argv is None:  # the console script: the process exits next, and a late Ctrl-C must
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # not turn a finished run into -2
        # an embedding process (a test run, a notebook) gets its own SIGTERM handler back
        signal.signal(signal.SIGTERM, previous)


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the chosen subcommand; turn every failure into a one-line message and an exit code."""
    if args.command is None:
        parser.print_help()
        return 2
    parser = args.command_parser
    try:
        # the one subcommand's module is imported: the others' are never run in this process
        if args.command == "devices":
            from .cmd_devices import _cmd_devices
            return _cmd_devices(args)
        if args.command == "run":
            from .cmd_run import _cmd_run
            return _cmd_run(args, parser)
        if args.command == "compare":
            from .cmd_run import _cmd_compare
            return _cmd_compare(args, parser)
        if args.command == "report":
            from .cmd_report import _cmd_report
            return _cmd_report(args)
        if args.command == "sweep":
            from .cmd_sweep import _cmd_sweep
            return _cmd_sweep(args, parser)
        if args.command == "evaluate":
            from .cmd_evaluate import _cmd_evaluate
            return _cmd_evaluate(args, parser)
        from .cmd_optimize import _cmd_optimize
        return _cmd_optimize(args, parser)
    except CinmError as e:
        print(f"onnx-cinm: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` or similar: stop quietly, like Unix tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as e:  # the file system said no (a name too long, a full disk, ...)
        where = f" '{e.filename}'" if getattr(e, "filename", None) else ""
        print(f"onnx-cinm: error: cannot access{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print("onnx-cinm: error: out of memory (are the input shapes right?)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return _interrupted(args)
    except Exception as e:  # noqa: BLE001 - a bug of ours: one line unless --debug
        if _caused_by_interrupt(e):  # e.g. Ctrl-C inside a C extension's import: ImportError
            return _interrupted(args)
        if getattr(args, "debug", False) or os.environ.get("ONNX_CINM_DEBUG"):
            traceback.print_exc()
        else:
            first = str(e).splitlines()[0] if str(e) else ""
            print(f"onnx-cinm: internal error: {type(e).__name__}: {first} "
                  "(rerun with --debug for the traceback, and please report it)", file=sys.stderr)
        return 3
