"""Emit one ``.xbar`` command file per crossbar kernel.

A compiled model's kernels name the model's own tensors as their weights (:func:`model_source`,
written by the device's ``emit``): the weights live once, in the ``.onnx``. :func:`emit_kernel`
writes a self-contained kernel with ``.npy`` sidecars, for the simulator on its own.

The schedule written is exactly the one :func:`~onnx_cinm.paradigms.cim.schedule.plan`
counts: tiles in ``(g, k, n)`` order, tile ``j`` on crossbar ``j mod P``, rounds of ``P`` tiles
ended by a barrier; weight-stationary files load the first ``P`` tiles and run ``order
serpentine`` with residency on; naive files wrap the rounds (per ``(g, n)``, ``P`` k tiles per
round) in ``FOR ROWS m_block`` with residency off (a write before every use, as CINM lowers).

``mode`` (a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode`, default ideal) only
writes header lines (``mode quantized`` and its parameters); the schedule is the same in every
mode (the slices of a quantized tile sit in parallel arrays of one logical crossbar).
"""
from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

import numpy as np

from ..base import render as render_template
from ..base import template
from ...sim.crossbar import COST_KEYS, FORMAT_VERSION, MODEL_SOURCE
from ...sim.crossbar.mode import IDEAL


def _tiles(plan) -> list[dict]:
    return [{"g": g, "k": k, "n": n} for g in range(plan.groups) for k in range(plan.Kt)
            for n in range(plan.Nt)]


def schedule_rounds(plan) -> tuple[list[dict], list[list[dict]]]:
    """``(tiles programmed at load, rounds of one inference)``; each tile ``{x, g, k, n}``."""
    P = plan.crossbars
    if plan.loop_order == "naive":
        rounds = []
        for g in range(plan.groups):
            for n in range(plan.Nt):
                ks = list(range(plan.Kt))
                for r in range(0, len(ks), P):
                    rounds.append([{"x": i, "g": g, "k": k, "n": n}
                                   for i, k in enumerate(ks[r:r + P])])
        return [], rounds
    tiles = _tiles(plan)
    for j, t in enumerate(tiles):
        t["x"] = (plan.first + j) % P  # (first: 0 unless it streams through a shared pool)
    rounds = [tiles[r:r + P] for r in range(0, len(tiles), P)]
    return ([] if plan.shared else tiles[:P]), rounds


def model_source(tensor: str) -> str:
    """The source of a constant region naming the model's tensor ``tensor``: ``model:`` and
    the name percent-encoded (a name may hold spaces or ``#``, which end a token or start a
    comment in a ``.xbar`` file)."""
    return MODEL_SOURCE + urllib.parse.quote(tensor, safe="")


def render(plan, params, name: str, weight_file: str, bias_file: str | None = None, *,
           mode=None, int_cells=None) -> str:
    """The text of the ``.xbar`` file for ``plan`` (see ``docs/xbar-format.md``).

    ``weight_file``/``bias_file``: where the constants come from: a ``.npy`` sidecar name or
    :func:`model_source` of a tensor of the model. ``mode``: a
    :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode`; None is ideal.
    ``int_cells``: header lines ``[(key, value)]`` of an integer kernel (``dtype int32``, its
    weights in cells as they are; :func:`onnx_cinm.devices.memristor.int_cells`), ideal mode.
    """
    return fill(render_parts(plan, params, bias_file is not None, mode=mode, int_cells=int_cells),
                name, weight_file, bias_file)


#: stand-ins :func:`render_parts` renders in place of the name and the sources (a NUL is in no
#: other text of the file: the template's, numbers, keywords)
_SLOTS = ("\0name\0", "\0weight\0", "\0bias\0")
_SLOT_SPLIT = re.compile("(" + "|".join(_SLOTS) + ")")


def fill(parts: tuple, name: str, weight_file: str, bias_file: str | None) -> str:
    """The text :func:`render` gives, from :func:`render_parts` ``(plan, params, bias_file is
    not None, ...)``: the name and the sources put in."""
    values = (name, weight_file, bias_file)
    return "".join([values[p] if type(p) is int else p for p in parts])


def text_key(plan) -> tuple:
    """The fields of ``plan`` that :func:`render_parts` writes (through the template and
    :func:`schedule_rounds`): plans with the same key give the same text with the same
    ``params``, mode and bias. The streamed rows ``M`` and the counts that follow from them
    (MVMs, conversions, ``Mt``) are not written."""
    return (plan.groups, plan.K, plan.N, plan.rows, plan.cols, plan.crossbars, plan.loop_order,
            plan.m_block, plan.Kt, plan.Nt, plan.tiles, plan.resident, plan.shared,
            plan.writes_load, plan.writes_per_inference, plan.first)


