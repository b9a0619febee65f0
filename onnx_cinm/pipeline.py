"""``optimize()``: the whole compiler as one call, and the summary a person reads afterwards."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from . import devices, frontend, golden, hostmodel
from .analysis import body_flops, node_flops, op_info, open_tensors, tensor_infos
from .devices.base import accepts_keyword
from .dialects import cinm
from .errors import CheckFailed, CinmError, ReferenceFailed
from .options import unknown_key
from .passes import PassContext, PassManager, check_options
from .text import if_rule, si


@dataclass
class OptimizeResult:
    """What :func:`optimize` produced.

    Attributes:
        model: the optimized model (not yet written anywhere).
        nodes_before, nodes_after: node counts of the main graph.
        cinm_by_device: cinm ops per device name (``"unplaced"`` before the placement pass).
        flops_total: FLOPs of one inference of the optimized model, at ``dims``.
        flops_on_devices: the part of ``flops_total`` in cinm ops placed on a non-host device.
        timings: ``(pass or step name, seconds)`` per pass run and per step around the
            passes (:data:`STEPS`: loading, the probe, shape inference, totals, the checks, the
            summary's figures; the command line adds ``save`` and ``report``).
        wall_s: wall time of the whole :func:`optimize` call, seconds (the command line sets
            it to its own, from the command's start to the summary); what
            ``timings`` leave out of it the summary shows as ``other``.
        counted: False when ``optimize(totals=False)`` left the summary's figures out
            (FLOPs, cinm ops per device, placements, anonymous dims): :meth:`summary` then
            says so instead of printing zeros.
        startup_s: seconds before the command's start, from the process's (the console
            script on Linux) or :func:`onnx_cinm.cli.main`'s entry: the interpreter, the
            imports, the argument parser; the command line sets it, None from Python. The
            ``wall:`` line's whole is ``startup_s + wall_s``.
        check: the golden-check report, or None when the check was off (``check=0``) or
            could not run (see ``check_skipped``).
        check_skipped: why the check did not run, or None (it ran, or ``check=0``).
        stats: per-pass statistics (see each pass); ``probed_shapes``: how many tensors'
            shapes the probe run sized (absent: no probe ran or it sized nothing);
            ``reoptimized``: True when the model given was itself written by
            :func:`optimize` (it records a source digest): its cinm ops are placed anew and
            the check compares against it, not against the model it came from;
            ``option_warnings``: the devices' one-line warnings on options that change
            nothing (:meth:`onnx_cinm.devices.base.Device.option_warnings`);
            ``lowered_together``: ``{device: nodes}``
            planned again over all graphs once the If branches were compiled
            (:func:`onnx_cinm.passes.branches.lower_together`); with cost or heuristic
            placement, ``placement["model_totals"]`` (unless ``optimize(totals=False)``): the written
            model's per-inference totals (seconds,
            joules, tile writes, ...: :func:`onnx_cinm.passes.branches.counted_totals`; and
            ``by_device``, :func:`onnx_cinm.passes.branches.counted_by_device`), the
            figures ``onnx-cinm report`` adds up (``placement["totals"]`` are the search's, before
            the passes after placement, such as ``fold_layouts``, rewrote the graph).
        placements: ``(node name, op type, device, reason)`` per cinm op.
        check_special: the NaN/Inf check's report (one input set with NaN, +Inf, -Inf in every
            float input, run after the ordinary check passed), or None (no float input, the
            original cannot run on such inputs, or no check).
        special_skipped: why the NaN/Inf check did not run although the ordinary check did
            (the model's recurrent ops were lowered, or the original cannot run on such
            inputs), or None.
        dims: the sizes of symbolic dimensions everything was planned and counted at
            (recorded in the model, see :func:`onnx_cinm.frontend.planned_dims`).
        unsized_dims: symbolic dimensions of the inputs with no size, taken as 1.
        anonymous_dims: ``{dim: tensor}`` dims of the main graph's tensors that neither shape
            inference nor the probe run at ``dims`` could size (anonymous ``unk__N`` ones, or
            exporter-named ones not among the inputs' dims), each with one tensor that has it;
            taken as 1.
        host_flops: FLOPs left on the host per op type (the ops of the counted If branch
            under their own type, Loop and Scan bodies under their Loop/Scan node).
        flops_exact: False when ``flops_total`` is a lower bound or an estimate (a Loop
            trip count, or an If branch neither the probe saw nor equal to the other).
        fixed_dims: ``{dim: [device nodes]}``, the symbolic input dims the compiled plans fix
            at their planned size (:func:`fixed_dims`): the model runs only at those sizes.
        branches_from: which inputs chose the counted If branches (``"the check's first
            input set"``, ``"random inputs at the planned sizes"``), or None: no If, or none
            seen (each If then counts its larger branch).
        origins: ``to_cinm``'s record of the nodes it lowered (:mod:`onnx_cinm.passes.origins`)
            when the pipeline stopped before ``restore_host_ops`` used it (``stop_after``),
            else empty: what a later run of the passes from ``placement`` on needs to put
            lowered nodes back (:func:`onnx_cinm.sweep.evaluate`).
        source_ops: ``{cinm node name: op type of the node to_cinm lowered it from}``
            (:attr:`onnx_cinm.passes.PassContext.source_ops`): what placement hints naming an
            ONNX op type (``MatMul=upmem``) match in a later run of the passes.
        shaped_dims: ``{dim: size}``, the input model's symbolic dims that ``input_shapes``
            (``--overwrite-input-shape``) fixed, by their names there: planned at those sizes
            as ``dims`` are, though the compiled model no longer names them.
        shaped_note: :func:`onnx_cinm.frontend.batch_note` of the input model at
            ``shaped_dims`` and ``dims`` ('' without ``input_shapes``): what one inference is.
    """

    model: onnx.ModelProto
    nodes_before: int
    nodes_after: int
    cinm_by_device: Counter
    flops_total: int
    flops_on_devices: int
    timings: list
    check: object | None
    stats: dict = field(default_factory=dict)
    placements: list = field(default_factory=list)
    check_skipped: str | None = None
    check_special: object | None = None
    dims: dict = field(default_factory=dict)
    unsized_dims: list = field(default_factory=list)
    host_flops: Counter = field(default_factory=Counter)
    flops_exact: bool = True
    anonymous_dims: dict = field(default_factory=dict)
    special_skipped: str | None = None
    branches_from: str | None = None
    fixed_dims: dict = field(default_factory=dict)
    origins: list = field(default_factory=list)
    source_ops: dict = field(default_factory=dict)
    wall_s: float | None = None
    startup_s: float | None = None
    counted: bool = True
    shaped_dims: dict = field(default_factory=dict)
    shaped_note: str = ""

    @property
    def device_flops_share(self) -> float:
        """Fraction of the FLOPs in cinm ops on a memory-centric device (0..1)."""
        return self.flops_on_devices / self.flops_total if self.flops_total else 0.0

    def summary(self) -> str:
        """A few lines for a person: nodes, devices, FLOPs share, check, pass times."""
        n_cinm = sum(self.cinm_by_device.values())
        per_dev = ", ".join(f"{d} {n}" for d, n in sorted(self.cinm_by_device.items())) or "none"
        none = not n_cinm and not any(n.domain == cinm.DOMAIN for n in cinm.all_nodes(self.model.graph))
        if not self.counted:  # optimize(totals=False): no zeros that read as figures
            lines = [f"nodes: {self.nodes_before} -> {self.nodes_after}",
                     "cinm ops per device, FLOPs: not counted (optimize(totals=False))"]
            if self.fixed_dims:
                lines.append(fixed_dims_text(self.fixed_dims, {**{d: 1 for d in self.unsized_dims},
                                                               **self.dims}))
        else:
            lines = self._figure_lines(n_cinm, per_dev, none)
        return self._summary_rest(lines)

    def _figure_lines(self, n_cinm: int, per_dev: str, none: bool) -> list[str]:
        """The summary's lines of the counted figures: cinm ops per device, FLOPs, the dims
        left unsized or fixed by the plans, the host's FLOPs by op type."""
        lines = [
            f"nodes: {self.nodes_before} -> {self.nodes_after} ({n_cinm} cinm ops)",
            f"cinm ops per device: {per_dev}",
            "FLOPs on devices: "
            + (f"none of {si(self.flops_total, 'FLOP')}" if none else
               f"{100 * self.device_flops_share:.1f}% of {si(self.flops_total, 'FLOP')}")
            + ("" if self.flops_exact else " (estimate: control flow known only at run time)")
            + (f" (If branches: those {self.branches_from} take)" if self.flops_exact
               and self.branches_from else "")
            + _sizes_note({**self.shaped_dims, **self.dims}, self.unsized_dims)
            + (f"; {_no_device_ops(self.model)}" if none else self._modeled_share()),
        ]
        batch = self.shaped_note or frontend.batch_note(self.model, self.dims)
        if batch:
            lines.append(batch)
        if self.anonymous_dims:
            shown = ", ".join(f"{d} (of '{t}')" for d, t in list(self.anonymous_dims.items())[:4])
            more = f" and {len(self.anonymous_dims) - 4} more" if len(self.anonymous_dims) > 4 else ""
            if self.unsized_dims:
                what = "dims left unsized (taken as 1; most follow from the unsized inputs' dims)"
                why = ("size the inputs' dims (--dim NAME=SIZE, --input NAME=FILE.npy) and one "
                       "onnxruntime run at those sizes gives the rest their sizes")
            else:
                what = "dims shape inference could not size (taken as 1)"
                why = ("a run at the planned sizes does not size them: they depend on the data, "
                       "or onnxruntime could not run the model")
            lines.append(f"{what}: {shown}{more}")
            lines.append(f"  FLOPs and plans count these dims as 1 ({why}); to plan at real "
                         "sizes, fix the input shapes with --overwrite-input-shape NAME:d0,d1,...")
        if self.fixed_dims:
            lines.append(fixed_dims_text(self.fixed_dims, {**{d: 1 for d in self.unsized_dims},
                                                           **self.dims}))
        host = [(op, f) for op, f in self.host_flops.most_common() if f > 0]
        if host and self.flops_total:
            shown = ", ".join(f"{op} {100 * f / self.flops_total:.1f}%" for op, f in host[:6])
            more = f" and {len(host) - 6} more op types" if len(host) > 6 else ""
            lines.append(f"FLOPs on host by op type: {shown}{more}")
        return lines

    def _modeled_share(self) -> str:
        """``; modeled on devices: 0.13% of the energy, 13% of the time``: the devices' part of
        cost placement's totals for the written model (transfers apart), beside the FLOPs
        share, which alone can read as the work's share (trial s36: 'FLOPs on devices: 97.6%'
        where the host spent 99.5% of the modeled energy on Im2Cols); '' without the
        totals."""
        totals = self.stats.get("placement", {}).get("model_totals") or {}
        by = totals.get("by_device") or {}
        devices = [v for d, v in by.items() if d not in ("host", "transfers")]
        if not devices or not totals.get("energy_j") or not totals.get("latency_s"):
            return ""
        e = 100 * sum(v[1] for v in devices) / totals["energy_j"]
        t = 100 * sum(v[0] for v in devices) / totals["latency_s"]
        return f"; modeled on devices: {e:.2g}% of the energy, {t:.2g}% of the time"

    def _summary_rest(self, lines: list[str]) -> str:
        """The summary from the control-flow lines on, after ``lines``."""
        flow, made = _control_flow(self.model)
        from .passes.recurrent import DYNAMIC

        for why in sorted({w for _, w in made}, key=lambda w: w != DYNAMIC):
            ops = ", ".join(f"{op} x{n}" for (op, w), n in sorted(made.items()) if w == why)
            if why == DYNAMIC:
                lines.append(f"recurrences of a dynamic length: {ops}; their input projections "
                             "are cinm ops, their steps run in a Scan on the host (sized with "
                             "--dim, the steps are unrolled into cinm ops too)")
            else:  # sized, but too long to unroll: a fixed limit, no option raises it
                lines.append(f"recurrences {ops}: {why}: steps run in a Scan on the host (a "
                             "fixed limit); their input projections are cinm ops")
        if flow:
            lines.append(f"control flow: {flow}")
        kept = self.stats.get("to_cinm", {}).get("kept", {})
        if kept:
            lowered = self.stats.get("to_cinm", {}).get("lowered", {})

            def share(op):  # an op type none of whose nodes was lowered: its host FLOPs are theirs
                f = self.host_flops.get(op, 0) if not lowered.get(op) else 0
                return f", {100 * f / self.flops_total:.1f}% of FLOPs" if self.flops_total and \
                    f >= 0.0005 * self.flops_total else ""
            reasons = "; ".join(f"{op} x{sum(c.values())}{share(op)} ({', '.join(c)})"
                                for op, c in sorted(kept.items()))
            lines.append(f"left on host: {reasons}")
        if self.check is not None:  # which engine computed each side (compare runs the kernels)
            lines.append(self.check.summary() + f" ({CHECK_ENGINES})")
            if self.check_special is not None:
                lines.append("NaN/Inf " + self.check_special.summary())
            elif self.special_skipped:
                lines.append(f"NaN/Inf check: skipped ({self.special_skipped})")
        else:
            lines.append(f"check: skipped ({self.check_skipped or '--check 0'})")
        lines.append("passes: " + ", ".join(f"{n} {t:.2f} s" for n, t in self.timings))
        if self.wall_s is not None:
            lines.append(wall_text(self.timings, self.wall_s, self.startup_s))
        roof = self.stats.get("host_roofline")
        if roof is not None:
            lines.append(f"host roofline: {roof.text()}")
        return "\n".join(lines)

    def device_tables(self, fold: bool = True) -> str:
        """Each device's table of the plans it made for this model (:meth:`Device.summary`,
        e.g. the crossbar kernels' tiles, writes, latency and energy), in registration order,
        each followed by its wear line and note (:meth:`Device.wear`: inferences run back to
        back at the modeled latency of the written model's totals, ``stats["placement"]
        ["model_totals"]``, else at the device's own); empty if no device has one. ``fold``: rows of one source op with the same
        figures as one row with a count (False: a row per kernel)."""
        from . import devices

        if "device_lowering" not in self.stats:  # stopped before: no plans to show
            return ""
        plans, counted, ifs, inside = device_plans(self.model)
        period = (self.stats.get("placement", {}).get("model_totals") or {}).get("latency_s")
        tables = []
        for d, p in plans.items():
            dev = devices.get_device(d)
            # a plugin's summary written before it took fold= lists every plan
            kw = {"fold": fold} if accepts_keyword(dev.summary, "fold") else {}
            if accepts_keyword(dev.summary, "ops"):
                ops = _plan_ops(self.model, {name for name, _, _ in p})
                kw["ops"] = [ops.get(name) for name, _, _ in p]
            text = dev.summary(p, counted[d], **kw)
            w = dev.wear(p, counted[d], period) if text else None
            tables.append(text + (f"\n{w.line}" + (f"\n{w.note}" if w.note else "")
                                  if w else ""))
        tables = [t for t in tables if t]
        if tables and inside:
            tables[-1] += ("\n(kernels named '<If>[then] <node>' sit in an If branch; the kernels "
                           "of both branches are loaded and share each device with the main "
                           "graph's; per-inference totals: "
                           f"{if_rule(ifs, 'its kernels count at load only')})")
        return "\n\n".join(tables)


def _plan_ops(model: onnx.ModelProto, names: set) -> dict:
    """``{node name: OpInfo}`` of the main graph's cinm nodes named in ``names`` (their
    tensors' shapes and dtypes as the written model's value_info gives them), for the device
    tables; the nodes of If branches are not among them."""
    nodes = [n for n in model.graph.node if n.domain == cinm.DOMAIN and n.name in names]
    infos = tensor_infos(model, infer=False,
                         names={t for n in nodes for t in (*n.input, *n.output) if t})
    return {n.name: op_info(n, infos) for n in nodes}


def device_plans(model: onnx.ModelProto) -> tuple[dict, dict, dict, bool]:
    """The device plans of ``model``'s lowered nodes, an If's branches' included:
    ``(plans, counted, ifs, inside)`` with ``plans`` ``{device: [(node name, op type, plan
    attrs)]}`` (a branch's node named ``<If>[then] <node>``), ``counted`` ``{device: [bool per
    plan]}`` (False: a kernel the per-inference totals leave out, :meth:`Device.summary`),
    ``ifs`` the Ifs met (as :func:`onnx_cinm.dialects.cinm.labelled_nodes` fills it) and
    ``inside`` True if a plan sits in a branch."""
    plans: dict = {}
    counted: dict = {}
    ifs: dict = {}
    inside = False
    for label, node, count in cinm.labelled_nodes(model.graph, frontend.if_taken(model), ifs):
        at = cinm.node_attrs(node) if node.domain == cinm.DOMAIN else {}
        if at.get("device", "host") != "host" and at.get("kernel"):
            plans.setdefault(at["device"], []).append((label + node.name, node.op_type, at))
            counted.setdefault(at["device"], []).append(count)
            inside = inside or bool(label)
    return plans, counted, ifs, inside


def device_loads(model: onnx.ModelProto) -> dict:
    """``{device: (kernels, seconds, joules, saving_j)}``: the one-time load before the first
    inference that the recorded plans of ``model``'s lowered nodes charge
    (:meth:`Device.recorded`'s ``load_s``/``load_j``: e.g. a DPU program and the constants kept
    in its memory), summed per device over every kernel, an If's branches' included (both are
    loaded); devices whose plans charge none are left out. Per-inference totals and cost
    placement's objective leave this load out. ``saving_j``: joules per inference the
    device's kernels spend less than the host would on the same ops (the host's roofline
    :meth:`cost` at the figures recorded in the model, :func:`onnx_cinm.hostmodel.recorded`,
    minus the plans' recorded energy; the transfers between them are left out: the table
    figures' scope), over the kernels that run per inference; None when a kernel that does
    has no known shapes (in an If branch)."""
    plans, counted, _, _ = device_plans(model)
    host = devices.get_device("host")
    options = {"host_roofline": hostmodel.recorded(model)}
    out = {}
    for d, p in plans.items():
        if d not in devices.device_names():
            continue
        dev = devices.get_device(d)
        priced = [(name, runs, dev.recorded(at)) for (name, _, at), runs in zip(p, counted[d])]
        loaded = [r for _, _, r in priced if r is not None and (r.load_s or r.load_j)]
        if not loaded:
            continue
        ops = _plan_ops(model, {name for name, _, _ in p})
        saving = 0.0
        for name, runs, r in priced:
            if runs and r is not None and saving is not None:
                op = ops.get(name)
                saving = None if op is None else \
                    saving + host.cost(op, options).energy_j - r.cost.energy_j
        out[d] = (len(loaded), sum(r.load_s for r in loaded), sum(r.load_j for r in loaded),
                  saving)
    return out


def load_text(loads: dict) -> str:
    """The summary's line of the one-time load ``loads`` (:func:`device_loads`), or "" if
    none: per device its kernels, seconds and joules and, when its kernels spend less per
    inference than the host would, after how many inferences that saving repays the load's
    joules (ceil(load J / saving J)); else that it never does."""
    if not loads:
        return ""
    parts = []
    for d, (n, s, j, saving) in loads.items():
        text = f"{d} ({n} kernel{'s' * (n != 1)}) {si(s, 's')}, {si(j, 'J')}"
        if saving is not None and saving > 0:
            k = int(np.ceil(j / saving))
            text += (f", repaid after {k} inference{'s' * (k != 1)} by the {si(saving, 'J')} "
                     "per inference its kernels spend less than the host would")
        elif saving is not None:
            text += ", never repaid: its kernels spend no less per inference than the host would"
        parts.append(text)
    return ("one-time load before the first inference: " + "; ".join(parts)
            + " (the per-inference totals and placement's objective leave the load out; the "
            "host priced by its roofline, the transfers between host and device left out)")


def device_wear(model: onnx.ModelProto, seconds_per_inference: float | None = None) -> dict:
    """``{device: Wear}`` of the devices whose plans in ``model`` wear write-limited cells
    (:meth:`Device.wear`; e.g. a crossbar chip's writes per cell per inference, its endurance
    and lifetime), inferences running back to back every ``seconds_per_inference`` seconds
    (None: each device's own modeled latency per inference, a lower bound)."""
    plans, counted, _, _ = device_plans(model)
    out = {}
    for d, p in plans.items():
        if d in devices.device_names():
            w = devices.get_device(d).wear(p, counted[d], seconds_per_inference)
            if w is not None:
                out[d] = w
    return out


#: What optimize's check runs on each side, as its summary line says.
CHECK_ENGINES = ("reference: onnxruntime on the original; candidate: onnxruntime on the "
                 "optimized model, its cinm ops as their reference bodies, not the device "
                 "kernels ('onnx-cinm compare' runs those)")


def fixed_dims(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, list[str]]:
    """The symbolic dims of ``model``'s inputs that its compiled plans fix: ``{dim: [names of
    the device nodes]}``, the nodes whose plan fixes the shape of an input that is no
    constant (:meth:`onnx_cinm.devices.Device.fixed_operands`: a kernel compiled for that
    shape alone) when that input's shape follows ``dim``. ``dims``:
    the sizes the model was planned at (``{dim: size}``; a dim taken as 1 given as 1). A dim
    is found by inferring the shapes again with it doubled: the inputs whose shape changes
    follow it; one shape inference cannot size stays unjudged. Main graph only."""
    from . import devices

    if not dims:  # no symbolic dim: none to fix (the nodes' plans are not read)
        return {}
    consts = {i.name for i in model.graph.initializer}
    known = set(devices.device_names())
    watched = []
    for n in model.graph.node:
        if n.domain != cinm.DOMAIN:
            continue
        at = cinm.node_attrs(n)
        dev = at.get("device", "host")
        if dev == "host" or dev not in known:
            continue
        for i in devices.get_device(dev).fixed_operands(n.op_type, at):
            if i < len(n.input) and n.input[i] and n.input[i] not in consts:
                watched.append((n.name, n.input[i]))
    if not watched:
        return {}
    base = tensor_infos(model, dims=dims)
    out: dict[str, list[str]] = {}
    for d, size in dims.items():
        other = tensor_infos(model, dims={**dims, d: 2 * size})
        for name, t in watched:
            a, b = base.get(t), other.get(t)
            if a is not None and b is not None and a.shape is not None and b.shape is not None \
                    and a.shape != b.shape:
                out.setdefault(d, []).append(name)
    return out


def fixed_dims_text(fixed: dict[str, list[str]], dims: dict[str, int]) -> str:
    """One line for :func:`fixed_dims`' result: which dims, at which sizes, and why."""
    def nodes(names):
        return f"'{names[0]}'" + (f" and {len(names) - 1} more" if len(names) > 1 else "")

    return ("dims fixed at the planned sizes: " + "; ".join(
        f"{d}={dims[d]} (device plans fix the shape of a non-constant operand that follows it: "
        f"{nodes(names)})" for d, names in fixed.items())
        + "; the model runs only at these sizes (optimize again at others, or keep those nodes "
          "on the host with --place NODE=host)")


def _sizes_note(dims: dict, unsized: list) -> str:
    """`` (at batch=8; symbolic dims taken as 1: seq)`` or '' for a fully static model."""
    parts = []
    if dims:
        parts.append("at " + ", ".join(f"{k}={v}" for k, v in sorted(dims.items())))
    if unsized:
        parts.append("symbolic dims taken as 1: " + ", ".join(unsized) + "; size them with "
                     f"--dim {unsized[0]}=SIZE (Python: optimize(..., dims={{'{unsized[0]}': SIZE}}))")
    return f" ({'; '.join(parts)})" if parts else ""


def wall_text(timings: list, wall_s: float, startup_s: float | None = None) -> str:
    """The summary's ``wall:`` line: ``wall_s`` split into the passes, the steps around them
    (:data:`STEPS`) and the rest (argument checks, the summary; from ``timings``, ``(name,
    seconds)``), so the figures of the ``passes:`` line add up to the wall time. With
    ``startup_s`` (seconds from the process's start to the command's first line: the
    interpreter, the imports, the argument parser) the whole is ``startup_s + wall_s`` and
    start-up is its first part."""
    steps = sum(t for n, t in timings if n in STEPS)
    passes = sum(t for n, t in timings if n not in STEPS)
    other = max(wall_s - steps - passes, 0.0)
    head = (f"wall: {wall_s:.2f} s = " if startup_s is None else
            f"wall: {startup_s + wall_s:.2f} s = start-up {startup_s:.2f} s (interpreter, "
            "imports, argument parser) + ")
    return (f"{head}passes {passes:.2f} s + steps {steps:.2f} s (imports, "
            f"load, checks, save, ...: named on the line above) + other {other:.2f} s "
            "(option and input checks)")


def _flops(model: onnx.ModelProto, taken: dict | None = None, infos: dict | None = None) -> tuple:
    """``(total, on devices, cinm ops per device, placements, host FLOPs per op type, exact,
    anonymous dims)`` (see :class:`OptimizeResult`). ``taken``: ``{If name: condition}`` for
    the Ifs whose branch is known (the probe's, :mod:`onnx_cinm.passes.control_flow`).
    ``infos``: the model's tensor infos when the caller has them (the passes' last), else
    read from the model."""
    # the model was just inferred; planned dims or probed shapes make tensor_infos infer it
    # again, bound to them (the FLOPs are counted at the planned sizes)
    if infos is None:
        infos = tensor_infos(model, infer=False)
    named = set(golden.symbolic_dims(model))
    anonymous: dict = {}
    for node in model.graph.node:
        for name in node.output[:]:
            shape = infos[name].shape if name in infos else None
            for d in shape or ():
                if isinstance(d, str) and d not in named:
                    anonymous.setdefault(d, name)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
              if len(i.dims) <= 1 and i.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
              and int(np.prod(i.dims, dtype=np.int64)) == 1}  # trip counts
    by_dev: Counter = Counter()  # cinm.ops_per_device's count, from the same reads
    placements = []
    devs = {}  # id(node) -> (node, device): each cinm op's attributes read once, not again
    for node in cinm.all_nodes(model.graph):  # by the FLOP count
        if node.domain == cinm.DOMAIN:
            dev, how = cinm.string_attrs(node, "device", "placement")
            by_dev[dev or "unplaced"] += 1
            placements.append((node.name, node.op_type, "unplaced" if dev is None else dev,
                               "" if how is None else how))
            devs[id(node)] = (node, dev)  # the node kept: its id not reused meanwhile
    total, on_dev, host, exact = _graph_flops(model.graph, infos, values, taken or {}, devs)
    return total, on_dev, by_dev, placements, host, exact, anonymous


def _graph_flops(graph: onnx.GraphProto, infos: dict, values: dict, taken: dict,
                 devs: dict | None = None) -> tuple:
    """``(total, on devices, host FLOPs per op type, exact)`` of one run of ``graph``.
    ``devs``: ``{id(node): (node, device attribute)}`` of cinm ops whose device was read
    already (protobuf hands out the same node object again while one is alive), else read
    here.

    An If counts the branch ``taken`` names, else its larger branch (then not exact unless
    both count the same); its branches' ops count as themselves (a cinm op on a device is
    device work, any other host work under its own op type). Loop and Scan bodies are host
    work under the Loop/Scan (:func:`onnx_cinm.analysis.body_flops`)."""
    total = on_dev = 0
    exact = True
    host: Counter = Counter()
    for node in graph.node:
        bodies = frontend.subgraphs(node)
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH} \
            if bodies else {}
        if node.op_type == "If" and set(branches) == {"then_branch", "else_branch"}:
            counts = {k: _graph_flops(g, infos, values, taken, devs)
                      for k, g in branches.items()}
            if node.name in taken:
                pick = counts["then_branch" if taken[node.name] else "else_branch"]
                ok = pick[3]
            else:
                pick = max(counts.values(), key=lambda c: c[0])
                ok = pick[3] and len({c[0] for c in counts.values()}) == 1
            total, on_dev, exact = total + pick[0], on_dev + pick[1], exact and ok
            host.update(pick[2])
            continue
        f = node_flops(node, infos)
        if bodies:  # (a node without: no body FLOPs, exact)
            inner, ok = body_flops(node, infos, values)
            f, exact = f + inner, exact and ok
        total += f
        if node.domain == cinm.DOMAIN:
            known = devs.get(id(node)) if devs else None
            dev = known[1] if known is not None and known[0] is node else cinm.device_of(node)
            dev = "unplaced" if dev is None else dev
        else:
            dev = "host"
        if dev in ("host", "unplaced"):
            host[node.op_type] += f
        else:
            on_dev += f
    return total, on_dev, host, exact


