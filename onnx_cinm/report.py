"""A report a person can read: per-layer table, totals, and pictures of an optimized model.

``onnx-cinm report out.onnx -o DIR`` (or ``optimize ... --report DIR``) writes into ``DIR``:

* ``layers.csv``: one row per node (an If's branches' nodes after it, named
  ``<If>[then] <node>``): op, output shape, FLOPs, device, modeled latency (seconds), energy
  (joules), transfers charged to it (seconds, joules, bytes), crossbar tile writes per
  inference, bytes moved, placement reason, ``counted`` (1 if the totals count it: 0 for the
  branch of an If the planning probe did not see taken), then per part of the op's cost that
  its device breaks down (``Cost.parts``; a crossbar's ``array``, ``adc_dac`` and
  ``periphery``) its latency, energy and area (``<part>_latency_s``, ``<part>_energy_j``,
  ``<part>_area_mm2``; empty for ops without that part, and the energy and area of a part
  the device publishes only inside another's, ``CostPart.folded``);
* ``time_energy.png``: time and energy per layer, stacked by device (the op's own cost in its
  device's colour, transfers in grey on top);
* ``graph.png``: the graph, each node coloured by its device;
* ``report.html``: one self-contained page with the totals, both pictures (embedded as base64
  PNG) and the table;
* ``wear.json``: ``{device: figures}`` of the devices whose plans wear write-limited cells
  (:meth:`onnx_cinm.devices.Device.wear`; a crossbar chip's tile writes per inference, the
  streamed crossbars they rotate over, writes per cell per inference of the most-written
  cells, the cells' endurance, the lifetime in inferences and in seconds when inferences run
  back to back at the modeled latency, null when inference writes no cell, and ``short``:
  under a year); ``{}`` if none.

Figures per layer come from the cost model, the same one cost placement minimizes
(:func:`onnx_cinm.passes.cost_placement.node_costs` of the placement recorded in the model): a
lowered node's own plan (its device's :meth:`Device.recorded`, e.g. ``cim_latency_s``), else its
device's price (the host roofline for host ops). Transfers follow the cost model's one rule
(:func:`onnx_cinm.passes.cost_placement.tensor_charges`): a tensor leaving a device is charged
to its producer, a tensor entering a device is charged once per device, to its first reader
there; so the rows add up to the modeled totals. One branch of an If runs per inference: the
totals count the one the planning probe took (recorded by ``optimize``), and say so; an If it
did not see counts both branches, and the totals say they are an upper bound. Bytes moved:
what the op's device moves across its boundary by its own model (``Cost.bytes_moved``: for
DPUs the scatter and gather of the plan, for crossbars the inputs, results and cells
written). Every file is written under a temporary name and renamed into place.
"""
from __future__ import annotations

import base64
import csv
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path

import onnx

from . import hostmodel
from .pipeline import device_wear
from .dialects import cinm
from .text import Column, fold_rows, if_rule, si, table as text_table

#: Colour of the transfers in the pictures (a device's own is its ``Device.colour``).
TRANSFER_COLOUR = "#c7c7c7"
#: Size of both pictures, pixels (width, height).
PNG_SIZE = (1200, 700)
_DPI = 100


@dataclass
class Layer:
    """One node of the report (units: seconds, joules, bytes): ``latency_s``/``energy_j`` the
    op on its device, ``transfer_s``/``transfer_j``/``transfer_bytes`` the tensor transfers the
    cost model charges to it, ``bytes_moved`` the bytes its device moves across its boundary
    by the device's own model (:attr:`onnx_cinm.devices.Cost.bytes_moved`); ``parts`` the op's
    cost by component (:class:`onnx_cinm.graph.CostPart`), when its device breaks it down."""

    index: int | str
    name: str
    op: str
    shape: str
    flops: int
    device: str
    latency_s: float
    energy_j: float
    transfer_s: float
    transfer_j: float
    writes: int
    transfer_bytes: int
    bytes_moved: int
    reason: str
    cinm: bool
    parts: tuple = ()
    #: in the per-inference totals; False for the nodes of an If branch the planning probe
    #: did not see taken (the other branch of that If is counted)
    counted: bool = True


