"""Cost-model placement: every cinm op on the device that minimizes the objective over the graph.

Strategy ``cost`` of the ``placement`` pass (``--placement cost``). For every cinm op it chooses a
device among those that support it (the host always does) so that the whole graph's modeled
latency, energy or energy-delay product (``--objective latency|energy|edp``) is smallest, under
the constraints below. Devices are reached only through the registry (:mod:`onnx_cinm.devices`).

The model (one inference, ops run one after another, so latencies and energies add up):

* **Op cost** on a device: the device's choices, :meth:`Device.price` (``Priced.cost``:
  latency, energy, writes; what the choice keeps resident). An op a device refuses
  (``supports()`` false, or its price raises, e.g. data that does not fit the device's memory
  under the options) is not a candidate. Non-cinm ops run on the host and cost the host
  roofline (:mod:`onnx_cinm.hostmodel`).
* **Host cost**: a roofline of the host, ``max(FLOPs / FLOP/s, bytes / (bytes/s))`` seconds and
  that time x 30 W (nominal rates by default, this CPU's measured ones on request; see
  :mod:`onnx_cinm.hostmodel`).
* **Transfers**: a tensor whose producer and consumer sit on different devices crosses the host:
  ``out(producer device) + in(consumer device)`` per distinct consumer device, once per tensor
  (a tensor read by three host ops crosses once), each priced by the device's
  :meth:`Device.transfer_cost` (free for a device whose op costs include their transfers, such
  as UPMEM's, whose measured scatter and gather are part of every kernel). Graph inputs start on
  the host, graph outputs end there; constant inputs (weights) are loaded once and never cross
  per inference. Likewise a device's one-time load (``Priced.load_s``) is not part of the
  per-inference objective.

Constraints (a placement that breaks one is never chosen; user hints still win and are reported):

* **Crossbar residency** (a device's :attr:`Resources.crossbars` ``P``): a choice keeps
  ``Priced.kept_crossbars`` tiles programmed across inferences and assumes nobody else
  overwrites them. The crossbars are shared by every kernel on the device, one tile per
  crossbar, so the tiles kept by all of them must fit: ``sum(kept) <= P``. The search prices an
  op by the device's choices (a crossbar's: pinned, its tiles kept, priced as if alone;
  streamed, every tile rewritten); every assignment it reports (the result and the baselines)
  is priced from the device's model-wide plans (:meth:`Device.price_all`) instead, where a
  kernel streaming alone keeps some tiles on the crossbars the pinned kernels leave it.
* **Endurance** (``max_writes_per_cell``, CLI ``--max-writes-per-cell``): writes per cell per
  inference of the most-written cells = ceil(tile writes per inference summed over a device's
  crossbar kernels / the crossbars the kept tiles leave, ``P - kept`` (at least 1)): crossbars
  kept by resident kernels are written at load only, and the weight-stationary schedules
  spread the streamed tiles round-robin over the rest, the same ones every inference, so
  wear is as even there as whole writes allow; a tile write programs each cell once
  (:func:`~onnx_cinm.paradigms.cim.wear.writes_per_cell`; the device's wear line,
  :meth:`Device.wear`, reports the same figure). With ``lifetime_inferences = L`` (CLI
  ``--lifetime-inferences``, default 1) the budget is for ``L`` inferences:
  ``L * ceil(writes_per_inference / (P - kept)) <= max_writes_per_cell``. Writes at load (once per model load, at most one per cell) are not
  counted. Example: PCM endures 3.2e7 writes per cell; to last 1e9 inferences give
  ``--max-writes-per-cell 3.2e7 --lifetime-inferences 1e9`` (``max_writes_per_cell = 0``
  admits no write per inference at all).
* **Device memory** (:attr:`Resources.memory_bytes`): constant inputs kept resident
  (``Priced.resident_bytes``) by all ops on a device together must fit it (for UPMEM,
  ``upmem_dpus x`` MRAM; an op whose data do not fit makes the device refuse it).

Search:

* a dynamic program over the cinm ops in graph order, with the kept crossbar tiles as part of the
  state (so the residency constraint is exact); on a chain (each op's data come from the one
  before it) this is the exact optimum for ``latency`` and ``energy``;
* from its result and from three more starts (all on host, the paper heuristic when it meets the
  constraints, each op's cheapest device alone), a local search moves one op at a time to another
  device while that lowers the exact objective and keeps every constraint; ``edp`` (total latency
  x total energy, not a sum) is searched this way directly, from DP results for a few weightings
  ``energy + lambda * latency``;
* the best result is kept: of the results within a relative 1e-4 of the least objective
  (:data:`.search.TIE`: a difference no printed total shows), the one of the smaller other
  figure (latency for ``energy`` and ``edp``, energy for ``latency``); the all-host placement
  and (when it meets the constraints) the heuristic one are always among the candidates, so
  cost placement is never worse than either on its own objective by more than that 1e-4;
* every result is priced as compiled (model-wide crossbar plans) and the best one is polished
  by single-op moves priced that way (:func:`.search._polish`: sweeps until nothing improves,
  at most ``POLISH_MOVES`` crossbar re-plans; the method says when that budget stopped it).

Every op's ``placement`` attribute says what was chosen, at what modeled cost, what each
alternative would have added, and which devices refused the op and why.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

from ... import devices
from ...analysis import op_info
from ...dialects import cinm
from ...text import si
from ..pass_options import PlacementOptions
from .evaluate import (NodeCost, Totals, _add_choice, _devices, breaks,  # noqa: F401 (API)
                       evaluate, node_costs, tensor_charges, tensor_cost, violations,
                       writes_per_cell)
from .problem import (Choice, Constraints, Problem, Tensor, build_problem,  # noqa: F401 (API)
                      candidate, device_cost, link_cost)
from .search import (Solution, _Compiled, _compiled_devices, _evaluate, _f,  # noqa: F401 (API)
                     _local_delta, _paid, _swap_totals, _transfers, _with_variants, baselines,
                     chain_dp, heuristic_assign, local_search, repair, solve)



# --------------------------------------------------------------------------------------------
# The pass strategy
# --------------------------------------------------------------------------------------------

def _kind(ch) -> str:
    """How a choice keeps its operand: ``pinned``/``streamed`` on crossbars, ``resident`` or
    not in a device's memory."""
    if ch.capacity:
        return "streamed" if ch.streamed else "pinned"
    if ch.mram_capacity:
        return "resident" if ch.mram_resident else "not resident"
    return ""