#: Ops besides ONNX's LSTM/GRU/RNN (:func:`onnx_cinm.frontend.is_recurrent`) that run over a
#: sequence whose length a probed size would fix (``recurrent`` unrolls a recurrence of known
#: length): a model holding one is not probed at sizes it was not given.
_SEQUENCE_OPS = {"DynamicQuantizeLSTM", "Scan", "Loop"}


def _batches_only(model: onnx.ModelProto, names: list[str]) -> bool:
    """Whether the symbolic dims ``names`` may be probed as batches: on axis 0 of ``model``'s
    real graph inputs and nowhere else, in a model with no recurrence (:func:`onnx_cinm.
    frontend.is_recurrent`) and no :data:`_SEQUENCE_OPS` (an axis 0
    may be a sequence: silero-vad's ``input [sequence_length, 576]``, whose LSTM a size would
    unroll). Planning takes an unsized dim as 1, and so does a batch's random input
    (:data:`onnx_cinm.golden.DEFAULT_FIRST_DIM`): one run of the model at 1 sizes what shape
    inference leaves open (a Pad's pads computed from ``Shape(x)``, in PyTorch's exports) as
    it is planned, and the graph's types stay symbolic. (An unsized height or width stays
    unprobed: a run at 1 is no size the model was made for, and most convolutions refuse it.)"""
    if any(frontend.is_recurrent(node) or node.op_type in _SEQUENCE_OPS
           for g in frontend.iter_graphs(model.graph) for node in g.node):
        return False
    wanted = set(names)
    for vi in golden.real_inputs(model.graph):
        if vi.type.WhichOneof("value") != "tensor_type":
            return False
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if axis and d.dim_param in wanted:
                return False
    return True


