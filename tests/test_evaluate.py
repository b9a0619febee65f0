"""``onnx-cinm evaluate`` and :mod:`onnx_cinm.runtime.evaluate`: accuracy under device effects
over time, against onnxruntime on the original model and the drift law of the field notes.

Every crossbar model here names its chip preset (pcm-occ), so the tests do not depend on the
default preset.
"""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_cinm import artifacts
from onnx_cinm.cli import main
from onnx_cinm.errors import CinmError
from onnx_cinm.pipeline import optimize
from onnx_cinm.runtime import session as session_mod
from onnx_cinm.runtime.evaluate import Evaluator, Point

PRESET = {"cim_preset": "pcm-occ"}
#: pcm-occ's device model (pcm-joshi2020, chips.md §2.1): t0 = 20 s; every programmed cell of
#: a 2-bit slice sits at x >= 1/3, where mu_nu and sigma_nu are at their lower clips
T0, MU_NU, SD_NU = 20.0, 0.049, 0.008
YEAR = 365.25 * 86400.0


@pytest.fixture(scope="module")
def digits_files(digits_mlp, tmp_path_factory):
    """The digits MLP with its three MatMuls on pcm-occ crossbars (planned at batch 256, so
    each has enough work for a tile), its test set as an .npz, and the original model."""
    d = tmp_path_factory.mktemp("evaluate")
    res = optimize(digits_mlp.model, check=0, place=[("Gemm", "memristor")],
                   device_options=PRESET, dims={"batch": 256})
    path = d / "digits.onnx"
    artifacts.save(res.model, path)
    data = d / "digits.npz"
    np.savez(data, X=digits_mlp.X_test, labels=digits_mlp.y_test)
    original = d / "original.onnx"
    onnx.save(digits_mlp.model, original)
    return path, data, original


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    got = capsys.readouterr()
    assert got.err == ""  # no progress bar in a pipe
    return json.loads(got.out)


def test_three_crossbar_kernels(digits_files):
    sess = session_mod.InferenceSession(str(digits_files[0]))
    assert [k for k, _ in sess.partitions()].count("memristor") == 3


def test_ideal_accuracy_is_onnxruntime_on_the_original(digits_files, digits_mlp, capsys):
    path, data, original = digits_files
    # the reference: stock onnxruntime on the original model, class = arg max of the
    # probabilities (the classes are 0..9, so the index is the label)
    probs = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(
        ["probabilities"], {"X": digits_mlp.X_test})[0]
    want = float(np.mean(np.argmax(probs, axis=1) == digits_mlp.y_test))
    out = _json(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "ideal",
                         "--seeds", "1", "--json"])
    assert [s["mean"] for s in out["summary"]] == [want]
    assert out["exact"] == want and out["samples"] == 450


def test_drift_costs_accuracy_and_compensation_recovers_it(digits_files, capsys, tmp_path):
    path, data, _ = digits_files
    png = tmp_path / "drift.png"
    out = _json(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                         "--cim-effects", "drift,gdc", "--times", "1s,1y", "--seeds", "1",
                         "--plot", str(png), "--json"])
    acc = {(s["value"], s["compensation"]): s["mean"] for s in out["summary"]}
    assert set(acc) == {(1.0, False), (1.0, True), (YEAR, False), (YEAR, True)}
    fresh, drifted, compensated = acc[1.0, False], acc[YEAR, False], acc[YEAR, True]
    # a year of drift shrinks every conductance to about half (chips.md §2.1: 0.49 at
    # nu = 0.05): the logits shrink against the digital biases and predictions change; global
    # compensation scales the tiles back, leaving only the spread of nu
    assert drifted < fresh - 0.01, acc
    assert compensated - drifted >= 0.5 * (fresh - drifted), acc
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_for_people(digits_files, capsys):
    path, data, _ = digits_files
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                 "--cim-effects", "drift", "--times", "1h", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "450 samples" in out and "exact run (onnxruntime, reference bodies): accuracy" in out
    # the majority-class baseline (a trial's drifted detector scored exactly it), counted
    # with numpy from the labels the evaluation reads
    labels = np.load(data)["labels"]
    vals, counts = np.unique(labels, return_counts=True)
    k = int(np.argmax(counts))
    assert (f"most frequent class, {vals[k]}, holds {counts[k]} of {len(labels)} samples: "
            f"always answering it scores {100 * counts[k] / len(labels):.2f} %") in out
    rows = [line.split() for line in out.splitlines() if line.startswith("1 h")]
    assert [r[2] for r in rows] == ["off", "on"] and all(r[-1] == "1" for r in rows)


