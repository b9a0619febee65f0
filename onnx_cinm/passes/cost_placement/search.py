"""Cost placement's search: a dynamic program on chains, local search and repair, pricing as
compiled (model-wide device plans) and the polishing moves; :func:`solve` runs them."""
from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from itertools import compress

import numpy as np


from ... import devices
from ...devices import Priced
from ...dialects import cinm
from ...errors import CinmError
from ..pass_options import OBJECTIVES
from ..placement_rules import heuristic
from .evaluate import (Totals, _add_choice, _devices, _link, breaks, evaluate, tensor_cost,
                       violations)
from .problem import Choice, Problem, _choice, placement_targets


# --------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------

def _evaluate(prob: Problem, assign: dict) -> Totals:
    """:func:`evaluate`, remembered per problem and assignment (the search evaluates a start
    to check its budgets, again to search from it, and the baselines are starts too). Keyed
    by the choice objects, which the memo keeps alive; the totals are never changed in place."""
    try:  # (by maps in C: a generator resumed per op cost 12,700 resumptions an optimize)
        key = tuple(map(id, map(assign.__getitem__, prob.decision)))
    except KeyError:  # an assignment of part of the ops
        return evaluate(prob, assign)
    hit = prob.evals.get(key)
    if hit is None:
        if len(prob.evals) > 64:
            prob.evals.clear()
        hit = prob.evals[key] = (evaluate(prob, assign), tuple(assign.values()))
    return hit[0]


def _f(objective: str, lat: float, en: float, w=None) -> float:
    """The objective of totals ``lat`` seconds and ``en`` joules (``w``: the weighted sum
    ``w[0] * lat + w[1] * en`` instead); KeyError for an unknown objective."""
    if w is not None:
        return w[0] * lat + w[1] * en
    if objective == "energy":  # the search asks this for every move it weighs
        return en
    if objective == "latency":
        return lat
    if objective == "edp":
        return lat * en
    raise KeyError(objective)


def _transfers(prob: Problem, assign: dict, i: int, dev: str, devs: list | None = None,
               ks=None) -> list:
    """:func:`tensor_cost` of every tensor op ``i`` touches (``ks``: of those tensor indices
    instead, e.g. :func:`_paid`'s), with ``i`` on ``dev`` and every other op where ``assign``
    (or the problem's fixed choices) puts it. ``devs``: those devices by node index, ``"host"``
    last (:func:`.evaluate._devices` of ``assign``), when the caller keeps them."""
    tensors = prob.tensors
    if ks is None:
        ks = prob.touch.get(i, ())
    if devs is not None:  # ``i`` put on ``dev`` in the caller's list for the time of the call:
        was, devs[i] = devs[i], dev  # its lookups are then list indexing, not a Python call
        try:
            return [tensor_cost(prob, tensors[k], devs.__getitem__) for k in ks]
        finally:
            devs[i] = was
    fixed = prob.fixed

    def dev_of(n):
        if n == i:
            return dev
        ch = fixed.get(n) or assign.get(n) if n >= 0 else None
        return ch.device if ch is not None else "host"

    return [tensor_cost(prob, tensors[k], dev_of) for k in ks]


def _paid(prob: Problem) -> dict:
    """``{decision op: the tensors it touches whose transfer may cost time or energy}``: a
    tensor every op touching it can only put on devices whose links are free both ways
    (:meth:`Device.transfer_cost` zero, e.g. UPMEM's, or the host) always costs exactly
    ``(0.0, 0.0)`` seconds and joules (its bytes may still count), so a move's change of
    latency and energy (:func:`_local_delta`) is the same without it."""
    if prob.paid is None:
        fixed, cands = prob.fixed, prob.cands
        host = frozenset({"host"})
        node_devs: dict = {-1: host}  # node -> the devices it may sit on (asked once per node)
        both_free: dict = {}  # (device, bytes) -> its links cost 0 s and 0 J both ways

        def devs(n: int) -> frozenset:
            hit = node_devs.get(n)
            if hit is None:
                hit = node_devs[n] = frozenset({fixed[n].device}) if n in fixed else \
                    frozenset({c.device for c in cands.get(n, ())} | host)
            return hit

        free = []
        for t in prob.tensors:
            nb = t.nbytes
            if nb <= 0:
                free.append(True)
                continue
            ds = devs(t.producer)
            for n in t.consumers:
                ds = ds | devs(n)
            ok = True
            for d in ds:  # (in any order: _link is a function of its arguments)
                f = both_free.get((d, nb))
                if f is None:
                    f = both_free[(d, nb)] = all(_link(prob, d, nb, way) == (0.0, 0.0)
                                                 for way in (False, True))
                if not f:
                    ok = False
                    break
            free.append(ok)
        prob.paid = {i: [k for k in prob.touch.get(i, ()) if not free[k]] for i in prob.decision}
    return prob.paid


def _local_delta(prob: Problem, assign: dict, i: int, new: Choice, base: list | None = None,
                 moved: list | None = None) -> tuple[float, float]:
    """Change of (latency, energy) if decision node ``i`` moves to ``new``. ``base``/``moved``:
    :func:`_transfers` of ``i`` on its current device / on ``new``'s, when already known."""
    old = assign[i]
    dl = new.cost.latency_s - old.cost.latency_s
    de = new.cost.energy_j - old.cost.energy_j
    if base is None:
        base = _transfers(prob, assign, i, old.device)
    if moved is None:
        moved = _transfers(prob, assign, i, new.device)
    for (s0, j0, _), (s1, j1, _) in zip(base, moved):
        dl += s1 - s0
        de += j1 - j0
    return dl, de


