"""The ``onnx-cinm`` command line."""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import traceback
import zipfile
from pathlib import Path

from . import __version__
from .errors import CinmError, ReferenceFailed
from .text import Column, printable, si, table

_EPILOG = """\
examples:
  onnx-cinm optimize --example lenet -o lenet_opt.onnx
  onnx-cinm optimize model.onnx -o model_opt.onnx --place 'Gemm=upmem' --check 3
  onnx-cinm optimize model.onnx -o level1.onnx --stop-after cinm
  onnx-cinm optimize model.onnx -o out.onnx --placement cost --objective energy --report out.report
  onnx-cinm report out.onnx -o out.report
  onnx-cinm optimize model.onnx -o out.onnx --config options.toml --cim-rows 128
  onnx-cinm sweep model.onnx --set crossbar.size=64x64,128x128 --set cim.crossbars=4,64 -o sweep/
  onnx-cinm run lenet_opt.onnx --random 3 --profile
  onnx-cinm compare model.onnx model_opt.onnx
  onnx-cinm devices
"""


class _HelpFormatter(argparse.HelpFormatter):
    """Show an option's default in its help, unless it has none to show (None, off, empty)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def _common(p: argparse.ArgumentParser, quiet: bool = True) -> None:
    """The flags every subcommand takes: -q (unless it prints nothing else) and --debug."""
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--debug", action="store_true", help="show a traceback for internal errors")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return v


def _checked(parse, ok, must: str):
    """An argparse type: ``parse(text)``, then a usage error 'must be MUST' unless ``ok``."""
    def convert(text: str):
        v = parse(text)
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return v
    return convert


_count = _checked(_int, lambda v: v >= 0, "0 (off) or a positive count")
_positive = _checked(_int, lambda v: v >= 1, "a positive integer")
_tolerance = _checked(_number, lambda v: v >= 0, "a number >= 0")


_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0,
          "y": 365.25 * 86400.0}


def _duration(text: str) -> float:
    """``'1h'`` -> 3600.0: a number of seconds, with an optional unit s, min (or m), h, d, w, y."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*", text)
    if not m or m.group(2) not in _UNITS and m.group(2) != "":
        raise argparse.ArgumentTypeError(f"expected a time like 10s, 1h, 1d or 1y, got '{text}'")
    return float(m.group(1)) * _UNITS.get(m.group(2), 1.0)


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 64x64, got '{text}'")
    return _positive(parts[0]), _positive(parts[1])


def _typed(spec, parse=None):
    """An argparse type for option ``spec``: the text read as the option's type and checked
    against its declaration (:func:`onnx_cinm.options.from_text`), or by ``parse`` first (an
    alias's own format, e.g. a duration); a bad value is a usage error naming the option."""
    from .options import check, from_text

    def convert(text: str):
        try:
            return check(spec, parse(text)) if parse else from_text(spec, text)
        except CinmError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


#: Option keys with a hand-written flag instead of a generated one (``--place`` is repeatable).
_HAND_WRITTEN = {"place"}
#: Metavars of generated flags whose values have a format of their own.
_METAVARS = {"host_roofline": "GFLOPS,GBPS[,W]|nominal|measure", "cim_effects": "E1,E2|none",
             "lower_ops": "OP1,OP2"}


def _option_flags(p: argparse.ArgumentParser, schema: dict) -> None:
    """A flag ``--KEY`` (``_`` as ``-``) for every option of ``schema``, grouped by section,
    typed, checked and documented (help, range, unit, default) by the option's declaration
    (:mod:`onnx_cinm.options`); ``--no-KEY`` too for a true/false option. Every flag defaults
    to None, "not given": the option's declared default applies unless ``--config`` sets it.
    The older hand-written spellings stay as aliases: ``--cim-size ROWSxCOLS``, ``--cim-time T``
    (with a unit: 10s, 1h, 1d, 1y), ``--per-kernel-crossbars``."""
    from .devices import device_names
    from .options import help_text

    groups: dict = {}
    for key, spec in schema.items():
        if key in _HAND_WRITTEN:
            continue
        g = groups.get(spec.section)
        if g is None:
            owner = f"device {spec.owner}" if spec.owner in device_names() else f"pass {spec.owner}"
            g = groups[spec.section] = p.add_argument_group(
                f"{owner} options (--config table [{spec.section}])")
        flag = "--" + key.replace("_", "-")
        text = help_text(spec).replace("%", "%%")
        if spec.type is bool:
            g.add_argument(flag, dest=key, default=None, action=argparse.BooleanOptionalAction,
                           help=text)
        else:
            allowed = spec.allowed()
            metavar = _METAVARS.get(key) or ("|".join(allowed) if allowed and spec.type is str
                                             else {int: "N", float: "X"}.get(spec.type, "VALUE"))
            g.add_argument(flag, dest=key, default=None, type=_typed(spec), metavar=metavar,
                           choices=allowed if spec.type is str else None, help=text)
        if key == "cim_crossbars":
            g.add_argument("--cim-size", type=_size, default=None, metavar="ROWSxCOLS",
                           help="cells per crossbar, e.g. 128x128: --cim-rows and --cim-cols "
                                "at once")
        elif key == "cim_time_s":
            g.add_argument("--cim-time", dest=key, type=_typed(spec, _duration), metavar="T",
                           help="--cim-time-s with a unit: 10s, 1h, 1d, 1y")
        elif key == "crossbar_residency":
            g.add_argument("--per-kernel-crossbars", dest=key, action="store_const", const=False,
                           help="--no-crossbar-residency: an optimistic estimate, as the CINM "
                                "paper's (the crossbar plans still share the device's crossbars)")


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml",
                   help="options from a TOML file, one table per section of the flags below "
                        "([cim] rows = 64, [upmem] dpus = 256, [placement] objective = "
                        "\"energy\"); flags given on the command line win")


