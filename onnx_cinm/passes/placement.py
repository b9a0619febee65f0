"""Pass ``placement``: choose the device of every cinm op.

Two strategies (``ctx.options["placement"]``): ``cost`` (:mod:`.cost_placement`: the device
minimizing the modeled latency, energy or EDP of the whole graph under crossbar, endurance and
DPU constraints) and ``heuristic``, the heuristic of CINM: a matrix product with a constant operand and enough work goes to a
compute-in-memory device (crossbar), every other cinm op the compute-near-memory device (UPMEM)
supports goes there, and the rest stays on the host. User hints win: ``--place PATTERN=DEVICE``
(``fnmatch`` patterns over node names and op types; the first matching hint wins). A hint the
device cannot honour falls back to the strategy, the reason says so, and ``optimize`` warns
(:func:`.placement_rules.hint_warnings`: refused, shadowed by an earlier hint, or matching no
cinm op).

Each cinm node gets two attributes: ``device`` (a registry name) and ``placement`` (the reason,
in words). Devices are reached only through :mod:`onnx_cinm.devices` (the registry).
"""
from __future__ import annotations

from collections import Counter

import onnx

from .. import devices
from ..analysis import op_info
from ..dialects import cinm
from . import PassContext, register_pass
from .pass_options import STRATEGIES, PlacementOptions, parse_hint  # noqa: F401 (re-exported)
from .placement_rules import HintLog, heuristic, hint_warnings

_PARADIGM_ORDER = ("cim", "cnm")



def _set_attr(node: onnx.NodeProto, name: str, value: str) -> None:
    """Set string attribute ``name`` of ``node`` to ``value`` (any old one removed): the
    attribute ``helper.make_attribute(name, value)`` makes, built in place in the node
    (``add``) instead of built apart and copied in (twice per cinm op)."""
    attrs = node.attribute
    for k in range(len(attrs) - 1, -1, -1):
        if attrs[k].name == name:
            del attrs[k]
    a = attrs.add()
    a.name = name
    a.s = value.encode("utf-8")
    a.type = onnx.AttributeProto.STRING


@register_pass("placement", keeps_shapes=True)
def placement(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Annotate every cinm op with the device that runs it (cost model or paper heuristic, plus
    user hints).

    Reads ``ctx.options["placement"]`` (``"cost"``, the default of
    :class:`.pass_options.PlacementOptions`, whose options are listed in
    :func:`.cost_placement.place_by_cost`, or ``"heuristic"``) and ``ctx.options["place"]`` (a
    list of ``(pattern, device)``). Records ``ctx.stats["placement"] = {"devices": Counter,
    "unused_hints": [...], "shadowed_hints": [...], "refused_hints": [...], "strategy":
    "heuristic"}`` (see :meth:`HintLog.stats`; cost placement's ``strategy`` is ``"cost"``, and
    it adds its totals, baselines and method).
    """
    strategy = ctx.options.get("placement") or PlacementOptions.strategy
    if strategy == "cost":
        from .cost_placement import place_by_cost

        ctx.stats["placement"] = stats = place_by_cost(model, ctx, _set_attr)
        for line in hint_warnings(stats):
            ctx.log(f"placement: {line}")
        return model
    hints = HintLog(ctx.options.get("place", []), ctx.source_ops)
    infos = ctx.tensor_infos(model)
    counts: Counter = Counter()
    for node in model.graph.node:
        if node.domain != cinm.DOMAIN:
            continue
        info = op_info(node, infos)
        chosen = None
        hint = hints.first(node)
        if hint is not None:
            k, pattern, dev_name = hint
            s = devices.get_device(dev_name).supports_under(info, ctx.options)
            if s:
                chosen = (dev_name, f"hint {pattern}={dev_name}: {s.reason}")
            else:
                hints.refuse(k, node, f"{dev_name}: {s.reason}")
                dev, why = heuristic(info, ctx.options)
                chosen = (dev, f"hint {pattern}={dev_name} not possible ({s.reason}); {why}")
        dev, reason = chosen or heuristic(info, ctx.options)
        _set_attr(node, "device", dev)
        _set_attr(node, "placement", reason)
        counts[dev] += 1
    ctx.stats["placement"] = stats = {"devices": counts, **hints.stats(), "strategy": "heuristic"}
    for line in hint_warnings(stats):
        ctx.log(f"placement: {line}")
    return model
