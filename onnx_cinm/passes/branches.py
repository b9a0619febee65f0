"""The graphs of a model's If branches, as the cost model, the sweep and the devices see them.

One branch of an If runs per inference. Everything that counts per inference (the report's
totals, the sweep's rows, optimize's device tables) follows one rule: the branch the planning
probe saw taken (:func:`onnx_cinm.frontend.if_taken`) counts, the other does not; an If whose
branch the probe did not see counts both, and the totals are an upper bound then. What a
device keeps programmed does not follow that rule: the kernels of both branches are loaded
(the provider loads every kernel of the model), so their resident tiles share the chip with
the main graph's.

- :func:`evaluate_graphs` prices the main graph and every branch (nested Ifs alike) with the
  cost model (:func:`.cost_placement.evaluate_model`), each branch as a graph of its own
  (:func:`branch_model`), and :func:`counted_totals` adds them up by the rule above, checking
  the crossbars kept by all graphs together against each device's;
- :func:`lower_branches` runs node-annotating passes (placement, the paradigm and device
  passes) on every branch of a model whose branches are already at the cinm level (the sweep,
  which brings a model to that level once and places it per configuration);
- :func:`lower_together` plans again, in one batch per device, the nodes of every graph on a
  device that plans its nodes together (:attr:`Device.plans_together`, the crossbars): each
  branch was planned as if it had the whole device, the batch shares it among all of them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import onnx

from .. import devices
from ..analysis import op_info, tensor_infos
from ..dialects import cinm
from . import PassContext, PassManager
from .graph_names import captured

BRANCHES = ("then_branch", "else_branch")


def branch_scope(scope: str, index: int, branch: str) -> str:
    """The kernel-stem prefix of the nodes of branch ``branch`` (``then_branch``/``else_branch``)
    of the If at ``index`` in a graph whose own prefix is ``scope``: ``if0012t_`` for the
    then-branch of the main graph's node 12 (:attr:`PassContext.scope`)."""
    return f"{scope}if{index:04d}{'t' if branch == 'then_branch' else 'e'}_"


def branch_model(outer: onnx.ModelProto, body: onnx.GraphProto, *, weights: bool = False,
                 input_type=None, inits: dict | None = None,
                 name: str | None = None) -> onnx.ModelProto | None:
    """If branch ``body`` of ``outer``'s main graph as a model of its own: its nodes (copies),
    outputs and initializers, every value of ``outer`` it captures an initializer of its own
    if it is one of ``outer``'s (a programmed weight crosses nothing per inference, a Slice
    bound stays foldable), else an input, in name order. The one builder of the cost model,
    the branch compiler (:mod:`.control_flow`) and the provider's If kernel.

    Args:
        outer: the model whose main graph holds the If.
        body: the branch (``then_branch``/``else_branch`` graph of one of its Ifs).
        weights: False (to price or annotate: the tensor infos come from the whole model,
            nested branches alike): initializers without their bytes, ``outer``'s
            ``metadata_props`` (its planned dims). True (to compile or run): initializers with
            their bytes, ``outer``'s model-local functions.
        input_type: ``name -> ValueInfoProto | None``, the input declaring captured value
            ``name``; None gives no branch model (its type is not known). Default: an input
            without a type.
        inits: ``outer``'s initializers by name, if the caller has them.
        name: the graph's name (default the body's).

    Returns the model, or None when ``input_type`` declined a captured value.
    """
    inits = inits if inits is not None else {t.name: t for t in outer.graph.initializer}
    g = onnx.GraphProto(name=body.name if name is None else name)
    g.node.extend(body.node)
    g.output.extend(body.output)
    consts = []
    for n in sorted(captured(body)):
        if n in inits:
            consts.append(inits[n])
            continue
        vi = input_type(n) if input_type is not None else onnx.ValueInfoProto(name=n)
        if vi is None:
            return None
        g.input.append(vi)
    for t in (*body.initializer, *consts):
        if weights:
            g.initializer.append(t)
        else:
            g.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    m = onnx.ModelProto(ir_version=outer.ir_version, opset_import=outer.opset_import, graph=g)
    if weights:
        m.functions.extend(outer.functions)
    else:
        m.metadata_props.extend(outer.metadata_props)
    return m


