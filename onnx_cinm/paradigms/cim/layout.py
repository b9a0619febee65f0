"""How a cinm matrix product maps onto crossbars: which operand is programmed, and the layouts.

A crossbar kernel computes ``Y[g] = X[g] @ W[g]`` for ``g < G``: ``W[g]`` is ``K x N`` and
programmed into the cells, ``X[g]`` is ``rows x K`` and streams through (see
:mod:`.schedule`). A cinm product maps onto that in one of two ways, the *programmed operand*:

- ``"B"`` -- ``Gemm(A[..., M, K], B[..., K, N])``: ``W = B``. The batch axes of the result on
  which ``B`` varies are *grouped* (one weight matrix each, e.g. the groups of a grouped
  convolution); the axes on which ``B`` is broadcast are *shared* and fold into the streamed rows
  together with ``M``: ``X`` is ``[G, S * M, K]`` with ``S`` the product of the shared axes.
- ``"A"`` -- ``Gemm`` with the left operand programmed: ``Y^T = B^T @ A^T``, so ``W = A^T`` and
  the columns of ``B`` stream through; the roles of ``M`` and ``N`` swap.

``Gemv(A[M, K], x[K])`` is ``Gemm(A, x[:, None])[:, 0]``: operand ``"A"`` streams the single
vector ``x`` through ``A^T`` (OCC's GEMV-as-GEVM); operand ``"B"`` streams the ``M`` rows of ``A``
through the one column ``x``.

The functions here work on numpy arrays (any float dtype, cast to float32 by the caller) and on
shapes (tuples of ints); they copy only where broadcasting or a transpose requires it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ...graph import OpInfo
    from . import CrossbarArray


@dataclass(frozen=True)
class ProductView:
    """A matrix product seen as ``Y[g] = X[g] @ W[g]`` on crossbars.

    Attributes:
        op_type: ``"Gemm"`` or ``"Gemv"``.
        operand: ``"A"`` or ``"B"``: the programmed operand (see the module docstring).
        a_shape, b_shape: the node's input shapes (Gemv: ``b_shape`` is ``(K,)``).
        y_batch: batch shape of the result (Gemm), ``()`` for Gemv.
        grouped: result batch axes along which the programmed operand varies.
        G, K, N: groups, reduction size, programmed columns (``N`` of ``W``).
        rows: streamed rows per group (``S * M`` for operand B, ``S * N`` for operand A).
    """

    op_type: str
    operand: str
    a_shape: tuple
    b_shape: tuple
    y_batch: tuple
    grouped: tuple
    G: int
    K: int
    N: int
    rows: int


def _batch(a: tuple, b: tuple) -> tuple:
    return tuple(np.broadcast_shapes(a[:-2], b[:-2]))


def view(op_type: str, operand: str, a_shape: tuple, b_shape: tuple) -> ProductView:
    """The :class:`ProductView` of ``op_type`` with static input shapes (ints).

    Raises ValueError if the shapes are not a valid product of that op.
    """
    a_shape, b_shape = tuple(a_shape), tuple(b_shape)
    if op_type == "Gemv":
        if len(a_shape) != 2 or len(b_shape) != 1 or a_shape[1] != b_shape[0]:
            raise ValueError(f"Gemv shapes {a_shape} x {b_shape}")
        M, K = a_shape
        if operand == "A":
            return ProductView(op_type, operand, a_shape, b_shape, (), (), 1, K, M, 1)
        return ProductView(op_type, operand, a_shape, b_shape, (), (), 1, K, 1, M)
    if len(a_shape) < 2 or len(b_shape) < 2 or a_shape[-1] != b_shape[-2]:
        raise ValueError(f"Gemm shapes {a_shape} x {b_shape}")
    yb = _batch(a_shape, b_shape)
    prog = b_shape if operand == "B" else a_shape
    pb = (1,) * (len(yb) - len(prog[:-2])) + tuple(prog[:-2])
    grouped = tuple(i for i, d in enumerate(pb) if d != 1)
    G = math.prod(yb[i] for i in grouped)
    S = math.prod(yb) // G if G else 0
    M, K, N = a_shape[-2], a_shape[-1], b_shape[-1]
    if operand == "B":
        return ProductView(op_type, operand, a_shape, b_shape, yb, grouped, G, K, N, S * M)
    return ProductView(op_type, operand, a_shape, b_shape, yb, grouped, G, K, M, S * N)


def _perm(v: ProductView) -> list[int]:
    shared = [i for i in range(len(v.y_batch)) if i not in v.grouped]
    return list(v.grouped) + shared


def weights(v: ProductView, A: np.ndarray | None, B: np.ndarray | None) -> np.ndarray:
    """The programmed matrix ``W`` as ``[G, K, N]`` (from ``B``, or ``A`` transposed)."""
    if v.op_type == "Gemv":
        return (A.T if v.operand == "A" else B[:, None])[None]
    src = B if v.operand == "B" else np.swapaxes(A, -1, -2)
    return np.ascontiguousarray(src).reshape(v.G, v.K, v.N)


def stream_rows(v: ProductView, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The streamed operand as ``X[G, rows, K]`` (A's rows for operand B, B's columns for A)."""
    if v.op_type == "Gemv":
        X = B[None] if v.operand == "A" else A
        return X[None]
    if v.operand == "B":
        if not v.grouped and A.shape[:-2] == v.y_batch:  # rows in A's own order: a reshape
            return A.reshape(1, v.rows, v.K)  # (what the broadcast and transpose reduce to)
        src, inner = A, (v.a_shape[-2], v.K)
    else:
        src, inner = np.swapaxes(B, -1, -2), (v.b_shape[-1], v.K)
    full = np.broadcast_to(src, v.y_batch + inner)
    nb = len(v.y_batch)
    perm = _perm(v) + [nb, nb + 1]
    return full.transpose(perm).reshape(v.G, v.rows, v.K)


