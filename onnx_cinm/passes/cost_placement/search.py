"""Cost placement's search: a dynamic program on chains, local search and repair, pricing as
compiled (model-wide device plans) and the polishing moves; :func:`solve` runs them."""
from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass


from ... import devices
from ...devices import Priced
from ...dialects import cinm
from ...errors import CinmError
from ..pass_options import OBJECTIVES
from ..placement_rules import heuristic
from .evaluate import Totals, _add_choice, evaluate, tensor_cost, violations
from .problem import Choice, Problem, _choice


# --------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------

def _f(objective: str, lat: float, en: float, w=None) -> float:
    if w is not None:
        return w[0] * lat + w[1] * en
    return {"latency": lat, "energy": en, "edp": lat * en}[objective]


def _local_delta(prob: Problem, assign: dict, i: int, new: Choice) -> tuple[float, float]:
    """Change of (latency, energy) if decision node ``i`` moves to ``new``."""
    old = assign[i]
    dl = new.cost.latency_s - old.cost.latency_s
    de = new.cost.energy_j - old.cost.energy_j
    for k in prob.touch.get(i, ()):
        t = prob.tensors[k]
        s0, j0, _ = tensor_cost(prob, t, lambda n: prob.device_of(assign, n))
        s1, j1, _ = tensor_cost(prob, t, lambda n: new.device if n == i else prob.device_of(assign, n))
        dl += s1 - s0
        de += j1 - j0
    return dl, de


def local_search(prob: Problem, assign: dict, objective: str, w=None, max_sweeps: int = 30) -> dict:
    """Move one op at a time to the device that lowers the objective most while every
    constraint holds, until no move helps (each move lowers the exact objective: it ends)."""
    assign = dict(assign)
    tot = evaluate(prob, assign)
    for _ in range(max_sweeps):
        moved = False
        for i in prob.decision:
            cur = _f(objective, tot.latency_s, tot.energy_j, w)
            best, best_val, best_d = None, cur, None
            for ch in prob.cands[i]:
                if ch is assign[i]:
                    continue
                dl, de = _local_delta(prob, assign, i, ch)
                val = _f(objective, tot.latency_s + dl, tot.energy_j + de, w)
                if val < best_val - 1e-15 * max(abs(cur), 1e-30):
                    trial = _swap_totals(tot, assign[i], ch, dl, de)
                    if not violations(prob, trial):
                        best, best_val, best_d = ch, val, trial
            if best is not None:
                assign[i] = best
                tot = best_d
                moved = True
        if not moved:
            break
    return assign


def _swap_totals(tot: Totals, old: Choice, new: Choice, dl: float, de: float) -> Totals:
    t = _copy_totals(tot)
    # node costs: remove old, add new; the transfer part of dl/de is carried in the totals
    _add_choice(t, old, -1)
    _add_choice(t, new, +1)
    t.latency_s = tot.latency_s + dl
    t.energy_j = tot.energy_j + de
    return t


def _neighbors(prob: Problem) -> dict:
    """``{decision op: decision ops sharing a tensor with it}`` (whose move changes its
    transfers)."""
    if prob.neighbors is None:
        dec = set(prob.decision)
        out: dict = {i: set() for i in prob.decision}
        for t in prob.tensors:
            ops = {t.producer, *t.consumers} & dec
            for i in ops:
                out[i] |= ops
        prob.neighbors = out
    return prob.neighbors


