"""Design-space sweeps: compile one model under every configuration and tabulate the modeled cost.

``onnx-cinm sweep in.onnx --set crossbar.size=32x32,64x64 --set crossbar.count=4,16 -o DIR``
evaluates the cartesian product of the ``--set`` values. The model is brought to the cinm level
once; every configuration then runs the placement, paradigm and device passes (``placement``,
``fold_layouts``, ``cim_tiling``, ``cnm_mapping``, ``device_lowering``: the compiled plans) and is scored by the
same model as cost placement (:func:`onnx_cinm.passes.cost_placement.evaluate_model`): modeled
latency (seconds), energy (joules), crossbar tile writes per inference, bytes crossing device
boundaries, cinm ops per device, and the constraints the placement breaks. No inference is run.

If branches: the cinm level compiles them too (recording which branch the planning probe took,
:func:`onnx_cinm.frontend.if_taken`); every configuration places and lowers each branch as
``optimize`` does, plans the crossbars of all graphs together
(:func:`onnx_cinm.passes.branches.lower_together`) and counts them as the report does
(:func:`onnx_cinm.passes.branches.counted_totals`): the branch the probe took, else both, the
row's ``branches`` column saying which (``taken``, ``upper bound``; empty without an If).

Keys (``--set KEY=V1,V2,...``) come from the option schema
(:func:`onnx_cinm.passes.option_schema`): every option is swept as ``SECTION.NAME``, its table
and key in a ``--config`` file (``cim.rows``, ``cim.crossbars``, ``cim.preset``,
``upmem.dpus``, ``upmem.tasklets``, ``upmem.target``, ``placement.strategy``,
``placement.objective``, ``placement.max_writes_per_cell``, ``host.roofline``, ...), its values
typed and checked as the option's. A value of a list option joins its names with ``+``
(``cim.effects=prog+drift,none``). The sweep keys an option declares as its aliases
(:class:`onnx_cinm.options.Alias`) are keys too: the crossbar's older ``crossbar.size``
(``ROWSxCOLS``, setting ``cim_rows`` and ``cim_cols``), ``crossbar.count``, ... .

Configurations run in worker processes (:class:`concurrent.futures.ProcessPoolExecutor`, the
model sent once per worker) or on a Dask cluster (``executor="dask"``, ``scheduler`` = the
scheduler's address, or a ``distributed.Client``; the model is scattered once to every worker).
Results come back in configuration order whatever the executor. Outputs: ``sweep.csv`` (one row
per configuration) and ``sweep.png`` (latency, energy and writes per configuration), each written
under a temporary name and renamed.
"""
from __future__ import annotations

import contextlib
import csv
import io
import itertools
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import onnx

from . import frontend
from .dialects import cinm
from .errors import CinmError
from .options import alias_values, from_text, unknown_key
from .passes import DEFAULT_PIPELINE


def _converter(spec, alias=None, schema=None):
    """Value text -> ``{flat key: value}`` for option ``spec`` (:func:`onnx_cinm.options.from_text`)
    or its ``alias`` (:func:`onnx_cinm.options.alias_values`); the names of a list option
    joined by ``+``."""
    def conv(v: str) -> dict:
        if spec.type is tuple:
            v = v.replace("+", ",")
        if alias is not None:
            return alias_values(alias, schema, v, alias.sweep)
        return {spec.key: from_text(spec, v)}
    return conv


def keys() -> dict:
    """Every ``--set`` key and its converter (value text -> pass options): ``SECTION.NAME`` of
    every option of the schema, then the sweep keys of the options' aliases
    (:class:`onnx_cinm.options.Alias`, e.g. ``crossbar.size``)."""
    from .passes import option_schema

    schema = option_schema()
    out = {f"{s.section}.{s.name}": _converter(s) for s in schema.values()}
    out.update({a.sweep: _converter(s, a, schema) for s in schema.values() for a in s.aliases
                if a.sweep})
    return out


