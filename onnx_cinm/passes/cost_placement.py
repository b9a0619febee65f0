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
  inference = tile writes per inference summed over a device's crossbar kernels / ``P`` (the
  weight-stationary schedules rotate tiles round-robin over the ``P`` crossbars, so wear is
  even; a tile write programs each cell once). With ``lifetime_inferences = L`` (CLI
  ``--lifetime-inferences``, default 1) the budget is for ``L`` inferences:
  ``L * writes_per_inference / P <= max_writes_per_cell``. Writes at load (once per model load,
  at most one per cell) are not counted. Example: PCM endures 3.2e7 writes per cell; to last
  1e9 inferences give ``--max-writes-per-cell 3.2e7 --lifetime-inferences 1e9``.
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
* the best result is kept; the all-host placement and (when it meets the constraints) the
  heuristic one are always among the candidates, so cost placement is never worse than either
  on its own objective.

Every op's ``placement`` attribute says what was chosen, at what modeled cost, what each
alternative would have added, and which devices refused the op and why.
"""
from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

import onnx

from .. import devices
from ..analysis import op_info, tensor_infos
from ..devices import Cost, Device, Priced
from ..dialects import cinm
from ..errors import CinmError
from ..text import si
from . import pass_option_schema
from .pass_options import OBJECTIVES, PlacementOptions  # noqa: F401 (OBJECTIVES re-exported)
from .placement_rules import HintLog, heuristic


@dataclass(frozen=True)
class Constraints:
    """Budgets cost placement respects (see the module docstring for the definitions).

    Attributes:
        max_writes_per_cell: crossbar writes per cell allowed over ``lifetime_inferences``
            inferences (None: no endurance budget).
        lifetime_inferences: inferences the budget must last (1: the budget is per inference).
        crossbar_residency: enforce that the tiles kept programmed by all crossbar kernels fit
            the crossbars (True; False reproduces the per-kernel view of the plans).
    """

    max_writes_per_cell: float | None = PlacementOptions.max_writes_per_cell
    lifetime_inferences: float = PlacementOptions.lifetime_inferences
    crossbar_residency: bool = PlacementOptions.crossbar_residency

    @classmethod
    def from_options(cls, options: dict) -> "Constraints":
        """Read the ``max_writes_per_cell``, ``lifetime_inferences`` and ``crossbar_residency``
        options (checked by :func:`onnx_cinm.passes.check_options`; defaults from
        :class:`.pass_options.PlacementOptions`)."""
        get = lambda k: options[k] if options.get(k) is not None else getattr(cls, k)  # noqa: E731
        return cls(get("max_writes_per_cell"), get("lifetime_inferences"),
                   get("crossbar_residency"))


@dataclass(frozen=True)
class Choice:
    """One candidate device of one op, with its modeled cost.

    ``kept_tiles``/``capacity``: crossbar tiles this op keeps programmed across inferences and
    the crossbars of its device (:attr:`Priced.kept_crossbars`, :attr:`Resources.crossbars`;
    0 for a device without crossbars). ``streamed``: the choice shares the device's crossbars
    (every tile written every inference). ``mram_resident``/``mram_capacity``: constant bytes
    this op keeps in the device's memory and that memory's size
    (:attr:`Priced.resident_bytes`, :attr:`Resources.memory_bytes`; 0 otherwise).
    """

    device: str
    cost: Cost
    kept_tiles: int = 0
    capacity: int = 0
    mram_resident: int = 0
    mram_capacity: int = 0
    note: str = ""
    streamed: bool = False


# --------------------------------------------------------------------------------------------
# Device queries (cached: many ops of a model share their shapes)
# --------------------------------------------------------------------------------------------

_CACHE: dict = {}
_CACHE_MAX = 20000
#: Options no device cost depends on: the passes' own (placement, objective, budgets, hints).
_SKIP_OPTS = {"kernel_stem", *pass_option_schema()}


def _opts_key(options: dict, dev: Device | None = None) -> tuple:
    """The options a device's figures depend on: its own and every option no device declares
    (a crossbar option does not invalidate the cached DPU costs and the other way round)."""
    foreign = _foreign(dev)
    return tuple(sorted((k, repr(v)) for k, v in options.items()
                        if k not in _SKIP_OPTS and k not in foreign))


_FOREIGN: dict = {}


def _foreign(dev: Device | None) -> frozenset:
    if dev is None:
        return frozenset()
    key = (dev.name, id(dev))
    hit = _FOREIGN.get(key)
    if hit is None:
        own = set(dev.option_specs())
        hit = _FOREIGN[key] = frozenset(k for d in devices.all_devices() if d is not dev
                                        for k in d.option_specs() if k not in own)
    return hit


def _op_key(op) -> tuple:
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()
                         if k not in cinm.PLACEMENT_ATTRS and k not in cinm.PLAN_ATTRS))
    ts = lambda t: (str(t.dtype), t.shape, t.const)  # noqa: E731
    return (op.op_type, attrs, tuple(ts(t) for t in op.inputs), tuple(ts(t) for t in op.outputs),
            op.flops)


def device_cost(dev: Device, op, options: dict) -> Cost:
    """``dev``'s modeled cost of ``op`` under ``options``. Raises whatever the device raises."""
    return dev.cost(op, options)