def test_adc_and_stuck_at_sweeps(digits_files, capsys):
    path, data, _ = digits_files
    out = _json(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                         "--cim-effects", "none", "--adc-bits", "3,8", "--stuck-at", "0,0.05",
                         "--seeds", "2", "--json"])
    assert len(out["records"]) == 8  # (2 widths + 2 rates) x 2 seeds
    acc = {(s["sweep"], s["value"]): s for s in out["summary"]}
    assert acc["adc_bits", 3]["mean"] < acc["adc_bits", 8]["mean"] - 0.02
    # 5 % of the cells stuck at 0 and 5 % at g_max, on every slice of every weight
    assert acc["stuck_at", 0.05]["max"] < acc["stuck_at", 0.0]["min"] - 0.05
    # without draws (no effect but quantization), every seed gives the same accuracy
    assert acc["stuck_at", 0.0]["min"] == acc["stuck_at", 0.0]["max"]


def _linear_model(tmp_path, rng):
    """``Y = X @ W``, ``W`` [256, 64] in [0.25, 1], on pcm-occ crossbars; positive inputs."""
    W = rng.uniform(0.25, 1.0, (256, 64)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 64])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, check=0, place=[("Gemm", "memristor")], device_options=PRESET,
                   dims={"batch": 64})
    path = tmp_path / "linear.onnx"
    artifacts.save(res.model, path)
    return path


def test_output_error_follows_the_drift_law(tmp_path):
    # no labels: the relative RMS error of Y against the exact run. Every programmed cell has
    # nu ~ |N(0.049, 0.008)| (chips.md §2.1 at x >= 1/3), so after t the outputs shrink by the
    # mean factor E[((t + t0) / t0)^-nu] = exp(-mu L + sd^2 L^2 / 2), L = ln((t + t0) / t0):
    # 0.500 after a year (the notes' table: 0.49 at nu = 0.05), and the error is 1 - that
    # (plus 8-bit quantization and the spread of nu, each under 1 %). Compensation rescales
    # each tile by its summed weight magnitude (a one-hot calibration read), leaving those.
    rng = np.random.default_rng(3)
    path = _linear_model(tmp_path, rng)
    X = rng.uniform(0.0, 1.0, (200, 256)).astype(np.float32)
    ev = Evaluator(str(path), {"X": X}, None, options={"cim_mode": "device",
                                                       "cim_effects": ("drift", "gdc")})
    assert ev.exact is None and ev.output_name == "Y"
    recs = {(p.value, p.compensation): ev.run(p)["rel_rms"]
            for p in ev.points(times=[1.0, YEAR], seeds=1)}

    def shrink(t):
        L = math.log((t + T0) / T0)
        return math.exp(-MU_NU * L + SD_NU ** 2 * L * L / 2)

    assert shrink(YEAR) == pytest.approx(0.500, abs=0.002)
    assert recs[YEAR, False] == pytest.approx(1 - shrink(YEAR), abs=0.02), recs
    assert recs[1.0, False] == pytest.approx(1 - shrink(1.0), abs=0.02), recs
    assert recs[YEAR, True] < 0.03, recs


def test_batches_follow_the_model(digits_files, digits_mlp, monkeypatch):
    path, _, _ = digits_files
    sizes = []
    real = session_mod.InferenceSession.run

    def spy(self, names, feed, *a):
        sizes.append(len(feed["X"]))
        return real(self, names, feed, *a)

    monkeypatch.setattr(session_mod.InferenceSession, "run", spy)
    ev = Evaluator(str(path), {"X": digits_mlp.X_test}, digits_mlp.y_test, batch=100)
    sizes.clear()
    ev.run(Point("compiled", None, None, 0))
    assert sizes == [100, 100, 100, 100, 50]


