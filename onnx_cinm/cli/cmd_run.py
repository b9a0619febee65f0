"""``onnx-cinm run`` and ``onnx-cinm compare``: the optimized model in the CINM execution
provider, its profile, and its check against onnxruntime on the original."""
from __future__ import annotations

import math
from pathlib import Path

from ..errors import CinmError, ReferenceFailed
from ..text import si
from .args import (_check_dim_names, _check_output_file, _drop_labels, _given_inputs, _input_files,
                   _refuse_dim_conflicts)
from .messages import note, warn


def _provider_options(items: list[str], parser) -> dict:
    """``--provider-option KEY=VALUE`` items as typed provider options
    (:func:`onnx_cinm.runtime.session.provider_option_specs`, e.g. ``upmem_mode`` from the
    UPMEM device's run modes); an unknown key or a bad value is a usage error."""
    from ..options import from_text, unknown_key
    from ..runtime.session import PROVIDER, provider_option_specs

    schema = provider_option_specs()
    opts: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--provider-option expects KEY=VALUE, got '{item}'")
        if key in opts:  # two values for one key: which one was meant?
            parser.error(f"--provider-option {key} given twice")
        try:
            if key not in schema:
                raise unknown_key(key, schema, f"{PROVIDER} option")
            opts[key] = from_text(schema[key], value)
        except CinmError as e:
            parser.error(f"--provider-option {str(e).removeprefix('option ')}")
    return opts


def _session(path, provider_options: dict):
    from ..runtime.session import PROVIDER, InferenceSession

    return InferenceSession(path, providers=[PROVIDER, "CPUExecutionProvider"],
                            provider_options=[provider_options, {}])


def _warn_if_nothing_on_devices(sess, args) -> None:
    """A warning on stderr when the provider will run (some of) the model in onnxruntime only
    (none under ``-q``: :func:`.messages.warn`)."""
    from ..dialects.cinm import all_nodes
    from .args import written_by_optimize

    cinm_ops = [n for n in all_nodes(sess._model.graph) if n.domain == "cinm"]  # If branches too
    devices = [dict((a.name, a.s) for a in n.attribute).get("device") for n in cinm_ops]
    placed = [n for n, d in zip(cinm_ops, devices) if d not in (None, b"host")]
    unkerneled = [n for n in placed if not any(a.name == "kernel" for a in n.attribute)]
    everything = "; everything runs in onnxruntime"
    if not cinm_ops and written_by_optimize(sess._model):
        note(args, "'onnx-cinm optimize' placed no op of this model on a device "
             "(none of its ops is one a device takes)" + everything)
        return
    if not cinm_ops:
        warning = ("no op of this model runs on a device: it has no cinm op and no record of "
                   "'onnx-cinm optimize' (optimize it first)" + everything)
    elif all(d is None for d in devices):  # no device attribute: placement never ran
        warning = (f"no op of this model runs on a device: its {len(cinm_ops)} cinm ops were "
                   "never placed (written before placement: optimize --stop-after cinm or "
                   "--skip-pass placement)" + everything)
    elif not placed:
        warning = (f"no op of this model runs on a device: placement put all {len(cinm_ops)} "
                   "cinm ops on the host" + everything)
    elif unkerneled:
        warning = (f"{len(unkerneled)} device-placed op(s) have no kernel (compiled with "
                   "--stop-after?); they run in onnxruntime")
    else:
        return
    warn(args, warning)


def _modeled_totals(model) -> dict:
    """The written model's modeled per-inference totals (seconds, joules, tile writes, split by
    device and transfers), as ``report`` and optimize's summary total them (the cost model
    over the recorded placement, with the options and host figures it was compiled with)."""
    from ..passes.branches import counted_by_device, counted_totals, evaluate_graphs
    from ..report import options_from_plans

    root = evaluate_graphs(model, options_from_plans(model))[0]
    return {**counted_totals(root), "by_device": counted_by_device(root)}


