"""A mapping search per op: DPUs, column blocks, tasklets and WRAM block sizes under the cost model.

:func:`~onnx_cinm.devices.upmem.mapping.plan_op` maps by rule: the target's default tasklets, the largest WRAM
block that fits, the best DPU count and column split. :func:`search_plan` searches the workgroup
and the tiling jointly (after ATiM, ISCA 2025, and Cinnamon's search over DPUs, tasklets and
tiles, as issue 14 summarises them) and keeps the rule's plan as its starting point and floor:
it returns a plan that is never slower under the model (:attr:`CostBreakdown.latency_s`), and
the rule's own plan when nothing beats it.

The space: every ``(DPUs, column blocks)`` the rule considers
(:func:`~onnx_cinm.devices.upmem.mapping.workgroups`) x tasklets (:func:`tasklet_counts`: up to the
target's limit) x WRAM blocks (:func:`blocks`: the largest that fits, the DMA limit and smaller
powers of two). If it holds at most ``max_plans`` plans it is searched exhaustively; otherwise by
coordinate descent from the rule's plan (each dimension in turn over all its values, the others
fixed, until a round changes nothing). Both walk the space in a fixed order and break ties
towards the earlier (simpler) plan, so the result is deterministic; ``max_plans`` bounds the
work (the time: each plan is one cost evaluation). ``budget_s`` is a wall-clock safety net: if
it runs out first, the best plan so far is returned and its record says so (then the result
depends on the machine's speed).

The winning plan records the search in ``CnmPlan.search`` (node attribute ``cnm_search``):
method, plans evaluated, the rule's and the winner's modeled latency, and what changed.
"""
from __future__ import annotations

import time
from dataclasses import replace

from ...errors import CinmError
from ..base import OpInfo
from .cost import DEFAULT_PARAMS, UpmemParams
from .mapping import (DEFAULT_DPUS, DEFAULT_TASKLETS, CnmPlan, make_plan, memoized, params_key,
                      plan_op, workgroups)

#: Tasklet counts tried below the target's most (>= 11 fill the pipeline, PrIM §3; fewer leave
#: WRAM to larger blocks); the most itself is always tried (:func:`tasklet_counts`).
TASKLETS = (1, 2, 4, 8, 11, 12, 14, 16, 20)
#: WRAM blocks tried besides the largest that fits and the DMA limit (:func:`blocks`), bytes.
BLOCKS = (1024, 512, 256, 128, 64)


def tasklet_counts(params: UpmemParams) -> list[int]:
    """The tasklet counts the search tries on ``params``' DPUs: :data:`TASKLETS` up to
    ``params.max_tasklets``, and that most."""
    return sorted({t for t in TASKLETS if t <= params.max_tasklets} | {params.max_tasklets})


def blocks(params: UpmemParams) -> tuple:
    """The WRAM blocks the search tries, bytes: the largest that fits (None), the DMA limit
    ``params.dma_max`` and the smaller ones of :data:`BLOCKS`."""
    return (None, params.dma_max) + tuple(b for b in BLOCKS if b < params.dma_max)
#: Default evaluation bound of one search (plans costed).
MAX_PLANS = 3000


def _lat(p: CnmPlan) -> float:
    return p.cost().latency_s


#: Memo of :func:`search_plan` (placement, pricing and lowering ask for the same op, and the
#: ops of one shape share their plan; :func:`.mapping.memoized`).
_SEARCHES: dict = {}


def search_plan(op: OpInfo, max_dpus: int = DEFAULT_DPUS, params: UpmemParams = DEFAULT_PARAMS,
                max_plans: int = MAX_PLANS, budget_s: float = 5.0,
                tasklets: int = DEFAULT_TASKLETS) -> CnmPlan:
    """The best plan of ``op`` found by searching DPUs, column blocks, tasklets and WRAM blocks,
    never slower than ``plan_op(op, max_dpus, tasklets, params)`` (the rule's plan, returned
    when nothing beats it).

    Args:
        op: the op (shapes resolved).
        max_dpus: most DPUs; params: cost-model constants (their ``max_tasklets`` bounds the
            tasklets tried); tasklets: the rule's tasklets (the floor plan's).
        max_plans: most plans costed (the time bound, deterministic).
        budget_s: wall-clock safety net, seconds.

    Memoized per op signature and arguments (:func:`.mapping.memoized`): an op of a shape
    searched before gets that search's plan, with its own input names.

    Raises:
        CinmError: not even the rule's plan fits.
    """
    return memoized(_SEARCHES, (max_dpus, params_key(params), max_plans, budget_s, tasklets), op,
                    lambda: _search(op, max_dpus, params, max_plans, budget_s, tasklets))


def _search(op: OpInfo, max_dpus: int, params: UpmemParams, max_plans: int, budget_s: float,
            tasklets: int) -> CnmPlan:
    t0 = time.perf_counter()
    floor = plan_op(op, max_dpus=max_dpus, tasklets=tasklets, params=params)
    floor_lat = _lat(floor)
    groups = workgroups(op, max_dpus)
    tks, blks = tasklet_counts(params), blocks(params)
    space = len(groups) * len(tks) * len(blks)
    seen: dict = {}
    state = {"evals": 0, "timeout": False}

    def cost_of(d: int, dc: int, t: int, blk) -> float | None:
        key = (d, dc, t, blk)
        if key in seen:
            return seen[key][0]
        if state["evals"] >= max_plans or time.perf_counter() - t0 > budget_s:
            state["timeout"] = state["timeout"] or time.perf_counter() - t0 > budget_s
            return None
        state["evals"] += 1
        try:
            p = make_plan(op, d, t, "cinm", params, floor.stack_bytes, dc, block_bytes=blk)
        except CinmError:
            seen[key] = (None, None)
            return None
        seen[key] = (_lat(p), p)
        return seen[key][0]

    dc0 = floor.g.get("grid", (floor.dpus, 1))[1]
    start = (floor.dpus, dc0, floor.tasklets, None)
    best_key, best_lat = start, floor_lat
    seen[start] = (floor_lat, floor)

    def consider(key) -> None:
        nonlocal best_key, best_lat
        lat = cost_of(*key)
        if lat is not None and lat < best_lat * (1 - 1e-9):
            best_key, best_lat = key, lat

    if space <= max_plans:
        method = "exhaustive"
        for d, dc in groups:
            for t in tks:
                for blk in blks:
                    consider((d, dc, t, blk))
    else:
        method = "coordinate descent"
        for _ in range(8):
            before = best_key
            d, dc, t, blk = best_key
            for g in groups:
                consider((*g, t, blk))
            d, dc, t, blk = best_key
            for tt in tks:
                consider((d, dc, tt, blk))
            d, dc, t, blk = best_key
            for bb in blks:
                consider((d, dc, t, bb))
            if best_key == before or state["evals"] >= max_plans or state["timeout"]:
                break
    best = seen[best_key][1]
    changes = [f"{name} {a}->{b}" for name, a, b in (
        ("dpus", floor.dpus, best.dpus), ("tasklets", floor.tasklets, best.tasklets),
        ("block", floor.block_bytes, best.block_bytes),
        ("grid", floor.g.get("grid"), best.g.get("grid"))) if a != b]
    note = (f"{method}: {state['evals']} of {space} plans"
            + (", stopped by the time budget" if state["timeout"] else "")
            + f"; rule {floor_lat * 1e6:.4g} us -> {best_lat * 1e6:.4g} us"
            + (f" ({', '.join(changes)})" if changes else " (the rule's plan)"))
    return replace(best, search=note)