def _probe_feeds(original: onnx.ModelProto, inputs: dict | None, check: int,
                 dims: dict) -> tuple[dict | None, str]:
    """One input set for a probe run of ``original`` at the planned sizes (the check's first,
    else random inputs; None when they cannot be drawn) and what it is, for the summary."""
    feeds = _check_feeds(original, inputs, check, dims)
    label = "the given --input arrays" if feeds and inputs and len(feeds) == 1 and check \
        else "the check's first input set" if check else "random inputs at the planned sizes"
    try:
        return (feeds[0] if feeds else golden.random_inputs(original, seed=0, dims=dims)), label
    except CinmError:  # inputs random_inputs cannot draw: nothing probed
        return None, label


#: Ops whose output size depends on the values of their data, not on the input sizes: a
#: probe run would size them by one input set's data, so they (and what follows) stay open.
_SIZED_BY_DATA = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "Loop"}


def _probe_open_shapes(model: onnx.ModelProto, feeds: Callable[[], dict | None],
                       by_data_too: bool = False, ctx: PassContext | None = None,
                       assume: dict | None = None) -> dict | None:
    """Shapes of the main graph's tensors that shape inference leaves open at the planned sizes
    and that a node or graph output reads (anonymous dims, or no shape at all: a contrib op's
    outputs), from one onnxruntime run of ``model`` on ``feeds()``
    (:func:`onnx_cinm.passes.control_flow.probe`), recorded in ``model``
    (:data:`onnx_cinm.frontend.PROBED_SHAPES_KEY`) so every pass plans them at their real sizes.
    Tensors sized by the data (the outputs of :data:`_SIZED_BY_DATA` ops and what reads them)
    are left open, unless ``by_data_too`` (``feeds()`` gives the user's own arrays for every
    input: the sizes their data gives are the ones to plan at; the graph keeps its symbolic
    shapes, so the model still runs on other data: a text encoder's rows after its Unique).
    Returns the record (``{name: (element type, dims)}``), or None when nothing was open or
    onnxruntime could not run the model (then nothing is recorded: those dims count 1).
    With ``ctx``, a model below opset 13 is told open or not by the inference its opset
    conversion runs first, handed on to it in ``ctx.opset_inference``
    (:func:`onnx_cinm.passes.canonicalize.conversion_inference`): run once, not twice.
    ``assume``: the unsized batches ``feeds()`` draws at 1 (:func:`_batches_only`): a tensor
    open only in them is not open (:func:`onnx_cinm.analysis.open_tensors`)."""
    from .passes.graph_names import names_read

    def asked() -> list[str]:
        by_data: set = set()  # sizes one run's data would fix, not the planned sizes: never pinned
        names = []
        # a value nothing reads (a Dropout's mask) is planned by no pass: not worth a run of the
        # whole model (on light VGG19, 0.9 s for two unread masks)
        read = names_read(model.graph)
        for node in model.graph.node:
            if not by_data_too and (node.op_type in _SIZED_BY_DATA or
                                    by_data and any(i in by_data for i in node.input[:])):
                by_data.update(node.output[:])
                continue
            names += [o for o in node.output[:] if o in read]
        return names

    # most models have every shape sized by one inference: that alone tells (open_tensors)
    def first_inference():
        from .passes.canonicalize import conversion_inference

        ctx.opset_inference = conversion_inference(model)
        return ctx.opset_inference and ctx.opset_inference[3]

    # (asked is listed only when the first inference leaves some node output open)
    open_ = open_tensors(model, asked, first_inference if ctx is not None else None, assume)
    if not open_:
        return None
    if ctx is not None:  # the model may change here (the record): not handed on
        ctx.opset_inference = None
    # imported only for a run: it loads onnxruntime (about 40 ms), which a model with every
    # shape known and the check off never needs
    from .passes.control_flow import probe

    feed = feeds()
    values = probe(model, open_, feed) if feed is not None else {}
    shapes = {name: (onnx.helper.np_dtype_to_tensor_dtype(v.dtype), tuple(v.shape))
              for name, v in values.items() if isinstance(v, np.ndarray) and v.dtype != object}
    if not shapes:
        return None
    frontend.set_probed_shapes(model, shapes)
    return shapes


