"""Arguments of the ``onnx-cinm`` subcommands: flags generated from the option schema, typed
value parsers, model inputs and output-path checks shared by the subcommands."""
from __future__ import annotations

import argparse
import math
import os
import re
import zipfile
from pathlib import Path

from .. import __version__
from ..errors import CinmError


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
  onnx-cinm evaluate model_opt.onnx --data test.npz --cim-mode device --times 1s,1h,1d,1y
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
        p.add_argument("-q", "--quiet", action="store_true",
                       help="print nothing but errors: no summary, progress, warnings or notes")
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


def _duration(text: str) -> float:
    """``'1h'`` -> 3600.0 (:func:`onnx_cinm.options.parse_duration`), as an argparse type."""
    from ..options import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: A token that reads as a negative number or starts like one (``-1``, ``-1s``, ``-.5``,
#: ``-1e-3``, ``-1,4``): no option string of onnx-cinm starts with ``-`` and a digit, so such a
#: token is always a value, never an option.
_NEGATIVE_VALUE = re.compile(r"-\.?[0-9]")


def join_negative_values(argv: list[str]) -> list[str]:
    """``["--times", "-1s"]`` -> ``["--times=-1s"]``: a long option followed by a token that
    looks like a negative value (:data:`_NEGATIVE_VALUE`) is joined to it in argparse's
    documented ``--option=value`` form.

    argparse reads only plain negative numbers (``-1``, ``-0.5``) as values; ``-1s``, ``-1e-3``
    or ``-1,4`` it takes for an option and reports "expected one argument", hiding the real
    error (a negative time, a rate out of range) that the option's own type gives. Tokens after
    ``--`` (the end of the options) and an option already written ``--option=value`` are left
    alone. An option that takes no value, joined this way, is still a usage error (argparse's
    "ignored explicit argument").

    Parameters
    ----------
    argv : list of str
        The command line without the program name.

    Returns
    -------
    list of str
        A new list; ``argv`` is not changed.
    """
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "--":
            return out + argv[i:]
        prev = out[-1] if out else ""
        if (prev.startswith("--") and len(prev) > 2 and "=" not in prev
                and _NEGATIVE_VALUE.match(tok)):
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out


def _typed(spec):
    """An argparse type for option ``spec``: the text read as the option's type and checked
    against its declaration (:func:`onnx_cinm.options.from_text`); a bad value is a usage error
    naming the option."""
    from ..options import from_text

    def convert(text: str):
        try:
            return from_text(spec, text)
        except CinmError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def _alias_typed(alias, schema: dict):
    """An argparse type for an option alias (:class:`onnx_cinm.options.Alias`) setting one
    option: the value it gives that option, checked as the option's."""
    from ..options import alias_values

    def convert(text: str):
        try:
            return alias_values(alias, schema, text)[alias.keys[0]]
        except CinmError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{alias.flag}: ")) from None
    return convert


def _alias_typed_all(alias, schema: dict):
    """An argparse type for an option alias setting several options: ``{flat key: value}``."""
    from ..options import alias_values

    def convert(text: str):
        try:
            return alias_values(alias, schema, text)
        except CinmError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{alias.flag}: ")) from None
    return convert


def _alias_dest(alias) -> str:
    """Where argparse keeps the value of an alias setting several options (``cim_size``)."""
    return alias.flag.lstrip("-").replace("-", "_")


#: Option keys with a hand-written flag instead of a generated one (``--place`` is repeatable).
_HAND_WRITTEN = {"place"}


def _option_flags(p: argparse.ArgumentParser, schema: dict) -> None:
    """A flag ``--KEY`` (``_`` as ``-``) for every option of ``schema``, grouped by section,
    typed, checked and documented (help, range, unit, default) by the option's declaration
    (:mod:`onnx_cinm.options`); ``--no-KEY`` too for a true/false option. Every flag defaults
    to None, "not given": the option's declared default applies unless ``--config`` sets it.
    The other spellings an option declares (:class:`onnx_cinm.options.Alias`, e.g.
    ``--cim-size ROWSxCOLS``) follow its flag."""
    from ..devices import device_names
    from ..options import help_text

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
            metavar = spec.metavar or ("|".join(allowed) if allowed and spec.type is str
                                       else {int: "N", float: "X"}.get(spec.type, "VALUE"))
            g.add_argument(flag, dest=key, default=None, type=_typed(spec), metavar=metavar,
                           choices=allowed if spec.type is str else None, help=text)
        for alias in spec.aliases:
            if not alias.flag:
                continue
            text = alias.help.replace("%", "%%")
            if alias.const is not None:  # one option, a fixed value
                g.add_argument(alias.flag, dest=key, action="store_const", const=alias.const,
                               help=text)
            elif len(alias.keys) == 1:  # the option itself in another form: the last one wins
                g.add_argument(alias.flag, dest=key, type=_alias_typed(alias, schema),
                               metavar=alias.metavar or None, help=text)
            else:  # several options: their own flags may repeat a value, not contradict it
                g.add_argument(alias.flag, dest=_alias_dest(alias), default=None,
                               type=_alias_typed_all(alias, schema),
                               metavar=alias.metavar or None, help=text)


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
    from ..options import load_config
    from ..passes import check_options, option_schema

    schema = option_schema()
    opts: dict = {}
    if getattr(args, "config", None):
        opts = load_config(args.config, schema)
        try:
            check_options(opts)
        except CinmError as e:
            raise CinmError(f"config '{args.config}': {e}") from None
    # flags given on the command line win over the file; an unused list flag (--place) is [],
    # not a value, and must not erase the file's hints
    opts.update({k: getattr(args, k) for k in schema if getattr(args, k, None) not in (None, [])})
    for spec in schema.values():  # aliases setting several options, e.g. --cim-size ROWSxCOLS:
        for alias in spec.aliases:  # each option its own flag does not set; a flag of its
            given = getattr(args, _alias_dest(alias), None) if len(alias.keys) > 1 else None
            for key, v in (given or {}).items():  # own giving another value is a usage error
                own = getattr(args, key, None)
                if own is None:
                    opts[key] = v
                elif own != v:
                    flag = "--" + key.replace("_", "-")
                    parser.error(f"{alias.flag} sets {flag} to {v}, but {flag} {own} is given "
                                 "too: give one of them")
    try:
        return check_options(opts)
    except CinmError as e:
        parser.error(str(e))


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line naming the (sub)command, with a pointer to its --help; exit 2.
    Long flags match only in full, not by a prefix: ``sweep --place X=upmem`` (a flag sweep
    does not have) was taken as ``--placement`` and refused as a placement method (a trial)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


class _Subcommands(argparse._SubParsersAction):
    """The subcommands' parsers, each given its arguments when its subcommand is the one parsed
    (:attr:`pending`: ``{name: function adding them}``): a command line builds the flags of
    its own subcommand, not those of every other (``sweep`` and ``evaluate`` repeat every
    device's options). The top-level ``--help`` lists the subcommands by their help alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending: dict = {}

    def __call__(self, parser, namespace, values, option_string=None):
        fill = self.pending.pop(values[0], None)
        if fill is not None:
            fill()
        super().__call__(parser, namespace, values, option_string)


def _parser() -> argparse.ArgumentParser:
    """The ``onnx-cinm`` argument parser. ``optimize``'s parser has its arguments at once; the
    other subcommands' get theirs when parsed (:class:`_Subcommands`)."""
    from ..passes import STOP_LEVELS, option_schema

    p = _Parser(
        prog="onnx-cinm",
        description="Compile ONNX models for compute-in-memory (memristor crossbars) and "
                    "compute-near-memory (UPMEM) devices.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"onnx-cinm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", action=_Subcommands)

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
    o.add_argument("-o", "--output",
                   help="output .onnx path (required unless listing); its kernels go in the "
                        "folder of its name minus .onnx plus .cinm (other names whole plus "
                        ".cinm: out.v1 -> out.v1.cinm); an existing file whose name does not "
                        "end in .onnx and that is not an ONNX model is refused, not "
                        "overwritten")
    o.add_argument("--check", type=_count, default=None, metavar="N",
                   help="random-input runs comparing onnxruntime on input and output; 0 disables "
                        "(default: 1, or 2 - compare's default - for a model that quantizes at run "
                        "time, e.g. DynamicQuantizeLinear, where a last-bit difference shows on "
                        "some inputs only)")
    o.add_argument("--no-check-nan-inf", action="store_false", dest="check_nan_inf",
                   help="skip the NaN/Inf check that follows the check (one more run of both "
                        "models, on inputs holding NaN, +Inf and -Inf; about the check's time "
                        "again); --check 0 skips both")
    o.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension, e.g. sequence=512 (repeatable): FLOPs, "
                        "placement, tiling, mapping and the check use it, and the model records it "
                        "for run and compare; dims without a size are planned as 1; sizes the "
                        "original cannot run at (an onnxruntime shape error) are refused")
    o.add_argument("--input", action="append", default=[], dest="feed", metavar="NAME=FILE.npy|FILE.npz",
                   help="check on real data: " + _INPUT_HELP + "; with every input given, the "
                        "check runs once, on them")
    _tolerance_options(o, "--check-rtol", "--check-atol", " of the check")
    o.add_argument("--overwrite-input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                   help="bake a static shape into an input (repeatable)")
    o.add_argument("--report", metavar="DIR",
                   help="also write the report (table, PNG pictures, HTML page) into DIR")
    o.add_argument("--place", action="append", default=[], metavar="PATTERN=DEVICE",
                   help="placement hint; PATTERN (fnmatch) matches a cinm op's name or op type "
                        "or the name or ONNX op type of the node it was lowered from, e.g. "
                        "'Gemm=upmem', 'MatMul=upmem' or '*conv1*=host'; the first matching "
                        "hint wins (repeatable)")
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
    o.add_argument("-v", "--verbose", action="store_true",
                   help="print progress, every placement and a row per kernel (else the kernels "
                        "of one source op with the same figures share a row, 'NAME xN', and a "
                        "device table shows its 30 rows of the most energy)")
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

    def _run_args() -> None:
        r.add_argument("model", help="optimized .onnx model (kernels in <model>.cinm/)")
        _input_options(r)
        r.add_argument("--random", type=_positive, default=1, metavar="N",
                       help="number of runs (random inputs drawn with seeds 0..N-1 where not given)")
        r.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                       help="CinmExecutionProvider option, e.g. upmem_mode=emulate (repeatable)")
        r.add_argument("-o", "--output", metavar="FILE.npz", help="write the last run's outputs here")
        r.add_argument("--profile", action="store_true", help="print the per-node profile")
        r.add_argument("--all-nodes", action="store_true",
                       help="with --profile: a row per node (else the nodes of one source op with "
                            "the same modeled figures share a row, 'NAME xN')")
        r.add_argument("--profile-out", metavar="FILE", help="write the profile records (.json or .csv)")
        _common(r)
    sub.pending["run"] = _run_args

    c = sub.add_parser(
        "compare", help="run the original in onnxruntime and the optimized model through the provider",
        description="Run the original model in stock onnxruntime and the optimized one through "
                    "the CINM execution provider on the same inputs (random, or --input files); "
                    "print the largest "
                    "absolute and relative error per output; exit 1 on a mismatch.",
        formatter_class=_HelpFormatter)

    def _compare_args() -> None:
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
    sub.pending["compare"] = _compare_args

    rp = sub.add_parser(
        "report", help="per-layer table, totals and pictures (PNG, HTML) of an optimized model",
        description="Read an optimized model and write layers.csv, time_energy.png, graph.png and "
                    "a self-contained report.html into a folder; print the per-layer table. "
                    "Costs are priced with the options the model was compiled with and, unless "
                    "--host-roofline says otherwise, the host figures it was optimized with.",
        formatter_class=_HelpFormatter)

    def _report_args() -> None:
        rp.add_argument("model", help="optimized .onnx model")
        rp.add_argument("-o", "--output", metavar="DIR", help="report folder (default: <model>.report/, <model> minus an .onnx "
                             "extension, other names whole: out.v1 -> out.v1.report/)")
        _option_flags(rp, {"host_roofline": schema["host_roofline"]})
        rp.add_argument("--all-nodes", action="store_true",
                        help="print every node, not only cinm ops, a row each (else the nodes of one "
                             "source op with the same figures share a row, 'NAME xN')")
        _common(rp)
    sub.pending["report"] = _report_args

    sw = sub.add_parser(
        "sweep", help="compile a model under every combination of device parameters",
        description="Evaluate the cartesian product of --set values (modeled latency, energy, "
                    "writes of the compiled plans; no inference runs) in parallel worker processes "
                    "or on a Dask cluster; write sweep.csv and sweep.png.",
        formatter_class=_HelpFormatter)

    def _sweep_args() -> None:
        sw_src = sw.add_mutually_exclusive_group(required=True)
        sw_src.add_argument("input", nargs="?", help="input .onnx model")
        sw_src.add_argument("--example", metavar="NAME",
                            help="a model bundled with onnx-cinm instead of a file (see optimize "
                                 "--list-examples)")
        sw.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2,...", dest="sets",
                        help="values of one option (repeatable); keys: SECTION.NAME of every option "
                             "below (e.g. cim.rows, cim.crossbars, upmem.dpus, placement.objective; "
                             "the names of a list option joined by +), and their aliases "
                             + ", ".join(f"{a.sweep} ({a.metavar})" if a.metavar else a.sweep
                                         for spec in schema.values() for a in spec.aliases if a.sweep))
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
        sw.add_argument("--place", action="append", default=[], metavar="PATTERN=DEVICE",
                        help="placement hint in every configuration, as optimize's (repeatable), "
                             "e.g. 'MatMul=upmem' to sweep the DPUs' options on the MatMuls")
        sw.add_argument("--place-config", metavar="FILE",
                        help="JSON or TOML file with a 'place' table of PATTERN = DEVICE hints")
        _common(sw)
        _config_option(sw)
        _option_flags(sw, schema)  # the options of every configuration, unless swept
    sub.pending["sweep"] = _sweep_args

    ev = _evaluate_parser(sub)
    d = sub.add_parser(
        "devices", help="list the registered devices and their parameters",
        description="Print every registered device (built in and from plugins), one block each: "
                    "its name and paradigm; its parameters as optimize plans with them by "
                    "default, each with its meaning, unit and the source of its figure; its "
                    "options (flag prefix, --config table, sweep keys) with units, ranges and "
                    "defaults; its run modes and run options (--provider-option of run, compare "
                    "and evaluate); and the presets it offers, if any. Takes no arguments and "
                    "reads no model.")
    d.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)

    for command_parser in (o, r, c, rp, sw, ev, d):  # usage errors name the subcommand
        command_parser.set_defaults(command_parser=command_parser)
    return p


