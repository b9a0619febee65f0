"""numpy kernels for cinm ops whose reference bodies are slow in onnxruntime.

In the execution provider's model mode a UPMEM node computes its op's semantics and is charged
the cost model's figures. Most ops are fastest left inside their onnxruntime partition (their
bodies are single standard ops). ``Im2Col``'s body is a Pad and one Gather per spatial axis plus
a Transpose, which onnxruntime runs 2-8x slower than a strided view copied once (measured on
light ResNet50's shapes), so it runs here.
"""
from __future__ import annotations

import math

import numpy as np

from ..sim import scratch


def _geometry(shape, kernel_shape, strides, pads, dilations):
    """``(padded spatial shape, output spatial shape)`` of an Im2Col; ValueError if a padded
    spatial dim is smaller than the dilated kernel."""
    r = len(kernel_shape)
    padded = tuple(int(shape[2 + i]) + int(pads[i]) + int(pads[i + r]) for i in range(r))
    span = [int(d) * (int(k) - 1) + 1 for k, d in zip(kernel_shape, dilations)]
    if any(padded[i] < span[i] for i in range(r)):
        raise ValueError(f"Im2Col: padded input {padded} smaller than the kernel span {span}")
    return padded, tuple((padded[i] - span[i]) // int(strides[i]) + 1 for i in range(r))


class _Plan:
    """What :func:`im2col` does with one input shape, worked out once: the padded input's
    shape and interior, the result memory's shape, the ``(destination, source)`` index of the
    strided copy of each kernel position, and the final reshape and transpose. A node's
    :class:`Im2Col` keeps one per input shape, so a run is its numpy copies and nothing else
    (a small input's Python arithmetic cost as much as its copies: 1x32x150, kernel 5, took
    0.07 ms per call before)."""

    __slots__ = ("cols", "copies", "final", "interior", "padded", "to_last", "view")

    def __init__(self, shape: tuple, kernel_shape, strides, pads, dilations) -> None:
        r = len(kernel_shape)
        n, c = shape[:2]
        self.to_last = (0,) + tuple(range(2, 2 + r)) + (1,)  # [N, C, *O] -> [N, *O, C]
        padded, out_sp = _geometry(shape, kernel_shape, strides, pads, dilations)
        self.view = all(int(k) == 1 for k in kernel_shape) and \
            all(int(t) == 1 for t in strides) and not any(int(p) for p in pads)
        self.padded = (n, c) + padded if any(int(p) for p in pads) else None
        self.interior = (slice(None), slice(None)) + tuple(
            slice(int(pads[i]), int(pads[i]) + int(shape[2 + i])) for i in range(r))
        kernel = tuple(int(k) for k in kernel_shape)
        self.cols = (n, c) + kernel + out_sp
        self.copies = [((slice(None), slice(None)) + pos,
                        (slice(None), slice(None)) + tuple(
                            slice(k * int(d), k * int(d) + (o - 1) * int(t) + 1, int(t))
                            for k, d, o, t in zip(pos, dilations, out_sp, strides)))
                       for pos in np.ndindex(*kernel)]
        self.final = (n, c * math.prod(kernel)) + out_sp

    def apply(self, x: np.ndarray, buffers=None) -> np.ndarray:
        """:func:`im2col` of ``x`` (of the planned shape), into ``buffers`` as it says."""
        if self.view:
            return x.transpose(self.to_last)
        if self.padded is not None:
            xp = buffers("padded", self.padded, x.dtype) if buffers else \
                np.zeros(self.padded, x.dtype)
            xp[self.interior] = x
        else:
            xp = x
        buf = buffers("cols", self.cols, x.dtype) if buffers else np.empty(self.cols, x.dtype)
        for dst, src in self.copies:
            buf[dst] = xp[src]
        return buf.reshape(self.final).transpose(self.to_last)


def im2col(x: np.ndarray, kernel_shape, strides, pads, dilations, buffers=None) -> np.ndarray:
    """cinm.Im2Col: ``X[N, C, *S]`` -> ``Y[N, *O, C * prod(kernel_shape)]``.

    Patches of the zero-padded input, channel-major then kernel position (as Conv sees them);
    ``pads`` is ``[begin_1..begin_r, end_1..end_r]``; any dtype (values are copied, never
    combined). Raises ValueError if a padded spatial dim is smaller than the dilated kernel.

    The result is a view whose memory is ``[N, C * prod(kernel_shape), *O]``: one strided copy
    per kernel position (inner loops along the output's rows) instead of a copy of a 6-axis
    window view with 3-element inner loops, and for ``N = 1`` the ``[*O, C * k]`` matrix a
    product streams is the transpose of a C-contiguous one, which BLAS and onnxruntime read as
    it is (``transA``). A 1x1 kernel with unit strides and no padding is a view of ``x``.

    ``buffers``: a callable ``(role, shape, dtype) -> array`` giving the padded input
    (``"padded"``, zero outside the interior written here: its borders must still be zero)
    and the result's memory (``"cols"``, contents undefined); None allocates both afresh.
    """
    x = np.asarray(x)
    return _Plan(x.shape, kernel_shape, strides, pads, dilations).apply(x, buffers)


class Im2Col:
    """The Im2Col kernel of one node: :func:`im2col` into memory of the session's scratch pool.

    A large result in a fresh array faults in new pages at every inference (light ResNet50's
    Im2Col results are 56 MB per run); like onnxruntime's arena and the crossbar simulator's
    outputs, the padded input and the result take pooled blocks nobody holds any more
    (:mod:`onnx_cinm.sim.scratch`), shared with the session's other kernels. Padded inputs
    are pooled by their shape and pads too: a new one is zeroed and only its interior is ever written,
    so its borders stay zero for every Im2Col of that geometry. Call it as
    ``kernel(inputs, attrs) -> [Y]``.
    """

    def __init__(self) -> None:
        self._plans: dict = {}  # input shape -> _Plan
        self._pads: tuple = ()  # the node's pads, set with the first plan

    def _buffer(self, role: str, shape: tuple, dtype) -> np.ndarray:
        """:func:`im2col`'s ``buffers``, from the session's scratch pool."""
        if role == "padded":  # the shape and pads fix the interior
            return scratch.take(shape, dtype, ("Im2Col padded", shape, self._pads), zeros=True)
        return scratch.take(shape, dtype)

    def __call__(self, inputs: list, attrs: dict) -> list:
        x = np.asarray(inputs[0])
        plan = self._plans.get(x.shape)
        if plan is None:  # attrs are the node's own: fixed for this kernel's lifetime
            plan = self._plans[x.shape] = _Plan(x.shape, attrs["kernel_shape"],
                                                attrs["strides"], attrs["pads"],
                                                attrs["dilations"])
            self._pads = tuple(int(p) for p in attrs["pads"])
        return [plan.apply(x, self._buffer)]


#: cinm op type -> a class whose instance is one node's kernel, ``kernel(inputs, attrs) ->
#: outputs``, for the execution provider's model mode.
KERNELS = {"Im2Col": Im2Col}