def local_search(prob: Problem, assign: dict, objective: str, w=None, max_sweeps: int = 30) -> dict:
    """Move one op at a time to the device that lowers the objective most while every
    constraint holds, until no move helps (each move lowers the exact objective: it ends).

    For an objective that is a weighted sum (not ``edp``) a move's gain depends only on the op
    and the ops sharing a tensor with it (one whose transfers may cost, :func:`_paid`: the
    others add exactly nothing), so an op none of whose moves gained (none was held back by a
    budget either) is not priced again until it or such a neighbour moves. A move's budgets
    are checked from the totals it changes (:func:`.evaluate.breaks`), and its totals are made
    only when it is taken."""
    assign = dict(assign)
    tot = _evaluate(prob, assign)
    linear = w is not None or objective != "edp"
    near = _neighbors(prob)
    devs = _devices(prob, assign)
    tensors, touch = prob.tensors, _paid(prob)  # the tensors whose transfers can change
    dev_of = devs.__getitem__
    now: dict = {}  # tensor index -> its tensor_cost under ``devs``, until an op touching it moves
    settled: set = set()
    bad_now = None  # whether ``tot`` breaks a budget, once asked, until ``tot`` changes
    owned = False  # ``tot`` is this search's own copy (changed in place)
    floor_l, floor_e = _rises(objective, w)
    cur = _f(objective, tot.latency_s, tot.energy_j, w)  # the objective of ``tot``, kept with it
    for _ in range(max_sweeps):
        moved = False
        for i in prob.decision:
            if i in settled:
                continue
            best, best_val, best_d, held = None, cur, None, False
            old = assign[i]
            ks = touch[i]  # none for most ops: then a move changes the op's own cost alone
            if ks:
                base = []  # _transfers of ``i`` where it is, each tensor priced once per placement
                for k in ks:
                    c = now.get(k)
                    if c is None:
                        c = now[k] = tensor_cost(prob, tensors[k], dev_of)
                    base.append(c)
                on = {old.device: base}  # the transfers depend on the device alone
            for ch in prob.cands[i]:
                if ch is old:
                    continue
                # :func:`_local_delta`, inline (the same sums in the same order)
                dl = ch.cost.latency_s - old.cost.latency_s
                de = ch.cost.energy_j - old.cost.energy_j
                if not ks and dl >= floor_l and de >= floor_e:
                    continue  # (it cannot pass the test below: the same outcome, unpriced)
                if ks:
                    moved_to = on.get(ch.device)
                    if moved_to is None:
                        moved_to = on[ch.device] = _transfers(prob, assign, i, ch.device, devs, ks)
                    for (s0, j0, _), (s1, j1, _) in zip(base, moved_to):
                        dl += s1 - s0
                        de += j1 - j0
                val = _f(objective, tot.latency_s + dl, tot.energy_j + de, w)
                if val < best_val - 1e-15 * max(abs(cur), 1e-30):
                    if bad_now is None:
                        bad_now = bool(violations(prob, tot))
                    if not (violations(prob, _swap_totals(tot, old, ch, dl, de)) if bad_now
                            else breaks(prob, tot, old, ch)):
                        best, best_val, best_d = ch, val, (dl, de)
                    else:
                        held = True
            if best is not None:
                assign[i] = best
                devs[i] = best.device
                if ks:
                    now.update(zip(ks, on[best.device]))
                if not owned:  # (the first: ``tot`` was _evaluate's, shared)
                    tot, owned = _copy_totals(tot), True
                _swap_in_place(tot, old, best, *best_d)
                cur = _f(objective, tot.latency_s, tot.energy_j, w)
                bad_now = None
                moved = True
                settled -= near.get(i, set()) | {i}
            elif linear and not held:
                settled.add(i)
        if not moved:
            break
    return assign


def _rises(objective: str, w=None) -> tuple[float, float]:
    """``(a, b)``: a move changing the totals' latency by ``dl >= a`` seconds and their energy
    by ``de >= b`` joules, and nothing else (a move of an op none of whose tensors may cost,
    :func:`_paid`), surely leaves the objective (:func:`_f`) at its value or above, so that
    :func:`local_search`'s test ``value < current - tolerance`` fails for it. Exact: adding a
    non-negative float to a total never lowers it (rounding is monotone), nor does multiplying
    non-negative totals (``edp``) by factors made no smaller, nor a weighted sum with weights
    at least 0; a figure the objective does not read may change either way (``-inf``). NaN
    (no ``dl`` or ``de`` is at least NaN): for a weighting with a negative weight, and a NaN
    delta, every move is priced."""
    inf, nan = math.inf, math.nan
    if w is not None:
        return (0.0, 0.0) if w[0] >= 0 and w[1] >= 0 else (nan, nan)
    if objective == "energy":
        return -inf, 0.0
    if objective == "latency":
        return 0.0, -inf
    if objective == "edp":  # latency x energy, both at least 0
        return 0.0, 0.0
    return nan, nan


def _swap_totals(tot: Totals, old: Choice, new: Choice, dl: float, de: float) -> Totals:
    """New totals: ``tot`` with one op moved from choice ``old`` to ``new``, its latency and
    energy changed by ``dl`` seconds and ``de`` joules (op and transfers)."""
    t = _copy_totals(tot)
    _swap_in_place(t, old, new, dl, de)
    return t


def _swap_in_place(tot: Totals, old: Choice, new: Choice, dl: float, de: float) -> None:
    """:func:`_swap_totals` changing ``tot`` itself (the same figures)."""
    lat, en = tot.latency_s + dl, tot.energy_j + de
    # node costs: remove old, add new; the transfer part of dl/de is carried in the totals
    _add_choice(tot, old, -1)
    _add_choice(tot, new, +1)
    tot.latency_s = lat
    tot.energy_j = en


