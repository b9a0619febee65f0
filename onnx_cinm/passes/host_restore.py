"""Pass ``restore_host_ops``: a node ``to_cinm`` lowered goes back to the original op where no
device runs its cinm ops, or where the original on the host costs less.

``to_cinm`` lowers without knowing where the ops will run: a grouped Conv becomes Im2Col +
Reshape + Transpose + a batched Gemm, which is what a crossbar wants and slower than
onnxruntime's Conv on the host (fsmn_vad: 4.44 ms / 82.2 mJ lowered, 2.24 ms / 67.3 mJ as it
was). After placement this pass, per node lowered into several (``ctx.origins``, recorded by
``to_cinm``; a 1:1 lowering's cinm op on the host runs the original op already, a group a
user hint placed keeps the hint's placement, visible in its reason, and an unrolled recurrence
stays unrolled):

1. restores the original node when every cinm op it became stays on the host (its result is
   then onnxruntime's on the original op, exactly);
2. with cost placement, restores it too when the model with the original op on the host costs
   less (the placement's objective over the whole graph, transfers included, priced by
   :func:`.cost_placement.evaluate_model`), of the groups whose original could cost less
   (its own host cost below the group's ops' own costs plus their transfers, in latency or in
   energy), the :data:`MAX_TRIALS` with the most to gain, :data:`CHUNK` at a time (a chunk
   that costs less as a whole is kept whole);
3. replaces the cost placement's totals by the restored model's, and its ``all-host``
   baseline by the model with every lowered node restored, on the host: the original model.
"""
from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper

from ..dialects import cinm
from ..graph import TensorInfo
from ..rewrite import FillWeight, rule_key
from . import PassContext, register_pass
from .graph_names import drop_unread_initializers
from .origins import NEVER_RESTORED
from .pass_options import PlacementOptions

#: Lowered nodes with an op on a device whose restoration is priced (one whole-graph
#: evaluation each), of those that might gain (:func:`_worth_trying`), most to gain first.
MAX_TRIALS = 64

#: Groups priced together first (most to gain first): a chunk that costs less as a whole is
#: kept whole (one evaluation), else its groups are priced one by one. light LEADER at 384x288
#: (afis 1.2.7): 42 of its grouped Convs cost less on the host, priced one by one in 4.75 s.
CHUNK = 8


def _groups(graph: onnx.GraphProto, origins: list) -> list[tuple[onnx.NodeProto, dict, list[int]]]:
    """The recorded lowerings still whole in ``graph``: ``(original node, its weights, indices
    of the nodes it became)``, those whose nodes all exist, produce every output of the
    original and whose other outputs only they read (and are no graph outputs), and whose
    original's inputs all still exist before them (a QDQ op's lowering reads the integer
    operands and drops the DequantizeLinear it read through). Only those of at least two
    nodes are ever restored (a 1:1 lowering's cinm op on the host runs its reference body,
    the original op); the others are priced as they were for the all-host baseline."""
    index = {n.name: k for k, n in enumerate(graph.node) if n.name}
    readers: dict[str, set[int]] = {}
    for k, n in enumerate(graph.node):
        for name in n.input[:]:  # (slices: lists, see rewrite's note)
            readers.setdefault(name, set()).add(k)
    outputs = {o.name for o in graph.output}
    made_at = {o: k for k, n in enumerate(graph.node) for o in n.output[:] if o}
    given = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    out = []
    for proto, weights, names in origins:
        if rule_key(proto) in NEVER_RESTORED or not names or \
                any(name not in index for name in names):
            continue
        ks = sorted(index[name] for name in names)
        if any(n.attribute and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                   for a in n.attribute[:]) for n in (graph.node[k] for k in ks)):
            continue
        made = {o for k in ks for o in graph.node[k].output[:] if o}
        final = {o for o in proto.output[:] if o}
        inner = made - final
        if not final <= made or inner & outputs or \
                any(not readers.get(v, set()) <= set(ks) for v in inner):
            continue
        if any(name and name not in given and name not in weights and
               made_at.get(name, len(graph.node)) >= ks[0] for name in proto.input[:]):
            continue  # an input the lowering read through is gone (a QDQ op's DequantizeLinear)
        out.append((proto, weights, ks))
    return out


