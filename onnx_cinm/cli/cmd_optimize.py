"""``onnx-cinm optimize``: the compiler on a model or a bundled example, its summary and the
kernel folder."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..errors import CinmError
from ..text import Column, printable, progress_bar, si, table
from . import clock
from .args import (
    _check_dim_names,
    _check_output_file,
    _check_writable_folder,
    _dims,
    _drop_labels,
    _given_inputs,
    _pass_options,
)
from .messages import note, warn


def totals_text(t: dict, scope: str = " for the model written") -> str:
    """The summary's clause of the written model's modeled per-inference totals ``t``
    (``stats["placement"]["model_totals"]``: seconds, joules, tile writes, as ``report`` adds
    them up), the same under cost and heuristic placement; ``scope`` follows the tile writes
    (``run --profile`` prints the clause without it)."""
    # as report lists them: devices by name, then the transfers; a device with nothing left out
    by = t.get("by_device") or {}
    by = {d: by[d] for d in sorted(by, key=lambda d: (d == "transfers", d)) if by[d][0] or by[d][1]}
    return (f"modeled {si(t['latency_s'], 's')}, {si(t['energy_j'], 'J')}, {t['writes']} tile "
            f"writes/inference{scope}"
            + (" (" + ", ".join(f"{d} {si(v[0], 's')} / {si(v[1], 'J')}" for d, v in by.items())
               + ")" if len(by) > 1 else ""))


def _cmd_optimize(args, parser) -> int:
    begin = time.perf_counter()  # the command's own time counts from here
    startup = begin - clock.origin if clock.origin is not None else None
    from .. import artifacts, frontend
    from ..examples import EXAMPLES, get_example
    from ..passes import DEFAULT_PIPELINE, available_passes
    from ..passes.placement_rules import hint_warnings, load_hints, parse_hint
    from ..pipeline import STEPS, device_loads, load_text, optimize

    imported = time.perf_counter() - begin
    if args.list_passes:
        descriptions = available_passes()
        print(table(("pass", "description"), [(n, descriptions.get(n, "")) for n in DEFAULT_PIPELINE],
                    header=False))
        print("\nsteps around the passes (also timed on the 'passes:' line; --skip-pass does not take them):")
        print(table(("step", "description"), list(STEPS.items()), header=False))
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
    artifacts.check_output_replaceable(args.output, "-o")
    kernels = artifacts.artifact_dir(out).resolve()
    other = artifacts.shared_with(out)
    if other.is_file() and kernels.is_dir():  # X.onnx and X: the one pair sharing a folder
        raise CinmError(f"-o '{args.output}' would replace the kernel folder "
                        f"'{artifacts.artifact_dir(out)}' of the existing '{other}' (both "
                        "names map to it); choose another output name")
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
        warn(args, f"{', '.join(cost_only)} apply to --placement cost only")
    if "lifetime_inferences" in options and "max_writes_per_cell" not in options:
        warn(args, "--lifetime-inferences is the span of the --max-writes-per-cell budget; "
             "without that budget it changes nothing")
    from ..passes import DEFAULT_PIPELINE as _PIPE

    bar = progress_bar(len(_PIPE) + (0 if args.check == 0 else 1), "optimize", "pass",
                       not args.quiet)

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
    # the output's and the report's folders exist and take files: checked before the work,
    # after the usage errors (a bad option or --dim is a usage error whatever the output)
    _check_output_file(args.output, "-o", {})
    if args.report:
        _check_writable_folder(args.report, "report")
    if args.place_config:
        hints += load_hints(args.place_config)
    if hints:  # on the command line: they replace the --config file's
        options["place"] = hints
    hints = options.get("place", [])
    if hints and (args.stop_after == "cinm" or "placement" in args.skip_pass):
        warn(args, "placement does not run, so --place hints are ignored")
    # a path, not a loaded model: optimize() then owns what it loads and rewrites it in place
    # (a model handed in is copied first, a second copy of every weight)
    model = get_example(args.example) if args.example else args.input
    header = model
    if dims or shapes:
        from .. import golden

        # the looks at the inputs below parse a path's whole file: parse it once for them
        header = golden._load_header(model)
        if dims:
            _check_dim_names(header, dims, parser)
        try:  # a name or rank the model's inputs do not have: a usage error, as --dim's
            frontend.check_input_shapes(header, shapes)
        except CinmError as e:
            parser.error(str(e))
    if given:
        _drop_labels(args, header, given)
    try:
        result = optimize(model, skip=args.skip_pass,
                          stop_after=args.stop_after, input_shapes=shapes, check=args.check,
                          check_rtol=args.check_rtol, check_atol=args.check_atol,
                          check_nan_inf=args.check_nan_inf,
                          dims=dims, inputs=given, device_options=options, log=log,
                          totals=not args.quiet,  # -q prints no summary: its figures not counted
                          progress=not args.quiet)
    finally:
        bar.close()
    if dims and given:  # --dim wins for planning; the check fed the arrays as they are (said
        # after the work: a conflict the model cannot run, an unrolled recurrence, is an error)
        for dim, size, name, has in golden.dim_conflicts(header, given, dims):
            warn(args, f"--dim {dim}={size} and --input '{name}' ({dim}={has}) "
                 f"differ: planned at {dim}={size}, "
                 + (f"checked on the array at {dim}={has}" if args.check != 0 else
                    "the array not run (--check 0)"))
    if args.report:  # rendered first: a report that cannot be made stops before any writing
        from .. import report

        t0 = time.perf_counter()
        rendered = report.render_report(result.model, options, title=out.name)
        result.timings.append(("report", time.perf_counter() - t0))
    t0 = time.perf_counter()
    manifest = artifacts.save(result.model, out, log)
    result.timings.append(("save", time.perf_counter() - t0))
    args.written = out  # an interrupt from here on must not claim that nothing was written
    if args.report:  # its folder was checked up front; a failure now still says what exists
        try:
            report_files = frontend.write_files_into(args.report, rendered["files"], "report")
        except CinmError as e:
            raise CinmError(f"{out} was written, but: {e}") from None
    if result.check is not None and result.check.meaningless:
        warn(args, f"golden check not meaningful: {'; '.join(result.check.meaningless)}; "
             "check real data with --input NAME=FILE.npy (or FILE.npz)")
    if result.check_skipped:
        warn(args, f"golden check skipped: {result.check_skipped}; give sizes "
             "with --dim NAME=SIZE or --overwrite-input-shape NAME:D1,D2,..., or check it "
             "with 'onnx-cinm compare --input ...'")
    if result.stats.get("reoptimized"):
        note(args, f"{args.input} was itself written by onnx-cinm optimize: its cinm ops are "
             "placed anew, and the check compares against it, not against the model it came "
             "from ('onnx-cinm compare SOURCE.onnx OUT.onnx' compares against that one)")
    frozen = result.stats.get("canonicalize_opset", {}).get("frozen_inputs", [])
    if frozen and args.verbose:  # old exporters list every weight: a note, not a warning
        shown = ", ".join(frozen[:5]) + (f" and {len(frozen) - 5} more" if len(frozen) > 5 else "")
        note(args, f"{len(frozen)} graph input(s) with initializers ({shown}) are "
             "compiled as constants; values fed for them at run time are refused")
    for line in result.stats.get("option_warnings", []):
        warn(args, line)
    for line in hint_warnings(result.stats.get("placement", {})):
        warn(args, printable(line))
    unrolled = frontend.unrolled_dims(result.model)
    if unrolled and not args.quiet:  # as the compiled model's fixed dims below: it runs at these
        from .. import golden

        def source(d):
            if d in dims:
                return "--dim"
            names = [n for n, a in given.items()
                     if d in golden.dims_from_shapes(result.model, {n: np.shape(a)})]
            return f"--input '{names[0]}'" if names else "the input model's planned sizes"
        note(args, "the recurrences were unrolled for "
             + ", ".join(f"{d}={n} (sized by {source(d)})" for d, n in unrolled.items())
             + ": the model runs only at " + ("that length" if len(unrolled) == 1 else "those")
             + " (optimize without sizing "
             + ", ".join(unrolled) + " for a Scan that runs at any)")
    if result.fixed_dims:
        sizes = {**{d: 1 for d in result.unsized_dims}, **result.dims}
        warn(args, "the compiled model runs only at "
             + ", ".join(f"{d}={sizes[d]}" for d in result.fixed_dims)
             + " (see 'dims fixed' in the summary)")
    source = args.input or f"example '{args.example}'"
    result.timings.insert(0, ("imports", imported))
    result.wall_s = time.perf_counter() - begin  # the command's, not only optimize()'s
    result.startup_s = startup
    say(f"onnx-cinm optimize: {source} -> {out}")
    for line in ([] if args.quiet else result.summary().splitlines()):
        say(f"  {line}")
    if manifest is not None:
        n_files = sum(len(k["files"]) for k in manifest["kernels"])
        say(f"  kernels: {len(manifest['kernels'])} in {artifacts.artifact_dir(out)}/ "
            f"({n_files} files, listed with hashes in {artifacts.MANIFEST})")
    # -q prints none: not built; -v lists every kernel, else one row per repeated kernel
    tables = None if args.quiet else result.device_tables(fold=not args.verbose)
    if tables:
        say("")
        for line in tables.splitlines():
            say(f"  {line}")
    st = result.stats.get("placement", {})
    t = st.get("model_totals")
    if t is not None and st.get("strategy") == "heuristic":
        say(f"  heuristic placement: {totals_text(t)}")
    if st.get("strategy") == "cost":
        if t is not None:
            # two sets of figures: the model written (what report and sweep count) and the
            # baselines, priced on the graph the search saw (as the -v 'placement:' line is)
            budget = options.get("max_writes_per_cell")
            within = ("" if budget is None else
                      f"; within the endurance budget of {budget:g} writes per cell over "
                      f"{options.get('lifetime_inferences', 1.0):g} inference(s)")
            say(f"  cost placement ({st['objective']}): {totals_text(t)}; {st['method']}{within}")
            say("    baselines, priced on the graph as placement saw it (before restore_host_ops "
                "and fold_layouts rewrite it; so is optimize -v's 'placement:' line):")
            for name, b in st["baselines"].items():
                say(f"    {name}: {si(b.latency_s, 's')}, {si(b.energy_j, 'J')}, {b.writes} "
                    "tile writes/inference")
        for v in st.get("violations", []):
            warn(args, f"the placement hints break a constraint: {v}")
    load = "" if t is None else load_text(device_loads(result.model))
    if load:
        say(f"  {load}")
    if args.verbose and result.placements:
        print(table((Column("node", fit=40), "op", "device", "placement"), result.placements,
                    header=False, indent="  "))
    if args.report:
        say(f"  report: {', '.join(str(p) for p in report_files)}")
    return 0