def _pass_options(args, parser) -> dict:
    """The pass options of ``optimize`` or ``sweep``: the ``--config`` file's, then the flags
    given, checked together (:func:`onnx_cinm.passes.check_options`). A bad file is an error
    naming it (exit 1); flags that contradict each other or the file are a usage error
    (exit 2)."""
    from .options import load_config
    from .passes import check_options, option_schema

    schema = option_schema()
    opts: dict = {}
    if getattr(args, "config", None):
        opts = load_config(args.config, schema)
        try:
            check_options(opts)
        except CinmError as e:
            raise CinmError(f"config '{args.config}': {e}") from None
    opts.update({k: getattr(args, k) for k in schema if getattr(args, k, None) is not None})
    size = getattr(args, "cim_size", None)
    if size is not None:  # --cim-size: both at once, unless --cim-rows/--cim-cols are given
        for key, v in zip(("cim_rows", "cim_cols"), size):
            if getattr(args, key, None) is None:
                opts[key] = v
    try:
        return check_options(opts)
    except CinmError as e:
        parser.error(str(e))


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line naming the (sub)command, with a pointer to its --help; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    from .passes import STOP_LEVELS, option_schema

    p = _Parser(
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
        formatter_class=_HelpFormatter)
    src = o.add_mutually_exclusive_group()
    src.add_argument("input", nargs="?", help="input .onnx model")
    src.add_argument("--example", metavar="NAME",
                     help="use a model bundled with onnx-cinm instead of a file (see --list-examples)")
    o.add_argument("-o", "--output", help="output .onnx path (required unless listing)")
    o.add_argument("--check", type=_count, default=1, metavar="N",
                   help="random-input runs comparing onnxruntime on input and output; 0 disables")
    o.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension, e.g. sequence=512 (repeatable): FLOPs, "
                        "placement, tiling, mapping and the check use it, and the model records it "
                        "for run and compare; dims without a size are planned as 1")
    o.add_argument("--input", action="append", default=[], dest="feed", metavar="NAME=FILE.npy|FILE.npz",
                   help="check on real data: " + _INPUT_HELP + "; with every input given, the "
                        "check runs once, on them")
    _tolerance_options(o, "--check-rtol", "--check-atol", " of the check")
    o.add_argument("--overwrite-input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="bake a static shape into an input (repeatable)")
    o.add_argument("--report", metavar="DIR",
                   help="also write the report (table, PNG pictures, HTML page) into DIR")
    o.add_argument("--place", action="append", default=[], metavar="PATTERN=DEVICE",
                   help="placement hint; PATTERN (fnmatch) matches node names or op types, e.g. "
                        "'Gemm=upmem' or '*conv1*=host'; the first matching hint wins (repeatable)")
    o.add_argument("--place-config", metavar="FILE",
                   help="JSON or TOML file with a 'place' table of PATTERN = DEVICE hints")
    o.add_argument("--skip-pass", action="append", default=[], metavar="NAME",
                   help="do not run this pass (repeatable; see --list-passes)")
    o.add_argument("--stop-after", metavar="LEVEL", choices=sorted(STOP_LEVELS),
                   help="write the model at this level: 'cinm' (device-agnostic ops), 'placement' "
                        "(ops annotated with devices), 'paradigm' (with crossbar tiles and "
                        "near-memory workgroups) or 'device' (with costs and kernel paths)")
    o.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    o.add_argument("--list-examples", action="store_true", help="list the bundled models and exit")
    o.add_argument("-v", "--verbose", action="store_true", help="print progress and every placement")
    _common(o)
    _config_option(o)
    schema = option_schema()
    _option_flags(o, schema)

    r = sub.add_parser(
        "run", help="run an optimized model: host parts in onnxruntime, device nodes in their kernels",
        description="Run a model written by 'onnx-cinm optimize' through the CINM execution "
                    "provider: host partitions in onnxruntime, crossbar nodes in the simulator "
                    "(their .xbar files), UPMEM nodes by the cost model or in the emulator.",
        formatter_class=_HelpFormatter)
    r.add_argument("model", help="optimized .onnx model (kernels in <model>.cinm/)")
    _input_options(r)
    r.add_argument("--random", type=_positive, default=1, metavar="N",
                   help="number of runs (random inputs drawn with seeds 0..N-1 where not given)")
    r.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="CinmExecutionProvider option, e.g. upmem_mode=emulate (repeatable)")
    r.add_argument("-o", "--output", metavar="FILE.npz", help="write the last run's outputs here")
    r.add_argument("--profile", action="store_true", help="print the per-node profile")
    r.add_argument("--profile-out", metavar="FILE", help="write the profile records (.json or .csv)")
    _common(r)

    c = sub.add_parser(
        "compare", help="run the original in onnxruntime and the optimized model through the provider",
        description="Run the original model in stock onnxruntime and the optimized one through "
                    "the CINM execution provider on the same inputs (random, or --input files); "
                    "print the largest "
                    "absolute and relative error per output; exit 1 on a mismatch.",
        formatter_class=_HelpFormatter)
    c.add_argument("original", nargs="?", help="the original .onnx model (or --example NAME)")
    c.add_argument("optimized", help="the optimized .onnx model (kernels in <model>.cinm/)")
    c.add_argument("--example", metavar="NAME",
                   help="a bundled example model as the original (see optimize --list-examples)")
    _input_options(c)
    c.add_argument("--runs", type=_positive, default=2,
                   help="input sets (random where not given by --input; seeds 0..N-1)")
    _tolerance_options(c, "--rtol", "--atol", "")
    c.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="CinmExecutionProvider option (repeatable)")
    _common(c, quiet=False)

    rp = sub.add_parser(
        "report", help="per-layer table, totals and pictures (PNG, HTML) of an optimized model",
        description="Read an optimized model and write layers.csv, time_energy.png, graph.png and "
                    "a self-contained report.html into a folder; print the per-layer table. "
                    "Costs are priced with the options the model was compiled with and, unless "
                    "--host-roofline says otherwise, the host figures it was optimized with.",
        formatter_class=_HelpFormatter)
    rp.add_argument("model", help="optimized .onnx model")
    rp.add_argument("-o", "--output", metavar="DIR", help="report folder (default: <model>.report/)")
    _option_flags(rp, {"host_roofline": schema["host_roofline"]})
    rp.add_argument("--all-nodes", action="store_true", help="print every node, not only cinm ops")
    _common(rp)

    sw = sub.add_parser(
        "sweep", help="compile a model under every combination of device parameters",
        description="Evaluate the cartesian product of --set values (modeled latency, energy, "
                    "writes of the compiled plans; no inference runs) in parallel worker processes "
                    "or on a Dask cluster; write sweep.csv and sweep.png.",
        formatter_class=_HelpFormatter)
    sw.add_argument("input", help="input .onnx model")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2,...", dest="sets",
                    help="values of one option (repeatable); keys: SECTION.NAME of every option "
                         "below (e.g. cim.rows, cim.crossbars, upmem.dpus, placement.objective; "
                         "the names of a list option joined by +), and crossbar.size "
                         "(ROWSxCOLS), crossbar.count, crossbar.loop_order, crossbar.preset")
    sw.add_argument("-o", "--output", metavar="DIR", required=True, help="folder for sweep.csv and sweep.png")
    sw.add_argument("--executor", default="process", choices=["process", "dask", "serial"],
                    help="local worker processes, a Dask cluster (--scheduler), or in this process")
    sw.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    sw.add_argument("--workers", type=_positive, default=None, metavar="N",
                    help="local worker processes (default: CPU count)%(default).0s")
    sw.add_argument("--overwrite-input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                    help="bake a static shape into an input (repeatable)")
    sw.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                    help="size of a symbolic dimension to plan at, e.g. sequence=512 (repeatable; "
                         "default: the sizes the model records, else 1)")
    _common(sw)
    _config_option(sw)
    _option_flags(sw, schema)  # the options of every configuration, unless swept

    d = sub.add_parser("devices", help="list the registered devices and their parameters")
    d.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    for command_parser in (o, r, c, rp, sw, d):  # usage errors name the subcommand
        command_parser.set_defaults(command_parser=command_parser)
    return p


