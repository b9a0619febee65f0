"""Cost placement's model of one assignment: totals, transfers charged per tensor and per node,
and the budgets an assignment breaks."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


from ... import devices
from ...devices import Cost
from ...paradigms.cim.wear import writes_per_cell
from .problem import Choice, Problem, Tensor, link_cost


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
        """The figure ``objective`` minimizes (KeyError for an unknown one)."""
        if objective == "energy":
            return self.energy_j
        if objective == "latency":
            return self.latency_s
        if objective == "edp":
            return self.edp()
        raise KeyError(objective)


def tensor_charges(prob: Problem, t: Tensor, dev_of) -> list[tuple[int, float, float, int]]:
    """The transfers of tensor ``t`` given ``dev_of(node index) -> device name``, each as
    ``(node index charged, seconds, joules, bytes)``: the way out of a device (when any reader,
    or the graph output, sits elsewhere), charged to the producer; the way into each distinct
    consumer device other than the producer's and the host, once, charged to the first consumer
    (graph order) on that device. The one transfer rule: :func:`node_costs` spreads it over the
    nodes; :func:`tensor_cost` adds up the same charges in the same order without listing
    them (tests/test_cost_placement.py checks that the two agree)."""
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
    (the sum of :func:`tensor_charges`, in its order, without listing the charges: the search
    asks this one most)."""
    if t.nbytes <= 0:
        return _NOTHING
    a = dev_of(t.producer)
    for c in t.consumers:
        if dev_of(c) != a:
            break
    else:  # every consumer on the producer's device
        if a == "host" or not t.output:  # nothing crosses (the search's most asked)
            return _NOTHING
    dests = []  # the consumers' devices, first seen first
    for c in t.consumers:
        d = dev_of(c)
        if d not in dests:
            dests.append(d)
    s = j = 0.0
    moved = 0
    if a != "host":
        ds, dj = _link(prob, a, t.nbytes, False)
        s, j, moved = s + ds, j + dj, moved + t.nbytes
    for d in dests:
        if d != a and d != "host":
            ds, dj = _link(prob, d, t.nbytes, True)
            s, j, moved = s + ds, j + dj, moved + t.nbytes
    return s, j, moved


#: :func:`tensor_cost` of a tensor nothing moves (one tuple, not one per call).
_NOTHING = (0.0, 0.0, 0)


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


def _devices(prob: Problem, assign: dict) -> list:
    """:meth:`Problem.device_of` of every node under ``assign``, in graph order, then
    ``"host"``: indexed by a tensor's producer, -1 (a graph input) reads the host."""
    fixed = prob.fixed
    out = []
    for i in range(len(prob.nodes)):
        ch = fixed.get(i) or assign.get(i)
        out.append(ch.device if ch is not None else "host")
    out.append("host")
    return out


def evaluate(prob: Problem, assign: dict) -> Totals:
    """Totals of the placement ``assign`` (decision node index -> Choice; fixed nodes as fixed)."""
    tot = Totals()
    fixed, cands = prob.fixed, prob.cands
    lat = en = 0.0  # :func:`_add_choice`'s sums, in the same order (the search asks this often)
    writes = 0
    devs = []
    touch, near = prob.touch, set()  # the tensors some node off the host touches
    for i in range(len(prob.nodes)):
        ch = fixed.get(i) or assign.get(i) or cands[i][0]
        c = ch.cost
        lat += c.latency_s
        en += c.energy_j
        writes += c.writes
        if ch.capacity or c.writes or ch.mram_capacity:  # else it adds nothing (most nodes)
            _add_resources(tot, ch)
        d = ch.device
        devs.append(d)
        if d != "host":
            near.update(touch.get(i, ()))
    devs.append("host")  # a graph input (producer -1) is read from the host
    tot.latency_s, tot.energy_j, tot.writes = lat, en, writes
    s = j = 0.0
    moved = 0
    dev_of = devs.__getitem__
    tensors = prob.tensors
    # in tensor order, as every tensor: one whose producer and readers are all on the host
    # moves nothing (tensor_cost's (0.0, 0.0, 0)), and adding 0.0 to these sums changes none
    for k in sorted(near):
        t = tensors[k]
        if t.nbytes > 0:
            ds, dj, db = tensor_cost(prob, t, dev_of)
            s += ds
            j += dj
            moved += db
    tot.transfer_s, tot.transfer_j, tot.transfer_bytes = s, j, moved
    tot.latency_s += s
    tot.energy_j += j
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
    dev_of = _devices(prob, assign).__getitem__
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
    _add_resources(tot, ch, sign)