def candidate(dev: Device, op, options: dict) -> list | str:
    """The :class:`Choice` list of ``op`` on ``dev`` (its :meth:`Device.price` choices, e.g. a
    crossbar's pinned and streamed), or the reason ``dev`` refuses it (a string)."""
    key = (dev.name, id(dev), _op_key(op), _opts_key(options, dev))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    s = dev.supports_under(op, options)
    if not s:
        return s.reason if s.applicable else ""
    try:
        priced = dev.price(op, options)
        res = dev.resources(options)
    except Exception as e:  # noqa: BLE001 - e.g. data that do not fit the DPUs' MRAM
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    note = "" if s.preferred else s.reason
    out = [_choice(dev.name, p, res.crossbars, res.memory_bytes, note) for p in priced]
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = out
    return out


def _choice(dev: str, p: Priced, capacity: int, memory: int, note: str = "",
            bytes_moved: int | None = None) -> Choice:
    cost = p.cost if bytes_moved is None else Cost(p.cost.latency_s, p.cost.energy_j,
                                                   p.cost.writes, bytes_moved)
    return Choice(dev, cost, p.kept_crossbars, capacity, p.resident_bytes if memory else 0,
                  memory, note, streamed=p.streamed)


def link_cost(dev: Device | None, nbytes: int, to_device: bool, options: dict) -> tuple[float, float]:
    """(seconds, joules) of moving ``nbytes`` between the host and ``dev``
    (:meth:`Device.transfer_cost`); 0 for the host."""
    if dev is None or dev.paradigm == "host" or nbytes <= 0:
        return 0.0, 0.0
    c = dev.transfer_cost(nbytes, to_device, options)
    return c.latency_s, c.energy_j


# --------------------------------------------------------------------------------------------
# The problem: ops, candidates, tensors
# --------------------------------------------------------------------------------------------

@dataclass
class Tensor:
    """A non-constant tensor: producer node index (-1: graph input), consumer node indices,
    whether it is a graph output, and its size in bytes."""

    name: str
    nbytes: int
    producer: int
    consumers: list
    output: bool


