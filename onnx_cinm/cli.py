"""The ``onnx-cinm`` command line."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import traceback
from pathlib import Path

from . import __version__
from .errors import CinmError

_EPILOG = """\
examples:
  onnx-cinm optimize --example lenet -o lenet.cinm.onnx
  onnx-cinm optimize model.onnx -o model.cinm.onnx --place 'Gemm=upmem' --check 3
  onnx-cinm optimize model.onnx -o level1.onnx --stop-after cinm
  onnx-cinm devices
"""


def _count(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a positive count, got {v}")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _size(text: str) -> tuple[int, int]:
    rows, sep, cols = text.lower().partition("x")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 64x64, got '{text}'")
    return _positive(rows), _positive(cols)


def _tolerance(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return v


def _parser() -> argparse.ArgumentParser:
    from .passes import STOP_LEVELS

    p = argparse.ArgumentParser(
        prog="onnx-cinm",
        description="Compile ONNX models for compute-in-memory (memristor crossbars) and "
                    "compute-near-memory (UPMEM) devices.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"onnx-cinm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    o = sub.add_parser(
        "optimize", help="rewrite a model into cinm ops placed on devices, checked against the original",
        description="Rewrite an ONNX model into device-agnostic cinm ops, place each on a device "
                    "(memristor crossbar, UPMEM or host) and check that stock onnxruntime computes "
                    "the same outputs on the result as on the original. The output is written only "
                    "after the check passes, through a temporary file and a rename.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = o.add_mutually_exclusive_group()
    src.add_argument("input", nargs="?", help="input .onnx model")
    src.add_argument("--example", metavar="NAME",
                     help="use a model bundled with onnx-cinm instead of a file (see --list-examples)")
    o.add_argument("-o", "--output", help="output .onnx path (required unless listing)")
    o.add_argument("--check", type=_count, default=1, metavar="N",
                   help="random-input runs comparing onnxruntime on input and output; 0 disables")
    o.add_argument("--check-rtol", type=_tolerance, default=1e-4, help="relative tolerance of the check")
    o.add_argument("--check-atol", type=_tolerance, default=1e-5, help="absolute tolerance of the check")
    o.add_argument("--overwrite-input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="bake a static shape into an input (repeatable)")
    o.add_argument("--placement", default="heuristic", choices=["heuristic"],
                   help="placement strategy: 'heuristic' is the CINM paper's (large matmuls with "
                        "constant weights to the crossbar, other cinm ops to UPMEM)")
    o.add_argument("--place", action="append", default=[], metavar="PATTERN=DEVICE",
                   help="placement hint; PATTERN (fnmatch) matches node names or op types, e.g. "
                        "'Gemm=upmem' or '*conv1*=host'; the first matching hint wins (repeatable)")
    o.add_argument("--place-config", metavar="FILE",
                   help="JSON or TOML file with a 'place' table of PATTERN = DEVICE hints")
    xb = o.add_argument_group("crossbar (memristor) options")
    xb.add_argument("--cim-loop-order", default="weight_stationary", choices=["weight_stationary", "naive"],
                    help="tile loop order: weight_stationary (k, n, m) writes each weight tile once "
                         "and keeps it resident; naive (m, n, k) rewrites it for every input row, "
                         "for comparison")
    xb.add_argument("--cim-crossbars", type=_positive, default=None, metavar="P",
                    help="crossbars on the device (default: the preset's, 4)")
    xb.add_argument("--cim-size", type=_size, default=None, metavar="ROWSxCOLS",
                    help="cells per crossbar, e.g. 128x128 (default: the preset's, 64x64)")
    xb.add_argument("--cim-preset", default="pcm-occ", choices=["pcm-occ", "reram-isaac"],
                    help="device parameters: OCC's PCM model or an ISAAC-like ReRAM")
    xb.add_argument("--cim-mode", default="ideal", metavar="MODE",
                    help="'ideal' (exact fp32) or a non-ideal preset such as 'q8' (8-bit weights "
                         "with per-channel scales, 8-bit ADC)")
    o.add_argument("--skip-pass", action="append", default=[], metavar="NAME",
                   help="do not run this pass (repeatable; see --list-passes)")
    o.add_argument("--stop-after", metavar="LEVEL", choices=sorted(STOP_LEVELS),
                   help="write the model at this level: 'cinm' (device-agnostic ops) or 'placement'")
    o.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    o.add_argument("--list-examples", action="store_true", help="list the bundled models and exit")
    o.add_argument("-v", "--verbose", action="store_true", help="print progress and every placement")
    o.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    o.add_argument("--debug", action="store_true", help="show a traceback for internal errors")

    d = sub.add_parser("devices", help="list the registered devices and their parameters")
    d.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    return p


def _cmd_devices(args) -> int:
    from dataclasses import fields

    from .devices import all_devices

    for dev in all_devices():
        print(f"{dev.name} ({dev.paradigm})")
        for f in fields(dev.params):
            print(f"  {f.name} = {getattr(dev.params, f.name)}")
    return 0


def _device_options(args) -> dict:
    opts = {"cim_loop_order": args.cim_loop_order, "cim_preset": args.cim_preset,
            "cim_mode": args.cim_mode}
    if args.cim_crossbars is not None:
        opts["cim_crossbars"] = args.cim_crossbars
    if args.cim_size is not None:
        opts["cim_rows"], opts["cim_cols"] = args.cim_size
    return opts


def _cmd_optimize(args, parser) -> int:
    from . import artifacts, frontend
    from .examples import EXAMPLES, get_example
    from .passes import DEFAULT_PIPELINE, available_passes
    from .passes.placement import load_hints, parse_hint
    from .pipeline import optimize

    if args.list_passes:
        descriptions = available_passes()
        for name in DEFAULT_PIPELINE:
            print(f"{name:20s} {descriptions.get(name, '')}")
        return 0
    if args.list_examples:
        for name, fn in EXAMPLES.items():
            print(f"{name:10s} {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        return 0
    if not args.input and not args.example:
        parser.error("give an input model or --example NAME")
    if not args.output:
        parser.error("the output path -o/--output is required")
    if args.verbose and args.quiet:
        parser.error("-v and -q exclude each other")
    out = Path(args.output)
    if args.input and out.resolve() == Path(args.input).resolve():
        raise CinmError("the output path equals the input path; refusing to overwrite the input")
    say = (lambda msg: None) if args.quiet else print
    log = print if args.verbose else (lambda msg: None)
    try:  # malformed option values are usage errors (exit 2)
        hints = [parse_hint(h) for h in args.place]
        shapes: dict = {}
        for spec in args.overwrite_input_shape:
            name, dims = frontend.parse_shape_spec(spec)
            if name in shapes:
                raise CinmError(f"--overwrite-input-shape given twice for input '{name}'")
            shapes[name] = dims
    except CinmError as e:
        parser.error(str(e))
    if args.place_config:
        hints += load_hints(args.place_config)
    if hints and (args.stop_after == "cinm" or "placement" in args.skip_pass):
        print("onnx-cinm: warning: placement does not run, so --place hints are ignored", file=sys.stderr)
    model = get_example(args.example) if args.example else frontend.load_model(args.input)
    result = optimize(model, placement=args.placement, place=hints, skip=args.skip_pass,
                      stop_after=args.stop_after, input_shapes=shapes, check=args.check,
                      check_rtol=args.check_rtol, check_atol=args.check_atol,
                      device_options=_device_options(args), log=log)
    manifest = artifacts.save(result.model, out, log)
    for hint in result.stats.get("placement", {}).get("unused_hints", []):
        print(f"onnx-cinm: warning: hint {hint} matched no cinm op", file=sys.stderr)
    source = args.input or f"example '{args.example}'"
    say(f"onnx-cinm optimize: {source} -> {out}")
    for line in result.summary().splitlines():
        say(f"  {line}")
    if manifest is not None:
        n_files = sum(len(k["files"]) for k in manifest["kernels"])
        say(f"  kernels: {len(manifest['kernels'])} in {artifacts.artifact_dir(out)}/ "
            f"({n_files} files, listed with hashes in {artifacts.MANIFEST})")
    table = result.crossbar_table()
    if table:
        say("")
        for line in table.splitlines():
            say(f"  {line}")
    if args.verbose:
        for name, op, dev, why in result.placements:
            print(f"  {name:40s} {op:12s} {dev:10s} {why}")
    return 0


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``onnx-cinm`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:  # SIGTERM unwinds like Ctrl-C, so temporary files are removed on the way out
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (embedded use)
        pass
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "devices":
            return _cmd_devices(args)
        return _cmd_optimize(args, parser)
    except CinmError as e:
        print(f"onnx-cinm: error: {e}", file=sys.stderr)
        return 1
    except MemoryError:
        print("onnx-cinm: error: out of memory (are the input shapes right?)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("onnx-cinm: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug of ours: one line unless --debug
        if getattr(args, "debug", False) or os.environ.get("ONNX_CINM_DEBUG"):
            traceback.print_exc()
        else:
            first = str(e).splitlines()[0] if str(e) else ""
            print(f"onnx-cinm: internal error: {type(e).__name__}: {first} "
                  "(rerun with --debug for the traceback, and please report it)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