def _cmd_run(args, parser) -> int:
    from .. import artifacts, frontend, golden
    from ..runtime import profile

    opts = _provider_options(args.provider_option, parser)
    given, dims = _given_inputs(args, parser)
    if args.profile_out and Path(args.profile_out).suffix.lower() not in (".json", ".csv"):
        parser.error(f"--profile-out must end in .json or .csv, got '{args.profile_out}'")
    if args.output and Path(args.output).suffix.lower() != ".npz":
        parser.error(f"-o/--output must end in .npz (a numpy archive), got '{args.output}'")
    protected = {args.model: "the model being run",
                 str(artifacts.find_artifact_dir(args.model)): "the model's kernel folder"}
    protected.update({file: f"input file '{file}'" for file in
                      _input_files(args.feed)})
    for option, target in (("-o", args.output), ("--profile-out", args.profile_out)):
        if target:
            _check_output_file(target, option, protected)
            artifacts.check_output_outside_kernels(target, option)
            protected[target] = f"the {option} output"
    sess = _session(args.model, opts)
    _drop_labels(args, sess._model, given)
    shapes = {name: arr.shape for name, arr in given.items()}
    _check_dim_names(sess._model, dims, parser)
    from ..dialects import cinm

    # an empty array runs, except into a recurrent op onnxruntime runs: its LSTM aborts the
    # process (SIGABRT, no message) given no elements (a review's HardSigmoid LSTM, kept whole)
    recurrent = any(map(frontend.is_recurrent, cinm.all_nodes(sess._model.graph)))
    golden.check_given_inputs(sess._model, given, empty_ok=not recurrent)
    _refuse_dim_conflicts(sess._model, given, dims)
    planned = frontend.planned_dims(sess._model)
    # by default the sizes it was planned for (a dim optimize was given no size for: 1, as
    # its plans took it), unless the given arrays have others
    from_arrays = golden.dims_from_shapes(sess._model, shapes)
    at_one = [d for d in golden.symbolic_dims(sess._model)
              if d not in planned and d not in from_arrays and d not in dims]
    dims = {**{d: 1 for d in at_one}, **planned, **from_arrays, **dims}
    _warn_if_nothing_on_devices(sess, args)
    say = (lambda msg: None) if args.quiet else print
    outs = None
    for i in range(args.random):
        feeds = golden.random_inputs(sess._model, seed=i, dims=dims, shapes=shapes) \
            if len(given) < len(sess.get_inputs()) else {}
        feeds.update(given)
        try:
            outs = sess.run(None, feeds)
        except CinmError as e:
            if i or not at_one:
                raise
            # too small to run at all (a pooling window wider than 1): the random inputs' sizes,
            # said only when they run (else the first error, which the sizes did not cause:
            # a note blaming them came before an unrolled model's length error, trial s36b)
            sizes = {k: v for k, v in dims.items() if k not in at_one}
            feeds = {**golden.random_inputs(sess._model, seed=i, dims=sizes, shapes=shapes), **given}
            try:
                outs = sess.run(None, feeds)
            except CinmError:
                raise e from None
            note(args, f"the model does not run with {', '.join(at_one)} at 1, the "
                 f"size its plans took ({e}); ran at the random inputs' sizes instead (give "
                 "--dim NAME=SIZE)")
            dims, at_one = sizes, []
    ran = golden.dims_from_shapes(sess._model, {k: v.shape for k, v in feeds.items()})
    replanned = {k: v for k, v in sorted(ran.items()) if v != planned.get(k, 1)}
    names = [o.name for o in sess.get_outputs()]
    say(f"onnx-cinm run: {args.model}, {args.random} run(s), providers {', '.join(sess.get_providers())}")
    say("  partitions: " + _partitions_line(sess))
    unchecked = frontend.check_skipped(sess._model)
    if unchecked:  # the outputs below come from a model optimize could not check
        warn(args, f"optimize could not check this model against its original: {unchecked}")
    arrays: dict = {}
    for arg, value in zip(sess.get_outputs(), outs):
        found = _output_arrays(arg.name, value)
        arrays.update(found)
        arr = found.get(arg.name)
        kind = "" if arg.type.startswith("tensor(") else f"{arg.type} as "
        say(f"  output {arg.name}: " + (f"{arg.type}" if arr is None else
            f"{kind}{arr.dtype} {list(arr.shape)}" + _value_range(arr)))
    if args.output:
        unsaved = [n for n in names if n not in arrays]
        if unsaved:
            raise CinmError(f"output '{unsaved[0]}' has no array form to write to "
                            f"{args.output}")
        _save_npz(args.output, arrays)
        say(f"  outputs written to {args.output}")
    was = {k: planned.get(k, 1) for k in replanned}
    if args.profile:
        print(profile.table(sess.profile(), planned=_dims_text(was) if replanned else None,
                            at_run=_dims_text(replanned) if replanned else None,
                            fold=not args.all_nodes))
        cfg = sess.configuration()
        libs = ", ".join(f"{lib} ({api})" for lib, api, _ in cfg["blas"]) or "none loaded"
        print(f"configuration: BLAS threads {cfg['blas_threads'] or 'library default'} [{libs}], "
              f"crossbar products {cfg['matmul']}"
              + (f" ({', '.join(f'{k}: {v}' for k, v in cfg['chosen'].items())})"
                 if cfg["chosen"] else "")
              + ", partitions " + ", ".join(f"{k} {v}" for k, v in cfg["partitions"].items())
              + (" (both branches of each If the provider runs)" if sess.provider_ifs() else ""))
        load = sess.load_profile()
        for dev in sorted({r["device"] for r in load}):
            rs = [r for r in load if r["device"] == dev]
            writes = sum(r["writes"] for r in rs)
            print(f"at load (once per session, not per inference): {dev}, {len(rs)} "
                  f"kernel{'s' * (len(rs) != 1)}" + (f", {writes} tile writes" if writes else "")
                  + f", modeled {si(sum(r['latency_s'] for r in rs), 's')}, "
                  f"{si(sum(r['energy_j'] for r in rs), 'J')}")
        # the plans' figures, at the sizes planned, as optimize's summary and report price
        # them: the whole model's (the rows above have no modeled host time), and inferences
        # back to back at its modeled latency for the wear
        from ..dialects import cinm
        from .cmd_optimize import totals_text

        sizes = (f"at {_dims_text({k: planned.get(k, 1) for k in replanned})} as planned, not "
                 f"this run's {_dims_text(replanned)}" if replanned else "")
        at = f" (the plans' figures, {sizes})" if sizes else ""
        wear = sess.wear()
        if any(n.domain == cinm.DOMAIN for n in cinm.all_nodes(sess._model.graph)):
            totals = _modeled_totals(sess._model)  # (a model never optimized has no plans)
            print("model (the plans' figures, as optimize's summary and report price them"
                  + (f"; {sizes}" if sizes else "") + "): "
                  + totals_text(totals, scope=""))
            # the rows above are counted at this run's sizes; the plans' at 1 for an unsized
            # dim, and behind it (a trial's BERT: 51 us counted, 1.6 us planned, no word why)
            unsized = frontend.unsized_note(sess._model, planned)
            if unsized and not args.quiet:
                print(f"  ({unsized})")
            if wear:  # at the model's modeled latency, as optimize's summary and report
                wear = sess.wear(totals["latency_s"])
        for w in wear.values():
            # -q: the profile asked for, not the advice of a note
            print(w.line + at + (f"\n{w.note}" if w.note and not args.quiet else ""))
    if replanned and (args.profile or (args.profile_out and not args.quiet)):
        print(_sizes_note(planned, replanned, sess.profile()))
    if args.profile_out:
        try:
            profile.write(sess.profile(), args.profile_out)
        except OSError as e:
            raise CinmError(f"cannot write the profile to '{args.profile_out}': {e.strerror}") from None
        say(f"  profile written to {args.profile_out}")
    return 0