#: the run options ``evaluate`` sweeps itself (field name -> how to set them instead)
SWEPT = {"time_s": "use --times", "drift_compensation": "--times runs each time with drift "
         "compensation off and on", "adc_bits": "use --adc-bits", "stuck_at": "use --stuck-at",
         "seed": "use --seeds"}


def evaluate_flag(key: str, spec) -> str:
    """How ``evaluate`` sets run option ``key`` (a provider option such as ``cim_time_s``,
    declared by ``spec``): a sweep of :data:`SWEPT` (``"use --times"``), else the flag made
    from the key (``"use --cim-mode"``)."""
    return SWEPT.get(spec.name) or "use --" + key.replace("_", "-")


def _list(parse, what: str):
    """An argparse type: comma-separated values, each read by ``parse``."""
    def convert(text: str) -> list:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
        return [parse(t) for t in items]
    return convert


_adc_bits = _checked(_int, lambda v: v == 0 or 2 <= v <= 16, "0 (an ideal ADC) or 2..16 bits")
_rate = _checked(_number, lambda v: 0 <= v <= 0.5, "a fraction of cells in 0..0.5")


def _evaluate_parser(sub: _Subcommands) -> argparse.ArgumentParser:
    """The ``evaluate`` subcommand's parser, its arguments added when it is parsed
    (:func:`_evaluate_args`)."""
    e = sub.add_parser(
        "evaluate", help="accuracy under device effects over time after programming, seeds, "
                         "ADC bits and stuck-at rates")
    sub.pending["evaluate"] = lambda: _evaluate_args(e)
    return e