@dataclass
class Problem:
    """A model as cost placement sees it (node indices are positions in ``graph.node``)."""

    nodes: list
    infos: dict
    options: dict
    constraints: Constraints
    cands: dict = field(default_factory=dict)       # cinm node index -> [Choice]
    refused: dict = field(default_factory=dict)     # cinm node index -> [(device, reason)]
    fixed: dict = field(default_factory=dict)       # node index -> Choice (host ops, hints)
    hint_note: dict = field(default_factory=dict)   # node index -> text
    tensors: list = field(default_factory=list)
    touch: dict = field(default_factory=dict)       # node index -> [tensor index]
    decision: list = field(default_factory=list)    # cinm node indices not fixed, graph order
    ops: list = field(default_factory=list)         # node index -> OpInfo (built once)
    neighbors: dict | None = None                   # see _neighbors
    links: dict = field(default_factory=dict)       # see _link

    def device_of(self, assign: dict, i: int) -> str:
        if i < 0:
            return "host"
        ch = self.fixed.get(i) or assign.get(i)
        return ch.device if ch is not None else "host"

    def choice(self, assign: dict, i: int) -> Choice:
        return self.fixed.get(i) or assign[i]


def build_problem(model: onnx.ModelProto, options: dict, hints=(), infos=None) -> Problem:
    """Collect candidates and tensors of ``model`` (cinm ops already created)."""
    infos = infos if infos is not None else tensor_infos(model)
    prob = Problem(list(model.graph.node), infos, options, Constraints.from_options(options))
    host = devices.get_device("host")
    targets = [d for d in devices.all_devices() if d.paradigm != "host"]
    hint_log = HintLog(hints)
    for i, node in enumerate(prob.nodes):
        info = op_info(node, infos)
        prob.ops.append(info)
        hc = Choice("host", device_cost(host, info, options))
        if node.domain != cinm.DOMAIN:
            prob.fixed[i] = hc
            continue
        cands, refused = [hc], []
        for dev in targets:
            r = candidate(dev, info, options)
            if isinstance(r, list):
                cands.extend(r)
            elif r:
                refused.append((dev.name, r))
        hint = hint_log.first(node)
        if hint is not None:
            k, pattern, dev_name = hint
            pick = next((c for c in cands if c.device == dev_name), None)
            if pick is not None:
                prob.fixed[i] = pick
                prob.hint_note[i] = f"hint {pattern}={dev_name}"
            else:
                why = next((r for d, r in refused if d == dev_name), None) \
                    or devices.get_device(dev_name).supports_under(info, options).reason
                prob.hint_note[i] = f"hint {pattern}={dev_name} not possible ({why})"
                hint_log.refuse(k, node, f"{dev_name}: {why}")
        prob.cands[i], prob.refused[i] = cands, refused
        if i not in prob.fixed:
            prob.decision.append(i)
    prob.hint_stats = hint_log.stats()
    # tensors
    const = {t.name for t in model.graph.initializer}
    producer = {}
    for i, node in enumerate(prob.nodes):
        for o in node.output:
            if o:
                producer[o] = i
    index: dict[str, int] = {}
    outputs = {o.name for o in model.graph.output}

    def tensor(name: str) -> int | None:
        if name in const or not name:
            return None
        if name not in index:
            info = infos.get(name)
            nb = info.nbytes if info is not None else 0
            index[name] = len(prob.tensors)
            prob.tensors.append(Tensor(name, nb, producer.get(name, -1), [], name in outputs))
        return index[name]

    for i, node in enumerate(prob.nodes):
        for n in node.input:
            t = tensor(n)
            if t is not None and i not in prob.tensors[t].consumers:
                prob.tensors[t].consumers.append(i)
        for n in node.output:
            tensor(n)
    for k, t in enumerate(prob.tensors):
        for i in {t.producer, *t.consumers} - {-1}:
            prob.touch.setdefault(i, []).append(k)
    return prob


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------