#: CSV columns after the configuration keys.
COLUMNS = ["latency_s", "energy_j", "writes", "transfer_bytes", "devices", "violations", "branches",
           "seconds"]

#: The passes every configuration runs on the cinm-level model (and on its If branches):
#: ``optimize``'s from placement on, so a configuration scores what ``optimize`` would write.
LOWERING = DEFAULT_PIPELINE[DEFAULT_PIPELINE.index("placement"):]


def parse_sets(items: list[str], notes: list | None = None) -> list[tuple[str, list[str]]]:
    """``["crossbar.count=4,16", ...]`` -> ``[("crossbar.count", ["4", "16"]), ...]``, checked.

    A value giving the same options as an earlier one of its key (``cim.rows=64,64``,
    ``crossbar.size=64x64,64X64``) is dropped, so no configuration runs twice; ``notes``, when
    given, receives one line per key that had some. Raises CinmError on a malformed item, an
    unknown or repeated key, two keys setting one option (``cim.rows`` and ``crossbar.size``),
    or a bad value."""
    known = keys()
    out, seen, owners = [], set(), {}
    for item in items:
        key, sep, vals = item.partition("=")
        key = key.strip()
        if not sep or not key or not vals.strip():
            raise CinmError(f"--set expects KEY=V1,V2,..., got '{item}'")
        if key not in known:
            raise unknown_key(key, known, "sweep key")
        if key in seen:
            raise CinmError(f"sweep key '{key}' given twice")
        seen.add(key)
        values, parsed, dropped = [], [], []
        for v in (v.strip() for v in vals.split(",") if v.strip()):
            o = known[key](v)
            if o in parsed:
                dropped.append(v)
                continue
            values.append(v)
            parsed.append(o)
        for opt in dict.fromkeys(k for o in parsed for k in o):
            if owners.setdefault(opt, key) != key:
                raise CinmError(f"sweep keys '{owners[opt]}' and '{key}' both set option {opt}: "
                                "give one of them")
        if dropped and notes is not None:
            notes.append(f"sweep key '{key}': {', '.join(dropped)} repeat{'s' * (len(dropped) == 1)} "
                         "an earlier value; each configuration runs once")
        out.append((key, values))
    return out


def idle_devices(sets: list[tuple[str, list[str]]], results: list[dict]) -> list[tuple[str, str]]:
    """``(sweep key, device)`` for each swept key that sets an option of a device no evaluated
    configuration placed an op on (its ``devices`` column never names it): the sweep of that
    key changed nothing (a trial swept ``upmem.dpus`` over three values and got three identical
    rows, no op being on the DPUs). None when no configuration was evaluated (every one a
    device rejected: :func:`rejection` says why)."""
    from . import devices

    known = keys()
    done = [r for r in results if not rejection(r)]
    if not done:
        return []
    used = {part.split(":")[0] for r in done if r.get("devices") for part in r["devices"].split()}
    out = []
    for key, values in sets:
        opts = known[key](values[0])
        for dev in devices.all_devices():
            if dev.name not in used and any(o in dev.option_specs() for o in opts):
                out.append((key, dev.name))
    return out


def run_time_key(key: str, value: str) -> bool:
    """Whether the sweep key ``key`` (at one of its values, ``value``) sets only run options of
    a device (what a device's kernels take when they run,
    :meth:`~onnx_cinm.devices.base.Device.run_option_specs`: a data path, a time after
    programming), which no cost model reads."""
    from . import devices

    run = {k for dev in devices.all_devices() for k in dev.run_option_specs()}
    opts = keys()[key](value)
    return bool(opts) and set(opts) <= run


