"""Softmax, LayerNormalization and Gelu (and the erf pattern of Gelu) as cinm ops that UPMEM runs
(issue 11 #5), and the UPMEM Im2Col that scatters row bands with their halos (issue 11 #7).

The oracle is onnxruntime on the *original* model (standard ONNX ops), never the code under
test. The UPMEM kernels compute in float32 with software helpers (``emu_expf``: Taylor to r^7
after a reduction by ln 2; ``emu_erff``: Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7),
so the emulated results are compared with stated tolerances: Softmax rtol 1e-5 / atol 1e-7
(probabilities; exp's relative error < 1e-7 plus float rounding over the sum), LayerNorm
rtol 1e-4 / atol 1e-5 (normalized values of order 1; a two-pass variance against
onnxruntime's one-pass), Gelu atol 1e-6 (the erf approximation times x / 2).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts, optimize
from onnx_cinm.devices.upmem import codegen, cost, mapping
from onnx_cinm.dialects import cinm
from onnx_cinm.golden import run_onnxruntime
from onnx_cinm.graph import OpInfo, TensorInfo
from onnx_cinm.runtime.session import InferenceSession
from onnx_cinm.sim import upmem_emu as emu

TOL = {"Softmax": dict(rtol=1e-5, atol=1e-7), "LayerNorm": dict(rtol=1e-4, atol=1e-5),
       "Gelu": dict(rtol=1e-5, atol=1e-6)}


def _model(nodes, x_shape, outs=("y",), inits=(), opset=17):
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                          list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _init(name, v):
    return numpy_helper.from_array(np.asarray(v, np.float32), name)


def _softmax_model(shape):
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], shape)


def _layernorm_model(shape, axis, bias=True, rng=None):
    rng = rng or np.random.default_rng(0)
    norm = list(shape[axis:])
    inits = [_init("s", rng.standard_normal(norm) + 1.0)] + ([_init("b", rng.standard_normal(norm))] if bias else [])
    ins = ["x", "s"] + (["b"] if bias else [])
    return _model([helper.make_node("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-5)],
                  shape, inits=inits)


def _erf_gelu_model(shape, variant=0):
    """x / 2 * (1 + erf(x / sqrt 2)) as PyTorch exports it (variant 0: Div, Mul x, Mul 0.5;
    variant 1: Mul by 1 / sqrt 2, Mul(x, 0.5) times (1 + erf))."""
    if variant == 0:
        nodes = [helper.make_node("Div", ["x", "r2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["y"])]
        inits = [_init("r2", 1.4142135381698608), _init("one", 1.0), _init("half", 0.5)]
    else:
        nodes = [helper.make_node("Mul", ["ir2", "x"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
                 helper.make_node("Add", ["one", "e"], ["a"]), helper.make_node("Mul", ["x", "half"], ["h"]),
                 helper.make_node("Mul", ["h", "a"], ["y"])]
        inits = [_init("ir2", 0.7071067690849304), _init("one", 1.0), _init("half", 0.5)]
    return _model(nodes, shape, inits=inits)


def _emulate(model, tmp_path, x, place="upmem", **opts):
    """optimize with every cinm op on ``place``, run in the provider's emulate mode; returns
    (outputs, the cinm op types on UPMEM)."""
    res = optimize(model, place=[("*", place)], **opts)
    on = sorted(n.op_type for n in res.model.graph.node
                if n.domain == cinm.DOMAIN and cinm.node_attrs(n).get("device") == "upmem")
    artifacts.save(res.model, tmp_path / "m.onnx")
    sess = InferenceSession(tmp_path / "m.onnx", provider_options=[{"upmem_mode": "emulate"}, {}])
    return sess.run(None, {"x": x}), on


# -- reference bodies against onnxruntime's own ops ---------------------------------------------

@pytest.mark.parametrize("opset", [13, 17, 18])
def test_layernorm_reference_body_equals_onnx_layernormalization(opset):
    """cinm.LayerNorm's body (Flatten, two ReduceMeans, ...) in opsets without
    LayerNormalization, against onnxruntime's LayerNormalization (opset 17)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    ref_model = _layernorm_model(x.shape, 2, rng=np.random.default_rng(2))
    ref = run_onnxruntime(ref_model, {"x": x})[0]
    s, b = (numpy_helper.to_array(t) for t in ref_model.graph.initializer)
    node = cinm.make_node("LayerNorm", ["x", "s", "b"], ["y"], axis=2, epsilon=1e-5)
    m = _model([node], x.shape, inits=[_init("s", s), _init("b", b)], opset=opset)
    cinm.attach_functions(m)
    np.testing.assert_allclose(run_onnxruntime(m, {"x": x})[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu_reference_body_equals_onnx_gelu_20(approx):
    x = np.linspace(-8, 8, 301, dtype=np.float32)
    ref = run_onnxruntime(_model([helper.make_node("Gelu", ["x"], ["y"], approximate=approx)],
                                 x.shape, opset=20), {"x": x})[0]
    m = _model([cinm.make_node("Gelu", ["x"], ["y"], approximate=approx)], x.shape, opset=13)
    cinm.attach_functions(m)
    np.testing.assert_allclose(run_onnxruntime(m, {"x": x})[0], ref, rtol=1e-6, atol=1e-6)


# -- to_cinm -----------------------------------------------------------------------------------

def _cinm_ops(model, **kw):
    res = optimize(model, stop_after="cinm", check=0, **kw)
    return sorted(n.op_type for n in res.model.graph.node if n.domain == cinm.DOMAIN), res


@pytest.mark.parametrize("variant", [0, 1])
def test_the_erf_pattern_becomes_one_gelu(variant):
    ops, res = _cinm_ops(_erf_gelu_model((2, 9), variant))
    assert ops == ["Gelu"]
    assert [n.op_type for n in res.model.graph.node] == ["Gelu"]


def test_an_erf_that_is_not_gelu_stays():
    """Erf(x / 2) + 1: the constant is not sqrt 2, so no Gelu (the Div and Add still lower)."""
    m = _model([helper.make_node("Div", ["x", "two"], ["t"]), helper.make_node("Erf", ["t"], ["y"])],
               (4,), inits=[_init("two", 2.0)])
    ops, _ = _cinm_ops(m)
    assert ops == ["Div"]


@pytest.mark.parametrize("shape,axis,perm", [((2, 3, 4), 1, [0, 2, 1]), ((2, 3, 4, 5), 1, [0, 2, 3, 1]),
                                             ((2, 3, 4, 5), -4, [1, 2, 3, 0]), ((6, 7), 0, [1, 0])])
def test_softmax_over_another_axis_moves_it_last_and_back(shape, axis, perm):
    """cinm Softmax normalizes over the last axis: Transpose(perm) puts ``axis`` last, the
    second Transpose applies the inverse permutation."""
    m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], shape)
    _, res = _cinm_ops(m)
    nodes = list(res.model.graph.node)
    assert [n.op_type for n in nodes] == ["Transpose", "Softmax", "Transpose"]
    assert all(n.domain == cinm.DOMAIN for n in nodes)
    first, last = (list(cinm.node_attrs(n)["perm"]) for n in (nodes[0], nodes[2]))
    assert first == perm and last == list(np.argsort(perm))
    assert nodes[2].output[0] == "y"