@dataclass
class Totals:
    """Modeled figures of one placement, per inference.

    Attributes:
        latency_s, energy_j: ops plus transfers, seconds and joules.
        transfer_s, transfer_j, transfer_bytes: the transfers alone.
        writes: crossbar tile writes per inference (all devices with crossbars).
        kept_tiles: {device: tiles kept programmed}; capacity: {device: crossbars}.
        writes_by_dev: {device: tile writes per inference}.
        mram: {cnm device: resident constant bytes}; mram_capacity: {cnm device: bytes}.
    """

    latency_s: float = 0.0
    energy_j: float = 0.0
    transfer_s: float = 0.0
    transfer_j: float = 0.0
    transfer_bytes: int = 0
    writes: int = 0
    kept_tiles: dict = field(default_factory=Counter)
    capacity: dict = field(default_factory=dict)
    writes_by_dev: dict = field(default_factory=Counter)
    mram: dict = field(default_factory=Counter)
    mram_capacity: dict = field(default_factory=dict)

    def edp(self) -> float:
        """Energy-delay product, joule-seconds."""
        return self.latency_s * self.energy_j

    def value(self, objective: str) -> float:
        """The figure ``objective`` minimizes."""
        return {"latency": self.latency_s, "energy": self.energy_j, "edp": self.edp()}[objective]


def tensor_charges(prob: Problem, t: Tensor, dev_of) -> list[tuple[int, float, float, int]]:
    """The transfers of tensor ``t`` given ``dev_of(node index) -> device name``, each as
    ``(node index charged, seconds, joules, bytes)``: the way out of a device (when any reader,
    or the graph output, sits elsewhere), charged to the producer; the way into each distinct
    consumer device other than the producer's and the host, once, charged to the first consumer
    (graph order) on that device. The one transfer rule: :func:`tensor_cost` sums it and
    :func:`node_costs` spreads it over the nodes."""
    if t.nbytes <= 0:
        return []
    a = dev_of(t.producer)
    dests: dict = {}
    for c in t.consumers:
        dests.setdefault(dev_of(c), c)
    out = []
    if a != "host" and (t.output or any(d != a for d in dests)):
        ds, dj = _link(prob, a, t.nbytes, False)
        out.append((t.producer, ds, dj, t.nbytes))
    for d, first in dests.items():
        if d not in (a, "host"):
            ds, dj = _link(prob, d, t.nbytes, True)
            out.append((first, ds, dj, t.nbytes))
    return out


def tensor_cost(prob: Problem, t: Tensor, dev_of) -> tuple[float, float, int]:
    """(seconds, joules, bytes) of moving tensor ``t`` given ``dev_of(node index) -> device name``
    (the sum of :func:`tensor_charges`)."""
    s = j = 0.0
    moved = 0
    for _, ds, dj, db in tensor_charges(prob, t, dev_of):
        s, j, moved = s + ds, j + dj, moved + db
    return s, j, moved


def _link(prob: Problem, dev: str, nbytes: int, to_device: bool) -> tuple[float, float]:
    """:func:`link_cost` of device ``dev`` (a name), memoized per problem (its options are fixed)."""
    key = (dev, nbytes, to_device)
    hit = prob.links.get(key)
    if hit is None:
        hit = prob.links[key] = link_cost(devices.get_device(dev), nbytes, to_device, prob.options)
    return hit


def _node_choice(prob: Problem, assign: dict, i: int) -> Choice:
    """Node ``i``'s choice under ``assign`` (fixed nodes as fixed, unassigned ones on the host)."""
    return prob.choice(assign, i) if (i in prob.fixed or i in assign) else prob.cands[i][0]


def evaluate(prob: Problem, assign: dict) -> Totals:
    """Totals of the placement ``assign`` (decision node index -> Choice; fixed nodes as fixed)."""
    tot = Totals()
    for i in range(len(prob.nodes)):
        _add_choice(tot, _node_choice(prob, assign, i))
    dev_of = lambda i: prob.device_of(assign, i)  # noqa: E731
    for t in prob.tensors:
        s, j, b = tensor_cost(prob, t, dev_of)
        tot.transfer_s += s
        tot.transfer_j += j
        tot.transfer_bytes += b
    tot.latency_s += tot.transfer_s
    tot.energy_j += tot.transfer_j
    return tot


