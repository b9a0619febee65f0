"""The table ``optimize`` prints of a model's UPMEM kernels (:meth:`UpmemDevice.summary
<onnx_cinm.devices.upmem.UpmemDevice.summary>`): per kernel its workgroup, its modeled cost per
inference and its one-time load, as the plan recorded them on the node (``cnm_*`` attributes,
:meth:`.mapping.CnmPlan.attrs`).

Where the figures come from (``devices/upmem/cost.py``, field notes ``upmem.md`` §1.5): the
latency is the cost model's end to end (scatter and broadcast to the DPUs, launch, kernel,
gather, host merge); the joules are *estimates* (no published per-DPU power:
``UpmemParams.dpu_power_w`` 0.12 W, ``host_xfer_j_per_byte`` 20 pJ/B, ...); the load is
``program_load_s`` (60 ms per DPU program, the middle of the 40-80 ms Cinnamon measured) plus
the transfer of the constants kept resident in MRAM.
"""
from __future__ import annotations

from ...errors import CinmError
from ...text import Column, folded_kernels, si, table


def _shape(op) -> str:
    """The first output's shape of ``op`` (an OpInfo or None) as ``1x128x384``; ``-`` when
    not known."""
    if op is None or not op.outputs or op.outputs[0].shape is None:
        return "-"
    return "x".join(str(d) for d in op.outputs[0].shape) or "scalar"


def bytes_moved(op, attrs: dict, params) -> int | None:
    """Bytes the plan ``attrs`` of ``op`` (an OpInfo) moves between the host and the DPUs per
    inference (scattered and broadcast in, results and partials out, padding included; the
    constants resident in MRAM not counted: they move once, at load), from the cost model
    (:attr:`.cost.CostBreakdown.bytes_in` + ``bytes_out``) of the plan made again with the
    recorded workgroup, grid and block (:func:`.mapping.make_plan`) on the DPU generation
    ``params``. None when ``op`` is None or the plan made again does not reproduce the
    recorded latency (to the float32 attribute's 1e-6) and MRAM footprint (an op planned at
    other shapes: no guess)."""
    if op is None:
        return None
    from .mapping import make_plan

    grid = attrs.get("cnm_grid")
    try:
        plan = make_plan(op, int(attrs["cnm_dpus"]), int(attrs["cnm_tasklets"]), params=params,
                         col_blocks=int(grid[1]) if grid else 1,
                         block_bytes=int(attrs["cnm_block_bytes"]))
        b = plan.cost()
    except (CinmError, KeyError, ValueError, TypeError, IndexError):
        return None
    rec = float(attrs.get("cnm_latency_s", -1.0))
    # the attribute is a float32 (7 digits); the MRAM footprint an exact int
    if abs(b.latency_s - rec) > 1e-6 * abs(rec) or plan.mram_bytes != attrs.get("cnm_mram_bytes"):
        return None
    return int(b.bytes_in + b.bytes_out)


def summary(plans: list, counted: list | None, fold: bool, ops: list | None, params_of) -> str:
    """The UPMEM kernels' table (see :meth:`UpmemDevice.summary
    <onnx_cinm.devices.upmem.UpmemDevice.summary>`): ``plans`` ``[(node name, op type, attrs)]``,
    ``counted`` per plan (False: left out of the per-inference totals, shown in parentheses),
    ``fold`` (rows of one source op with the same figures as one), ``ops`` (OpInfo per plan or
    None, for the shape and the bytes moved), ``params_of(attrs)`` the plan's DPU generation
    (:class:`.cost.UpmemParams`). Empty if no plan is a UPMEM kernel."""
    flags = [True] * len(plans) if counted is None else list(counted)
    ops = [None] * len(plans) if ops is None else list(ops)
    keep = [k for k, p in enumerate(plans) if "cnm_dpus" in p[2]]
    if not keep:
        return ""
    cols = (Column("UPMEM kernel", fit=64), Column("op"), Column("out shape", ">"),
            Column("DPUs", ">"), Column("tasklets", ">"), Column("latency", ">"),
            Column("energy", ">"), Column("bytes h<->DPU", ">"), Column("load", ">"),
            Column("load energy", ">"))
    rows = []
    tot = {"lat": 0.0, "en": 0.0, "bytes": 0, "load_s": 0.0, "load_j": 0.0}
    unknown = False
    targets, program = set(), set()
    most = 0
    for k in keep:
        name, op_type, a = plans[k]
        per_inf = flags[k]
        params = params_of(a)
        targets.add(params.name)
        program.add(params.program_load_s)
        moved = bytes_moved(ops[k], a, params)
        unknown = unknown or moved is None
        inf = (lambda text: text) if per_inf else (lambda text: f"({text})")
        lat, en = float(a.get("cnm_latency_s", 0.0)), float(a.get("cnm_energy_j", 0.0))
        load_s, load_j = float(a.get("cnm_load_s", 0.0)), float(a.get("cnm_load_j", 0.0))
        rows.append((name, op_type, _shape(ops[k]), int(a["cnm_dpus"]), int(a["cnm_tasklets"]),
                     inf(si(lat, "s")), inf(si(en, "J")),
                     inf("-" if moved is None else si(moved, "B")), si(load_s, "s"),
                     si(load_j, "J")))
        most = max(most, int(a["cnm_dpus"]))
        if per_inf:
            tot["lat"] += lat
            tot["en"] += en
            tot["bytes"] += moved or 0
        tot["load_s"] += load_s
        tot["load_j"] += load_j
    n_inf = sum(flags[k] for k in keep)
    label = f"total ({len(keep)} kernels" + (f", {n_inf} per inference)" if n_inf < len(keep)
                                             else ")")
    total = (label, "", "", f"{most} max", "", si(tot["lat"], "s"), si(tot["en"], "J"),
             "-" if unknown and not tot["bytes"] else si(tot["bytes"], "B") + (" +" if unknown
                                                                              else ""),
             si(tot["load_s"], "s"),
             si(tot["load_j"], "J"))
    notes = [
        f"({', '.join(sorted(targets))} DPUs, one kernel at a time, each on its own DPUs and "
        "tasklets (the total: the most any kernel takes); latency and energy per inference, "
        "modeled end to end: scatter and broadcast to the DPUs, launch, kernel, gather, host "
        "merge; the joules are estimates (no published per-DPU power); bytes h<->DPU: moved "
        "between the host and the DPUs per inference, padding included, the constants kept "
        "in MRAM not: they move once, at load)",
        "(load: once, before the first inference: the DPU program ("
        + " or ".join(si(s, "s") for s in sorted(program)) + " per kernel: "
        "dpu_load's time, by default 60 ms, the middle of the 40-80 ms Cinnamon measured) and the "
        "constants kept in MRAM; seconds modeled, joules estimated; the per-inference totals "
        "and cost placement's objective leave it out)",
    ]
    if unknown:
        notes.append("(bytes '-': a kernel whose plan could not be made again at the model's "
                     "shapes; '+' on the total: it counts only the others)")
    rows, note = folded_kernels(rows, fold, energy=[
        float(plans[k][2].get("cnm_energy_j", 0.0)) for k in keep])
    if note:
        notes.append(note)
    if n_inf < len(keep):
        notes.append("(figures in parentheses: a kernel the per-inference totals leave out, "
                     "of an If branch that does not run per inference; it counts at load)")
    return table(cols, rows, totals=[total], notes=notes)
