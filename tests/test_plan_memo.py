"""What optimize computes once instead of per op (issue 16): the UPMEM plans and the code
generator's check are memoized per op signature, the crossbar pinning is a numpy knapsack, the
DPU-count rule skips workgroups that cannot win. None of it may change a plan: identical layers
get identical plans and kernels, a run without the memos writes the same model, and each
shortcut returns what the plain computation returns."""
from __future__ import annotations

import itertools
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts
from onnx_cinm.devices import upmem
from onnx_cinm.devices.base import Priced
from onnx_cinm.devices.upmem import mapping
from onnx_cinm.errors import CinmError
from onnx_cinm.graph import OpInfo, TensorInfo
from onnx_cinm.paradigms.cim.residency import pin
from onnx_cinm.pipeline import optimize


def _two_layers() -> onnx.ModelProto:
    """x[4, 64] -> Gemm(w0) -> Relu -> Gemm(w1) -> Relu: two layers of one shape, different
    weights and names."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), f"w{i}")
             for i in range(2)]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"], name="fc0"),
             helper.make_node("Relu", ["m0"], ["r0"], name="act0"),
             helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="fc1"),
             helper.make_node("Relu", ["m1"], ["y"], name="act1")]
    f = TensorProto.FLOAT
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", f, [4, 64])],
                          [helper.make_tensor_value_info("y", f, [4, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


class _NoMemo(dict):
    """A memo that never remembers: every lookup misses."""

    def get(self, key, default=None):
        return default

    def __setitem__(self, key, value):
        pass


def _upmem_nodes(model):
    return {n.name: n for n in model.graph.node
            if any(a.name == "device" and a.s == b"upmem" for a in n.attribute)}


def _optimize(model):
    return optimize(model, place=[("*", "upmem")], check=0).model


def test_identical_layers_get_identical_plans_and_kernels(tmp_path):
    """Both Relus (and both Gemms) have one plan: the same ``cnm_*`` attributes but their own
    input names, and kernels whose C sources and Makefile are byte for byte the same."""
    model = _optimize(_two_layers())
    nodes = _upmem_nodes(model)
    assert {"act0/Relu", "act1/Relu", "fc0/Gemm", "fc1/Gemm"} <= set(nodes)
    manifest = artifacts.save(model, tmp_path / "two.onnx")
    files = {k["node"]: {f["path"].rsplit("/", 1)[1]: f["sha256"] for f in k["files"]}
             for k in manifest["kernels"]}
    for a, b, inputs in (("act0/Relu", "act1/Relu", (["m0:scatter"], ["m1:scatter"])),
                         ("fc0/Gemm", "fc1/Gemm", None)):
        at = {n: {x.name: helper.get_attribute_value(x) for x in nodes[n].attribute
                  if x.name.startswith("cnm_")} for n in (a, b)}
        if inputs is not None:
            assert (at[a].pop("cnm_inputs"), at[b].pop("cnm_inputs")) == \
                tuple([s.encode() for s in x] for x in inputs)
        else:  # each Gemm names its own operands
            names = [[s.decode().split(":")[0] for s in at[n].pop("cnm_inputs")] for n in (a, b)]
            assert names[0] != names[1]
        assert at[a] == at[b] and at[a]["cnm_dpus"] >= 1
        for name in ("host.c", "dpu.c", "Makefile"):
            assert files[a][name] == files[b][name]
    # the weights differ, so the Gemms' constant sidecars do too: the kernels are not shared
    assert files["fc0/Gemm"]["const1.bin"] != files["fc1/Gemm"]["const1.bin"]


def test_the_memos_do_not_change_the_model(monkeypatch):
    """A run whose plan and emit-check memos never remember writes exactly the same model."""
    memo = _optimize(_two_layers()).SerializeToString(deterministic=True)
    monkeypatch.setattr(mapping, "_PLANS", _NoMemo())
    monkeypatch.setattr(upmem, "_EMITTABLE", _NoMemo())
    monkeypatch.setattr(upmem, "_SUPPORTS", _NoMemo())
    monkeypatch.setattr(upmem, "_PRICES", _NoMemo())
    fresh = _optimize(_two_layers()).SerializeToString(deterministic=True)
    assert memo == fresh


def test_a_refusal_names_the_op_it_is_given_for():
    """A refusal for an op's shape is remembered (plans and emit checks are memoized per shape),
    and the refusal of a second op of that shape names the second op, not the first."""
    dev = upmem.UpmemDevice()
    t = lambda n, s: TensorInfo(n, np.dtype("float32"), s)
    ops = [OpInfo(name, "TopK", {"k": 6000, "axis": -1, "largest": 1}, (t("x", (200_000,)),),
                  (t("v", (6000,)), TensorInfo("i", np.dtype("int64"), (6000,))))
           for name in ("first", "second")]
    said = []
    for op in ops:
        support = dev.supports(op)
        assert not support
        said.append(support.reason)
    assert "'first'" in said[0] and said[1] == said[0].replace("'first'", "'second'")


def _brute_pin(tiles, const, capacity, uses):
    """The most writes saved over every subset of eligible sets that fits (by enumeration)."""
    ok = [i for i, (t, c) in enumerate(zip(tiles, const)) if c and t <= capacity]
    best = 0
    for r in range(len(ok) + 1):
        for sub in itertools.combinations(ok, r):
            if sum(tiles[i] for i in sub) <= capacity:
                best = max(best, sum(tiles[i] * uses[i] for i in sub))
    return best


def test_pin_is_an_optimal_knapsack():
    """On random small cases the pinned sets fit, are constant, and save as many writes as the
    best subset found by enumeration."""
    rng = random.Random(1)
    for _ in range(300):
        k = rng.randint(0, 8)
        tiles = [rng.randint(0, 9) for _ in range(k)]
        const = [rng.random() < 0.8 for _ in range(k)]
        uses = [rng.randint(1, 3) for _ in range(k)]
        cap = rng.randint(0, 30)
        got = pin(tiles, const, cap, uses)
        assert all(const[i] and tiles[i] > 0 for i in got)
        assert sum(tiles[i] for i in got) <= cap
        assert sum(tiles[i] * uses[i] for i in got) == _brute_pin(tiles, const, cap, uses)


def test_pin_keeps_the_earlier_sets_on_a_tie():
    """Two sets of 3 tiles and room for one: the first; room for 5 with 2 + 3 or 5: the earlier
    choice (2 + 3 found before the 5-tile set came); more room than tiles: all."""
    assert pin([3, 3], [True, True], 3) == {0}
    assert pin([2, 3, 5], [True, True, True], 5) == {0, 1}
    assert pin([2, 3, 5], [True, False, True], 1000) == {0, 2}


def _t(name, shape, dtype="float32", const=False):
    return TensorInfo(name, np.dtype(dtype), tuple(shape), const)


@pytest.mark.parametrize("op", [
    OpInfo("relu", "Relu", {}, (_t("x", (1, 256)),), (_t("y", (1, 256)),)),
    OpInfo("add", "Add", {}, (_t("a", (1, 1 << 20)), _t("b", (1, 1 << 20))), (_t("y", (1, 1 << 20)),)),
    OpInfo("fc", "Gemm", {}, (_t("x", (1, 1024)), _t("w", (1024, 1000), const=True)), (_t("y", (1, 1000)),)),
    OpInfo("conv", "Gemm", {}, (_t("x", (1, 196, 1152)), _t("w", (1152, 32), const=True)),
           (_t("y", (1, 196, 32)),)),
], ids=lambda o: o.name)
def test_the_rule_is_the_fastest_workgroup(op):
    """The DPU-count rule (which skips workgroups whose launch alone is too slow) returns the
    plan a search costing every workgroup finds: the least modeled latency, ties to the
    earlier (fewer DPUs)."""
    best, best_lat = None, 0.0
    dpus, tasklets = mapping.DEFAULT_DPUS, mapping.DEFAULT_TASKLETS
    for d, dc in mapping.workgroups(op, dpus):
        try:
            p = mapping.make_plan(op, d, tasklets, col_blocks=dc)
        except CinmError:
            continue
        lat = p.cost().latency_s
        if best is None or lat < best_lat * (1 - 1e-9):
            best, best_lat = p, lat
    got = mapping._search_plan(op, dpus, tasklets, mapping.DEFAULT_PARAMS, mapping.STACK_BYTES, None)
    assert got == best and got.cost() == best.cost()


def test_a_search_runs_once_per_shape_and_keeps_each_ops_names(monkeypatch):
    """``upmem_search``: the second op of a shape gets the first one's searched plan with its own
    input names, without searching again, and that plan is what a search of it alone finds."""
    from onnx_cinm.devices.upmem import search

    ops = [OpInfo(f"fc{i}", "Gemm", {}, (_t(f"x{i}", (16, 512)), _t(f"w{i}", (512, 512), const=True)),
                  (_t(f"y{i}", (16, 512)),)) for i in range(2)]
    monkeypatch.setattr(search, "_SEARCHES", {})
    runs = []
    real = search._search
    monkeypatch.setattr(search, "_search", lambda *a: runs.append(a[0].name) or real(*a))
    plans = [search.search_plan(op) for op in ops]
    assert runs == ["fc0"]
    assert [e.split(":")[0] for e in plans[1].inputs] == ["x1", "w1"]
    alone = real(ops[1], mapping.DEFAULT_DPUS, mapping.DEFAULT_PARAMS, search.MAX_PLANS, 5.0,
                 mapping.DEFAULT_TASKLETS)
    assert plans[1] == alone and plans[1].search == alone.search


def test_the_plan_attributes_do_not_split_the_memo(monkeypatch):
    """cnm_mapping writes each op's plan as ``cnm_*`` attributes before device_lowering asks for
    the plan again: they record the decision and take no part in it, so the second ask is a
    memo hit, and its plan is what planning the annotated op afresh gives."""
    from dataclasses import replace

    op = OpInfo("fc", "Gemm", {}, (_t("x", (16, 512)), _t("w", (512, 512), const=True)),
                (_t("y", (16, 512)),))
    monkeypatch.setattr(mapping, "_PLANS", {})
    first = mapping.plan_op(op)
    annotated = replace(op, attrs={**first.attrs(), "device": "upmem"})
    plans = []
    real = mapping._search_plan
    monkeypatch.setattr(mapping, "_search_plan", lambda *a: plans.append(1) or real(*a))
    assert mapping.plan_op(annotated) == first and plans == []
    monkeypatch.setattr(mapping, "_PLANS", _NoMemo())
    assert mapping.plan_op(annotated) == first and plans == [1]


def test_matmul_bounds_from_the_memo_equal_fresh_ones():
    """A matrix product's lower bounds reuse the parts its K leaves unchanged per workgroup
    tuple and output size (``_matmul_floor_parts``): for products of one output size and many
    K, A constant or not, with and without a bias, they equal bit for bit the bounds computed
    afresh from a plain list of the same workgroups (which is never remembered)."""
    f32 = np.dtype("float32")
    for rows, k, n in ((196, 128, 32), (196, 640, 32), (4, 64, 64), (3136, 64, 128),
                       (1, 1024, 1000), (49, 992, 128)):
        for const_a, bias in ((False, False), (True, False), (False, True)):
            ins = [TensorInfo("a", f32, (rows, k), const_a), TensorInfo("b", f32, (k, n), True)]
            if bias:
                ins.append(TensorInfo("c", f32, (n,), True))
            op = OpInfo("g", "Gemm", {}, tuple(ins), (TensorInfo("y", f32, (rows, n)),))
            unit = mapping._unit_geometry(op)
            for max_dpus in (2560, 2048, 96, 7):
                combos = mapping._workgroups(op, max_dpus, None, unit)
                floor = mapping._floor_s(op, 16, mapping.DEFAULT_PARAMS, unit)
                memo = np.asarray(floor(combos), dtype=float)
                again = np.asarray(floor(combos), dtype=float)
                fresh = np.asarray(floor(list(combos)), dtype=float)
                assert memo.tobytes() == fresh.tobytes() == again.tobytes()


def _ew_bounds_by_arrays(op, params) -> list:
    """An elementwise op's lower bounds over its workgroups by the parameters' array methods
    (``push_s_array``, ``broadcast_s_array``, ``launch_overhead_s_array``), as the floor was
    computed before it ran in Python floats."""
    from onnx_cinm.devices.upmem import cost as C
    unit = mapping._unit_geometry(op)
    g, dt = unit[1], mapping._dtype_name(op.inputs[0])
    es = mapping._esize(dt)
    instr = (g["streams"] + C.op_instructions(g["op"], dt) + 1 + 2 * g["wram_bcast"]
             + C.LOOP_CONTROL / mapping.UNROLL)
    out_es, word = g.get("out_esize", es), (max(1, 8 // es) if 8 % es == 0 else 8)
    d = np.asarray([c[0] for c in mapping._workgroups(op, 2048, None, unit)], dtype=np.int64)
    up = mapping._cdivs
    n_dpu = up(up(max(g["n"], 1), d), word) * word
    out = (params.launch_overhead_s_array(d) + n_dpu * instr / params.frequency_hz
           + params.push_s_array(up(n_dpu * out_es, 8) * 8, d, to_dpu=False)
           + params.push_s_array(g["streams"] * (up(n_dpu * es, 8) * 8), d))
    if g["bcast_bytes"]:
        out = out + params.broadcast_s_array(np.full(len(d), g["bcast_bytes"]), d)
    return out.tolist()


def test_elementwise_bounds_in_floats_equal_the_array_methods():
    """An elementwise op's lower bounds, computed per workgroup in Python floats, equal bit for
    bit those of the array methods, for ops of varied sizes, dtypes, broadcasts and both DPU
    generations (the plan search orders and prunes the workgroups by them)."""
    from onnx_cinm.devices.upmem.cost import TARGETS
    rng = random.Random(3)
    for _ in range(150):
        dt = np.dtype(rng.choice(["float32", "int8", "int16", "int32", "int64", "uint8"]))
        shape = tuple(rng.choice([1, 2, 3, 7, 33, 64, 1000]) for _ in range(rng.randint(1, 4)))
        other = rng.choice([shape, shape[-1:], (1,), shape[:1] + (1,) * (len(shape) - 1)])
        kind = rng.choice(["Add", "Mul", "Max", "Sub", "Relu"])
        ins = (TensorInfo("a", dt, shape),) + (() if kind == "Relu" else (
            TensorInfo("b", dt, other, rng.random() < 0.5),))
        op = OpInfo("e", kind, {}, ins, (TensorInfo("y", dt, shape),))
        unit = mapping._unit_geometry(op)
        combos = mapping._workgroups(op, 2048, None, unit)
        for params in TARGETS.values():
            got = mapping._floor_s(op, 16, params, unit)(combos)
            want = _ew_bounds_by_arrays(op, params)
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
            assert mapping._floor_s(op, 16, params, unit)(list(combos)) == got


def test_supports_answers_once_per_op_signature(monkeypatch):
    """Two ops of one signature get one answer from the device's ``supports`` (the kernel
    choice, plan and emit check run for the first only); an op of another shape is asked
    afresh."""
    from onnx_cinm.devices.upmem import codegen
    f32 = np.dtype("float32")
    dev = upmem.UpmemDevice()
    monkeypatch.setattr(upmem, "_SUPPORTS", {})
    asked = []
    real = codegen.kernel_for
    monkeypatch.setattr(codegen, "kernel_for", lambda *a, **k: asked.append(1) or real(*a, **k))
    ops = [OpInfo(f"r{i}", "Relu", {}, (TensorInfo(f"x{i}", f32, shape),),
                  (TensorInfo(f"y{i}", f32, shape),))
           for i, shape in enumerate([(4, 64), (4, 64), (4, 65)])]
    said = [dev.supports(op) for op in ops]
    assert all(said) and said[0].reason == said[1].reason and len(asked) == 2


def _price_by_hand(op, options):
    """The UPMEM price of ``op`` computed without the price memo: the plan's cost, the
    constant inputs' bytes (dtype size x elements) resident."""
    plan = upmem.UpmemDevice().plan(op, options)
    const = sum(np.dtype(t.dtype).itemsize * int(np.prod(t.shape)) for t in op.inputs if t.const)
    return [Priced(plan.to_cost(), resident_bytes=const)]