def _error(capsys, argv, code=1) -> str:
    if code == 2:  # a usage error: argparse exits
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    else:
        assert main(argv) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line(digits_files, digits_mlp, capsys, tmp_path):
    path, data, original = digits_files
    ev = ["evaluate", str(path), "--data"]
    assert "No such file" in _error(capsys, ev + [str(tmp_path / "none.npz")])
    np.savez(tmp_path / "other.npz", Y=digits_mlp.X_test, labels=digits_mlp.y_test)
    assert "no array 'X'" in _error(capsys, ev + [str(tmp_path / "other.npz")])
    np.savez(tmp_path / "short.npz", X=digits_mlp.X_test, labels=digits_mlp.y_test[:10])
    assert "must be [450]" in _error(capsys, ev + [str(tmp_path / "short.npz")])
    assert "no array 'y'" in _error(capsys, ev + [str(data), "--labels", "y"])
    # an array that is no input (and not the labels) is refused, as optimize --input refuses it
    np.savez(tmp_path / "extra.npz", X=digits_mlp.X_test, labels=digits_mlp.y_test,
             bogus=digits_mlp.X_test)
    err = _error(capsys, ev + [str(tmp_path / "extra.npz")])
    assert "the data's array 'bogus' is not an input of the model (inputs: X)" in err
    np.savez(tmp_path / "y.npz", X=digits_mlp.X_test, y=digits_mlp.y_test)  # labels by another name
    assert "name it with --labels y" in _error(capsys, ev + [str(tmp_path / "y.npz")])
    # the original model has no crossbar kernels: nothing to evaluate
    assert "nothing to evaluate" in _error(capsys, ["evaluate", str(original), "--data",
                                                    str(data)])
    # time after programming under the exact data path
    assert "mode 'ideal' has no time" in _error(capsys, ev + [str(data), "--cim-mode", "ideal",
                                                              "--times", "1h"])
    assert "--times" in _error(capsys, ev + [str(data), "--times", "1h,3x"], code=2)
    assert "give --times" in _error(capsys, ev + [str(data), "--plot", str(tmp_path / "p.png")],
                                    code=2)
    assert not (tmp_path / "p.png").exists()


def test_saturated_adc_conversions_reach_the_profile(digits_files, digits_mlp):
    """The simulator counted ADC conversions that saturated, but no profile, table or note
    showed them (trial s31: a calibration on one unrepresentative first input clipped every
    later one, silently). With the full-scale rule a noiseless column never clips (mode.py,
    effect 6); calibrated on one sample, the next 64 go beyond its range."""
    from onnx_cinm.runtime import profile

    path, _, _ = digits_files
    one, many = digits_mlp.X_test[:1], digits_mlp.X_test[1:65]
    runs = {}
    for how in ("max", "data"):
        s = session_mod.InferenceSession(str(path), provider_options=[
            {"cim_mode": "device", "cim_effects": "none", "cim_adc_calibration": how}, {}])
        s.run(["probabilities"], {"X": one})
        s.run(["probabilities"], {"X": many})
        runs[how] = s.profile()
    assert not any(r.get("adc_clipped") for r in runs["max"])
    assert profile.clipped_note(runs["max"]) is None
    clipped = [r for r in runs["data"] if r.get("adc_clipped")]
    assert clipped and all(r["run"] == 1 for r in clipped)  # none on the calibrating run
    assert all(0 < r["adc_clipped"] <= r["adc_conversions"] for r in clipped)
    note = profile.clipped_note(runs["data"])
    total = sum(r["adc_clipped"] for r in clipped)
    kernels = {r["node"] for r in clipped}
    assert note.startswith(f"ADC: {total:,} conversions saturated in {len(kernels)} crossbar")
    assert f"of their {sum(r['adc_conversions'] for r in clipped):,} conversions" in note
    assert note in profile.table(runs["data"]) and "cim_adc_calibration=data" in note