def layers(model: onnx.ModelProto, options: dict | None = None) -> tuple[list[Layer], dict]:
    """The report rows of ``model`` and its totals (``latency_s``, ``energy_j``, ``writes``,
    ``transfer_bytes``, ``transfer_s``, ``transfer_j``, ``by_device`` {device: [seconds,
    joules]}, ``by_part`` {part: [seconds, joules, folded]} of the ops whose device breaks its
    cost down (``folded``: every op's device publishes that part's energy only inside
    another's), ``violations`` (every graph's, then the model's as a whole: the crossbar tiles all
    graphs keep, :func:`onnx_cinm.passes.branches.counted_totals`), ``ifs`` {``"taken"``: Ifs
    counted by the branch the planning probe saw, ``"both"``: Ifs counted with both
    branches}, ``host_roofline``: the host figures the host ops are priced with, in words
    (:meth:`~onnx_cinm.hostmodel.HostRoofline.text`), ``notes``: the devices' notes on their
    figures, :meth:`Device.cost_notes`,
    then their wear lines, ``wear``: {device: :class:`onnx_cinm.devices.Wear`} of the devices
    whose plans wear write-limited cells, inferences back to back at ``latency_s``).

    One row per node of the main graph in graph order; after an If's row, the nodes of its
    then and else branches (nested Ifs alike), named ``<If>[then] <node>`` as the provider's
    profile names them, indexed ``<If index>t<node index>`` (``e`` for else). Every figure is
    the cost model's (:func:`onnx_cinm.passes.cost_placement.node_costs` of the placement
    recorded in ``model``; a branch is priced as a graph of its own whose captured values
    arrive from the host, as the provider runs it), so the counted rows add up to the totals.

    Per inference one branch of an If runs: the totals count the branch the planning probe saw
    taken (:func:`onnx_cinm.frontend.if_taken`), the other's rows have ``counted`` False; an If
    whose branch the probe did not see counts both branches, so the totals are an upper bound
    then (``ifs["both"]`` > 0)."""
    from . import devices
    from .passes.branches import counted_totals, evaluate_graphs

    root, ifs = evaluate_graphs(model, options)
    rows: list[Layer] = []
    _graph_layers(root, rows)
    by_dev: dict = {}
    by_part: dict = {}
    for r in rows:
        if not r.counted:
            continue
        s = by_dev.setdefault(r.device, [0.0, 0.0])
        s[0] += r.latency_s
        s[1] += r.energy_j
        for p in r.parts:
            s = by_part.setdefault(p.term, [0.0, 0.0, True])
            s[0] += p.latency_s
            s[1] += p.energy_j
            s[2] = s[2] and bool(p.folded)  # energy shown only when some op publishes it
    totals = counted_totals(root)
    from . import frontend

    planned = frontend.planned_dims(model)
    unchecked = frontend.check_skipped(model)
    notes = [f"({n})" for n in (frontend.batch_note(model, planned),
                                frontend.unsized_note(model, planned),
                                unchecked and f"UNCHECKED: optimize could not check this model "
                                f"against its original: {unchecked}") if n]
    notes += [note for d in dict.fromkeys(r.device for r in rows) if d in devices.device_names()
              for note in devices.get_device(d).cost_notes(dict(options or {}))]
    wear = device_wear(model, totals["latency_s"])
    notes += [text for w in wear.values() for text in (w.line, w.note) if text]
    totals.update(by_device=by_dev, by_part=by_part, ifs=ifs, notes=notes, wear=wear,
                  host_roofline=hostmodel.get((options or {}).get("host_roofline")).text())
    return rows, totals