def repair(prob: Problem, assign: dict, objective: str, w=None) -> dict:
    """Move ops off constrained devices until every constraint holds, each time the move that
    costs the least objective per unit of budget freed; the all-host placement always satisfies
    them, so this ends.

    Incremental: the moves of an op are priced once and again only after it or an op sharing a
    tensor with it moved; for an objective that is a weighted sum (not ``edp``) the cheapest
    move comes from a heap, so a repair of ``n`` moves costs ``O(n log n)``, not a re-scan of
    the graph per move."""
    assign = dict(assign)
    tot = evaluate(prob, assign)
    linear = w is not None or objective != "edp"
    pos = {i: k for k, i in enumerate(prob.decision)}
    near = _neighbors(prob)
    version = dict.fromkeys(prob.decision, 0)
    moves: dict = {}
    heap: list = []

    def price(i: int) -> None:
        ch, out = assign[i], []
        if ch.kept_tiles or ch.cost.writes or ch.mram_resident:
            cur = _f(objective, tot.latency_s, tot.energy_j, w)
            for k, alt in enumerate(prob.cands[i]):
                if alt.kept_tiles + alt.mram_resident >= ch.kept_tiles + ch.mram_resident and \
                        alt.cost.writes >= ch.cost.writes:
                    continue
                dl, de = _local_delta(prob, assign, i, alt)
                freed = (ch.kept_tiles - alt.kept_tiles) + (ch.cost.writes - alt.cost.writes) \
                    + (ch.mram_resident - alt.mram_resident) / 2**20
                out.append((k, alt, dl, de, max(freed, 1e-9)))
                if linear:
                    loss = _f(objective, tot.latency_s + dl, tot.energy_j + de, w) - cur
                    heapq.heappush(heap, (loss / out[-1][4], pos[i], k, version[i], i, len(out) - 1))
        moves[i] = out

    for i in prob.decision:
        price(i)
    for _ in range(len(prob.decision) + 1):
        if not violations(prob, tot):
            return assign
        best = None
        if linear:
            while heap and heap[0][3] != version[heap[0][4]]:
                heapq.heappop(heap)
            if heap:
                _, _, _, _, i, m = heap[0]
                best = (i, moves[i][m])
        else:
            cur = _f(objective, tot.latency_s, tot.energy_j, w)
            score = None
            for i in prob.decision:
                for mv in moves[i]:
                    sc = (_f(objective, tot.latency_s + mv[2], tot.energy_j + mv[3], w) - cur) / mv[4]
                    if score is None or sc < score:
                        score, best = sc, (i, mv)
        if best is None:
            break
        i, (_, alt, dl, de, _) = best
        tot = _swap_totals(tot, assign[i], alt, dl, de)
        assign[i] = alt
        for j in near.get(i, ()) | {i}:
            version[j] += 1
            price(j)
    host = {i: prob.cands[i][0] for i in prob.decision}
    return assign if not violations(prob, evaluate(prob, assign)) else host


#: Most states the dynamic program keeps per op (device x kept tiles); beyond it the best ones
#: are kept and the result is no longer claimed exact.
MAX_DP_STATES = 4096


