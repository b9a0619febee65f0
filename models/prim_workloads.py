"""PrIM-style workloads as ONNX models (VA, GEMV, RED, HST, SEL, SCAN, TRNS, MLP).

Each workload is the ONNX graph of one PrIM benchmark (Gomez-Luna et al., IEEE Access 2022;
``CMU-SAFARI/prim-benchmarks``), built with :mod:`onnx.helper`:

======  =================================================  ======================================
name    graph                                              cinm after ``to_cinm``
======  =================================================  ======================================
VA      ``y = a + b``, a, b [N]                            Add
GEMV    ``y = A @ x``, A [M, K], x [K]                     Gemv
RED     ``y = ReduceSum(x)``, x [N]                        Reduce(add)
HST     ``counts = cinm.Histogram(x)``, 256 bins over      Histogram (authored directly: ONNX has
        [0, 4096) (12-bit pixels, PrIM HST's DEPTH 12)     no histogram op)
SEL     ``y = Compress(x, x > 0)`` (keep the positive      stays standard ONNX (no cinm select op
        elements, in order)                                yet)
SCAN    ``y = CumSum(x, axis 0)``                          Scan
TRNS    ``Y = Transpose(X)``, X [M, N]                     Transpose
MLP     3 x ``h = Relu(W_i @ h)``                          Gemv, Relu per layer
======  =================================================  ======================================

Sizes: ``small`` (for tests: awkward sizes, none a multiple of DPUs x tasklets x block) and
``prim`` (PrIM's strong-scaling sizes, field notes upmem.md §2.2): VA 167,772,160; GEMV
163,840 x 4,096; RED 419,430,400; SEL and SCAN 251,658,240; TRNS (2,048 x 16) x (12,288 x 8);
MLP 3 layers of 4,096 x 4,096 (PrIM's ``n``; PrIM reuses one m x n shape for every layer, which
does not chain, so we keep square layers); HST 4,194,304 pixels (the CINM artifact's HST input;
PrIM replicates one 1536 x 1024 image per DPU). At ``prim`` size weights are graph inputs, not
initializers (the models stay a few KB); at ``small`` size MLP weights are initializers.

Dtypes: ``int32`` and ``float32`` (``int64`` also works for all but HST's float range).

Usage: ``python models/prim_workloads.py --out DIR [--size small|prim] [--dtype int32 ...]``
writes ``DIR/<name>_<dtype>_<size>.onnx``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NAMES = ("VA", "GEMV", "RED", "HST", "SEL", "SCAN", "TRNS", "MLP")
DTYPES = ("int32", "float32")
OPSET = 17

#: Problem sizes per workload and size class.
SIZES = {
    "small": {"VA": 1001, "GEMV": (37, 53), "RED": 1003, "HST": 1005, "SEL": 999, "SCAN": 777,
              "TRNS": (19, 23), "MLP": (33, 29, 17, 11)},
    "prim": {"VA": 167_772_160, "GEMV": (163_840, 4_096), "RED": 419_430_400, "HST": 4_194_304,
             "SEL": 251_658_240, "SCAN": 251_658_240, "TRNS": (2_048 * 16, 12_288 * 8),
             "MLP": (4_096, 4_096, 4_096, 4_096)},
}
#: Histogram parameters: 256 bins over 12-bit values (PrIM HST: ``-b 256``, DEPTH 12).
HST_BINS, HST_MIN, HST_MAX = 256, 0.0, 4096.0


def _tp(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _vi(name: str, dtype: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _tp(dtype), list(shape))


def _model(nodes, name, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    m.producer_name = "onnx-cinm prim_workloads"
    return m


def build(name: str, dtype: str = "int32", size: str = "small", seed: int = 0) -> onnx.ModelProto:
    """The ONNX model of workload ``name`` (see the module docstring) for ``dtype`` and ``size``.

    Raises:
        ValueError: unknown name, dtype or size.
    """
    if name not in NAMES or size not in SIZES:
        raise ValueError(f"unknown workload {name!r} or size {size!r}")
    np.dtype(dtype)
    s = SIZES[size][name]
    tag = f"{name.lower()}_{dtype}_{size}"
    if name == "VA":
        return _model([helper.make_node("Add", ["a", "b"], ["y"], name="va")], tag,
                      [_vi("a", dtype, [s]), _vi("b", dtype, [s])], [_vi("y", dtype, [s])])
    if name == "GEMV":
        m, k = s
        return _model([helper.make_node("MatMul", ["A", "x"], ["y"], name="gemv")], tag,
                      [_vi("A", dtype, [m, k]), _vi("x", dtype, [k])], [_vi("y", dtype, [m])])
    if name == "RED":
        axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
        return _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="red", keepdims=0)],
                      tag, [_vi("x", dtype, [s])], [_vi("y", dtype, [])], [axes])
    if name == "HST":
        from onnx_cinm.dialects import cinm
        node = cinm.make_node("Histogram", ["x"], ["counts"], name="hst", bins=HST_BINS,
                              min=HST_MIN, max=HST_MAX)
        m = _model([node], tag, [_vi("x", dtype, [s])], [_vi("counts", "int64", [HST_BINS])])
        return cinm.attach_functions(m)
    if name == "SEL":
        zero = numpy_helper.from_array(np.zeros((), dtype), "zero")
        nodes = [helper.make_node("Greater", ["x", "zero"], ["keep"], name="sel_pred"),
                 helper.make_node("Compress", ["x", "keep"], ["y"], name="sel", axis=0)]
        return _model(nodes, tag, [_vi("x", dtype, [s])], [_vi("y", dtype, ["kept"])], [zero])
    if name == "SCAN":
        axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
        return _model([helper.make_node("CumSum", ["x", "axis"], ["y"], name="scan")], tag,
                      [_vi("x", dtype, [s])], [_vi("y", dtype, [s])], [axis])
    if name == "TRNS":
        m, n = s
        return _model([helper.make_node("Transpose", ["X"], ["Y"], name="trns", perm=[1, 0])], tag,
                      [_vi("X", dtype, [m, n])], [_vi("Y", dtype, [n, m])])
    # MLP: h_{i+1} = Relu(W_i @ h_i), W_i [d_{i+1}, d_i]
    dims = s
    rng = np.random.default_rng(seed)
    nodes, inputs, inits = [], [_vi("h0", dtype, [dims[0]])], []
    for i in range(len(dims) - 1):
        w = f"W{i}"
        shape = [dims[i + 1], dims[i]]
        if size == "small":
            if np.dtype(dtype).kind == "f":
                arr = rng.standard_normal(shape).astype(dtype)
            else:
                arr = rng.integers(-8, 8, size=shape).astype(dtype)
            inits.append(numpy_helper.from_array(arr, w))
        else:
            inputs.append(_vi(w, dtype, shape))
        nodes += [helper.make_node("MatMul", [w, f"h{i}"], [f"z{i}"], name=f"mlp_gemv{i}"),
                  helper.make_node("Relu", [f"z{i}"], [f"h{i + 1}"], name=f"mlp_relu{i}")]
    return _model(nodes, tag, inputs, [_vi(f"h{len(dims) - 1}", dtype, [dims[-1]])], inits)


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict:
    """Signed random feeds for ``model`` (never all-positive: PrIM's MLP hid a missing ReLU that
    way); histogram inputs spread over [-64, 4160) so some fall outside the bins."""
    rng = np.random.default_rng(seed)
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value for d in tt.shape.dim]
        if model.graph.node[0].op_type == "Histogram":
            x = rng.integers(-64, 4160, size=shape)
        elif np.dtype(dt).kind == "f":
            x = rng.standard_normal(shape) * 4
        else:
            x = rng.integers(-100, 100, size=shape)
        feeds[vi.name] = x.astype(dt)
    return feeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write PrIM-style workloads as ONNX models.")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--dtype", action="append", choices=["int32", "float32", "int64"],
                    help="dtype (repeatable; default int32 and float32)")
    ap.add_argument("--only", action="append", choices=NAMES, help="workload (repeatable)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only or NAMES:
        for dt in args.dtype or DTYPES:
            m = build(name, dt, args.size)
            onnx.checker.check_model(m, full_check=True)
            path = out / f"{name.lower()}_{dt}_{args.size}.onnx"
            onnx.save(m, path)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