_INPUT_HELP = ("an input array NAME=FILE.npy, or FILE.npz holding arrays by input name "
               "(repeatable); inputs not given are drawn at random")


def _tolerance_options(p, rtol: str, atol: str, what: str) -> None:
    """The golden check's tolerance flags; None (default) lets each output's dtype decide
    (:func:`onnx_cinm.golden.default_tolerance`)."""
    for flag, kind, f32 in ((rtol, "relative", "1e-4"), (atol, "absolute", "1e-5")):
        p.add_argument(flag, type=_tolerance, default=None,
                       help=f"{kind} tolerance{what} (default: by output dtype, {f32} for "
                            "float32, 4 ulps = 0.0039 for float16)")


def _input_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--input", action="append", default=[], dest="feed",
                    metavar="NAME=FILE.npy|FILE.npz", help=_INPUT_HELP)
    sp.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                    help="size of a symbolic dimension of the random inputs, e.g. batch=8 "
                         "(repeatable; default: the sizes the model was optimized for, else "
                         "1 on axis 0 and 8 elsewhere)")


def _dims(items: list[str], parser) -> dict[str, int]:
    """``{name: size}`` from ``--dim NAME=SIZE`` options (a usage error if malformed)."""
    dims: dict = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            parser.error(f"--dim expects NAME=SIZE with a positive integer SIZE, got '{item}'")
        dims[name] = int(size)
    return dims


def _input_files(items: list[str]) -> list[str]:
    """The files named by ``--input`` options (to protect them from being overwritten)."""
    return [item.partition("=")[2] if "=" in item else item for item in items]