def unstream(v: ProductView, Y: np.ndarray) -> np.ndarray:
    """Inverse of the streaming layout: ``Y[G, rows, N]`` back to the node's output shape
    (a view where numpy can make one)."""
    shape, axes = unstream_plan(v)
    return Y.reshape(shape).transpose(axes)


def unstream_plan(v: ProductView) -> tuple[tuple, tuple]:
    """``(shape, axes)`` with ``unstream(v, Y) == Y.reshape(shape).transpose(axes)``: the
    inverse of the streaming layout as one reshape and one transpose, computed once per view
    (a kernel composes ``axes`` with a permutation of its own)."""
    if v.op_type == "Gemv":  # Y[0, 0] (operand A) or Y[0, :, 0] (operand B)
        return ((v.N,) if v.operand == "A" else (v.rows,)), (0,)
    nb = len(v.y_batch)
    perm = _perm(v)
    M = v.a_shape[-2] if v.operand == "B" else v.b_shape[-1]
    axes = [int(a) for a in np.argsort(perm + [nb, nb + 1])]
    if v.operand == "A":  # the result is Y^T
        axes[-2], axes[-1] = axes[-1], axes[-2]
    return tuple(v.y_batch[i] for i in perm) + (M, v.N), tuple(axes)


def bias_per_group(v: ProductView, C_shape: tuple) -> bool:
    """Whether a bias of ``C_shape`` can be added on the crossbar side as ``[G, 1, N]``: it may
    vary only along the grouped axes and the programmed columns (operand B only)."""
    if v.op_type != "Gemm" or v.operand != "B":
        return v.op_type == "Gemv" and v.operand == "A" and len(C_shape) <= 1
    out = v.y_batch + (v.a_shape[-2], v.N)
    cs = (1,) * (len(out) - len(C_shape)) + tuple(C_shape)
    if len(cs) != len(out):
        return False
    free = set(v.grouped) | {len(out) - 1}
    return all(d == 1 for i, d in enumerate(cs) if i not in free)


def bias_array(v: ProductView, C: np.ndarray) -> np.ndarray:
    """A bias for which :func:`bias_per_group` holds, as ``[G, 1, N]``."""
    if v.op_type == "Gemv":
        return np.broadcast_to(C, (v.N,)).reshape(1, 1, v.N)
    out = v.y_batch + (v.a_shape[-2], v.N)
    cs = (1,) * (len(out) - C.ndim) + C.shape
    full = np.broadcast_to(C.reshape(cs), tuple(out[i] if i in v.grouped else 1
                                                 for i in range(len(v.y_batch))) + (1, v.N))
    nb = len(v.y_batch)
    return np.ascontiguousarray(full.transpose(_perm(v) + [nb, nb + 1])).reshape(v.G, 1, v.N)


def constant_operand(op: OpInfo) -> tuple[str | None, str]:
    """``(programmed operand or None, why)`` of a cinm Gemm/Gemv from its operands' constness:
    the constant operand is the one programmed (Gemm: ``B`` before ``A``; Gemv: the matrix
    ``A`` before the vector); None when both are activations."""
    if op.op_type == "Gemm":
        a, b = op.inputs[0], op.inputs[1]
        if b.const:
            return "B", f"constant B {b.shape} programmed"
        if a.const:
            return "A", f"constant A {a.shape} programmed as A^T"
    else:
        a, b = op.inputs[0], op.inputs[1]
        if a.const:
            return "A", f"constant matrix {a.shape} programmed as A^T"
        if b.const:
            return "B", f"constant vector {b.shape} programmed as one column"
    return None, "both operands are activations"


def op_view(op: OpInfo, operand: str) -> ProductView:
    """The :class:`ProductView` of a cinm Gemm/Gemv node with static shapes (symbolic dims as 1)."""
    a, b = op.inputs[0].static_shape, op.inputs[1].static_shape
    return view(op.op_type, operand, a, b)


def choose_operand(op: OpInfo, array: CrossbarArray) -> tuple[str, bool, str]:
    """``(programmed operand, is it constant, why)``: the constant operand
    (:func:`constant_operand`), else the activation whose tiles on ``array`` are fewer (it is
    rewritten every inference; ties program ``B``)."""
    operand, why = constant_operand(op)
    if operand is not None:
        return operand, True, why
    tiles = {}
    for cand in ("B", "A"):
        v = op_view(op, cand)
        tiles[cand] = v.G * -(-v.K // array.rows) * -(-v.N // array.cols)
    pick = "B" if tiles["B"] <= tiles["A"] else "A"
    return pick, False, (f"both operands are activations: programming {pick} costs "
                         f"{tiles[pick]} tile writes per inference, the other "
                         f"{tiles['B' if pick == 'A' else 'A']}")