def test_run_options_make_the_kernels_inexact(digits_files, digits_mlp):
    # compiled exact; the run option cim_mode=device makes compare report statistics, and the
    # device draws really run (the outputs move off onnxruntime's)
    path, _, _ = digits_files
    feed = {"X": digits_mlp.X_test[:64]}
    exact = session_mod.InferenceSession(str(path))
    dev = session_mod.InferenceSession(str(path), provider_options=[{"cim_mode": "device"}, {}])
    # the fixture's preset's device (pcm-joshi2020): programming noise sigma(x) = 0.26348 +
    # 1.9650 x - 1.1731 x^2 uS at g_max 25 uS (chips.md §2.1): 0.26348 / 25 = 1.1 % at x = 0
    # and 1.05538 / 25 = 4.2 % at x = 1
    assert exact.inexact_kernels() == []
    # the default effects stick no cells (MNSIM's rate is unsourced: by name only)
    assert dev.inexact_kernels() == ["crossbar data path device (pcm-joshi2020: programming "
                                     "noise of 1.1 to 4.2 % of g_max per cell, the published "
                                     "device model: a network not trained with them may not "
                                     "tolerate them; cim_effects=none leaves the quantization "
                                     "alone)"]
    # named, the stuck effect's 1e-3 of the cells at g_max (nonideal.EFFECTS): 0.1 %
    stuck = session_mod.InferenceSession(str(path), provider_options=[
        {"cim_mode": "device", "cim_effects": "prog,drift,read1f,gdc,irdrop,stuck"}, {}])
    assert stuck.inexact_kernels() == ["crossbar data path device (pcm-joshi2020: programming "
                                       "noise of 1.1 to 4.2 % of g_max per cell, the published "
                                       "device model; 0.1 % of cells stuck at g_max (MNSIM's "
                                       "rate, unsourced), each a full-scale weight: a network "
                                       "not trained with them may not tolerate them; "
                                       "cim_effects=none leaves the quantization alone)"]
    none = session_mod.InferenceSession(str(path), provider_options=[
        {"cim_mode": "device", "cim_effects": ""}, {}])
    assert none.inexact_kernels() == ["crossbar data path device"]
    # the run option cim_adc_calibration=data sets the ADC ranges from the first inference:
    # on that same batch the probabilities are closer to the exact ones than with the
    # full-scale rule (the fixture's 8-bit ADC on columns of up to 64 rows)
    cal = session_mod.InferenceSession(str(path), provider_options=[
        {"cim_mode": "device", "cim_effects": "none", "cim_adc_calibration": "data"}, {}])
    ref = exact.run(["probabilities"], feed)[0]
    err = {name: np.abs(s.run(["probabilities"], feed)[0] - ref).max()
           for name, s in (("max", none), ("data", cal))}
    assert 0 < err["data"] < err["max"], err
    assert not np.array_equal(exact.run(["probabilities"], feed)[0],
                              dev.run(["probabilities"], feed)[0])


@pytest.mark.parametrize("option, how", [
    ("cim_time_s=31536000", "use --times"),  # was shown in the header, then run at --times
    ("cim_seed=5", "use --seeds"),  # was shown, and seeds 0..N-1 were used
    ("cim_mode=ideal", "use --cim-mode"),  # lost silently against --cim-mode device
    ("cim_effects=drift", "use --cim-effects"),
    ("cim_drift_compensation=true", "--times runs each time with drift compensation off and on"),
    ("cim_adc_bits=4", "use --adc-bits"),
    ("cim_stuck_at=0.1", "use --stuck-at"),
])
def test_run_options_evaluate_sets_are_not_provider_options(digits_files, capsys, option, how):
    path, data, _ = digits_files
    err = _error(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                          "--times", "1s", "--seeds", "1", "--provider-option", option], code=2)
    assert f"--provider-option {option.split('=')[0]}: evaluate sets it itself; {how}" in err


def test_header_lists_the_run_options_applied(digits_files, capsys):
    path, data, _ = digits_files
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                 "--cim-effects", "drift", "--times", "1h", "--seeds", "1"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.endswith("; 1 seed(s); run options cim_mode=device, cim_effects=drift"), head


def test_a_time_needs_an_effect_that_depends_on_it(digits_files, capsys):
    # q8 has no drift: `--times 1y` used to print rows identical to the fresh chip's
    path, data, _ = digits_files
    ev = ["evaluate", str(path), "--data", str(data), "--seeds", "1", "--times", "1y"]
    err = _error(capsys, ev + ["--cim-mode", "q8"])
    assert "a time after programming changes nothing on mode 'q8' with effects none" in err
    err = _error(capsys, ev + ["--cim-mode", "device", "--cim-effects", "read,stuck"])
    assert "changes nothing on mode 'device' with effects read,stuck" in err
    # with drift it runs (q8 precision, the preset's drift)
    assert main(ev + ["--cim-mode", "q8", "--cim-effects", "drift", "--json"]) == 0
    assert [s["value"] for s in json.loads(capsys.readouterr().out)["summary"]] == [YEAR, YEAR]


def test_a_negative_time_is_read_as_a_value_and_refused(digits_files, capsys):
    # argparse took "-1s" for an option ("expected one argument")
    path, data, _ = digits_files
    for times in ("-1s", "1s,-1h"):
        err = _error(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                              "--times", times], code=2)
        assert f"argument --times: a time cannot be negative, got '{times.split(',')[-1]}'" in err


