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