def _given_inputs(args, parser) -> tuple[dict, dict]:
    """``(arrays, dims)`` from ``--input NAME=FILE.npy`` / ``--input FILE.npz`` and
    ``--dim NAME=SIZE``."""
    import numpy as np

    dims = _dims(args.dim, parser)
    given: dict = {}

    def add(name: str, arr, where: str) -> None:
        if name in given:
            parser.error(f"--input given twice for '{name}' (again in {where})")
        given[name] = arr

    for item in args.feed:
        name, sep, file = item.partition("=")
        if not sep and item.lower().endswith(".npz"):
            file = item
        elif not sep or not name or not file:
            parser.error(f"--input expects NAME=FILE.npy or FILE.npz, got '{item}'")
        try:
            data = np.load(file, allow_pickle=False)
            if sep and not isinstance(data, np.ndarray):
                raise ValueError("not a .npy array file (an .npz archive? give it without NAME=)")
            if not sep:
                if not isinstance(data, np.lib.npyio.NpzFile):
                    raise ValueError("not an .npz archive")
                with data:
                    arrays = {k: data[k] for k in data.files}
                if not arrays:
                    raise ValueError("the archive holds no arrays")
                for k, arr in arrays.items():
                    add(k, arr, file)
                continue
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # EOF: empty or cut off
            kind = ".npy array file" if sep else ".npz archive"
            why = getattr(e, "strerror", None) or (str(e).splitlines() or ["truncated"])[0]
            if isinstance(e, (EOFError, zipfile.BadZipFile)):
                why = f"not a {kind} ({os.path.getsize(file)} bytes, cut off)"
            if "pickled" in why:  # never suggest loading untrusted pickles
                why = f"not a {kind}"
            what = f"input '{name}'" if sep else "inputs"
            raise CinmError(f"cannot read {what} from '{file}': {why}") from None
        add(name, data, file)
    return given, dims