def _evaluate_args(e: argparse.ArgumentParser) -> None:
    """The ``evaluate`` parser's description and arguments; run-option flags (``--cim-mode``,
    ...) come from the devices' run options that evaluate does not sweep itself
    (:data:`SWEPT`)."""
    import textwrap

    from ..devices import all_devices
    from ..options import help_text

    e.description = textwrap.fill(
                    "Run a labeled data set through the CINM execution provider once per "
                    "configuration: each time after programming (--times) with and without "
                    "global drift compensation, each ADC width (--adc-bits) and stuck-at rate "
                    "(--stuck-at), each over --seeds seeds of the device draws (the same seed "
                    "at two times is the same programmed chip read later). Prints accuracy "
                    "(mean, min, max over seeds) per configuration; without labels, the "
                    "relative RMS error of an output against the exact run. The data path is "
                    "the one the model was compiled with (optimize --cim-mode) unless "
                    "--cim-mode/--cim-effects say otherwise; time, compensation, ADC bits and "
                    "stuck-at rates need a data path with device effects (--cim-mode device).", 90)
    e.epilog = ("examples:\n"
                "  onnx-cinm optimize model.onnx -o opt.onnx --cim-preset pcm-hermes\n"
                "  onnx-cinm evaluate opt.onnx --data test.npz --cim-mode device "
                "--times 1s,1h,1d,1y --seeds 5 --plot drift.png\n"
                "  onnx-cinm evaluate opt.onnx --data test.npz --cim-mode device "
                "--adc-bits 4,6,8 --stuck-at 0,1e-3,1e-2 --json > records.json")
    e.formatter_class = type("F", (_HelpFormatter, argparse.RawDescriptionHelpFormatter), {})
    e.add_argument("model", help="optimized .onnx model (kernels in <model>.cinm/)")
    e.add_argument("--data", required=True, metavar="FILE.npz",
                   help="numpy archive: one array per model input (samples along axis 0) and "
                        "the integer labels")
    e.add_argument("--labels", metavar="KEY", default=None,
                   help="the labels' array in --data (default: 'labels' if present; without "
                        "labels the output error against the exact run is measured)")
    e.add_argument("--output", metavar="NAME", dest="judged",
                   help="the output judged (default: the first; without labels the first "
                        "float one); class ids, or scores whose arg max is the class "
                        "(one score column per class: a one-column output is refused "
                        "without --threshold)")
    e.add_argument("--threshold", type=_number, default=None, metavar="T",
                   help="judge a one-score output ([N, 1] or [N]: a sigmoid or a logit) as a "
                        "binary classifier: class 1 where the score > T, else 0 (0.5 for a "
                        "probability, 0 for a logit); the labels must be 0 and 1")
    e.add_argument("--times", type=_list(_duration, "times like 1s,1h,1d,1y"), default=[],
                   metavar="T1,T2,...",
                   help="times after programming, units s, m (min), h, d, w, y: "
                        "e.g. 1s,1h,1d,1y; each with drift compensation off and on")
    e.add_argument("--adc-bits", type=_list(_adc_bits, "ADC bits like 4,6,8"), default=[],
                   metavar="B1,B2,...", help="ADC widths including the sign (0: ideal ADC)")
    e.add_argument("--stuck-at", type=_list(_rate, "rates like 0,1e-3,1e-2"), default=[],
                   metavar="R1,R2,...",
                   help="fractions of cells stuck at 0, and as many stuck at the largest "
                        "conductance")
    e.add_argument("--seeds", type=_positive, default=3, metavar="N",
                   help="seeds of the device draws per configuration (0..N-1)")
    e.add_argument("--batch", type=_positive, default=256, metavar="N",
                   help="samples per inference when the model's batch size is not fixed")
    e.add_argument("--plot", metavar="FILE.png",
                   help="plot the time sweep (log time axis, with and without compensation)")
    e.add_argument("--json", action="store_true",
                   help="print the records and their summary as JSON instead of the table")
    e.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="other CinmExecutionProvider options (repeatable)")
    g = e.add_argument_group("run options of the device kernels (provider options)")
    for dev in all_devices():
        for key, spec in dev.run_option_specs().items():
            if spec.name in SWEPT:
                continue
            flag = "--" + key.replace("_", "-")
            g.add_argument(flag, dest=key, default=None, type=_typed(spec),
                           metavar=spec.metavar or {str: "|".join(spec.allowed() or ()) or "NAME",
                                                    tuple: "A,B|none"}.get(spec.type, "VALUE"),
                           help=help_text(spec).replace("%", "%%"))
    _common(e)


