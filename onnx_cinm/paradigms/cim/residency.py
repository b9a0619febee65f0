"""Residency: which kernels keep their tiles programmed when they share a chip's ``P`` crossbars.

A chip has ``P`` crossbars for all the crossbar kernels of a model (field notes ``crossbar.md``
§3). With the weight-stationary order (:mod:`.schedule`):

- if every kernel's tiles fit together (``sum T_k <= P``) and every programmed operand is
  constant, each kernel keeps its tiles resident in crossbars of its own: all are programmed
  once, at load, and no tile is written per inference;
- otherwise whole kernels are *pinned* and the others stream through the remaining ``P_s``
  crossbars. :func:`pin` (a 0/1 knapsack: every pinned tile saves one write per inference; one
  crossbar must stay free for the rest) gives the sets saving the most writes in ``c``
  crossbars, for every ``c`` up to ``P - 1``; :func:`allocate` takes, among them, the one
  whose streamed rest is best by the objective (:class:`Goal`): pinning the most can leave one
  crossbar for many streamed kernels, so that a chip with more crossbars was slower. One
  streaming kernel is evicted by nobody and keeps the serpentine schedule (``T_k - P_s``
  writes per inference); several evict each other, so each writes all its tiles every
  inference (``shared``). A kernel whose programmed operand is an activation always
  streams.

Kernels over the same weights (one constant programmed the same way, e.g. the per-step
recurrent Gemms of an unrolled LSTM over its ``R``) share one *tile set*: the caller passes each
set once, with ``uses``, the kernels that run over it. A set's tiles are programmed once and
count once against ``P``; pinning it saves one write per tile per *use*, so the knapsack values
a set at ``T * uses`` (:func:`pin`).

The naive order keeps no tile, so it needs no allocation (the caller plans each kernel alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...options import DEFAULT_OBJECTIVE
from .wear import writes_per_cell


def _table(tiles: list[int], const: list[bool], capacity: int, uses: list[int] | None):
    """The pinning knapsack's table: ``(items, cap, best, taken)``: the eligible sets (constant,
    ``0 < tiles <= capacity``), the tabled capacity ``cap``, ``best[c]`` the most tile writes
    saved per inference in at most ``c`` crossbars, and per item the boolean row saying, for
    ``c = t..cap``, whether the item improved ``best[c]`` (read back by :func:`_pinned`)."""
    uses = uses or [1] * len(tiles)
    items = [i for i, (t, c) in enumerate(zip(tiles, const)) if c and 0 < t <= capacity]
    cap = max(min(capacity, sum(tiles[i] for i in items)), 0)
    best = np.zeros(cap + 1, dtype=np.int64)
    taken = []
    for i in items:
        t = tiles[i]
        cand = best[:cap + 1 - t] + t * uses[i]  # best[c - t] + value, for c = t..cap
        better = cand > best[t:]
        best[t:][better] = cand[better]
        taken.append(better)
    return items, cap, best, taken


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
    items, _, best, taken = _table(tiles, const, capacity, uses)
    start = np.array([int(np.argmax(best))])  # the first capacity with the most saved
    x = _pinned(tiles, items, taken, start, len(tiles))
    return {int(i) for i in np.flatnonzero(x[:, 0])}


def _pinned(tiles: list[int], items: list[int], taken: list, start: np.ndarray,
            n: int) -> np.ndarray:
    """The knapsack's choice read back from every capacity of ``start`` at once: a boolean
    ``[n, len(start)]`` matrix, ``x[i, j]`` set when set ``i`` is pinned by the choice of
    capacity ``start[j]`` (the sets come back last first, as a single read-back does)."""
    x = np.zeros((n, len(start)), dtype=bool)
    c = start.copy()
    for i, better in zip(reversed(items), reversed(taken)):
        t = tiles[i]
        ok = c >= t
        if not ok.any():
            continue
        sel = np.zeros(len(c), dtype=bool)
        sel[ok] = better[c[ok] - t]
        x[i] = sel
        c -= t * sel
    return x


def allocate(tiles: list[int], const: list[bool], crossbars: int,
             uses: list[int] | None = None, *,
             goal: "Goal | None" = None) -> list[tuple[int, bool]]:
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
        goal: what the choice minimizes (:class:`Goal`); None: the knapsack's own choice, the
            most tile writes saved in ``P - 1`` crossbars, whatever it does to latency.

    Returns:
        ``[(crossbars used, shared)]`` per kernel: a resident or pinned kernel gets ``T_k``
        crossbars of its own (``shared`` False); a streaming one the ``P_s = P - pinned tiles``
        left, ``shared`` when another kernel streams through them too. Plan each kernel with
        ``schedule.plan(..., crossbars=used, shared=shared)``.
    """
    if all(const) and sum(tiles) <= crossbars:  # each kernel on crossbars of its own
        return [(t, False) for t in tiles]
    n = len(tiles)
    items, cap, best, taken = _table(tiles, const, crossbars - 1, uses)
    old = int(np.argmax(best))  # the knapsack's choice: the first capacity with the most saved
    if goal is None:
        x = _pinned(tiles, items, taken, np.array([old]), n)[:, 0]
    else:
        x = _pinned(tiles, items, taken, np.arange(cap + 1), n)
        x = x[:, goal.choose(tiles, const, uses or [1] * n, crossbars, x, old)]
    used = sum(t for t, p in zip(tiles, x) if p)
    shared = n - int(x.sum()) > 1
    return [(tiles[i], False) if x[i] else (crossbars - used, shared) for i in range(n)]