def _crossbar_use(prob: Problem, assign: dict) -> dict:
    """``{device: (tiles kept by its pinned kernels, kernels streaming)}`` under ``assign``,
    over the devices with crossbars."""
    out: dict = {}
    for j in prob.cands:
        c = prob.choice(assign, j)
        if c.capacity:
            kept, streaming = out.get(c.device, (0, 0))
            out[c.device] = (kept + c.kept_tiles * (not c.streamed), streaming + c.streamed)
    return out


def _no_room(use: dict, ch, alt) -> str:
    """Why an op now on choice ``ch`` could not keep ``alt``'s tiles programmed while the other
    ops keep theirs (``use``: :func:`_crossbar_use` of the placement), in words ("" if it
    could, or ``alt`` keeps none). The device's model-wide plan pins kernels only in the
    crossbars the streamed ones leave, at least one when any streams
    (:func:`onnx_cinm.paradigms.cim.residency.allocate`); a candidate alone is priced with all
    of them, so with ``--cim-crossbars 1`` and other kernels streaming a pinned one cannot be
    had at any price."""
    if not alt.capacity or alt.streamed or not alt.kept_tiles:
        return ""
    kept, streaming = use.get(alt.device, (0, 0))
    if ch.device == alt.device:  # the others': without the op's own
        kept, streaming = kept - ch.kept_tiles * (not ch.streamed), streaming - ch.streamed
    if alt.kept_tiles + kept + (streaming > 0) <= alt.capacity:
        return ""
    n = lambda k, what: f"{k} {what}{'' if k == 1 else 's'}"
    return (f"its {n(alt.kept_tiles, 'tile')} + {kept} kept by other kernels"
            + (f" + 1 crossbar for the {n(streaming, 'kernel')} streaming" if streaming else "")
            + f" > {n(alt.capacity, 'crossbar')}")


def _holds(ch) -> bool:
    """Whether choice ``ch`` adds to a budget :func:`violations` reads: crossbar tiles kept,
    tile writes, resident bytes. Any other choice (the host's, UPMEM's without resident
    constants) adds 0 to each (:func:`.evaluate._add_resources`), so a move between two such
    choices breaks what the placement breaks: at most a device's count appears at 0, and 0
    tiles, writes (budgets are at least 0) or bytes break nothing."""
    return bool(ch.kept_tiles or ch.cost.writes or ch.mram_resident)