#: The steps :func:`optimize` runs around the registered passes, as the summary's ``passes:``
#: line names them (not passes: ``skip`` does not take them; ``check=0`` turns the checks off).
STEPS = {
    "imports": "load the compiler's modules (the command line's)",
    "load": "read and validate the input model (and copy it, when the check needs the original)",
    "probe_shapes": "one onnxruntime run of the original at the planned sizes, for the shapes "
                    "inference leaves open (only when every input dim has a size, or the dims "
                    "without one are batches, planned at 1, and some shapes are open)",
    "if_bodies": "compile the branches of If nodes through the same passes (only with an If)",
    "shape_inference": "infer the shapes of the rewritten model afresh (not when the passes' "
                       "last shapes are of this very graph and all static: they are kept)",
    "totals": "price the written model once more for the cost placement's totals (not with -q)",
    "check": "golden check: onnxruntime on the original and on the result, on random or "
             "given inputs (--check N; 0 = off)",
    "check_nan_inf": "the check once more with NaN, +Inf and -Inf in every float input "
                     "(after the check passed)",
    "figures": "count the FLOPs (not under -q) and the dims the plans fix, for the summary",
    "save": "write the model and its kernel files (the command line's)",
    "report": "render the --report folder's files (the command line's, with --report)",
}


def default_check_runs(model: onnx.ModelProto) -> int:
    """The check's default number of random input sets: 2 (``compare``'s default, same seeds
    0 and 1) when any graph of ``model`` has an op of
    :data:`onnx_cinm.golden.RUNTIME_QUANTIZERS`, else 1.

    A difference in the last bit before a dynamic quantization shows on some inputs only
    (trial finding 3: seed 0 passed, seed 1 was off by whole int8 steps), so one set can
    pass what ``compare`` then fails; a second set costs one more onnxruntime run of each model.
    """
    return 2 if golden.runtime_quantizers(model) else 1