def test_a_fixed_batch_the_data_do_not_fill_is_padded(digits_mlp, tmp_path, capsys):
    # batch fixed at 64 (--overwrite-input-shape X:64,64), 450 samples: 7 batches, the last
    # one 2 short of full. evaluate refused it ("450 samples do not split into the model's
    # fixed batch of 64"); now it pads that batch with copies of its last sample and drops
    # their results: the exact accuracy is onnxruntime's on the original over the 450 samples
    res = optimize(digits_mlp.model, check=0, place=[("Gemm", "memristor")],
                   device_options=PRESET, input_shapes={"X": [64, 64]})
    path = tmp_path / "fixed.onnx"
    artifacts.save(res.model, path)
    data = tmp_path / "digits.npz"
    np.savez(data, X=digits_mlp.X_test, labels=digits_mlp.y_test)
    probs = ort.InferenceSession(digits_mlp.model.SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(
        ["probabilities"], {"X": digits_mlp.X_test})[0]
    want = float(np.mean(np.argmax(probs, axis=1) == digits_mlp.y_test))
    assert len(digits_mlp.y_test) % 64
    out = _json(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "ideal",
                         "--seeds", "1", "--json"])
    assert out["exact"] == want and out["samples"] == 450
    assert [s["mean"] for s in out["summary"]] == [want]


def test_progress_lines_in_a_pipe_are_rate_limited():
    """In a pipe (no terminal for a bar) evaluate printed nothing for minutes (finding 4):
    now a line on stderr at most every 15 s, with an estimate of the rest from the rate so far;
    none once everything is done."""
    import io

    from onnx_cinm.cli.cmd_evaluate import _Lines

    now = [0.0]
    out = io.StringIO()
    bar = _Lines(4, 25, clock=lambda: now[0], stream=out)  # 4 configurations of 25 samples
    for t, n in ((5.0, 10), (20.0, 10), (25.0, 10), (36.0, 30), (60.0, 40)):
        now[0] = t
        bar.update(n)
    # 20 of 100 at 20 s: 80 s (1.33 min) left at 1 per second; 60 at 36 s (16 s after the last line)
    assert out.getvalue().splitlines() == [
        ("onnx-cinm evaluate: 20/100 sample runs (25 samples x 4 configurations, 20%), 20 s "
         "elapsed, about 1.33 min left"),
        ("onnx-cinm evaluate: 60/100 sample runs (25 samples x 4 configurations, 60%), 36 s "
         "elapsed, about 24 s left")]


def test_evaluate_shows_progress_in_a_pipe(digits_files, capsys, monkeypatch):
    from onnx_cinm.cli import cmd_evaluate

    lines = cmd_evaluate._Lines
    monkeypatch.setattr(cmd_evaluate, "_Lines",
                        lambda configs, samples, **kw: lines(configs, samples, interval=0.0))
    path, data, _ = digits_files
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                 "--cim-effects", "drift", "--times", "1h", "--seeds", "1"]) == 0
    err = capsys.readouterr().err.splitlines()
    # 2 configurations (compensation off, on) x 450 samples in batches of 256 + 194
    assert [e.split(" sample runs")[0] for e in err] == [
        "onnx-cinm evaluate: 256/900", "onnx-cinm evaluate: 450/900", "onnx-cinm evaluate: 706/900"]
    assert all("(450 samples x 2 configurations, " in e for e in err)


def test_the_row_of_an_unswept_run_names_the_run_options(digits_files, capsys):
    """Trial: ``--cim-mode device`` with nothing swept was labelled 'as compiled' (the model
    was compiled ideal); the row now shows the options the runs had."""
    path, data, _ = digits_files
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
                 "--cim-effects", "read1f", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "as compiled" not in out
    assert any(line.startswith("cim_mode=device, cim_effects=read1f ") for line in out.splitlines()), out
    assert main(["evaluate", str(path), "--data", str(data), "--seeds", "1"]) == 0
    assert any(line.startswith("as compiled ") for line in capsys.readouterr().out.splitlines())