def _graph_layers(g, rows: list) -> None:
    """Append the rows of graph ``g`` (a :class:`onnx_cinm.passes.branches.GraphCost`), each
    name after its branch label, each index after its branch prefix, and after each If the
    rows of its branches, to ``rows``."""
    from .passes.cost_placement import node_costs

    prob = g.problem
    for i, (node, nc) in enumerate(zip(prob.nodes, node_costs(prob, prob.assign))):
        at = cinm.node_attrs(node) if node.domain == cinm.DOMAIN else {}
        out = prob.infos.get(node.output[0]) if node.output else None
        shape = "x".join(str(d) for d in out.shape) if out is not None and out.shape is not None else "?"
        name = cinm.node_label(node, i)  # as run --profile names it
        rows.append(Layer(f"{g.prefix}{i}" if g.prefix else i, g.label + name, node.op_type, shape,
                          _flops(prob, i), nc.device, float(nc.cost.latency_s),
                          float(nc.cost.energy_j), nc.transfer_s, nc.transfer_j,
                          int(nc.cost.writes), int(nc.transfer_bytes), int(nc.cost.bytes_moved),
                          at.get("placement", "" if node.domain == cinm.DOMAIN else "standard op: host"),
                          node.domain == cinm.DOMAIN, tuple(nc.cost.parts), g.counted))
        for b in g.branches.get(i, ()):
            _graph_layers(b, rows)


def _flops(prob, i) -> int:
    """The FLOPs of node ``i`` as the placement priced it: a Loop's or Scan's with its body
    (:attr:`onnx_cinm.graph.OpInfo.flops`)."""
    return prob.ops[i].flops


def _colour(dev: str, seen: list) -> str:
    """The colour of device ``dev`` in the pictures: the one it declares (``Device.colour``),
    else a colour of matplotlib's ``tab10`` no registered device declares, in the order the
    devices without one appear in ``seen`` (updated)."""
    import matplotlib
    from matplotlib.colors import to_hex

    from . import devices

    declared = {d.name: d.colour for d in devices.all_devices() if d.colour}
    if dev in declared:
        return declared[dev]
    free = [c for c in map(to_hex, matplotlib.colormaps["tab10"].colors)
            if c not in {v.lower() for v in declared.values()} and c != TRANSFER_COLOUR]
    if dev not in seen:
        seen.append(dev)
    return free[seen.index(dev) % len(free)]


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.figure(figsize=(PNG_SIZE[0] / _DPI, PNG_SIZE[1] / _DPI), dpi=_DPI)


def _png(fig, plt) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    plt.close(fig)
    return buf.getvalue()


def plot_time_energy(rows: list[Layer], title: str = "") -> bytes:
    """PNG bytes (``PNG_SIZE``): per-layer time (top) and energy (bottom), bars in the device's
    colour with the transfers stacked on top in grey."""
    from matplotlib.patches import Patch

    plt, fig = _figure()
    seen: list = []
    of = {d: _colour(d, seen) for d in dict.fromkeys(r.device for r in rows)}
    cols = [of[r.device] for r in rows]
    for k, (attr, tattr, label) in enumerate((("latency_s", "transfer_s", "time per inference (s)"),
                                             ("energy_j", "transfer_j", "energy per inference (J)"))):
        ax = fig.add_subplot(2, 1, k + 1)
        own = [getattr(r, attr) for r in rows]
        extra = [getattr(r, tattr) for r in rows]
        _bars(ax, own, [0.0] * len(own), cols)
        _bars(ax, extra, own, [TRANSFER_COLOUR] * len(own))
        top = max((a + b for a, b in zip(own, extra)), default=0.0)
        if top > 0:
            ax.set_ylim(0, top * 1.08)  # the tallest bar does not touch the frame
        ax.set_ylabel(label)
        ax.set_xlim(-0.5, max(len(rows), 1) - 0.5)
        if k == 1:
            ax.set_xlabel("layer (graph order, an If's branches after it; a branch not "
                          "counted left out)")
    devs = list(dict.fromkeys(r.device for r in rows))
    handles = [Patch(color=_colour(d, seen), label=d) for d in devs]
    handles.append(Patch(color=TRANSFER_COLOUR, label="transfers"))
    # above the plots, beside the title, where no bar can hide under it
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, x=0.02, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _png(fig, plt)


