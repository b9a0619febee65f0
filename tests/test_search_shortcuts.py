"""Shortcuts of cost placement's search against the paths they replaced, on real problems whose
costs are redrawn at random (ties, inf and NaN; :func:`test_chain_dp._redrawn`):

* :func:`search.local_search` settles, before its first sweep, the ops that sweep would price
  and settle without a move (:func:`search._settled`); the old path priced them all;
* :func:`search._paid` asks each device's links once per tensor size, not once per tensor;
* :func:`cost_placement._reason` builds a move's totals (to name the budget it breaks) only when
  the move changes a budget; the old path built them for every candidate.
"""
from __future__ import annotations

import math
import random

import pytest
from test_chain_dp import _redrawn

from onnx_cinm import optimize
from onnx_cinm.passes import cost_placement as cp
from onnx_cinm.passes.cost_placement import search
from onnx_cinm.passes.cost_placement.evaluate import _link
from onnx_cinm.passes.cost_placement.problem import Problem


def _fresh(prob: Problem) -> Problem:
    """``prob`` without the memos a search leaves in it (paid tensors, neighbours, totals)."""
    return Problem(prob.nodes, prob.infos, prob.options, prob.constraints, cands=prob.cands,
                   refused=prob.refused, fixed=prob.fixed, hint_note=prob.hint_note,
                   tensors=prob.tensors, touch=prob.touch, decision=prob.decision, ops=prob.ops,
                   support=prob.support)


def _reference_paid(prob: Problem) -> dict:
    """:func:`search._paid` as it was: every tensor's devices asked, link by link."""
    def devs(n: int) -> set:
        if n < 0:
            return {"host"}
        if n in prob.fixed:
            return {prob.fixed[n].device}
        return {c.device for c in prob.cands.get(n, ())} | {"host"}

    free = []
    for t in prob.tensors:
        ds = set().union(*(devs(n) for n in (t.producer, *t.consumers)))
        free.append(t.nbytes <= 0 or all(
            _link(prob, d, t.nbytes, way) == (0.0, 0.0) for d in sorted(ds)
            for way in (False, True)))
    return {i: [k for k in prob.touch.get(i, ()) if not free[k]] for i in prob.decision}


@pytest.fixture(scope="module")
def problems(light_model_paths) -> list:
    """SqueezeNet's and DenseNet121's problems (crossbars, UPMEM, HBM-PIM candidates), on 4 and
    16 crossbars, an endurance budget on one of them."""
    out = []
    for name in ("squeezenet", "densenet121"):
        model = optimize(str(light_model_paths[name]), check=0, stop_after="cinm").model
        for opts in ({"cim_crossbars": 4}, {"cim_crossbars": 16, "max_writes_per_cell": 3.0}):
            out.append(cp.build_problem(model, {**opts, "host_roofline": "nominal"}))
    return out


def test_paid_matches_its_reference(problems):
    for prob in problems:
        got = search._paid(_fresh(prob))
        want = _reference_paid(_fresh(prob))
        assert got == want
        assert any(got.values()) and not all(got.values())  # both kinds of op are there


def _starts(prob: Problem, rng: random.Random, objective: str) -> list:
    host = {i: prob.cands[i][0] for i in prob.decision}
    rand = {i: rng.choice(prob.cands[i]) for i in prob.decision}
    w = {"latency": (1.0, 0.0), "energy": (0.0, 1.0)}.get(objective, (1.0, 1.0))
    try:
        return [host, rand, search.chain_dp(prob, w)[0]]
    except ValueError:  # no state left (inf and NaN everywhere): the two others
        return [host, rand]


def test_local_search_settling_ahead_changes_nothing(problems, monkeypatch):
    """The same assignment (the same choice objects) from every start, with the settled ops
    found ahead and without (the old path: every op priced in the first sweep); and the
    shortcut must have settled ops ahead, under energy and latency."""
    rng = random.Random(7)
    ahead = 0
    real = search._settled
    for base in problems:
        for trial in range(4):
            prob = _redrawn(base, rng, kept=trial % 2 == 0)
            for objective in ("energy", "latency", "edp"):
                for start in _starts(prob, rng, objective):
                    ahead += len(real(_fresh(prob), start, objective))
                    got = search.local_search(_fresh(prob), start, objective)
                    monkeypatch.setattr(search, "_settled", lambda *a: set())
                    want = search.local_search(_fresh(prob), start, objective)
                    monkeypatch.setattr(search, "_settled", real)
                    assert list(got) == list(want)
                    assert all(got[i] is want[i] for i in want)
    assert ahead >= 1000


def test_settled_ops_have_no_cheaper_candidate():
    """:func:`search._settled` by hand: of three ops touching no paid tensor, the one on its
    cheapest candidate (a tie counts) is settled, the one with a cheaper candidate is not, and
    an op whose cost is NaN is not."""
    from onnx_cinm.devices import Cost
    from onnx_cinm.passes.cost_placement.problem import Choice, Constraints

    def ch(dev, e):
        return Choice(dev, Cost(1.0, e))

    a, b, c = [ch("host", 2.0), ch("upmem", 2.0)], [ch("host", 2.0), ch("upmem", 1.0)], \
        [ch("host", math.nan), ch("upmem", 1.0)]
    prob = Problem([None] * 3, {}, {}, Constraints(), cands={0: a, 1: b, 2: c},
                   decision=[0, 1, 2])
    prob.paid = {0: [], 1: [], 2: []}
    assert search._settled(prob, {0: a[0], 1: b[0], 2: c[0]}, "energy") == {0}
    assert search._settled(prob, {0: a[1], 1: b[1], 2: c[1]}, "energy") == {0, 1}
    assert search._settled(prob, {0: a[0], 1: b[0], 2: c[0]}, "latency") == {0, 1, 2}
    assert search._settled(prob, {0: a[0], 1: b[0], 2: c[0]}, "edp") == set()


def test_reasons_match_the_old_path(problems, monkeypatch):
    """Every op's ``placement`` text is the same with the move's totals built only where its
    budgets change as with them built for every candidate (``_holds`` always true: the old
    path), on placements that break the endurance budget, so that the budget is named."""
    rng = random.Random(3)
    named = 0
    for base in problems:
        prob = _fresh(base)
        sol = search.solve(prob, "energy")
        for trial in range(3):
            assign = {i: rng.choice(prob.cands[i]) for i in prob.decision}
            tot = search._evaluate(prob, assign)
            run = search.Solution(assign, tot, "", {}, False)
            for s in (sol, run):
                devs = search._devices(prob, s.assign)
                use = cp._crossbar_use(prob, s.assign)
                bad = cp.violations(prob, s.totals)

                def texts():
                    return [cp._reason(prob, s, i, "energy", devs, use, bad)
                            for i in prob.decision]

                got = texts()
                monkeypatch.setattr(cp, "_holds", lambda ch: True)
                want = texts()
                monkeypatch.undo()
                assert got == want
                named += sum("breaks" in t for t in got)
    assert named >= 100
