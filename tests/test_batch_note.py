"""What "per inference" means at a planned size above 1: optimize's summary and report say a
per-inference figure is for one run at the planned sizes (a whole batch), not per sample."""
import numpy as np
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnx_cinm import optimize, report

NOTE = ("per inference: one run of the model at batch=8: every per-inference figure (latency, "
        "energy, tile writes, wear) is for the whole run, not per sample")


def _matmul(batch="batch"):
    w = nh.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "W")
    g = h.make_graph([h.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [batch, 64])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [batch, 64])], [w])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)


def test_summary_and_report_say_an_inference_is_the_whole_batch():
    res = optimize(_matmul(), dims={"batch": 8}, check=0, host_roofline="nominal")
    assert NOTE in res.summary().splitlines()
    _, totals = report.layers(res.model, report.options_from_plans(res.model))
    assert f"({NOTE})" in totals["notes"]


def test_a_batch_fixed_by_overwrite_input_shape_is_said_as_a_dim_given():
    """--overwrite-input-shape x:8,64 plans at batch 8 as --dim batch=8 does: the summary says
    so the same way ('at batch=8' and the per-inference note; a fresh user, s35: open_nsfw's
    summary dropped both), though the compiled model no longer names the dim."""
    res = optimize(_matmul(), input_shapes={"x": [8, 64]}, check=0, host_roofline="nominal")
    lines = res.summary().splitlines()
    assert NOTE in lines and "(at batch=8)" in lines[2]
    assert res.shaped_dims == {"batch": 8}
    at_one = optimize(_matmul(), input_shapes={"x": [1, 64]}, check=0, host_roofline="nominal")
    assert "per inference: one run" not in at_one.summary()


def test_no_note_at_one_sample_or_a_fixed_batch():
    for model, dims in ((_matmul(), {"batch": 1}), (_matmul(8), {})):
        res = optimize(model, dims=dims, check=0, host_roofline="nominal")
        assert "per inference: one run" not in res.summary()
        _, totals = report.layers(res.model, report.options_from_plans(res.model))
        assert not any(n.startswith("(per inference: one run") for n in totals["notes"])


def test_report_says_which_dims_its_figures_take_as_1():
    """A model planned without a size for a symbolic dim (a dynamic length): report's totals
    are at 1 for it, and now say so (trial s30: 'total: 1.26 us' on an LSTM planned at T=1)."""
    res = optimize(_matmul(), check=0, host_roofline="nominal")
    _, totals = report.layers(res.model, report.options_from_plans(res.model))
    assert ("(the figures take batch as 1: the model was planned without its size; optimize "
            "--dim batch=SIZE plans at a size (if optimize named dims left unsized, --dim "
            "batch=1 sizes them too: unsized, they count 1 as well))") in totals["notes"]
    res = optimize(_matmul(), dims={"batch": 8}, check=0, host_roofline="nominal")
    _, totals = report.layers(res.model, report.options_from_plans(res.model))
    assert not any(n.startswith("(the figures take") for n in totals["notes"])


def test_run_profile_says_which_dims_the_plans_figures_take_as_1(tmp_path, capsys):
    """run --profile counts its rows at this run's sizes, and the model line gives the plans'
    figures: planned without a size, that line now says they take the dim as 1 (a trial's
    BERT: 51 us counted at batch 1 beside 1.6 us planned, with no word why); planned at a
    size, it says nothing of the kind."""
    from onnx_cinm import artifacts
    from onnx_cinm.cli import main

    x = tmp_path / "x.npy"
    np.save(x, np.ones((2, 64), np.float32))
    for dims, said in (({}, True), ({"batch": 2}, False)):
        out = tmp_path / f"m{len(dims)}.onnx"
        res = optimize(_matmul(), dims=dims, place=[("*", "memristor")], check=0,
                       host_roofline="nominal")
        artifacts.save(res.model, out)
        assert main(["run", str(out), "--input", f"x={x}", "--profile"]) == 0
        text = capsys.readouterr().out
        assert ("\n  (the figures take batch as 1: the model was planned without its size"
                in text) is said


def test_a_length_dim_off_the_first_axis_is_not_called_samples():
    """An audio clip's length named 'samples' on axis 1 of a batch-1 input: the figures are for
    one run at samples=32000, which is one clip, not a batch (a trial's mel front end read
    'not per sample')."""
    w = nh.from_array(np.ones((4, 4), np.float32), "W")
    g = h.make_graph([h.make_node("Reshape", ["x", "s"], ["r"]),
                      h.make_node("MatMul", ["r", "W"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [1, "samples"])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [None, 4])],
                     [w, nh.from_array(np.array([-1, 4], np.int64), "s")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    res = optimize(m, dims={"samples": 32000}, check=0, host_roofline="nominal")
    assert ("per inference: one run of the model at samples=32000: every per-inference figure "
            "(latency, energy, tile writes, wear) is for the whole run") in res.summary().splitlines()


def test_a_dim_and_a_shape_override_of_its_input_conflict_in_words():
    """--overwrite-input-shape x:2,64 fixes the dim 'batch' that --dim batch=1 sizes: the error
    says the two flags conflict (it said no input had a dim 'batch', named ones: none)."""
    import pytest

    from onnx_cinm.errors import CinmError

    with pytest.raises(CinmError, match=r"^--dim batch: --overwrite-input-shape gave its input a "
                       r"fixed shape, so the model has no dim 'batch' left to size; give one"):
        optimize(_matmul(), dims={"batch": 1}, input_shapes={"x": [2, 64]}, check=0)
    # without the --dim, the override alone plans at its shape
    res = optimize(_matmul(), input_shapes={"x": [2, 64]}, check=0)
    assert res.flops_total == 2 * 2 * 64 * 64


def test_a_time_major_lstm_input_has_its_batch_on_axis_1():
    """x[T, N, 4] into an ONNX LSTM (layout 0): T=100 is the sequence, one run of a clip, not
    a batch; N=8 is the batch (a review found the first-axis rule calling T a batch)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((1, 12, 4)).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal((1, 12, 3)).astype(np.float32), "R")]
    g = h.make_graph([h.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["T", "N", 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["T", 1, "N", 3])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=10)
    from onnx_cinm import frontend

    assert frontend.batch_note(m, {"T": 100, "N": 1}).endswith("is for the whole run")
    assert frontend.batch_note(m, {"T": 100, "N": 8}).endswith("for the whole run, not per sample")


def test_an_empty_input_array_for_the_check_names_the_way_around():
    """optimize's check cannot compare a batch of 0; the refusal says --check 0 plans without
    it (review), and with --check 0 the array only sizes nothing (the batch taken as 1)."""
    import pytest

    from onnx_cinm.errors import CinmError

    empty = {"x": np.zeros((0, 64), np.float32)}
    with pytest.raises(CinmError, match=r"give at least one element \(or plan without a check: "
                       r"--check 0\)$"):
        optimize(_matmul(), inputs=empty)
    assert optimize(_matmul(), inputs=empty, check=0).flops_total == 2 * 64 * 64