def _check_unrolled(original: onnx.ModelProto, inputs: dict | None, dims: dict,
                    label: str) -> None:
    """Refuse, in one line, sizes an already optimized ``original`` cannot run at because a
    recurrence in it was unrolled for another length (:func:`frontend.check_unrolled_size`,
    the message ``run`` gives): the given arrays' sizes, then the planned ones (``--dim``).
    Otherwise the check's first onnxruntime run failed in a ``Split``, after the passes."""
    fixed = frontend.unrolled_dims(original)
    if not fixed:
        return
    for vi in golden.real_inputs(original.graph):
        if vi.name not in (inputs or {}) or not vi.type.tensor_type.HasField("shape"):
            continue
        shape = np.shape(inputs[vi.name])
        for i, d in enumerate(vi.type.tensor_type.shape.dim[:len(shape)]):
            if d.HasField("dim_param"):
                frontend.check_unrolled_size(fixed, d.dim_param, shape[i], f"input '{vi.name}'",
                                             label, original=True)
    for dim, size in dims.items():
        frontend.check_unrolled_size(fixed, dim, size, "--dim", label, original=True)


def _refuse_unrolled_conflicts(work: onnx.ModelProto, original: onnx.ModelProto,
                               inputs: dict | None, asked: dict) -> None:
    """Raise a one-line CinmError when a recurrence of ``work`` was unrolled for a size in
    ``asked`` (the ``dims`` given) that a given array (``inputs``) has at another: the array
    cannot run in the result (its ``Split`` of the steps would fail in onnxruntime, as the
    check's first run did)."""
    unrolled = frontend.unrolled_dims(work) if inputs and asked else {}
    sized = {d: s for d, s in asked.items() if d in unrolled}
    for dim, size, name, has in golden.dim_conflicts(original, inputs, sized)[:1]:
        raise CinmError(f"--dim {dim}={size} and --input '{name}' ({dim}={has}) disagree: the "
                        f"recurrence was unrolled for {dim}={size}, so the array cannot run in "
                        f"the optimized model; drop the --dim or give an array with {dim}={size}")


def _check_feeds(model: onnx.ModelProto, inputs: dict | None, n: int, dims: dict) -> list | None:
    """The check's input sets with the given ``inputs`` (None: all random)."""
    if not inputs:
        return None
    names = [vi.name for vi in golden.real_inputs(model.graph)]
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise CinmError(f"--input '{unknown[0]}' is not an input of the model (inputs: {', '.join(names)})")
    golden.check_given_inputs(model, inputs, empty_ok=False,
                              empty_hint=" (or plan without a check: --check 0)")
    if set(names) <= set(inputs):
        return [dict(inputs)]
    shapes = {k: np.shape(v) for k, v in inputs.items()}
    return [{**golden.random_inputs(model, seed=i, dims=dims, shapes=shapes), **inputs} for i in range(n)]


def _physical_memory() -> int | None:
    """This machine's physical memory in bytes (``SC_PHYS_PAGES`` x ``SC_PAGE_SIZE``), or None
    where the system does not tell (then no size is refused for its memory)."""
    import os

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return total if total > 0 else None


def _memory_shortfall(original: onnx.ModelProto, dims: dict, asked: str) -> str | None:
    """Why one onnxruntime run of ``original`` (the probe's, the check's) at ``dims`` cannot
    fit this machine's physical memory (:func:`_physical_memory`), in one line, or None when it
    may:
    the bytes of every input drawn at ``dims`` (:func:`onnx_cinm.golden.input_nbytes`) plus the
    largest single tensor shape inference sizes at ``dims`` (a lower bound: onnxruntime holds
    more than these at once). ``asked``: the sizes as the message names them. A 10^8-long
    sequence otherwise took all 23 GB of a shared machine before the kernel killed it
    (trial s24b finding 1)."""
    limit = _physical_memory()
    if limit is None:
        return None
    inputs = sum(golden.input_nbytes(original, dims).values())
    largest, name = 0, None
    if inputs <= limit:  # already too much otherwise: no inference needed to tell
        try:
            infos = tensor_infos(original, dims=dims)
        except Exception:  # noqa: BLE001 - an estimate: without inference, the inputs alone
            infos = {}
        for info in infos.values():
            if info.const or info.dtype is None or info.shape is None \
                    or not all(isinstance(d, int) and d >= 0 for d in info.shape):
                continue
            size = int(np.prod(info.shape, dtype=object)) * np.dtype(info.dtype).itemsize
            if size > largest:
                largest, name = size, info.name
    if inputs + largest > limit:
        parts = f"inputs {si(inputs, 'B')}" + (f" + tensor '{name}' {si(largest, 'B')}" if name else "")
        return (f"one onnxruntime run at {asked} needs at least {si(inputs + largest, 'B')} "
                f"of memory ({parts}), more than this machine's {si(limit, 'B')}")
    return None


def _out_of_memory(dims: dict, error: BaseException) -> str:
    """The one-line refusal of sizes onnxruntime ran out of memory at (``error``: its run
    error, a ``std::bad_alloc``): not a skip, since no input of these sizes runs here."""
    at = ", ".join(f"{k}={v}" for k, v in dims.items()) or "its input shapes"
    return (f"onnxruntime ran out of memory running the original at {at} ({error}): out of "
            "memory at these sizes; choose smaller sizes")


def _sizes_to_blame(original: onnx.ModelProto, dims: dict) -> tuple[bool, str | None]:
    """Whether the shape error the check met with some dims unsized (drawn 1 on axis 0, 8
    elsewhere) is between the sizes given (``dims``) themselves: onnxruntime runs ``original``
    once more on random inputs with every unsized named dim at each size given (at most 4
    sizes). ``(True, names)`` when every run fails with a shape error too (``names``: the
    unsized dims, "b" or "b, c"): no size of them runs (trial s24b finding 3: three batch dims
    that must be equal, two given 74 and 13). ``(False, "b=3")`` when a run succeeds: the
    draw failed, and those sizes run (the caller refuses when the model does not run with the
    unsized dims at 1 either, the size the plans take them at: :func:`_runs_at_one`).
    ``(False, None)`` when it cannot tell: a run fails
    otherwise, a dim is anonymous (no size can be given to it), or a run would not fit in memory
    (:func:`_memory_shortfall`)."""
    open_ = [d for d in golden.symbolic_dims(original) if d not in dims]
    sizes = sorted(set(dims.values()))[:4]
    if not open_ or not sizes or not golden.every_dim_sized(original, {**dims, **dict.fromkeys(open_, 1)}):
        return False, None
    for size in sizes:
        trial = {**dims, **dict.fromkeys(open_, size)}
        if _memory_shortfall(original, trial, ""):
            return False, None
        try:
            golden.run_onnxruntime(original, golden.random_inputs(original, seed=0, dims=trial))
        except CinmError as e:
            if golden.is_shape_error(str(e)):
                continue
            return False, None
        return False, ", ".join(f"{d}={size}" for d in open_)
    return True, ", ".join(open_)


def _runs_at_one(original: onnx.ModelProto, dims: dict) -> bool:
    """Whether onnxruntime runs ``original`` on random inputs with the sizes ``dims`` and every
    other named symbolic dim at 1, the size the plans take an unsized dim at: then the model
    written runs too, and a shape error of the check's draw (8 off axis 0) is the draw's. A
    run that fails otherwise than by a shape error counts as running (it says nothing about
    the sizes)."""
    at_one = {**dict.fromkeys(golden.symbolic_dims(original), 1), **dims}
    try:
        golden.run_onnxruntime(original, golden.random_inputs(original, seed=0, dims=at_one))
    except CinmError as e:
        return not golden.is_shape_error(str(e))
    return True


def _drawn_integer_inputs(model: onnx.ModelProto, inputs: dict | None) -> list[str]:
    """The names of ``model``'s real inputs of an integer or bool element type that the check
    draws at random (those not in ``inputs``, the caller's own arrays): values such an input
    holds can be a shape (Reshape's, Expand's), so a shape error on them may be the draw's.
    Inputs drawn as indices into a table or as masks (:func:`onnx_cinm.golden.index_ranges`:
    token ids, an attention mask) are not counted: what they hold indexes, it sizes nothing
    (trial s30b: a BERT at a length its position table refuses was blamed on its input_ids,
    and written unchecked instead of refused)."""
    given = set(inputs or ())
    drawn = [vi.name for vi in golden.real_inputs(model.graph)
             if vi.name not in given and vi.type.WhichOneof("value") == "tensor_type"
             and vi.type.tensor_type.elem_type in _INTEGER_TYPES]
    if not drawn:
        return drawn
    indices = golden.index_ranges(model)
    return [name for name in drawn if name not in indices]


#: ONNX element types of integers and bool (a shape or a mask an input can carry).
_INTEGER_TYPES = frozenset({
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64, onnx.TensorProto.BOOL})


