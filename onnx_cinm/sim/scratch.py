"""Output memory that kernels of one session share, so a run's memory follows its live values.

A large result in a fresh array faults in new pages at every inference (light ResNet50's
Im2Col results are 56 MB per run), so kernels reuse their output memory across runs, as
onnxruntime's arena does. A buffer kept by each kernel, though, keeps every kernel's largest
output alive between runs: memory grew with the sum of all device kernels' outputs, 369 MB of
them held after a run of a 16-kernel BERT at batch 2000. A :class:`Scratch` is one pool for all
kernels of a session instead: :func:`take` hands out a pooled block of the same byte size that
nobody holds any more (its reference count is that of a free block: the caller dropped the
result and every view of it), else a new block it keeps. A block freed by one kernel's last
consumer is reused by the next kernel of that size within the same run, so the pool holds at
most what was live at once of each byte size.

The session makes its pool the current one for the duration of a run (:func:`use`); outside
one (a simulator run on its own) :func:`take` allocates afresh.
"""
from __future__ import annotations

import contextlib
import math
import sys
import threading
from contextvars import ContextVar

import numpy as np

_current: ContextVar = ContextVar("onnx_cinm_scratch", default=None)


class Scratch:
    """A pool of byte blocks by ``(kind, byte size)``; see the module docstring."""

    def __init__(self) -> None:
        self._blocks: dict = {}  # (kind, nbytes) -> [uint8 arrays]
        self._free_refs = None  # the reference count of a free block, as take() measures it
        self._lock = threading.Lock()  # two runs of one session may share the pool

    def take(self, shape: tuple, dtype, kind=(), zeros: bool = False) -> np.ndarray:
        """A C-contiguous array of ``shape`` and ``dtype`` on a pooled block nobody holds,
        contents undefined (the last user's values). ``kind`` separates blocks whose contents
        matter (``zeros``: a new block is zeroed, for callers that rely on parts they never
        write staying zero; they name the layout in ``kind``)."""
        dtype = np.dtype(dtype)
        n = int(math.prod(shape)) * dtype.itemsize  # Python ints: no overflow, no ufunc
        with self._lock:
            blocks = self._blocks.setdefault((kind, n), [])
            for raw in blocks:
                if sys.getrefcount(raw) == self._free_refs:
                    break
            else:
                raw = (np.zeros if zeros else np.empty)(n, np.uint8)
                blocks.append(raw)
                if self._free_refs is None:  # measured as the loop measures it
                    self._free_refs = sys.getrefcount(raw)
            return raw.view(dtype).reshape(shape)

    def nbytes(self) -> int:
        """Bytes of all pooled blocks (held or free)."""
        return sum(raw.nbytes for blocks in self._blocks.values() for raw in blocks)


def take(shape: tuple, dtype, kind=(), zeros: bool = False) -> np.ndarray:
    """:meth:`Scratch.take` of the current pool (:func:`use`); outside one a new array."""
    pool = _current.get()
    if pool is None:
        return (np.zeros if zeros else np.empty)(shape, dtype)
    return pool.take(shape, dtype, kind, zeros)


@contextlib.contextmanager
def use(pool: Scratch):
    """Make ``pool`` the one :func:`take` draws from inside the ``with`` block."""
    token = _current.set(pool)
    try:
        yield pool
    finally:
        _current.reset(token)
