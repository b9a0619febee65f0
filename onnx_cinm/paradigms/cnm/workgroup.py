"""Workgroups of the cnm paradigm: how many units, how much data each, what a thread streams.

All sizes are bytes or element counts (ints); ``esize`` is the bytes of one element. The
functions are the rules the UPMEM mapping has used since it was written (field notes
``upmem.md`` §4: equal, padded shares per DPU because one host transfer moves one length to all
of them; powers of two of DPUs; the largest WRAM block that fits), stated for any
:class:`~onnx_cinm.paradigms.cnm.NearMemoryArray`.
"""
from __future__ import annotations

from . import NearMemoryArray


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of integers."""
    return -(-int(a) // int(b))


def align_up(n, align: int) -> int:
    """``n`` (truncated to an int) rounded up to a multiple of ``align`` bytes."""
    return -(-int(n) // align) * align


def share(n: int, units: int, esize: int, align: int) -> int:
    """Elements per unit when ``n`` elements are scattered over ``units``: ``ceil(n / units)``,
    rounded up so that the share is a whole number of ``align``-byte words (every unit gets
    the same padded length)."""
    per = cdiv(max(n, 1), units)
    unit = max(1, align // esize) if align % esize == 0 else align
    return cdiv(per, unit) * unit


def unit_counts(limit: int, work_items: int) -> list[int]:
    """Unit counts worth trying: the powers of two below ``limit`` and ``limit`` itself, none
    above ``work_items`` (a unit without work only adds transfer and launch time)."""
    out, d = [], 1
    while d < limit:
        out.append(d)
        d *= 2
    out.append(limit)
    cap = max(1, work_items)
    return sorted({min(c, cap) for c in out})


def grid_splits(units: int) -> list[int]:
    """Column blocks of a ``row blocks x column blocks`` grid of ``units`` units (a matrix
    product): 1, every power of two dividing ``units``, and ``units`` itself."""
    splits, c = [1], 2
    while c <= units:
        if units % c == 0:
            splits.append(c)
        c *= 2
    if units not in splits:
        splits.append(units)
    return splits


def workgroups(work_items: int, max_units: int, units: int | None = None,
               grid: bool = False) -> list[tuple[int, int]]:
    """``[(units, column blocks)]`` to consider: :func:`unit_counts` up to ``max_units`` (or
    exactly ``units``); with ``grid`` (matrix products) each with every :func:`grid_splits`
    column split, else with 1."""
    out = []
    for d in ([units] if units else unit_counts(max_units, work_items)):
        out += [(d, dc) for dc in (grid_splits(d) if grid else [1])]
    return out


def scratch_block(array: NearMemoryArray, threads: int, buffers: int, private_bytes: int = 0,
                  shared_bytes: int = 0, stack_bytes: int = 0, reserved: int = 0) -> int:
    """The scratchpad block per thread, bytes: the largest multiple of ``array.align_bytes``
    that is <= ``array.block_max_bytes`` with ``threads * (stack + buffers * block + private)
    + shared + reserved <= array.scratch_bytes``. Returns 0 if not one aligned word fits
    (``buffers`` <= 0: one word, nothing to stream).

    Example (UPMEM, 64 KiB WRAM, 8-byte DMA words up to 2048 B): 16 tasklets, 2 buffers,
    1024-B stacks, 2048 B reserved: ``(65536 - 2048 - 16 * 1024) / (16 * 2) = 1472``.
    """
    free = array.scratch_bytes - reserved - shared_bytes - threads * (stack_bytes + private_bytes)
    if free <= 0 or buffers <= 0:
        return 0 if buffers > 0 else min(array.block_max_bytes, array.align_bytes)
    per = free // (threads * buffers)
    return int(min(array.block_max_bytes, per // array.align_bytes * array.align_bytes))


def blocks(nbytes: int, block: int, threads: int) -> tuple[int, int]:
    """``(blocks, blocks of the busiest thread)`` when ``nbytes`` of one unit stream through
    scratchpad blocks of ``block`` bytes, the blocks dealt out evenly to ``threads``."""
    total = cdiv(nbytes, block) if nbytes else 0
    return total, (cdiv(total, threads) if total else 0)
