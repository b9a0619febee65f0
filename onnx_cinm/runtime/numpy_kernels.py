"""numpy kernels for cinm ops whose reference bodies are slow in onnxruntime.

In the execution provider's model mode a UPMEM node computes its op's semantics and is charged
the cost model's figures. Most ops are fastest left inside their onnxruntime partition (their
bodies are single standard ops). ``Im2Col``'s body is a Pad and one Gather per spatial axis plus
a Transpose, which onnxruntime runs 2-8x slower than a strided view copied once (measured on
light ResNet50's shapes), so it runs here.
"""
from __future__ import annotations

import numpy as np


def im2col(x: np.ndarray, kernel_shape, strides, pads, dilations) -> np.ndarray:
    """cinm.Im2Col: ``X[N, C, *S]`` -> ``Y[N, *O, C * prod(kernel_shape)]``.

    Patches of the zero-padded input, channel-major then kernel position (as Conv sees them);
    ``pads`` is ``[begin_1..begin_r, end_1..end_r]``; any dtype (values are copied, never
    combined). Raises ValueError if a padded spatial dim is smaller than the dilated kernel.

    The result is a view whose memory is ``[N, C * prod(kernel_shape), *O]``: one strided copy
    per kernel position (inner loops along the output's rows) instead of a copy of a 6-axis
    window view with 3-element inner loops, and for ``N = 1`` the ``[*O, C * k]`` matrix a
    product streams is the transpose of a C-contiguous one, which BLAS and onnxruntime read as
    it is (``transA``). A 1x1 kernel with unit strides and no padding is a view of ``x``.
    """
    r = len(kernel_shape)
    x = np.asarray(x)
    pad = [(0, 0), (0, 0)] + [(int(pads[i]), int(pads[i + r])) for i in range(r)]
    n, c = x.shape[:2]
    to_last = (0,) + tuple(range(2, 2 + r)) + (1,)  # [N, C, *O] -> [N, *O, C]
    if all(int(k) == 1 for k in kernel_shape) and all(int(t) == 1 for t in strides) \
            and not any(p for pr in pad for p in pr):
        return x.transpose(to_last)
    xp = np.pad(x, pad) if any(p for pr in pad for p in pr) else x
    span = [int(d) * (int(k) - 1) + 1 for k, d in zip(kernel_shape, dilations)]
    if any(xp.shape[2 + i] < span[i] for i in range(r)):
        raise ValueError(f"Im2Col: padded input {xp.shape[2:]} smaller than the kernel span {span}")
    out_sp = tuple((xp.shape[2 + i] - span[i]) // int(strides[i]) + 1 for i in range(r))
    kernel = tuple(int(k) for k in kernel_shape)
    buf = np.empty((n, c) + kernel + out_sp, dtype=x.dtype)
    for pos in np.ndindex(*kernel):
        window = tuple(slice(k * int(d), k * int(d) + (o - 1) * int(t) + 1, int(t))
                       for k, d, o, t in zip(pos, dilations, out_sp, strides))
        buf[(slice(None), slice(None)) + pos] = xp[(slice(None), slice(None)) + window]
    return buf.reshape((n, c * int(np.prod(kernel))) + out_sp).transpose(to_last)


def _im2col_node(inputs: list, attrs: dict) -> list:
    return [im2col(inputs[0], attrs["kernel_shape"], attrs["strides"], attrs["pads"],
                   attrs["dilations"])]


#: cinm op type -> ``fn(inputs, attrs) -> outputs`` for the execution provider's model mode.
KERNELS = {"Im2Col": _im2col_node}