def test_data_of_another_dtype_are_refused_as_run_refuses_them(digits_files, tmp_path, capsys):
    """Trial: evaluate cast float64 data silently where run --input refuses them."""
    path, data, _ = digits_files
    with np.load(data) as d:
        x, y = d["X"], d["labels"]
    np.savez(tmp_path / "d64.npz", X=x.astype(np.float64), labels=y)
    assert main(["evaluate", str(path), "--data", str(tmp_path / "d64.npz")]) == 1
    assert capsys.readouterr().err.strip() == (
        "onnx-cinm: error: the data's array 'X' holds float64, but the model's input is "
        "float32 (convert it, e.g. numpy's a.astype(np.float32))")


def _clip_model(tmp_path):
    """madmom's key CNN in miniature: one clip ``X [T, 256]`` (frames on axis 0), a crossbar
    product per frame, then the mean over time: ``Y [24]``, one result per clip."""
    W = np.random.default_rng(5).uniform(0.25, 1.0, (256, 24)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["F"], name="mm"),
         helper.make_node("ReduceMean", ["F"], ["Y"], axes=[0], keepdims=0)], "clip",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["T", 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [24])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, check=0, place=[("Gemm", "memristor")], device_options=PRESET,
                   dims={"T": 64})
    path = tmp_path / "clip.onnx"
    artifacts.save(res.model, path)
    return path


