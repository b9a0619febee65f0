"""Small CLI findings: compare of two unrelated models, help texts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper

from onnx_cinm import frontend
from onnx_cinm.cli import main


def _other_model(path, scale=1.0):
    """Same input as LeNet (``input`` [1, 1, 28, 28]), another output name (``logits``);
    its weights all ``scale``."""
    w = numpy_helper.from_array(np.full((784, 10), scale, np.float32), "w")
    g = h.make_graph([h.make_node("Flatten", ["input"], ["f"]),
                      h.make_node("MatMul", ["f", "w"], ["logits"])], "other",
                     [h.make_tensor_value_info("input", TP.FLOAT, [1, 1, 28, 28])],
                     [h.make_tensor_value_info("logits", TP.FLOAT, [1, 10])], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def test_compare_two_different_models_says_so_in_one_line(tmp_path, capsys):
    """It printed a table of 'inf inf 0/0 FAIL: missing in candidate' rows."""
    _other_model(tmp_path / "other.onnx")
    other = tmp_path / "other_opt.onnx"
    assert main(["optimize", str(tmp_path / "other.onnx"), "-o", str(other), "--check", "0",
                 "-q"]) == 0
    capsys.readouterr()
    # as a model optimized before optimize recorded its source: the names tell them apart
    m = onnx.load(other)
    frontend.set_recorded_source(m, None)
    onnx.save(m, other)
    assert main(["compare", "--example", "lenet", str(other)]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("onnx-cinm: error: the models' outputs differ: ")
    assert f"example 'lenet' has output float32; {other} has logits float32" in cap.err


def test_compare_an_original_the_model_was_not_made_from_says_so_in_one_line(tmp_path, capsys):
    """Trial s23: 'compare m/orinet_qdq.onnx o/dyn_b1.onnx' (the second made from
    orinet_dyn: same input and output names) only failed numerically. Two models with the same
    inputs and outputs, weights all 1 and all 2: the one optimized from the first is refused
    against the second, and checked (exactly, one float32 product) against the first."""
    _other_model(tmp_path / "ones.onnx", 1.0)
    _other_model(tmp_path / "twos.onnx", 2.0)
    opt = tmp_path / "ones_opt.onnx"
    assert main(["optimize", str(tmp_path / "ones.onnx"), "-o", str(opt), "--check", "0",
                 "-q"]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "twos.onnx"), str(opt)]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == (f"onnx-cinm: error: {opt} was not optimized from {tmp_path / 'twos.onnx'}"
                       " (it records another source model's digest): compare an original with"
                       " its own optimized model\n")
    assert main(["compare", str(tmp_path / "ones.onnx"), str(opt)]) == 0
    assert "check: 2 runs, 1 output, max abs err 0" in capsys.readouterr().out


def test_the_source_digest_ignores_storage_and_survives_a_second_optimize(tmp_path):
    """The digest is the model's content: the same weights stored as float_data instead of
    raw bytes, or another node name, give the same; one weight changed by one ulp does not. An
    optimized model optimized again records its first original's."""
    from onnx_cinm import optimize

    _other_model(tmp_path / "ones.onnx")
    m = onnx.load(tmp_path / "ones.onnx")
    d = frontend.source_digest(m)
    assert len(d) == 64 and int(d, 16) >= 0
    typed = onnx.ModelProto()
    typed.CopyFrom(m)
    w = typed.graph.initializer[0]
    w.float_data.extend([1.0] * 7840)
    w.ClearField("raw_data")
    typed.graph.node[0].name = "renamed"
    assert frontend.source_digest(typed) == d
    w.float_data[5] = float(np.nextafter(np.float32(1), np.float32(2)))
    assert frontend.source_digest(typed) != d
    once = optimize(m, check=0).model
    assert frontend.recorded_source(once) == d
    assert frontend.recorded_source(optimize(once, check=0).model) == d


def test_optimize_help_texts(capsys):
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "at most 24 on v1a, 16 on v1b) [integer in 1..24]" in text
    assert "weight_stationary (alias knm," in text and "naive (alias mnk," in text


def test_list_passes_names_the_real_skip_flag(capsys):
    """Trial s23: --list-passes said '--skip does not take them'; the flag is --skip-pass.
    Every --flag the listing names must be an option optimize accepts."""
    import argparse
    import re

    from onnx_cinm.cli import main
    from onnx_cinm.cli.args import _parser

    assert main(["optimize", "--list-passes"]) == 0
    named = set(re.findall(r"--[a-z][a-z-]*", capsys.readouterr().out))
    assert "--skip-pass" in named
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {f for a in sub.choices["optimize"]._actions for f in a.option_strings}
    assert named <= flags, named - flags


