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
  onnx-cinm optimize --example lenet -o lenet_opt.onnx
  onnx-cinm optimize model.onnx -o model_opt.onnx --place 'Gemm=upmem' --check 3
  onnx-cinm optimize model.onnx -o level1.onnx --stop-after cinm
  onnx-cinm run lenet_opt.onnx --random 3 --profile
  onnx-cinm compare model.onnx model_opt.onnx
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


def _tasklets(text: str) -> int:
    v = _positive(text)
    if v > 24:  # UPMEM SDK: at most 24 tasklets per DPU
        raise argparse.ArgumentTypeError(f"a DPU runs at most 24 tasklets, got {v}")
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
                    help="crossbars on the device (default: the preset's, 4)%(default).0s")
    xb.add_argument("--cim-size", type=_size, default=None, metavar="ROWSxCOLS",
                    help="cells per crossbar, e.g. 128x128 (default: the preset's, 64x64 for "
                         "pcm-occ, 128x128 for reram-isaac)%(default).0s")
    xb.add_argument("--cim-preset", default="pcm-occ", choices=["pcm-occ", "reram-isaac"],
                    help="device parameters: OCC's PCM model or an ISAAC-like ReRAM")
    xb.add_argument("--cim-mode", default="ideal", choices=["ideal", "q8", "q8-noisy"],
                    help="data path of the emitted kernels: 'ideal' (exact fp32), 'q8' (8-bit "
                         "weights with per-channel scales on 2-bit cells in differential pairs, "
                         "8-bit DAC and ADC) or 'q8-noisy' (q8 plus 2%% seeded read noise); the "
                         "check compares the cinm reference bodies, which are exact")
    up = o.add_argument_group("UPMEM options")
    up.add_argument("--upmem-dpus", type=_positive, default=None, metavar="N",
                    help="most DPUs one op may use; the mapping picks the count with the lowest "
                         "modeled time up to this (default: 2048)%(default).0s")
    up.add_argument("--upmem-tasklets", type=_tasklets, default=None, metavar="T",
                    help="tasklets per DPU, 1..24 (default: 16)%(default).0s")
    o.add_argument("--skip-pass", action="append", default=[], metavar="NAME",
                   help="do not run this pass (repeatable; see --list-passes)")
    o.add_argument("--stop-after", metavar="LEVEL", choices=sorted(STOP_LEVELS),
                   help="write the model at this level: 'cinm' (device-agnostic ops), 'placement' "
                        "(ops annotated with devices) or 'device' (with crossbar and UPMEM plans)")
    o.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    o.add_argument("--list-examples", action="store_true", help="list the bundled models and exit")
    o.add_argument("-v", "--verbose", action="store_true", help="print progress and every placement")
    o.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    o.add_argument("--debug", action="store_true", help="show a traceback for internal errors")

    r = sub.add_parser(
        "run", help="run an optimized model: host parts in onnxruntime, device nodes in their kernels",
        description="Run a model written by 'onnx-cinm optimize' through the CINM execution "
                    "provider: host partitions in onnxruntime, crossbar nodes in the simulator "
                    "(their .xbar files), UPMEM nodes by the cost model or in the emulator.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("model", help="optimized .onnx model (kernels in <model>.cinm/)")
    r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                   help="an input array (repeatable); inputs not given are drawn at random")
    r.add_argument("--random", type=_positive, default=1, metavar="N",
                   help="number of runs (random inputs drawn with seeds 0..N-1 where not given)")
    r.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="CinmExecutionProvider option, e.g. upmem_mode=emulate (repeatable)")
    r.add_argument("-o", "--output", metavar="FILE.npz", help="write the last run's outputs here")
    r.add_argument("--profile", action="store_true", help="print the per-node profile")
    r.add_argument("--profile-out", metavar="FILE", help="write the profile records (.json or .csv)")
    r.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    r.add_argument("--debug", action="store_true", help="show a traceback for internal errors")

    c = sub.add_parser(
        "compare", help="run the original in onnxruntime and the optimized model through the provider",
        description="Run the original model in stock onnxruntime and the optimized one through "
                    "the CINM execution provider on the same random inputs; print the largest "
                    "absolute and relative error per output; exit 1 on a mismatch.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    c.add_argument("original", help="the original .onnx model")
    c.add_argument("optimized", help="the optimized .onnx model (kernels in <model>.cinm/)")
    c.add_argument("--runs", type=_positive, default=2, help="random input sets")
    c.add_argument("--rtol", type=_tolerance, default=1e-4, help="relative tolerance")
    c.add_argument("--atol", type=_tolerance, default=1e-5, help="absolute tolerance")
    c.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="CinmExecutionProvider option (repeatable)")
    c.add_argument("--debug", action="store_true", help="show a traceback for internal errors")

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


