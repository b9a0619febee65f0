"""Cost placement's problem: the candidates of every op on every device (asked through the
device contract and cached), the budgets, and the tensors that may cross devices."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx

from ... import devices
from ...analysis import op_info, tensor_infos
from ...devices import Cost, Device, Priced
from ...dialects import cinm
from .. import pass_option_schema
from ..pass_options import PlacementOptions
from ..placement_rules import HintLog


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
    ``tile_set``: :attr:`Priced.tile_set`; of the ops whose choices keep one tile set, only the
    first in graph order counts its tiles (:func:`build_problem`).
    """

    device: str
    cost: Cost
    kept_tiles: int = 0
    capacity: int = 0
    mram_resident: int = 0
    mram_capacity: int = 0
    note: str = ""
    streamed: bool = False
    tile_set: str = ""


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
    return (op.op_type, attrs, tuple(map(_tensor_key, op.inputs)),
            tuple(map(_tensor_key, op.outputs)), op.flops)


def _tensor_key(t) -> tuple:
    """A tensor's part of :func:`_op_key`: a constant's name too (a choice may name the tiles
    it keeps after it, :attr:`Priced.tile_set`)."""
    return t.dtype, t.shape, t.const, t.name if t.const else ""


def device_cost(dev: Device, op, options: dict) -> Cost:
    """``dev``'s modeled cost of ``op`` under ``options``. Raises whatever the device raises."""
    return dev.cost(op, options)


def candidate(dev: Device, op, options: dict) -> list | str:
    """The :class:`Choice` list of ``op`` on ``dev`` (its :meth:`Device.price` choices, e.g. a
    crossbar's pinned and streamed), or the reason ``dev`` refuses it (a string)."""
    return _query(dev, op, options)[1]


def _query(dev: Device, op, options: dict, op_key: tuple | None = None,
           opts_key: tuple | None = None) -> tuple:
    """``(dev.supports_under(op, options), candidate(dev, op, options))``, cached per device,
    op signature (``op_key``: :func:`_op_key` of ``op`` when already known) and the options the
    device depends on (``opts_key``: :func:`_opts_key` of ``options`` and ``dev``, likewise). A refusal is cached only when its reason names neither the op nor one
    of its tensors (then it is every op's of that signature; placement, restore_host_ops and
    the written model's totals each ask again for every op)."""
    key = (dev.name, id(dev), op_key or _op_key(op),
           _opts_key(options, dev) if opts_key is None else opts_key)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    s = dev.supports_under(op, options)
    if not s:
        return _keep(key, (s, s.reason if s.applicable else ""), op)
    try:
        priced = dev.price(op, options)
        res = dev.resources(options)
    except Exception as e:  # noqa: BLE001 - e.g. data that do not fit the DPUs' MRAM
        return _keep(key, (s, str(e).splitlines()[0] if str(e) else type(e).__name__), op)
    note = "" if s.preferred else s.reason
    out = [_choice(dev.name, p, res.crossbars, res.memory_bytes, note) for p in priced]
    return _keep(key, (s, out), op)


def _keep(key: tuple, answer: tuple, op) -> tuple:
    """Cache ``answer`` of :func:`_query` under ``key`` (unless it is a refusal naming ``op``
    or one of its tensors) and return it."""
    why = answer[1]
    if isinstance(why, str) and why and any(
            n and n in why for n in (op.name, *(t.name for t in op.inputs + op.outputs))):
        return answer
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    _CACHE[key] = answer
    return answer


