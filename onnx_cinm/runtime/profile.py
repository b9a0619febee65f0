"""The execution provider's profile: per-node records aggregated into a table, JSON or CSV.

A record (see :meth:`InferenceSession.profile`) has ``run``, ``node``, ``op_type``, ``device``,
``nodes`` (graph nodes it covers), ``in_partition`` (a model-mode device node inside a host
partition; absent otherwise), ``mode``, ``wall_s`` (host wall time, seconds), ``latency_s`` and ``energy_j`` (modeled on the
device), ``writes`` (crossbar tile writes) and ``bytes_moved`` (with ``bytes_note`` when a
kernel counts them otherwise than its plan does) and ``basis`` (``run``: the modeled figures
were counted on this run's inputs, at their sizes; ``plan``: they are the recorded plan's, at
the sizes the model was planned at; None on the host) and, on a crossbar kernel whose
programmed operand is an activation of another shape than planned, ``replanned`` (``[planned
[G, K, N], this run's]``: the run's figures are those of a program planned again at that
shape), ``adc_clipped``/``adc_conversions`` on a crossbar kernel whose ADC saturated, and
``fused_into`` (the node whose kernel computed it: an Im2Col, view or Relu with 0 s wall of its
own) on a node computed inside a convolution's kernel. Missing figures are None: host
partitions have no modeled device figures, nodes charged by a cost model have no wall time of
their own.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from .. import frontend
from ..text import Column, fold_rows, si, table as text_table

FIELDS = ["run", "node", "op_type", "device", "mode", "wall_s", "latency_s", "energy_j", "writes",
          "bytes_moved", "nodes", "basis"]
_SUMMED = ("wall_s", "latency_s", "energy_j", "writes", "bytes_moved")


#: How a host partition's ``op_type`` ends when a convolution computed it (the provider's
#: residual Add and Relu, :meth:`onnx_cinm.runtime.session.InferenceSession._run_partition`).
IN_CONV = " in conv"


def steady(records: list[dict]) -> list[dict]:
    """The records of the runs after the first when there is more than one run, else all of
    them: the first run of a session includes one-time work (the matrix kernel chosen per
    product shape by CPU time, onnxruntime's set-up of each partition), measured at about 25x
    a steady run on a small quantized model, so the steady figures leave it out."""
    runs = sorted({r["run"] for r in records})
    return records if len(runs) < 2 else [r for r in records if r["run"] != runs[0]]


def first_run_wall(records: list[dict]) -> float | None:
    """Summed ``wall_s`` (seconds) of the first run's records, or None without records."""
    if not records:
        return None
    first = min(r["run"] for r in records)
    return sum(r.get("wall_s") or 0.0 for r in records if r["run"] == first)


def aggregate(records: list[dict]) -> list[dict]:
    """One row per node, in first-seen order, plus ``runs`` (the runs the node appeared in).
    ``wall_s``: the median over the node's runs after the session's first (:func:`steady`;
    over all of its runs when it ran only in the first, or there was one run); the modeled
    figures: their mean over the node's runs (a per-inference mean). None stays None."""
    rows: dict[str, dict] = {}
    walls: dict[str, list] = {}
    later = {id(r) for r in steady(records)}
    for r in records:
        row = rows.setdefault(r["node"], {"node": r["node"], "op_type": r["op_type"],
                                          "device": r["device"], "mode": r["mode"], "runs": 0,
                                          "nodes": r.get("nodes", 1),
                                          "in_partition": r.get("in_partition", False),
                                          "basis": r.get("basis"),
                                          **{k: None for k in _SUMMED}})
        row["runs"] += 1
        for k in _SUMMED:
            if k != "wall_s" and r.get(k) is not None:
                row[k] = (row[k] or 0) + r[k]
        if r.get("wall_s") is not None:
            walls.setdefault(r["node"], []).append((id(r) in later, r["wall_s"]))
    for name, row in rows.items():
        for k in _SUMMED:
            if k != "wall_s" and row[k] is not None:
                row[k] = row[k] / row["runs"]
        ws = walls.get(name)
        if ws:
            row["wall_s"] = statistics.median([w for s, w in ws if s] or [w for _, w in ws])
    return list(rows.values())


def totals_by_device(rows: list[dict]) -> list[dict]:
    """Per device: ``nodes`` (graph nodes, a host partition counting all of its own),
    ``partitions`` (host partitions) and the summed per-inference figures of :func:`aggregate`
    rows; a figure none of the device's rows has (None: not modeled, e.g. the host's latency
    and energy) is None in the total too, not 0."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["device"], {"device": r["device"], "nodes": 0, "partitions": 0,
                                         **{k: None for k in _SUMMED}})
        t["nodes"] += r.get("nodes", 1)
        t["partitions"] += r["mode"] == "onnxruntime"
        for k in _SUMMED:
            if r[k] is not None:
                t[k] = (t[k] or 0.0) + r[k]
    return list(out.values())


def median_split(records: list[dict]) -> dict:
    """``{device: median over runs of that run's summed wall_s}`` in seconds: where a typical
    run spent its host time (the median, not one run, so a run slowed by other work on the
    machine does not decide the split). A device absent from a run counts 0 for it. Every run
    of ``records`` counts: pass :func:`steady` records to leave the first run out."""
    runs: dict = {}
    for r in records:
        per = runs.setdefault(r["run"], {})
        per[r["device"]] = per.get(r["device"], 0.0) + (r.get("wall_s") or 0.0)
    devs = {d for per in runs.values() for d in per}
    return {d: statistics.median(per.get(d, 0.0) for per in runs.values()) for d in sorted(devs)}


def _whole(v) -> str:
    """A count (a mean over runs) to the unit, or ``-`` when not known."""
    return "-" if v is None else f"{v:.0f}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def own_nodes_text(counts: dict) -> str:
    """``", host 2 nodes on numpy kernels, upmem 1 node"``: the nodes the provider runs itself,
    outside the host partitions, per device (``{device: count}``; a cinm op on the host runs
    on a numpy kernel), as the run line and the profile both say it."""
    return "".join(f", {d} {_count(n, 'node')}" + (" on numpy kernels" if d == "host" else "")
                   for d, n in counts.items())


def ran(records: list[dict]) -> dict:
    """What the runs of ``records`` ran, counted as the head of :func:`table` counts it (a
    node seen in any run counts once; an If the provider runs counts the branches that ran):
    ``partitions`` (host partitions), ``nodes`` (their graph nodes), ``modeled`` ({device:
    device nodes charged by its cost model inside them}), ``own`` ({device: nodes the
    provider runs itself, outside the host partitions})."""
    rows = aggregate(records)
    modeled: dict = {}
    own: dict = {}
    for r in rows:
        if r["in_partition"]:
            modeled[r["device"]] = modeled.get(r["device"], 0) + 1
        elif r["mode"] != "onnxruntime":
            own[r["device"]] = own.get(r["device"], 0) + 1
    return {"partitions": sum(r["mode"] == "onnxruntime" for r in rows),
            "nodes": sum(r["nodes"] for r in rows if r["mode"] == "onnxruntime"),
            "modeled": modeled, "own": own}


#: The columns of :func:`table`.
COLUMNS = (Column("node", fit=44), Column("op", width=10), Column("device", width=10),
           Column("mode", width=11), Column("wall", ">"), Column("modeled", ">"),
           Column("energy", ">"), Column("basis", width=5), Column("writes", ">"),
           Column("bytes", ">"))


def _figures(r: dict) -> tuple:
    return (si(r["wall_s"], "s"), si(r["latency_s"], "s"), si(r["energy_j"], "J"),
            r.get("basis") or "", _whole(r["writes"]), si(r["bytes_moved"], "B"))


def _device_basis(rows: list[dict], dev: str) -> str | None:
    """The basis of a device's total: its rows' one basis, ``mixed``, or None (host)."""
    bases = {r.get("basis") for r in rows if r["device"] == dev} - {None}
    return None if not bases else bases.pop() if len(bases) == 1 else "mixed"


def basis_note(records: list[dict], planned: str | None = None, at_run: str | None = None) -> str:
    """The note saying on which sizes each row's modeled figures stand ('' when no row has
    any): ``run`` rows were counted on this run's inputs, ``plan`` rows are the plan's.
    ``planned``/``at_run``: the sizes as text (``batch=1``/``batch=8``) when they differ; then
    the note names them, and the rows of the two bases are not comparable."""
    bases = {r.get("basis") for r in records} - {None}
    if not bases:
        return ""
    text = ("basis of modeled and energy: "
            + "; ".join(b for b in ("run: counted on this run's inputs, at their sizes"
                                    + (f" ({at_run})" if at_run else ""),
                                    "plan: the plan's figures, at the sizes the model was "
                                    "planned at" + (f" ({planned})" if planned else ""))
                        if b.split(":")[0] in bases))
    if planned and bases == {"run", "plan"}:
        text += ("; the two differ in size here, so compare rows of one basis only (optimize "
                 f"again at {at_run} for plan figures at this run's sizes)")
    return text


def clipped_note(records: list[dict]) -> str | None:
    """The ADC conversions that saturated in these runs (records' ``adc_clipped``), of how
    many, in which kernels (the three that clipped most first) and why they can (the
    kernel's ``clipped_note``); None when none did."""
    per: dict = {}
    why = ""
    for r in records:
        if r.get("adc_clipped"):
            got = per.setdefault(r["node"], [0, 0])
            got[0] += r["adc_clipped"]
            got[1] += r.get("adc_conversions", 0)
            why = why or r.get("clipped_note", "")
    if not per:
        return None
    clipped = sum(c for c, _ in per.values())
    total = sum(n for _, n in per.values())
    worst = sorted(per.items(), key=lambda kv: -kv[1][0])
    names = ", ".join(f"{node} {c:,}" for node, (c, _) in worst[:3])
    more = f" and {len(worst) - 3} more" if len(worst) > 3 else ""
    return (f"ADC: {clipped:,} conversions saturated in {len(per)} crossbar kernel(s) "
            f"({names}{more}; of their {total:,} conversions in the runs that clipped): "
            + saturation_text(why))


def saturation_text(why: str) -> str:
    """The words after a count of saturated ADC conversions: their outputs stop at the
    ADC's range, and ``why`` (the kernel's ``clipped_note``) in brackets when there is one."""
    return "those outputs stop at the ADC's range" + (f" ({why})" if why else "")


def replanned_notes(records: list[dict]) -> list[str]:
    """One note per node whose records carry ``replanned`` (a crossbar kernel whose programmed
    operand, an activation, had another shape than planned): the planned shape and the
    shapes it was planned again at in these runs, in first-seen order, and how many of its
    runs did; [] when none."""
    seen: dict = {}
    for r in records:
        if r.get("replanned"):
            planned, at = r["replanned"]
            got = seen.setdefault(r["node"], (planned, {}, set()))
            got[1].setdefault(tuple(at), None)
            got[2].add(r["run"])
    runs = len({r["run"] for r in records})
    return [f"{node}: its programmed operand, an activation planned as {list(planned)} "
            f"[G, K, N], had another shape in {len(hit)} of {runs} run(s) and was planned again "
            f"at {', '.join(str(list(s)) for s in at)} (same preset and plan options; its "
            "figures in those runs are the re-planned program's)"
            for node, (planned, at, hit) in seen.items()]


#: The figures :func:`table` folds: the wall times summed, the modeled ones compared and
#: multiplied (positions in the raw row ``node, op, device, mode, wall, modeled, energy, basis,
#: writes, bytes``).
_WALL, _MODELED = (4,), (5, 6, 8, 9)


def table(records: list[dict], max_rows: int | None = None, planned: str | None = None,
          at_run: str | None = None, fold: bool = True) -> str:
    """A text table for a person: per node (wall: the median over the runs after the first,
    :func:`aggregate`; modeled figures: per-inference means), then totals per device, and the
    first run's wall time on its own line (with one run: a note that it includes the warm-up).
    ``planned``/``at_run``: the planned and the run's sizes as text when they differ
    (:func:`basis_note`). ``fold``: the rows of one source op (or host partitions) of the
    same op, device, mode and modeled figures in one row ``<node> xN``
    (:func:`onnx_cinm.text.fold_rows`) whose figures are the N rows' sums; the totals are
    the same either way. ``max_rows``: most rows shown (after folding)."""
    rows = aggregate(records)
    n_runs = len({r["run"] for r in records})
    counts = ran(records)
    parts, own = counts["partitions"], counts["own"]
    raw = [(r["node"], r["op_type"], r["device"], r["mode"], r["wall_s"], r["latency_s"],
            r["energy_j"], r.get("basis") or "", r["writes"], r["bytes_moved"]) for r in rows]
    grouped = fold_rows(raw, add=_WALL, times=_MODELED) if fold else [(list(c), [0]) for c in raw]
    shown = grouped if max_rows is None else grouped[:max_rows]
    body = [(*c[:4], si(c[4], "s"), si(c[5], "s"), si(c[6], "J"), c[7], _whole(c[8]),
             si(c[9], "B")) for c, _ in shown]
    modeled = sum(counts["modeled"].values())
    totals = []
    for t in totals_by_device(rows):
        dev = t["device"]
        inside = sum(r["in_partition"] for r in rows if r["device"] == dev)
        if t["partitions"]:  # the same counts as the head: partitions, their nodes, the rest
            in_parts = sum(r["nodes"] for r in rows if r["device"] == dev
                           and r["mode"] == "onnxruntime")
            what = f"{_count(t['partitions'], 'partition')}, {_count(in_parts, 'node')}"
            if own.get(dev):  # (short: the label spans the op, device and mode columns)
                what += f"; {own[dev]} on numpy"
        else:
            what = _count(t["nodes"], "node")
            if inside:
                what += (", in host partitions" if inside == t["nodes"] else
                         f", {inside} of them in host partitions")
        totals.append((f"total {dev} ({what})", "", "", "",
                       *_figures({**t, "basis": _device_basis(rows, dev)
                                  if t["latency_s"] is not None else None})))
    notes = []
    if len(grouped) < len(rows):
        notes.append(f"{len(rows)} rows in {len(grouped)}: '<node> xN' stands for N nodes of one "
                     "source op (or N host partitions), named by the first, with the same op, "
                     "device, mode and modeled figures, e.g. the steps of an unrolled "
                     "recurrence; its figures are the N rows' sums (wall: of their medians); "
                     "--all-nodes lists them one by one")
    if len(shown) < len(grouped):
        notes.append(f"... {len(grouped) - len(shown)} more rows (every node in --profile-out)")
    first = first_run_wall(records)
    if n_runs > 1:
        which = f"runs 2-{n_runs}" if n_runs > 2 else "run 2"  # not "runs 2-2"
        # a device whose nodes have no wall time of their own (model mode, in host
        # partitions) is '-', as its total row, not '0 s', which reads as free
        timed = {r["device"] for r in records if r.get("wall_s") is not None}
        notes.append(f"median wall per run ({which}; the median of each run's sum, where "
                     "a total row adds up its nodes' medians): " + ", ".join(
            f"{d} {si(v, 's') if d in timed else '- (in host partitions)'}"
            for d, v in median_split(steady(records)).items()))
        notes.append(f"first run, including one-time kernel selection: {si(first, 's')} "
                     "(left out of the wall column)")
    elif n_runs == 1:
        notes.append(f"one run: its wall times include the one-time warm-up (kernel selection, "
                     f"session set-up; {si(first, 's')} in all); give --random 3 or more for "
                     "steady medians")
    notes.append("wall: host time of this process (a node's: its median over the runs after the "
                 "first; a total row's: the sum of its nodes' medians); modeled: device latency, from a simulator's "
                 "counters or a cost model; bytes: across the device's boundary in one "
                 "inference, as its plan counts them (report's bytes_moved)")
    basis = basis_note(records, planned, at_run)
    if basis:
        notes.append(basis)
    notes += replanned_notes(records)
    clipped = clipped_note(records)
    if clipped:
        notes.append(clipped)
    for (dev, mode), note in sorted({(r["device"], r["mode"]): r["bytes_note"]
                                     for r in records if r.get("bytes_note")}.items()):
        notes.append(f"bytes of {dev} in {mode} mode: {note}")
    if modeled:
        notes.append("nodes in 'model' mode run inside a host partition (counted among its "
                     "nodes) and are charged by their device's cost model")
    fused = next((r for r in records if r.get("fused_into")), None)
    if fused is not None:
        notes.append(f"0 s rows of an Im2Col, a view between it and its convolution, or the "
                     f"Relu a convolution applies (e.g. {fused['node']}): computed inside the "
                     f"convolution's own kernel ({fused['fused_into']}'s, from the Im2Col's "
                     "input), whose wall time includes them")
    if any(r["op_type"].endswith(IN_CONV) for r in records if r["device"] == "host"):
        notes.append(f"'N{IN_CONV}': a host partition of a residual Add (and Relu) that the "
                     "convolution before it computed in its own onnxruntime session, as "
                     "onnxruntime fuses them in a whole model: no wall time of its own")
    host_nodes = counts["nodes"]
    head = (f"profile: {len(rows)} rows, over {n_runs} run(s): {_count(parts, 'host partition')} "
            f"({_count(host_nodes, 'node')}" + (f", {modeled} of them device nodes in model mode, "
                                                "each also a row" if modeled else "") + ")"
            + own_nodes_text(own))
    return head + "\n" + text_table(COLUMNS, body, totals=totals, notes=notes)


def write(records: list[dict], path) -> None:
    """Write the raw records to ``path``: CSV if it ends in ``.csv``, else JSON. Atomic."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(records)
        text = buf.getvalue()
    else:
        text = json.dumps(records, indent=1) + "\n"
    frontend.write_file_atomic(path, text)