def _ifs(graph: onnx.GraphProto):
    """``(index, node, {branch name: body})`` of every standard If of ``graph``."""
    for i, node in enumerate(graph.node):
        if cinm.is_if(node):
            yield i, node, {a.name: a.g for a in node.attribute}


# ---------------------------------------------------------------------------------------------
# Pricing
# ---------------------------------------------------------------------------------------------

@dataclass
class GraphCost:
    """The cost model's view of one graph of a model (the main graph or an If branch).

    Attributes:
        label: the branch path before its nodes' names (``""``, ``pick[then] ``,
            :func:`onnx_cinm.dialects.cinm.branch_label`).
        prefix: the branch path before its nodes' indices (``""``, ``0t``, ``1t0e``).
        totals: :class:`.cost_placement.Totals` of the graph alone, per run of it.
        violations: the constraints it breaks alone, each after ``label``.
        problem: the :class:`.cost_placement.Problem` it was priced as (``problem.assign``
            the recorded placement).
        counted: whether a run of the model runs it (False: the other branch of an If whose
            branch the planning probe saw taken, or inside such a branch).
        branches: ``{node index: [then GraphCost, else GraphCost]}`` of its Ifs.
    """

    label: str
    prefix: str
    totals: object
    violations: list
    problem: object
    counted: bool
    branches: dict = field(default_factory=dict)

    def walk(self):
        """This graph, then its Ifs' branches in node order (then before else), recursively."""
        yield self
        for i in sorted(self.branches):
            for b in self.branches[i]:
                yield from b.walk()


def evaluate_graphs(model: onnx.ModelProto, options: dict | None = None,
                    infos: dict | None = None) -> tuple[GraphCost, dict]:
    """The main graph of ``model`` and its If branches (nested alike) priced by the cost model
    (:func:`.cost_placement.evaluate_model` of the recorded placement; a branch as a graph of
    its own, :func:`branch_model`, whose captured values arrive from the host, as the provider
    runs it), as a tree of :class:`GraphCost`, and ``ifs``: the Ifs of counted graphs,
    ``{"taken": counted by the branch the probe saw, "both": counted with both}``.

    ``infos``: the whole model's tensor infos (:func:`onnx_cinm.analysis.tensor_infos`),
    computed if not given. Raises CinmError on a malformed If-branch record
    (:func:`onnx_cinm.frontend.if_taken`)."""
    from .. import frontend

    taken = frontend.if_taken(model)
    ifs = {"taken": 0, "both": 0}
    infos = infos if infos is not None else tensor_infos(model)
    return _evaluate(model, options, infos, taken, ifs, "", "", True), ifs


def _evaluate(model, options, infos, taken, ifs, label, prefix, counted) -> GraphCost:
    from .cost_placement import evaluate_model

    tot, bad, prob = evaluate_model(model, options, infos=infos)
    out = GraphCost(label, prefix, tot, [f"{label}{v}" for v in bad], prob, counted)
    for i, node, _ in _ifs(model.graph):
        name = node.name or f"{node.op_type}_{i}"
        out.branches[i] = [
            _evaluate(branch_model(model, body), options, infos, taken, ifs,
                      label + cinm.branch_label(name, b), f"{prefix}{i}{b[0]}", runs)
            for b, body, runs in cinm.if_branches(node, taken, counted, ifs)]
    return out


#: The per-inference figures :func:`counted_totals` adds up over the counted graphs.
SUMMED = ("latency_s", "energy_j", "writes", "transfer_bytes", "transfer_s", "transfer_j")