def _provider_options(items: list[str], parser) -> dict:
    opts: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--provider-option expects KEY=VALUE, got '{item}'")
        opts[key] = int(value) if value.isdigit() else value
    return opts


def _session(path, provider_options: dict):
    from .runtime.session import PROVIDER, InferenceSession

    return InferenceSession(path, providers=[PROVIDER, "CPUExecutionProvider"],
                            provider_options=[provider_options, {}])


def _cmd_run(args, parser) -> int:
    import numpy as np

    from . import golden
    from .runtime import profile

    opts = _provider_options(args.provider_option, parser)
    given: dict = {}
    for item in args.input:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            parser.error(f"--input expects NAME=FILE.npy, got '{item}'")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CinmError(f"cannot read input '{name}' from '{file}': "
                            f"{getattr(e, 'strerror', None) or str(e).splitlines()[0]}") from None
    sess = _session(args.model, opts)
    say = (lambda msg: None) if args.quiet else print
    outs = None
    for i in range(args.random):
        feeds = golden.random_inputs(sess._model, seed=i) if len(given) < len(sess.get_inputs()) else {}
        feeds.update(given)
        outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    say(f"onnx-cinm run: {args.model}, {args.random} run(s), providers {', '.join(sess.get_providers())}")
    for name, arr in zip(names, outs):
        arr = np.asarray(arr)
        say(f"  output {name}: {arr.dtype} {list(arr.shape)}"
            + (f", mean {float(arr.mean()):.6g}" if arr.size and arr.dtype.kind in "fiu" else ""))
    if args.output:
        _save_npz(args.output, dict(zip(names, outs)))
        say(f"  outputs written to {args.output}")
    if args.profile:
        print(profile.table(sess.profile()))
        load = sess.load_profile()
        if load:
            print(f"programmed at load (once per session): {sum(r['writes'] for r in load)} tile "
                  f"writes on {len(load)} crossbar kernels, modeled "
                  f"{sum(r['latency_s'] for r in load) * 1e6:.1f} us, "
                  f"{sum(r['energy_j'] for r in load) * 1e6:.2f} uJ")
    if args.profile_out:
        try:
            profile.write(sess.profile(), args.profile_out)
        except OSError as e:
            raise CinmError(f"cannot write the profile to '{args.profile_out}': {e.strerror}") from None
        say(f"  profile written to {args.profile_out}")
    return 0


def _save_npz(path: str, arrays: dict) -> None:
    import tempfile

    import numpy as np

    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".npz", dir=folder)
    except OSError as e:
        raise CinmError(f"cannot write '{path}': {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _cmd_compare(args, parser) -> int:
    from . import frontend, golden

    opts = _provider_options(args.provider_option, parser)
    frontend.load_model(args.original)  # one-line errors for a bad original
    sess = _session(args.optimized, opts)
    report = golden.compare(args.original, sess.as_runner(), n=args.runs, rtol=args.rtol,
                            atol=args.atol)
    print(f"onnx-cinm compare: {args.original} (onnxruntime) vs {args.optimized} (CINM provider), "
          f"{args.runs} random input set(s)")
    print(report.table())
    print(report.summary())
    return 0 if report.ok else 1


def _device_options(args) -> dict:
    opts = {"cim_loop_order": args.cim_loop_order, "cim_preset": args.cim_preset,
            "cim_mode": args.cim_mode}
    if args.cim_crossbars is not None:
        opts["cim_crossbars"] = args.cim_crossbars
    if args.cim_size is not None:
        opts["cim_rows"], opts["cim_cols"] = args.cim_size
    if args.upmem_dpus is not None:
        opts["upmem_dpus"] = args.upmem_dpus
    if args.upmem_tasklets is not None:
        opts["upmem_tasklets"] = args.upmem_tasklets
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
        if args.command == "run":
            return _cmd_run(args, parser)
        if args.command == "compare":
            return _cmd_compare(args, parser)
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