#: The unit of each objective, as :func:`_reason` words a change of it.
_UNITS = {"latency": "s", "energy": "J", "edp": "Js"}


def _reason(prob: Problem, sol: Solution, i: int, objective: str, devs: list,
            use: dict, bad_now: list) -> str:
    """The ``placement`` attribute of op ``i``: its choice and what every other candidate
    would change. A device with several candidates (pinned and streamed crossbar kernels) is
    named with the kind of each, and listed once per kind. ``devs``: the device of every node
    under ``sol`` (:func:`.evaluate._devices`); ``use``: :func:`_crossbar_use` of ``sol``;
    ``bad_now``: :func:`violations` of ``sol.totals`` (those of a move between two choices
    that hold no budget, e.g. host and UPMEM without resident constants)."""
    assign = sol.assign
    ch = prob.choice(assign, i)
    head = f"cost[{objective}]"
    per_device: dict = {}  # candidates per device
    for c in prob.cands[i]:
        per_device[c.device] = per_device.get(c.device, 0) + 1

    def name(c) -> str:
        return f"{c.device} ({_kind(c)})" if per_device[c.device] > 1 and _kind(c) else c.device

    if i in prob.fixed:
        base = prob.hint_note.get(i, "fixed")
        return f"{base}: {si(ch.cost.latency_s, 's')}, {si(ch.cost.energy_j, 'J')} on {name(ch)}"
    parts = [f"{head}: {name(ch)} {si(ch.cost.latency_s, 's')}, {si(ch.cost.energy_j, 'J')}"
             + (f", {ch.cost.writes} tile writes/inf" if ch.cost.writes else "")
             + (f", keeps {ch.kept_tiles} of {ch.capacity} crossbar tiles" if ch.capacity else "")]
    cur = sol.totals
    unit = _UNITS.get(objective)  # (None for an unknown one: _f raises KeyError first)
    said = {name(ch)}
    paid = _paid(prob)[i]  # the tensors whose transfers a move can change
    on = {ch.device: _transfers(prob, assign, i, ch.device, devs, paid)}  # the device's alone
    for alt in prob.cands[i]:
        if alt is ch or name(alt) in said:
            continue
        said.add(name(alt))
        no_room = _no_room(use, ch, alt)
        if no_room:
            parts.append(f"{name(alt)}: no room, {no_room}")
            continue
        if alt.device not in on:
            on[alt.device] = _transfers(prob, assign, i, alt.device, devs, paid)
        dl, de = _local_delta(prob, assign, i, alt, on[ch.device], on[alt.device])
        # the totals of the move (_swap_totals) only where its budgets change
        bad = violations(prob, _swap_totals(cur, ch, alt, dl, de)) \
            if (_holds(ch) or _holds(alt)) and (bad_now or breaks(prob, cur, ch, alt)) \
            else bad_now
        dv = _f(objective, cur.latency_s + dl, cur.energy_j + de) - cur.value(objective)
        txt = f"{name(alt)} {'+' if dv >= 0 else ''}{si(dv, unit)}"
        if bad:
            txt += f" and breaks {bad[0]}"
        parts.append(txt)
    for dev, why in prob.refused.get(i, ()):
        parts.append(f"not {dev}: {why}")
    if i in prob.hint_note:
        parts.insert(0, prob.hint_note[i])
    return "; ".join(parts)


