"""Compile the branches of If nodes: each branch on its own, through the same passes as the main
graph, then back into its If.

A branch reads values of the graph around it (captured values). To compile it alone it becomes
a model of its own (:func:`.branches.branch_model`):

- a captured initializer of the outer graph becomes one of its initializers (a weight the
  crossbar can hold, a Slice bound the folder can read);
- every other captured value becomes an input, typed from the outer graph's shape inference;
  where that knows no shape (the output of another If whose branches differ in rank, as in
  Silero VAD) the dims come from a *probe*: one onnxruntime run of the outer model at the
  planned sizes (the check's first input set, or random inputs) that also records every If
  condition. Each such dim gets a symbolic name of its own with the probed size as its planned
  size, so the branch is planned at the probed sizes but its shape arithmetic is not folded to
  them (a Shape of it stays a Shape).

The branch model runs the pipeline from ``fold_constants`` (the opset is the model's, already
canonical) to the same ``--stop-after`` level, with the same options (``fold_constants``
replaces an If whose condition folds, a rank test say, by the branch it takes); the Ifs left
are compiled the same way, recursively. A branch that gained cinm ops replaces the original one,
with its value_info (symbolic; the sizes of the dims named here, and of the dims that inference
leaves anonymous without the planned sizes, a pad computed from ``Shape(x)`` say, are recorded
under :data:`onnx_cinm.frontend.BRANCH_DIMS_KEY`, which tensor infos bind, so the FLOP count,
the kernels' emission and the provider see the shapes the branch was placed and planned at); a
branch without any keeps its
original nodes. Kernel stems get the branch's path as prefix (``if0012t_``: then-branch of node 12,
:attr:`PassContext.scope`). Names the branch creates that the rest of the model uses are renamed.

Loop and Scan bodies are not compiled: their captured values change per iteration, and the
provider runs them inside host partitions.
"""
from __future__ import annotations

import re
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from .. import frontend
from ..analysis import tensor_infos
from ..dialects import cinm
from . import DEFAULT_PIPELINE, STOP_LEVELS, PassContext, PassManager
from .branches import SUMMED, branch_model, branch_scope, merge_stats
from .canonicalize import condition
from .graph_names import Names, captured