@dataclass(frozen=True)
class NodeCost:
    """One node's share of :func:`evaluate`'s totals, per inference.

    Attributes:
        device: the device the node runs on.
        cost: the op on that device (:class:`Cost`: seconds, joules, tile writes, and the bytes
            the device's own model moves across its boundary, ``Cost.bytes_moved``).
        transfer_s, transfer_j, transfer_bytes: the tensor transfers :func:`tensor_charges`
            charges to this node (seconds, joules, bytes).
    """

    device: str
    cost: Cost
    transfer_s: float = 0.0
    transfer_j: float = 0.0
    transfer_bytes: int = 0


def node_costs(prob: Problem, assign: dict) -> list[NodeCost]:
    """Per node (graph order), its op cost and the transfers charged to it under ``assign``:
    summed over the nodes they give exactly :func:`evaluate`'s totals (``latency_s`` = op
    seconds + ``transfer_s``, likewise joules; ``transfer_bytes``), because both use
    :func:`tensor_charges`. The report's per-layer figures come from here."""
    tr = [[0.0, 0.0, 0] for _ in prob.nodes]
    dev_of = lambda i: prob.device_of(assign, i)  # noqa: E731
    for t in prob.tensors:
        for i, s, j, b in tensor_charges(prob, t, dev_of):
            tr[i][0] += s
            tr[i][1] += j
            tr[i][2] += b
    out = []
    for i in range(len(prob.nodes)):
        ch = _node_choice(prob, assign, i)
        out.append(NodeCost(ch.device, ch.cost, *tr[i]))
    return out


def _add_choice(tot: Totals, ch: Choice, sign: int = 1) -> None:
    tot.latency_s += sign * ch.cost.latency_s
    tot.energy_j += sign * ch.cost.energy_j
    tot.writes += sign * ch.cost.writes
    if ch.capacity:
        tot.kept_tiles[ch.device] += sign * ch.kept_tiles
        tot.capacity[ch.device] = ch.capacity
        tot.writes_by_dev[ch.device] += sign * ch.cost.writes
    elif ch.cost.writes:
        tot.writes_by_dev[ch.device] += sign * ch.cost.writes
    if ch.mram_capacity:
        tot.mram[ch.device] += sign * ch.mram_resident
        tot.mram_capacity[ch.device] = ch.mram_capacity


def violations(prob: Problem, tot: Totals) -> list[str]:
    """The constraints ``tot`` breaks, in words (empty: feasible)."""
    out = []
    c = prob.constraints
    if c.crossbar_residency:
        for dev, kept in tot.kept_tiles.items():
            cap = tot.capacity.get(dev, 0)
            if cap and kept > cap:
                out.append(f"{dev}: {kept} tiles kept programmed > {cap} crossbars")
    if c.max_writes_per_cell is not None:
        for dev, w in tot.writes_by_dev.items():
            per_cell = writes_per_cell(w, tot.capacity.get(dev, 0), c.lifetime_inferences)
            if per_cell > c.max_writes_per_cell * (1 + 1e-12):
                out.append(f"{dev}: {per_cell:.3g} writes per cell over {c.lifetime_inferences:g} "
                           f"inference(s) > budget {c.max_writes_per_cell:g}")
    for dev, b in tot.mram.items():
        cap = tot.mram_capacity.get(dev, 0)
        if cap and b > cap:
            out.append(f"{dev}: {b} B of resident constants > {cap} B of memory")
    return out