def _static_inputs(model) -> dict:
    """``{input name: shape}`` of ``model``'s inputs whose every dim is a number."""
    from .. import golden

    out = {}
    for vi in golden.real_inputs(model.graph):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(
                d.HasField("dim_value") and d.dim_value > 0 for d in tt.shape.dim):
            out[vi.name] = [d.dim_value for d in tt.shape.dim]
    return out


def _dims_text(dims: dict) -> str:
    """``batch=8, seq=128``."""
    return ", ".join(f"{k}={v}" for k, v in sorted(dims.items()))


def _sizes_note(planned: dict, replanned: dict, records: list) -> str:
    """The warning that some modeled figures are for the sizes the model was planned at, not
    the ones this run had (``replanned``: the dims whose size differs): which, by the records'
    ``basis`` (:func:`onnx_cinm.runtime.profile.basis_note`), per device, and how many
    crossbar kernels ran programs planned again at this run's shapes (``replanned``)."""
    text = _dims_text
    was = text({k: planned.get(k, 1) for k in replanned})
    by = {}
    for r in records:
        if r.get("basis"):
            by.setdefault(r["basis"], set()).add(r["device"])
    again = f"optimize again with --dim {' --dim '.join(text(replanned).split(', '))}"
    head = f"note: this run had {text(replanned)}, but the model was planned at {was}: "
    again_at = len({r["node"] for r in records if r.get("replanned")})
    if again_at:  # crossbar kernels over an activation ran programs planned at its shape
        again_at = (f" (but for {again_at} crossbar kernel{'s' * (again_at != 1)} planned again "
                    "at this run's shapes, noted above)")
    if "plan" not in by:
        return (head + "the modeled figures were counted on this run's inputs (basis 'run'), "
                f"on plans made for the planned sizes{again_at or ''}; {again} to plan for "
                "these sizes")
    plan = ", ".join(sorted(by["plan"]))
    ran = (f"; those of {', '.join(sorted(by['run']))} (basis 'run') were counted on this run's "
           "inputs, so the two do not add up to one inference at one size") if "run" in by else ""
    return (head + f"the modeled figures of {plan} (basis 'plan') are for the planned sizes{ran}; "
            f"{again} to cost these sizes")