_INPUT_HELP = ("an input array NAME=FILE.npy, or FILE.npz holding arrays by input name "
               "(repeatable); inputs not given are drawn at random")


def _tolerance_options(p, rtol: str, atol: str, what: str) -> None:
    """The golden check's tolerance flags; None (default) lets each output's dtype decide
    (:func:`onnx_cinm.golden.default_tolerance`)."""
    for flag, kind, f32 in ((rtol, "relative", "1e-4"), (atol, "absolute", "1e-5")):
        widened = ("; widened per output after a K-term sum to 4 eps sqrt(K) rms(reference), or "
                   "to one step of a quantized output: the check's header prints each widened "
                   "atol" if kind == "absolute" else "")
        p.add_argument(flag, type=_tolerance, default=None,
                       help=f"{kind} tolerance{what} (default: by output dtype, {f32} for "
                            f"float32, 4 ulps = 0.0039 for float16{widened})")


def _input_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--input", action="append", default=[], dest="feed",
                    metavar="NAME=FILE.npy|FILE.npz", help=_INPUT_HELP)
    sp.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                    help="size of a symbolic dimension of the random inputs, e.g. batch=8 "
                         "(repeatable; default: the sizes the model was optimized for, else "
                         "1 on axis 0 and 8 elsewhere)")