def chain_dp(prob: Problem, w: tuple[float, float]) -> tuple[dict, bool]:
    """Dynamic program over the decision ops in graph order minimizing ``w[0] * latency +
    w[1] * energy``, with kept crossbar tiles per device in the state (residency exact).

    Each tensor is charged at the last decision op touching it, with the previous decision op's
    device known and every other op on its own device if fixed, else taken as the host. On a chain
    (every tensor touches at most two consecutive decision ops) this is the exact optimum, unless
    more than :data:`MAX_DP_STATES` states had to be pruned. Returns ``(assignment, exact)``.
    """
    dec = prob.decision
    pos = {i: k for k, i in enumerate(dec)}
    owner: dict[int, list] = {}
    chain = True
    for k, t in enumerate(prob.tensors):
        touching = sorted({pos[n] for n in {t.producer, *t.consumers} if n in pos})
        if not touching:
            continue
        if len(touching) > 2 or (len(touching) == 2 and touching[1] - touching[0] != 1):
            chain = False
        owner.setdefault(dec[touching[-1]], []).append(k)
    residency = prob.constraints.crossbar_residency
    fixed_tot = Totals()
    for i, ch in prob.fixed.items():
        if prob.nodes[i].domain == cinm.DOMAIN:
            _add_choice(fixed_tot, ch)
    # state: (device name, kept-tiles tuple) -> (value, back pointer)
    xbar_devs = sorted({c.device for i in dec for c in prob.cands[i] if c.capacity})
    caps = {}
    for i in dec:
        for c in prob.cands[i]:
            if c.capacity:
                caps[c.device] = c.capacity
    start = tuple(fixed_tot.kept_tiles.get(d, 0) for d in xbar_devs)
    xidx = {d: j for j, d in enumerate(xbar_devs)}
    layers = [{(None, start): (0.0, None, None)}]
    for k, i in enumerate(dec):
        prev_i = dec[k - 1] if k else None
        local: dict = {}
        nxt: dict = {}
        for (pdev, res), (val, _, _) in layers[-1].items():
            for ch in prob.cands[i]:
                r = res  # the kept tiles after ``ch``: only its own crossbar device's change
                if ch.capacity and ch.device in xidx:
                    j = xidx[ch.device]
                    kept = res[j] + ch.kept_tiles
                    if residency and kept > caps[ch.device]:
                        continue
                    r = (*res[:j], kept, *res[j + 1:])
                key = (pdev, ch.device)
                if key not in local:
                    lat, en = ch.cost.latency_s, ch.cost.energy_j

                    def dev_of(n, _p=pdev, _d=ch.device):
                        if n == i:
                            return _d
                        if n == prev_i and _p is not None:
                            return _p
                        return prob.fixed[n].device if n in prob.fixed else "host"

                    for tk in owner.get(i, ()):
                        s, j_, _ = tensor_cost(prob, prob.tensors[tk], dev_of)
                        lat += s
                        en += j_
                    local[key] = w[0] * lat + w[1] * en
                v = val + local[key]
                sk = (ch.device, r)
                cur = nxt.get(sk)
                if cur is None or v < cur[0]:
                    nxt[sk] = (v, (pdev, res), ch)
        if not nxt:  # no state meets the residency: fall back to the host for this op
            host = prob.cands[i][0]
            for (pdev, res), (val, _, _) in layers[-1].items():
                sk = ("host", res)
                if sk not in nxt or val < nxt[sk][0]:
                    nxt[sk] = (val, (pdev, res), host)
        if len(nxt) > MAX_DP_STATES:  # many crossbars and many sizes: keep the best states
            keep = sorted(nxt, key=lambda sk: nxt[sk][0])[:MAX_DP_STATES]
            nxt = {sk: nxt[sk] for sk in keep}
            chain = False  # no longer a proof of optimality
        layers.append(nxt)
    assign: dict = {}
    if dec:
        state = min(layers[-1], key=lambda s: layers[-1][s][0])
        for k in range(len(dec), 0, -1):
            _, back, ch = layers[k][state]
            assign[dec[k - 1]] = ch
            state = back
    return assign, chain


@dataclass
class Solution:
    """The outcome of :func:`solve`: the assignment, its totals, how it was found, and the
    totals of the baselines (:func:`baselines`: all on host, heuristic) under the same model;
    empty when the problem has hints (the baselines leave them out, so they need a problem
    built without them)."""

    assign: dict
    totals: Totals
    method: str
    baselines: dict
    exact: bool


def baselines(prob: Problem) -> dict:
    """Totals of the reference placements of ``prob`` (:class:`Totals`, keyed by name):
    ``all-host`` (every op on the host) and, when the heuristic's devices all price its ops,
    ``heuristic`` (:func:`heuristic_assign`). ``prob`` must be built without hints: they are
    the user's choice for the placed model, and an all-host plan with hinted crossbar ops is
    no all-host plan (:func:`.place_by_cost` builds a hint-free problem for them)."""
    out = {"all-host": evaluate(prob, {i: prob.cands[i][0] for i in prob.decision})}
    heur = heuristic_assign(prob)
    if heur is not None:
        out["heuristic"] = evaluate(prob, heur)
    return out