def _neighbors(prob: Problem) -> dict:
    """``{decision op: decision ops sharing with it a tensor whose transfers may cost}`` (whose
    move changes its transfers; :func:`_paid`)."""
    if prob.neighbors is None:
        dec = set(prob.decision)
        out: dict = {i: set() for i in prob.decision}
        paid = {k for ks in _paid(prob).values() for k in ks}
        for k in sorted(paid):
            t = prob.tensors[k]
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
    tot = _evaluate(prob, assign)
    linear = w is not None or objective != "edp"
    pos = {i: k for k, i in enumerate(prob.decision)}
    near = _neighbors(prob)
    version = dict.fromkeys(prob.decision, 0)
    moves: dict = {}
    heap: list = []

    paid = _paid(prob)

    def price(i: int) -> None:
        ch, out = assign[i], []
        if ch.kept_tiles or ch.cost.writes or ch.mram_resident:
            cur = _f(objective, tot.latency_s, tot.energy_j, w)
            base = None
            for k, alt in enumerate(prob.cands[i]):
                if alt.kept_tiles + alt.mram_resident >= ch.kept_tiles + ch.mram_resident and \
                        alt.cost.writes >= ch.cost.writes:
                    continue
                if base is None:
                    base = _transfers(prob, assign, i, ch.device, ks=paid[i])
                dl, de = _local_delta(prob, assign, i, alt, base,
                                      _transfers(prob, assign, i, alt.device, ks=paid[i]))
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
    return assign if not violations(prob, _evaluate(prob, assign)) else host


#: Most states the dynamic program keeps per op (device x kept tiles); beyond it the best ones
#: are kept and the result is no longer claimed exact.
MAX_DP_STATES = 4096