def _dims(items: list[str], parser) -> dict[str, int]:
    """``{name: size}`` from ``--dim NAME=SIZE`` options (a usage error if malformed or if a
    name is given twice)."""
    dims: dict = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not name or not size.isdigit() or int(size) < 1:
            parser.error(f"--dim expects NAME=SIZE with a positive integer SIZE, got '{item}'")
        if name in dims:
            parser.error(f"--dim given twice for '{name}' ({name}={dims[name]}, {item})")
        dims[name] = int(size)
    return dims


def _check_dim_names(model, dims: dict, parser) -> None:
    """:func:`onnx_cinm.golden.check_dim_names` (a ``--dim`` naming no symbolic dim of
    ``model``'s inputs) as a usage error, exit 2, like every other ``--dim`` mistake
    (:func:`_dims`)."""
    from .. import golden

    try:
        golden.check_dim_names(model, dims)
    except CinmError as e:
        parser.error(f"--dim: {e}")


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


#: The labels' array of a labeled ``.npz`` (``evaluate --data``'s default ``--labels`` key).
LABELS_KEY = "labels"


def _drop_labels(args, model, given: dict) -> None:
    """Drop (in place, with a note on stderr unless ``-q``) the labels' array of an ``--input FILE.npz``
    archive that ``model`` has no input for: the labeled archive ``evaluate --data`` takes
    feeds ``run``, ``compare`` and ``optimize`` as it is. An array given by name
    (``--input labels=FILE.npy``) is left for the input checks to refuse."""
    from .. import golden
    from .messages import note

    named = {item.partition("=")[0] for item in args.feed if "=" in item}
    if LABELS_KEY not in given or LABELS_KEY in named:
        return
    if LABELS_KEY in {vi.name for vi in golden.real_inputs(golden._load_header(model).graph)}:
        return
    archive = next((item for item in args.feed if "=" not in item), "")
    del given[LABELS_KEY]
    note(args, f"--input {archive}: array '{LABELS_KEY}' is not an input of the "
         "model (a labeled data set's labels, as evaluate takes them); ignored")