#: The passes run on a branch: the main pipeline but the opset canonicalization.
BODY_PIPELINE = [p for p in DEFAULT_PIPELINE if p != "canonicalize_opset"]
_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def probe(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict[str, np.ndarray]:
    """The values of the tensors ``names`` of ``model``'s main graph on the inputs ``feeds``,
    computed by onnxruntime (``ORT_DISABLE_ALL``); ``{}`` when onnxruntime cannot run the
    model on them (then nothing is probed: the caller compiles without)."""
    if not names or feeds is None:
        return {}
    outputs = len(model.graph.output)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    try:  # the model's bytes with the probed values as outputs, then the model as it was
        data = model.SerializeToString()
    finally:
        del model.graph.output[outputs:]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        feed = {i.name: feeds[i.name] for i in sess.get_inputs() if i.name in feeds}
        return dict(zip(names, sess.run(list(names), feed)))
    except Exception:  # noqa: BLE001 - onnxruntime's own types: no probe, no harm
        return {}


def _if_nodes(graph: onnx.GraphProto) -> list[tuple[int, onnx.NodeProto]]:
    return [(k, n) for k, n in enumerate(graph.node)
            if n.op_type == "If" and n.domain in ("", "ai.onnx")]


def _all_names(graph: onnx.GraphProto, skip: onnx.NodeProto | None = None) -> set[str]:
    """Every tensor and node name of ``graph`` and its bodies, but those inside ``skip``."""
    names = {t.name for t in graph.initializer}
    names.update(v.name for v in (*graph.input, *graph.output, *graph.value_info))
    for node in graph.node:
        names.update((node.name, *node.input, *node.output))
        if node is not skip:
            for sub in frontend.subgraphs(node):
                names |= _all_names(sub)
    names.discard("")
    return names


def _defined(graph: onnx.GraphProto) -> set[str]:
    out = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    for node in graph.node:
        out.update(o for o in node.output if o)
        out.add(node.name)
        for sub in frontend.subgraphs(node):
            out |= _defined(sub)
    out.discard("")
    return out


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename tensors and nodes of ``graph`` and its bodies by ``mapping``, in place."""
    for t in graph.initializer:
        t.name = mapping.get(t.name, t.name)
    for v in (*graph.output, *graph.value_info):
        v.name = mapping.get(v.name, v.name)
    for node in graph.node:
        node.name = mapping.get(node.name, node.name)
        for field in (node.input, node.output):
            for i, n in enumerate(field):
                field[i] = mapping.get(n, n)
        for sub in frontend.subgraphs(node):
            _rename(sub, mapping)


def _input_type(name: str, vi, value, dims: dict, fresh: dict, base: str):
    """The input declaring captured value ``name`` in its branch model, or None when neither the
    outer inference (``vi``) nor the probe (``value``) gives its element type."""
    tt = vi.type.tensor_type if vi is not None and vi.type.HasField("tensor_type") else None
    elem = tt.elem_type if tt is not None and tt.elem_type else (
        helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype) if value is not None else 0)
    if not elem:
        return None
    declared = list(tt.shape.dim) if tt is not None and tt.HasField("shape") else None
    shape = np.shape(value) if value is not None else None
    if declared is None and shape is None:
        return helper.make_tensor_value_info(name, elem, None)
    rank = len(shape) if shape is not None else len(declared)
    out = []
    for axis in range(rank):
        d = declared[axis] if declared is not None and axis < len(declared) else None
        if d is not None and d.HasField("dim_value") and d.dim_value > 0:
            out.append(d.dim_value)
        elif d is not None and d.dim_param in dims:
            out.append(d.dim_param)
        elif shape is not None:
            key = f"{base}_{len(fresh)}"
            fresh[key] = max(int(shape[axis]), 1)
            out.append(key)
        else:
            out.append(None)
    return helper.make_tensor_value_info(name, elem, out)


def _branch_model(model, body, inits, vis, probed, dims, base):
    """The branch ``body`` as a model of its own (see the module docstring,
    :func:`.branches.branch_model`), its planned dims, and why it cannot be (None then)."""
    fresh: dict = {}
    untyped: list = []

    def typed(name):
        vi = _input_type(name, vis.get(name), probed.get(name), dims, fresh, base)
        if vi is None:
            untyped.append(name)
        return vi

    sub = branch_model(model, body, weights=True, input_type=typed, inits=inits,
                       name=body.name or base)
    if sub is None:
        return None, None, f"captured value '{untyped[0]}' has no known type"
    planned = {**dims, **fresh}
    frontend.set_planned_dims(sub, planned)
    return sub, planned, None


def _value_info(sub: onnx.ModelProto, base: str, taken: set[str]) -> tuple[list, dict[str, int]]:
    """value_info of the branch's tensors, inferred without binding the planned sizes (a dim
    keeps its name: a model planned at batch 1 still runs at batch 4), and the sizes of the
    dims it had to name.

    Where inference leaves a dim open without the planned sizes (an ``unk__N`` behind a
    ``Pad`` whose pads come from ``Shape(x)``) but the branch's tensor infos at its planned
    sizes know it (the placement and the plans saw that size), the dim gets a name of its own,
    ``<base>_v<k>`` (not in ``taken``), returned with that size: recorded under
    :data:`onnx_cinm.frontend.BRANCH_DIMS_KEY`, the main model's tensor infos bind it, so
    the kernels are emitted at the shapes they were planned at (an ``unk__N`` is a name
    inference makes up afresh each run; left as it is, it would be taken as 1)."""
    planned = tensor_infos(sub)
    sized = {*frontend.planned_dims(sub), *frontend.planned_dims(sub, frontend.BRANCH_DIMS_KEY)}
    del sub.graph.value_info[:]
    sub = frontend.infer_shapes(sub, strict=False)
    fresh: dict[tuple[str, int], str] = {}
    for vi in sub.graph.value_info:
        info = planned.get(vi.name)
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if info is None or info.shape is None or tt is None or not tt.HasField("shape") \
                or len(tt.shape.dim) != len(info.shape):
            continue
        for d, size in zip(tt.shape.dim, info.shape):
            if d.HasField("dim_value") or d.dim_param in sized or not isinstance(size, int) \
                    or size < 1:  # a planned dim keeps its name (and other sizes stay possible)
                continue
            key = (d.dim_param, size)  # one open dim of one size: one name (equal stays equal)
            if key not in fresh:
                name = f"{base}_v{len(fresh)}"
                while name in taken:
                    name += "_"
                taken.add(name)
                fresh[key] = name
            d.dim_param = fresh[key]
    return list(sub.graph.value_info), {name: size for (_, size), name in fresh.items()}


def compile_if_bodies(model: onnx.ModelProto, ctx: PassContext, *, skip=(), stop_after=None,
                      feeds: dict | None = None) -> onnx.ModelProto:
    """Compile the branches of the If nodes of ``model``'s main graph (see the module
    docstring), in place; the model must have been through the main pipeline.

    Args:
        model: the model (its planned dims recorded, :func:`onnx_cinm.frontend.planned_dims`).
        ctx: the main pipeline's context: its options; the branches' statistics are added to
            its ``stats`` (``to_cinm``, ``placement``, ``device_lowering`` ... as the main
            graph's), plus ``stats["if_bodies"]``: one dict per branch, ``node`` (the If's
            name), ``branch``, ``compiled`` (cinm ops went in), ``cinm`` (their count),
            ``nodes`` (the branch's nodes after), ``why`` (why not compiled, or None).
            ``stats["if_taken"]``: ``{If name: True|False}`` for the Ifs whose condition the
            probe saw. With cost placement, ``stats["placement"]["baselines"]`` become the
            whole model's: the main graph's plus those of the branches a run takes
            (:func:`add_baselines`), as the plan's totals count them.
        skip, stop_after: as the main :class:`PassManager`'s.
        feeds: one input set for the probe (``{input name: array}``); None: nothing probed.

    Returns the model. Raises CinmError as the passes do (a bad option, a device refusing).
    """
    ifs = _if_nodes(model.graph)
    ctx.stats.setdefault("if_bodies", [])
    ctx.stats.setdefault("if_taken", {})
    last = STOP_LEVELS.get(stop_after, stop_after) if stop_after else None
    if not ifs or (last is not None and last not in BODY_PIPELINE[BODY_PIPELINE.index("to_cinm"):]):
        return model
    dims = frontend.planned_dims(model)
    del model.graph.value_info[:]
    model = frontend.infer_shapes(model, strict=False)
    ifs = _if_nodes(model.graph)
    g = model.graph
    # the record of the taken branches, the report and the profile name an If by its node name:
    # unnamed Ifs would share one entry (and count one If's branch for all of them)
    names = Names(g)
    for index, node in ifs:
        if not node.name:
            node.name = names.fresh(f"If_{index}")
    inits = {i.name: i for i in g.initializer}
    vis = {v.name: v for v in (*g.input, *g.value_info, *g.output)}
    wanted = sorted({n for _, node in ifs for n in captured_all(node)} - set(inits))
    probed = probe(model, wanted, feeds)
    for _, node in ifs:
        taken = condition(probed.get(node.input[0]))
        if taken is not None:
            ctx.stats["if_taken"][node.name] = taken
    named = frontend.planned_dims(model, frontend.BRANCH_DIMS_KEY)
    own = ctx.stats.get("placement", {}).get("baselines")  # the main graph's, if placed by cost
    own = dict(own) if own is not None else None  # the branches' stats merge into the dict
    added: list = []  # the baselines of the branches a run takes
    for index, node in ifs:
        seen = ctx.stats["if_taken"].get(node.name)
        for attr in node.attribute:
            if attr.type != onnx.AttributeProto.GRAPH:
                continue
            runs = seen is None or seen == (attr.name == "then_branch")  # cinm.if_branches' rule
            tag = "t" if attr.name == "then_branch" else "e"
            scope = branch_scope(ctx.scope, index, attr.name)
            record = {"node": node.name, "branch": attr.name, "compiled": False, "cinm": 0,
                      "nodes": len(attr.g.node), "why": None}
            ctx.stats["if_bodies"].append(record)
            base = _UNSAFE.sub("_", f"{node.name or 'If'}_{tag}").strip("_")
            sub, planned, why = _branch_model(model, attr.g, inits, vis, probed, dims, base)
            if sub is None:
                record["why"] = why
                if own is not None and runs:
                    added.append(_priced_as_is(model, attr.g, ctx))
                continue
            sub_ctx = PassContext(options=ctx.options, scope=scope,
                                  log=lambda m, label=f"{node.name}/{attr.name}": ctx.log(f"{label}: {m}"))
            pm = PassManager(pipeline=list(BODY_PIPELINE),
                             skip=[s for s in skip if s in BODY_PIPELINE], stop_after=stop_after)
            sub = pm.run(sub, sub_ctx)
            sub_feeds = {i.name: probed[i.name] for i in sub.graph.input if i.name in probed}
            if len(sub_feeds) < len(sub.graph.input):
                sub_feeds = None
            sub = compile_if_bodies(sub, sub_ctx, skip=skip, stop_after=stop_after, feeds=sub_feeds)
            # hints naming a source op type reach the branch's ops in a later run of the passes
            # (the sweep's, :func:`onnx_cinm.passes.branches.lower_branches`)
            ctx.source_ops.update(sub_ctx.source_ops)
            if own is not None and runs:  # its own baselines include its counted nested branches
                added.append(sub_ctx.stats.get("placement", {}).get("baselines")
                             or _priced_as_is(model, attr.g, ctx))
            n_cinm = sum(1 for n in cinm.all_nodes(sub.graph) if n.domain == cinm.DOMAIN)
            kept = sub_ctx.stats.get("to_cinm", {}).get("kept")
            if kept:  # what stayed on the host is true of the original branch as well
                merge_stats(ctx.stats.setdefault("to_cinm", {}), {"kept": kept})
            if not n_cinm:
                record["why"] = "nothing to lower"
                continue
            if [o.name for o in sub.graph.output] != [o.name for o in attr.g.output]:
                record["why"] = "the passes renamed its outputs"
                continue
            body, sized = _merged_body(model, node, attr.g, sub, inits, base,
                                       {*dims, *named, *planned,
                                        *frontend.planned_dims(sub, frontend.BRANCH_DIMS_KEY)})
            attr.g.CopyFrom(body)
            named.update({k: v for k, v in planned.items() if k not in dims})
            named.update(frontend.planned_dims(sub, frontend.BRANCH_DIMS_KEY))
            named.update(sized)
            record.update(compiled=True, cinm=n_cinm, nodes=len(body.node))
            stats = {k: v for k, v in sub_ctx.stats.items() if k != "to_cinm"}
            stats["to_cinm"] = {"lowered": sub_ctx.stats.get("to_cinm", {}).get("lowered", Counter())}
            merge_stats(ctx.stats, stats)
            ctx.log(f"{node.name}/{attr.name}: compiled, {n_cinm} cinm ops")
    frontend.set_planned_dims(model, named, frontend.BRANCH_DIMS_KEY)
    if own is not None:
        ctx.stats["placement"]["baselines"] = add_baselines(own, added)
    return model


def _priced_as_is(model: onnx.ModelProto, body: onnx.GraphProto, ctx: PassContext) -> dict:
    """The baselines of a branch the passes did not place (its captured values untyped): its
    nodes on the host as they are, priced as :func:`.branches.evaluate_graphs` prices it in
    the plan's totals (its nested Ifs with both branches: no probe saw them)."""
    from .branches import _evaluate, counted_totals
    from .cost_placement import Totals

    sub = branch_model(model, body)
    root = _evaluate(sub, ctx.options, tensor_infos(model), {}, {}, "", "", True)
    tot = counted_totals(root)
    as_is = Totals(**{k: tot[k] for k in SUMMED})
    return {"all-host": as_is, "heuristic": as_is}


def add_baselines(own: dict, added: list[dict]) -> dict:
    """The baselines of a graph with If nodes (``{name: Totals}``, see
    :func:`.cost_placement.baselines`): ``own``, the graph's alone, plus those of each branch
    that runs per inference (``added``; each a branch's, its nested branches included), as the
    plan's totals count the branches (:func:`.branches.counted_totals`): the figures of
    :data:`.branches.SUMMED` add up. A baseline some branch lacks (its heuristic's devices could
    not price its ops) is left out: no figure of it covers the whole model."""
    from .cost_placement import Totals

    out = {}
    for name, t in own.items():
        parts = [t] + [b.get(name) for b in added]
        if any(p is None for p in parts):
            continue
        out[name] = Totals(**{k: sum(getattr(p, k) for p in parts) for k in SUMMED})
    return out


def captured_all(node: onnx.NodeProto) -> set[str]:
    """The condition of If ``node`` and every outer value its branches capture."""
    out = {node.input[0]}
    for sub in frontend.subgraphs(node):
        out |= captured(sub)
    return out


def _merged_body(model, node, original, sub, inits, base: str,
                 taken: set[str]) -> tuple[onnx.GraphProto, dict[str, int]]:
    """The compiled branch model ``sub`` as the body of ``node``: outer initializers it
    captured dropped again, its value_info (symbolic), names the rest of the model uses
    renamed; and the planned sizes of the dims its value_info names (:func:`_value_info`:
    ``base``, ``taken``)."""
    body = onnx.GraphProto(name=original.name)
    body.node.extend(sub.graph.node)
    body.initializer.extend(t for t in sub.graph.initializer
                            if t.name not in inits or t.dims != inits[t.name].dims
                            or t.data_type != inits[t.name].data_type)
    body.output.extend(original.output)
    value_info, sized = _value_info(sub, base, taken)
    body.value_info.extend(value_info)
    outside = _all_names(model.graph, skip=node)
    new = _defined(body) - _defined(original)
    clash = sorted(new & outside)
    if clash:
        names = Names(model.graph)
        names.reserve(_defined(body))
        _rename(body, {n: names.fresh(n) for n in clash})
    return body, sized
