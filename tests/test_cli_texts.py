"""Small CLI findings: compare of two unrelated models, help texts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper

from onnx_cinm.cli import main


def _other_model(path):
    """Same input as LeNet (``input`` [1, 1, 28, 28]), another output name (``logits``)."""
    w = numpy_helper.from_array(np.ones((784, 10), np.float32), "w")
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
    assert main(["compare", "--example", "lenet", str(other)]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("\n") == 1 and cap.err.startswith("onnx-cinm: error: the models' outputs differ: ")
    assert f"example 'lenet' has output; {other} has logits" in cap.err


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