def tile_write_energy_j(params) -> float:
    """The energy one tile write adds to a crossbar plan's cost, joules: the cells'
    ``write_energy_j`` plus the periphery's busy cycles during the write (``write_latency_s x
    clock_hz x periphery_energy_per_cycle_j``), as :meth:`.schedule.CrossbarPlan.cost` counts
    them; ``params`` a :class:`~onnx_cinm.paradigms.cim.CrossbarArray`."""
    return (params.write_energy_j
            + params.write_latency_s * params.clock_hz * params.periphery_energy_per_cycle_j)


@dataclass(frozen=True)
class Goal:
    """What :func:`allocate` minimizes over its candidates, and the figures it needs.

    The candidates are the knapsack's choices for every capacity ``c = 0 .. P - 1`` (the sets
    a chip of ``c + 1`` crossbars would pin: one table holds them all), each with the kernels
    it does not pin streaming through the ``P_s = P - pinned tiles`` left. A streamed kernel's
    latency and writes per ``P_s`` are closed forms of :mod:`.schedule` (field notes
    ``crossbar.md`` §3; ``r = ceil(T / P_s)``
    rounds, ``R`` the rows its kernels stream, ``u`` the kernels that run per inference):

    - shared (several streamers, or a programmed activation): ``r * (u * write_latency + R *
      mvm_latency)`` seconds, ``T * u`` tile writes;
    - the only streamer (serpentine): ``R * mvm_latency`` and no write if ``T <= P_s``, else
      ``(r - 1) * u * write_latency + r * R * mvm_latency`` and ``(T - P_s) * u`` writes;
    - pinned: ``R * mvm_latency``, no write.

    Energy differs between candidates by the writes only (MVMs, conversions and DAC drives do
    not depend on the allocation): ``fixed_energy_j + writes * (write_energy + write_latency *
    clock * periphery_energy_per_cycle)``. So a plan on ``P`` crossbars can do whatever a
    plan on ``P' < P`` did (pin the same sets, stream through a larger rest, which never
    costs more time or writes), and taking the best candidate makes more crossbars never worse
    for the objective.

    Attributes:
        params: the chip (:class:`~onnx_cinm.paradigms.cim.CrossbarArray`; its
            ``write_latency_s``, ``mvm_latency_s``, ``write_energy_j``, ``clock_hz`` and
            ``periphery_energy_per_cycle_j`` are read).
        rows: per tile set, the rows ``M`` its kernels that run per inference stream, summed.
        objective: ``"energy"`` (fewest joules, ties by latency), ``"latency"`` (fewest
            seconds, ties by writes) or ``"edp"`` (their product, over the crossbar kernels).
        fixed_energy_j: the kernels' energy that does not depend on the allocation, joules
            (only ``edp`` reads it).
        max_writes_per_cell, lifetime_inferences: the endurance budget as cost placement
            states it (:func:`.wear.writes_per_cell` of the writes per inference over the
            crossbars the candidate's pinned sets leave, where they rotate, and
            ``lifetime_inferences``; None: no budget). Candidates over it are left out; if all
            are, those with the fewest writes stay.

    Ties (relative 1e-9) keep the knapsack's own choice, then the smallest capacity.
    """

    params: object
    rows: list
    objective: str = DEFAULT_OBJECTIVE
    fixed_energy_j: float = 0.0
    max_writes_per_cell: float | None = None
    lifetime_inferences: float = 1.0

    def figures(self, tiles: list[int], const: list[bool], uses: list[int], crossbars: int,
                x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(latency seconds, tile writes)`` per inference of every candidate (the columns of
        the pinned matrix ``x[set, candidate]``), summed over the tile sets."""
        p = self.params
        T = np.asarray(tiles, dtype=np.int64)[:, None]
        u = np.asarray(uses, dtype=np.int64)[:, None]
        R = np.asarray(self.rows, dtype=np.float64)[:, None]
        Ps = crossbars - (T * x).sum(axis=0)[None, :]
        shared = ((len(tiles) - x.sum(axis=0) > 1)[None, :]
                  | ~np.asarray(const, dtype=bool)[:, None]) & ~x
        alone = ~x & ~shared
        r = -(-T // Ps)
        read = R * p.mvm_latency_s
        lat = np.where(shared, r * (u * p.write_latency_s + read), read)
        over = alone & (T > Ps)
        lat = np.where(over, (r - 1) * u * p.write_latency_s + r * read, lat)
        writes = np.where(shared, T * u, 0) + np.where(over, (T - Ps) * u, 0)
        return lat.sum(axis=0), writes.sum(axis=0)

    def choose(self, tiles, const, uses, crossbars, x, old) -> int:
        """The index of the best candidate (column of ``x``); ``old`` is the knapsack's own."""
        lat, writes = self.figures(tiles, const, uses, crossbars, x)
        e_write = tile_write_energy_j(self.params)
        if self.objective == "latency":
            keys = (lat, writes)
        elif self.objective == "edp":
            keys = (lat * (self.fixed_energy_j + writes * e_write), lat)
        else:  # energy: the writes' share is all that differs
            keys = (writes * e_write, lat)
        ok = np.ones(len(lat), dtype=bool)
        if self.max_writes_per_cell is not None:  # on the crossbars the pinned sets leave
            pinned = (np.asarray(tiles, dtype=np.int64)[:, None] * x).sum(axis=0)
            per_cell = writes_per_cell(writes, crossbars - pinned, self.lifetime_inferences)
            ok = per_cell <= self.max_writes_per_cell * (1 + 1e-12)
            if not ok.any():
                ok = writes == writes.min()
        for key in keys:
            m = key[ok].min()
            ok &= key <= m + 1e-9 * abs(m)
        return old if ok[old] else int(np.argmax(ok))