def test_layernorm_with_read_statistics_stays_on_the_host():
    ln = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], axis=-1)
    m = _model([ln], (2, 4), outs=("y", "mean"), inits=[_init("s", np.ones(4))])
    ops, res = _cinm_ops(m)
    assert ops == [] and "Mean" in str(res.stats["to_cinm"]["kept"]["LayerNormalization"])


# -- UPMEM kernels in the emulator against onnxruntime on the original model -------------------

#: (shape, why): a short row, a batch of rows, a row longer than a WRAM block (and than one DMA)
SHAPES = [((1, 7), "one short row"), ((4, 3, 33), "a batch > 1"), ((2, 1100), "rows > 2048 B")]


@pytest.mark.parametrize("shape", [s for s, _ in SHAPES], ids=[w for _, w in SHAPES])
def test_softmax_on_upmem_matches_onnxruntime(tmp_path, shape):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    model = _softmax_model(shape)
    (y,), on = _emulate(model, tmp_path, x)
    assert on == ["Softmax"]
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], **TOL["Softmax"])


@pytest.mark.parametrize("shape,axis,opset", [((2, 3, 4, 5), 1, 17), ((2, 5, 3, 4), -3, 13),
                                              ((3, 4, 9), -2, 18), ((6, 7), 0, 13)],
                         ids=["4d-axis1", "4d-axis-3", "3d-axis-2", "2d-axis0"])