def _control_flow(model: onnx.ModelProto) -> tuple[str | None, Counter]:
    """``(line, made)``: the summary's ``control flow:`` line for the main graph's nodes with
    subgraphs (If, Loop, Scan): which If branches were compiled (hold cinm ops), how many of
    their cinm ops run on a device, and what stays on the host as it is (None without control
    flow); ``made`` counts, per recurrent op type and reason (``(op, why)``, why
    :func:`onnx_cinm.passes.recurrent.scan_reason`: a dynamic length, or one above the unroll
    limit), the recurrences whose steps ``to_cinm`` put in Scans (not the model's control flow:
    :func:`onnx_cinm.passes.recurrent.made_scan`)."""
    from .passes.recurrent import made_scan, scan_reason

    made: dict = {}  # (op type, why) -> the doc strings (one per recurrent op; a Scan per direction)
    count: Counter = Counter()
    branches = compiled = on_dev = host_cinm = unplaced = other = plain = loop_nodes = nested = 0
    for node in model.graph.node:
        bodies = frontend.subgraphs(node)
        if not bodies:
            continue
        if made_scan(node):
            made.setdefault((made_scan(node), scan_reason(node)), set()).add(node.doc_string)
            continue
        count[node.op_type] += 1
        for body in bodies:
            inner = [n for g in frontend.iter_graphs(body) for n in g.node]
            if node.op_type != "If":
                loop_nodes += len(inner)
                continue
            branches += 1
            nested += sum(n.op_type == "If" for n in inner)
            ops = [n for n in inner if n.domain == cinm.DOMAIN]
            if not ops:
                plain += len(inner)
                continue
            compiled += 1
            where = Counter(cinm.node_attrs(n).get("device", "unplaced") for n in ops)
            on_dev += len(ops) - where["host"] - where["unplaced"]
            host_cinm, unplaced = host_cinm + where["host"], unplaced + where["unplaced"]
            other += len(inner) - len(ops)
    made_count = Counter({op: len(docs) for op, docs in made.items()})
    if not count:
        return None, made_count
    parts = [", ".join(f"{op} x{n}" for op, n in sorted(count.items()))]
    if branches and compiled:
        where = f"{on_dev} on devices" + (f", {host_cinm} on the host" if host_cinm else "") \
            + (f", {unplaced} not placed" if unplaced else "")
        rest = f"; their other {other} nodes run on the host" if other else ""
        parts.append(f"{compiled} of {branches} If branches compiled ({on_dev + host_cinm + unplaced} "
                     f"cinm ops: {where}{rest})")
        if plain:
            parts.append(f"the {plain} nodes of the other branches run on the host as they are")
    elif branches:
        parts.append(f"no If branch has work for a device: the {plain} nodes of the {branches} "
                     "branches run on the host as they are")
    if nested:  # the device tables count the Ifs a run meets, nested ones included
        parts.append(f"{count['If'] + nested} Ifs in all with the {nested} nested in the "
                     f"branches (If x{count['If']}: the main graph's)")
    if loop_nodes:
        parts.append(f"the {loop_nodes} nodes of the Loop/Scan bodies run on the host as they are "
                     "(onnx-cinm compiles If branches only)")
    return "; ".join(parts), made_count


def _no_device_ops(model: onnx.ModelProto) -> str:
    """What the summary says of a model none of whose ops became a cinm op (a tree ensemble):
    its op types, by count."""
    kinds = Counter(n.op_type for n in model.graph.node)
    shown = ", ".join(f"{op} x{n}" for op, n in kinds.most_common(6))
    more = f" and {len(kinds) - 6} more op types" if len(kinds) > 6 else ""
    return f"no op of this model is one a device runs ({shown}{more} run on the host)"


#: The ``constraints`` of :func:`optimize`: the budgets among the placement options.
CONSTRAINTS = ("max_writes_per_cell", "lifetime_inferences", "crossbar_residency")


def _options(placement, place, objective, constraints, host_roofline, device_options) -> dict:
    """The pass options of one :func:`optimize` call, checked
    (:func:`onnx_cinm.passes.check_options`)."""
    opts = dict(device_options or {})
    for k, v in (constraints or {}).items():
        if k not in CONSTRAINTS:
            raise unknown_key(k, CONSTRAINTS, "placement constraint")
        opts[k] = v
    for key, value in (("placement", placement), ("objective", objective),
                       ("host_roofline", host_roofline)):
        if value is not None:
            opts[key] = value
    if place:
        opts["place"] = list(place)
    return check_options(opts)


