"""The UPMEM device's shortcuts when it answers placement (issue 16) give what the plain
computation gives, bit for bit: plans, cost breakdowns and kernel works built without their
dataclass ``__init__``, a one-launch cost without ``kernel_cycles``' dict, Im2Col's lower
bounds read from its split, the emitter's dry run called without ``emit_op``'s file
bookkeeping, and shapes broadcast in Python."""
from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest

from onnx_cinm.devices.upmem import codegen, mapping
from onnx_cinm.devices.upmem.codegen.common import broadcast_shape
from onnx_cinm.devices.upmem.cost import TARGETS, CostBreakdown, KernelWork, PhasedWork
from onnx_cinm.errors import CinmError
from onnx_cinm.graph import OpInfo, TensorInfo

F32 = np.dtype("float32")


def _conv(side: int, chans: int, k: int, stride: int, pad: int, dil: int = 1, n: int = 1,
          dtype=F32, one_d: bool = False) -> OpInfo:
    """An Im2Col of an ``n x chans x side x side`` input (``side`` long if ``one_d``)."""
    nd = 1 if one_d else 2
    attrs = {"kernel_shape": [k] * nd, "strides": [stride] * nd, "pads": [pad] * (2 * nd),
             "dilations": [dil] * nd}
    shape = (n, chans) + (side,) * nd
    out = max(1, (side + 2 * pad - dil * (k - 1) - 1) // stride + 1)
    return OpInfo("c", "Im2Col", attrs, (TensorInfo("x", np.dtype(dtype), shape),),
                  (TensorInfo("y", np.dtype(dtype), (n * out ** nd, chans * k ** nd)),), 0)


def _random_ops(seed: int, count: int) -> list:
    """Elementwise ops, products (A constant or not, a bias or not) and Im2Cols of varied
    sizes and dtypes."""
    rng = random.Random(seed)
    ops = []
    for i in range(count):
        pick = i % 3
        dt = np.dtype(rng.choice(["float32", "int32", "int8", "int16", "int64", "uint8"]))
        if pick == 0:
            shape = tuple(rng.choice([1, 3, 7, 64, 112, 1000]) for _ in range(rng.randint(1, 4)))
            other = rng.choice([shape, shape[-1:], (1,), shape[:1] + (1,) * (len(shape) - 1)])
            kind = rng.choice(["Add", "Mul", "Max", "Sub", "Relu"])
            ins = (TensorInfo("a", dt, shape),) + (() if kind == "Relu" else (
                TensorInfo("b", dt, other, rng.random() < 0.5),))
            ops.append(OpInfo("e", kind, {}, ins, (TensorInfo("y", dt, shape),)))
        elif pick == 1:
            rows, k, n = (rng.choice([1, 4, 49, 196, 3136]), rng.choice([3, 64, 1152]),
                          rng.choice([1, 10, 32, 1000]))
            ins = [TensorInfo("a", dt, (rows, k), rng.random() < 0.3),
                   TensorInfo("b", dt, (k, n), True)]
            if rng.random() < 0.4:
                ins.append(TensorInfo("c", dt, (n,), True))
            ops.append(OpInfo("g", "Gemm", {}, tuple(ins), (TensorInfo("y", dt, (rows, n)),),
                              2 * rows * k * n))
        else:
            k = rng.choice([1, 3, 5, 7])
            ops.append(_conv(rng.choice([7, 14, 56, 224]), rng.choice([1, 3, 64, 512]), k,
                             rng.choice([1, 2]), rng.choice([0, k // 2]), rng.choice([1, 2]),
                             rng.choice([1, 2]), dt, rng.random() < 0.2))
    return ops


def test_a_plan_built_directly_is_the_dataclass_plan():
    """make_plan sets a plan's fields without CnmPlan's __init__: every field, nothing else,
    equal to the plan the dataclass builds from them; the same for the kernel works."""
    names = [f.name for f in dataclasses.fields(mapping.CnmPlan)]
    for op in _random_ops(1, 30):
        try:
            p = mapping.make_plan(op, 64, 16)
        except CinmError:
            continue
        assert sorted(p.__dict__) == sorted(names)
        built = mapping.CnmPlan(**{n: getattr(p, n) for n in names})
        assert p == built and p.params is built.params and hash(p) == hash(built)
    w = mapping._work(16, 10.0, 160.0, 300.5, 20.0)
    assert w == KernelWork(16, 10.0, 160.0, 300.5, 20.0)
    assert sorted(w.__dict__) == sorted(f.name for f in dataclasses.fields(KernelWork))


def test_the_one_launch_cost_equals_the_phased_one(monkeypatch):
    """_finish's one-launch path (no kernel_cycles dict, a breakdown without its __init__)
    gives the breakdown the general path gives for the same work as one phase run once, field
    for field, for plans of every kind the random ops make, on both DPU generations; and that
    breakdown is what CostBreakdown's own __init__ makes of its fields."""
    calls = []
    real = mapping._finish
    monkeypatch.setattr(mapping, "_finish", lambda p, works, *a, **k: calls.append(
        (p, works, a, k)) or real(p, works, *a, **k))
    kinds = set()
    for op in _random_ops(2, 60):
        for params in TARGETS.values():
            for d in (1, 5, 64, 2048):
                try:
                    mapping.make_plan(op, d, 11, params=params).cost()
                except CinmError:
                    continue
    assert calls
    for p, works, a, k in calls:
        got = real(p, works, *a, **k)
        assert got == CostBreakdown(**{f.name: getattr(got, f.name)
                                       for f in dataclasses.fields(CostBreakdown)})
        if len(works) == 1 and type(works[0]) is KernelWork:
            kinds.add(p.kind)
            phased = real(p, [PhasedWork(((1, works[0]),))], *a, **k)
            assert dataclasses.astuple(got) == dataclasses.astuple(phased)
            assert repr(got.latency_s) == repr(phased.latency_s)
    assert kinds >= {"elementwise", "gemm", "im2col"}


def _im2col_bounds_by_geometry(op, tasklets, params, combos) -> list:
    """Im2Col's lower bounds as they were computed from the kernel's geometry
    (``_im2col_geometry`` on the DPUs that get work)."""
    es = mapping._esize(mapping._dtype_name(op.inputs[0]))
    out = []
    for d, _ in combos:
        # the DPUs that get work (make_plan plans on those)
        used = mapping._im2col_geometry(op.inputs[0].shape, op.attrs, d, es)["used"]
        g = mapping._im2col_geometry(op.inputs[0].shape, op.attrs, used, es)
        instr_row = g["windows"] * (mapping.IM2COL_WIN_INSTR[0] * g["kw"]
                                    + mapping.IM2COL_WIN_INSTR[1])
        rows = g["row_cap"]
        kernel = max(rows * instr_row, params.issue_interval * -(-rows // tasklets) * instr_row)
        out.append(params.launch_overhead_s(used) + kernel / params.frequency_hz
                   + params.push_s(g["xs_bytes"], used)
                   + params.push_s(mapping._r8(g["n_dpu"] * es), used, to_dpu=False))
    return out


def test_im2col_bounds_from_the_split_equal_the_geometrys():
    """Im2Col's lower bounds, read from its split without building the geometry, equal bit
    for bit those computed from the geometry, for kernels, strides, pads, dilations, batches,
    1-D and 2-D, dtypes, tasklets and DPU limits."""
    rng = random.Random(4)
    cases = [_conv(56, 1, 3, 1, 1), _conv(224, 3, 7, 2, 3), _conv(7, 512, 3, 1, 1, n=4),
             _conv(100, 8, 5, 2, 2, 2, one_d=True), _conv(14, 64, 1, 1, 0, dtype="int8")]
    cases += [op for op in _random_ops(5, 90) if op.op_type == "Im2Col"]
    for op in cases:
        unit = mapping._unit_geometry(op)
        for max_dpus in (2560, 2048, 100, 3):
            combos = mapping._workgroups(op, max_dpus, None, unit)
            for params in TARGETS.values():
                t = rng.choice([1, 11, 16])
                got = mapping._floor_s(op, t, params, unit)(combos)
                want = _im2col_bounds_by_geometry(op, t, params, combos)
                assert [repr(x) for x in got] == [repr(x) for x in want]


def _outcome(fn):
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def test_the_direct_dry_run_agrees_with_emitting(tmp_path):
    """check_emittable (the emitter called without emit_op) refuses exactly what emitting the
    kernel for real refuses, with the same message, over ops, shapes, dtypes, plans and
    workgroups the plan never chose (too few DPUs for MRAM, too many tasklets for WRAM, bad
    grids, blocks of every size)."""
    rng = random.Random(6)
    ops = _random_ops(7, 45) + [
        OpInfo("big", "Add", {}, (TensorInfo("a", F32, (1 << 25,)),
                                   TensorInfo("b", F32, (1 << 25,))),
               (TensorInfo("y", F32, (1 << 25,)),)),
        OpInfo("bad", "Add", {}, (TensorInfo("a", F32, (3, 4)), TensorInfo("b", F32, (5,))),
               (TensorInfo("y", F32, (3, 4)),)),
        OpInfo("f64", "Relu", {}, (TensorInfo("a", np.dtype("float64"), (9,)),),
               (TensorInfo("y", np.dtype("float64"), (9,)),)),
        OpInfo("wide", "Gemm", {}, (TensorInfo("a", F32, (2, 8)), TensorInfo("b", F32, (8, 3))),
               (TensorInfo("y", F32, (2, 3)),)),
        _conv(20, 2, 900, 1, 0, one_d=True)]
    refused = agreed = 0
    for i, op in enumerate(ops):
        params = rng.choice(list(TARGETS.values()))
        kernel = _outcome(lambda: codegen.kernel_for(op, target=params))
        plans = []
        try:
            p = mapping.make_plan(op, rng.choice([1, 8, 256]), 16, params=params)
            plans.append({"cnm_dpus": p.dpus, "cnm_tasklets": p.tasklets,
                          "cnm_block_bytes": p.block_bytes, "cnm_grid": p.g.get("grid"),
                          "cnm_lanes": p.g.get("lanes"), "cnm_target": params.name})
        except CinmError:
            pass
        for _ in range(3):
            plans.append({"cnm_dpus": rng.choice([1, 2, 7, 64, 2560]),
                          "cnm_tasklets": rng.choice([1, 16, 24]),
                          "cnm_block_bytes": rng.choice([8, 64, 1024, 2048]),
                          "cnm_grid": rng.choice([None, None, [1, 1], [2, 2], [1, 4], [4, 1]])})
        for j, attrs in enumerate(plans):
            k = None if kernel else codegen.kernel_for(op, target=params)
            direct = _outcome(lambda: codegen.check_emittable(op, attrs, target=params, kernel=k))
            emitted = _outcome(lambda: codegen.emit_op(
                op, {**attrs, "kernel": f"k{i}_{j}"}, {}, tmp_path, target=params))
            assert direct == emitted, (op.name, op.op_type, attrs)
            refused += direct is not None
            agreed += 1
    assert refused >= 10 and agreed - refused >= 10


@pytest.mark.parametrize("seed", range(3))
def test_shapes_broadcast_in_python_as_numpy_does(seed):
    """broadcast_shape gives numpy's broadcast shape, or numpy's own error, for shapes of
    ranks 0-4 with dims 0, 1 and others, compatible or not."""
    rng = random.Random(seed)
    for _ in range(400):
        shapes = [tuple(rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.randint(0, 4)))
                  for _ in range(rng.randint(1, 3))]
        try:
            want = tuple(np.broadcast_shapes(*shapes))
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                broadcast_shape(*shapes)
            assert str(got.value) == str(e)
            continue
        assert broadcast_shape(*shapes) == want


def _matmul_bounds_by_arrays(op, tasklets, params, combos) -> np.ndarray:
    """A matrix product's lower bounds as they were computed before the shortcuts: every term
    over the workgroups' arrays by the parameters' array methods (``push_s_array``,
    ``broadcast_s_array``, ``launch_overhead_s_array``)."""
    kind, g = mapping._unit_geometry(op)
    dt = mapping._dtype_name(op.inputs[0])
    es = mapping._esize(dt)
    rows, n, k, batched = g["rows"], g["n"], g["k"], g.get("b_batched", False)
    per = 8 // np.gcd(8, es)
    per_mac = k * mapping._matvec_instr(dt, mapping.UNROLL) + 3
    a_row = 0 if op.inputs[0].const else -(-k // per) * per * es
    arr = np.array(combos, dtype=np.int64).reshape(-1, 2).T
    d, dc = arr[0], arr[1]
    up = mapping._cdivs
    ok, dr, dcol = mapping._grid_array(d, dc, rows, n, batched)
    rows_dpu, n_dpu = up(rows, dr), up(n, dcol)
    n_pad, r_grp, nt, tiles = mapping._matmul_tiles_array(kind, rows_dpu, n_dpu, es, tasklets,
                                                          batched)
    r_t, n_t = mapping._matmul_busiest_array(rows_dpu, tasklets, n_pad, r_grp, nt, tiles)
    kernel = np.maximum(rows_dpu * n_pad * per_mac, params.issue_interval * r_t * n_t * per_mac)
    a_bytes = rows_dpu * a_row
    send = np.where(dr > 1, params.push_s_array(a_bytes, d), params.broadcast_s_array(a_bytes, d))
    gather = params.push_s_array(up(rows_dpu * n_dpu * es, 8) * 8, d, to_dpu=False)
    out = params.launch_overhead_s_array(d) + kernel / params.frequency_hz + send + gather
    return np.where(ok, out, np.inf)


def test_matmul_bounds_equal_the_array_methods():
    """A matrix product's lower bounds (the busiest count's maximum taken before the multiply,
    A's host part shared by its scatter and broadcast) equal bit for bit those computed term
    by term with the array methods, for products of many sizes, A constant or not, a bias or
    not, batched or not, dtypes, tasklets, DPU limits and both DPU generations."""
    rng = random.Random(8)
    ops = [op for op in _random_ops(9, 150) if op.op_type == "Gemm"]
    ops.append(OpInfo("bmm", "Gemm", {}, (TensorInfo("a", F32, (3, 5, 64)),
                                           TensorInfo("b", F32, (3, 64, 7))),
                      (TensorInfo("y", F32, (3, 5, 7)),)))
    ops.append(OpInfo("empty", "Gemm", {}, (TensorInfo("a", F32, (0, 64)),
                                             TensorInfo("b", F32, (64, 7), True)),
                      (TensorInfo("y", F32, (0, 7)),)))
    for op in ops:
        unit = mapping._unit_geometry(op)
        for max_dpus in (2560, 2048, 96, 7):
            combos = mapping._workgroups(op, max_dpus, None, unit)
            for params in TARGETS.values():
                t = rng.choice([1, 11, 16, 24 if params.max_tasklets >= 24 else 16])
                with np.errstate(divide="ignore"):  # an empty product's tiles: 0 // 0
                    got = np.asarray(mapping._floor_s(op, t, params, unit)(combos), dtype=float)
                    want = _matmul_bounds_by_arrays(op, t, params, combos)
                assert got.tobytes() == want.tobytes(), (op.name, max_dpus, params.name)


def _elementwise_geometry_by_hand(op, d: int, es: int) -> tuple:
    """An elementwise op's geometry on ``d`` DPUs from its definition: ``n`` the output's
    elements; an input of ``n`` elements (or a unary op's first input) one scattered stream,
    any other broadcast, ``ceil(elements * es / 8) * 8`` bytes, in WRAM when at most the DMA
    limit; each DPU's share ``ceil(n / d)`` elements rounded up to 8 bytes."""
    n = max(int(np.prod(op.outputs[0].shape)), 1)
    unary = op.op_type in ("Relu", "Exp", "Gelu")
    streams, bcast, wram, names = 0, 0, 0, []
    for i, t in enumerate(op.inputs):
        numel = max(int(np.prod(t.shape)), 1)
        if numel == n or (unary and i == 0):
            streams += 1
            names.append(f"{t.name}:scatter")
        else:
            b = -(-numel * es // 8) * 8
            bcast, wram = bcast + b, wram + (b <= 2048)
            names.append(f"{t.name}:broadcast")
    per = max(1, 8 // es)
    share = -(-(-(-n // d)) // per) * per
    opn = {"Add": "add", "Mul": "mul", "Sub": "sub", "Relu": "relu", "Exp": "exp"}.get(
        op.op_type, "gelu_tanh" if op.attrs.get("approximate") == "tanh" else "gelu")
    geom = {"n": n, "n_dpu": share, "op": opn, "streams": max(streams, 1), "bcast_bytes": bcast,
            "wram_bcast": wram, "out_esize": op.outputs[0].dtype.itemsize}
    return "elementwise", geom, names, max(streams, 1)


@pytest.mark.parametrize("seed", range(3))
def test_the_elementwise_geometry_kept_on_the_op_is_each_dpu_counts(seed):
    """An elementwise op's geometry is worked out once per op (everything but the DPUs'
    share) and copied for each DPU count: asked on one op for DPU counts in any order, it
    equals the geometry from the definition on each, and a plan made after the others equals
    the plan of a fresh op; the kept part is never changed by a caller."""
    rng = random.Random(seed)
    for _ in range(150):
        dt = np.dtype(rng.choice(["float32", "int32", "int8", "int64", "uint16"]))
        kind = rng.choice(["Add", "Mul", "Sub", "Relu", "Exp", "Gelu"])
        if kind in ("Exp", "Gelu"):
            dt = F32
        shape = tuple(rng.choice([1, 3, 7, 32, 56, 1000]) for _ in range(rng.randint(1, 4)))
        other = rng.choice([shape, shape[-1:], (1,), shape[:1] + (1,) * (len(shape) - 1)])
        ins = (TensorInfo("a", dt, shape),) + (() if kind in ("Relu", "Exp", "Gelu") else (
            TensorInfo(rng.choice(["a", "b"]), dt, other, rng.random() < 0.5),))
        attrs = {"approximate": rng.choice(["none", "tanh"])} if kind == "Gelu" else {}

        def make():
            return OpInfo("e", kind, dict(attrs), ins, (TensorInfo("y", dt, shape),))

        op, es = make(), dt.itemsize
        counts = rng.sample([1, 2, 3, 7, 64, 100, 512, 2048, 2560], 5)
        got = [mapping._geometry(op, d, es) for d in counts]
        for d, one in zip(counts, got):
            assert one == _elementwise_geometry_by_hand(op, d, es)
            one[1]["n_dpu"] = -1   # a caller changing its copy changes nothing kept
            one[2].append("x")
            assert mapping._geometry(op, d, es) == _elementwise_geometry_by_hand(op, d, es)
        for d in counts:
            try:
                want = mapping.make_plan(make(), d, 16)
            except CinmError as e:
                with pytest.raises(CinmError, match="^" + re.escape(str(e)) + "$"):
                    mapping.make_plan(op, d, 16)
                continue
            assert mapping.make_plan(op, d, 16) == want


def test_a_plans_input_template_is_each_entrys_first_input():
    """The memo's record of a plan's inputs (``_template``) gives each entry the position of
    the first input of that name (``list.index``'s), for inputs named twice too (Mul(x, x))
    and names holding ``:``; a renamed plan names the other op's inputs there."""
    t = lambda n, s=(4, 8): TensorInfo(n, F32, s)  # noqa: E731
    cases = [(OpInfo("m", "Mul", {}, (t("x"), t("x")), (t("y"),)), ("x:scatter", "x:scatter")),
             (OpInfo("m", "Add", {}, (t("a:b"), t("c", (8,))), (t("y"),)),
              ("a:b:scatter", "c:broadcast")),
             (OpInfo("g", "Gemm", {}, (t("p"), t("q", (8, 3)), t("p", (3,))), (t("y", (4, 3)),)),
              ("p:broadcast", "q:broadcast", "p:scatter"))]
    for op, entries in cases:
        names = [x.name for x in op.inputs]
        want = tuple((names.index(e.rsplit(":", 1)[0]), e.rsplit(":", 1)[1]) for e in entries)
        assert mapping._template(entries, op) == want
    op = cases[0][0]
    plan = mapping.plan_op(op)
    other = OpInfo("m2", "Mul", {}, (t("z"), t("z")), (t("w"),))
    assert mapping.plan_op(other).inputs == tuple(e.replace("x:", "z:") for e in plan.inputs)


def test_an_im2col_plan_is_made_on_the_dpus_that_get_work():
    """An Im2Col planned on ``d`` DPUs is the plan on the DPUs its split gives work (the
    geometry's ``used`` on ``d``, at most ``d``), with that geometry: asked for ``d`` or for
    ``used`` itself, on random convolutions (1-D and 2-D, strided, dilated, batched)."""
    ops = [op for op in _random_ops(7, 240) if op.op_type == "Im2Col"]
    assert len(ops) == 80
    shrunk = 0
    for op in ops:
        es = op.inputs[0].dtype.itemsize
        for d in (1, 3, 8, 56, 64, 100, 1000, 2560):
            used = mapping._geometry(op, d, es)[1]["used"]
            assert 1 <= used <= d
            try:
                want = mapping.make_plan(_conv_copy(op), used, 16)
            except CinmError as e:
                with pytest.raises(CinmError, match="^" + re.escape(str(e)) + "$"):
                    mapping.make_plan(op, d, 16)
                continue
            got = mapping.make_plan(op, d, 16)
            assert got == want and got.dpus == used and got.g == dict(
                mapping._geometry(op, used, es)[1])
            shrunk += used < d
    assert shrunk > 50


def _conv_copy(op):
    """``op`` as a new OpInfo (nothing it keeps for the mapping)."""
    return OpInfo(op.name, op.op_type, dict(op.attrs), op.inputs, op.outputs, op.flops)