def _restored(graph: onnx.GraphProto, groups: list) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` with each group's nodes replaced by its original node (at the
    place of the group's first node)."""
    first = {ks[0]: proto for proto, _, ks in groups}
    gone = {k for _, _, ks in groups for k in ks}
    nodes = []
    for k, n in enumerate(graph.node):
        if k in first:
            nodes.append(first[k])
        elif k not in gone:
            nodes.append(n)
    return nodes


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers are stubs (name, type and dims, no data): all
    the cost model reads of them."""
    sk = onnx.ModelProto()
    for field in ("ir_version", "opset_import", "functions", "metadata_props"):
        if field in ("opset_import", "functions", "metadata_props"):
            getattr(sk, field).extend(getattr(model, field))
        else:
            setattr(sk, field, getattr(model, field))
    g = sk.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t in model.graph.initializer:
        g.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    return sk


def _with_nodes(skeleton: onnx.ModelProto, nodes: list, weights: dict) -> onnx.ModelProto:
    """``skeleton`` with ``nodes`` and stubs of the ``weights`` it lacks."""
    trial = onnx.ModelProto()
    trial.CopyFrom(skeleton)
    del trial.graph.node[:]
    trial.graph.node.extend(nodes)
    have = {t.name for t in trial.graph.initializer}
    for name, t in weights.items():
        if name not in have:
            trial.graph.initializer.add(name=name, data_type=t.data_type, dims=t.dims)
    return trial


def _worth_trying(graph: onnx.GraphProto, groups: list, now, before: dict, originals: list,
                  objective: str) -> list:
    """The ``groups`` (placed on devices) whose original op on the host could cost less under
    ``objective``, most to gain first. ``now``: the cost problem of the model as placed;
    ``before``: the host choices of ``originals`` (every lowered node put back) by index
    (:func:`.cost_placement.evaluate_on_host`). A group can
    gain only if its original's own host cost is below what putting it back removes at most:
    the group's ops' own costs plus every transfer of a tensor they touch, in the objective's
    quantity (``latency`` or ``energy``; ``edp`` gains only if one of them does). Not counted:
    what the group's leaving frees for other kernels (crossbars they could then keep), so a
    group gaining only that way is not tried."""
    from .cost_placement.evaluate import tensor_cost

    where = {n.name: k for k, n in enumerate(now.nodes) if n.name}
    at = {id(n): k for k, n in enumerate(originals)}

    def dev_of(i):
        return now.device_of(now.assign, i)

    out = []
    for g in groups:
        proto, _, ks = g
        host = before.get(at.get(id(proto), -1))
        idx = [where.get(graph.node[k].name) for k in ks]
        if host is None or None in idx:
            out.append((float("inf"), g))  # not priced alone: tried
            continue
        lat = en = 0.0
        for i in idx:
            ch = now.fixed.get(i) or now.assign.get(i)
            if ch is not None:
                lat += ch.cost.latency_s
                en += ch.cost.energy_j
        for k in {k for i in idx for k in now.touch.get(i, ())}:
            s, j, _ = tensor_cost(now, now.tensors[k], dev_of)
            lat += s
            en += j
        gains = {"latency": (lat - host.cost.latency_s) / max(lat, 1e-30),
                 "energy": (en - host.cost.energy_j) / max(en, 1e-30)}
        gain = gains[objective] if objective in gains else max(gains.values())
        if gain > 0:
            out.append((gain, g))
    out.sort(key=lambda x: -x[0])
    return [g for _, g in out]


#: The one attribute :func:`_on_host` / :func:`_hinted` read (the others of a placed op, its
#: plan and its placement reason, are not converted).
_DEVICE, _PLACEMENT = frozenset({"device"}), frozenset({"placement"})


def _on_host(graph: onnx.GraphProto, ks: list[int]) -> bool:
    return all(cinm.node_attrs(graph.node[k], _DEVICE).get("device", "host") == "host"
               for k in ks if graph.node[k].domain == cinm.DOMAIN)


def _hinted(graph: onnx.GraphProto, ks: list[int]) -> bool:
    return any(str(cinm.node_attrs(graph.node[k], _PLACEMENT).get("placement", "")).startswith("hint ")
               for k in ks if graph.node[k].domain == cinm.DOMAIN)


def _rewrite_reasons(graph: onnx.GraphProto, reasons: dict) -> None:
    """Replace the ``placement`` text of each cinm op of ``graph`` named in ``reasons`` (in
    place, where the attribute is), unless a hint placed it (the text says so first)."""
    for node in graph.node:
        new = reasons.get(node.name) if node.domain == cinm.DOMAIN else None
        if new is None:
            continue
        for a in node.attribute:
            if a.name == "placement":
                if not a.s.startswith(b"hint"):
                    a.s = new.encode("utf-8")
                break


@register_pass("restore_host_ops", keeps_shapes=True)  # forgets the infos when it restores
def restore_host_ops(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Put back the original of every lowered node whose cinm ops all stay on the host, or
    (cost placement) whose original on the host costs less than its placed ops.

    Reads ``ctx.origins`` (from ``to_cinm``; cleared here). Records
    ``ctx.stats["restore_host_ops"] = {"restored": Counter by op type, "cheaper": n}`` (``cheaper``:
    how many of them had device ops, restored because the original on the host costs less)
    and, with cost placement, replaces ``ctx.stats["placement"]``'s ``totals`` and its
    ``all-host`` baseline (see the module docstring). Rewrites ``model`` in place. A model with
    nothing to restore is left as it is, so the tensor infos the placement inferred
    (:meth:`PassContext.tensor_infos`) stay valid for the passes after it (``keeps_shapes``);
    restoring forgets them (the light DenseNet121, ResNet50 and VGG19 restore nothing: one
    whole-graph shape inference fewer, 0.04 s on DenseNet121).
    """
    origins, ctx.origins = ctx.origins, []
    placed, ctx.placed = ctx.placed, None
    graph = model.graph
    # none restorable without a lowering into several nodes: then none to find
    everything = _groups(graph, origins) if any(len(o[2]) >= 2 for o in origins) else []
    groups = [g for g in everything if len(g[2]) >= 2]
    stats = ctx.stats.get("placement", {})
    cost = stats.get("strategy") == "cost"
    # each group's nodes read once: (on the host, hinted) by group, for keep and the trials
    where = [(_on_host(graph, g[2]), _hinted(graph, g[2])) for g in groups]
    keep = [g for g, (host, hint) in zip(groups, where) if host and not hint]
    cheaper = 0
    reasons: dict = {}  # cost placement's reasons for the model as it is after restoring
    if cost and groups:
        from .cost_placement import evaluate_model, evaluate_on_host, reasons_as_placed

        objective = stats.get("objective") or PlacementOptions.objective
        infos = dict(ctx.tensor_infos(model))
        for _, weights, _ in everything:
            for name, t in weights.items():
                if name not in infos:
                    infos[name] = TensorInfo(name, helper.tensor_dtype_to_np_dtype(t.data_type),
                                             tuple(t.dims), True)
        weights = {n: t for _, w, _ in everything for n, t in w.items()}
        skeleton: list = []  # made on the first trial (most models price none)

        def priced(nodes) -> tuple:
            if not skeleton:
                skeleton.append(_skeleton(model))
            tot, _, prob = evaluate_model(_with_nodes(skeleton[0], nodes, weights), ctx.options,
                                          infos)
            return tot, prob

        # the model as placed, unless groups went back: the placement priced it already
        hit = placed.priced(model, ctx.options, infos) if placed and not keep else None
        current, now = hit or priced(_restored(graph, keep))
        originals = _restored(graph, everything)
        all_host, before = evaluate_on_host(originals, ctx.options, infos, placed)
        tried = _worth_trying(graph, [g for g, (host, hint) in zip(groups, where)
                                      if not host and not hint], now, before, originals, objective)
        if len(tried) > MAX_TRIALS:
            ctx.log(f"restore_host_ops: {len(tried)} lowered nodes on devices might cost less as "
                    f"they were; the {MAX_TRIALS} with the most to gain are priced")
            tried = tried[:MAX_TRIALS]
        for start in range(0, len(tried), CHUNK):
            chunk = tried[start:start + CHUNK]
            trial, trial_prob = priced(_restored(graph, keep + chunk))
            if len(chunk) > 1 and trial.value(objective) < current.value(objective):
                keep += chunk  # the chunk together costs less: one evaluation, not len(chunk)
                current, now = trial, trial_prob
                cheaper += len(chunk)
                continue
            for g in chunk:
                if len(chunk) > 1:
                    trial, trial_prob = priced(_restored(graph, keep + [g]))
                if trial.value(objective) < current.value(objective):
                    keep.append(g)
                    current, now = trial, trial_prob
                    cheaper += 1
        stats["totals"] = current
        if keep:  # the reasons of the ops left on devices, for the model as it is now
            reasons = reasons_as_placed(now, current, objective)
        if "baselines" in stats:
            stats["baselines"]["all-host"] = all_host
    if keep:
        nodes = _restored(graph, keep)
        have = {t.name for t in graph.initializer}
        for _, weights, _ in keep:
            for name, t in weights.items():
                if name not in have:  # (a FillWeight: the initializer to_cinm reshaped)
                    graph.initializer.append(t.tensor() if isinstance(t, FillWeight) else t)
                    have.add(name)
        made = {o for n in graph.node for o in n.output}
        del graph.node[:]
        graph.node.extend(nodes)
        gone = made - {o for n in graph.node for o in n.output}
        infos = [v for v in graph.value_info if v.name not in gone]
        if len(infos) < len(graph.value_info):  # the lowered ops' intermediate values
            del graph.value_info[:]
            graph.value_info.extend(infos)
        drop_unread_initializers(graph)
        _rewrite_reasons(graph, reasons)
        ctx.forget_infos()
        if "devices" in stats:
            stats["devices"] = Counter(cinm.node_attrs(n, _DEVICE).get("device", "host")
                                       for n in graph.node if n.domain == cinm.DOMAIN)
    restored = Counter(proto.op_type for proto, _, _ in keep)
    ctx.stats["restore_host_ops"] = {"restored": restored, "cheaper": cheaper}
    if keep:
        ctx.log(f"restore_host_ops: {len(keep)} lowered nodes back as they were "
                f"({dict(restored)}; {cheaper} of them cheaper on the host than as placed)")
    return model