def unchanged_keys(sets: list[tuple[str, list[str]]], configs: list[dict],
                   results: list[dict]) -> list[str]:
    """The swept keys (of more than one value) whose values changed none of :data:`COLUMNS`
    (the compile time, ``seconds``, aside): among the evaluated configurations that agree on
    every other key, each group's rows are equal (a trial swept ``cim.mode`` and
    ``cim.time_s``, which set a run's data path and its time after programming, not a cost,
    and got six identical rows without a word). Empty when fewer than two configurations were
    evaluated."""
    done = [(c, r) for c, r in zip(configs, results) if not rejection(r)]
    out = []
    for key, values in sets:
        if len(values) < 2:
            continue
        groups: dict = {}
        for c, r in done:
            rest = tuple(sorted((k, v) for k, v in c.items() if k != key))
            groups.setdefault(rest, []).append(tuple(repr(r.get(col)) for col in COLUMNS
                                                     if col != "seconds"))
        compared = [g for g in groups.values() if len(g) > 1]
        if compared and all(len(set(g)) == 1 for g in compared):
            out.append(key)
    return out


def configurations(sets: list[tuple[str, list[str]]]) -> list[dict]:
    """Every combination of the values, as ``{key: value text}`` in cartesian-product order."""
    keys = [k for k, _ in sets]
    return [dict(zip(keys, combo)) for combo in itertools.product(*[v for _, v in sets])]


def options_of(config: dict, base: dict | None = None) -> dict:
    """Pass options of one configuration (``base`` first, then the keys' options)."""
    known = keys()
    opts = dict(base or {})
    for k, v in config.items():
        opts.update(known[k](v))
    return opts


# ---------------------------------------------------------------------------------------------
# Evaluation of one configuration (runs in workers)
# ---------------------------------------------------------------------------------------------

_WORKER_MODEL: onnx.ModelProto | None = None
_WORKER_LOWERED: tuple = ((), None)


def _init_worker(model_path: str, lowered: tuple) -> None:
    global _WORKER_MODEL, _WORKER_LOWERED
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _WORKER_MODEL = onnx.load(model_path)
    _WORKER_LOWERED = lowered


def evaluate(model: onnx.ModelProto, options: dict, origins: list = (),
             source_ops: dict | None = None) -> dict:
    """Place and lower the cinm-level ``model`` under ``options`` and return the modeled figures
    (``COLUMNS``: seconds, joules, tile writes, bytes, ``device:count`` list, broken
    constraints, how If branches count, wall seconds of the evaluation), and ``hints``: the
    warnings on placement hints not (fully) honoured (not a CSV column). The kernels inside
    If branches are placed, lowered and counted as in the module docstring. A configuration a
    device rejects (e.g. a bad option) gives its error in ``violations`` and NaN figures
    instead of stopping the sweep (every figure NaN: latency, energy, writes, bytes).
    ``origins``: the nodes ``to_cinm`` lowered (:attr:`onnx_cinm.pipeline.OptimizeResult.origins`,
    weights as stubs), so ``restore_host_ops`` prices the model ``optimize`` would write;
    ``source_ops``: their source op types (:attr:`onnx_cinm.pipeline.OptimizeResult.source_ops`),
    for hints naming them (``options["place"]``)."""
    from .analysis import tensor_infos
    from .passes import PassContext, PassManager
    from .passes.placement_rules import hint_warnings
    from .passes.branches import (
        counted_totals,
        evaluate_graphs,
        lower_branches,
        lower_together,
    )

    t0 = time.perf_counter()
    work = onnx.ModelProto()
    work.CopyFrom(model)
    ctx = PassContext(options=dict(options), origins=list(origins), source_ops=source_ops or {})
    try:  # the pass manager checks the options: a bad combination is this row's error
        work = PassManager(pipeline=LOWERING).run(work, ctx)
        infos = None
        if any(cinm.is_if(n) for n in work.graph.node):
            infos = tensor_infos(work)
            lower_branches(work, ctx, LOWERING, infos)
            lower_together(work, ctx, infos=infos)
        root, ifs = evaluate_graphs(work, ctx.options, infos)
        tot = counted_totals(root)
    except CinmError as e:
        nan = float("nan")
        return {"latency_s": nan, "energy_j": nan, "writes": nan, "transfer_bytes": nan, "devices": "",
                "violations": f"error: {e}", "branches": "", "seconds": time.perf_counter() - t0,
                "hints": []}
    # the lowered model's cinm ops, as optimize counts them (not placement's own count, which
    # predates fold_layouts: khmersm, host 62 here against optimize's 59)
    devs = cinm.ops_per_device(work)
    return {"latency_s": tot["latency_s"], "energy_j": tot["energy_j"], "writes": int(tot["writes"]),
            "transfer_bytes": int(tot["transfer_bytes"]),
            "devices": " ".join(f"{d}:{n}" for d, n in sorted(devs.items())),
            "violations": "; ".join(tot["violations"]), "branches": _branches(ifs),
            "seconds": time.perf_counter() - t0,
            "hints": hint_warnings(ctx.stats.get("placement", {}))}


