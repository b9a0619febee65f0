"""Sweeps: 12 configurations of light ResNet50, in local worker processes and on a Dask cluster."""
from __future__ import annotations

import csv
import math

import pytest

from onnx_cinm import optimize, sweep
from onnx_cinm.cli import main
from onnx_cinm.dialects import cinm
from onnx_cinm.errors import CinmError

SETS = ["crossbar.size=32x32,64x64,128x128", "crossbar.count=4,16,64,256"]
COMMON = ["--placement", "cost", "--objective", "energy", "--host-roofline", "nominal", "-q"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check(rows):
    assert len(rows) == 12
    combos = [(r["crossbar.size"], r["crossbar.count"]) for r in rows]
    assert combos == [(s, c) for s in ("32x32", "64x64", "128x128") for c in ("4", "16", "64", "256")]
    for r in rows:
        assert math.isfinite(float(r["latency_s"])) and float(r["energy_j"]) > 0
        assert r["violations"] == ""   # cost placement keeps every budget


@pytest.fixture(scope="module")
def resnet(light_model_paths):
    return str(light_model_paths["resnet50"])


@pytest.fixture(scope="module")
def local_rows(resnet, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep_local")
    argv = ["sweep", resnet, *sum((["--set", s] for s in SETS), []), "-o", str(out),
            "--workers", "2", *COMMON]
    assert main(argv) == 0
    assert (out / "sweep.png").stat().st_size > 0
    return _rows(out / "sweep.csv")


def test_local_sweep(local_rows, resnet):
    _check(local_rows)
    # one configuration compiled directly: its plans' tile writes are the row's writes
    r = optimize(resnet, placement="cost", objective="energy", host_roofline="nominal", check=0,
                 device_options={"cim_rows": 128, "cim_cols": 128, "cim_crossbars": 64})
    writes = sum(cinm.node_attrs(n).get("cim_writes", 0) for n in r.model.graph.node if n.domain == cinm.DOMAIN)
    row = next(x for x in local_rows if x["crossbar.size"] == "128x128" and x["crossbar.count"] == "64")
    assert int(row["writes"]) == writes
    # more crossbars never make the energy-optimal placement worse (a superset of choices)
    for size in ("32x32", "64x64", "128x128"):
        e = [float(x["energy_j"]) for x in local_rows if x["crossbar.size"] == size]
        assert all(b <= a * (1 + 1e-9) for a, b in zip(e, e[1:])), (size, e)


def test_dask_sweep_matches_local(local_rows, resnet, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster:
        argv = ["sweep", resnet, *sum((["--set", s] for s in SETS), []), "-o", str(tmp_path),
                "--executor", "dask", "--scheduler", cluster.scheduler_address, *COMMON]
        assert main(argv) == 0
    rows = _rows(tmp_path / "sweep.csv")
    _check(rows)
    for a, b in zip(rows, local_rows):
        assert float(a["energy_j"]) == pytest.approx(float(b["energy_j"]), rel=1e-12)
        assert a["writes"] == b["writes"] and a["devices"] == b["devices"]


def test_bad_sweeps(tmp_path, capsys):
    with pytest.raises(CinmError, match="unknown sweep key"):
        sweep.parse_sets(["crossbar.colour=red"])
    with pytest.raises(CinmError, match="^crossbar.size: expected ROWSxCOLS such as 64x64, got '64'"):
        sweep.parse_sets(["crossbar.size=64"])
    with pytest.raises(CinmError, match="twice"):
        sweep.parse_sets(["upmem.dpus=1", "upmem.dpus=2"])
    # two keys for one option: the last one silently won (--cim-size beside --cim-rows alike)
    with pytest.raises(CinmError, match="^sweep keys 'cim.rows' and 'crossbar.size' both set "
                                        "option cim_rows: give one of them$"):
        sweep.parse_sets(["cim.rows=128", "crossbar.size=64x64"])
    assert len(sweep.configurations(sweep.parse_sets(["upmem.dpus=1,2,3", "crossbar.count=4,8"]))) == 6
    with pytest.raises(SystemExit) as e:
        main(["sweep", "x.onnx", "--set", "upmem.tasklets=99", "-o", str(tmp_path / "s")])
    assert e.value.code == 2 and not (tmp_path / "s").exists()
    capsys.readouterr()
    assert main(["sweep", str(tmp_path / "none.onnx"), "--set", "upmem.dpus=1", "-o", str(tmp_path / "s")]) == 1
    assert capsys.readouterr().err.count("\n") == 1 and not (tmp_path / "s").exists()


def test_a_rejected_configuration_says_so_instead_of_nan(tmp_path, capsys):
    """A configuration a device refuses printed 'nan s  nan J  -1' beside the error."""
    assert main(["sweep", "--example", "lenet", "--set", "upmem.target=v1a,v1b", "--set",
                 "upmem.tasklets=24", "-o", str(tmp_path / "sw"), "--executor", "serial"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "tasklets=24" in line]
    assert len(rows) == 2 and "nan" not in " ".join(rows)
    assert rows[1].split()[:4] == ["target=v1b", "tasklets=24", "rejected", "-"]
    assert rows[1].rstrip().endswith("option upmem_tasklets=24: a v1b DPU runs 1..16 tasklets")
    assert "rejected" not in rows[0]
    # the CSV: no figure for a rejected row, all alike (writes and bytes said -1 beside NaN)
    import csv

    rec = list(csv.DictReader(open(tmp_path / "sw" / "sweep.csv")))
    assert [rec[1][k] for k in ("latency_s", "energy_j", "writes", "transfer_bytes")] == ["nan"] * 4
    assert rec[0]["writes"] == "0" and int(rec[0]["transfer_bytes"]) > 0
    # and a missing parent of -o is refused before the sweep runs, not after it
    assert main(["sweep", "--example", "lenet", "--set", "upmem.target=v1a", "-o",
                 str(tmp_path / "no" / "sw"), "--executor", "serial", "-q"]) == 1
    assert "folder '" + str(tmp_path / "no") + "' does not exist" in capsys.readouterr().err


def test_a_repeated_value_runs_once_with_a_note(tmp_path, capsys):
    """`--set cim.rows=64,64` ran the same configuration twice, silently (finding 7); values
    spelled apart but giving the same options (64x64, 64X64) are one configuration too."""
    notes: list = []
    assert sweep.parse_sets(["cim.rows=64,64,32"], notes) == [("cim.rows", ["64", "32"])]
    assert sweep.parse_sets(["crossbar.size=64x64,64X64"], notes) == [("crossbar.size", ["64x64"])]
    assert notes == [
        "sweep key 'cim.rows': 64 repeats an earlier value; each configuration runs once",
        "sweep key 'crossbar.size': 64X64 repeats an earlier value; each configuration runs once"]
    assert main(["sweep", "--example", "mlp", "--set", "upmem.dpus=8,8", "-o",
                 str(tmp_path / "sw"), "--executor", "serial"]) == 0
    out, err = capsys.readouterr()
    assert "onnx-cinm: note: sweep key 'upmem.dpus': 8 repeats an earlier value" in err
    assert "1 configurations" in out and len(_rows(tmp_path / "sw" / "sweep.csv")) == 1


def test_an_example_is_named_as_such_not_as_a_file(tmp_path, capsys, monkeypatch):
    """`sweep --example lenet` titled its table and plot 'lenet.onnx', a file that does not
    exist."""
    titles = []
    real = sweep.plot
    monkeypatch.setattr(sweep, "plot", lambda c, r, title="": titles.append(title) or real(c, r, title))
    assert main(["sweep", "--example", "mlp", "--set", "upmem.dpus=8", "-o",
                 str(tmp_path / "sw"), "--executor", "serial"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("onnx-cinm sweep: example 'mlp', 1 configurations")
    assert titles == ["example 'mlp'"] and "mlp.onnx" not in out


def test_sweep_counts_the_devices_of_the_model_optimize_writes():
    """A crossbar product read by a Transpose: placement puts 3 cinm ops (the Transpose on the
    host), then fold_layouts has the crossbar write the transposed layout and drops it. The
    sweep's devices column counted placement's 3 (khmersm: host 62 against optimize's 59);
    it must count the 2 cinm ops of the written model, as optimize does."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    w = nh.from_array(np.random.default_rng(0).uniform(-1, 1, (256, 256)).astype(np.float32), "W")
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["p"], name="mm"),
                      h.make_node("Transpose", ["p"], ["t"], perm=[1, 0], name="tr"),
                      h.make_node("Relu", ["t"], ["y"], name="relu")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [64, 256])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [256, 64])], [w])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    written = optimize(model, check=0, host_roofline="nominal").model
    ops = [(n.op_type, cinm.node_attrs(n)["device"]) for n in written.graph.node
           if n.domain == cinm.DOMAIN]
    assert ops == [("Gemm", "memristor"), ("Relu", "host")]  # the Transpose folded away
    level, origins, _ = sweep._cinm_level(model, None, None)
    assert [n.op_type for n in level.graph.node] == ["Gemm", "Transpose", "Relu"]
    row = sweep.evaluate(level, {"host_roofline": "nominal"}, origins)
    assert row["devices"] == "host:1 memristor:1"


def _frames_model(path):
    """x[samples] reshaped into frames of 4 and multiplied by a 4 x 64 weight: onnxruntime
    cannot run it at samples=1 (1 is no whole frame)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "W")
    s = numpy_helper.from_array(np.array([-1, 4], np.int64), "s")
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]),
                           helper.make_node("MatMul", ["r", "W"], ["y"])], "frames",
                          [helper.make_tensor_value_info("x", f, ["samples"])],
                          [helper.make_tensor_value_info("y", f, ["frames", 64])], [w, s])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_dim_the_model_cannot_run_at_1_is_refused_not_swept(tmp_path, capsys):
    """Trial s29: sweep planned an unsized dim at 1 without a word, at a size the model cannot
    run (optimize refuses it); now refused, nothing written. Given a size, it sweeps; a dim
    taken as 1 where the model runs gets a note."""
    _frames_model(tmp_path / "f.onnx")
    out = tmp_path / "sw"
    assert main(["sweep", str(tmp_path / "f.onnx"), "--set", "cim.crossbars=16,64",
                 "-o", str(out), "--executor", "serial"]) == 1
    err = capsys.readouterr().err
    assert "does not run with samples at 1" in err and "--dim samples=SIZE" in err
    assert "Traceback" not in err and not out.exists()
    assert main(["sweep", str(tmp_path / "f.onnx"), "--set", "cim.crossbars=16,64",
                 "-o", str(out), "--executor", "serial", "--dim", "samples=4000"]) == 0
    assert "taken as 1" not in capsys.readouterr().err
    assert main(["sweep", "--example", "lenet", "--set", "cim.crossbars=16,64",
                 "-o", str(tmp_path / "l"), "--executor", "serial"]) == 0
    assert "note: symbolic dims taken as 1: batch" in capsys.readouterr().err


def test_a_drawn_shape_input_is_not_refused_and_the_callers_model_is_kept():
    """Reviewer s29: a model whose int64 input is a Reshape's shape runs at N=1 with fitting
    values (optimize accepts it), but random values fail: sweep must not refuse it as if the
    size did; and sweep.run with input_shapes must not rewrite the caller's ModelProto."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["m"]),
                           helper.make_node("Abs", ["s"], ["a"]),
                           helper.make_node("Reshape", ["m", "a"], ["y"])], "shape_in",
                          [helper.make_tensor_value_info("x", f, ["N", 4]),
                           helper.make_tensor_value_info("s", i64, [2])],
                          [helper.make_tensor_value_info("y", f, None)], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    _, results = sweep.run(model, [("cim.crossbars", ["4", "8"])], executor="serial",
                           input_shapes={"s": [2]})
    assert len(results) == 2 and all(r.get("latency_s", 0) > 0 for r in results)
    assert model.SerializeToString() == before
    assert onnx.load_from_string(before).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_sweep_places_ops_by_hint_and_says_when_a_swept_device_runs_nothing(tmp_path, capsys):
    """A trial swept upmem.dpus over three values and got three identical rows with no word
    why (no op was on the DPUs) and no way to put one there (sweep had no --place). With
    --place the hint holds in every configuration, the ONNX op type included (Conv: LeNet's
    conv1 and conv2, each an Im2Col and a Gemm); without it a note says the sweep of that key
    changed nothing."""
    def rows(folder):
        with open(folder / "sweep.csv", newline="") as f:
            return list(csv.DictReader(f))

    assert main(["sweep", "--example", "lenet", "--set", "upmem.dpus=64,256", "--executor", "serial",
                 "-o", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "no configuration placed an op on upmem: sweeping upmem.dpus changed nothing" in err
    assert all("upmem" not in r["devices"] for r in rows(tmp_path / "a"))
    assert main(["sweep", "--example", "lenet", "--set", "upmem.dpus=64,256", "--executor", "serial",
                 "--place", "Conv=upmem", "-o", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "changed nothing" not in err and "matched no cinm op" not in err
    got = rows(tmp_path / "b")
    # LeNet's two Convs, each an Im2Col and a Gemm on the DPUs (restore_host_ops keeps a hinted
    # group as the hint put it)
    assert [r["devices"].split()[-1] for r in got] == ["upmem:4", "upmem:4"]
    assert float(got[0]["latency_s"]) != float(got[1]["latency_s"])  # the DPU count tells now
    # LeNet has no MatMul: the hint's warning once (not per configuration), and the note
    # does not tell the user to do what they did
    assert main(["sweep", "--example", "lenet", "--set", "upmem.dpus=64,256", "--executor", "serial",
                 "--place", "MatMul=upmem", "-o", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: hint MatMul=upmem matched no cinm op") == 1
    assert "changed nothing (the --place hints for it placed none)" in err
    # every configuration rejected: no figures to say anything changed or not of
    assert main(["sweep", "--example", "lenet", "--set", "upmem.tasklets=20,24", "--executor",
                 "serial", "--upmem-target", "v1b", "--place", "Conv=upmem",
                 "-o", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    assert "changed nothing" not in err
    assert all(r["violations"].startswith("error: ") for r in rows(tmp_path / "d"))


def test_a_swept_key_that_changes_no_figure_is_named():
    """Rows equal wherever only key 'a' differs: 'a' changed nothing; 'b' changed the energy of
    one pair; a rejected row and the compile time are not compared; a key of one value is no
    sweep. (A trial swept cim.mode and cim.time_s, got six identical rows and no word.)"""
    from onnx_cinm import sweep

    def row(e, seconds=0.1):
        return {"latency_s": 1e-3, "energy_j": e, "writes": 0, "transfer_bytes": 8,
                "devices": "host:1", "violations": "", "branches": "", "seconds": seconds}

    sets = [("a", ["x", "y"]), ("b", ["1", "2"]), ("c", ["only"])]
    configs = sweep.configurations(sets)
    assert [tuple(c.values()) for c in configs] == [("x", "1", "only"), ("x", "2", "only"),
                                                     ("y", "1", "only"), ("y", "2", "only")]
    results = [row(1.0, 0.1), row(2.0, 0.2), row(1.0, 0.3), row(2.0, 0.4)]
    assert sweep.unchanged_keys(sets, configs, results) == ["a"]
    rejected = dict(row(float("nan")), latency_s=float("nan"), violations="error: no fit")
    assert sweep.rejection(rejected)
    # a rejected row (no figures) is not compared: 'a' still changed nothing
    assert sweep.unchanged_keys(sets, configs, results[:3] + [rejected]) == ["a"]
    results[3] = row(3.0)  # 'a' now changes the energy at b=2
    assert sweep.unchanged_keys(sets, configs, results) == []
    assert sweep.unchanged_keys(sets, configs[:1], results[:1]) == []


def test_run_time_keys_are_those_that_set_only_run_options():
    """cim.mode and cim.time_s set what the crossbar kernels take when they run (the device's
    run options), no cost; cim.rows sizes the crossbars, a cost."""
    from onnx_cinm import sweep

    assert sweep.run_time_key("cim.mode", "q8") and sweep.run_time_key("cim.time_s", "1")
    assert not sweep.run_time_key("cim.rows", "64")