def _refuse_dim_conflicts(model, given: dict, dims: dict) -> None:
    """Raise a one-line CinmError when a ``--dim`` sizes a dim another way than a given
    ``--input`` array does (``run``/``compare`` feed the array as it is: the ``--dim`` would be
    silently ignored, and random inputs drawn at it would disagree with the array)."""
    from .. import golden

    for dim, size, name, has in golden.dim_conflicts(model, given, dims)[:1]:
        raise CinmError(f"--dim {dim}={size} conflicts with --input '{name}', whose {dim} is "
                        f"{has}; drop the --dim or give an array of that size")


def _check_writable_folder(folder: str, what: str) -> None:
    """Raise CinmError unless ``folder`` is, or can be created as, a writable folder (a file
    is created and removed in it, or in the parent it would be created in)."""
    p = Path(folder)
    if p.exists() and not p.is_dir():
        raise CinmError(f"{what} folder '{folder}' exists and is not a folder")
    from .. import frontend

    frontend.missing_parent(p, what)
    existing = p
    while not existing.exists():  # the nearest ancestor that exists must take new entries
        existing = existing.parent
    if not existing.is_dir():
        raise CinmError(f"cannot create the {what} folder '{folder}': '{existing}' is not a folder")
    _probe_folder(existing, f"the {what} into '{folder}'")


