"""The execution provider's profile: per-node records aggregated into a table, JSON or CSV.

A record (see :meth:`InferenceSession.profile`) has ``run``, ``node``, ``op_type``, ``device``,
``nodes`` (graph nodes it covers), ``mode``, ``wall_s`` (host wall time, seconds), ``latency_s`` and ``energy_j`` (modeled on the
device), ``writes`` (crossbar tile writes) and ``bytes_moved``. Missing figures are None: host
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
from ..text import printable

FIELDS = ["run", "node", "op_type", "device", "mode", "wall_s", "latency_s", "energy_j", "writes",
          "bytes_moved", "nodes"]
_SUMMED = ("wall_s", "latency_s", "energy_j", "writes", "bytes_moved")


def aggregate(records: list[dict]) -> list[dict]:
    """One row per node, in first-seen order: the sums of each figure divided by the number of
    runs the node appeared in (a per-inference mean), plus ``runs``. None stays None."""
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(r["node"], {"node": r["node"], "op_type": r["op_type"],
                                          "device": r["device"], "mode": r["mode"], "runs": 0,
                                          "nodes": r.get("nodes", 1),
                                          **{k: None for k in _SUMMED}})
        row["runs"] += 1
        for k in _SUMMED:
            if r.get(k) is not None:
                row[k] = (row[k] or 0) + r[k]
    for row in rows.values():
        for k in _SUMMED:
            if row[k] is not None:
                row[k] = row[k] / row["runs"]
    return list(rows.values())


def totals_by_device(rows: list[dict]) -> list[dict]:
    """Per device: ``nodes`` (graph nodes, a host partition counting all of its own),
    ``partitions`` (host partitions) and the summed per-inference figures of :func:`aggregate`
    rows."""
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["device"], {"device": r["device"], "nodes": 0, "partitions": 0,
                                         **{k: 0.0 for k in _SUMMED}})
        t["nodes"] += r.get("nodes", 1)
        t["partitions"] += r["mode"] == "onnxruntime"
        for k in _SUMMED:
            t[k] += r[k] or 0
    return list(out.values())


def median_split(records: list[dict]) -> dict:
    """``{device: median over runs of that run's summed wall_s}`` in seconds: where a typical
    run spent its host time (the median, not one run, so a run slowed by other work on the
    machine does not decide the split). A device absent from a run counts 0 for it."""
    runs: dict = {}
    for r in records:
        per = runs.setdefault(r["run"], {})
        per[r["device"]] = per.get(r["device"], 0.0) + (r.get("wall_s") or 0.0)
    devs = {d for per in runs.values() for d in per}
    return {d: statistics.median(per.get(d, 0.0) for per in runs.values()) for d in sorted(devs)}


def _fmt(v, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "":
        return f"{v:.0f}"
    for prefix, scale in (("", 1), ("m", 1e-3), ("u", 1e-6), ("n", 1e-9), ("p", 1e-12)):
        if abs(v) >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"0 {unit}" if v == 0 else f"{v:.2e} {unit}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def table(records: list[dict], max_rows: int | None = None) -> str:
    """A text table for a person: per node (per-inference means), then totals per device."""
    rows = aggregate(records)
    n_runs = len({r["run"] for r in records})
    head = (f"{'node':36s} {'op':10s} {'device':10s} {'mode':11s} {'wall':>10s} "
            f"{'modeled':>10s} {'energy':>10s} {'writes':>7s} {'bytes':>10s}")
    parts = sum(r["mode"] == "onnxruntime" for r in rows)
    lines = [f"profile: {len(rows)} rows ({_count(parts, 'host partition')}, "
             f"{_count(len(rows) - parts, 'device node')}), mean of {n_runs} run(s)",
             head, "-" * len(head)]
    shown = rows if max_rows is None else rows[:max_rows]
    for r in shown:
        lines.append(f"{printable(r['node'])[:36]:36s} {printable(r['op_type'])[:10]:10s} "
                     f"{r['device']:10s} "
                     f"{r['mode'][:11]:11s} {_fmt(r['wall_s'], 's'):>10s} "
                     f"{_fmt(r['latency_s'], 's'):>10s} {_fmt(r['energy_j'], 'J'):>10s} "
                     f"{_fmt(r['writes'], ''):>7s} {_fmt(r['bytes_moved'], ''):>10s}")
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more nodes (all of them in --profile-out)")
    lines.append("-" * len(head))
    for t in totals_by_device(rows):
        what = (f"{_count(t['partitions'], 'partition')}, " if t["partitions"] else "") \
            + _count(t["nodes"], "node")
        lines.append(f"{'total ' + t['device'] + ' (' + what + ')':36s} "
                     f"{'':10s} {'':10s} {'':11s} {_fmt(t['wall_s'], 's'):>10s} "
                     f"{_fmt(t['latency_s'], 's'):>10s} {_fmt(t['energy_j'], 'J'):>10s} "
                     f"{_fmt(t['writes'], ''):>7s} {_fmt(t['bytes_moved'], ''):>10s}")
    if n_runs > 1:
        lines.append("median wall per run: " + ", ".join(
            f"{d} {_fmt(v, 's')}" for d, v in median_split(records).items()))
    lines.append("wall: host time of this process; modeled: device latency from the cost model "
                 "(crossbar simulator counters, UPMEM cost model)")
    if any(r["mode"] == "model" for r in rows):
        lines.append("nodes in 'model' mode run inside a host partition (counted among its "
                     "nodes) and are charged by their device's cost model")
    return "\n".join(lines)


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