def _choice(dev: str, p: Priced, capacity: int, memory: int, note: str = "",
            bytes_moved: int | None = None) -> Choice:
    cost = p.cost if bytes_moved is None else Cost(p.cost.latency_s, p.cost.energy_j,
                                                   p.cost.writes, bytes_moved, p.cost.parts)
    return Choice(dev, cost, p.kept_crossbars, capacity, p.resident_bytes if memory else 0,
                  memory, note, streamed=p.streamed, tile_set=p.tile_set)


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
    paid: dict | None = None                        # see search._paid
    links: dict = field(default_factory=dict)       # see _link
    support: dict = field(default_factory=dict)     # cinm node index -> {device: Support}
    heuristic: dict | None = None                   # see search.heuristic_assign
    evals: dict = field(default_factory=dict)       # see search._evaluate
    compiled: dict = field(default_factory=dict)    # see search._as_compiled
    shared: dict = field(default_factory=dict)      # see search._shared_plans

    def device_of(self, assign: dict, i: int) -> str:
        if i < 0:
            return "host"
        ch = self.fixed.get(i) or assign.get(i)
        return ch.device if ch is not None else "host"

    def choice(self, assign: dict, i: int) -> Choice:
        return self.fixed.get(i) or assign[i]


def _share_tile_sets(prob: Problem) -> None:
    """Choices keeping a tile set an earlier op's choice keeps (same device and
    :attr:`Choice.tile_set`) keep no tiles of their own: the set counts once against the
    crossbars, as the device's model-wide plan programs it once. (The search may still pin a
    later op whose earlier one streams; every reported assignment is priced from the plans.)"""
    seen: set = set()
    for i in sorted(prob.cands):
        cands = prob.cands[i]
        keys = {(c.device, c.tile_set) for c in cands if c.tile_set and c.kept_tiles}
        shared = keys & seen
        if shared:
            new = [replace(c, kept_tiles=0) if (c.device, c.tile_set) in shared else c for c in cands]
            k = next((k for k, c in enumerate(cands) if c is prob.fixed.get(i)), None)
            if k is not None:
                prob.fixed[i] = new[k]
            prob.cands[i] = new
        seen |= keys


def placement_targets() -> list:
    """The registry's devices other than the host: those :func:`build_problem` asks about
    every cinm op, in registration order."""
    return [d for d in devices.all_devices() if d.paradigm != "host"]


def build_problem(model: onnx.ModelProto, options: dict, hints=(), infos=None,
                  sources: dict | None = None) -> Problem:
    """Collect candidates and tensors of ``model`` (cinm ops already created); ``sources``: the
    source op types of its cinm ops, for the hints (:class:`.placement_rules.HintLog`)."""
    infos = infos if infos is not None else tensor_infos(model)
    prob = Problem(list(model.graph.node), infos, options, Constraints.from_options(options))
    host = devices.get_device("host")
    targets = placement_targets()
    hint_log = HintLog(hints, sources)
    opts_keys = [_opts_key(options, dev) for dev in targets]  # the same for every op
    host_costs: dict = {}  # op signature -> the host's cost of a cinm op (this call's options)
    for i, node in enumerate(prob.nodes):
        info = op_info(node, infos)
        prob.ops.append(info)
        if node.domain != cinm.DOMAIN:
            prob.fixed[i] = Choice("host", device_cost(host, info, options))
            continue
        key = _op_key(info)  # asked once for every device
        hcost = host_costs.get(key)
        if hcost is None:
            hcost = host_costs[key] = device_cost(host, info, options)
        hc = Choice("host", hcost)
        cands, refused = [hc], []
        prob.support[i] = support = {}
        for dev, opts_key in zip(targets, opts_keys):
            support[dev.name], r = _query(dev, info, options, key, opts_key)
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
    _share_tile_sets(prob)
    # tensors
    const = {t.name for t in model.graph.initializer}
    producer = {}
    for i, node in enumerate(prob.nodes):
        for o in node.output[:]:  # (slices: lists, see rewrite's note)
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
        for n in node.input[:]:
            t = tensor(n)
            if t is not None and i not in prob.tensors[t].consumers:
                prob.tensors[t].consumers.append(i)
        for n in node.output[:]:
            tensor(n)
    for k, t in enumerate(prob.tensors):
        for i in {t.producer, *t.consumers} - {-1}:
            prob.touch.setdefault(i, []).append(k)
    return prob