def counted_totals(root: GraphCost) -> dict:
    """The per-inference totals of the graphs of ``root`` (:func:`evaluate_graphs`): the
    figures of :data:`SUMMED` (seconds, joules, tile writes, bytes) over the counted graphs,
    and ``violations``: those of every graph, then the load-time ones of the model as a whole.
    A device's kept crossbar tiles (:attr:`.cost_placement.Totals.kept_tiles`) add up over
    every graph, counted or not (both branches' kernels are loaded), and must fit its
    crossbars: ``"memristor: 5 tiles kept programmed by the main graph and its If branches > 4
    crossbars"``. (One graph's own excess is already among its violations.)"""
    graphs = list(root.walk())
    out = {k: sum(getattr(g.totals, k) for g in graphs if g.counted) for k in SUMMED}
    bad = [v for g in graphs for v in g.violations]
    if len(graphs) > 1 and root.problem.constraints.crossbar_residency:
        kept: Counter = Counter()
        cap: dict = {}
        for g in graphs:
            kept.update(g.totals.kept_tiles)
            cap.update(g.totals.capacity)
        for dev, n in kept.items():
            alone = any(g.totals.kept_tiles.get(dev, 0) > g.totals.capacity.get(dev, 0)
                        for g in graphs)  # said by that graph's own violation
            if cap.get(dev) and n > cap[dev] and not alone:
                bad.append(f"{dev}: {n} tiles kept programmed by the main graph and its If "
                           f"branches > {cap[dev]} crossbars")
    out["violations"] = bad
    return out


def counted_by_device(root: GraphCost) -> dict:
    """Where the per-inference totals of :func:`counted_totals` go: ``{device: [seconds,
    joules]}`` of the ops' own costs over the counted graphs, and ``"transfers"``: the
    transfers the cost model charges (:func:`.cost_placement.node_costs`); summed, they give
    the totals' latency and energy. Devices in the order their first op appears."""
    from .cost_placement import node_costs

    out: dict = {}
    moved = [0.0, 0.0]
    for g in root.walk():
        if g.counted:
            for nc in node_costs(g.problem, g.problem.assign):
                s = out.setdefault(nc.device, [0.0, 0.0])
                s[0] += float(nc.cost.latency_s)
                s[1] += float(nc.cost.energy_j)
                moved[0] += nc.transfer_s
                moved[1] += nc.transfer_j
    if moved[0] or moved[1]:
        out["transfers"] = moved
    return out


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------

def merge_stats(into: dict, add: dict) -> None:
    """Add the pass statistics ``add`` (a branch's) to ``into`` (its model's), in place:
    Counters, lists, numbers add up, dicts merge recursively, anything else is kept from
    ``into`` (set from ``add`` if missing)."""
    for k, v in add.items():
        have = into.get(k)
        if have is None:
            into[k] = v
        elif isinstance(have, Counter) and isinstance(v, Counter):
            have.update(v)
        elif isinstance(have, list) and isinstance(v, list):
            have.extend(v)
        elif isinstance(have, dict) and isinstance(v, dict):
            merge_stats(have, v)
        elif isinstance(have, (int, float)) and isinstance(v, (int, float)) and \
                not isinstance(have, bool):
            into[k] = have + v


def lower_branches(model: onnx.ModelProto, ctx: PassContext, pipeline: list[str],
                   infos: dict | None = None) -> int:
    """Run ``pipeline`` (the passes from placement on: placement, ``fold_layouts``,
    ``cim_tiling``, ...; they annotate nodes, fold some away, add no initializer) on every If
    branch of ``model``, nested ones too, in place (the branch's nodes become the rewritten
    ones): each branch as a model of its own (:func:`branch_model`) with the whole model's
    tensor infos (``infos``, else computed), its kernel stems prefixed by its path
    (:func:`branch_scope`), its statistics added to ``ctx.stats``. The branches must already be
    at the cinm level (``optimize(stop_after="cinm")`` compiles them so). Returns the number of
    branches annotated. Raises CinmError as the passes do."""
    if not any(True for _ in _ifs(model.graph)):
        return 0
    infos = infos if infos is not None else tensor_infos(model)
    return _lower_branches(model, ctx, pipeline, infos)