def test_a_model_that_runs_one_sample_at_a_time_is_evaluated_at_batch_1(tmp_path):
    """x [n, 8] @ W on a crossbar, then a Reshape to the hard-coded [1, 4] (an exporter that
    traced batch 1): it runs on one sample only. At batch 1 it is evaluated (the exact
    accuracy: numpy's argmax of x @ W per sample against the labels); at batch 2 no run of
    two samples exists, so it is refused in one line."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((8, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["p"], name="mm"),
         helper.make_node("Reshape", ["p", "s"], ["y"], name="rs")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array([1, 4], np.int64), "s")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, place=[("mm*", "memristor")], device_options=PRESET, dims={"n": 1})
    path = tmp_path / "b1.onnx"
    artifacts.save(res.model, path)
    x = rng.standard_normal((10, 8)).astype(np.float32)
    labels = rng.integers(0, 4, 10)
    want = float(np.mean(np.argmax(x.astype(np.float64) @ W, axis=1) == labels))
    assert 0 < want < 1  # neither all right nor all wrong: the figure tells something
    assert Evaluator(str(path), {"x": x}, labels, batch=1).exact == want
    with pytest.raises(CinmError, match="does not run on 2 sample"):
        Evaluator(str(path), {"x": x}, labels, batch=2)


@pytest.mark.parametrize("frames", [401, 24, 2, 1])
def test_a_model_without_a_sample_axis_is_refused(tmp_path, capsys, frames):
    """Axis 0 is time, not samples: batches of 256 frames would be shorter clips, each judged
    as the data set. 24 frames (as many as Y's 24 values) and 1 frame included: the output
    [24] follows no count of samples fed."""
    path = _clip_model(tmp_path)
    X = np.random.default_rng(0).uniform(0, 1, (frames, 256)).astype(np.float32)
    # the model itself runs on the clip: onnxruntime gives one [24] result for all frames
    assert ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"X": X})[0].shape == (24,)
    np.savez(tmp_path / "clip.npz", X=X)
    err = _error(capsys, ["evaluate", str(path), "--data", str(tmp_path / "clip.npz")])
    assert "evaluate needs a sample axis" in err and "output 'Y' has shape [24]" in err
    # run one sample at a time, the one-frame probe still shows axis 0 is not samples
    err = _error(capsys, ["evaluate", str(path), "--data", str(tmp_path / "clip.npz"),
                          "--batch", "1"])
    assert "evaluate needs a sample axis" in err and "output 'Y' has shape [24]" in err


def _one_column_model(tmp_path):
    """A binary classifier with one sigmoid score per sample: ``Y = sigmoid(relu(X @ W1) @ w2)``
    ``[N, 1]``, X [N, 64], W1 [64, 32] on pcm-occ crossbars; its exact run is onnxruntime's."""
    rng = np.random.default_rng(3)
    W1 = rng.standard_normal((64, 32)).astype(np.float32) / 8
    w2 = rng.standard_normal((32, 1)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W1"], ["H"], name="mm1"),
         helper.make_node("Relu", ["H"], ["R"], name="relu"),
         helper.make_node("MatMul", ["R", "w2"], ["Z"], name="mm2"),
         helper.make_node("Sigmoid", ["Z"], ["Y"], name="sig")], "binary",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = optimize(model, check=0, place=[("Gemm", "memristor")], device_options=PRESET,
                   dims={"batch": 64})
    path = tmp_path / "binary.onnx"
    artifacts.save(res.model, path)
    X = rng.standard_normal((80, 64)).astype(np.float32)
    p = 1 / (1 + np.exp(-(np.maximum(X.astype(np.float64) @ W1, 0) @ w2[:, 0])))
    return path, X, p, rng


def test_a_one_column_output_is_refused_without_threshold(tmp_path, capsys):
    """The arg max of one column is always class 0: its 'accuracy' would be the share of
    label-0 samples, flat under any device effect (s24 trial #2). Refused in one line; with
    --threshold 0.5 the class is score > 0.5, the exact accuracy numpy's on the same rule."""
    path, X, p, rng = _one_column_model(tmp_path)
    labels = (p > 0.5).astype(np.int64)
    flip = rng.random(len(labels)) < 0.2  # some wrong, so the figure is neither 0 nor 1
    labels[flip] = 1 - labels[flip]
    assert 0 < labels.mean() < 1
    np.savez(tmp_path / "bin.npz", X=X, labels=labels)
    ev = ["evaluate", str(path), "--data", str(tmp_path / "bin.npz")]
    err = _error(capsys, ev)
    assert "one score column per class" in err and "has 1 column" in err
    assert "--threshold" in err and "share of label-0 samples" in err
    want = float(np.mean((p > 0.5) == labels))
    assert want not in (float(np.mean(labels == 0)), 0.0, 1.0)
    got = _json(capsys, ev + ["--threshold", "0.5", "--seeds", "1", "--json"])
    assert got["exact"] == pytest.approx(want, abs=1e-12)
    # a threshold of 0 on a probability: every sample is class 1
    got = _json(capsys, ev + ["--threshold", "0", "--seeds", "1", "--json"])
    assert got["exact"] == pytest.approx(float(np.mean(labels == 1)), abs=1e-12)
    # a third class cannot come from one threshold
    np.savez(tmp_path / "three.npz", X=X, labels=np.where(flip, 2, labels))
    err = _error(capsys, ["evaluate", str(path), "--data", str(tmp_path / "three.npz"),
                          "--threshold", "0.5"])
    assert "binary classifier" in err and "class(es) 2" in err
    # no labels: nothing to threshold
    np.savez(tmp_path / "nolab.npz", X=X)
    err = _error(capsys, ["evaluate", str(path), "--data", str(tmp_path / "nolab.npz"),
                          "--threshold", "0.5"])
    assert "--threshold" in err and "hold none" in err


def test_labels_beyond_the_score_columns_and_threshold_on_many_are_refused(
        digits_files, digits_mlp, capsys, tmp_path):
    path, data, _ = digits_files
    labels = digits_mlp.y_test.copy()
    labels[:3] = [10, 11, 10]  # 10 score columns: classes 0..9
    np.savez(tmp_path / "big.npz", X=digits_mlp.X_test, labels=labels)
    err = _error(capsys, ["evaluate", str(path), "--data", str(tmp_path / "big.npz"),
                          "--output", "probabilities"])
    assert "has 10 columns (classes 0..9)" in err and "class(es) 10, 11" in err
    err = _error(capsys, ["evaluate", str(path), "--data", str(data), "--threshold", "0.5",
                          "--output", "probabilities"])
    assert "one float score per sample" in err and "[450, 10]" in err
    # the integer output 'label' is a class already: nothing to threshold
    err = _error(capsys, ["evaluate", str(path), "--data", str(data), "--threshold", "0.5"])
    assert "one float score per sample" in err and "int64" in err


def test_a_missing_model_is_said_before_the_data_is_read(tmp_path, capsys, monkeypatch):
    """A fresh user, s27: evaluate loaded the --data archive before looking for the model, so a
    mistyped model name waited for the load (or got the data's error). The model is checked
    first: one line naming it, and the archive is never opened."""
    from onnx_cinm.cli import cmd_evaluate, main

    opened = []
    monkeypatch.setattr(cmd_evaluate, "_load_data", lambda path: opened.append(path) or {})
    code = main(["evaluate", str(tmp_path / "nope.onnx"), "--data", str(tmp_path / "d.npz")])
    err = capsys.readouterr().err
    assert code == 1 and err == f"onnx-cinm: error: no such file: '{tmp_path / 'nope.onnx'}'\n"
    assert opened == []


def test_no_effects_read_none_in_the_header_and_table():
    """`evaluate --cim-effects none` printed 'cim_effects=' with nothing after it (trial s31)."""
    from onnx_cinm.cli.cmd_evaluate import _show
    from onnx_cinm.runtime import evaluate as ev

    assert ev._value_text("compiled", None, {"cim_mode": "device", "cim_effects": ()}) == \
        "cim_mode=device, cim_effects=none"
    assert _show(()) == "none" and _show(("prog", "drift")) == "prog,drift"


def test_evaluate_says_when_adc_conversions_saturated(digits_files, capsys):
    """evaluate counted no saturated conversion anywhere, so a calibration on one
    unrepresentative first sample failed silently (review s31). With the full-scale rule and
    no device effect a column never saturates (mode.py, effect 6); calibrated on the first of
    samples run one at a time, the later ones go beyond its range."""
    path, data, _ = digits_files
    base = ["evaluate", str(path), "--data", str(data), "--cim-mode", "device",
            "--cim-effects", "none", "--seeds", "1", "--batch", "1"]
    out = _json(capsys, base + ["--json"])
    assert [r["adc_clipped"] for r in out["records"]] == [0]
    assert main(base) == 0
    assert "ADC: conversions saturated" not in capsys.readouterr().out
    out = _json(capsys, base + ["--cim-adc-calibration", "data", "--json"])
    clipped = out["records"][0]["adc_clipped"]
    assert clipped > 0
    assert main(base + ["--cim-adc-calibration", "data"]) == 0
    text = capsys.readouterr().out
    assert f"ADC: conversions saturated in 1 of 1 runs (most {clipped:,}, at " in text


def test_nan_outputs_are_counted_and_warned_about(digits_files, digits_mlp, capsys, tmp_path):
    """Features that are NaN in 7 of the samples (a broken extraction) make those samples'
    scores NaN, whose arg max is 0: the accuracy counts them as class-0 answers. evaluate now
    says so, with the counts (7 of 450 in the exact run and in each device run), as text and
    in --json; finite data get no such line."""
    path, _, _ = digits_files
    X = digits_mlp.X_test.copy()
    X[[0, 5, 9, 100, 200, 300, 449], 3] = np.nan
    data = tmp_path / "nan.npz"
    np.savez(data, X=X, labels=digits_mlp.y_test)
    judged = ["--output", "probabilities"]  # the scores (the label output is an int)
    out = _json(capsys, ["evaluate", str(path), "--data", str(data), "--cim-mode", "ideal",
                         "--seeds", "2", "--json", *judged])
    assert out["exact_nonfinite"] == out["data_nonfinite"] == 7
    assert [r["nonfinite"] for r in out["records"]] == [7, 7]
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "ideal",
                 "--seeds", "2", *judged]) == 0
    text = capsys.readouterr().out
    assert ("warning: the data hold NaN or Inf in 7 of 450 samples; the judged output is NaN "
            "or Inf in 7 of 450 samples of the exact run and in 2 of 2 device runs (most 7 of "
            "450 samples") in text
    # judged by the integer label output (the arg max of NaN scores: 0), the data still tell
    assert main(["evaluate", str(path), "--data", str(data), "--cim-mode", "ideal",
                 "--seeds", "1"]) == 0
    assert ("note: the data hold NaN or Inf in 7 of 450 samples; the judged output is an "
            "integer (a class), which cannot show whether they made the scores behind it NaN"
            in capsys.readouterr().out)
    assert main(["evaluate", str(path), "--data", str(digits_files[1]), "--cim-mode", "ideal",
                 "--seeds", "1", *judged]) == 0
    assert "NaN or Inf" not in capsys.readouterr().out


def test_nan_data_a_model_handles_get_a_note_not_a_warning():
    """Missing values as NaN that the model handles (an imputing pipeline: finite scores in
    every run): a plain note with the count, not the warning that the classes are no
    prediction (a review's SimpleImputer + MLP got that warning at 96.33 % accuracy)."""
    from onnx_cinm.runtime.evaluate import nonfinite_text

    assert nonfinite_text(0, [{"nonfinite": 0}], 300, data=30) == (
        "note: the data hold NaN or Inf in 30 of 300 samples; the judged output is finite in "
        "all of them")
    assert nonfinite_text(0, [{"nonfinite": 0}], 300) is None
