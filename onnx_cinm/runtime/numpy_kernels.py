"""numpy kernels for cinm ops whose reference bodies are slow in onnxruntime.

In the execution provider's model mode a UPMEM node computes its op's semantics and is charged
the cost model's figures. Most ops are fastest left inside their onnxruntime partition (their
bodies are single standard ops). ``Im2Col``'s body is a Pad and one Gather per spatial axis plus
a Transpose, which onnxruntime runs 2-8x slower than a strided view copied once (measured on
light ResNet50's shapes), so it runs here.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def im2col(x: np.ndarray, kernel_shape, strides, pads, dilations) -> np.ndarray:
    """cinm.Im2Col: ``X[N, C, *S]`` -> ``Y[N, *O, C * prod(kernel_shape)]``.

    Patches of the zero-padded input, channel-major then kernel position (as Conv sees them);
    ``pads`` is ``[begin_1..begin_r, end_1..end_r]``; any dtype (values are copied, never
    combined). Raises ValueError if a padded spatial dim is smaller than the dilated kernel.
    """
    r = len(kernel_shape)
    x = np.asarray(x)
    pad = [(0, 0), (0, 0)] + [(int(pads[i]), int(pads[i + r])) for i in range(r)]
    xp = np.pad(x, pad) if any(p for pr in pad for p in pr) else x
    span = [int(d) * (int(k) - 1) + 1 for k, d in zip(kernel_shape, dilations)]
    if any(xp.shape[2 + i] < span[i] for i in range(r)):
        raise ValueError(f"Im2Col: padded input {xp.shape[2:]} smaller than the kernel span {span}")
    v = sliding_window_view(xp, span, axis=tuple(range(2, 2 + r)))  # [N, C, *W, *span]
    v = v[(slice(None), slice(None)) + tuple(slice(None, None, int(s)) for s in strides)
          + tuple(slice(None, None, int(d)) for d in dilations)]
    n, c = x.shape[:2]
    out_sp = v.shape[2:2 + r]
    perm = (0,) + tuple(range(2, 2 + r)) + (1,) + tuple(range(2 + r, 2 + 2 * r))
    return v.transpose(perm).reshape((n,) + tuple(out_sp) + (c * int(np.prod(kernel_shape)),))


def _im2col_node(inputs: list, attrs: dict) -> list:
    return [im2col(inputs[0], attrs["kernel_shape"], attrs["strides"], attrs["pads"],
                   attrs["dilations"])]


#: cinm op type -> ``fn(inputs, attrs) -> outputs`` for the execution provider's model mode.
KERNELS = {"Im2Col": _im2col_node}