def _bars(ax, heights: list, bottoms: list, colours: list) -> None:
    """Bars of width 1 centred on 0, 1, ... (``heights`` above ``bottoms``, each in its
    colour) drawn as one collection: ``Axes.bar`` makes a patch per bar, and an unrolled
    LSTM's 21811 layers took 200 s to add and draw (s24 trial: report 208 s)."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    x = np.arange(len(heights), dtype=float)
    lo = np.asarray(bottoms, dtype=float)
    hi = lo + np.asarray(heights, dtype=float)
    verts = np.stack([np.stack([x - 0.5, lo], 1), np.stack([x - 0.5, hi], 1),
                      np.stack([x + 0.5, hi], 1), np.stack([x + 0.5, lo], 1)], 1)
    ax.add_collection(PolyCollection(verts, facecolors=colours, linewidths=0))
    ax.autoscale_view()


#: graphs up to this many nodes get each node's op type written next to its dot
GRAPH_LABELS_UP_TO = 120


def plot_graph(model: onnx.ModelProto, rows: list[Layer], title: str = "") -> bytes:
    """PNG bytes (``PNG_SIZE``): the graph, one dot per node in its device's colour, placed by
    depth (longest path from the inputs, wrapped into bands of 40 columns), edges in grey, op
    types written beside the dots of graphs up to :data:`GRAPH_LABELS_UP_TO` nodes."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    nodes = model.graph.node[:]  # slices: see rewrite's note on repeated fields
    producer = {o: i for i, n in enumerate(nodes) for o in n.output[:] if o}
    depth = []
    edges = []
    for i, n in enumerate(nodes):
        preds = [producer[t] for t in n.input[:] if t in producer]
        edges += [(p, i) for p in preds]
        depth.append(1 + max((depth[p] for p in preds), default=-1))
    per_depth: dict = {}
    slot = []
    for i, d in enumerate(depth):
        slot.append(per_depth.get(d, 0))
        per_depth[d] = slot[-1] + 1
    width = max(per_depth.values(), default=1)
    wrap = 40
    pos = [(d % wrap, -((d // wrap) * (width + 1) + s)) for d, s in zip(depth, slot)]
    plt, fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    ax.add_collection(LineCollection([(pos[a], pos[b]) for a, b in edges if depth[b] // wrap == depth[a] // wrap],
                                     colors="#bbbbbb", linewidths=0.6, zorder=1))
    seen: list = []
    of = {d: _colour(d, seen) for d in dict.fromkeys(r.device for r in rows)}
    ax.scatter([p[0] for p in pos], [p[1] for p in pos], c=[of[r.device] for r in rows],
               s=[40 if r.cinm else 14 for r in rows], zorder=2, edgecolors="none")
    if len(rows) <= GRAPH_LABELS_UP_TO:  # small graphs: every node says what it is
        for (px, py), r in zip(pos, rows):
            ax.annotate(r.op, (px, py), xytext=(0, 5), textcoords="offset points", fontsize=7,
                        rotation=45, ha="left", va="bottom", color="#333333")
    devs = list(dict.fromkeys(r.device for r in rows))
    ax.legend(handles=[Patch(color=_colour(d, seen), label=d) for d in devs], loc="lower right", fontsize=8)
    ax.set_axis_off()
    ax.autoscale()
    ax.set_title(title or "graph: nodes by device (large dots: cinm ops)")
    fig.tight_layout()
    return _png(fig, plt)


#: The columns of :func:`table`. Names and shapes are shown whole: the layer and shape columns
#: are as wide as their cells up to 64 and 24 characters, a longer cell shifts the rest of its
#: line; the reason, last, is never cut.
COLUMNS = (Column("#", ">"), Column("layer", fit=64), Column("op", fit=12),
           Column("shape", ">", fit=24), Column("FLOPs", ">"), Column("device", fit=10),
           Column("latency", ">"), Column("energy", ">"), Column("writes", ">"),
           Column("moved", ">"), Column("energy by part", fit=36), Column("area", ">"),
           Column("reason"))


def _parts_text(r: Layer) -> str:
    """The op's energy by part in percent (``array 60%, adc_dac 30%, periphery 10%``); parts
    the device publishes only inside another's (``CostPart.folded``) are named after the part
    holding them, not given a 0%: ``array 100% (with adc_dac, periphery)``,
    ``array 0%, periphery 100% (with adc_dac)``."""
    tot = sum(p.energy_j for p in r.parts)
    if not tot:
        return ""
    inside: dict[str, list] = {}
    for p in r.parts:
        if p.folded:
            inside.setdefault(p.folded, []).append(p.term)
    return ", ".join(f"{p.term} {100 * p.energy_j / tot:.0f}%"
                     + (f" (with {', '.join(inside[p.term])})" if p.term in inside else "")
                     for p in r.parts if not p.folded)


def _area_text(r: Layer) -> str:
    area = sum(p.area_mm2 for p in r.parts)
    return f"{area:.4g} mm2" if area else ""


#: The figures :func:`table` shows of a folded row as the sum over its nodes (positions in
#: its raw row: FLOPs, latency, energy, writes, moved); the index cell lists the nodes'.
_SUMMED, _INDEX = (4, 6, 7, 8, 9), 0


def _indices(indices: list[int]) -> str:
    """The index cell of a (folded) row of the nodes at ``indices`` (ascending): ``7``, a run
    of consecutive ones ``3..6``, others listed (``3,5,9``; past three, the first two and the
    last: ``3,5,...,41``), so a range never covers a node that is not in the row."""
    if len(indices) == 1:
        return str(indices[0])
    if indices[-1] - indices[0] == len(indices) - 1:
        return f"{indices[0]}..{indices[-1]}"
    shown = indices if len(indices) <= 3 else [*indices[:2], "...", indices[-1]]
    return ",".join(map(str, shown))


def table(rows: list[Layer], totals: dict, cinm_only: bool = False, fold: bool = True) -> str:
    """The per-layer table as text, then the totals. ``cinm_only``: the cinm ops' rows only;
    a line before the totals then counts the rows left out (the standard ops the host runs)
    with their latency and energy, so the rows shown and that line add up to the totals.
    ``fold``: the nodes of one source op with the same op, shape, device and figures in one
    row ``<node> xN`` (:func:`onnx_cinm.text.fold_rows`; the steps of an unrolled recurrence),
    its figures the N nodes' sums, its index the nodes' (``first..last`` when consecutive,
    else listed: :func:`_indices`); False: one line per node. The
    totals are the same either way."""
    raw = [(r.index, r.name, r.op, r.shape, r.flops, r.device, r.latency_s + r.transfer_s,
            r.energy_j + r.transfer_j, r.writes, r.bytes_moved, _parts_text(r), _area_text(r),
            _reason_text(r)) for r in rows if r.cinm or not cinm_only]
    grouped = fold_rows(raw, name=1, times=_SUMMED, skip=(_INDEX,)) if fold \
        else [(list(c), [k]) for k, c in enumerate(raw)]
    body = [(_indices([raw[k][0] for k in m]), *c[1:4], si(c[4]),
             c[5], si(c[6], "s"), si(c[7], "J"), c[8], si(c[9], "B"), *c[10:])
            for c, m in grouped]
    hidden = [r for r in rows if cinm_only and not r.cinm and r.counted]
    left_out = [] if not hidden else [(
        f"{len(hidden)} {'/'.join(sorted({r.device for r in hidden}))} ops not shown ({si(sum(r.latency_s + r.transfer_s for r in hidden), 's')}, "
        f"{si(sum(r.energy_j + r.transfer_j for r in hidden), 'J')}, in the total): --all-nodes "
        "lists them")]
    folded = []
    if len(grouped) < len(raw):
        folded.append(f"({len(raw)} rows in {len(grouped)}: '<node> xN' stands for N nodes of "
                      "one source op, named by the first, with the same op, shape, device and "
                      "figures each, e.g. the steps of an unrolled recurrence; its FLOPs, "
                      "latency, energy, writes and moved are the N nodes' sums, its area one "
                      "node's; --all-nodes lists every node, layers.csv too)")
    return text_table(COLUMNS, body, notes=[
        *left_out,
        _totals_line(totals), *folded,
        ("(latency and energy include the transfers the cost model charges to the op, listed "
         "apart in the CSV and HTML; moved: bytes the op's device moves across its boundary by "
         "its own model, while the total counts only tensors that cross between devices; "
         "energy by part: the op's own energy split by its device's cost model (crossbars: the "
         "cells' array, the ADCs/DACs and the rest of the periphery), with latency and area in "
         "the CSV; area: the chip area the op occupies)"), *totals.get("notes", [])])


#: What the reason column says first of a row the totals do not count.
NOT_COUNTED = "not counted (the planning probe took the other branch)"


def _reason_text(r: Layer) -> str:
    return r.reason if r.counted else f"{NOT_COUNTED}; {r.reason}"


def _totals_line(t: dict) -> str:
    by = ", ".join(f"{d} {si(v[0], 's')} / {si(v[1], 'J')}" for d, v in sorted(t["by_device"].items()))
    ifs = if_rule(t.get("ifs", {}), "rows marked 'not counted'")
    line = (f"total{f' ({ifs})' if ifs else ''}: {si(t['latency_s'], 's')}, "
            f"{si(t['energy_j'], 'J')}, {t['writes']} tile "
            f"writes/inference, {si(t['transfer_bytes'], 'B')} across device boundaries "
            f"({si(t['transfer_s'], 's')}); by device: {by}")
    if t.get("by_part"):
        line += "; by part: " + ", ".join(
            f"{k} {si(v[0], 's')} / {'energy counted in the others' if v[2] else si(v[1], 'J')}"
            for k, v in t["by_part"].items())
    if t["violations"]:
        line += "; BREAKS: " + "; ".join(t["violations"][:3])
    return line


def _html(title: str, rows: list[Layer], totals: dict, pngs: dict) -> str:
    e = html.escape
    imgs = "".join(f'<h2>{e(cap)}</h2><img alt="{e(cap)}" width="{PNG_SIZE[0]}" height="{PNG_SIZE[1]}" '
                   f'src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                   for cap, data in pngs.items())
    head = ["#", "layer", "op", "shape", "FLOPs", "device", "latency (s)", "energy (J)",
            "transfers (s)", "transfers (B)", "writes/inf", "bytes moved", "energy by part",
            "area (mm2)", "reason"]
    body = "".join(
        "<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in (
            r.index, r.name, r.op, r.shape, r.flops, r.device, f"{r.latency_s:.4g}",
            f"{r.energy_j:.4g}", f"{r.transfer_s:.3g}", r.transfer_bytes, r.writes, r.bytes_moved,
            _parts_text(r), f"{sum(p.area_mm2 for p in r.parts):.4g}" if r.parts else "",
            _reason_text(r))) + "</tr>\n"
        for r in rows)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 4px;text-align:left}</style></head><body>"
            f"<h1>{e(title)}</h1><p>{e(_totals_line(totals))}</p>"
            + "".join(f"<p>{e(n)}</p>" for n in totals.get("notes", [])) +
            "<p>Modeled figures per inference (devices' cost models; host: the roofline "
            f"{e(totals['host_roofline'])}). "
            "Latency and energy are the op's own; transfers are listed apart.</p>"
            f"{imgs}<h2>Layers</h2><table><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}"
            f"</tr></thead><tbody>\n{body}</tbody></table></body></html>\n")


def write_report(model: onnx.ModelProto | str | Path, out_dir: str | Path, options: dict | None = None,
                 title: str | None = None) -> dict:
    """Write ``layers.csv``, ``time_energy.png``, ``graph.png``, ``report.html`` and
    ``wear.json`` into ``out_dir`` (created if missing) and return ``{"rows", "totals", "files"}``.

    Raises CinmError if the model cannot be read or the folder cannot be written.
    """
    from . import frontend

    rendered = render_report(model, options, title)
    rendered["files"] = frontend.write_files_into(out_dir, rendered["files"], "report")
    return rendered


def render_report(model: onnx.ModelProto | str | Path, options: dict | None = None,
                  title: str | None = None) -> dict:
    """The report's files in memory: ``{"rows", "totals", "files": {name: bytes}}`` with the
    files of :func:`write_report`; nothing is written. Raises CinmError if the model cannot
    be read."""
    from . import frontend

    if not isinstance(model, onnx.ModelProto):
        title = title or Path(model).name
        model = frontend.load_model(model)
    title = title or (model.graph.name or "model")
    rows, totals = layers(model, options)
    pngs = {"time and energy per layer, by device":
            plot_time_energy([r for r in rows if r.counted], title),
            "graph, nodes coloured by device":  # the main graph's nodes (branch rows: str index)
            plot_graph(model, [r for r in rows if isinstance(r.index, int)], title)}
    buf = io.StringIO()
    w = csv.writer(buf)
    terms = list(dict.fromkeys(p.term for r in rows for p in r.parts))
    # total_*: the table's figures (the op and the transfers charged to it), then the two apart
    w.writerow(["index", "layer", "op", "shape", "flops", "device", "total_latency_s",
                "total_energy_j", "latency_s", "energy_j",
                "transfer_s", "transfer_j", "transfer_bytes", "writes", "bytes_moved", "reason",
                "counted"]
               + [f"{t}_{q}" for t in terms for q in ("latency_s", "energy_j", "area_mm2")])
    for r in rows:
        part = {p.term: p for p in r.parts}
        w.writerow([r.index, r.name, r.op, r.shape, r.flops, r.device,
                    repr(r.latency_s + r.transfer_s), repr(r.energy_j + r.transfer_j),
                    repr(r.latency_s),
                    repr(r.energy_j), repr(r.transfer_s), repr(r.transfer_j), r.transfer_bytes,
                    r.writes, r.bytes_moved, r.reason, int(r.counted)]
                   + [repr(float(getattr(part[t], q)))
                      if t in part and not (part[t].folded and q != "latency_s") else ""
                      for t in terms for q in ("latency_s", "energy_j", "area_mm2")])
    files = {"layers.csv": buf.getvalue().encode(),
             "time_energy.png": pngs["time and energy per layer, by device"],
             "graph.png": pngs["graph, nodes coloured by device"],
             "report.html": _html(f"onnx-cinm report: {title}", rows, totals, pngs).encode(),
             "wear.json": (json.dumps({d: w.figures for d, w in totals["wear"].items()},
                                      indent=1, sort_keys=True) + "\n").encode()}
    return {"rows": rows, "totals": totals, "files": files}


def options_from_plans(model: onnx.ModelProto) -> dict:
    """The device options recorded in the model's plan attributes (each device's
    :meth:`Device.recorded_options`, e.g. the crossbars' size and count), so the report judges
    residency with the configuration the model was compiled for. Also ``host_roofline``: the
    host figures the model was optimized with (:func:`onnx_cinm.hostmodel.recorded`), if
    recorded."""
    from . import devices

    roof = hostmodel.recorded(model)
    out = {"host_roofline": roof} if roof is not None else {}
    plans: dict = {}
    for n in cinm.all_nodes(model.graph):  # If branches too: a model may lower only there
        if n.domain == cinm.DOMAIN:
            at = cinm.node_attrs(n)
            if at.get("device") in devices.device_names():
                plans.setdefault(at["device"], []).append((n.name, n.op_type, at))
    for dev, p in plans.items():
        out.update(devices.get_device(dev).recorded_options(p))
    return out
