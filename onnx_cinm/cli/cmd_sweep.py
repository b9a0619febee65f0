"""``onnx-cinm sweep``: a model optimized over a grid of device configurations."""
from __future__ import annotations

from pathlib import Path

from ..errors import CinmError
from ..text import Column, si, table
from .args import _check_dim_names, _check_writable_folder, _dims, _pass_options
from .messages import note, warn


def _cmd_sweep(args, parser) -> int:
    from .. import artifacts, frontend, sweep
    from ..passes.placement_rules import load_hints, parse_hint

    try:
        hints = [parse_hint(h) for h in args.place]
        notes: list = []
        sets = sweep.parse_sets(args.sets, notes)
        for line in notes:
            note(args, line)
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
        warn(args, f"--scheduler applies to --executor dask only; ignored with "
             f"--executor {args.executor}")
    if args.workers and args.executor != "process":
        warn(args, f"--workers applies to --executor process only; ignored with "
             f"--executor {args.executor}")
    if args.executor == "dask" and not args.scheduler:
        parser.error("--executor dask needs --scheduler ADDRESS")
    out = Path(args.output)
    artifacts.check_output_outside_kernels(out, "-o")
    _check_writable_folder(args.output, "sweep")  # before the sweep, not after it
    base = _pass_options(args, parser)
    if args.place_config:
        hints += load_hints(args.place_config)
    if hints:  # on the command line: they replace the --config file's, as optimize's do
        base["place"] = hints
    if args.example:
        from ..examples import get_example

        # no file of that name exists: the table and the plot name the example
        model, source = get_example(args.example), f"example '{args.example}'"
    else:
        model, source = frontend.load_model(args.input), args.input
    _check_dim_names(model, dims, parser)
    dim_notes: list = []
    configs, results = sweep.run(model, sets, base_options=base, executor=args.executor,
                                 workers=args.workers, scheduler=args.scheduler,
                                 progress=not args.quiet, input_shapes=shapes or None, dims=dims,
                                 notes=dim_notes)
    for line in dim_notes:
        note(args, line)
    for line in dict.fromkeys(w for r in results for w in r.get("hints", [])):
        warn(args, line)  # each once, however many configurations said it
    idle = sweep.idle_devices(sets, results)
    for key, dev in idle:
        hinted = any(d == dev for _, d in base.get("place", ()))
        note(args, f"no configuration placed an op on {dev}: sweeping {key} changed nothing "
             + ("(the --place hints for it placed none)" if hinted
                else f"(put ops there with --place PATTERN={dev})"))
    values = dict(sets)
    for key in sweep.unchanged_keys(sets, configs, results):
        if key not in {k for k, _ in idle}:
            note(args, f"sweeping {key} changed no figure of any configuration at these values"
                 + (": it sets how the kernels run, which no cost model reads (onnx-cinm "
                    "evaluate measures what it does to accuracy)"
                    if sweep.run_time_key(key, values[key][0]) else ""))
    paths = sweep.write(out, configs, results,
                        title=source if args.example else Path(args.input).name)
    if not args.quiet:
        print(f"onnx-cinm sweep: {source}, {len(configs)} configurations ({args.executor})")
        print(table(
            ("configuration", Column("latency", ">"), Column("energy", ">"), Column("writes", ">"),
             "devices", "breaks"),
            [(sweep.label(c), "rejected", "-", "-", "-", sweep.rejection(r)) if sweep.rejection(r)
             else (sweep.label(c), si(r["latency_s"], "s"), si(r["energy_j"], "J"), r["writes"],
                   r["devices"], r["violations"] or "") for c, r in zip(configs, results)], indent="  "))
        counts = {r.get("branches") for r in results} - {""}
        if counts:
            print("  (If branches: " + ("UPPER BOUND, both branches summed of an If whose branch "
                                        "the planning probe did not see" if "upper bound" in counts
                                        else "the one the planning probe took counted") + ")")
        print(f"written: {', '.join(str(p) for p in paths)}")
    return 0