def _partitions_line(sess) -> str:
    """What the runs so far ran, counted as ``--profile`` counts it (:func:`onnx_cinm.runtime.
    profile.ran`: of an If the provider runs, the branches that ran); when the provider runs
    Ifs, then what the model holds over both branches of each
    (:meth:`InferenceSession.partitions`), labelled as such."""
    from collections import Counter

    from ..runtime import profile
    from ..runtime.session import HOST_KERNEL

    text = _partition_text(profile.ran(sess.profile()))
    ifs = sess.provider_ifs()
    if not ifs:
        return text
    parts = sess.partitions()
    host = [n for k, n in parts if k == "host"]
    whole = {"partitions": len(host), "nodes": sum(host),
             "modeled": Counter(dev for _, dev in sess.modeled_nodes()),
             "own": Counter("host" if k == HOST_KERNEL else k for k, _ in parts if k != "host")}
    return (f"{text} ran; the model holds {_partition_text(whole)} over both branches of the "
            f"{len(ifs)} If{'s' * (len(ifs) != 1)} the provider runs")


def _modeled_text(sess) -> str:
    """``, except 4 <device> nodes ...``: the device nodes of ``sess`` whose device arithmetic
    the comparison did not see: those that ran as their reference bodies inside host
    partitions, charged by their device's cost model (a device's ``model`` run mode; a trial
    read "max abs err 0 ... device nodes in their kernels" for nodes that the device's simulate
    mode puts 0.0032 off), and those computed inside the kernel of a node on another device
    that reads them (an Im2Col on UPMEM whose crossbar convolution takes its input: trial s36
    read "except 1 upmem node" for 3); '' when there are none."""
    from collections import Counter

    modeled = Counter(dev for _, dev in sess.modeled_nodes())
    records = sess.profile()
    owner = {r["node"]: r["device"] for r in records if not r.get("fused_into")}
    fused = Counter(dev for _, dev in {(r["node"], r["device"]) for r in records
                                       if r.get("fused_into")
                                       and owner.get(r["fused_into"], r["device"]) != r["device"]})
    if not modeled and not fused:
        return ""
    parts = []
    for dev in sorted(set(modeled) | set(fused)):
        m, f = modeled[dev], fused[dev]
        run = (f"run by onnxruntime as {'its reference body' if m == 1 else 'their reference bodies'}"
               " and charged by the device's cost model")
        inside = f"computed inside the kernel of the node on another device that reads {'it' if f == 1 else 'them'}"
        n = m + f
        ways = f"({m} {run}; {f} {inside})" if m and f else run if m else inside
        parts.append(f"{n} {dev} node{'s' * (n != 1)} {ways}")
    return (f", except {', '.join(parts)}, whose device arithmetic is not in this comparison "
            "(onnx-cinm devices lists the run modes that simulate it)")


def _partition_text(counts: dict) -> str:
    """``2 host partitions (5 nodes; 2 of them upmem nodes charged by their device's cost model),
    memristor 1 node``: the counts of :func:`onnx_cinm.runtime.profile.ran`, with their
    units."""
    from ..runtime.profile import own_nodes_text

    n = counts["partitions"]
    text = f"{n} host partition{'s' * (n != 1)} ({counts['nodes']} nodes"
    if counts["modeled"]:
        text += "; " + ", ".join(f"{k} of them {d} node{'s' * (k != 1)} charged by "
                                 f"{'its' if k == 1 else 'their'} device's cost model"
                                 for d, k in sorted(counts["modeled"].items()))
    text += ")"
    return text + own_nodes_text(dict(sorted(counts["own"].items())))