def writes_per_cell(tile_writes: float, crossbars: int, lifetime: float = 1.0) -> float:
    """Writes per cell over ``lifetime`` inferences from ``tile_writes`` tile writes per inference
    spread round-robin over ``crossbars`` crossbars (one write per cell per tile write)."""
    return lifetime * tile_writes / max(crossbars, 1)


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
    layers = [{(None, start): (0.0, None, None)}]
    for k, i in enumerate(dec):
        prev_i = dec[k - 1] if k else None
        local: dict = {}
        nxt: dict = {}
        for (pdev, res), (val, _, _) in layers[-1].items():
            for ch in prob.cands[i]:
                r = list(res)
                if ch.capacity and ch.device in xbar_devs:
                    j = xbar_devs.index(ch.device)
                    r[j] += ch.kept_tiles
                    if residency and r[j] > caps[ch.device]:
                        continue
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
                sk = (ch.device, tuple(r))
                if sk not in nxt or v < nxt[sk][0]:
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
    totals of the baselines (all on host, heuristic) under the same model."""

    assign: dict
    totals: Totals
    method: str
    baselines: dict
    exact: bool


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
    return _choice(dev, a, c.capacity, c.mram_capacity, c.note, bytes_moved=c.cost.bytes_moved)


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
    baselines = {"all-host": t_host}
    if heur is not None:
        baselines["heuristic"] = evaluate(prob, heur)
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
    return Solution(assign, tot, method, baselines, exact)


# --------------------------------------------------------------------------------------------
# The pass strategy
# --------------------------------------------------------------------------------------------

def _reason(prob: Problem, sol: Solution, i: int, objective: str) -> str:
    assign = sol.assign
    ch = prob.choice(assign, i)
    head = f"cost[{objective}]"
    if i in prob.fixed:
        base = prob.hint_note.get(i, "fixed")
        return f"{base}: {si(ch.cost.latency_s, 's')}, {si(ch.cost.energy_j, 'J')} on {ch.device}"
    parts = [f"{head}: {ch.device} {si(ch.cost.latency_s, 's')}, {si(ch.cost.energy_j, 'J')}"
             + (f", {ch.cost.writes} tile writes/inf" if ch.cost.writes else "")
             + (f", keeps {ch.kept_tiles} of {ch.capacity} crossbar tiles" if ch.capacity else "")]
    cur = sol.totals
    for alt in prob.cands[i]:
        if alt is ch:
            continue
        dl, de = _local_delta(prob, assign, i, alt)
        trial = _swap_totals(cur, ch, alt, dl, de)
        bad = violations(prob, trial)
        dv = _f(objective, trial.latency_s, trial.energy_j) - cur.value(objective)
        unit = {"latency": "s", "energy": "J", "edp": "Js"}[objective]
        txt = f"{alt.device} {'+' if dv >= 0 else ''}{si(dv, unit)}"
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
    prob = build_problem(model, options, hints)
    sol = solve(prob, objective)
    counts: Counter = Counter()
    for i, node in enumerate(prob.nodes):
        if node.domain != cinm.DOMAIN:
            continue
        ch = prob.choice(sol.assign, i)
        set_attr(node, "device", ch.device)
        set_attr(node, "placement", _reason(prob, sol, i, objective))
        counts[ch.device] += 1
    bad = violations(prob, sol.totals)
    for v in bad:
        ctx.log(f"placement: user hints break a constraint: {v}")
    ctx.log(f"placement: cost[{objective}] {sol.method}; modeled {si(sol.totals.latency_s, 's')}, "
            f"{si(sol.totals.energy_j, 'J')}")
    return {"devices": counts, **prob.hint_stats, "strategy": "cost",
            "objective": objective, "method": sol.method, "exact": sol.exact,
            "totals": sol.totals, "baselines": sol.baselines, "violations": bad}


def evaluate_model(model: onnx.ModelProto, options: dict | None = None) -> tuple[Totals, list, Problem]:
    """Modeled totals of the placement already recorded in ``model`` (the ``device`` attribute
    of every cinm op), under the same model as cost placement: ``(totals, violations, problem)``.
    Ops whose recorded device cannot run them under ``options`` are charged on the host and
    named in the violations."""
    options = dict(options or {})
    prob = build_problem(model, options)
    assign, bad = {}, []
    devs = {i: cinm.node_attrs(prob.nodes[i]).get("device", "host") for i in prob.decision}
    for i, ch in _with_variants(prob, devs).items():
        if ch is None:
            bad.append(f"{prob.nodes[i].name}: {devs[i]} cannot run it under these options")
            ch = prob.cands[i][0]
        assign[i] = ch
    prob.assign = assign
    tot = evaluate(prob, assign)
    return tot, bad + violations(prob, tot), prob