def render_parts(plan, params, bias: bool, *, mode=None, int_cells=None) -> tuple:
    """The text of :func:`render` around the kernel's name and its weight and bias sources, for
    a kernel with a bias or without (``bias``): a tuple of strings and slot numbers (0 the name,
    1 the weight source, 2 the bias source), which :func:`fill` joins. Kernels of one plan,
    array and mode share it (rendering it is most of :func:`render`'s work: a tile set of
    thousands of lines)."""
    text = _render(plan, params, _SLOTS[0], _SLOTS[1], _SLOTS[2] if bias else None, mode=mode,
                   int_cells=int_cells)
    return tuple(_SLOTS.index(p) if i % 2 else p for i, p in enumerate(_SLOT_SPLIT.split(text)))


def _render(plan, params, name: str, weight_file: str, bias_file: str | None = None, *,
            mode=None, int_cells=None) -> str:
    mode = IDEAL if mode is None else mode
    load, rounds = schedule_rounds(plan)
    naive = plan.loop_order == "naive"
    # the header's key-value lines and the per-tile lines are joined here, not looped over in
    # the template: a kernel has thousands of tile lines (3 per tile and round), and Jinja's
    # loops took most of the rendering (the header's: a third of what was left)
    cost_lines = "".join([f"cost {k} {float(getattr(params, k))!r}\n" for k in COST_KEYS])
    mode_lines = "".join([f"{k} {v}\n" for k, v in mode.header_items() + list(int_cells or ())])
    load_lines = "".join([f"PROGRAM {t['x']} W {t['g']} {t['k']} {t['n']}\n" for t in load])
    round_lines = "".join([
        "".join([f"PROGRAM {x} W {g} {k} {n}\nMVM {x} X {g} {k}\nACC Y {g} {n} {x}\n"
                 for x, g, k, n in ((t["x"], t["g"], t["k"], t["n"]) for t in r)]) + "BARRIER\n"
        for r in rounds])
    return render_template(template("memristor/kernel.xbar.j2"),
        version=FORMAT_VERSION, name=name, plan=plan, cost_lines=cost_lines,
        load_lines=load_lines, round_lines=round_lines,
        order="fixed" if (naive or plan.resident or plan.shared) else "serpentine",
        residency="off" if (naive or plan.shared) else "on", loop_rows=plan.m_block if naive else 0,
        weight_file=weight_file, bias={"name": "C", "file": bias_file} if bias_file else None,
        dtype="int32" if int_cells else "float32",
        mode_lines=mode_lines)


def emit_kernel(plan, params, W: np.ndarray, outdir, name: str,
                bias: np.ndarray | None = None, *, mode=None, int_cells=None) -> list[Path]:
    """Write a self-contained kernel for the simulator on its own: ``<name>.xbar``,
    ``<name>.W.npy`` (float32 ``[G, K, N]``) and, with a bias, ``<name>.C.npy`` into ``outdir``;
    return the paths written (the ``.xbar`` first). (A compiled model's kernels name the model's
    tensors instead: :func:`model_source`.)

    ``mode``: a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` written into the
    header (None: ideal). The weights are written unquantized; the simulator quantizes them at
    load (per-output-channel scales are a function of the weights). ``int_cells``: an integer
    kernel (see :func:`render`): weights and bias are written as int32.

    ``W`` may be ``[K, N]`` (one group). Raises ValueError if its shape disagrees with ``plan``.
    """
    dtype = np.int32 if int_cells else np.float32  # integer weights stay integers
    W = np.asarray(W, dtype=dtype)
    if W.ndim == 2:
        W = W[None]
    if W.shape != (plan.groups, plan.K, plan.N):
        raise ValueError(f"weights {W.shape} do not match the plan "
                         f"({plan.groups}, {plan.K}, {plan.N})")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    wpath = out / f"{name}.W.npy"
    np.save(wpath, W)
    paths = [out / f"{name}.xbar", wpath]
    bfile = None
    if bias is not None:
        bpath = out / f"{name}.C.npy"
        np.save(bpath, np.asarray(bias, dtype=dtype))
        paths.append(bpath)
        bfile = bpath.name
    paths[0].write_text(render(plan, params, name, wpath.name, bfile, mode=mode, int_cells=int_cells))
    return paths