def _branches(ifs: dict) -> str:
    """The ``branches`` column: how the row counts If branches (``ifs`` of
    :func:`onnx_cinm.passes.branches.evaluate_graphs`): ``""`` without an If, ``taken`` (the
    branch the planning probe took), ``upper bound`` when some If counts both."""
    if ifs.get("both"):
        return "upper bound"
    return "taken" if ifs.get("taken") else ""


def _evaluate_in_worker(options: dict) -> dict:
    return evaluate(_WORKER_MODEL, options, *_WORKER_LOWERED)


def _evaluate_bytes(model, options: dict, origins: list = (), source_ops: dict | None = None) -> dict:
    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    return evaluate(model, options, origins, source_ops)


def cinm_level(model, input_shapes: dict | None = None, dims: dict | None = None) -> onnx.ModelProto:
    """``model`` (path or ModelProto) brought to the cinm level once for all configurations,
    planned at ``dims`` (``{symbolic dim: size}``, recorded in the model). Raises CinmError
    when a symbolic dim is left unsized and the model cannot run with it at 1 (see
    :func:`run`)."""
    return _cinm_level(model, input_shapes, dims)[0]


def _cinm_level(model, input_shapes: dict | None, dims: dict | None,
                notes: list | None = None) -> tuple[onnx.ModelProto, list, dict]:
    """:func:`cinm_level`'s model, what ``to_cinm`` lowered (weights as stubs) and the source op
    types of its cinm ops, for :func:`evaluate`; a note on the dims taken as 1 is appended to ``notes``."""
    from .passes.origins import stub_origins
    from .pipeline import _drawn_integer_inputs, _runs_at_one, optimize

    res = optimize(model, stop_after="cinm", check=0, input_shapes=input_shapes, dims=dims)
    if res.unsized_dims:
        # as optimize's check refuses: figures planned at sizes that cannot exist describe
        # nothing (an audio front end whose samples must be a whole frame)
        original = model if isinstance(model, onnx.ModelProto) else frontend.load_model(model)
        if input_shapes:  # on a copy: the caller's model stays as given
            copy = onnx.ModelProto()
            copy.CopyFrom(original)
            original = frontend.overwrite_input_shapes(copy, input_shapes)
        open_ = ", ".join(res.unsized_dims)
        # an integer input drawn at random may be a shape (a Reshape's): its values, not the
        # sizes, can be what fails, as optimize's check judges it
        if not _drawn_integer_inputs(original, None) and not _runs_at_one(original, dict(dims or {})):
            raise CinmError(f"the original does not run with {open_} at 1, the size the plans "
                            "take a dim without one (a shape error in onnxruntime): give their "
                            "sizes: " + " ".join(f"--dim {d}=SIZE" for d in res.unsized_dims))
        if notes is not None:
            notes.append(f"symbolic dims taken as 1: {open_}; every configuration is planned at that "
                         "size: give others with " + " ".join(f"--dim {d}=SIZE" for d in res.unsized_dims))
    return res.model, stub_origins(res.origins), res.source_ops