def _probe_folder(folder: Path, what: str) -> None:
    """Raise CinmError (``cannot write WHAT: 'FOLDER' is not writable (reason)``) unless a file
    can be created in, and removed from, the existing folder ``folder``. A real write, not
    ``os.access``: that says yes to root in an immutable folder (``chattr +i``) or on a
    read-only mount, and the failure then came only after all the work."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".onnx-cinm-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise CinmError(f"cannot write {what}: '{folder}' is not writable "
                        f"({e.strerror or type(e).__name__})") from None


def _check_output_file(target: str, option: str, protected: dict) -> None:
    """Raise CinmError if ``target`` (an output file of ``option``) names a folder, lies in a
    folder that does not exist or cannot be written (:func:`_probe_folder`), or would overwrite
    one of ``protected`` (``{path: what it is}``; a folder
    protects everything inside it)."""
    p = Path(target)
    if target.endswith(("/", os.sep)) or p.is_dir():
        raise CinmError(f"{option} '{target}' names a folder, not a regular file")
    if p.resolve().parent.exists() and not p.resolve().parent.is_dir():
        raise CinmError(f"cannot write '{target}': '{p.parent}' is a file, not a folder "
                        "(Not a directory)")
    if not p.resolve().parent.is_dir():
        raise CinmError(f"cannot write '{target}': folder '{p.parent}' does not exist")
    _probe_folder(p.resolve().parent, f"'{target}'")
    resolved = p.resolve()
    for path, what in protected.items():
        q = Path(path).resolve()
        if resolved == q or q in resolved.parents:
            verb = "overwrite" if resolved == q else "write into"
            raise CinmError(f"{option} '{target}' would {verb} {what}; choose another path")


def written_by_optimize(model) -> bool:
    """Whether ``model`` (a ModelProto) was written by ``onnx-cinm optimize``: it records the
    host figures optimize priced it with (:data:`onnx_cinm.hostmodel.METADATA_KEY`, written on
    every optimize) or holds a cinm op (a model of an older onnx-cinm)."""
    from ..dialects.cinm import all_nodes
    from ..hostmodel import METADATA_KEY

    return any(p.key == METADATA_KEY for p in model.metadata_props) \
        or any(n.domain == "cinm" for n in all_nodes(model.graph))