def place_by_cost(model: onnx.ModelProto, ctx, set_attr) -> dict:
    """Place every cinm op of ``model`` by cost (in place); returns the ``placement`` stats.

    Options read (:class:`.pass_options.PlacementOptions`): ``objective`` (``energy``, the
    default, ``latency`` or ``edp``), ``place`` (hints), ``max_writes_per_cell``,
    ``lifetime_inferences``, ``crossbar_residency``, and the device options
    (:func:`onnx_cinm.devices.option_schema`, e.g. the host's ``host_roofline``).
    """
    options = ctx.options
    objective = options.get("objective") or PlacementOptions.objective
    hints = list(options.get("place", []))
    infos = ctx.tensor_infos(model)
    prob = build_problem(model, options, hints, infos=infos, sources=ctx.source_ops)
    sol = solve(prob, objective)
    # the baselines are the real all-host and heuristic placements, hints left out (solve
    # prices them only from a hint-free problem)
    base = sol.baselines or baselines(build_problem(model, options, infos=infos))
    counts: Counter = Counter()
    devs = _devices(prob, sol.assign)
    use = _crossbar_use(prob, sol.assign)
    bad = violations(prob, sol.totals)
    for i, node in enumerate(prob.nodes):
        if node.domain != cinm.DOMAIN:
            continue
        ch = prob.choice(sol.assign, i)
        set_attr(node, "device", ch.device)
        set_attr(node, "placement", _reason(prob, sol, i, objective, devs, use, bad))
        counts[ch.device] += 1
    ctx.placed = Placed.of(prob, infos)
    for v in bad:
        ctx.log(f"placement: user hints break a constraint: {v}")
    # the graph as the search saw it: restore_host_ops (lowered ops back as their source op)
    # and fold_layouts (host Transposes folded away) change it after, so the summary's figure
    # of the model written differs (LeNet: 172 us, 854 uJ here; 43.8 us, 587 uJ written)
    ctx.log(f"placement: cost[{objective}] {sol.method}; modeled for the graph as placed, "
            f"before the passes after placement rewrite it: {si(sol.totals.latency_s, 's')}, "
            f"{si(sol.totals.energy_j, 'J')} (the summary's 'cost placement' line prices the "
            "model written)")
    return {"devices": counts, **prob.hint_stats, "strategy": "cost",
            "objective": objective, "method": sol.method, "exact": sol.exact,
            "totals": sol.totals, "baselines": base, "violations": bad}


@dataclass
class Placed:
    """The problem :func:`place_by_cost` built, kept for pricing the model it placed again
    (:meth:`priced`) without building the problem again.

    Attributes:
        problem: the problem (its nodes: the model's node objects, which placement annotated).
        infos: the tensor infos it was built from; options: the options it was built under.
    """

    problem: Problem
    infos: dict
    options: dict

    @classmethod
    def of(cls, prob: Problem, infos: dict) -> Placed | None:
        """The record of ``prob``, or None when :func:`evaluate_model` would build another
        problem for the placed model: with hints (their ops are fixed as the user placed them)
        or with ops that came with a device (a recorded plan of an earlier compile prices them,
        :func:`.search._recorded`, as long as they keep that device)."""
        if prob.hint_note or any("device" in prob.ops[i].attrs for i in prob.cands):
            return None
        return cls(prob, infos, dict(prob.options))

    def priced(self, model: onnx.ModelProto, options: dict, infos: dict) -> tuple | None:
        """``(totals, problem)`` of ``model`` as :func:`evaluate_model` gives them under
        ``options`` and ``infos``, if ``model`` still has exactly the nodes placed (the same
        node objects, only annotated since: the placement pass wrote their ``device`` and
        ``placement``), the options are the same and the infos the same object (or a copy
        with more entries); else None."""
        nodes = self.problem.nodes
        if options != self.options or len(model.graph.node) != len(nodes) or \
                any(a is not b for a, b in zip(model.graph.node, nodes)) or \
                any(infos.get(k) is not v for k, v in self.infos.items()):
            return None
        tot, _, prob = _as_placed(self.problem)
        return tot, prob


def evaluate_model(model: onnx.ModelProto, options: dict | None = None,
                   infos: dict | None = None) -> tuple[Totals, list, Problem]:
    """Modeled totals of the placement already recorded in ``model`` (the ``device`` attribute
    of every cinm op), under the same model as cost placement: ``(totals, violations, problem)``.
    Ops whose recorded device cannot run them under ``options`` are charged on the host and
    named in the violations. ``infos``: the tensor infos to use (:func:`onnx_cinm.analysis.
    tensor_infos`; an If branch's come from its whole model's), else ``model``'s own."""
    return _as_placed(build_problem(model, dict(options or {}), infos=infos))