def heuristic_assign(prob: Problem) -> dict | None:
    """The paper heuristic's devices as an assignment (None if one of its devices has no cost
    for an op, e.g. it exceeds the DPUs' MRAM under the current options)."""
    devs = {i: heuristic(prob.ops[i], prob.options)[0] for i in prob.decision}
    out = _with_variants(prob, devs)
    return None if any(ch is None for ch in out.values()) else out


def _recorded(prob: Problem, i: int, dev: str) -> Priced | None:
    """The choice node ``i``'s recorded plan made if it is already lowered onto ``dev`` (then
    it is used as it is), else None."""
    at = prob.ops[i].attrs
    if at.get("device") != dev:
        return None
    return devices.get_device(dev).recorded(at)


def _together(dev: str) -> bool:
    """Whether ``dev`` plans the ops placed on it together (:attr:`Device.plans_together`)."""
    return devices.get_device(dev).plans_together


def _shared_plans(prob: Problem, dev: str, idx: list) -> dict:
    """``{op index: Priced}`` of the ops ``idx`` (execution order) on ``dev``, a device that
    plans its ops together, as its :meth:`Device.price_all` allocates the shared resources
    among all of them; empty when it cannot plan them (the candidates' figures stand)."""
    try:
        plans = devices.get_device(dev).price_all([(prob.ops[i], prob.options) for i in idx])
    except Exception:  # noqa: BLE001 - no plan: the candidates' own figures stand
        return {}
    return {} if plans is None else dict(zip(idx, plans))


def _plans(prob: Problem, devs: dict) -> dict:
    """``{op index: Priced}`` for the ops ``devs`` puts on devices that plan together, as each
    device's :meth:`Device.price_all` allocates the shared resources among all of them (the
    plan already recorded on a lowered node is used as it is)."""
    out, groups = {}, {}
    for i, dev in devs.items():
        rec = _recorded(prob, i, dev)
        if rec is not None:
            out[i] = rec
        elif _together(dev):
            groups.setdefault(dev, []).append(i)
    for dev, idx in groups.items():
        out.update(_shared_plans(prob, dev, idx))
    return out


def _variant(prob: Problem, i: int, dev: str, a: Priced | None) -> Choice | None:
    """The choice of op ``i`` on ``dev`` priced from its model-wide plan ``a`` (a device that
    plans together, or a recorded plan), else the device's first candidate; None if ``dev``
    has no choice for the op."""
    opts = [c for c in prob.cands[i] if c.device == dev]
    if not opts:
        return None
    c = opts[0]
    if a is None:
        return c
    # a plan that does not count its bytes (a recorded UPMEM plan) takes the candidate's
    return _choice(dev, a, c.capacity, c.mram_capacity, c.note,
                   bytes_moved=a.cost.bytes_moved or c.cost.bytes_moved)


def _with_variants(prob: Problem, devs: dict) -> dict:
    """Choices for the device of every op in ``devs``, priced as compiled: on a device that plans
    its ops together, from its model-wide plan (for crossbars: the crossbars the kernel really
    gets, the tiles it really keeps and writes), elsewhere the device's candidate; None if the
    device has no choice for the op.

    The search prices a crossbar op by one of two candidates (pinned with all ``P`` crossbars,
    or streamed with every tile rewritten); a kernel that streams alone through the crossbars
    the pinned ones leave keeps some tiles and runs on fewer crossbars than either assumes, so
    every assignment that is reported is priced here, from the plans.
    """
    plans = _plans(prob, devs)
    return {i: _variant(prob, i, dev, plans.get(i)) for i, dev in devs.items()}


def _as_compiled(prob: Problem, assign: dict) -> dict:
    """``assign`` with its crossbar choices priced from the model-wide plans."""
    return _with_variants(prob, {i: c.device for i, c in assign.items()})