def test_price_answers_once_per_op_signature_and_options(monkeypatch):
    """Ops of one signature (other names, other weights) get one priced choice: the plan's
    cost and their constants' bytes, as computed without the memo; other DPU, tasklet or
    generation options, and another shape, are priced afresh (the plan is made for them)."""
    f32 = np.dtype("float32")
    dev = upmem.UpmemDevice()
    monkeypatch.setattr(upmem, "_PRICES", {})
    planned = []
    real = upmem.UpmemDevice.plan
    monkeypatch.setattr(upmem.UpmemDevice, "plan",
                        lambda self, *a, **k: planned.append(1) or real(self, *a, **k))

    def fc(tag, k=64):
        return OpInfo(f"fc{tag}", "Gemm", {}, (TensorInfo(f"x{tag}", f32, (512, k)),
                                              TensorInfo(f"w{tag}", f32, (k, 32), True)),
                      (TensorInfo(f"y{tag}", f32, (512, 32)),), 2 * 512 * k * 32)

    cases = [(fc("a"), {}), (fc("b"), {}), (fc("c"), {"upmem_dpus": 1}),
             (fc("d"), {"upmem_tasklets": 4}), (fc("e"), {"upmem_target": "v1b"}),
             (fc("f", k=96), {}), (fc("g"), {"upmem_dpus": 1})]
    got = [dev.price(op, options) for op, options in cases]
    assert len(planned) == 5  # a, c, d, e, f: b and g ask what a and c asked
    monkeypatch.setattr(upmem.UpmemDevice, "plan", real)
    for (op, options), answer in zip(cases, got):
        assert answer == _price_by_hand(op, options)
    assert got[0][0].resident_bytes == 64 * 32 * 4 and got[5][0].resident_bytes == 96 * 32 * 4
    assert got[2] != got[0] and got[3] != got[0] and got[4] != got[0]
    with pytest.raises(CinmError, match="tasklets"):  # bad options: refused as before
        dev.price(fc("h"), {"upmem_tasklets": 30, "upmem_target": "v1b"})
    # supports plans the op under the default options: their price is not planned again
    monkeypatch.setattr(upmem, "_SUPPORTS", {})
    assert dev.supports(fc("i", k=128))
    planned.clear()
    monkeypatch.setattr(upmem.UpmemDevice, "plan",
                        lambda self, *a, **k: planned.append(1) or real(self, *a, **k))
    kept = dev.price(fc("j", k=128), {})
    assert planned == []
    monkeypatch.setattr(upmem.UpmemDevice, "plan", real)
    assert kept == _price_by_hand(fc("j", k=128), {})