def test_softmax_over_another_axis_on_upmem_matches_onnxruntime(tmp_path, shape, axis, opset):
    """Opset >= 13 Softmax over one axis that is not the last: both Transposes and the Softmax
    run on UPMEM in the emulator; the oracle is onnxruntime's own Softmax(axis)."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], shape, opset=opset)
    (y,), on = _emulate(model, tmp_path, x)
    assert on == ["Softmax", "Transpose", "Transpose"]
    ref = run_onnxruntime(model, {"x": x})[0]
    np.testing.assert_allclose(y, ref, **TOL["Softmax"])
    np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape,axis,bias", [((1, 6), -1, True), ((3, 2, 5, 8), 2, True),
                                             ((2, 3, 700), -1, False), ((2, 1, 1025), 1, True)],
                         ids=["short", "batch-two-axes", "long-no-bias", "long-odd"])
def test_layernorm_on_upmem_matches_onnxruntime(tmp_path, shape, axis, bias):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    model = _layernorm_model(shape, axis, bias, rng)
    (y,), on = _emulate(model, tmp_path, x)
    assert on == ["LayerNorm"]
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], **TOL["LayerNorm"])


@pytest.mark.parametrize("make,shape", [
    (lambda s: _erf_gelu_model(s, 0), (3, 700)),
    (lambda s: _erf_gelu_model(s, 1), (1, 5)),
    (lambda s: _model([helper.make_node("Gelu", ["x"], ["y"])], s, opset=20), (2, 3, 40)),
    (lambda s: _model([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], s, opset=20), (4, 33)),
], ids=["erf-pattern", "erf-pattern-mul", "gelu-20", "gelu-20-tanh"])
def test_gelu_on_upmem_matches_onnxruntime(tmp_path, make, shape):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[:4] = [0.0, -12.0, 12.0, 1e-3]
    model = make(shape)
    (y,), on = _emulate(model, tmp_path, x)
    assert on == ["Gelu"]
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], **TOL["Gelu"])


def _op(op_type, ins, out_shape, attrs=None):
    return OpInfo(op_type.lower(), op_type, attrs or {},
                  tuple(TensorInfo(n, np.dtype("float32"), s, c) for n, s, c in ins),
                  (TensorInfo("y", np.dtype("float32"), out_shape),))


@pytest.mark.parametrize("op", [
    _op("Softmax", [("x", (40, 24), False)], (40, 24)),
    _op("Softmax", [("x", (5, 1100), False)], (5, 1100)),
    _op("LayerNorm", [("x", (33, 96), False), ("s", (96,), True), ("b", (96,), True)], (33, 96),
        {"axis": -1, "epsilon": 1e-5}),
    _op("LayerNorm", [("x", (3, 900), False), ("s", (900,), True)], (3, 900),
        {"axis": 1, "epsilon": 1e-5}),
], ids=["softmax-one-block", "softmax-streamed", "layernorm-one-block", "layernorm-streamed"])
def test_modeled_kernel_cycles_equal_the_emulators(tmp_path, op):
    """The cost model's cycles (mapping._cost_rownorm) against the emulator counting the
    generated kernel's instructions and DMAs as they execute."""
    plan = mapping.plan_op(op, max_dpus=8, tasklets=16)
    attrs = dict(plan.attrs(), kernel="k")
    consts = {t.name: np.ones(t.shape, np.float32) for t in op.inputs if t.const}
    codegen.emit_op(op, attrs, consts, tmp_path)
    man = json.loads((tmp_path / "k" / "kernel.json").read_text())
    assert man["dpus"] == plan.dpus
    x = np.random.default_rng(6).standard_normal(op.inputs[0].shape).astype(np.float32)
    _, counters = emu.run_kernel(tmp_path / "k", [x])
    assert counters["kernel_cycles"] == pytest.approx(plan.cost().kernel_cycles, rel=1e-3)


def test_the_cost_of_a_softmax_follows_prims_float_measurements():
    """Per element, exp alone is 12 float multiplies and 10 float adds (PrIM: FLOAT mul 1.91,
    add 4.91 MOPS at 350 MHz -> 183 - 5 and 71 - 5 instructions), so a 64-element row cannot
    take fewer than 64 * (12 * 178 + 10 * 66) cycles on a DPU (one instruction a cycle, however
    many tasklets share the row), nor fewer than 11 times that on one tasklet (one instruction
    every 11 cycles)."""
    op = _op("Softmax", [("x", (1, 64), False)], (1, 64))
    exp = 64 * (12 * 178 + 10 * 66)
    assert mapping.make_plan(op, 1, 16).cost().kernel_cycles >= exp
    assert mapping.make_plan(op, 1, 1).cost().kernel_cycles >= 11 * exp