def _copy_totals(tot: Totals) -> Totals:
    return Totals(tot.latency_s, tot.energy_j, tot.transfer_s, tot.transfer_j, tot.transfer_bytes,
                  tot.writes, Counter(tot.kept_tiles), dict(tot.capacity),
                  Counter(tot.writes_by_dev), Counter(tot.mram), dict(tot.mram_capacity))


class _Compiled:
    """An assignment priced as compiled (:func:`_as_compiled`), whose single-op moves are priced
    incrementally: a move re-prices the moved op, the transfers of the tensors it touches and,
    on a device that plans together which it leaves or joins, the model-wide plans of that
    device's ops (the only ones the move can change), instead of compiling and evaluating the whole graph."""

    def __init__(self, prob: Problem, assign: dict):
        self.prob = prob
        self.assign = _as_compiled(prob, assign)
        self.tot = evaluate(prob, self.assign)
        self._variants: dict = {}

    def _variant(self, i: int, dev: str, a: Priced | None) -> Choice | None:
        """:func:`_variant`, memoized per op and plan (the device's plans are memoized too, so
        most moves find the choices they priced before)."""
        key = (i, dev, id(a))
        hit = self._variants.get(key)
        if hit is None or hit[0] is not a:
            hit = self._variants[key] = (a, _variant(self.prob, i, dev, a))
        return hit[1]

    def trial(self, i: int, dev: str) -> tuple[dict, Totals]:
        """``(changed choices {op index: Choice}, totals)`` of moving op ``i`` to ``dev``."""
        prob, assign = self.prob, self.assign
        old_dev = assign[i].device
        changed = {}
        for d in {old_dev, dev}:
            if not _together(d):
                continue
            idx = [j for j in prob.decision
                   if (dev if j == i else assign[j].device) == d and not _recorded(prob, j, d)]
            plans = _shared_plans(prob, d, idx)
            for j in idx:
                ch = self._variant(j, d, plans.get(j))
                if ch is not assign[j] and ch != assign[j]:
                    changed[j] = ch
        if i not in changed:
            changed[i] = _variant(prob, i, dev, _recorded(prob, i, dev))
        tot = _copy_totals(self.tot)
        for j, ch in changed.items():
            _add_choice(tot, assign[j], -1)
            _add_choice(tot, ch, +1)
        for k in prob.touch.get(i, ()):
            t = prob.tensors[k]
            s0, j0, b0 = tensor_cost(prob, t, lambda n: prob.device_of(assign, n))
            s1, j1, b1 = tensor_cost(prob, t, lambda n: dev if n == i else prob.device_of(assign, n))
            tot.transfer_s += s1 - s0
            tot.transfer_j += j1 - j0
            tot.transfer_bytes += b1 - b0
            tot.latency_s += s1 - s0
            tot.energy_j += j1 - j0
        return changed, tot

    def apply(self, changed: dict, tot: Totals) -> None:
        """Take a move :meth:`trial` priced."""
        self.assign.update(changed)
        self.tot = tot


#: Most single-op moves :func:`_polish` prices (each re-prices the moved op, its tensors and
#: the crossbar plans of the devices it leaves or joins).
POLISH_MOVES = 400


def _polish(prob: Problem, assign: dict, objective: str) -> dict | None:
    """Single-op device changes priced as compiled, first improvement taken, until none helps
    or :data:`POLISH_MOVES` moves were priced. The search's two-candidate crossbar prices can
    miss what the model-wide plans make cheap (a kernel streaming through crossbars the others
    leave); this corrects for it on the result. Returns the improved assignment or None."""
    state = _Compiled(prob, assign)
    best = state.tot.value(objective)
    moves, better = 0, None
    changed = True
    while changed and moves < POLISH_MOVES:
        changed = False
        for i in prob.decision:
            tried: dict = {}
            for c in prob.cands[i]:
                if c.device == state.assign[i].device or moves >= POLISH_MOVES:
                    continue
                moves += 1
                if c.device not in tried:  # a device's second candidate prices the same
                    tried[c.device] = state.trial(i, c.device)
                diff, tot = tried[c.device]
                if tot.value(objective) < best * (1 - 1e-9) and not violations(prob, tot):
                    state.apply(diff, tot)
                    best, changed = tot.value(objective), True
                    better = dict(state.assign)
                    break
    return better