def _add_resources(tot: Totals, ch: Choice, sign: int = 1) -> None:
    """The per-device part of :func:`_add_choice`: kept tiles, crossbars, writes per device,
    resident bytes."""
    if ch.capacity:
        tot.kept_tiles[ch.device] += sign * ch.kept_tiles
        tot.capacity[ch.device] = ch.capacity
        tot.writes_by_dev[ch.device] += sign * ch.cost.writes
    elif ch.cost.writes:
        tot.writes_by_dev[ch.device] += sign * ch.cost.writes
    if ch.mram_capacity:
        tot.mram[ch.device] += sign * ch.mram_resident
        tot.mram_capacity[ch.device] = ch.mram_capacity


def breaks(prob: Problem, tot: Totals, old: Choice, new: Choice) -> bool:
    """Whether the totals of ``tot`` with one op moved from choice ``old`` to ``new`` (what
    :func:`_add_choice` makes of them, ``old`` taken out and ``new`` added) break a budget,
    for totals ``tot`` that break none: ``bool(violations(...))`` of those totals without
    making them. Only the figures of ``old``'s and ``new``'s devices change, so only they are
    checked, from the same integers :func:`violations` reads (a device's count that the move
    would add at 0 is checked as :func:`violations` checks it)."""
    c = prob.constraints
    for dev in (old.device, new.device) if old.device != new.device else (old.device,):
        kept, cap = tot.kept_tiles.get(dev), tot.capacity.get(dev, 0)
        written = tot.writes_by_dev.get(dev)
        mram, mcap = tot.mram.get(dev), tot.mram_capacity.get(dev, 0)
        for ch, sign in ((old, -1), (new, 1)):
            if ch.device != dev:
                continue
            if ch.capacity:
                kept = (kept or 0) + sign * ch.kept_tiles
                cap = ch.capacity
                written = (written or 0) + sign * ch.cost.writes
            elif ch.cost.writes:
                written = (written or 0) + sign * ch.cost.writes
            if ch.mram_capacity:
                mram = (mram or 0) + sign * ch.mram_resident
                mcap = ch.mram_capacity
        if c.crossbar_residency and kept is not None and cap and kept > cap:
            return True
        if c.max_writes_per_cell is not None and written is not None:
            per_cell = writes_per_cell(written, cap - (kept or 0), c.lifetime_inferences)
            if per_cell > c.max_writes_per_cell * (1 + 1e-12):
                return True
        if mram is not None and mcap and mram > mcap:
            return True
    return False


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
            # the streamed tiles rotate over the crossbars the kept ones leave (at least one)
            streamed = tot.capacity.get(dev, 0) - tot.kept_tiles.get(dev, 0)
            per_cell = writes_per_cell(w, streamed, c.lifetime_inferences)
            if per_cell > c.max_writes_per_cell * (1 + 1e-12):
                out.append(f"{dev}: {per_cell:.3g} writes per cell over {c.lifetime_inferences:g} "
                           f"inference(s) > budget {c.max_writes_per_cell:g}")
    for dev, b in tot.mram.items():
        cap = tot.mram_capacity.get(dev, 0)
        if cap and b > cap:
            out.append(f"{dev}: {b} B of resident constants > {cap} B of memory")
    return out