def test_the_source_digest_of_string_initializers_is_their_text():
    """A STRING initializer is hashed by its strings (an object array's bytes would be
    pointers, different in every copy): the same strings give the same digest in another copy
    of the model, other strings with the same concatenation another digest."""
    from onnx import TensorProto, helper

    from onnx_cinm import frontend

    def model(strings):
        t = helper.make_tensor("s", TensorProto.STRING, [len(strings)], strings)
        g = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [2])], [t])
        return helper.make_model(g)

    a = model([b"ab", b"c"])
    copy = onnx.ModelProto.FromString(a.SerializeToString())
    assert frontend.source_digest(a) == frontend.source_digest(copy)
    assert frontend.source_digest(a) != frontend.source_digest(model([b"a", b"bc"]))


def test_devices_help_says_what_it_prints(capsys):
    """It printed only its usage line."""
    with pytest.raises(SystemExit) as e:
        main(["devices", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    text = " ".join(out.split())
    for words in ("every registered device", "parameters", "options", "run modes",
                  "presets", "Takes no arguments"):
        assert words in text, words


def test_check_and_compare_say_which_engine_computed_each_side(tmp_path, capsys):
    """A fresh user, s27: optimize's 'check:' line and compare's read alike, though optimize's
    candidate is stock onnxruntime running the cinm ops' reference bodies and compare's is the
    CINM provider's device kernels; both lines now name the engine of each side."""
    _other_model(tmp_path / "ones.onnx", 1.0)
    opt = tmp_path / "ones_opt.onnx"
    assert main(["optimize", str(tmp_path / "ones.onnx"), "-o", str(opt)]) == 0
    line = next(ln.strip() for ln in capsys.readouterr().out.splitlines()
                if ln.strip().startswith("check: "))
    assert line.endswith(" (reference: onnxruntime on the original; candidate: onnxruntime "
                         "on the optimized model, its cinm ops as their reference bodies, not the "
                         "device kernels ('onnx-cinm compare' runs those))")
    assert main(["compare", str(tmp_path / "ones.onnx"), str(opt)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("check: "))
    assert line.endswith(" (reference: onnxruntime on the original; candidate: the CINM "
                         "provider, device nodes in their kernels)")


def test_compare_with_the_optimized_model_first_is_refused_in_one_line(tmp_path, capsys):
    """Trial s27: 'compare seiz_scan.onnx seizure.onnx' (the optimized model first) warned,
    printed 'check ... OK', then failed a NaN/Inf check with error inf, exit 1. The arguments
    swapped are refused before anything runs; in order they compare."""
    _other_model(tmp_path / "ones.onnx", 1.0)
    opt = tmp_path / "ones_opt.onnx"
    assert main(["optimize", str(tmp_path / "ones.onnx"), "-o", str(opt), "--check", "0",
                 "-q"]) == 0
    capsys.readouterr()
    assert main(["compare", str(opt), str(tmp_path / "ones.onnx")]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == (f"onnx-cinm: error: {opt} is an optimized model (it records its source "
                       "model's digest): give the original model first, then its optimized one"
                       " (onnx-cinm compare ORIGINAL OPTIMIZED)\n")
    assert main(["compare", str(tmp_path / "ones.onnx"), str(opt)]) == 0


def test_compare_input_of_another_name_lists_the_inputs_as_run_does(tmp_path, capsys):
    """Trial s27: compare said only "--input 'X' is not an input of M"; run lists the model's
    inputs (LeNet-shaped model: its one input is named ``input``)."""
    _other_model(tmp_path / "ones.onnx", 1.0)
    opt = tmp_path / "ones_opt.onnx"
    assert main(["optimize", str(tmp_path / "ones.onnx"), "-o", str(opt), "--check", "0",
                 "-q"]) == 0
    np.savez(tmp_path / "x.npz", X=np.zeros((1, 1, 28, 28), np.float32))
    capsys.readouterr()
    want = "onnx-cinm: error: --input 'X' is not an input of the model (inputs: input)\n"
    for args in (["compare", str(tmp_path / "ones.onnx"), str(opt)], ["run", str(opt)]):
        assert main([*args, "--input", str(tmp_path / "x.npz")]) == 1
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err == want