def optimize(model: onnx.ModelProto | str | Path, *, placement: str | None = None,
             place: list[tuple[str, str]] | tuple = (), skip: list[str] | tuple = (),
             stop_after: str | None = None, input_shapes: dict[str, list[int]] | None = None,
             check: int | None = None, check_rtol: float | None = None, check_atol: float | None = None,
             dims: dict[str, int] | None = None, device_options: dict | None = None,
             log: Callable[[str], None] | None = None, objective: str | None = None,
             constraints: dict | None = None, host_roofline=None,
             inputs: dict | None = None, totals: bool = True,
             progress: bool = False, check_nan_inf: bool = True) -> OptimizeResult:
    """Compile an ONNX model into cinm ops placed on devices, and check it against the original.

    The branches of the main graph's If nodes go through the same passes, each as a model of
    its own (:func:`onnx_cinm.passes.control_flow.compile_if_bodies`; what their captured
    values look like at the planned sizes comes from one onnxruntime run of the model on the
    check's first input set, or random inputs with ``check=0``); Loop and Scan bodies stay as
    they are.

    When every input dim has a size (``dims``, ``inputs`` or a static shape), or the dims
    without one are batches (axis 0 of the inputs alone: planned at 1, :func:`_batches_only`),
    and shape inference still leaves tensors open (a Pad's pads computed from ``Shape(x)``, a contrib op
    onnx has no schema for), one onnxruntime run of the original on that same input set gives
    their shapes, recorded in the model (:data:`onnx_cinm.frontend.PROBED_SHAPES_KEY`) for
    FLOPs, placement, tiling, mapping and the report at the planned sizes; the graph's types
    stay symbolic, so the model still runs at other sizes.

    Args:
        model: a ModelProto or a path (external data next to it is loaded).
        placement: placement strategy: ``"cost"`` (the default, declared in
            :class:`onnx_cinm.passes.pass_options.PlacementOptions`: every cinm op on the
            device minimizing ``objective`` over the graph,
            :mod:`onnx_cinm.passes.cost_placement`) or ``"heuristic"`` (the CINM paper's:
            large matmuls with constant weights to the crossbar, other cinm ops to UPMEM).
        place: user hints ``(pattern, device)``; the first matching hint wins.
        skip: pass names not to run.
        stop_after: ``"cinm"``, ``"placement"``, ``"paradigm"``, ``"device"`` or a pass name: the
            level to stop at (:data:`onnx_cinm.passes.STOP_LEVELS`).
        input_shapes: ``{input name: dims}`` baked into the model before optimizing.
        check: number of random-input runs comparing stock onnxruntime on the original and on the
            result (0 disables the check); None (default): :func:`default_check_runs`, 1, or 2
            for a model that quantizes at run time.
        check_nan_inf: after a passing check, also compare both models on one input set
            holding NaN, +Inf and -Inf (:func:`onnx_cinm.golden.compare_special`); False skips
            it (the summary says so). Nothing runs when ``check`` is 0.
        check_rtol, check_atol: tolerances of the check; None (default): by each output's
            dtype (:func:`onnx_cinm.golden.default_tolerance`: 1e-4 / 1e-5 for float32,
            4 ulps = 0.0039 for float16).
        dims: sizes of symbolic dimensions, by name (``{"batch": 8, "seq": 128}``): FLOPs,
            placement, tiling and mapping are planned at these sizes, the check's random inputs
            have them, and the model records them (run and compare use them by default).
            Symbolic dims without a size are planned as 1 (and drawn 1 on axis 0, 8 elsewhere
            by the check; see :func:`onnx_cinm.golden.random_inputs`).
            If onnxruntime cannot run the *original* at those sizes because of a shape error
            (:func:`onnx_cinm.golden.is_shape_error`: a Reshape to a hard-coded batch 1,
            operands that no longer broadcast, an input shorter than a kernel), no input of
            these sizes can run: CinmError, and nothing is returned to write. A failure of
            another kind may depend on the values drawn (an index input out of range): the
            check is skipped, not failed, and ``check_skipped`` says why. So is a shape error
            at sizes the caller did not give (a dim left unsized or anonymous, which the check
            draws: :func:`onnx_cinm.golden.every_dim_sized`), and a shape error when an
            integer or bool input was drawn at random (its values may be a shape: an Expand's
            or a Reshape's; pass it in ``inputs`` to have the check run). A shape error with
            dims left unsized is still refused when onnxruntime fails alike with them at each
            size given (:func:`_sizes_to_blame`: sizes given that conflict among
            themselves), or when it runs at a size given but not with those dims at 1, the
            size the plans take them at (then they must be given too: :func:`_runs_at_one`),
            and so are sizes whose inputs and largest tensor alone exceed this machine's memory (:func:`_memory_shortfall`, before any run; with ``check=0``
            the shape probe is left out instead) and sizes onnxruntime
            runs out of memory at (:func:`onnx_cinm.golden.is_out_of_memory`).
        device_options: options by flat key, checked against the schema of every device and
            pass (:func:`onnx_cinm.passes.option_schema`; ``onnx-cinm devices`` lists the
            devices'), e.g. ``cim_loop_order`` (``"weight_stationary"`` or ``"naive"``),
            ``cim_crossbars``, ``cim_rows``, ``cim_cols``, ``cim_preset``, ``cim_mode``,
            ``cim_time_s`` (seconds after programming), ``cim_effects`` (effect names),
            ``upmem_dpus``, ``upmem_tasklets``, ``upmem_target``; the keyword arguments
            above win over the same keys here.
        log: callable receiving progress lines.
        objective: what cost placement minimizes: ``"energy"`` (the default), ``"latency"``
            or ``"edp"``.
        constraints: cost placement budgets: ``max_writes_per_cell`` (crossbar writes per cell
            over ``lifetime_inferences`` inferences, default 1), ``crossbar_residency`` (True:
            the tiles kept by all crossbar kernels must fit the crossbars). See
            :class:`onnx_cinm.passes.cost_placement.Constraints`.
        inputs: real input arrays for the check, by input name (``{"input_ids": ids}``); they
            also size the symbolic dims they cover for planning (``dims`` wins; a recurrence
            unrolled for a size in ``dims`` that an array has at another: CinmError when
            ``check`` runs, the array could not run in the result); inputs not given are drawn
            at random (valid indices and masks, see
            :func:`onnx_cinm.golden.index_ranges`). With every input given, the check runs
            once, on them.
        totals: the figures only the summary prints: with cost or heuristic placement, price
            the written model once more for ``stats["placement"]["model_totals"]`` (one cost
            evaluation of every op: 0.1 s on light DenseNet121), and count the FLOPs, cinm ops
            and anonymous dims. False leaves them out (``onnx-cinm optimize -q``, which prints
            no summary): ``flops_total`` and ``flops_on_devices`` 0, ``flops_exact`` False,
            ``cinm_by_device``, ``placements``, ``host_flops`` and ``anonymous_dims`` empty.
        progress: a progress bar on stderr (when it is a terminal) for a long check: the
            tensor-by-tensor check of a quantized model (:func:`onnx_cinm.golden.compare`).
        host_roofline: the host's figures for cost placement (a
            :class:`onnx_cinm.hostmodel.HostRoofline`, ``"GFLOPS,GBPS[,WATTS]"``, ``"nominal"``
            or ``"measure"``: probed once on this machine and cached); default: the
            ``ONNX_CINM_HOST_ROOFLINE`` environment variable, else nominal figures. The figures
            used are recorded in the model (``metadata_props``) and printed by the summary.

    Returns:
        An :class:`OptimizeResult`; nothing is written to disk.

    Raises:
        CinmError: bad input (unreadable model, unknown pass, device or input name, an
            unknown option key or a value of the wrong type or range, sizes the original
            cannot run at or that do not fit in memory; one line naming it).
        CheckFailed: the optimized model does not match the original within tolerance.
    """
    log = log or (lambda msg: None)
    begin = time.perf_counter()
    options = _options(placement, place, objective, constraints, host_roofline, device_options)
    if isinstance(model, (str, Path)):
        original = frontend.load_model(model)
    else:  # load_model validates files; an in-memory model gets the same structural checks
        frontend.validate_structure(model, opsets=False)
        original = model
    # what compare checks its original against; a re-optimized model keeps its first source's
    source = frontend.recorded_source(original) or frontend.source_digest(original)
    shaped, shaped_note = {}, ""
    if input_shapes:
        named = set(golden.symbolic_dims(original))
        # the dims the new shapes fix, by the names the input gave them: the summary's
        # "(at batch=4)" and its per-inference note, as --dim batch=4 has them (s35 trial)
        shaped = {k: v for k, v in golden.dims_from_shapes(original, input_shapes).items()
                  if k not in (dims or {})}
        shaped_note = frontend.batch_note(original, {**shaped, **(dims or {})})
        if original is model:  # never change the caller's model
            original = onnx.ModelProto()
            original.CopyFrom(model)
        original = frontend.overwrite_input_shapes(original, input_shapes)
        # a --dim of a dim the new shapes fixed: the two flags conflict (said as such, not as
        # a dim no input has)
        gone = sorted(set(dims or {}) & named - set(golden.symbolic_dims(original)))
        if gone:
            raise CinmError(f"--dim {gone[0]}: --overwrite-input-shape gave its input a fixed "
                            f"shape, so the model has no dim '{gone[0]}' left to size; give "
                            "one of the two")
    # a re-optimized model keeps its sizes; real input arrays size what they cover; --dim wins
    given = golden.dims_from_shapes(original, {k: np.shape(v) for k, v in (inputs or {}).items()})
    asked = dict(dims or {})
    dims = {**frontend.planned_dims(original), **given, **asked}
    golden.check_dim_names(original, dims)
    _check_unrolled(original, inputs, dims, f"model '{model}'" if isinstance(model, (str, Path))
                    else "the model")
    if check is None:
        check = default_check_runs(original)
    if check or original is model:  # the check needs the original; the caller's stays as is
        work = onnx.ModelProto()
        work.CopyFrom(original)
    else:  # loaded here and not needed again: rewrite it in place rather than hold two copies
        work = original
    if cinm.forget_plans(work):  # an optimized model compiled again: plan and emit afresh
        log("input already has planned cinm ops; their kernels and plans are recomputed")
    # value_info the model came with (an exporter's, a trace's): every inference of the passes
    # keeps typed entries as they are and sizes what they feed from them, so the passes' types
    # may hold what a fresh inference would not (a wrong entry, a traced size where it leaves a
    # dim open); only types this run wrote from no value_info are kept by the final step below
    carried_types = len(work.graph.value_info) > 0
    frontend.set_planned_dims(work, dims)
    frontend.set_probed_shapes(work, {})  # a re-optimized model's were taken at its old sizes
    unsized = [d for d in golden.symbolic_dims(work) if d not in dims]
    nodes_before = len(work.graph.node)
    ctx = PassContext(options=options, log=log)
    if frontend.recorded_source(original) is not None:
        ctx.stats["reoptimized"] = True
    # options that are valid but change nothing (a time after programming, exact data path)
    ctx.stats["option_warnings"] = [w for dev in devices.all_devices()
                                    for w in dev.option_warnings(options)]
    pm = PassManager(skip=list(skip), stop_after=stop_after)
    pm.timings.append(("load", time.perf_counter() - begin))
    short = None
    if (dims or input_shapes) and (check or not unsized):  # onnxruntime would run at these sizes
        at = ", ".join(f"{k}={v}" for k, v in dims.items())
        short = _memory_shortfall(original, dims, at or "the input shapes given")
        if short and check:
            raise CinmError(f"{short}: choose smaller sizes, or plan at them without running the "
                            "original: --check 0")
    # every size known, or only batches left unsized (planned at 1, as the check draws them):
    # what inference leaves open, one run at those sizes can tell
    if (not unsized or _batches_only(original, unsized)) and not short:
        t0 = time.perf_counter()
        # the user's own arrays for every input: what their data sizes (the rows after a
        # Unique) is what the model meets, so it is planned at those sizes too
        given = bool(inputs) and {vi.name for vi in golden.real_inputs(original.graph)} <= set(inputs)
        batches = {d: golden.DEFAULT_FIRST_DIM for d in unsized}
        at = {**dims, **batches}
        probed = _probe_open_shapes(work, lambda: _probe_feeds(original, inputs, check, at)[0],
                                    by_data_too=given, ctx=ctx, assume=batches)
        if probed is not None:
            ctx.stats["probed_shapes"] = len(probed)
            pm.timings.append(("probe_shapes", time.perf_counter() - t0))
    work = pm.run(work, ctx)
    if check:  # the arrays are fed only by the check
        _refuse_unrolled_conflicts(work, original, inputs, asked)
    branches_from = None
    bodies = any(n.op_type == "If" for n in work.graph.node)
    if bodies:
        from .passes.control_flow import compile_if_bodies

        t0 = time.perf_counter()
        feeds, branches_from = _probe_feeds(original, inputs, check, dims)
        work = compile_if_bodies(work, ctx, skip=skip, stop_after=stop_after, feeds=feeds)
    # which branch the probe saw each If take: the report's per-inference totals count it
    frontend.set_if_taken(work, ctx.stats.get("if_taken") or {})
    if branches_from is not None:
        # the branches were planned alone, each as if it had the whole device: the devices
        # that share resources among their kernels (crossbars) plan all graphs' at once
        ran = {name for name, _ in pm.timings}
        if ran & {"cim_tiling", "cnm_mapping", "device_lowering"}:
            from .passes.branches import lower_together

            ctx.stats["lowered_together"] = lower_together(
                work, ctx, paradigm_only="device_lowering" not in ran)
        pm.timings.append(("if_bodies", time.perf_counter() - t0))
    cinm.attach_functions(work)
    roof = hostmodel.get(ctx.options.get("host_roofline"))  # what the host's costs were priced at
    ctx.stats["host_roofline"] = roof
    for p in [p for p in work.metadata_props if p.key == hostmodel.METADATA_KEY]:
        work.metadata_props.remove(p)
    work.metadata_props.add(key=hostmodel.METADATA_KEY, value=hostmodel.to_json(roof))
    frontend.set_recorded_source(work, source)
    t0 = time.perf_counter()
    # the passes' last tensor infos are of this graph, their types all static and all written
    # by this run (none derived from a carried entry): what a fresh inference would write is in
    # value_info already (keep_inferred_types says when)
    inferred = carried_types or not (ctx.infos_current(work) and frontend.keep_inferred_types(work))
    if inferred:
        del work.graph.value_info[:]  # rewritten tensors: infer afresh, not trust stale entries
        work = frontend.infer_shapes(work, strict=False)
    timings = pm.timings + [("shape_inference", time.perf_counter() - t0)]
    # the passes' last tensor infos are this model's (as tensor_infos(work) gives them, and
    # as the model's value_info holds them) unless shape inference ran again above or If
    # bodies were compiled since (their tensors are in the infos too): then taken afresh by
    # the totals and the figures below
    infos = None if inferred or bodies or not totals else ctx.tensor_infos(work)
    placed = ctx.stats.get("placement")
    if totals and placed is not None and placed.get("strategy") in ("cost", "heuristic"):
        # the totals of the model as written, counted as the report counts them (under either
        # placement: the summary prints them): the search's own totals predate the passes
        # after placement (fold_layouts drops host Transposes)
        from .passes.branches import counted_by_device, counted_totals, evaluate_graphs

        t0 = time.perf_counter()
        root = evaluate_graphs(work, ctx.options, infos)[0]
        placed["model_totals"] = {**counted_totals(root), "by_device": counted_by_device(root)}
        timings.append(("totals", time.perf_counter() - t0))
    report, skipped, special, special_skipped = None, None, None, None
    if check:
        t0 = time.perf_counter()
        try:
            report = golden.compare(original, work, n=check, rtol=check_rtol, atol=check_atol,
                                    dims=dims, feeds=_check_feeds(original, inputs, check, dims),
                                    progress=progress)
        except CheckFailed as e:  # the candidate out of memory says nothing about its values
            if golden.is_out_of_memory(str(e)):
                raise CinmError(_out_of_memory(dims, e)) from None
            raise
        except ReferenceFailed as e:  # says nothing about our rewrite: skip, and say why
            if golden.is_out_of_memory(str(e)):  # the sizes, not the values or the rewrite
                raise CinmError(_out_of_memory(dims, e)) from None
            if inputs:  # the user's own arrays: their mistake to fix, not a skip to shrug at
                raise CinmError(f"the original does not run on the given --input arrays: {e}") from None
            if not golden.is_shape_error(str(e)):
                skipped = (f"the original does not run on the random inputs (not a shape error: "
                           f"it may depend on the values drawn): {e}")
            elif not golden.every_dim_sized(original, dims):
                # a conflict among the sizes given (no size of the others runs) is refused as
                # when every dim is given; else the drawn sizes may be what fails
                blame, which = (False, None) if _drawn_integer_inputs(original, inputs) \
                    else _sizes_to_blame(original, dims)
                if blame:
                    at = ", ".join(f"{k}={v}" for k, v in dims.items())
                    raise CinmError(f"the original cannot run at {at} ({which} drawn, or at each "
                                    f"size given: a shape error every time): {e}; no input of "
                                    "these sizes runs in onnxruntime: choose sizes the model "
                                    "supports") from None
                if which and not _runs_at_one(original, dims):
                    # tied to a size given (a Concat of two batches): the model as planned,
                    # those dims at 1, cannot run either; refused, nothing written
                    at = ", ".join(f"{k}={v}" for k, v in dims.items())
                    open_ = ", ".join(w.split("=")[0] for w in which.split(", "))
                    raise CinmError(f"the original does not run at {at} with {open_} left unsized "
                                    f"(a shape error: {e}); at {which} it runs: give that size "
                                    f"too, --dim {' --dim '.join(which.split(', '))}") from None
                open_ = [d for d in golden.symbolic_dims(original) if d not in dims]
                if not which and open_ and not _drawn_integer_inputs(original, inputs) \
                        and not _runs_at_one(original, dims):
                    # neither the check's draw nor the plans' size 1 runs (an image model at
                    # 1x1): the model written would be planned at sizes that cannot exist
                    given = ", ".join(f"{k}={v}" for k, v in dims.items())
                    raise CinmError(
                        f"the original does not run with {', '.join(open_)} at 1, the size plans "
                        "take a dim without one" + (f" (with {given})" if given else "")
                        + f", nor at the sizes the check drew (a shape error: {e}); give their "
                        "sizes: " + " ".join(f"--dim {d}=SIZE" for d in open_)) from None
                skipped = ("the original does not run on the random inputs at the sizes the check "
                           f"drew for the dims without one: {e}"
                           + (f"; at {which} it runs" if which else ""))
            elif drawn := _drawn_integer_inputs(original, inputs):
                # an integer input may be a shape (Reshape's, Expand's): its drawn values, not
                # the sizes, can be what fails
                skipped = (f"the original does not run on the random inputs (the values drawn for "
                           f"the integer input {drawn[0]} may be what fails): {e}")
            else:
                # the requested sizes themselves: no input of them runs, so a model planned at
                # them (and its figures) would describe a configuration that cannot exist
                at = ", ".join(f"{k}={v}" for k, v in dims.items()) or "its input shapes"
                raise CinmError(f"the original cannot run at {at}: {e}; no input of these sizes "
                                "runs in onnxruntime: choose sizes the model supports") from None
            log(f"check skipped: {skipped}")
        timings.append(("check", time.perf_counter() - t0))
        if report is not None and not report.ok:
            # a quantized model judged tensor by tensor has named the tensor that is off: no
            # rounding to widen a tolerance for
            rounding = report.stepwise is None and any(
                not o.ok and not o.note and o.dtype.startswith("float") for o in report.outputs)
            quantizers = golden.runtime_quantizers(original) if rounding else []
            if quantizers:  # a last-bit difference moves whole steps: not a tolerance matter
                hint = (f"; the model quantizes at run time ({', '.join(quantizers)}: one scale "
                        "over the whole tensor, the batch included), where a last-bit difference "
                        "before it can move whole quantization steps on random inputs; check on "
                        "real inputs (--input NAME=FILE.npy or FILE.npz; Python: inputs=) or at "
                        "batch 1, rather than widening the tolerance")
            elif rounding:
                hint = ("; if that is float rounding (onnxruntime's own graph optimization levels "
                        "may differ as much on this model), widen the tolerance: "
                        "--check-atol/--check-rtol (Python: check_atol=, check_rtol=)")
            else:
                hint = ""
            raise CheckFailed(f"the optimized model does not match the original: {report.summary()}"
                              + hint)
        squashers = golden.lowered_nan_squashers(original, work) \
            if report is not None and check_nan_inf else []
        if report is not None and not check_nan_inf:
            special_skipped = "--no-check-nan-inf; Python: check_nan_inf=False"
        elif squashers:
            special_skipped = golden.nan_squash_reason(squashers)
        elif report is not None:  # then, apart, NaN/Inf inputs: they must land where ORT puts them
            t0 = time.perf_counter()
            try:
                special = golden.compare_special(original, work, rtol=check_rtol, atol=check_atol,
                                                 dims=dims, given=inputs or None)
            except ReferenceFailed as e:
                special_skipped = f"the original does not run on such inputs: {e}"
            else:
                if special is None:  # said in the summary, not left out without a word
                    special_skipped = golden.NO_FLOAT_INPUT
            timings.append(("check_nan_inf", time.perf_counter() - t0))
            if special is not None and not special.ok:
                raise CheckFailed("the optimized model does not match the original on NaN/Inf "
                                  f"inputs: {special.summary()}")
    # the model written says whether it went unchecked (an earlier optimize's record goes)
    frontend.set_check_skipped(work, skipped)
    t0 = time.perf_counter()
    if totals:
        total, on_dev, by_dev, placements, host, exact, anonymous = _flops(
            work, ctx.stats.get("if_taken"), infos)
    else:  # figures only the summary prints (a walk of every tensor: 2% of -q on DenseNet121)
        total, on_dev, by_dev, placements, host, exact, anonymous = \
            0, 0, Counter(), [], Counter(), False, {}
    if not ctx.stats.get("if_taken"):
        branches_from = None
    fixed = fixed_dims(work, {**{d: 1 for d in unsized}, **dims}) \
        if "device_lowering" in ctx.stats else {}
    timings.append(("figures", time.perf_counter() - t0))
    return OptimizeResult(work, nodes_before, len(work.graph.node), by_dev, total, on_dev, timings,
                          report, ctx.stats, placements, skipped, special, dims, unsized, host, exact,
                          anonymous, special_skipped, branches_from, fixed, ctx.origins,
                          source_ops=ctx.source_ops, wall_s=time.perf_counter() - begin, counted=totals,
                          shaped_dims=shaped, shaped_note=shaped_note)