# -- rows split over tasklets (few rows per DPU) -------------------------------------------------

def _rownorm_ref(kind, x, s=None, b=None):
    """numpy in float64: softmax over the last axis, or LayerNorm over it with Scale and B."""
    x = x.astype(np.float64)
    if kind == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * s + b


#: (kind, shape, tasklets, block bytes, lanes: None = the mapping's choice, lanes expected)
SPLITS = [
    ("softmax", (1, 4096), 16, 2048, None, 16),    # batch 1: one long row, 16 slices of 256
    ("layernorm", (1, 4096), 16, 2048, None, 16),
    ("softmax", (20, 37), 16, 64, 2, 2),           # 8 groups: 3 rounds, the last one half idle;
    ("layernorm", (20, 37), 16, 64, 2, 2),         # slices of 20 (80 B) streamed in 64-B blocks
    ("layernorm", (11, 300), 12, 256, 5, 5),       # 2 groups of 5 and 2 tasklets without a group
    ("softmax", (4, 5), 16, 64, 4, 4),             # slices of 2, 2, 1 and an empty one
    ("softmax", (64, 40), 16, 2048, None, 1),      # rows >> tasklets: whole rows per tasklet
    ("layernorm", (64, 40), 16, 2048, None, 1),
]


@pytest.mark.parametrize("kind,shape,tasklets,block,lanes,want", SPLITS,
                         ids=[f"{k}-{s[0]}x{s[1]}-t{t}-l{w}" for k, s, t, _, _, w in SPLITS])
def test_rows_split_over_tasklets_match_numpy_and_the_cost_model(tmp_path, kind, shape, tasklets,
                                                                block, lanes, want):
    """The kernel on one DPU against numpy, and the emulator's cycles (counted as the generated
    C runs, a phase closed at every barrier) against the cost model's."""
    rng = np.random.default_rng(11)
    ln = kind == "layernorm"
    shapes = [shape] + ([shape[1:], shape[1:]] if ln else [])
    params = dict(axis=-1, epsilon=1e-5) if ln else {}
    if lanes is not None:
        params["lanes"] = lanes
    codegen.emit_kernel(kind, "float32", shapes, dpus=1, tasklets=tasklets, block_bytes=block,
                        outdir=tmp_path, **params)
    man = json.loads((tmp_path / "kernel.json").read_text())
    assert man["lanes"] == want
    ins = [(rng.standard_normal(s) * 3).astype(np.float32) for s in shapes]
    (y,), counters = emu.run_kernel(tmp_path, ins)
    np.testing.assert_allclose(y, _rownorm_ref(kind, *ins), **TOL["LayerNorm" if ln else "Softmax"])
    work, barriers = mapping.rownorm_work(kind, "float32", shape[0], shape[1], want, tasklets,
                                          man["block_bytes"], len(shapes) - 1)
    barrier = tasklets * mapping.BARRIER_INSTR * 11
    model = cost.kernel_cycles(work)["total"] + (1 + barriers) * barrier
    assert counters["kernel_cycles"] == pytest.approx(model, rel=1e-9)