def run(model, sets: list[tuple[str, list[str]]], *, base_options: dict | None = None,
        executor: str = "process", workers: int | None = None, scheduler=None,
        progress: bool = False, input_shapes: dict | None = None,
        dims: dict | None = None, notes: list | None = None) -> tuple[list[dict], list[dict]]:
    """Evaluate every configuration of ``sets``; returns ``(configurations, results)`` in order.

    Args:
        model: path or ModelProto (any level; it is brought to the cinm level once).
        sets: from :func:`parse_sets`.
        base_options: pass options common to all configurations (e.g. ``host_roofline``),
            checked against the option schema (CinmError on an unknown key or a bad value).
        executor: ``"process"`` (local worker processes), ``"dask"`` or ``"serial"``.
        workers: local worker processes (default: CPU count, at most the configurations).
        scheduler: Dask scheduler address (``tcp://host:8786``) or a ``distributed.Client``.
        progress: show a tqdm bar on stderr (only when stderr is a terminal).
        input_shapes: ``{input: dims}`` baked into the model first.
        dims: ``{symbolic dim: size}`` every configuration is planned at.
        notes: a list the notes for the user are appended to (a symbolic dim taken as 1).

    Raises CinmError when a symbolic dim of the model's inputs has no size in ``dims`` and
    onnxruntime cannot run the model with it at 1, the size it would be planned at.
    """
    from .passes import check_options

    configs = configurations(sets)
    base = check_options(dict(base_options or {}))
    opts = [options_of(c, base) for c in configs]
    cinm_model, origins, source_ops = _cinm_level(model, input_shapes, dims, notes)
    data = cinm_model.SerializeToString()
    from tqdm import tqdm

    bar = tqdm(total=len(configs), desc="sweep", unit="config", file=sys.stderr,
               disable=not (progress and sys.stderr.isatty()))
    results: list = [None] * len(configs)
    try:
        if executor == "serial":
            for k, o in enumerate(opts):
                results[k] = evaluate(cinm_model, o, origins, source_ops)
                bar.update(1)
        elif executor == "process":
            from concurrent.futures import ProcessPoolExecutor, as_completed

            n = max(1, min(workers or os.cpu_count() or 1, len(configs)))
            # spawn, not fork: the parent holds onnxruntime thread pools, and a forked child can
            # inherit one of their locks held (it then waits forever)
            ctx = multiprocessing.get_context("spawn")
            # the workers read the model from a file: a start-up message of a few bytes instead
            # of the whole model through each worker's pipe keeps the start quick
            folder = tempfile.TemporaryDirectory(prefix="onnx_cinm_sweep_")
            model_path = os.path.join(folder.name, "cinm.onnx")
            with open(model_path, "wb") as f:
                f.write(data)
            ex = ProcessPoolExecutor(max_workers=n, initializer=_init_worker,
                                     initargs=(model_path, (origins, source_ops)), mp_context=ctx)
            try:
                # workers start on submit and inherit an ignored SIGINT, so a Ctrl-C cannot
                # hit one still starting up (a traceback per worker); the parent's Ctrl-C is
                # off for those milliseconds only
                with _sigint_ignored():
                    futs = {ex.submit(_evaluate_in_worker, o): k for k, o in enumerate(opts)}
                for f in as_completed(futs):
                    results[futs[f]] = f.result()
                    bar.update(1)
                ex.shutdown()
            except BaseException:  # Ctrl-C, a failed config: stop the workers, do not wait
                for proc in list((getattr(ex, "_processes", None) or {}).values()):
                    proc.terminate()  # the pool sees its workers gone and winds down at once
                ex.shutdown(wait=True, cancel_futures=True)
                raise
            finally:
                folder.cleanup()
        elif executor == "dask":
            results = _run_dask(data, opts, scheduler, bar, origins, source_ops)
        else:
            raise CinmError(f"unknown executor '{executor}' (known: process, dask, serial)")
    finally:
        bar.close()
    return configs, results


