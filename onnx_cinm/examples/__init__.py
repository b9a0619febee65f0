"""Small example models bundled with the package (built in code, no files, no torch).

They back the README's one-command demo and the tests. Every builder is deterministic
(weights from ``np.random.default_rng(0)``, He-scaled: ``std = sqrt(2 / fan_in)``) and returns a
model with ``ir_version`` 10 and opset 17 that passes ``onnx.checker.check_model(model,
full_check=True)`` and runs in stock onnxruntime.

>>> from onnx_cinm.examples import get_example
>>> model = get_example("lenet")

The scikit-learn digits MLP lives in :mod:`onnx_cinm.examples.digits` (it needs the ``[test]``
extra and a few seconds of training), so it is not part of :data:`EXAMPLES`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import CinmError

__all__ = ["EXAMPLES", "get_example", "lenet", "mlp", "OPSET", "IR_VERSION"]

#: Default-domain opset of the bundled examples.
OPSET = 17
#: IR version of the bundled examples (accepted by onnxruntime >= 1.16).
IR_VERSION = 10


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """He-normal weights, float32: N(0, 2 / fan_in)."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def _bias(rng: np.random.Generator, n: int) -> np.ndarray:
    """Small nonzero biases, float32 N(0, 0.01^2), so a dropped bias shows up in the check."""
    return (rng.standard_normal(n) * 0.01).astype(np.float32)


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="onnx-cinm.examples",
        doc_string=doc,
    )
    return model


def lenet() -> onnx.ModelProto:
    """LeNet-5 style CNN for 28x28 grey images.

    Graph: ``input`` float32 [batch, 1, 28, 28] -> Conv 6x5x5 (pads 2) -> Relu -> MaxPool 2x2 ->
    Conv 16x5x5 -> Relu -> MaxPool 2x2 -> Flatten (400) -> Gemm 400->120 (``transB=1``, weight
    stored [120, 400] as ``nn.Linear`` exports it) -> Relu -> Gemm 120->10 (``transB=0``, weight
    [120, 10]) -> Softmax(axis=1) -> ``output`` float32 [batch, 10] (rows sum to 1).

    Returns
    -------
    onnx.ModelProto
        ir_version 10, opset 17, symbolic batch dimension ``"batch"``; 51,902 float32
        parameters as initializers.
    """
    rng = np.random.default_rng(0)
    w1 = _he(rng, (6, 1, 5, 5), 1 * 5 * 5)
    b1 = _bias(rng, 6)
    w2 = _he(rng, (16, 6, 5, 5), 6 * 5 * 5)
    b2 = _bias(rng, 16)
    w3 = _he(rng, (120, 400), 400)
    b3 = _bias(rng, 120)
    w4 = _he(rng, (120, 10), 120)
    b4 = _bias(rng, 10)
    inits = [numpy_helper.from_array(a, name) for a, name in
             [(w1, "conv1.weight"), (b1, "conv1.bias"), (w2, "conv2.weight"), (b2, "conv2.bias"),
              (w3, "fc1.weight"), (b3, "fc1.bias"), (w4, "fc2.weight"), (b4, "fc2.bias")]]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1"], name="conv1",
                         kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool1", "conv2.weight", "conv2.bias"], ["conv2"], name="conv2",
                         kernel_shape=[5, 5]),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool2"], name="pool2",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1",
                         transB=1),
        helper.make_node("Relu", ["fc1"], ["relu3"], name="relu3"),
        helper.make_node("Gemm", ["relu3", "fc2.weight", "fc2.bias"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["output"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "lenet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    return _model(graph, "LeNet-5 style CNN (onnx-cinm example), deterministic He-scaled weights")


def mlp() -> onnx.ModelProto:
    """Three-layer perceptron 64 -> 128 -> 64 -> 10 from MatMul + Add (+ Relu).

    Graph: ``input`` float32 [batch, 64] -> MatMul [64, 128] -> Add [128] -> Relu -> MatMul
    [128, 64] -> Add [64] -> Relu -> MatMul [64, 10] -> Add [10] -> ``output`` float32
    [batch, 10] (logits; no Relu after the last layer).

    Returns
    -------
    onnx.ModelProto
        ir_version 10, opset 17, symbolic batch dimension ``"batch"``.
    """
    rng = np.random.default_rng(0)
    sizes = [64, 128, 64, 10]
    inits, nodes = [], []
    x = "input"
    for i, (k, n) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        inits.append(numpy_helper.from_array(_he(rng, (k, n), k), f"fc{i}.weight"))
        inits.append(numpy_helper.from_array(_bias(rng, n), f"fc{i}.bias"))
        last = i == len(sizes) - 1
        nodes.append(helper.make_node("MatMul", [x, f"fc{i}.weight"], [f"mm{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Add", [f"mm{i}", f"fc{i}.bias"],
                                      ["output" if last else f"add{i}"], name=f"add{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [f"add{i}"], [f"relu{i}"], name=f"relu{i}"))
            x = f"relu{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )
    return _model(graph, "MLP 64-128-64-10 (onnx-cinm example), deterministic He-scaled weights")


#: Example name -> builder returning a fresh ``onnx.ModelProto``.
EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "lenet": lenet,
    "mlp": mlp,
}


def get_example(name: str) -> onnx.ModelProto:
    """Build the bundled example ``name`` (a fresh copy each call).

    Parameters
    ----------
    name : str
        A key of :data:`EXAMPLES` (``"lenet"``, ``"mlp"``).

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    CinmError
        ``name`` is not a known example; the message lists the known ones.
    """
    try:
        builder = EXAMPLES[name]
    except KeyError:
        raise CinmError(
            f"unknown example {name!r}; known examples: {', '.join(sorted(EXAMPLES))}"
        ) from None
    return builder()
