"""Emit one ``.xbar`` command file (plus ``.npy`` sidecars) per crossbar kernel.

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

from pathlib import Path

import jinja2
import numpy as np

from ...sim.crossbar import COST_KEYS, FORMAT_VERSION
from ...sim.crossbar.mode import IDEAL

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("onnx_cinm", "templates"), keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined, autoescape=False)


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
        t["x"] = j % P
    rounds = [tiles[r:r + P] for r in range(0, len(tiles), P)]
    return ([] if plan.shared else tiles[:P]), rounds


def render(plan, params, name: str, weight_file: str, bias_file: str | None = None, *,
           mode=None, int_cells=None) -> str:
    """The text of the ``.xbar`` file for ``plan`` (see ``docs/xbar-format.md``).

    ``mode``: a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode`; None is ideal.
    ``int_cells``: header lines ``[(key, value)]`` of an integer kernel (``dtype int32``, its
    weights in cells as they are; :func:`onnx_cinm.devices.memristor.int_cells`), ideal mode.
    """
    mode = IDEAL if mode is None else mode
    load, rounds = schedule_rounds(plan)
    naive = plan.loop_order == "naive"
    cost = {k: repr(float(getattr(params, k))) for k in COST_KEYS}
    return _ENV.get_template("memristor/kernel.xbar.j2").render(
        version=FORMAT_VERSION, name=name, plan=plan, cost=cost, load=load, rounds=rounds,
        order="fixed" if (naive or plan.resident or plan.shared) else "serpentine",
        residency="off" if (naive or plan.shared) else "on", loop_rows=plan.m_block if naive else 0,
        weight_file=weight_file, bias={"name": "C", "file": bias_file} if bias_file else None,
        dtype="int32" if int_cells else "float32",
        mode_lines=mode.header_items() + list(int_cells or ()))


def emit_kernel(plan, params, W: np.ndarray | None, outdir, name: str,
                bias: np.ndarray | None = None, *, mode=None, int_cells=None,
                weight_file: str | None = None) -> list[Path]:
    """Write ``<name>.xbar``, ``<name>.W.npy`` (float32 ``[G, K, N]``) and, with a bias,
    ``<name>.C.npy`` into ``outdir``; return the paths written (the ``.xbar`` first).

    ``mode``: a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` written into the
    header (None: ideal). The weights are written unquantized; the simulator quantizes them at
    load (per-output-channel scales are a function of the weights). ``int_cells``: an integer
    kernel (see :func:`render`): weights and bias are written as int32.

    ``W`` may be ``[K, N]`` (one group). ``weight_file`` (with ``W`` None): the file names this
    sidecar of another kernel over the same weights in ``outdir`` instead of writing its own.
    Raises ValueError if the shape of ``W`` disagrees with ``plan``.
    """
    dtype = np.int32 if int_cells else np.float32  # integer weights stay integers
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.xbar"]
    if weight_file is None:
        W = np.asarray(W, dtype=dtype)
        if W.ndim == 2:
            W = W[None]
        if W.shape != (plan.groups, plan.K, plan.N):
            raise ValueError(f"weights {W.shape} do not match the plan "
                             f"({plan.groups}, {plan.K}, {plan.N})")
        wpath = out / f"{name}.W.npy"
        np.save(wpath, W)
        paths.append(wpath)
        weight_file = wpath.name
    bfile = None
    if bias is not None:
        bpath = out / f"{name}.C.npy"
        np.save(bpath, np.asarray(bias, dtype=dtype))
        paths.append(bpath)
        bfile = bpath.name
    paths[0].write_text(render(plan, params, name, weight_file, bfile, mode=mode, int_cells=int_cells))
    return paths
