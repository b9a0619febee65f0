"""Shortcuts of cost placement's search against the paths they replaced, on the problems of
real models (SqueezeNet, DenseNet121) and random placements of them:

* :func:`search._paid` asks each device's links once per tensor size, not once per tensor;
* :func:`cost_placement._reason` builds a move's totals (to name the budget it breaks) only when
  the move changes a budget; the old path built them for every candidate;
* :func:`search._shared_plans` remembers a device's model-wide plans per problem and set of ops.
"""
from __future__ import annotations

import random

import pytest

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


def test_solve_plans_each_set_of_kernels_once(problems, monkeypatch):
    """A device's model-wide plans of one set of ops are asked for once per problem (the
    searches' results, the baselines and every polishing move share them), and the placement
    is the one found with them asked for every time (the memo emptied before each ask)."""
    from onnx_cinm import devices

    asked = []
    for base in problems:
        for objective in ("energy", "latency"):
            asked.clear()
            for dev in devices.all_devices():
                if dev.plans_together:
                    real = dev.price_all
                    monkeypatch.setattr(dev, "price_all", lambda items, real=real, d=dev.name: (
                        asked.append((d, tuple(id(op) for op, _ in items))), real(items))[1])
            got = search.solve(_fresh(base), objective)
            monkeypatch.undo()
            assert asked and len(asked) == len(set(asked))
            prob = _fresh(base)
            real_shared = search._shared_plans

            def forgetful(p, dev, idx):
                p.shared.clear()
                return real_shared(p, dev, idx)

            monkeypatch.setattr(search, "_shared_plans", forgetful)
            want = search.solve(prob, objective)
            monkeypatch.undo()
            assert (got.method, got.totals) == (want.method, want.totals)
            assert all(got.assign[i] == want.assign[i] for i in want.assign)


def _all_tensors_evaluate(prob: Problem, assign: dict) -> tuple:
    """:func:`evaluate`'s transfer sums as they were made: :func:`tensor_cost` of every tensor
    of the problem, in tensor order (the shortcut prices only those a node off the host
    touches)."""
    devs = search._devices(prob, assign)
    s = j = 0.0
    moved = 0
    for t in prob.tensors:
        if t.nbytes > 0:
            ds, dj, db = cp.tensor_cost(prob, t, devs.__getitem__)
            s, j, moved = s + ds, j + dj, moved + db
    return s, j, moved


def test_evaluate_prices_the_tensors_off_the_host_as_all_of_them(problems):
    """The totals' transfers (seconds, joules, bytes) are bit for bit those of every tensor
    priced, on the search's result, all-host and random placements (some ops off the host
    move tensors: the figures are not all 0)."""
    rng = random.Random(5)
    crossed = 0
    for base in problems:
        prob = _fresh(base)
        starts = [search.solve(prob, "energy").assign, {i: prob.cands[i][0] for i in prob.decision}]
        starts += [{i: rng.choice(prob.cands[i]) for i in prob.decision} for _ in range(4)]
        for assign in starts:
            tot = cp.evaluate(prob, assign)
            want = _all_tensors_evaluate(prob, assign)
            assert (tot.transfer_s, tot.transfer_j, tot.transfer_bytes) == want
            crossed += want[2] > 0
    assert crossed >= 2 * len(problems)


@pytest.mark.parametrize("objective", ["energy", "latency", "edp"])
def test_local_search_skips_only_moves_that_cannot_gain(problems, monkeypatch, objective):
    """Local search skips a move of an op without costly tensors whose own latency and energy
    do not fall (for the figure the objective reads); from all-host and random (repaired)
    starts, and weighted, it
    ends where it ends pricing every move (``_rises`` giving NaN: no move skipped)."""
    rng = random.Random(11)
    moves = 0
    for base in problems:
        prob = _fresh(base)
        for w in (None, (0.5, 2.0)):
            host = {i: prob.cands[i][0] for i in prob.decision}
            rand = {i: rng.choice(prob.cands[i]) for i in prob.decision}
            for start in (host, search.repair(prob, rand, objective, w)):
                got = search.local_search(prob, start, objective, w)
                monkeypatch.setattr(search, "_rises", lambda o, w=None: (float("nan"),) * 2)
                want = search.local_search(prob, start, objective, w)
                monkeypatch.undo()
                assert all(got[i] is want[i] for i in prob.decision)
                moves += any(got[i] is not start[i] for i in prob.decision)
    assert moves >= 2 * len(problems)  # (searches that moved ops)


def test_rises_bounds(problems):
    """The bounds read the figures the objective reads: a fall of energy alone can lower
    ``energy`` and ``edp``, not ``latency``; a negative weight prices every move."""
    nan = float("nan")
    lo = search._rises("latency")
    assert 1.0 >= lo[0] and -1.0 >= lo[1]  # energy falls: latency cannot
    en = search._rises("energy")
    assert not (-1e-30 >= en[1]) and 5.0 >= en[0]
    ed = search._rises("edp")
    assert not (-1e-30 >= ed[1]) and not (-1e-30 >= ed[0])
    neg = search._rises("energy", (-1.0, 1.0))
    assert not (0.0 >= neg[0]) and not (nan >= neg[1])


def test_heuristic_assign_asks_each_answer_set_once(problems, monkeypatch):
    """The heuristic's devices, asked once per set of device answers, are those of
    :func:`placement_rules.heuristic` asked for every op."""
    from onnx_cinm.passes import placement_rules

    for base in problems:
        prob = _fresh(base)
        calls = []
        real = search.heuristic
        monkeypatch.setattr(search, "heuristic", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        got = search.heuristic_assign(prob)
        monkeypatch.undo()
        assert 0 < len(calls) < len(prob.decision)  # (ops of one signature share answers)
        want = {}
        for i in prob.decision:
            known = prob.support[i]
            want[i] = placement_rules.heuristic(
                prob.ops[i], prob.options, supports=lambda d, k=known: k[d.name])[0]
        assert {i: c.device for i, c in got.items()} == want
        assert len(set(want.values())) >= 2