def _output_arrays(name: str, value) -> dict:
    """An output as arrays for display and ``.npz``: a tensor as ``{name: array}``; a map or a
    sequence of maps (ZipMap) as its values ``{name: [len, keys]}`` plus ``{name.keys: keys}``;
    a sequence of tensors of one shape stacked. ``{}`` if it has no array form (never pickled)."""
    import numpy as np

    from .. import golden

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

    from .. import frontend

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    try:
        frontend.write_file_atomic(path, buf.getvalue())
    except OSError as e:
        raise CinmError(f"cannot write '{path}': {e.strerror}") from None


def _refuse_other_model(original, optimized, args) -> None:
    """Raise CinmError (one line) when the optimized model was not made from this original:
    it records another source (:data:`.frontend.SOURCE_DIGEST_KEY`, which ``optimize``
    writes), or, for a model that records none, the two models' outputs or inputs (those not
    initializers) have other names or element types (``optimize`` keeps them)."""
    from .. import frontend, golden

    recorded = frontend.recorded_source(optimized)
    if recorded is not None and frontend.source_digest(original) not in (None, recorded):
        raise CinmError(f"{args.optimized} was not optimized from {args.original} (it records "
                        "another source model's digest): compare an original with its own "
                        "optimized model")
    for what, of in (("outputs", lambda g: g.output), ("inputs", golden.real_inputs)):
        want, got = ({v.name: v.type.tensor_type.elem_type for v in of(m.graph)}
                     for m in (original, optimized))
        if set(want) != set(got) or any(want[k] and got[k] and want[k] != got[k] for k in want):
            raise CinmError(f"the models' {what} differ: {args.original} has {_named(want)}; "
                            f"{args.optimized} has {_named(got)} (optimize keeps them: compare "
                            "an original with its own optimized model)")


def _named(types: dict) -> str:
    """``{tensor name: onnx element type}`` as ``x float, y int64`` (``?``: type unknown)."""
    import onnx

    name = lambda t: onnx.helper.tensor_dtype_to_np_dtype(t).name if t else "?"
    return ", ".join(f"{k} {name(t)}" for k, t in types.items())


def _value_range(arr) -> str:
    """``, min A, max B, mean C`` of a numeric array (floats over their finite values, with
    how many NaN/Inf were left out), or '' for an empty or non-numeric one. The mean alone
    said nothing of a softmax's outputs (a trial: always 0.5 over two classes)."""
    import numpy as np

    if not arr.size or arr.dtype.kind not in "fiu":
        return ""
    vals = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
    gone = arr.size - vals.size
    if not vals.size:
        return f", all {gone} values NaN or Inf"
    return (f", min {float(vals.min()):.6g}, max {float(vals.max()):.6g}, mean "
            f"{float(vals.mean()):.6g}" + (f" ({gone} NaN/Inf left out)" if gone else ""))