def test_a_row_split_over_two_tasklets_costs_what_a_hand_count_says(tmp_path):
    """Softmax of one row of 8 float32 on 1 DPU with 2 tasklets, by hand. Instructions (PrIM's
    float figures, mapping.rownorm_instr): cmp 10, add 66, sub 71, mul 178, div 1024,
    expf 12 mul + 10 add + 6 cmp + 8 = 2864; per element pass 1 ld + cmp = 11, pass 2
    ld + sub + expf + st + add = 3003, pass 3 ld + mul + st = 180; loop control 3 per element
    (4 elements: no unrolled iteration), 12 per block. Split: 2 lanes of 4 elements (16 B,
    one block each):

    * pass 1: 4 * (11 + 3) + 12 + 1 (store the partial) = 69 instructions per lane, one
      16-B read (77 + 0.5 * 16 = 85 cycles): max(2 * 69, 11 * 69 + 85, 2 * 85) = 844 cycles;
    * lane 0 combines the two maxima: 2 * (ld + cmp + 3) = 28 instructions: 11 * 28 = 308;
    * pass 2: 4 * (3003 + 3) + 12 + 2 = 12038 per lane: 11 * 12038 = 132418;
    * lane 0 sums the two partials and divides: 2 * (1 + 66 + 3) + 1024 = 1164: 12804;
    * pass 3: 4 * (180 + 3) + 12 + 1 = 745 per lane, one 16-B write (61 + 8 = 69):
      11 * 745 + 69 = 8264;
    * 5 barriers (the start and 4 per row) of 2 tasklets x 6 instructions x 11 = 132 each: 660.

    In all 155298 cycles; the whole row on one tasklet takes 11 * (1024 + 8 * (11 + 3003 + 180)
    + 3 * (3 + 12)) + (77 + 16) + (61 + 16) + 132 = 293133 (one unrolled iteration per pass,
    one 32-B read and write), so the mapping splits. Bytes:
    32 in and 32 out per DPU (+ 8 of arguments), 32 read and 32 written by DMA."""
    op = _op("Softmax", [("x", (1, 8), False)], (1, 8))
    plan = mapping.make_plan(op, 1, 2)
    assert plan.g["lanes"] == 2 and plan.block_bytes == 32
    assert plan.cost().kernel_cycles == 155298
    assert (plan.cost().bytes_in, plan.cost().bytes_out) == (32, 32)
    whole = mapping.rownorm_work("softmax", "float32", 1, 8, 1, 2, 32, 0)[0]
    assert cost.kernel_cycles(whole)["total"] + 132 == 293133
    codegen.emit_op(op, dict(plan.attrs(), kernel="k"), {}, tmp_path)
    x = np.array([[3, -1, 0.5, 7, 2, 2, -4, 1]], np.float32)
    (y,), counters = emu.run_kernel(tmp_path / "k", [x])
    np.testing.assert_allclose(y, _rownorm_ref("softmax", x), **TOL["Softmax"])
    assert counters["kernel_cycles"] == 155298
    assert (counters["h2d_bytes"], counters["d2h_bytes"]) == (32 + 8, 32)
    assert (counters["totals"]["dma_read_bytes"], counters["totals"]["dma_write_bytes"]) == (32, 32)


def test_the_lowered_node_records_its_tasklets_per_row_and_the_kernel_follows_it(tmp_path):
    """Plans are data: a batch-1 LayerNorm's node carries ``cnm_lanes`` (16: one row, 16
    tasklets), its generated kernel splits the row that way, and an edited ``cnm_lanes`` is
    what the code generator follows."""
    model = _layernorm_model((1, 512), -1)
    res = optimize(model, place=[("*", "upmem")])
    (node,) = [n for n in res.model.graph.node if n.op_type == "LayerNorm"]
    attrs = cinm.node_attrs(node)
    assert attrs["cnm_lanes"] == 16 and attrs["cnm_tasklets"] == 16
    artifacts.save(res.model, tmp_path / "m.onnx")
    (man,) = [json.loads(p.read_text()) for p in tmp_path.rglob("kernel.json")]
    assert man["lanes"] == 16
    op = _op("LayerNorm", [("x", (1, 512), False), ("s", (512,), True), ("b", (512,), True)],
             (1, 512), {"axis": -1, "epsilon": 1e-5})
    plan = mapping.plan_op(op)
    consts = {"s": np.ones(512, np.float32), "b": np.zeros(512, np.float32)}
    codegen.emit_op(op, dict(plan.attrs(), kernel="k", cnm_lanes=4), consts, tmp_path)
    assert json.loads((tmp_path / "k" / "kernel.json").read_text())["lanes"] == 4


@pytest.mark.parametrize("lanes", [0, 17])
def test_more_lanes_than_tasklets_is_a_one_line_error(tmp_path, lanes):
    with pytest.raises(ValueError, match=f"lanes={lanes} tasklets per row; expected 1..16"):
        codegen.emit_kernel("softmax", "float32", [(1, 64)], dpus=1, tasklets=16, block_bytes=256,
                            outdir=tmp_path, lanes=lanes)
    assert not any(tmp_path.iterdir())