def _unique(codes: np.ndarray) -> np.ndarray:
    """The distinct values of the 1-D integer array ``codes``, sorted (``np.unique``'s result):
    ``np.unique`` imports ``numpy.ma`` on first use, 12 ms of every optimize run."""
    s = np.sort(codes)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def chain_dp(prob: Problem, w: tuple[float, float]) -> tuple[dict, bool]:
    """Dynamic program over the decision ops in graph order minimizing ``w[0] * latency +
    w[1] * energy``, with kept crossbar tiles per device in the state (residency exact).

    Each tensor is charged at the last decision op touching it, with the previous decision op's
    device known and every other op on its own device if fixed, else taken as the host. On a chain
    (every tensor touches at most two consecutive decision ops) this is the exact optimum, unless
    more than :data:`MAX_DP_STATES` states had to be pruned. Returns ``(assignment, exact)``.

    A layer of the program is an array ``value[device, kept]`` over the devices and the
    kept-tile vectors reached so far (one integer per vector: the tiles the decision ops keep on
    each crossbar device, mixed radix over the room the fixed ops leave), so an op costs a few
    array operations per choice, not a loop over states x choices. Without the residency
    constraint kept tiles change neither value nor feasibility and are not tracked.
    """
    dec = prob.decision
    pos = {i: k for k, i in enumerate(dec)}
    owner: dict[int, list] = {}
    chain = True
    paid = {k for ks in _paid(prob).values() for k in ks}  # the others always add 0.0
    at = pos.get
    for k, t in enumerate(prob.tensors):
        # the positions of the decision ops touching ``t`` (None: a node that is not one)
        touching = set(map(at, t.consumers))
        touching.add(at(t.producer))
        touching.discard(None)
        if not touching:
            continue
        touching = sorted(touching)
        if len(touching) > 2 or (len(touching) == 2 and touching[1] - touching[0] != 1):
            chain = False
        if k in paid:
            owner.setdefault(dec[touching[-1]], []).append(k)
    fixed_tot = Totals()
    for i, ch in prob.fixed.items():
        if prob.nodes[i].domain == cinm.DOMAIN:
            _add_choice(fixed_tot, ch)
    room: dict = {}  # crossbar device -> tiles the decision ops may keep on it
    if prob.constraints.crossbar_residency:
        for i in dec:
            for c in prob.cands[i]:
                if c.capacity:
                    room[c.device] = max(c.capacity - fixed_tot.kept_tiles.get(c.device, 0), 0)
    stride, s = {}, 1
    for d in sorted(room):
        stride[d] = s
        s *= room[d] + 1
    names = sorted({"host", *(c.device for i in dec for c in prob.cands[i])})
    row = {d: r for r, d in enumerate(names)}
    codes = np.zeros(1, dtype=np.int64)
    value = np.full((len(names), 1), np.inf)
    value[row["host"], 0] = 0.0
    back = []  # per op: [prev row, prev column, choice index] of every [row, column]
    # the device of every op but the two the program decides: fixed ones' own, else the host
    others = [prob.fixed[n].device if n in prob.fixed else "host" for n in range(len(prob.nodes))]
    others.append("host")  # a graph input (producer -1)
    live = None  # the rows of ``value`` with a finite state and those rows, when known
    lives: dict = {}  # those rows as a tuple -> as an array
    for k, i in enumerate(dec):
        prev_i = dec[k - 1] if k else None
        if live is None:
            live = np.flatnonzero(np.isfinite(value).any(axis=1))
            reached = value[live]
        prev_rows = live.tolist()
        moved: dict = {}
        mine = owner.get(i, ())

        def transfers(p: int, dev: str, i=i, prev_i=prev_i, moved=moved, mine=mine) -> float:
            """The weighted cost of the tensors op ``i`` owns, it on ``dev``, the previous op
            on ``names[p]``."""
            if not mine:  # (most ops own no tensor that may cost)
                return 0.0
            hit = moved.get((p, dev))
            if hit is None:
                # the two ops put in ``others`` for the time of the call (list lookups)
                was = others[i], others[prev_i] if prev_i is not None else None
                if prev_i is not None:
                    others[prev_i] = names[p]
                others[i] = dev
                hit = 0.0
                try:
                    for tk in mine:
                        s_, j_, _ = tensor_cost(prob, prob.tensors[tk], others.__getitem__)
                        hit += w[0] * s_ + w[1] * j_
                finally:
                    others[i] = was[0]
                    if prev_i is not None:
                        others[prev_i] = was[1]
                moved[(p, dev)] = hit
            return hit

        cands = prob.cands[i]
        rows = [row[ch.device] for ch in cands]
        small = len(names) * len(codes) <= MAX_DP_STATES  # then no state is pruned
        if small and len(set(rows)) == len(rows) and \
                not any(ch.kept_tiles and ch.device in stride for ch in cands):
            # every choice keeps the kept-tile columns as they are and has a device row of its
            # own: all of them in a few array operations over [choice, previous row, column]
            # (the same sums and the same first minimum as the loop below, op by op); the back
            # pointers are kept as the arrays they come from (:func:`_back`)
            # (most ops own no tensor that may cost: a choice then adds the same step
            # ``own + 0.0`` to every previous row, and while that step is finite, rounding
            # ``x + step`` keeps the order of ``x`` (NaN stays NaN), so the least previous
            # value of each column plus the step is ``tot.min(axis=1)`` exactly; the previous
            # row each state came from is then asked only for the states the way back visits)
            steps = [w[0] * ch.cost.latency_s + w[1] * ch.cost.energy_j + 0.0 for ch in cands] \
                if not mine else None
            if steps is not None and all(map(math.isfinite, steps)):
                best = reached.min(axis=0)[None, :] + np.array(steps)[:, None]
                back.append((rows, live, None, best, reached, steps))
                # no NaN: the values reached hold none (a NaN is never kept) and the steps are
                # finite, so ``best`` is what np.where below would keep
                kept = best
            else:
                steps = []
                for ch in cands:
                    own = w[0] * ch.cost.latency_s + w[1] * ch.cost.energy_j
                    steps.append([own + transfers(p, ch.device) for p in prev_rows])
                tot = reached[None, :, :] + np.array(steps)[:, :, None]
                best = tot.min(axis=1)  # tot[c, argmin, column]: the same values
                back.append((rows, live, tot.argmin(axis=1), best))
                kept = np.where(best < np.inf, best, np.inf)
            if k == len(dec) - 1:
                value = np.full((len(names), len(codes)), np.inf)
                value[rows] = kept
            # the next layer's live rows (ascending, as np.flatnonzero gives them) and values
            fin = np.isfinite(kept).any(axis=1).tolist()
            order = sorted(compress(range(len(rows)), fin), key=rows.__getitem__)
            key = tuple(map(rows.__getitem__, order))
            live = lives.get(key)
            if live is None:  # (read only, like every array of a layer: shared)
                live = lives[key] = np.array(key, dtype=np.intp)
            reached = kept if len(order) == len(rows) and order == sorted(order) else kept[order]
            continue
        src = np.arange(len(codes))
        entries = []  # (row, target columns' codes, values, prev rows, prev columns, choice)
        held: dict = {}  # crossbar device -> tiles each column keeps on it (once per layer)
        for ci, ch in enumerate(prob.cands[i]):
            own = w[0] * ch.cost.latency_s + w[1] * ch.cost.energy_j
            step = np.array([own + transfers(p, ch.device) for p in prev_rows])
            tot = reached + step[:, None]
            arg = tot.argmin(axis=0)
            best, prow, psrc, tgt = tot[arg, src], live[arg], src, codes
            if ch.device in stride and ch.kept_tiles:
                d = ch.device
                if d not in held:
                    held[d] = (codes // stride[d]) % (room[d] + 1)
                ok = held[d] <= room[d] - ch.kept_tiles  # (integers: held + kept <= room)
                best, prow, psrc = best[ok], prow[ok], src[ok]
                tgt = codes[ok] + ch.kept_tiles * stride[d]
            entries.append((row[ch.device], tgt, best, prow, psrc, ci))
        same = all(e[1] is codes for e in entries)
        new = codes if same else _unique(np.concatenate([e[1] for e in entries]))
        nvalue = np.full((len(names), len(new)), np.inf)
        bp = np.zeros((3, len(names), len(new)), dtype=np.int64)
        at_codes = src if same else None  # the new columns of the columns kept as they are
        written = set()  # rows some entry wrote: the others are still all inf
        for r, tgt, val, prow, psrc, ci in entries:
            if tgt is codes:
                if at_codes is None:
                    at_codes = np.searchsorted(new, codes)
                col = at_codes
            else:
                col = np.searchsorted(new, tgt)
            # the first of equal values stays
            better = val < (nvalue[r, col] if r in written else np.inf)
            written.add(r)
            if not better.all():
                col, val, prow, psrc = col[better], val[better], prow[better], psrc[better]
            nvalue[r, col] = val
            bp[0, r, col] = prow
            bp[1, r, col] = psrc
            bp[2, r, col] = ci
        # many crossbars and many sizes: keep the best states
        finite = None if len(names) * len(new) <= MAX_DP_STATES else np.isfinite(nvalue)
        if finite is not None and finite.sum() > MAX_DP_STATES:
            cut = np.partition(nvalue[finite], MAX_DP_STATES - 1)[MAX_DP_STATES - 1]
            nvalue[nvalue > cut] = np.inf
            used = np.isfinite(nvalue).any(axis=0)
            new, nvalue, bp = new[used], nvalue[:, used], bp[:, :, used]
            chain = False  # no longer a proof of optimality
        back.append(bp)
        codes, value, live = new, nvalue, None
    assign: dict = {}
    if dec:
        r, c = divmod(int(np.argmin(value)), value.shape[1])
        for k in range(len(dec), 0, -1):
            p, pc, ci = _back(back[k - 1], r, c)
            assign[dec[k - 1]] = prob.cands[dec[k - 1]][ci]
            r, c = p, pc
    return assign, chain


def _back(bp, r: int, c: int) -> tuple:
    """``(previous row, previous column, choice index)`` of state ``[r, c]`` of one layer of
    :func:`chain_dp`: ``bp`` is either that array ``[3, row, column]`` or, for a layer whose
    choices keep the columns, ``(row of each choice, previous rows, argmin over them
    [choice, column], value [choice, column])``, or, for such a layer whose choices each add
    one finite step to every previous row, ``(row of each choice, previous rows, None, value
    [choice, column], previous values [previous row, column], step of each choice)``, whose
    argmin is the first least ``previous value + step`` (the sum the layer's minimum stands
    for); an unreachable state points at ``(0, 0, 0)``."""
    if not isinstance(bp, tuple):
        return bp[:, r, c].tolist()
    rows, live, arg, best = bp[:4]
    if r not in rows:
        return 0, 0, 0
    ci = rows.index(r)
    if not best.item(ci, c) < math.inf:
        return 0, 0, 0
    if arg is None:
        reached, steps = bp[4:]
        return live.item(int(np.argmin(reached[:, c] + np.float64(steps[ci])))), c, ci
    return live.item(arg.item(ci, c)), c, ci


#: Relative tolerance within which two results' objective values tie in :func:`solve` (then the
#: smaller other figure wins: :func:`_pick`). The totals print to 3 significant digits, so two
#: values within 1e-4 of each other read the same (half a unit of the third digit is at least
#: 5e-4 of the figure), and the figures they come from are estimates known to a digit or two
#: (0.12 W per DPU, the host's nominal 50 GFLOP/s): a 1e-4 difference in the objective is
#: noise, a difference in the other figure is not (a trial: 0.003 % less energy, 23 % more
#: latency). Float rounding of the sums is far below it (about 1e-15).
TIE = 1e-4


def _other(objective: str, tot: Totals) -> float:
    """The figure that breaks a tie of ``objective``: the energy under latency, the latency
    under energy and edp (seconds or joules)."""
    return tot.energy_j if objective == "latency" else tot.latency_s


def _pick(results: dict, objective: str) -> str:
    """The name of the best of ``results`` (``{name: (objective value, assignment, Totals)}``):
    of those within a relative :data:`TIE` of the least value, the one of the smaller other
    figure (:func:`_other`), then the smaller value, then the first. Exact: no order effect
    beyond the last rule."""
    least = min(r[0] for r in results.values())
    near = [n for n, r in results.items() if r[0] <= least * (1 + TIE) or r[0] == least]
    return min(near, key=lambda n: (_other(objective, results[n][2]), results[n][0]))


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
    out = {"all-host": _evaluate(prob, {i: prob.cands[i][0] for i in prob.decision})}
    heur = heuristic_assign(prob)
    if heur is not None:
        out["heuristic"] = _evaluate(prob, heur)
    return out


def heuristic_assign(prob: Problem) -> dict | None:
    """The paper heuristic's devices as an assignment (None if one of its devices has no cost
    for an op, e.g. it exceeds the DPUs' MRAM under the current options)."""
    if prob.heuristic is None:  # asked twice (a start and a baseline): the answers are kept
        devs = {}
        # the heuristic's device is a function of the devices' answers alone (frozen Support
        # records, equal when their fields are): ops with equal answers are asked once
        # (light DenseNet121: 605 ops, 71 distinct sets of answers)
        seen: dict = {}
        for i in prob.decision:
            known = prob.support.get(i, {})
            key = tuple(known.items()) if known else None
            dev = seen.get(key) if key is not None else None
            if dev is None:
                ask = (lambda dev, _k=known, _o=prob.ops[i]:
                       _k[dev.name] if dev.name in _k else dev.supports_under(_o, prob.options))
                dev = heuristic(prob.ops[i], prob.options, supports=ask)[0]
                if key is not None and len(known) == len(placement_targets()):
                    seen[key] = dev  # (every device answered: none asked afresh)
            devs[i] = dev
        out = _compiled_devices(prob, devs)  # (its start is priced as compiled: the same)
        prob.heuristic = {"assign": None if any(ch is None for ch in out.values()) else out}
    a = prob.heuristic["assign"]
    return None if a is None else dict(a)


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
    among all of them; empty when it cannot plan them (the candidates' figures stand). The ops
    are handed on in execution order whatever the order of ``idx``: an assignment built
    backwards (the dynamic program's) was priced in reverse order, which allocates the shared
    crossbars differently (light DenseNet121: 0.186 s against 0.175 s for the same devices).
    Remembered per problem, device and set of ops (the dict returned is shared: read only):
    the searches' results and the baselines often put the same ops on the device (DenseNet121:
    the same 121 crossbar kernels twice in one solve), and polishing asks again per move."""
    idx = sorted(idx)  # op indices follow the graph's (topological) order
    key = (dev, tuple(idx))
    hit = prob.shared.get(key)
    if hit is None:
        if len(prob.shared) > 4096:
            prob.shared.clear()
        try:
            plans = devices.get_device(dev).price_all([(prob.ops[i], prob.options) for i in idx])
        except Exception:  # noqa: BLE001 - no plan: the candidates' own figures stand
            plans = None
        hit = prob.shared[key] = {} if plans is None else dict(zip(idx, plans))
    return hit


def _plans(prob: Problem, devs: dict) -> dict:
    """``{op index: Priced}`` for the ops ``devs`` puts on devices that plan together, as each
    device's :meth:`Device.price_all` allocates the shared resources among all of them (the
    plan already recorded on a lowered node is used as it is)."""
    out, groups = {}, {}
    together: dict = {}  # device name -> _together (asked once per device, not per op)
    for i, dev in devs.items():
        rec = _recorded(prob, i, dev)
        if rec is not None:
            out[i] = rec
            continue
        t = together.get(dev)
        if t is None:
            t = together[dev] = _together(dev)
        if t:
            groups.setdefault(dev, []).append(i)
    for dev, idx in groups.items():
        out.update(_shared_plans(prob, dev, idx))
    return out


def _variant(prob: Problem, i: int, dev: str, a: Priced | None) -> Choice | None:
    """The choice of op ``i`` on ``dev`` priced from its model-wide plan ``a`` (a device that
    plans together, or a recorded plan), else the device's first candidate; None if ``dev``
    has no choice for the op."""
    for c in prob.cands[i]:
        if c.device == dev:
            break
    else:
        return None
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
    """``assign`` with its crossbar choices priced from the model-wide plans (a new dict; the
    choices of one device map are made once per problem, so that :func:`_evaluate` knows
    them: several searches often end on the same placement)."""
    return _compiled_devices(prob, {i: c.device for i, c in assign.items()})


def _compiled_devices(prob: Problem, devs: dict) -> dict:
    """:func:`_with_variants` of ``devs`` (op index -> device name), remembered per problem
    and placement (a new dict; :func:`_as_compiled`, and the placed model priced again by
    :func:`.cost_placement.evaluate_model`'s shortcut for ``restore_host_ops``)."""
    key = tuple(sorted(devs.items()))  # one placement, however its dict was built
    hit = prob.compiled.get(key)
    if hit is None:
        if len(prob.compiled) > 64:
            prob.compiled.clear()
        hit = prob.compiled[key] = _with_variants(prob, devs)
    return dict(hit)


def _copy_totals(tot: Totals) -> Totals:
    return Totals(tot.latency_s, tot.energy_j, tot.transfer_s, tot.transfer_j, tot.transfer_bytes,
                  tot.writes, _counter(tot.kept_tiles), dict(tot.capacity),
                  _counter(tot.writes_by_dev), _counter(tot.mram), dict(tot.mram_capacity))


def _counter(counts: dict) -> Counter:
    """A copy of ``counts`` as a Counter (``Counter(counts)`` goes through its Python-level
    update; the search copies totals thousands of times)."""
    out = Counter.__new__(Counter)  # an empty Counter without its Python-level __init__
    dict.update(out, counts)
    return out


class _Compiled:
    """An assignment priced as compiled (:func:`_as_compiled`), whose single-op moves are priced
    incrementally: a move re-prices the moved op, the transfers of the tensors it touches and,
    on a device that plans together which it leaves or joins, the model-wide plans of that
    device's ops (the only ones the move can change), instead of compiling and evaluating the
    whole graph. The plans of one set of ops are asked for once (moving an op off a crossbar
    device to the host or to UPMEM leaves the same ops behind)."""

    def __init__(self, prob: Problem, assign: dict):
        self.prob = prob
        self.assign = _as_compiled(prob, assign)
        self.devs = _devices(prob, self.assign)  # kept with assign (see _transfers)
        self.tot = _evaluate(prob, self.assign)
        self._variants: dict = {}
        self._slack: dict = {}

    def _variant(self, i: int, dev: str, a: Priced | None) -> Choice | None:
        """:func:`_variant`, memoized per op and plan (the device's plans are memoized too, so
        most moves find the choices they priced before)."""
        key = (i, dev, id(a))
        hit = self._variants.get(key)
        if hit is None or hit[0] is not a:
            hit = self._variants[key] = (a, _variant(self.prob, i, dev, a))
        return hit[1]

    def _floor(self, j: int, dev: str) -> tuple[float, float]:
        """The least latency and the least energy of op ``j`` among its candidates on ``dev``
        (each priced as if alone, with all of the device's crossbars): no model-wide plan
        gives it less."""
        cs = [c.cost for c in self.prob.cands[j] if c.device == dev]
        return min(c.latency_s for c in cs), min(c.energy_j for c in cs)

    def _slack_of(self, dev: str) -> tuple[list, float, float, dict]:
        """``([(op, latency above its floor, energy above its floor)], their latency sum, their
        energy sum, {op: its entry})`` (each at least 0; the sums added in list order) of the
        ops on ``dev`` (a device that plans together) whose plans a move may change: what the
        move could save them at most."""
        hit = self._slack.get(dev)
        if hit is None:
            ops, tl, te = [], 0.0, 0.0
            for j in self.prob.decision:
                ch = self.assign[j]
                if ch.device == dev and not _recorded(self.prob, j, dev):
                    fl, fe = self._floor(j, dev)
                    sl, se = max(ch.cost.latency_s - fl, 0.0), max(ch.cost.energy_j - fe, 0.0)
                    ops.append((j, sl, se))
                    tl += sl
                    te += se
            hit = self._slack[dev] = (ops, tl, te, {e[0]: e for e in ops})
        return hit

    def _head(self, i: int, dev: str) -> tuple[float, float, list] | None:
        """:meth:`bound` before it takes the slack of the ops on the devices that plan together
        off: ``(latency, energy, those devices)``; None where :meth:`bound` is None."""
        prob, assign = self.prob, self.assign
        old = assign[i]
        ends = [d for d in dict.fromkeys((old.device, dev)) if _together(d)]
        if not ends or _recorded(prob, i, dev) is not None:
            return None
        fl, fe = self._floor(i, dev)
        lat = self.tot.latency_s - old.cost.latency_s + fl
        en = self.tot.energy_j - old.cost.energy_j + fe
        ks = _paid(prob).get(i)  # (the others add 0.0: the same sums, see moved)
        for (s0, j0, _), (s1, j1, _) in zip(_transfers(prob, assign, i, old.device, self.devs, ks),
                                            _transfers(prob, assign, i, dev, self.devs, ks)):
            lat += s1 - s0
            en += j1 - j0
        return lat, en, ends

    def bound(self, i: int, dev: str) -> tuple[float, float] | None:
        """Lower bounds of the total (latency, energy) after moving op ``i`` to ``dev``: ``i`` at
        its cheapest candidate on ``dev``, its transfers exact, and every op of a device that
        plans together which ``i`` leaves or joins at its floor (:meth:`_floor`). None for a
        move that neither leaves nor joins such a device (:meth:`trial` prices it exactly and
        cheaply) or that takes a recorded plan."""
        head = self._head(i, dev)
        if head is None:
            return None
        lat, en, ends = head
        for d in ends:
            for j, sl, se in self._slack_of(d)[0]:
                if j != i:
                    lat -= sl
                    en -= se
        return lat, en

    def hopeless(self, i: int, dev: str, objective: str, target: float) -> bool:
        """Whether moving op ``i`` to ``dev`` provably leaves the objective at ``target`` or
        above (:meth:`bound`), so that :meth:`trial` need not re-plan the crossbars for it.

        For ``latency`` and ``energy`` the answer is read from the slack's sums first
        (:meth:`_slack_of`): :meth:`bound`'s figure is the head minus ``n`` slacks, one at a
        time, and the head minus their sum differs from it by less than ``4 (n + 2) 2^-52
        (|head| + sum)`` (each of the at most ``2n + 3`` roundings of the two ways errs by at
        most ``2^-53`` of a partial result no larger than that); only a target within that
        margin asks for :meth:`bound` itself (light DenseNet121: 726 moves of 121 crossbar
        kernels each), so the answer is the same."""
        if objective in ("latency", "energy"):
            head = self._head(i, dev)
            if head is None:
                return False
            v = head[0] if objective == "latency" else head[1]
            k = 1 if objective == "latency" else 2
            n, total, own = 0, 0.0, 0.0
            for d in head[2]:
                slack = self._slack_of(d)
                n += len(slack[0])
                total += slack[k]
                mine = slack[3].get(i)
                if mine is not None:
                    own += mine[k]
            approx = v - (total - own)
            margin = 4 * (n + 2) * 2.0**-52 * (abs(v) + total)
            if approx - margin >= target:
                return True
            if approx + margin < target:
                return False
            return _f(objective, *self.bound(i, dev)) >= target
        b = self.bound(i, dev)
        if b is None or (objective == "edp" and min(b) < 0):
            return False
        return _f(objective, *b) >= target

    def trial(self, i: int, dev: str) -> tuple[dict, Totals]:
        """``(changed choices {op index: Choice}, totals)`` of moving op ``i`` to ``dev``."""
        return self.totals(*self.moved(i, dev))

    def moved(self, i: int, dev: str) -> tuple[dict, tuple, float, float]:
        """``(changed choices {op index: Choice}, the move (i, from device, to device), total
        latency s, total energy J)`` of moving op ``i`` to ``dev``: the totals' latency and
        energy as :meth:`totals` sums them (same order, same values), so that a move that does
        not improve the objective needs no full totals. Of the tensors ``i`` touches only those
        whose transfers may cost (:func:`_paid`) are priced here: every other one's seconds and
        joules are exactly 0.0 on any device its ops can take, before and after the move, and
        adding 0.0 changes no sum (:meth:`totals` prices them all: their bytes count)."""
        prob, assign = self.prob, self.assign
        old_dev = assign[i].device
        changed = {}
        for d in dict.fromkeys((old_dev, dev)):  # in a fixed order: the sums too
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
        lat, en = self.tot.latency_s, self.tot.energy_j
        for j, ch in changed.items():  # as _add_choice adds them
            lat += -1 * assign[j].cost.latency_s
            en += -1 * assign[j].cost.energy_j
            lat += 1 * ch.cost.latency_s
            en += 1 * ch.cost.energy_j
        ks = _paid(prob).get(i)
        for (s0, j0, _), (s1, j1, _) in zip(_transfers(prob, assign, i, old_dev, self.devs, ks),
                                            _transfers(prob, assign, i, dev, self.devs, ks)):
            lat += s1 - s0
            en += j1 - j0
        return changed, (i, old_dev, dev), lat, en

    def totals(self, changed: dict, move: tuple, lat: float, en: float) -> tuple[dict, Totals]:
        """``(changed, totals)`` of a move :meth:`moved` priced (``move``: ``(op, from device,
        to device)``; ``lat``/``en``: its sums, which these totals come to as well)."""
        prob, assign = self.prob, self.assign
        i, old_dev, dev = move
        tot = _copy_totals(self.tot)
        for j, ch in changed.items():
            _add_choice(tot, assign[j], -1)
            _add_choice(tot, ch, +1)
        pairs = zip(_transfers(prob, assign, i, old_dev, self.devs),
                    _transfers(prob, assign, i, dev, self.devs))
        for (s0, j0, b0), (s1, j1, b1) in pairs:
            tot.transfer_s += s1 - s0
            tot.transfer_j += j1 - j0
            tot.transfer_bytes += b1 - b0
            tot.latency_s += s1 - s0
            tot.energy_j += j1 - j0
        return changed, tot

    def apply(self, changed: dict, tot: Totals) -> None:
        """Take a move :meth:`trial` priced."""
        self.assign.update(changed)
        for j, ch in changed.items():
            self.devs[j] = ch.device
        self.tot = tot
        self._slack.clear()


#: Most single-op moves :func:`_polish` prices that re-plan a crossbar device (each re-prices
#: the moved op, its tensors and the crossbar plans of the devices it leaves or joins); moves its
#: lower bound rules out and moves between devices that plan alone (priced exactly from the op
#: and its tensors) are not counted.
POLISH_MOVES = 400
#: Most sweeps over the ops :func:`_polish` makes (each after one that improved).
POLISH_SWEEPS = 30


def _polish(prob: Problem, assign: dict, objective: str) -> tuple[dict | None, bool]:
    """Single-op device changes priced as compiled, first improvement taken, sweeping over
    every op until a sweep improves nothing, :data:`POLISH_MOVES` crossbar re-plans were priced
    or :data:`POLISH_SWEEPS` sweeps were made. The
    search's two-candidate crossbar prices can miss what the model-wide plans make cheap (a
    kernel streaming through crossbars the others leave); this corrects for it on the result.
    A move whose lower bound (:meth:`_Compiled.hopeless`) cannot beat the current objective is
    not priced: re-planning the crossbars for it could not make it the next step. Returns
    ``(the improved assignment or None, whether a budget ran out first)``."""
    state = _Compiled(prob, assign)
    best = state.tot.value(objective)
    priced, better = 0, None
    changed, sweeps = True, 0
    while changed:
        if sweeps == POLISH_SWEEPS:
            return better, True
        changed, sweeps = False, sweeps + 1
        for i in prob.decision:
            tried: dict = {}
            for c in prob.cands[i]:
                if c.device == state.assign[i].device or c.device in tried:
                    continue  # a device's second candidate prices the same
                if state.hopeless(i, c.device, objective, best * (1 - 1e-9)):
                    tried[c.device] = None
                    continue
                if _together(c.device) or _together(state.assign[i].device):
                    if priced >= POLISH_MOVES:
                        return better, True
                    priced += 1  # re-plans a crossbar device
                move = state.moved(i, c.device)
                tried[c.device] = None
                if not _f(objective, move[2], move[3]) < best * (1 - 1e-9):
                    continue  # (the value its totals would give)
                diff, tot = state.totals(*move)
                if not violations(prob, tot):
                    state.apply(diff, tot)
                    best, changed = tot.value(objective), True
                    better = dict(state.assign)
                    break
    return better, False


def solve(prob: Problem, objective: str) -> Solution:
    """Choose the devices of ``prob``'s decision ops for ``objective`` (see the module docstring)."""
    if objective not in OBJECTIVES:
        raise CinmError(f"unknown objective '{objective}' (known: {', '.join(OBJECTIVES)})")
    host = {i: prob.cands[i][0] for i in prob.decision}
    heur = heuristic_assign(prob)
    greedy = {}
    unit_w = (1.0, 1.0) if objective == "edp" else None

    def by_own(c: Choice) -> float:  # (one function for all the ops, not a lambda per op)
        return _f(objective, c.cost.latency_s, c.cost.energy_j, unit_w)

    for i in prob.decision:
        greedy[i] = min(prob.cands[i], key=by_own)
    starts = {"all-host": host, "unary": greedy}
    if heur is not None:
        starts["heuristic"] = heur
    t_host = _evaluate(prob, host)
    if objective == "edp":
        lam0 = t_host.energy_j / max(t_host.latency_s, 1e-30)
        weights = [(lam0 * f, 1.0) for f in (1e-2, 1e-1, 1.0, 10.0, 100.0)]
    else:
        weights = [(1.0, 0.0) if objective == "latency" else (0.0, 1.0)]
    chain = True
    dp_feasible = True
    for k, w in enumerate(weights):
        a, chain = chain_dp(prob, w)
        if violations(prob, _evaluate(prob, a)):
            dp_feasible = False
            a = repair(prob, a, objective, w)
        starts[f"dp{k}"] = a
    results = {}
    searched = {}
    for name, a in starts.items():
        if violations(prob, _evaluate(prob, a)):
            a = repair(prob, a, objective)
        searched[name] = local_search(prob, a, objective)
    # the search prices crossbar ops by two candidates each; every outcome, and the starting
    # points as they are, is priced as compiled (model-wide crossbar plans) and the best wins
    finals = dict(searched)
    finals.update({f"{n} as is": starts[n] for n in ("all-host", "heuristic") if n in starts})
    finals = {n: _as_compiled(prob, a) for n, a in finals.items()}
    for name, a in finals.items():
        tot = _evaluate(prob, a)
        if not violations(prob, tot):
            results[name] = (tot.value(objective), a, tot)
    if not results:
        # nothing meets every budget: hints pin too much on a device (e.g. more crossbar tiles
        # than crossbars). The crossbar plans cope (kernels that do not fit stream), so keep
        # the hinted placement and choose the rest by the objective alone.
        for name, a in finals.items():
            tot = _evaluate(prob, a)
            results[name] = (tot.value(objective), a, tot)
        dp_feasible = False
    best_name = _pick(results, objective)
    _, assign, tot = results[best_name]
    capped = False
    if not violations(prob, tot):
        polished, capped = _polish(prob, assign, objective)
        if polished is not None:
            tot = _evaluate(prob, polished)
            results["polish"] = (tot.value(objective), polished, tot)
            best_name = _pick(results, objective)
            _, assign, tot = results[best_name]
    least = min(r[0] for r in results.values())
    dp_best = min((results[n][0] for n in results if n.startswith("dp")), default=math.inf)
    # the DP is exact on a chain when its own result needed no repair (the endurance budget is
    # not part of its state) and nothing better turned up elsewhere
    exact = chain and dp_feasible and objective != "edp" and \
        math.isclose(dp_best, least, rel_tol=1e-9)
    if exact:
        method = "exact dynamic program (the cinm ops form a chain)"
    else:
        start = best_name if not best_name.startswith("dp") else "dynamic program"
        if prob.hint_note and start.startswith("all-host"):  # the hinted ops are not in it
            start += " (the ops without a hint)"
        method = (f"dynamic program + local search ({'chain' if chain else 'DAG'}), "
                  f"best start: {start}")
    if results[best_name][0] != least:  # a tie went to the other figure
        method += (f"; of the results within {TIE:g} of the least {objective}, the one of "
                   f"least {'energy' if objective == 'latency' else 'latency'}")
    if capped:
        method += (f"; polishing stopped at its budget ({POLISH_MOVES} crossbar re-plans or "
                   f"{POLISH_SWEEPS} sweeps)")
    return Solution(assign, tot, method, baselines(prob) if not prob.hint_note else {}, exact)