@contextlib.contextmanager
def _sigint_ignored():
    """Ignore SIGINT for the ``with`` body (processes started meanwhile inherit it ignored)."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to change
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _run_dask(data: bytes, opts: list[dict], scheduler, bar, origins: list = (),
              source_ops: dict | None = None) -> list[dict]:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise CinmError("--executor dask needs dask[distributed] (pip install 'onnx-cinm[sweep]')") from None
    own = not hasattr(scheduler, "submit")
    if own and not scheduler:
        raise CinmError("--executor dask needs --scheduler ADDRESS (e.g. tcp://127.0.0.1:8786)")
    try:
        client = Client(scheduler, timeout=10) if own else scheduler
    except (OSError, TimeoutError) as e:
        raise CinmError(f"cannot reach the Dask scheduler at '{scheduler}': {e}") from None
    try:
        blob = client.scatter(data, broadcast=True)
        futs = [client.submit(_evaluate_bytes, blob, o, origins, source_ops, pure=False)
                for o in opts]
        index = {f.key: k for k, f in enumerate(futs)}
        results: list = [None] * len(opts)
        for f in as_completed(futs):
            results[index[f.key]] = f.result()
            bar.update(1)
        return results
    finally:
        if own:
            client.close()


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------

def rejection(result: dict) -> str:
    """Why a device rejected the configuration of ``result`` (a row of :func:`evaluate`), ''
    if it was evaluated: such a row has no figures (NaN), only the error."""
    why = result.get("violations") or ""
    if why.startswith("error: ") and result["latency_s"] != result["latency_s"]:
        return why.removeprefix("error: ")
    return ""


def label(config: dict) -> str:
    """Short label of a configuration: ``size=64x64 count=16 dpus=256``."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in config.items())


def to_csv(configs: list[dict], results: list[dict]) -> str:
    """CSV text: the configuration keys, then :data:`COLUMNS`; one row per configuration."""
    keys = list(configs[0]) if configs else []
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(keys + COLUMNS)
    for c, r in zip(configs, results):
        w.writerow([c[k] for k in keys] + [repr(r[k]) if isinstance(r[k], float) else r[k] for k in COLUMNS])
    return buf.getvalue()


#: Size of the sweep plot, pixels.
PLOT_SIZE = (1200, 800)


def plot(configs: list[dict], results: list[dict], title: str = "") -> bytes:
    """PNG bytes: latency, energy and tile writes per configuration (three bar rows; a
    configuration that breaks a constraint is hatched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(PLOT_SIZE[0] / 100, PLOT_SIZE[1] / 100), dpi=100)
    x = list(range(len(configs)))
    for k, (key, lab, col) in enumerate((("latency_s", "latency (s)", "#1f77b4"),
                                        ("energy_j", "energy (J)", "#ff7f0e"),
                                        ("writes", "tile writes / inference", "#d62728"))):
        ax = fig.add_subplot(3, 1, k + 1)
        vals = [max(r[key], 0) if r[key] == r[key] else 0 for r in results]
        bars = ax.bar(x, vals, color=col)
        for b, r in zip(bars, results):
            if r["violations"]:
                b.set_hatch("//")
        ax.set_ylabel(lab)
        ax.set_xticks(x)
        ax.set_xticklabels([label(c) for c in configs] if k == 2 else [""] * len(x), rotation=60,
                           ha="right", fontsize=7)
        if k == 0 and title:
            ax.set_title(title + " (hatched: breaks a constraint)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def write(out_dir, configs: list[dict], results: list[dict], title: str = "") -> list[Path]:
    """Write ``sweep.csv`` and ``sweep.png`` into ``out_dir`` (atomically); returns the paths."""

    files = {"sweep.csv": to_csv(configs, results).encode(), "sweep.png": plot(configs, results, title)}
    return frontend.write_files_into(out_dir, files, "sweep")