def test_a_batch_1_layernorm_splits_its_row_and_runs_10x_faster():
    """LayerNorm of [1, 4096] on 16 tasklets: the one row on one tasklet is bound by that
    tasklet's chain (11 cycles an instruction); split in 16 slices the DPU issues an
    instruction every cycle, so the kernel is > 10x shorter even with its combines (a
    software square root on one tasklet) and barriers."""
    op = _op("LayerNorm", [("x", (1, 4096), False), ("s", (4096,), True), ("b", (4096,), True)],
             (1, 4096), {"axis": -1, "epsilon": 1e-5})
    plan = mapping.plan_op(op)
    assert (plan.dpus, plan.g["lanes"]) == (1, 16)
    whole = mapping.rownorm_work("layernorm", "float32", 1, 4096, 1, 16, plan.block_bytes, 2)[0]
    assert cost.kernel_cycles(whole)["total"] > 10 * plan.cost().kernel_cycles


# -- Im2Col: row bands with halos ----------------------------------------------------------------

def _im2col_op(shape, ks, st, pads):
    n, c, h, w = shape
    return OpInfo("cols", "Im2Col", {"kernel_shape": ks, "strides": st, "pads": pads, "dilations": [1, 1]},
                  (TensorInfo("x", np.dtype("float32"), shape),),
                  (TensorInfo("y", np.dtype("float32"), (n, h, w, c * ks[0] * ks[1])),))


def test_im2col_moves_to_each_dpu_only_the_rows_its_band_needs(tmp_path):
    """X[1, 3, 32, 32], 3x3, stride 1, pads 1 on 8 DPUs: each DPU builds 4 of the 32 output
    lines, which read padded rows 4b .. 4b + 5: 6 rows x 3 channels x 34 padded columns x
    4 bytes = 2448 bytes (+ 8 bytes the last 8-aligned window may read past), not the whole
    padded input (3 x 34 x 34 x 4 = 13872 bytes) on every DPU."""
    op = _im2col_op((1, 3, 32, 32), [3, 3], [1, 1], [1, 1, 1, 1])
    plan = mapping.make_plan(op, 8, 16)
    per_dpu = 6 * 3 * 34 * 4 + 8
    assert plan.dpus == 8 and plan.inputs == ("x:scatter",)
    assert plan.cost().bytes_in == 8 * per_dpu
    codegen.emit_op(op, dict(plan.attrs(), kernel="k"), {}, tmp_path)
    x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
    (y,), counters = emu.run_kernel(tmp_path / "k", [x])
    assert counters["broadcast_bytes"] == 0
    assert counters["h2d_bytes"] == 8 * per_dpu + 8 * 8   # + ARGS (8 bytes) per DPU
    cols = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.stack([cols[0, :, i:i + 3, j:j + 3].reshape(-1) for i in range(32) for j in range(32)])
    np.testing.assert_array_equal(y.reshape(-1, 27), ref)


@pytest.mark.parametrize("shape,ks,st,pads,dpus", [
    ((3, 2, 9, 11), [3, 3], [2, 1], [1, 0, 1, 2], 7),   # bands of 2 images' lines, a ragged last band
    ((5, 2, 6, 6), [3, 3], [1, 1], [1, 1, 1, 1], 2),    # fewer DPUs than images: whole images
    ((2, 1, 7, 5), [5, 1], [2, 1], [2, 0, 2, 0], 16),   # more DPUs than lines: column blocks
    ((1, 2, 6, 13), [3, 3], [1, 2], [1, 1, 1, 1], 32),  # column blocks of 2 with a ragged last one
])
def test_emulated_conv_on_upmem_im2col_matches_onnxruntime(tmp_path, shape, ks, st, pads, dpus):
    rng = np.random.default_rng(8)
    m = shape[1] * 2
    w = rng.standard_normal((m, shape[1], *ks)).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=ks, strides=st, pads=pads)],
                   shape, inits=[_init("w", w)], opset=17)
    x = rng.standard_normal(shape).astype(np.float32)
    res = optimize(model, place=[("*", "upmem")], device_options={"upmem_dpus": dpus})
    im = [n for n in res.model.graph.node if n.op_type == "Im2Col"]
    assert [v.decode() for v in cinm.node_attrs(im[0])["cnm_inputs"]] == ["x:scatter"]
    artifacts.save(res.model, tmp_path / "c.onnx")
    sess = InferenceSession(tmp_path / "c.onnx", provider_options=[{"upmem_mode": "emulate"}, {}])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)