def _cmd_compare(args, parser) -> int:
    from .. import frontend, golden

    opts = _provider_options(args.provider_option, parser)
    given, dims = _given_inputs(args, parser)
    if (args.original is None) == (args.example is None):
        parser.error("give the original model or --example NAME (one of them)")
    # both files there before the original is loaded (a large one takes a while)
    for path in (args.original, args.optimized):
        if path is not None:
            frontend.check_model_file(path)
    if args.example:
        from ..examples import get_example

        original = get_example(args.example)
        args.original = f"example '{args.example}'"
    else:
        original = frontend.load_model(args.original)  # one-line errors for a bad original
        if frontend.recorded_source(original) is not None:  # the arguments swapped
            raise CinmError(f"{args.original} is an optimized model (it records its source "
                            "model's digest): give the original model first, then its "
                            "optimized one (onnx-cinm compare ORIGINAL OPTIMIZED)")
    _check_dim_names(original, dims, parser)
    _drop_labels(args, original, given)
    # an unknown name: the inputs listed, as run's; an empty array: refused (nothing to compare)
    golden.check_given_inputs(original, given, empty_ok=False)
    _refuse_dim_conflicts(original, given, dims)
    # host partitions as the reference runs: onnxruntime's own fusions are not our error;
    # crossbar products in onnxruntime's matrix kernels, which sum in the reference's order
    # (numpy's order differs in the last bit, and a DynamicQuantizeLinear after the product can
    # turn that into a whole quantization step: a correct T5 encoder failed by 0.012)
    opts.setdefault("graph_optimization", "disable_all")
    opts.setdefault("matmul", "onnxruntime")
    sess = _session(args.optimized, opts)
    _refuse_other_model(original, sess._model, args)
    # inputs baked to fixed shapes (optimize --overwrite-input-shape) are drawn at them whole:
    # their dims' names may not tell them apart (PP-OCR's cls names height and width both '?')
    baked = _static_inputs(sess._model)
    declared = {vi.name: vi for vi in golden.real_inputs(original.graph)}
    shapes = {name: tuple(shape) for name, shape in baked.items()
              if name in declared and len(declared[name].type.tensor_type.shape.dim) == len(shape)}
    shapes.update((name, arr.shape) for name, arr in given.items())
    # the sizes it was planned for, or baked in, by default; then those of the given arrays;
    # then --dim
    dims = {**frontend.planned_dims(sess._model), **golden.dims_from_shapes(original, baked),
            **golden.dims_from_shapes(original, shapes), **dims}
    _warn_if_nothing_on_devices(sess, args)
    feeds = None
    every = bool(given) and {vi.name for vi in golden.real_inputs(original.graph)} <= set(given)
    if every:  # nothing left to draw at random: more runs would repeat the same data
        args.runs = 1
        feeds = [given]
    elif given:
        feeds = [{**golden.random_inputs(original, seed=i, dims=dims, shapes=shapes), **given}
                 for i in range(args.runs)]
    try:
        report = golden.compare(original, sess.as_runner(), n=args.runs, rtol=args.rtol,
                                atol=args.atol, dims=dims, shapes=shapes or None, feeds=feeds,
                                stepwise=args.optimized, progress=True)
    except ReferenceFailed as e:
        if every:  # the user's own arrays: no drawn input or size to blame
            raise CinmError(f"the original does not run on the --input arrays: {e}") from None
        drawn = "the other inputs" if given else "real inputs"
        raise CinmError(f"{e}; give {drawn} with --input NAME=FILE.npy or sizes with "
                        "--dim NAME=SIZE") from None
    what = ("all inputs from --input" if every else
            f"{', '.join(sorted(given))} from --input, the rest random" if given else "random")
    print(f"onnx-cinm compare: {args.original} (onnxruntime) vs {args.optimized} (CINM provider), "
          f"{args.runs} input set{'s' * (args.runs != 1)} ({what})")
    inexact = sess.inexact_kernels()
    print(report.table(verdict=not inexact))
    if inexact:  # quantized, noisy or narrower arithmetic: error statistics, not a verdict
        rms = ", ".join(f"{o.name} {o.rel_rms_err:.3g}" for o in report.outputs)
        print(f"{', '.join(inexact)}: inexact by design, so error statistics against "
              f"onnxruntime, not a verdict (relative RMS error: {rms}; the exact model was "
              "checked by optimize)")
        from ..runtime.profile import clipped_note

        for o in report.outputs:
            if o.argmax_rows:  # class scores: the answers, not only the error of the scores
                print(f"{o.name}: the largest value along the last axis is at the same index "
                      f"as onnxruntime's in {o.argmax_same} of {o.argmax_rows} rows (argmax, "
                      "top-1 for class scores)")
        clipped = clipped_note(sess.profile())
        if clipped:  # saturated conversions explain much of a device's error (run --profile's)
            print(clipped)
        # inexact arithmetic is not a licence for Inf/NaN where onnxruntime's values are finite
        # (e.g. a float32 constant beyond FP16's range): that is a failure
        broken = [o.name for o in report.outputs if not math.isfinite(o.max_abs_err)]
        if broken:
            print(f"FAILED: {', '.join(broken)}: non-finite values where onnxruntime's are finite "
                  "(an overflow of the narrower arithmetic?)")
        structural = report.problems or any(o.note for o in report.outputs) or broken
        return 1 if structural else 0
    # which engine computed each side (optimize's check runs the reference bodies instead)
    print(report.summary() + " (reference: onnxruntime on the original; candidate: the CINM "
          f"provider, device nodes in their kernels{_modeled_text(sess)})")
    special = None
    squashers = golden.lowered_nan_squashers(original, args.optimized) if not given else []
    if given:
        print("NaN/Inf check: skipped (it draws every input, and --input gives some)")
    if squashers:
        print(golden.nan_squash_note(squashers))
    elif not given:  # NaN/Inf inputs, apart: the provider's kernels must place them as ORT does
        try:
            special = golden.compare_special(original, sess.as_runner(), rtol=args.rtol,
                                             atol=args.atol, dims=dims, shapes=shapes or None,
                                             stepwise=args.optimized)
        except ReferenceFailed:
            special = None  # the original itself cannot run on NaN/Inf inputs: nothing to judge
        if special is not None:
            print("NaN/Inf " + special.summary())
    return 0 if report.ok and not report.meaningless and (special is None or special.ok) else 1