def test_a_renamed_plan_is_the_plan_with_the_other_names():
    """Ops of one shape share a plan; the second gets a copy with its own input names
    (``_renamed``), equal to ``dataclasses.replace`` of the plan with those names, with the
    same cost, and the first op's plan is left as it was."""
    from dataclasses import replace

    f32 = np.dtype("float32")
    ops = [OpInfo(f"fc{i}", "Gemm", {}, (TensorInfo(f"x{i}", f32, (16, 512)),
                                          TensorInfo(f"w{i}", f32, (512, 256), True)),
                  (TensorInfo(f"y{i}", f32, (16, 256)),)) for i in range(2)]
    first, second = (mapping.plan_op(op) for op in ops)
    assert first.inputs[0].startswith("x0:") and second.inputs[0].startswith("x1:")
    assert second == replace(first, inputs=second.inputs)
    assert second.cost() == first.cost() and second.attrs()["cnm_latency_s"] == \
        first.attrs()["cnm_latency_s"]
    assert mapping.plan_op(ops[0]).inputs == first.inputs


def test_lowering_finds_the_emit_check_placement_made(monkeypatch):
    """Placement checks a Gemm's plan with the grid the plan keeps (a tuple), lowering with the
    ``cnm_grid`` attribute it writes (a list): one grid, one dry run of the code generator per
    op shape (two layers of one shape: one Gemm and one Relu check in all)."""
    from onnx_cinm.devices.upmem import codegen
    monkeypatch.setattr(upmem, "_EMITTABLE", {})
    monkeypatch.setattr(upmem, "_SUPPORTS", {})
    grids = []
    real = codegen.check_emittable
    monkeypatch.setattr(codegen, "check_emittable", lambda op, attrs, **k: grids.append(
        (op.op_type, attrs.get("cnm_grid"))) or real(op, attrs, **k))
    _optimize(_two_layers())
    assert sorted(t for t, _ in grids) == ["Gemm", "Relu"]
    assert next(g for t, g in grids if t == "Gemm") is not None  # the Gemm's plan has a grid