def solve(prob: Problem, objective: str) -> Solution:
    """Choose the devices of ``prob``'s decision ops for ``objective`` (see the module docstring)."""
    if objective not in OBJECTIVES:
        raise CinmError(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
    host = {i: prob.cands[i][0] for i in prob.decision}
    heur = heuristic_assign(prob)
    greedy = {}
    for i in prob.decision:
        greedy[i] = min(prob.cands[i], key=lambda c: _f(objective, c.cost.latency_s, c.cost.energy_j,
                                                        (1.0, 1.0) if objective == "edp" else None))
    starts = {"all-host": host, "unary": greedy}
    if heur is not None:
        starts["heuristic"] = heur
    t_host = evaluate(prob, host)
    if objective == "edp":
        lam0 = t_host.energy_j / max(t_host.latency_s, 1e-30)
        weights = [(lam0 * f, 1.0) for f in (1e-2, 1e-1, 1.0, 10.0, 100.0)]
    else:
        weights = [(1.0, 0.0) if objective == "latency" else (0.0, 1.0)]
    chain = True
    dp_feasible = True
    for k, w in enumerate(weights):
        a, chain = chain_dp(prob, w)
        if violations(prob, evaluate(prob, a)):
            dp_feasible = False
            a = repair(prob, a, objective, w)
        starts[f"dp{k}"] = a
    results = {}
    searched = {}
    for name, a in starts.items():
        if violations(prob, evaluate(prob, a)):
            a = repair(prob, a, objective)
        searched[name] = local_search(prob, a, objective)
    # the search prices crossbar ops by two candidates each; every outcome, and the starting
    # points as they are, is priced as compiled (model-wide crossbar plans) and the best wins
    finals = dict(searched)
    finals.update({f"{n} as is": starts[n] for n in ("all-host", "heuristic") if n in starts})
    finals = {n: _as_compiled(prob, a) for n, a in finals.items()}
    for name, a in finals.items():
        tot = evaluate(prob, a)
        if not violations(prob, tot):
            results[name] = (tot.value(objective), a, tot)
    if not results:
        # nothing meets every budget: hints pin too much on a device (e.g. more crossbar tiles
        # than crossbars). The crossbar plans cope (kernels that do not fit stream), so keep
        # the hinted placement and choose the rest by the objective alone.
        for name, a in finals.items():
            tot = evaluate(prob, a)
            results[name] = (tot.value(objective), a, tot)
        dp_feasible = False
    best_name = min(results, key=lambda n: results[n][0])
    _, assign, tot = results[best_name]
    if not violations(prob, tot):
        polished = _polish(prob, assign, objective)
        if polished is not None:
            best_name = "polish"
            assign, tot = polished, evaluate(prob, polished)
            results[best_name] = (tot.value(objective), assign, tot)
    dp_best = min((results[n][0] for n in results if n.startswith("dp")), default=math.inf)
    # the DP is exact on a chain when its own result needed no repair (the endurance budget is
    # not part of its state) and nothing better turned up elsewhere
    exact = chain and dp_feasible and objective != "edp" and \
        math.isclose(dp_best, results[best_name][0], rel_tol=1e-9)
    if exact:
        method = "exact dynamic program (the cinm ops form a chain)"
    else:
        method = (f"dynamic program + local search ({'chain' if chain else 'DAG'}), "
                  f"best start: {best_name if not best_name.startswith('dp') else 'dynamic program'}")
    return Solution(assign, tot, method, baselines(prob) if not prob.hint_note else {}, exact)
