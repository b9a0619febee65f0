"""cnm mapping: WRAM-fit blocks, MRAM padding, DPU choice, merges, plan attributes on real models.

Expected values are worked out by hand in the comments (64 KB WRAM, 1 KB stacks, 2 KB reserved
for globals, DMA blocks multiples of 8 and at most 2048 bytes).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import onnx_cinm
from onnx_cinm.devices import get_device
from onnx_cinm.devices.base import Cost
from onnx_cinm.devices.upmem.mapping import make_plan, plan_op, wram_block
from onnx_cinm.errors import CinmError
from onnx_cinm.graph import OpInfo, TensorInfo
from onnx_cinm.passes import DEFAULT_PIPELINE, STOP_LEVELS, PassContext, PassManager, check_options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import prim_workloads as pw  # noqa: E402


def _t(name, shape, dtype="int32"):
    return TensorInfo(name, np.dtype(dtype), tuple(shape), False)


def _va(n, dtype="int32"):
    return OpInfo("va", "Add", {}, (_t("a", [n], dtype), _t("b", [n], dtype)), (_t("y", [n], dtype),))


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# -- the WRAM-fit rule -------------------------------------------------------------------------

@pytest.mark.parametrize("tasklets, buffers, stack, private, want", [
    (1, 2, 1024, 0, 2048),    # (65536 - 2048 - 1024) / 2 = 31232 -> the 2048-B DMA limit
    (11, 2, 1024, 0, 2048),   # (65536 - 2048 - 11264) / 22 = 2373 -> 2048
    (16, 2, 1024, 0, 1472),   # (65536 - 2048 - 16384) / 32 = 1472
    (24, 2, 1024, 0, 808),    # (65536 - 2048 - 24576) / 48 = 810.7 -> 808 (multiple of 8)
    (24, 1, 1024, 0, 1616),   # 38912 / 24 = 1621.3 -> 1616
    (16, 2, 2048, 0, 960),    # (65536 - 2048 - 32768) / 32 = 960
    (16, 1, 1024, 1024, 1920),  # private 256-bin histograms: (65536 - 2048 - 16 * 2048) / 16
    (24, 2, 2048, 0, 296),    # (65536 - 2048 - 49152) / 48 = 298.7 -> 296
])
def test_wram_block(tasklets, buffers, stack, private, want):
    got = wram_block(tasklets, buffers, private, stack_bytes=stack)
    assert got == want
    assert got % 8 == 0 and got <= 2048
    assert tasklets * (stack + buffers * got + private) + 2048 <= 65536


def test_wram_block_zero_when_nothing_fits():
    assert wram_block(24, 1, 2048, stack_bytes=1024) == 0   # 24 x 3 KB > 62 KB


def test_plan_uses_the_fitted_block_for_each_tasklet_count():
    # a large VA (every tasklet has many blocks): the block is exactly the WRAM-fit value
    for t, want in ((1, 2048), (11, 2048), (16, 1472), (24, 808)):
        p = plan_op(_va(1 << 22), dpus=8, tasklets=t)
        assert (p.tasklets, p.block_bytes) == (t, want)


def test_block_never_exceeds_a_tasklets_share():
    # 1001 int32 on 1 DPU, 11 tasklets: 1002 elements (padded to 8 B) = 4008 B,
    # 4008 / 11 = 364.4 -> 368 B per tasklet
    p = plan_op(_va(1001), dpus=1, tasklets=11)
    assert p.block_bytes == 368


# -- MRAM alignment and padding ---------------------------------------------------------------

def test_single_element_pads_to_8_bytes():
    p = plan_op(_va(1))
    assert p.dpus == 1                              # one 8-byte word of work: one DPU
    assert p.mram_layout() == [("in0", 0, 8), ("in1", 8, 8), ("out", 16, 8)]
    assert p.mram_bytes == 24
    assert p.block_bytes == 8


def test_n_not_a_multiple_of_dpus():
    # 1001 int32 on 7 DPUs: ceil(1001 / 7) = 143 -> 144 (two int32 per 8 B) = 576 B per region
    p = plan_op(_va(1001), dpus=7)
    assert p.mram_layout() == [("in0", 0, 576), ("in1", 576, 576), ("out", 1152, 576)]
    assert 7 * 144 >= 1001
    # int64: 10 elements on 3 DPUs -> 4 per DPU = 32 B
    p = plan_op(_va(10, "int64"), dpus=3)
    assert [r[2] for r in p.mram_layout()] == [32, 32, 32]
    for _, off, size in p.mram_layout():
        assert off % 8 == 0 and size % 8 == 0


def test_gemv_rows_padded_to_8_bytes():
    # A[37, 53] int32 on 7 DPUs: ceil(37 / 7) = 6 rows of 212 B padded to 216 B = 1296 B;
    # x broadcast: 212 -> 216 B; y: 6 x 4 = 24 B
    op = OpInfo("mv", "Gemv", {}, (_t("A", [37, 53]), _t("x", [53])), (_t("y", [37]),))
    p = plan_op(op, dpus=7)
    assert p.mram_layout() == [("A", 0, 1296), ("B", 1296, 216), ("Y", 1512, 24)]
    assert p.inputs == ("A:scatter", "x:broadcast")
    assert p.attrs()["cnm_grid"] == [7, 1]              # 7 row blocks x 1 column block


def test_fully_connected_layer_splits_columns_and_keeps_weights_resident():
    # x[1, 9216] @ W[9216, 4096] (AlexNet's fc6 at batch 1): one row, so W's columns are split.
    # On 64 DPUs: 64 columns each; K-rows of 9216 x 4 = 36,864 B; x broadcast 36,864 B,
    # W^T block 64 x 36,864 = 2,359,296 B, y 64 x 4 = 256 B.
    w = TensorInfo("W", np.dtype("float32"), (9216, 4096), True)
    op = OpInfo("fc", "Gemm", {}, (_t("x", [1, 9216], "float32"), w), (_t("y", [1, 4096], "float32"),))
    p = plan_op(op, dpus=64)
    assert p.inputs == ("x:broadcast", "W:scatter")
    assert p.attrs()["cnm_grid"] == [1, 64]
    assert p.mram_layout() == [("A", 0, 36864), ("B", 36864, 2359296), ("Y", 2396160, 256)]
    b = p.cost()
    assert b.resident_bytes == 64 * 2359296 and b.load_s > 0
    assert b.bytes_in == 64 * 36864            # per inference only x moves in
    assert plan_op(op).inputs == ("x:broadcast", "W:scatter")   # also when the DPU count is free


def test_convolution_with_few_pixels_uses_a_2d_grid():
    # im2col rows [196, 2304] @ W[2304, 256] (ResNet50 stage 4): 196 rows, 256 columns.
    # 4 x 16 grid on 64 DPUs: 49 rows and 16 columns per DPU
    w = TensorInfo("W", np.dtype("float32"), (2304, 256), True)
    op = OpInfo("conv", "Gemm", {}, (_t("cols", [1, 14, 14, 2304], "float32"), w),
                (_t("y", [1, 14, 14, 256], "float32"),))
    p = make_plan(op, 64, 16, col_blocks=16)
    assert p.attrs()["cnm_grid"] == [4, 16]
    assert p.inputs == ("cols:scatter", "W:scatter")
    assert [r[2] for r in p.mram_layout()] == [49 * 2304 * 4, 16 * 2304 * 4, 49 * 16 * 4]
    best = plan_op(op)
    assert best.attrs()["cnm_grid"][0] > 1 and best.attrs()["cnm_grid"][1] > 1


# -- DPU count and merges ----------------------------------------------------------------------

def test_small_inputs_do_not_use_all_dpus():
    assert plan_op(_va(1000)).dpus <= 64
    # PrIM's VA size: transfers dominate (53 ms in, 56 ms out on 1024 DPUs vs a 3 ms kernel);
    # the host's transfer limit (issue 14's calibration) does not grow with ranks while the
    # per-rank and per-DPU-chunk costs do, so 2048 DPUs (115.9 ms) lose to 1024 (112.7 ms)
    assert plan_op(_va(167_772_160)).dpus == 1024
    assert plan_op(_va(167_772_160), max_dpus=512).dpus == 512


def test_merges():
    red = OpInfo("r", "Reduce", {"kind": "add", "axes": [0], "keepdims": 0},
                 (_t("x", [1 << 20]),), (_t("y", []),))
    assert plan_op(red).merge == "tree"
    assert make_plan(red, 64, 16, "prim").merge == "host"
    rows = OpInfo("r", "Reduce", {"kind": "max", "axes": [1], "keepdims": 0},
                  (_t("x", [4096, 100]),), (_t("y", [4096]),))
    assert plan_op(rows, dpus=64).merge == "none"        # whole rows per DPU
    hst = OpInfo("h", "Histogram", {"bins": 256, "min": 0.0, "max": 4096.0},
                 (_t("x", [1 << 20]),), (_t("c", [256], "int64"),))
    assert plan_op(hst).merge == "tree"                  # 16 x 1 KB private histograms fit
    big = OpInfo("h", "Histogram", {"bins": 8192, "min": 0.0, "max": 8192.0},
                 (_t("x", [1 << 20]),), (_t("c", [8192], "int64"),))
    assert plan_op(big).merge == "mutex"                 # 16 x 32 KB do not: one shared table


def test_prim_schedule_is_never_faster_on_va_and_gemv():
    gemv = OpInfo("mv", "Gemv", {}, (_t("A", [163840, 4096]), _t("x", [4096])), (_t("y", [163840]),))
    for op in (_va(167_772_160), gemv):
        ours = plan_op(op)
        assert ours.cost().kernel_s <= make_plan(op, ours.dpus, 16, "prim").cost().kernel_s


# -- the device and the pass -------------------------------------------------------------------

def test_device_cost_and_lower_options():
    dev = get_device("upmem")
    c = dev.cost(_va(1 << 20))
    assert isinstance(c, Cost) and c.latency_s > 0 and c.energy_j > 0
    assert c.bytes_moved == 3 * (1 << 22)
    attrs = dev.lower([(_va(1001), {"kernel_stem": "0000_va", "upmem_dpus": 1, "upmem_tasklets": 11})])[0]
    assert attrs["kernel"] == "upmem/0000_va"
    assert (attrs["cnm_dpus"], attrs["cnm_tasklets"], attrs["cnm_block_bytes"]) == (1, 11, 368)
    # 1002 int32 = 4008 B per region, 3 regions
    assert attrs["cnm_mram_bytes"] == 3 * 4008
    # options are checked once, against the schema, before any pass or device sees them
    for bad in ({"upmem_tasklets": 25}, {"upmem_tasklets": 0}, {"upmem_dpus": 0},
                {"upmem_dpus": "8"}, {"upmem_tasklets": True}):
        with pytest.raises(CinmError, match="upmem_"):
            check_options(bad)
        with pytest.raises(CinmError, match="upmem_"):
            PassManager(pipeline=["cnm_mapping"]).run(pw.build("VA", "int32", "small"),
                                                       PassContext(options=bad))


def test_v1b_target_limits_tasklets_and_wram():
    """v1B DPUs (upmem/llvm-project DPUCharacteristics.h: 16 threads, 63,488 B of WRAM).
    VA of 47,104 int32 on 4 DPUs, 16 tasklets, 2 buffers each, 2,048 B reserved and 1,024 B of
    stack per tasklet: v1A block (65,536 - 2,048 - 16,384) / 32 = 1,472 B; v1B (63,488 - 2,048
    - 16,384) / 32 = 1,408 B."""
    dev = get_device("upmem")
    a = dev.plan(_va(47104), {"upmem_dpus": 4})
    b = dev.plan(_va(47104), {"upmem_dpus": 4, "upmem_target": "v1b"})
    assert (a.tasklets, a.block_bytes, b.tasklets, b.block_bytes) == (16, 1472, 16, 1408)
    assert b.params.frequency_hz == 400e6 and b.params.wram_bytes == 63488
    # 20 tasklets: a v1A DPU runs them, a v1B one cannot (a kernel would not link)
    assert dev.plan(_va(47104), {"upmem_tasklets": 20}).tasklets == 20
    with pytest.raises(CinmError, match="upmem_tasklets=20.*1..16"):
        dev.plan(_va(47104), {"upmem_tasklets": 20, "upmem_target": "v1b"})
    with pytest.raises(CinmError, match="upmem_tasklets=20.*1..16"):  # a cross-option check
        check_options({"upmem_tasklets": 20, "upmem_target": "v1b"})
    with pytest.raises(CinmError, match="1..16"):
        make_plan(_va(64), 1, 17, params=dev.target({"upmem_target": "v1b"}))
    with pytest.raises(CinmError, match="upmem_target='v2': expected one of v1a, v1b"):
        check_options({"upmem_target": "v2"})


def test_v1b_target_from_the_command_line(tmp_path, capsys):
    import onnx

    from onnx_cinm.cli import main

    out = tmp_path / "va.onnx"
    onnx.save(pw.build("VA", "int32", "small"), tmp_path / "in.onnx")
    assert main(["optimize", str(tmp_path / "in.onnx"), "-o", str(out), "--place", "*=upmem",
                 "--upmem-target", "v1b", "-q"]) == 0
    with pytest.raises(SystemExit) as e:   # a usage error, as --upmem-tasklets 25 is
        main(["optimize", str(tmp_path / "in.onnx"), "-o", str(tmp_path / "bad.onnx"),
              "--place", "*=upmem", "--upmem-target", "v1b", "--upmem-tasklets", "20", "-q"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "1..16" in err and err.count("\n") == 1 and not (tmp_path / "bad.onnx").exists()


def test_pass_is_registered():
    i = DEFAULT_PIPELINE.index("cim_tiling")
    assert DEFAULT_PIPELINE[i + 1] == "cnm_mapping"
    # the paradigm level ends with the cnm mapping; the device level adds costs and kernels
    assert STOP_LEVELS["paradigm"] == "cnm_mapping"
    assert STOP_LEVELS["device"] == "device_lowering" == DEFAULT_PIPELINE[i + 2]


def test_plan_attributes_on_optimized_model():
    model = pw.build("VA", "int32", "small")           # 1001 int32
    res = onnx_cinm.optimize(model, place=[("*", "upmem")])
    (node,) = [n for n in res.model.graph.node if n.domain == "cinm"]
    a = _attrs(node)
    d = a["cnm_dpus"]
    per = -(-1001 // d)
    per += per % 2                                     # two int32 per 8 bytes
    assert 1 <= d <= 64 and a["cnm_tasklets"] == 16
    assert a["cnm_mram_bytes"] == 3 * per * 4
    share = -(-per * 4 // 16)                          # one tasklet's bytes, rounded up to 8
    assert a["cnm_block_bytes"] == min(1472, -(-share // 8) * 8)
    assert a["cnm_inputs"] == [b"a:scatter", b"b:scatter"]
    assert a["cnm_merge"] == b"none"
    assert a["cnm_latency_s"] > 0 and a["cnm_energy_j"] > 0
    assert a["kernel"].decode().startswith("upmem/")
    feeds = pw.random_inputs(model)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(res.model.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])


def test_the_provider_reports_the_one_time_load_apart_from_inferences(tmp_path):
    """A Gemm with constant weights on UPMEM: the plan's ``cnm_load_s`` (its DPU program, 60 ms,
    plus the weights pushed once) is in the session's load profile, once, and never in the
    per-inference profile, which charges ``cnm_latency_s`` per run."""
    from onnx_cinm import artifacts
    from onnx_cinm.runtime.session import InferenceSession

    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", 6, [64, 32], rng.integers(-9, 9, (64, 32)).astype(np.int32).ravel())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "fc",
                          [helper.make_tensor_value_info("x", 6, [1, 64])],
                          [helper.make_tensor_value_info("y", 6, [1, 32])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = onnx_cinm.optimize(model, place=[("*", "upmem")])
    artifacts.save(res.model, tmp_path / "fc.onnx")
    (node,) = [n for n in res.model.graph.node if n.domain == "cinm"]
    a = _attrs(node)
    assert a["cnm_load_s"] > 60e-3 and a["cnm_load_j"] > 0
    sess = InferenceSession(str(tmp_path / "fc.onnx"))
    x = rng.integers(-9, 9, (1, 64)).astype(np.int32)
    for _ in range(3):
        sess.run(None, {"x": x})
    (load,) = [r for r in sess.load_profile() if r["device"] == "upmem"]
    assert load["latency_s"] == pytest.approx(a["cnm_load_s"], rel=1e-6)
    runs = [r for r in sess.profile() if r["device"] == "upmem"]
    assert len(runs) == 3
    assert all(r["latency_s"] == pytest.approx(a["cnm_latency_s"], rel=1e-6) for r in runs)
    assert a["cnm_latency_s"] < a["cnm_load_s"]


def test_pass_options_reach_the_device():
    model = pw.build("RED", "int32", "small")          # 1003 int32 summed
    ctx = PassContext(options={"placement": "heuristic", "place": [("*", "upmem")],
                               "upmem_dpus": 1, "upmem_tasklets": 11})
    out = PassManager(stop_after="device").run(model, ctx)
    (node,) = [n for n in out.graph.node if n.domain == "cinm"]
    a = _attrs(node)
    # 1003 -> 1004 int32 = 4016 B on one DPU; 4016 / 11 = 365.1 -> 368-B blocks
    assert (a["cnm_dpus"], a["cnm_tasklets"], a["cnm_block_bytes"]) == (1, 11, 368)
    assert a["cnm_merge"] == b"tree"
    # X, then 11 tasklets' 8-byte partials
    assert a["cnm_mram_bytes"] == 4016 + 11 * 8
    assert ctx.stats["cnm_mapping"]["nodes"]["upmem"] == 1


@pytest.mark.parametrize("name", ["GEMV", "HST", "SCAN", "TRNS", "MLP"])
def test_workloads_keep_matching_onnxruntime(name):
    model = pw.build(name, "int32", "small")
    res = onnx_cinm.optimize(model, place=[("*", "upmem")])
    for n in res.model.graph.node:   # every op UPMEM accepted carries its plan
        if n.domain == "cinm" and _attrs(n).get("device") == b"upmem":
            assert {"cnm_dpus", "cnm_tasklets", "cnm_block_bytes", "kernel"} <= set(_attrs(n))
    feeds = pw.random_inputs(model)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = ort.InferenceSession(res.model.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_workload_script_writes_checked_models(tmp_path):
    assert pw.main(["--out", str(tmp_path), "--size", "small"]) == 0
    files = sorted(p.name for p in tmp_path.glob("*.onnx"))
    assert len(files) == len(pw.NAMES) * 2 and "hst_int32_small.onnx" in files
    prim = pw.build("VA", "float32", "prim")     # PrIM size: shapes only, a few hundred bytes
    assert prim.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 167_772_160
    assert prim.ByteSize() < 4096
    x = pw.random_inputs(pw.build("MLP", "int32", "small"))["h0"]
    assert (x < 0).any() and (x > 0).any()       # signed data, never all-positive


def test_upmem_plan_memo_keeps_each_ops_own_names():
    """Plans are memoized per op shape; an op of the same shape gets the plan with its own
    tensor names (the kernels bind their inputs by them) and errors name the op asked about,
    exactly as a fresh search gives them."""
    import numpy as np

    from onnx_cinm.graph import OpInfo, TensorInfo
    from onnx_cinm.devices.upmem import mapping
    from onnx_cinm.errors import CinmError

    def gemm(tag, rows=64):
        f = np.dtype("float32")
        ins = (TensorInfo(f"x{tag}", f, (rows, 128)), TensorInfo(f"w{tag}", f, (128, 32), True))
        return OpInfo(f"fc{tag}", "Gemm", {}, ins, (TensorInfo(f"y{tag}", f, (rows, 32)),),
                      2 * rows * 128 * 32)

    first, second = mapping.plan_op(gemm("a")), mapping.plan_op(gemm("b"))
    assert second == mapping._search_plan(gemm("b"), mapping.DEFAULT_DPUS,
                                          mapping.DEFAULT_TASKLETS, mapping.DEFAULT_PARAMS,
                                          mapping.STACK_BYTES, None)
    assert [e.split(":")[0] for e in second.inputs] == ["xb", "wb"]
    assert [e.split(":")[0] for e in first.inputs] == ["xa", "wa"]
    # a failure cached for one op names the other when it is asked
    for tag in ("c", "d"):
        with pytest.raises(CinmError) as e:
            mapping.plan_op(gemm(tag, rows=1 << 22), max_dpus=1)
        assert f"'fc{tag}'" in str(e.value)


@pytest.mark.parametrize("rows,k,n,kind", [(12544, 147, 64, "Gemm"), (196, 2304, 256, "Gemm"),
                                           (1, 1024, 1000, "Gemm"), (49, 1152, 32, "Gemm"),
                                           (3136, 1152, 32, "Gemm"), (7, 1728, 320, "Gemm"),
                                           (1 << 20, 0, 0, "Add"), (200704, 0, 0, "Relu"),
                                           (37, 0, 0, "Mul"), (401408, 0, 128, "Mul"),
                                           (56, 3, 1, "Im2Col"), (14, 1, 512, "Im2Col"),
                                           (7, 3, 2, "Im2Col"), (112, 3, 3, "Im2Col")])
def test_the_pruned_plan_search_picks_what_planning_every_workgroup_picks(rows, k, n, kind):
    """The search plans workgroups in the order of their closed-form lower bounds (one
    launch, gathering the result, sending A, the instructions of all tasklets at one per
    cycle and of the busiest at one per issue interval) until a bound exceeds the least
    latency found: it must choose the plan an exhaustive search chooses (every workgroup
    planned and costed, the first of the fastest in DPU order, as before the bounds), and no
    bound may exceed a plan's modeled latency. Im2Col cases: ``rows`` the image side, ``k``
    the kernel side, ``n`` the channels (a 3x3 kernel on 56x56x1 is the tasklet-chain case:
    few rows per DPU)."""
    from onnx_cinm.devices.upmem import mapping

    f = np.dtype("float32")
    if kind == "Gemm":
        ins = (TensorInfo("x", f, (rows, k)), TensorInfo("w", f, (k, n), True))
        op = OpInfo("g", "Gemm", {}, ins, (TensorInfo("y", f, (rows, n)),), 2 * rows * k * n)
    elif kind == "Im2Col":
        attrs = {"kernel_shape": [k, k], "strides": [1, 1], "pads": [k // 2] * 4,
                 "dilations": [1, 1]}
        side = rows
        ins = (TensorInfo("x", f, (1, n, side, side)),)
        op = OpInfo("c", "Im2Col", attrs, ins,
                    (TensorInfo("y", f, (side * side, n * k * k)),), 0)
    else:
        # n > 0: a per-channel operand of n values, broadcast to every DPU
        b = TensorInfo("b", f, (n,) if n else (rows,), bool(n)) if kind != "Relu" else None
        ins = (TensorInfo("a", f, (rows,)),) + ((b,) if b else ())
        op = OpInfo("e", kind, {}, ins, (TensorInfo("y", f, (rows,)),), rows)
    args = (mapping.DEFAULT_TASKLETS, "cinm", mapping.DEFAULT_PARAMS, mapping.STACK_BYTES)
    combos = mapping.workgroups(op)
    bounds = mapping._floor_s(op, mapping.DEFAULT_TASKLETS, mapping.DEFAULT_PARAMS)(combos)
    best, best_lat = None, 0.0
    for (d, dc), bound in zip(combos, bounds):
        try:
            p = make_plan(op, d, *args, dc)
        except CinmError:
            assert kind == "Gemm" and bound == np.inf  # no such grid
            continue
        lat = p.cost().latency_s
        assert bound <= lat
        if best is None or lat < best_lat * (1 - 1e-9):
            best, best_lat = p, lat
    assert mapping._search_plan(op, mapping.DEFAULT_DPUS, mapping.DEFAULT_TASKLETS,
                                mapping.DEFAULT_PARAMS, mapping.STACK_BYTES, None) == best


def test_the_array_forms_of_the_transfer_times_and_the_product_tiles_agree_with_the_scalar_ones():
    """The lower bounds of a matrix product's workgroups are computed over arrays
    (``UpmemParams.push_s_array`` and its kin, ``mapping._matmul_tiles_array``,
    ``_matmul_busiest_array``): each must give what the scalar function the cost model uses
    gives, for byte counts across the host's small/large-chunk knee and DPU counts within,
    at and across ranks, and for row and column counts on both sides of the tasklet count."""
    from onnx_cinm.devices.upmem import mapping
    from onnx_cinm.devices.upmem.cost import TARGETS

    dpus = np.array([1, 2, 3, 63, 64, 65, 100, 128, 511, 512, 2048, 2560], dtype=np.int64)
    for params in TARGETS.values():
        for b in (0, 8, 1000, 65536, 65544, 1 << 22):
            nb = np.full(len(dpus), b, dtype=np.int64)
            for to in (True, False):
                assert params.push_s_array(nb, dpus, to) == pytest.approx(
                    [params.push_s(b, int(d), to) for d in dpus], rel=1e-12, abs=0)
            assert params.broadcast_s_array(nb, dpus) == pytest.approx(
                [params.broadcast_s(b, int(d)) for d in dpus], rel=1e-12, abs=0)
        assert params.launch_overhead_s_array(dpus) == pytest.approx(
            [params.launch_overhead_s(int(d)) for d in dpus], rel=1e-12, abs=0)
    rows = np.array([r for r in (1, 2, 3, 4, 5, 7, 15, 16, 17, 49, 3136) for _ in range(7)])
    cols = np.array([1, 2, 7, 8, 33, 64, 1000] * 11)
    for kind, es, t, batched in (("gemm", 4, 16, False), ("gemv", 4, 16, False),
                                 ("gemm", 1, 11, False), ("gemm", 8, 24, True)):
        arrays = mapping._matmul_tiles_array(kind, rows, cols, es, t, batched)
        busy = mapping._matmul_busiest_array(rows, t, *arrays)
        for j, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
            tiles = mapping._matmul_tiles(kind, r, c, es, t, batched)
            assert tuple(int(a[j]) for a in arrays) == tiles
            r_t, _, _, n_t = mapping._matmul_busiest(r, t, *tiles)
            assert (int(busy[0][j]), int(busy[1][j])) == (r_t, n_t)
    # the grids of a product's workgroups: DPU counts and column splits, some without a grid
    from onnx_cinm.paradigms.cnm import distribution as D
    units = np.array([u for u in (1, 2, 6, 8, 64, 2560) for _ in range(5)])
    splits = np.array([1, 2, 3, 8, 64] * 6)
    for r, c, batched in ((1, 1, False), (5, 2, False), (100, 8, False), (3000, 64, False),
                          (100, 8, True)):
        ok, dr, dc = mapping._grid_array(units, splits, r, c, batched)
        for j, (u, s) in enumerate(zip(units.tolist(), splits.tolist())):
            want = D.grid(u, s, r, c, batched)
            assert bool(ok[j]) == (want is not None)
            assert (int(dr[j]), int(dc[j])) == (want[:2] if want else (1, 1))


def test_workgroups_memo_keeps_each_ops_cap_and_limit():
    """mapping.workgroups remembers its list by the work items capped at the DPU limit: ops
    with more work than DPUs share it, smaller ops and other limits get their own (lists
    written out by hand: powers of two below the limit, the limit, none above the work)."""
    from onnx_cinm.devices.upmem.mapping import workgroups
    big = OpInfo("a", "Relu", {}, (_t("x", [1 << 20]),), (_t("y", [1 << 20]),))
    other_big = OpInfo("b", "Relu", {}, (_t("x", [3 << 20]),), (_t("y", [3 << 20]),))
    small = OpInfo("c", "Relu", {}, (_t("x", [10]),), (_t("y", [10]),))  # 40 B: 5 words
    assert workgroups(big, 2048) == [(1 << i, 1) for i in range(12)]
    assert workgroups(other_big, 2048) == [(1 << i, 1) for i in range(12)]
    assert workgroups(big, 100) == [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (32, 1), (64, 1),
                                    (100, 1)]
    assert workgroups(small, 2048) == [(1, 1), (2, 1), (4, 1), (5, 1)]
    assert workgroups(small, 4) == [(1, 1), (2, 1), (4, 1)]
    assert workgroups(big, 2048, dpus=24) == [(24, 1)]
    workgroups(big, 2048).append((0, 0))  # a caller's list is its own
    assert workgroups(big, 2048)[-1] == (2048, 1)
