"""The dynamic program of cost placement (:func:`search.chain_dp`) against the version it
replaced, kept here verbatim as the reference: same assignment (same first-minimum ties), same
exactness flag, on real problems whose costs are redrawn at random with ties, inf and NaN."""
from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from onnx_cinm import optimize
from onnx_cinm.dialects import cinm
from onnx_cinm.passes import cost_placement as cp
from onnx_cinm.passes.cost_placement import search
from onnx_cinm.passes.cost_placement.evaluate import Totals, _add_choice, tensor_cost
from onnx_cinm.passes.cost_placement.problem import Problem
from onnx_cinm.passes.cost_placement.search import MAX_DP_STATES, _paid, _unique


def _reference_chain_dp(prob: Problem, w: tuple[float, float]) -> tuple[dict, bool]:
    """The dynamic program as it was before its layers were made cheaper."""
    dec = prob.decision
    pos = {i: k for k, i in enumerate(dec)}
    owner: dict[int, list] = {}
    chain = True
    paid = {k for ks in _paid(prob).values() for k in ks}  # the others always add 0.0
    for k, t in enumerate(prob.tensors):
        touching = sorted({pos[n] for n in {t.producer, *t.consumers} if n in pos})
        if not touching:
            continue
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
    for k, i in enumerate(dec):
        prev_i = dec[k - 1] if k else None
        live = np.flatnonzero(np.isfinite(value).any(axis=1))
        prev_rows, reached = live.tolist(), value[live]
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
            steps = []
            for ch in cands:
                own = w[0] * ch.cost.latency_s + w[1] * ch.cost.energy_j
                steps.append([own + transfers(p, ch.device) for p in prev_rows])
            tot = reached[None, :, :] + np.array(steps)[:, :, None]
            best = tot.min(axis=1)  # tot[c, argmin, column]: the same values
            nvalue = np.full((len(names), len(codes)), np.inf)
            nvalue[rows] = np.where(best < np.inf, best, np.inf)
            back.append((rows, live, tot.argmin(axis=1), best))
            value = nvalue
            continue
        src = np.arange(len(codes))
        entries = []  # (row, target columns' codes, values, prev rows, prev columns, choice)
        for ci, ch in enumerate(prob.cands[i]):
            own = w[0] * ch.cost.latency_s + w[1] * ch.cost.energy_j
            step = np.array([own + transfers(p, ch.device) for p in prev_rows])
            tot = reached + step[:, None]
            arg = tot.argmin(axis=0)
            best, prow, psrc, tgt = tot[arg, src], live[arg], src, codes
            if ch.device in stride and ch.kept_tiles:
                d = ch.device
                ok = (codes // stride[d]) % (room[d] + 1) + ch.kept_tiles <= room[d]
                best, prow, psrc = best[ok], prow[ok], src[ok]
                tgt = codes[ok] + ch.kept_tiles * stride[d]
            entries.append((row[ch.device], tgt, best, prow, psrc, ci))
        same = all(e[1] is codes for e in entries)
        new = codes if same else _unique(np.concatenate([e[1] for e in entries]))
        nvalue = np.full((len(names), len(new)), np.inf)
        bp = np.zeros((3, len(names), len(new)), dtype=np.int64)
        for r, tgt, val, prow, psrc, ci in entries:
            col = src if same else np.searchsorted(new, tgt)
            better = val < nvalue[r, col]  # the first of equal values stays
            col = col[better]
            nvalue[r, col] = val[better]
            bp[0, r, col] = prow[better]
            bp[1, r, col] = psrc[better]
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
        codes, value = new, nvalue
    assign: dict = {}
    if dec:
        r, c = np.unravel_index(np.argmin(value), value.shape)
        for k in range(len(dec), 0, -1):
            p, pc, ci = _reference_back(back[k - 1], r, c)
            assign[dec[k - 1]] = prob.cands[dec[k - 1]][ci]
            r, c = p, pc
    return assign, chain


def _reference_back(bp, r: int, c: int) -> tuple:
    """``(previous row, previous column, choice index)`` of state ``[r, c]`` of one layer of
    :func:`chain_dp`: ``bp`` is either that array ``[3, row, column]`` or, for a layer whose
    choices keep the columns, ``(row of each choice, previous rows, argmin over them
    [choice, column], value [choice, column])``; an unreachable state points at ``(0, 0, 0)``."""
    if not isinstance(bp, tuple):
        return bp[:, r, c]
    rows, live, arg, best = bp
    if r not in rows:
        return 0, 0, 0
    ci = rows.index(r)
    if not best[ci, c] < np.inf:
        return 0, 0, 0
    return live[arg[ci, c]], c, ci


def _redrawn(prob, rng: random.Random, kept: bool):
    """``prob`` with every candidate's latency and energy drawn from a few values (ties), now and
    then inf or NaN (the host's often, on ops with more choices), and (``kept``) crossbar
    candidates keeping 1-3 tiles at random."""
    pool = [0.0, 1e-3, 2e-3, 3e-3, 5e-3]  # well above the transfers: the crossbars get used
    cands = {}
    for i in prob.decision:
        out = []
        for ch in prob.cands[i]:
            lat, en = rng.choice(pool), rng.choice(pool)
            u = rng.random()
            if u < 0.005:
                lat = math.inf
            elif u < 0.03:
                en = math.nan
            if ch.device == "host" and len(prob.cands[i]) > 2 and rng.random() < 0.5:
                lat = math.inf  # off the host: ties among the others under w = (0, 0)
            kt = ch.kept_tiles
            if kept and ch.capacity and kt:
                kt = rng.randint(1, 3)
            out.append(replace(ch, cost=replace(ch.cost, latency_s=lat, energy_j=en),
                               kept_tiles=kt))
        cands[i] = out
    return replace(prob, cands={**prob.cands, **cands})


@pytest.mark.parametrize("crossbars", [4, 16])
def test_chain_dp_matches_its_reference_on_redrawn_costs(light_model_paths, crossbars,
                                                         monkeypatch):
    model = optimize(str(light_model_paths["squeezenet"]), check=0, stop_after="cinm").model
    base = cp.build_problem(model, {"cim_crossbars": crossbars, "host_roofline": "nominal"})
    rng = random.Random(crossbars)
    ran = 0
    lazy = []  # layers traced back whose previous row is found on the way back
    back = search._back
    monkeypatch.setattr(search, "_back", lambda bp, r, c: (
        lazy.append(isinstance(bp, tuple) and bp[2] is None), back(bp, r, c))[1])
    for trial in range(12):
        prob = _redrawn(base, rng, kept=trial % 2 == 0)
        for w in [(1.0, 0.0), (0.0, 1.0), (0.5, 2.0), (0.0, 0.0)]:  # (0, 0): all ties
            outcomes = []
            for dp in (search.chain_dp, _reference_chain_dp):
                try:
                    outcomes.append(dp(prob, w))
                except ValueError as e:  # no state left: both fail alike
                    outcomes.append(type(e))
            got, want = outcomes
            if not isinstance(want, tuple):
                assert got is want
                continue
            ran += 1
            assert got[1] == want[1]
            assert list(got[0]) == list(want[0])
            assert all(got[0][i] is want[0][i] for i in want[0])
    assert ran >= 12
    assert sum(lazy) >= 100  # the layers of ops owning no tensor that may cost were compared