def evaluate_on_host(nodes: list, options: dict, infos: dict,
                     placed: Placed | None = None) -> tuple[Totals, dict]:
    """:func:`evaluate_model`'s totals of the model of ``nodes`` (graph order) with every cinm
    op on the host, without building its problem: the sum of the nodes' host costs in graph
    order, no transfer (every tensor stays on the host) and nothing kept on a device, so the
    same figures bit for bit. A cinm op's ``device`` attribute is not read: the host's cost
    of an op depends on its type, shapes and FLOPs only, so a placed op is priced as it would
    be put back on the host, without copying it. Also ``{node index: host Choice}`` of the
    nodes outside the cinm domain (the fixed choices of that problem).
    ``infos``: the tensor infos of the model (:func:`onnx_cinm.analysis.tensor_infos`).
    ``placed``: the placement's problem (:attr:`PassContext.placed`), whose host choices
    (a cinm op's first candidate, another node's fixed choice) serve for the nodes it holds
    (the same node objects, under the same options and with the same infos of their tensors)
    instead of pricing them again."""
    host = devices.get_device("host")
    known: dict = {}  # node position -> the placement problem's host choice of that node
    if placed is not None and placed.options == options:
        prob, pi = placed.problem, placed.infos
        at = {id(n): k for k, n in enumerate(prob.nodes)}
        # a node's tensors have the same infos when ``infos`` holds every one of ``pi`` (the
        # placement's, restore_host_ops's copy with weights added) and none of its tensors is
        # among the names ``infos`` adds: one pass over the infos, not one lookup per tensor
        same = all(infos.get(t) is v for t, v in pi.items())
        added = {t for t, v in infos.items() if v is not None and t not in pi} if same else None
        for i, node in enumerate(nodes):
            k = at.get(id(node))
            if k is not None and prob.nodes[k] is node and (
                    same and (not added or added.isdisjoint((*node.input[:], *node.output[:])))
                    or all(infos.get(t) is pi.get(t) for t in (*node.input[:], *node.output[:]))):
                known[i] = prob.cands[k][0] if node.domain == cinm.DOMAIN else prob.fixed[k]
    lat = en = 0.0  # summed in graph order, as evaluate() does
    writes = 0
    fixed = {}
    for i, node in enumerate(nodes):
        c = known[i].cost if i in known else device_cost(host, op_info(node, infos), options)
        lat += c.latency_s
        en += c.energy_j
        writes += c.writes
        if node.domain != cinm.DOMAIN:
            fixed[i] = Choice("host", c)
    return Totals(latency_s=lat, energy_j=en, writes=writes), fixed


def reasons_as_placed(prob: Problem, totals: Totals, objective: str) -> dict[str, str]:
    """``{node name: placement text}`` of every cinm op of ``prob`` that no hint placed, as
    :func:`place_by_cost` words it, for the model as placed now: ``prob`` is
    :func:`evaluate_model`'s problem of it (its ``assign`` the choices as compiled,
    :func:`_as_placed`) and ``totals`` its totals. ``restore_host_ops`` rewrites the reasons
    with it after putting nodes back: the crossbars those freed may pin a kernel placement
    found no room for (a trial: a reason said "streamed, 4 tile writes/inf; pinned: no room,
    its 4 tiles + 63 kept by other kernels" where the model written keeps 61 of 64 and the
    kernel writes none)."""
    sol = Solution(prob.assign, totals, "", {}, False)
    devs = _devices(prob, sol.assign)
    use = _crossbar_use(prob, sol.assign)
    bad = violations(prob, totals)
    return {prob.nodes[i].name: _reason(prob, sol, i, objective, devs, use, bad)
            for i in prob.decision}


def _as_placed(prob: Problem) -> tuple[Totals, list, Problem]:
    """:func:`evaluate_model` of the problem of the model (its ``assign``: the choices). The
    choices and totals of a placement the problem's search already priced as compiled (the
    placement pass's result, priced again by :meth:`Placed.priced`) are its memos'
    (:func:`.search._compiled_devices`, :func:`.search._evaluate`): the same functions of the
    same devices."""
    assign, bad = {}, []
    only = frozenset({"device"})  # not the plans and reasons of the other attributes
    devs = {i: cinm.node_attrs(prob.nodes[i], only).get("device", "host") for i in prob.decision}
    for i, ch in _compiled_devices(prob, devs).items():
        if ch is None:
            bad.append(f"{prob.nodes[i].name}: {devs[i]} cannot run it under these options")
            ch = prob.cands[i][0]
        assign[i] = ch
    prob.assign = assign
    tot = _evaluate(prob, assign)
    return tot, bad + violations(prob, tot), prob