def test_layernorm_keeps_the_shape_for_what_follows():
    """Regression: the body's Reshape(.., Shape(X)) hid Y's shape from shape inference, so the
    MatMul after a LayerNorm had no shape (its FLOPs counted 0, its placement at size 1)."""
    w = np.ones((8, 4), np.float32)
    m = _model([helper.make_node("LayerNormalization", ["x", "s"], ["n"], axis=-1),
                helper.make_node("MatMul", ["n", "w"], ["y"])], ("batch", 8),
               inits=[_init("s", np.ones(8)), _init("w", w)])
    res = optimize(m, dims={"batch": 16}, check=0, stop_after="cinm")
    assert res.flops_total == 2 * 16 * 8 * 4 + 8 * 16 * 8   # the Gemm, and LayerNorm's 8 per output


def _conv_patches(x, ks, st, pads):
    """numpy: rows (n, oh, ow), columns (c, kh, kw) of the zero-padded input."""
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, c, hp, wp = xp.shape
    oh, ow = (hp - ks[0]) // st[0] + 1, (wp - ks[1]) // st[1] + 1
    return np.stack([xp[b, :, i * st[0]:i * st[0] + ks[0], j * st[1]:j * st[1] + ks[1]].reshape(-1)
                     for b in range(n) for i in range(oh) for j in range(ow)])


@pytest.mark.parametrize("shape,ks,st,pads,dpus,split", [
    ((2, 2, 5, 9), [3, 3], [1, 2], [1, 1, 1, 1], 30, (1, 1, 2)),   # column blocks, ragged
    ((2, 1, 7, 5), [5, 1], [2, 1], [2, 0, 2, 0], 40, (1, 1, 1)),   # one pixel per DPU
    ((3, 2, 9, 11), [3, 3], [2, 1], [1, 0, 1, 2], 7, (1, 3, 11)),  # bands of 3 + 2 lines
    ((5, 2, 6, 6), [3, 3], [1, 1], [1, 1, 1, 1], 2, (3, 6, 6)),    # whole images
])
def test_im2col_tiles_with_halos_in_the_emulator(tmp_path, shape, ks, st, pads, dpus, split):
    """Every split of :func:`mapping.im2col_split` (images, bands of lines, column blocks)
    gathers the patches numpy does."""
    op = _im2col_op(shape, ks, st, pads)
    plan = mapping.make_plan(op, dpus, 4)
    assert (plan.g["nb"], plan.g["lb"], plan.g["cb"]) == split
    codegen.emit_op(op, dict(plan.attrs(), kernel="k"), {}, tmp_path)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    (y,), counters = emu.run_kernel(tmp_path / "k", [x])
    assert counters["h2d_bytes"] == plan.cost().bytes_in + 8 * plan.dpus   # + ARGS per DPU
    np.testing.assert_array_equal(y.reshape(-1, y.shape[-1]), _conv_patches(x, ks, st, pads))


@pytest.mark.parametrize("op,bias,transpose", [("Gelu", False, True), ("BiasGelu", True, False),
                                                ("FastGelu", True, False), ("FastGelu", False, True)])
def test_onnxruntime_contrib_gelus_run_on_upmem(tmp_path, op, bias, transpose):
    """com.microsoft Gelu (here before a Transpose, finding 6's shape), BiasGelu and FastGelu
    (tanh; with and without its bias) become cinm Gelus; the oracle is onnxruntime running the
    contrib op itself."""
    rng = np.random.default_rng(10)
    b = rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node(op, ["x"] + (["b"] if bias else []), ["g"], domain="com.microsoft")]
    nodes.append(helper.make_node("Transpose", ["g"], ["y"], perm=[1, 0]) if transpose
                 else helper.make_node("Identity", ["g"], ["y"]))
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [_init("b", b)] if bias else [])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    x = (rng.standard_normal((3, 16)) * 3).astype(np.float32)
    (y,), on = _emulate(model, tmp_path, x)
    assert "Gelu" in on
    np.testing.assert_allclose(y, run_onnxruntime(model, {"x": x})[0], rtol=1e-5, atol=2e-6)


# -- host-placed cinm ops compute what onnxruntime computes for the original, bit for bit ------

