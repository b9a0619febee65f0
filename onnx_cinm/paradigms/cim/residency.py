"""Residency: which kernels keep their tiles programmed when they share a chip's ``P`` crossbars.

A chip has ``P`` crossbars for all the crossbar kernels of a model (field notes ``crossbar.md``
§3). With the weight-stationary order (:mod:`.schedule`):

- if every kernel's tiles fit together (``sum T_k <= P``) and every programmed operand is
  constant, each kernel keeps its tiles resident in crossbars of its own: all are programmed
  once, at load, and no tile is written per inference;
- otherwise whole kernels are *pinned* so that as many tiles as possible fit in ``P - 1``
  crossbars (:func:`pin`, a 0/1 knapsack: every pinned tile saves one write per inference; one
  crossbar must stay free for the rest) and the others stream through the remaining ``P_s``
  crossbars. One streaming kernel is evicted by nobody and keeps the serpentine schedule
  (``T_k - P_s`` writes per inference); several evict each other, so each writes all its tiles
  every inference (``shared``). A kernel whose programmed operand is an activation always
  streams.

Kernels over the same weights (one constant programmed the same way, e.g. the per-step
recurrent Gemms of an unrolled LSTM over its ``R``) share one *tile set*: the caller passes each
set once, with ``uses``, the kernels that run over it. A set's tiles are programmed once and
count once against ``P``; pinning it saves one write per tile per *use*, so the knapsack values
a set at ``T * uses`` (:func:`pin`).

The naive order keeps no tile, so it needs no allocation (the caller plans each kernel alone).
"""
from __future__ import annotations

import numpy as np


def pin(tiles: list[int], const: list[bool], capacity: int,
        uses: list[int] | None = None) -> set[int]:
    """Indices of the tile sets to pin: the most tile writes saved per inference (``tiles[i] *
    uses[i]``; ``uses`` defaults to 1 each) in at most ``capacity`` crossbars, whole sets with
    a constant programmed operand only (0/1 knapsack by dynamic programming over the capacity;
    ties keep the earlier sets: of equal totals the one found first, at the fewest crossbars).

    The table is one row of totals per capacity, updated per set with numpy, and the choice is
    read back from the per-set "taken" rows; capacities above all eligible sets' tiles are not
    tabled (they all hold the same total as that sum, which comes first).
    """
    uses = uses or [1] * len(tiles)
    items = [i for i, (t, c) in enumerate(zip(tiles, const)) if c and 0 < t <= capacity]
    cap = min(capacity, sum(tiles[i] for i in items))
    best = np.zeros(max(cap, 0) + 1, dtype=np.int64)
    taken = []
    for i in items:
        t = tiles[i]
        cand = best[:cap + 1 - t] + t * uses[i]  # best[c - t] + value, for c = t..cap
        better = cand > best[t:]
        best[t:][better] = cand[better]
        taken.append(better)
    c, out = int(np.argmax(best)), set()  # the first capacity with the most saved
    for i, better in zip(reversed(items), reversed(taken)):
        t = tiles[i]
        if c >= t and better[c - t]:
            out.add(i)
            c -= t
    return out


def allocate(tiles: list[int], const: list[bool], crossbars: int,
             uses: list[int] | None = None) -> list[tuple[int, bool]]:
    """The crossbars of each kernel (or tile set) under the weight-stationary order (module
    docstring).

    Args:
        tiles: ``T_k`` of each kernel alone (``CrossbarPlan.tiles``), in execution order; one
            entry per tile set when kernels share one (the set's first kernel's place).
        const: whether each kernel's programmed operand is constant.
        crossbars: ``P``, the chip's crossbars.
        uses: kernels running over each tile set per inference (default 1 each): the
            knapsack's value (0: none runs per inference, as in an If branch the planning
            probe did not see taken; such a set is pinned only when everything fits).

    Returns:
        ``[(crossbars used, shared)]`` per kernel: a resident or pinned kernel gets ``T_k``
        crossbars of its own (``shared`` False); a streaming one the ``P_s = P - pinned tiles``
        left, ``shared`` when another kernel streams through them too. Plan each kernel with
        ``schedule.plan(..., crossbars=used, shared=shared)``.
    """
    if all(const) and sum(tiles) <= crossbars:  # each kernel on crossbars of its own
        return [(t, False) for t in tiles]
    pinned = pin(tiles, const, crossbars - 1, uses)
    used = sum(tiles[i] for i in pinned)
    shared = len(tiles) - len(pinned) > 1
    return [(tiles[i], False) if i in pinned else (crossbars - used, shared)
            for i in range(len(tiles))]