def _check_writable_folder(folder: str, what: str) -> None:
    """Raise CinmError unless ``folder`` is, or can be created as, a writable folder."""
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise CinmError(f"{what} folder '{folder}' exists and is not a folder")
    existing = p
    while not existing.exists():  # the nearest ancestor that exists must take new entries
        existing = existing.parent
    if not existing.is_dir():
        raise CinmError(f"cannot create the {what} folder '{folder}': '{existing}' is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CinmError(f"cannot write the {what} into '{folder}': '{existing}' is not writable")


def _check_output_file(target: str, option: str, protected: dict) -> None:
    """Raise CinmError if ``target`` (an output file of ``option``) names a folder, a folder that
    does not exist, or would overwrite one of ``protected`` (``{path: what it is}``; a folder
    protects everything inside it)."""
    p = Path(target)
    if target.endswith(("/", os.sep)) or p.is_dir():
        raise CinmError(f"{option} '{target}' names a folder, not a regular file")
    if not p.resolve().parent.is_dir():
        raise CinmError(f"cannot write '{target}': folder '{p.parent}' does not exist")
    resolved = p.resolve()
    for path, what in protected.items():
        q = Path(path).resolve()
        if resolved == q or q in resolved.parents:
            verb = "overwrite" if resolved == q else "write into"
            raise CinmError(f"{option} '{target}' would {verb} {what}; choose another path")


def _attribute_docs(cls) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` section of a dataclass docstring
    (``name[, name2]: text`` lines, indented continuation lines joined)."""
    import inspect
    import re

    doc = inspect.getdoc(cls) or ""
    _, sep, section = doc.partition("Attributes:\n")
    out: dict[str, str] = {}
    names: list[str] = []
    for line in section.splitlines() if sep else []:
        m = re.match(r"    ([A-Za-z_][\w, ]*):\s*(.*)", line)
        if m and not line.startswith("     "):
            names = [n.strip() for n in m.group(1).split(",")]
            for n in names:
                out[n] = m.group(2)
        elif line.startswith("        ") and names:
            for n in names:
                out[n] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break  # the next section
    return out


def _cmd_devices(args) -> int:
    from dataclasses import fields

    from .devices import all_devices

    for dev in all_devices():
        print(f"{dev.name} ({dev.paradigm})")
        docs = _attribute_docs(type(dev.params))
        rows = [(f"{f.name} = {getattr(dev.params, f.name)}", docs.get(f.name, ""))
                for f in fields(dev.params) if f.repr]  # not repr: sources, with the presets
        if rows:
            print(table((Column("parameter", fit=42), "meaning"), rows, header=False, indent="  "))
        _print_options(dev)
        for line in dev.catalog():
            print(f"  {line}")
    return 0


def _print_options(dev) -> None:
    """``onnx-cinm devices``: the device's options from its declaration (key, what it takes with
    its unit, default, help) and its run modes."""
    from .options import help_text

    opts = dev.option_specs()
    if opts:
        section = next(iter(opts.values())).section
        print(f"  options (flags --{dev.option_prefix}-*, --config table [{section}], sweep keys "
              f"{section}.*):")
        width = max(len(k) for k in opts)
        for key, spec in opts.items():
            print(f"    {key:{width}s}  {help_text(spec)}")
    if len(dev.modes) > 1:
        print(f"  run modes (--provider-option {dev.name}_mode=...): {', '.join(dev.modes)} "
              f"(default {dev.modes[0]})")


def _provider_options(items: list[str], parser) -> dict:
    """``--provider-option KEY=VALUE`` items as typed provider options
    (:func:`onnx_cinm.runtime.session.provider_option_specs`, e.g. ``upmem_mode`` from the
    UPMEM device's run modes); an unknown key or a bad value is a usage error."""
    from .options import from_text, unknown_key
    from .runtime.session import PROVIDER, provider_option_specs

    schema = provider_option_specs()
    opts: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--provider-option expects KEY=VALUE, got '{item}'")
        try:
            if key not in schema:
                raise unknown_key(key, schema, f"{PROVIDER} option")
            opts[key] = from_text(schema[key], value)
        except CinmError as e:
            parser.error(f"--provider-option {str(e).removeprefix('option ')}")
    return opts


def _session(path, provider_options: dict):
    from .runtime.session import PROVIDER, InferenceSession

    return InferenceSession(path, providers=[PROVIDER, "CPUExecutionProvider"],
                            provider_options=[provider_options, {}])


def _warn_if_nothing_on_devices(sess) -> None:
    """A warning on stderr when the provider will run (some of) the model in onnxruntime only."""
    cinm_ops = [n for n in sess._model.graph.node if n.domain == "cinm"]
    placed = [n for n in cinm_ops
              if dict((a.name, a.s) for a in n.attribute).get("device", b"host") != b"host"]
    unkerneled = [n for n in placed if not any(a.name == "kernel" for a in n.attribute)]
    everything = "; everything runs in onnxruntime"
    if not cinm_ops:
        warning = ("no op of this model runs on a device: it has no cinm op (was it written by "
                   "'onnx-cinm optimize'?)" + everything)
    elif not placed:
        warning = (f"no op of this model runs on a device: placement put all {len(cinm_ops)} "
                   "cinm ops on the host" + everything)
    elif unkerneled:
        warning = (f"{len(unkerneled)} device-placed op(s) have no kernel (compiled with "
                   "--stop-after?); they run in onnxruntime")
    else:
        return
    print(f"onnx-cinm: warning: {warning}", file=sys.stderr)


def _cmd_run(args, parser) -> int:
    import numpy as np

    from . import artifacts, frontend, golden
    from .runtime import profile

    opts = _provider_options(args.provider_option, parser)
    given, dims = _given_inputs(args, parser)
    shapes = {name: arr.shape for name, arr in given.items()}
    if args.profile_out and Path(args.profile_out).suffix.lower() not in (".json", ".csv"):
        parser.error(f"--profile-out must end in .json or .csv, got '{args.profile_out}'")
    if args.output and Path(args.output).suffix.lower() != ".npz":
        parser.error(f"-o/--output must end in .npz (a numpy archive), got '{args.output}'")
    protected = {args.model: "the model being run",
                 str(artifacts.artifact_dir(args.model)): "the model's kernel folder"}
    protected.update({file: f"input file '{file}'" for file in
                      _input_files(args.feed)})
    for option, target in (("-o", args.output), ("--profile-out", args.profile_out)):
        if target:
            _check_output_file(target, option, protected)
            artifacts.check_output_outside_kernels(target, option)
            protected[target] = f"the {option} output"
    sess = _session(args.model, opts)
    golden.check_dim_names(sess._model, dims)
    dims = {**frontend.planned_dims(sess._model), **dims}  # the sizes it was planned for, by default
    parts = sess.partitions()
    _warn_if_nothing_on_devices(sess)
    say = (lambda msg: None) if args.quiet else print
    outs = None
    for i in range(args.random):
        feeds = golden.random_inputs(sess._model, seed=i, dims=dims, shapes=shapes) \
            if len(given) < len(sess.get_inputs()) else {}
        feeds.update(given)
        outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    say(f"onnx-cinm run: {args.model}, {args.random} run(s), providers {', '.join(sess.get_providers())}")
    say("  partitions: " + _partition_text(parts, sess.modeled_nodes()))
    arrays: dict = {}
    for arg, value in zip(sess.get_outputs(), outs):
        found = _output_arrays(arg.name, value)
        arrays.update(found)
        arr = found.get(arg.name)
        kind = "" if arg.type.startswith("tensor(") else f"{arg.type} as "
        say(f"  output {arg.name}: " + (f"{arg.type}" if arr is None else
            f"{kind}{arr.dtype} {list(arr.shape)}"
            + (f", mean {float(arr.mean()):.6g}" if arr.size and arr.dtype.kind in "fiu" else "")))
    if args.output:
        unsaved = [n for n in names if n not in arrays]
        if unsaved:
            raise CinmError(f"output '{unsaved[0]}' has no array form to write to "
                            f"{args.output}")
        _save_npz(args.output, arrays)
        say(f"  outputs written to {args.output}")
    if args.profile:
        print(profile.table(sess.profile()))
        cfg = sess.configuration()
        libs = ", ".join(f"{lib} ({api})" for lib, api, _ in cfg["blas"]) or "none loaded"
        print(f"configuration: BLAS threads {cfg['blas_threads'] or 'library default'} [{libs}], "
              f"crossbar products {cfg['matmul']}"
              + (f" ({', '.join(f'{k}: {v}' for k, v in cfg['chosen'].items())})"
                 if cfg["chosen"] else "")
              + ", partitions " + ", ".join(f"{k} {v}" for k, v in cfg["partitions"].items()))
        load = sess.load_profile()
        for dev in sorted({r["device"] for r in load}):
            rs = [r for r in load if r["device"] == dev]
            writes = sum(r["writes"] for r in rs)
            print(f"at load (once per session, not per inference): {dev}, {len(rs)} "
                  f"kernel{'s' * (len(rs) != 1)}" + (f", {writes} tile writes" if writes else "")
                  + f", modeled {si(sum(r['latency_s'] for r in rs), 's')}, "
                  f"{si(sum(r['energy_j'] for r in rs), 'J')}")
    if args.profile_out:
        try:
            profile.write(sess.profile(), args.profile_out)
        except OSError as e:
            raise CinmError(f"cannot write the profile to '{args.profile_out}': {e.strerror}") from None
        say(f"  profile written to {args.profile_out}")
    return 0


def _partition_text(parts: list, modeled: list) -> str:
    """``2 host partitions (5 nodes; 2 of them upmem nodes charged by its cost model),
    memristor 1 node``: the same counts ``--profile`` shows, with their units."""
    from collections import Counter

    host = [n for k, n in parts if k == "host"]
    text = f"{len(host)} host partition{'s' * (len(host) != 1)} ({sum(host)} nodes"
    by_dev = Counter(dev for _, dev in modeled)
    if by_dev:
        text += "; " + ", ".join(f"{n} of them {d} nodes charged by its cost model"
                                 for d, n in sorted(by_dev.items()))
    text += ")"
    devs = Counter(k for k, _ in parts if k != "host")
    for d, n in sorted(devs.items()):
        text += f", {d} {n} node{'s' * (n != 1)}"
    return text


def _output_arrays(name: str, value) -> dict:
    """An output as arrays for display and ``.npz``: a tensor as ``{name: array}``; a map or a
    sequence of maps (ZipMap) as its values ``{name: [len, keys]}`` plus ``{name.keys: keys}``;
    a sequence of tensors of one shape stacked. ``{}`` if it has no array form (never pickled)."""
    import numpy as np

    from . import golden

    if isinstance(value, np.ndarray):
        return {name: value}
    arr = golden.as_array(value)
    if arr is None or arr.dtype == object:
        return {}
    keys = golden.map_keys(value)
    return {name: arr, **({f"{name}.keys": np.asarray(keys)} if keys is not None else {})}


def _save_npz(path: str, arrays: dict) -> None:
    import io

    import numpy as np

    from . import frontend

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        frontend.write_file_atomic(path, buf.getvalue())
    except OSError as e:
        raise CinmError(f"cannot write '{path}': {e.strerror}") from None


def _cmd_compare(args, parser) -> int:
    from . import frontend, golden

    opts = _provider_options(args.provider_option, parser)
    given, dims = _given_inputs(args, parser)
    if (args.original is None) == (args.example is None):
        parser.error("give the original model or --example NAME (one of them)")
    if args.example:
        from .examples import get_example

        original = get_example(args.example)
        args.original = f"example '{args.example}'"
    else:
        original = frontend.load_model(args.original)  # one-line errors for a bad original
    golden.check_dim_names(original, dims)
    # host partitions as the reference runs: onnxruntime's own fusions are not our error
    opts.setdefault("graph_optimization", "disable_all")
    sess = _session(args.optimized, opts)
    dims = {**frontend.planned_dims(sess._model), **dims}  # the sizes it was planned for, by default
    _warn_if_nothing_on_devices(sess)
    feeds = None
    if given:
        unknown = sorted(set(given) - {i.name for i in original.graph.input})
        if unknown:
            raise CinmError(f"--input '{unknown[0]}' is not an input of {args.original}")
        shapes = {name: arr.shape for name, arr in given.items()}
        feeds = [{**golden.random_inputs(original, seed=i, dims=dims, shapes=shapes), **given}
                 for i in range(args.runs)]
    try:
        report = golden.compare(original, sess.as_runner(), n=args.runs, rtol=args.rtol,
                                atol=args.atol, dims=dims, feeds=feeds)
    except ReferenceFailed as e:
        raise CinmError(f"{e}; give real inputs with --input NAME=FILE.npy or sizes with "
                        "--dim NAME=SIZE") from None
    what = f"{', '.join(sorted(given))} from --input, the rest random" if given else "random"
    print(f"onnx-cinm compare: {args.original} (onnxruntime) vs {args.optimized} (CINM provider), "
          f"{args.runs} input set(s) ({what})")
    inexact = sess.inexact_kernels()
    print(report.table(verdict=not inexact))
    if inexact:  # quantized, noisy or narrower arithmetic: error statistics, not a verdict
        rms = ", ".join(f"{o.name} {o.rel_rms_err:.3g}" for o in report.outputs)
        print(f"{', '.join(inexact)}: inexact by design, so error statistics against "
              f"onnxruntime, not a verdict (relative RMS error: {rms}; the exact model was "
              "checked by optimize)")
        structural = report.problems or any(o.note for o in report.outputs)
        return 1 if structural else 0
    print(report.summary())
    special = None
    if not given:  # NaN/Inf inputs, apart: the provider's kernels must place them as ORT does
        try:
            special = golden.compare_special(original, sess.as_runner(), rtol=args.rtol,
                                             atol=args.atol, dims=dims)
        except ReferenceFailed:
            special = None  # the original itself cannot run on NaN/Inf inputs: nothing to judge
        if special is not None:
            print("NaN/Inf " + special.summary())
    return 0 if report.ok and not report.meaningless and (special is None or special.ok) else 1


def _progress(total: int, desc: str, unit: str, quiet: bool):
    """A tqdm bar on stderr, silent with -q or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False,
                disable=quiet or not sys.stderr.isatty())


def _cmd_optimize(args, parser) -> int:
    from . import artifacts, frontend
    from .examples import EXAMPLES, get_example
    from .passes import DEFAULT_PIPELINE, available_passes
    from .passes.placement_rules import hint_warnings, load_hints, parse_hint
    from .pipeline import optimize

    if args.list_passes:
        descriptions = available_passes()
        print(table(("pass", "description"), [(n, descriptions.get(n, "")) for n in DEFAULT_PIPELINE],
                    header=False))
        return 0
    if args.list_examples:
        print(table(("example", "description"), [
            (name, (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "")
            for name, fn in EXAMPLES.items()], header=False))
        return 0
    if not args.input and not args.example:
        parser.error("give an input model or --example NAME")
    if not args.output:
        parser.error("the output path -o/--output is required")
    if args.verbose and args.quiet:
        parser.error("-v and -q exclude each other")
    out = Path(args.output)
    if args.output.endswith(("/", os.sep)) or out.is_dir() or not out.name or out.name in (".", ".."):
        raise CinmError(f"-o '{args.output}' names a folder, not a regular file; give the "
                        "output model's file path (e.g. out/model_opt.onnx)")
    artifacts.check_output_outside_kernels(args.output, "-o")
    if args.input and out.resolve() == Path(args.input).resolve():
        raise CinmError("the output path equals the input path; refusing to overwrite the input")
    kernels = artifacts.artifact_dir(out).resolve()
    if args.input and kernels in Path(args.input).resolve().parents:
        raise CinmError(f"the input lies inside the output's kernel folder '{kernels}', which "
                        "optimize replaces; choose another output or move the input")
    if args.report is not None:
        if not args.report:
            parser.error("--report needs a folder name")
        report_dir = Path(args.report).resolve()
        if report_dir == out.resolve() or report_dir == kernels or kernels in report_dir.parents:
            raise CinmError(f"--report '{args.report}' must be a folder of its own, not the output "
                            "model or its kernel folder")
        artifacts.check_output_outside_kernels(args.report, "--report")
    say = (lambda msg: None) if args.quiet else print
    options = _pass_options(args, parser)
    cost_only = [k for k in ("objective", "max_writes_per_cell", "crossbar_residency")
                 if k in options]
    if options.get("placement") == "heuristic" and cost_only:
        print(f"onnx-cinm: warning: {', '.join(cost_only)} apply to --placement cost only",
              file=sys.stderr)
    if args.report:
        _check_writable_folder(args.report, "report")
    from .passes import DEFAULT_PIPELINE as _PIPE

    bar = _progress(len(_PIPE) + (1 if args.check else 0), "optimize", "pass", args.quiet)

    def log(msg: str) -> None:
        if msg.startswith("pass "):
            bar.update(1)
            bar.set_postfix_str(msg[5:].split(":")[0])
        if args.verbose:
            msg = printable(msg)
            bar.write(msg) if not bar.disable else print(msg)
    try:  # malformed option values are usage errors (exit 2)
        hints = [parse_hint(h) for h in args.place]
        dims = _dims(args.dim, parser)
        shapes: dict = {}
        for spec in args.overwrite_input_shape:
            name, shape = frontend.parse_shape_spec(spec)
            if name in shapes:
                raise CinmError(f"--overwrite-input-shape given twice for input '{name}'")
            shapes[name] = shape
    except CinmError as e:
        parser.error(str(e))
    given, _ = _given_inputs(args, parser)
    if args.place_config:
        hints += load_hints(args.place_config)
    if hints:  # on the command line: they replace the --config file's
        options["place"] = hints
    hints = options.get("place", [])
    if hints and (args.stop_after == "cinm" or "placement" in args.skip_pass):
        print("onnx-cinm: warning: placement does not run, so --place hints are ignored", file=sys.stderr)
    model = get_example(args.example) if args.example else frontend.load_model(args.input)
    try:
        result = optimize(model, skip=args.skip_pass,
                          stop_after=args.stop_after, input_shapes=shapes, check=args.check,
                          check_rtol=args.check_rtol, check_atol=args.check_atol,
                          dims=dims, inputs=given, device_options=options, log=log)
    finally:
        bar.close()
    if args.report:  # rendered first: a report that cannot be made stops before any writing
        from . import report

        rendered = report.render_report(result.model, options, title=out.name)
    manifest = artifacts.save(result.model, out, log)
    args.written = out  # an interrupt from here on must not claim that nothing was written
    if args.report:  # its folder was checked up front; a failure now still says what exists
        try:
            report_files = frontend.write_files_into(args.report, rendered["files"], "report")
        except CinmError as e:
            raise CinmError(f"{out} was written, but: {e}") from None
    if result.check is not None and result.check.meaningless:
        print(f"onnx-cinm: warning: golden check not meaningful: {'; '.join(result.check.meaningless)}; "
              "check real data with --input NAME=FILE.npy (or FILE.npz)", file=sys.stderr)
    if result.check_skipped:
        print(f"onnx-cinm: warning: golden check skipped: {result.check_skipped}; give sizes "
              "with --dim NAME=SIZE or --overwrite-input-shape NAME:D1,D2,..., or check it "
              "with 'onnx-cinm compare --input ...'", file=sys.stderr)
    frozen = result.stats.get("canonicalize_opset", {}).get("frozen_inputs", [])
    if frozen and args.verbose:  # old exporters list every weight: a note, not a warning
        shown = ", ".join(frozen[:5]) + (f" and {len(frozen) - 5} more" if len(frozen) > 5 else "")
        print(f"onnx-cinm: note: {len(frozen)} graph input(s) with initializers ({shown}) are "
              "compiled as constants; values fed for them at run time are refused", file=sys.stderr)
    for line in hint_warnings(result.stats.get("placement", {})):
        print(f"onnx-cinm: warning: {printable(line)}", file=sys.stderr)
    source = args.input or f"example '{args.example}'"
    say(f"onnx-cinm optimize: {source} -> {out}")
    for line in result.summary().splitlines():
        say(f"  {line}")
    if manifest is not None:
        n_files = sum(len(k["files"]) for k in manifest["kernels"])
        say(f"  kernels: {len(manifest['kernels'])} in {artifacts.artifact_dir(out)}/ "
            f"({n_files} files, listed with hashes in {artifacts.MANIFEST})")
    tables = result.device_tables()
    if tables:
        say("")
        for line in tables.splitlines():
            say(f"  {line}")
    st = result.stats.get("placement", {})
    if st.get("strategy") == "cost":
        t = st["totals"]
        say(f"  cost placement ({st['objective']}): modeled {si(t.latency_s, 's')}, "
            f"{si(t.energy_j, 'J')}, {t.writes} tile writes/inference; {st['method']}")
        for name, b in st["baselines"].items():
            say(f"    {name}: {si(b.latency_s, 's')}, {si(b.energy_j, 'J')}, {b.writes} tile writes/inference")
        for v in st.get("violations", []):
            print(f"onnx-cinm: warning: the placement hints break a constraint: {v}", file=sys.stderr)
    if args.verbose and result.placements:
        print(table((Column("node", fit=40), "op", "device", "placement"), result.placements,
                    header=False, indent="  "))
    if args.report:
        say(f"  report: {', '.join(str(p) for p in report_files)}")
    return 0


def _cmd_report(args) -> int:
    from . import artifacts, frontend, report

    path = Path(args.model)
    model = frontend.load_model(str(path))
    opts = report.options_from_plans(model)
    if args.host_roofline:
        opts["host_roofline"] = args.host_roofline
    out = Path(args.output) if args.output else path.with_name(path.stem + ".report")
    artifacts.check_output_outside_kernels(out, "-o" if args.output else "the report folder")
    res = report.write_report(model, out, opts, title=path.name)
    if not args.quiet:
        print(f"onnx-cinm report: {path} -> {out}/")
        print(report.table(res["rows"], res["totals"], cinm_only=not args.all_nodes))
        print(f"written: {', '.join(p.name for p in res['files'])}")
    return 0


def _cmd_sweep(args, parser) -> int:
    from . import artifacts, frontend, sweep

    try:
        sets = sweep.parse_sets(args.sets)
        dims = _dims(args.dim, parser)
        shapes: dict = {}
        for spec in args.overwrite_input_shape:
            name, shape = frontend.parse_shape_spec(spec)
            shapes[name] = shape
    except CinmError as e:
        parser.error(str(e))
    if not sets:
        parser.error("give at least one --set KEY=V1,V2,...")
    if args.scheduler and args.executor != "dask":
        print(f"onnx-cinm: warning: --scheduler applies to --executor dask only; ignored with "
              f"--executor {args.executor}", file=sys.stderr)
    if args.workers and args.executor != "process":
        print(f"onnx-cinm: warning: --workers applies to --executor process only; ignored with "
              f"--executor {args.executor}", file=sys.stderr)
    if args.executor == "dask" and not args.scheduler:
        parser.error("--executor dask needs --scheduler ADDRESS")
    out = Path(args.output)
    artifacts.check_output_outside_kernels(out, "-o")
    if out.exists() and not out.is_dir():
        raise CinmError(f"sweep folder '{args.output}' exists and is not a folder")
    base = _pass_options(args, parser)
    model = frontend.load_model(args.input)
    configs, results = sweep.run(model, sets, base_options=base, executor=args.executor,
                                 workers=args.workers, scheduler=args.scheduler,
                                 progress=not args.quiet, input_shapes=shapes or None, dims=dims)
    paths = sweep.write(out, configs, results, title=Path(args.input).name)
    if not args.quiet:
        print(f"onnx-cinm sweep: {args.input}, {len(configs)} configurations ({args.executor})")
        print(table(
            ("configuration", Column("latency", ">"), Column("energy", ">"), Column("writes", ">"),
             "devices", "breaks"),
            [(sweep.label(c), si(r["latency_s"], "s"), si(r["energy_j"], "J"), r["writes"],
              r["devices"], r["violations"] or "") for c, r in zip(configs, results)], indent="  "))
        print(f"written: {', '.join(str(p) for p in paths)}")
    return 0


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
    """Entry point of the ``onnx-cinm`` console script; returns the exit status."""
    try:
        parser = _parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the subcommand they were given to
            getattr(args, "command_parser", parser).error(
                f"unrecognized arguments: {' '.join(extra)}")
    except KeyboardInterrupt:  # Ctrl-C while starting up
        return _interrupted(argparse.Namespace())
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
        if args.command == "devices":
            return _cmd_devices(args)
        if args.command == "run":
            return _cmd_run(args, parser)
        if args.command == "compare":
            return _cmd_compare(args, parser)
        if args.command == "report":
            return _cmd_report(args)
        if args.command == "sweep":
            return _cmd_sweep(args, parser)
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


if __name__ == "__main__":
    sys.exit(main())