def _quantized_tail(first_nodes, width, inits=(), opset=17):
    """``first_nodes`` (x -> y, float32 [4, width]) then DynamicQuantizeLinear and a
    MatMulInteger with a constant uint8 weight: one last-bit difference in y moves a
    quantization step and the int32 product by whole weight rows (finding 3 of the trial)."""
    w = numpy_helper.from_array(np.random.default_rng(7).integers(0, 255, (width, 8), dtype=np.uint8), "w")
    wz = numpy_helper.from_array(np.array(128, np.uint8), "wz")
    nodes = list(first_nodes) + [
        helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "qs", "qz"]),
        helper.make_node("MatMulInteger", ["q", "w", "qz", "wz"], ["p"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
                          [helper.make_tensor_value_info("p", TensorProto.INT32, None),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          list(inits) + [w, wz])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


_EXACT_CASES = {
    "layernorm": (lambda: [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
                  lambda n: [_init("s", np.linspace(0.5, 2, n)), _init("b", np.linspace(-1, 1, n))], 17),
    "gelu20": (lambda: [helper.make_node("Gelu", ["x"], ["y"])], lambda n: [], 20),
    "gelu20_tanh": (lambda: [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], lambda n: [], 20),
    "erf_gelu_div": (lambda: _erf_gelu_model((1,), 0).graph.node,
                     lambda n: list(_erf_gelu_model((1,), 0).graph.initializer), 17),
    "erf_gelu_mul": (lambda: _erf_gelu_model((1,), 1).graph.node,
                     lambda n: list(_erf_gelu_model((1,), 1).graph.initializer), 17),
    "softmax_axis0": (lambda: [helper.make_node("Softmax", ["x"], ["y"], axis=0)], lambda n: [], 17),
    # onnxruntime's Gemm adds the bias inside the product; MatMul then Add rounds differently
    "gemm_bias": (lambda: [helper.make_node("Gemm", ["x", "gw", "gb"], ["y"], transB=1)],
                  lambda n: [_init("gw", np.random.default_rng(3).standard_normal((n, n)) / 8),
                             _init("gb", np.random.default_rng(4).standard_normal(n))], 17),
}


@pytest.mark.parametrize("case", sorted(_EXACT_CASES))
def test_host_placed_ops_are_bit_identical_to_onnxruntime_on_the_original(case, tmp_path):
    """Every cinm op on the host (place '*' -> host): the provider's outputs equal stock
    onnxruntime's on the original model exactly, the float y and the int32 product after the
    dynamic quantization. Before, LayerNorm's decomposed body differed from onnxruntime's
    LayerNormalization by ~5e-7 and the product by whole weight rows."""
    nodes, inits, opset = _EXACT_CASES[case]
    width = 384
    m = _quantized_tail(nodes(), width, inits(width), opset)
    res = optimize(m, place=[("*", "host")], check=0)
    types = {n.op_type for n in res.model.graph.node if n.domain == cinm.DOMAIN}
    assert types & {"LayerNorm", "Gelu", "Softmax", "Gemm"}, types  # lowered, then left on the host
    artifacts.save(res.model, tmp_path / "m.onnx")
    # compare's setting: onnxruntime's own fusions off on both sides (with them, ORT fuses the
    # erf pattern of the original and of the body alike, into its Gelu kernel)
    sess = InferenceSession(tmp_path / "m.onnx", provider_options=[{"graph_optimization": "disable_all"}, {}])
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((4, width)) * 3).astype(np.float32)
        want = run_onnxruntime(m, {"x": x})
        got = sess.run(["p", "y"], {"x": x})
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])


def test_layernorm_with_another_stash_type_stays():
    m = _model([helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1, stash_type=0)],
               (2, 8), inits=[_init("s", np.ones(8))])
    ops, res = _cinm_ops(m)
    assert ops == [] and "stash_type 0" in str(res.stats["to_cinm"]["kept"]["LayerNormalization"])


def test_the_check_runs_two_input_sets_by_default_when_the_model_quantizes_at_run_time():
    """Trial finding 3: one input set passed what compare's second failed. A model with a
    DynamicQuantizeLinear is checked on compare's default two sets; others on one; an explicit
    count wins."""
    dyn = _quantized_tail([helper.make_node("Relu", ["x"], ["y"])], 16)
    plain = _model([helper.make_node("Relu", ["x"], ["y"])], (4, 16))
    assert optimize(dyn).check.runs == 2
    assert optimize(plain).check.runs == 1
    assert optimize(dyn, check=1).check.runs == 1
