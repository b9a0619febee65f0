"""Side-by-side wall time of ``onnx-cinm optimize --check 0`` and ``onnxsim`` on light CNNs,
and how optimize scales with model size.

Both run as command-line programs in fresh processes (so both pay interpreter start-up), on the
same model files from the onnx wheel, alternating, ``--repeat`` times each; the table shows the
medians and their ratio (onnx-cinm / onnxsim; below 1 means onnx-cinm is faster), of wall time
and of CPU time (user + system of the process: on a machine shared with other work, wall time
swings with the load, CPU time much less), and each tool's peak RSS. Target (issue 16): at
most 0.5x onnxsim.

Scaling table: ``optimize --check 0`` on MLP chains of 10, 100 and 1000 ``256 x 256`` Gemm+Relu
layers and on a conv net (8 conv3x3+Relu layers, 64 channels) at input sizes 32 and 128, with the
median wall time, the time per layer, the peak RSS of the process (``wait4``) and the memory per
weight byte (the peak RSS over the smallest model's, per weight byte added). Target: time per
layer and memory per weight byte flat within 2x from the smallest to the largest size.

Every child process runs with ``OMP_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` set to
``--threads`` (default 1: both tools single-threaded, so a shared machine's other work does not
decide the ratio); the first line printed says so, with the load average.

Both tools are measured as installed: before timing, onnx_cinm's modules are byte-compiled
(``compileall``, what ``pip install`` does for a wheel; an editable install under
``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile its ~70 modules from source in every
run, 0.2-0.3 s of CPU on light SqueezeNet, while onnxsim's site-packages hold their
bytecode), and each tool runs once untimed on the first model (the files it reads are then in
the page cache for both).

    pip install -e '.[bench]'
    python benchmarks/optimize_speed.py [--repeat 3] [--models resnet50 densenet121 vgg19]
        [--threads 1] [--no-scaling] [--json]
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


#: Environment of the measured processes (``--threads`` sets the thread counts).
_ENV = dict(os.environ)


def _byte_compile() -> None:
    """Byte-compile the onnx_cinm package that ``onnx-cinm`` imports (see the module docstring);
    exits if that fails."""
    code = "import onnx_cinm, os; print(os.path.dirname(onnx_cinm.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_ENV,
                         check=False)
    folder = out.stdout.strip()
    if out.returncode or not folder or not compileall.compile_dir(folder, quiet=1):
        sys.exit(f"cannot byte-compile onnx_cinm ({folder or out.stderr.strip()[-300:]})")


def _run(cmd: list[str], output: str | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak RSS bytes, CPU seconds: user + system) of ``cmd`` in a fresh process;
    exits on failure. ``output``: the model file the command writes, deleted afterwards with
    onnx-cinm's kernel folder next to it (``X.cinm``), so every run writes a new file (none
    replaces an earlier run's) and the temporary folder does not grow by a model per run
    (VGG19: 7 runs of two tools wrote 8 GB)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=_ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n"
                     f"{err.read().decode(errors='replace').strip()[-2000:]}")
    if output is not None:
        out = Path(output)
        out.unlink(missing_ok=True)
        shutil.rmtree(out.with_suffix(".cinm"), ignore_errors=True)
    return elapsed, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def _mlp(layers: int, path: Path, d: int = 256) -> int:
    """An MLP chain of ``layers`` ``d x d`` Gemm+Relu layers; returns its weight bytes."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((d, d)) * 0.05).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(np.zeros(d, np.float32), f"b{i}")]
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"], name=f"fc{i}"),
                  helper.make_node("Relu", [f"g{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    _save(nodes, inits, [1, d], x, [1, d], path)
    return layers * (d * d + d) * 4


def _convnet(size: int, path: Path, layers: int = 8, c: int = 64) -> int:
    """``layers`` conv3x3+Relu layers of ``c`` channels on a ``size x size`` input."""
    rng = np.random.default_rng(0)
    nodes, inits, x, cin = [], [], "x", 3
    for i in range(layers):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((c, cin, 3, 3)) * 0.1).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x, cin = f"r{i}", c
    _save(nodes, inits, [1, 3, size, size], x, [1, c, size, size], path)
    return sum(int(np.prod(t.dims)) * 4 for t in inits)


def _save(nodes, inits, in_shape, out, out_shape, path: Path) -> None:
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", f, in_shape)],
                          [helper.make_tensor_value_info(out, f, out_shape)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def scaling(cinm_exe: str, tmp: str, repeat: int, emit) -> list[dict]:
    """The scaling table (see the module docstring): one record per model size."""
    cases = [("mlp", n, n) for n in (10, 100, 1000)] + [("convnet", s, 8) for s in (32, 128)]
    recs = []
    for family, size, layers in cases:
        path = Path(tmp) / f"{family}{size}.onnx"
        # built in a child process: a child forked from a big parent inherits its peak RSS
        out = subprocess.run([sys.executable, __file__, "--build", family, str(size), str(path)],
                             capture_output=True, text=True, check=True)
        wbytes = int(out.stdout.strip().splitlines()[-1])
        runs = [_run([cinm_exe, "optimize", str(path), "-o", f"{tmp}/o_{family}{size}_{k}.onnx",
                      "--check", "0", "-q"], f"{tmp}/o_{family}{size}_{k}.onnx")
                for k in range(repeat)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        rss = max(r[1] for r in runs)
        first = next((r for r in recs if r["family"] == family), None)
        per_byte = ((rss - first["peak_rss_bytes"]) / (wbytes - first["weight_bytes"])
                    if first and wbytes > first["weight_bytes"] else None)
        recs.append({"family": family, "size": size, "layers": layers, "weight_bytes": wbytes,
                     "wall_s": wall, "cpu_s": cpu, "s_per_layer": wall / layers,
                     "cpu_s_per_layer": cpu / layers, "peak_rss_bytes": rss,
                     "rss_per_weight_byte": per_byte, "repeat": repeat})
        path.unlink()
        emit(recs[-1])
    return recs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and model")
    ap.add_argument("--models", nargs="+", default=["resnet50", "densenet121", "vgg19"])
    ap.add_argument("--json", action="store_true", help="print JSON records instead of a table")
    ap.add_argument("--no-scaling", action="store_true", help="skip the scaling table")
    ap.add_argument("--no-compare", action="store_true", help="skip the onnxsim comparison")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS and OPENBLAS_NUM_THREADS of the measured processes")
    ap.add_argument("--build", nargs=3, metavar=("FAMILY", "SIZE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    _ENV.update(OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    if args.build:  # internal: build one scaling model, print its weight bytes
        family, size, path = args.build
        print((_mlp if family == "mlp" else _convnet)(int(size), Path(path)))
        return 0
    cinm_exe = shutil.which("onnx-cinm") or sys.exit("onnx-cinm is not on PATH (pip install -e .)")
    sim_exe = shutil.which("onnxsim") or sys.exit("onnxsim is not on PATH (pip install -e '.[bench]')")
    _byte_compile()
    records = []
    if not args.json:
        print(f"OMP_NUM_THREADS=OPENBLAS_NUM_THREADS={args.threads}, {args.repeat} run(s) per tool "
              f"and model (medians), load average {os.getloadavg()[0]:.1f} at the start; "
              "targets (issue 16): ratio <= 0.5, per-layer time and RSS/B flat within 2x", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for short in ([] if args.no_compare else args.models):
            model = LIGHT_DIR / f"light_{short}.onnx"
            if not model.exists():
                sys.exit(f"no light model '{short}' in {LIGHT_DIR}")
            runs = {"onnx-cinm": [], "onnxsim": []}
            if short == args.models[0]:  # untimed: both tools' files into the page cache
                _run([cinm_exe, "optimize", str(model), "-o", f"{tmp}/w.onnx", "--check", "0", "-q"],
                     f"{tmp}/w.onnx")
                _run([sim_exe, str(model), f"{tmp}/w_s.onnx", "0"], f"{tmp}/w_s.onnx")
            for k in range(args.repeat):
                runs["onnx-cinm"].append(_run([cinm_exe, "optimize", str(model), "-o",
                                               f"{tmp}/{short}_c{k}.onnx", "--check", "0", "-q"],
                                              f"{tmp}/{short}_c{k}.onnx"))
                runs["onnxsim"].append(_run([sim_exe, str(model), f"{tmp}/{short}_s{k}.onnx", "0"],
                                            f"{tmp}/{short}_s{k}.onnx"))
            med = {tool: statistics.median(r[0] for r in rs) for tool, rs in runs.items()}
            cpu = {tool: statistics.median(r[2] for r in rs) for tool, rs in runs.items()}
            rss = {tool: max(r[1] for r in rs) for tool, rs in runs.items()}
            records.append({"model": short, "onnx_cinm_s": med["onnx-cinm"], "onnxsim_s": med["onnxsim"],
                            "ratio": med["onnx-cinm"] / med["onnxsim"],
                            "onnx_cinm_cpu_s": cpu["onnx-cinm"], "onnxsim_cpu_s": cpu["onnxsim"],
                            "cpu_ratio": cpu["onnx-cinm"] / cpu["onnxsim"],
                            "onnx_cinm_peak_rss_bytes": rss["onnx-cinm"],
                            "onnxsim_peak_rss_bytes": rss["onnxsim"], "repeat": args.repeat})
            if not args.json:
                r = records[-1]
                print(f"{short:12s} onnx-cinm {med['onnx-cinm']:7.2f} s ({cpu['onnx-cinm']:6.2f} s CPU, "
                      f"{rss['onnx-cinm'] / 2**20:5.0f} MB)   onnxsim {med['onnxsim']:7.2f} s "
                      f"({cpu['onnxsim']:6.2f} s CPU, {rss['onnxsim'] / 2**20:5.0f} MB)   ratio "
                      f"{r['ratio']:.2f} (CPU {r['cpu_ratio']:.2f})", flush=True)
        if not args.no_scaling:
            def emit(r):
                if not args.json:
                    pb = r["rss_per_weight_byte"]
                    print(f"{r['family']:8s} {r['size']:5d} {r['weight_bytes'] / 2**20:9.1f} MB "
                          f"{r['wall_s']:8.2f} s {r['s_per_layer'] * 1e3:9.1f} ms/layer "
                          f"{r['cpu_s_per_layer'] * 1e3:9.1f} ms CPU "
                          f"{r['peak_rss_bytes'] / 2**20:8.0f} MB "
                          f"{'-' if pb is None else f'{pb:.2f}':>8s}", flush=True)
            if not args.json:
                print(f"\n{'scaling':8s} {'size':>5s} {'weights':>12s} {'wall':>10s} "
                      f"{'per layer':>17s} {'CPU per layer':>16s} {'peak RSS':>11s} {'RSS/B':>8s}")
            recs = scaling(cinm_exe, tmp, args.repeat, emit)
            records += recs
            if not args.json:
                print("(RSS/B: peak RSS above the smallest model of the family per weight byte added; "
                      "size: layers for mlp, input side for convnet)")
                for family in ("mlp", "convnet"):
                    rs = [r for r in recs if r["family"] == family]
                    per_layer = rs[-1]["s_per_layer"] / rs[0]["s_per_layer"]
                    cpu_layer = rs[-1]["cpu_s_per_layer"] / rs[0]["cpu_s_per_layer"]
                    line = (f"{family}: time per layer largest / smallest {per_layer:.2f} "
                            f"(CPU {cpu_layer:.2f})")
                    per_byte = [r["rss_per_weight_byte"] for r in rs if r["rss_per_weight_byte"]]
                    if len(per_byte) > 1:
                        line += f", RSS/B largest / smallest {per_byte[-1] / per_byte[0]:.2f}"
                    print(line)
    if args.json:
        print(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