def _lower_branches(model, ctx, pipeline, infos) -> int:
    n = 0
    for i, _, bodies in _ifs(model.graph):
        for b in BRANCHES:
            body = bodies[b]
            sub = branch_model(model, body)
            sub_ctx = PassContext(options=ctx.options, scope=branch_scope(ctx.scope, i, b),
                                  log=ctx.log, infos=infos, source_ops=ctx.source_ops)
            sub = PassManager(pipeline=list(pipeline)).run(sub, sub_ctx)
            n += 1 + _lower_branches(sub, sub_ctx, pipeline, infos)
            # the passes annotate nodes, and some remove or replace them (fold_layouts folds a
            # Transpose into its Gemm): the branch takes the rewritten nodes as they are
            del body.node[:]
            body.node.extend(sub.graph.node)
            made = {o for node in body.node for o in node.output}
            kept = [v for v in body.value_info if v.name in made]
            if len(kept) < len(body.value_info):
                del body.value_info[:]
                body.value_info.extend(kept)
            merge_stats(ctx.stats, sub_ctx.stats)
    return n


def _device_nodes(graph: onnx.GraphProto, scope: str, taken: dict, depth: int = 0,
                  counted: bool = True):
    """``(node, its graph's kernel-stem prefix, its index there, branch depth, counted)`` of
    every cinm node of ``graph`` and its If branches, in execution order (an If's branches
    after it); ``counted`` as :func:`onnx_cinm.dialects.cinm.if_branches` says."""
    for i, node in enumerate(graph.node):
        if node.domain == cinm.DOMAIN:
            yield node, scope, i, depth, counted
        if cinm.is_if(node):
            for b, body, runs in cinm.if_branches(node, taken, counted):
                yield from _device_nodes(body, branch_scope(scope, i, b), taken, depth + 1, runs)


def lower_together(model: onnx.ModelProto, ctx: PassContext, paradigm_only: bool = False,
                   infos: dict | None = None) -> dict:
    """Plan again, in place, the nodes of every device that plans its nodes together
    (:attr:`Device.plans_together`: the crossbars all kernels of a chip share) over the whole
    model: the main graph's and every If branch's, one batch per device in execution order,
    so the device shares its resources among all of them (the If-branch kernels are loaded
    with the main graph's, and each branch was planned alone as if the chip were its own).
    The nodes of a branch the planning probe did not see taken (the model's record,
    :func:`onnx_cinm.frontend.if_taken`) go with ``per_inference`` False in their options
    (:meth:`Device.lower`): they are loaded, but the nodes that run come first.
    ``paradigm_only``: the paradigm-level plans (:meth:`Device.lower_paradigm`, a model
    stopped at ``--stop-after paradigm``), else the whole ones (:meth:`Device.lower`).

    ``infos``: the whole model's tensor infos, computed if not given. Devices without a node
    inside a branch keep their plans. Kernel stems are the ones the
    passes give (:func:`.device_lowering.kernel_stem` after the branch path). Returns ``{device:
    nodes planned again}``. Raises CinmError as :meth:`Device.lower` does."""
    from .. import frontend
    from .device_lowering import _set, kernel_stem

    by_dev: dict = {}
    inside: set = set()
    for node, scope, i, depth, counted in _device_nodes(model.graph, ctx.scope,
                                                        frontend.if_taken(model)):
        dev_name = cinm.node_attrs(node).get("device")
        if dev_name is None or dev_name not in devices.device_names():
            continue
        dev = devices.get_device(dev_name)
        if not dev.plans_together:
            continue
        by_dev.setdefault(dev_name, []).append((node, scope, i, counted))
        if depth:
            inside.add(dev_name)
    if not inside:
        return {}
    infos = infos if infos is not None else tensor_infos(model)
    out = {}
    for dev_name in sorted(inside):
        dev = devices.get_device(dev_name)
        items = by_dev[dev_name]
        batch = [(op_info(node, infos),
                  dict(ctx.options, kernel_stem=scope + kernel_stem(node.name or node.op_type, i),
                       per_inference=counted))
                 for node, scope, i, counted in items]
        plans = (dev.lower_paradigm if paradigm_only else dev.lower)(batch)
        for (node, *_), plan in zip(items, plans):
            _set(node, plan, dev)
        out[dev_name] = len(items)
    return out
