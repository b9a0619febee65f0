"""Memristor crossbar device (paradigm ``cim``): weight-stationary matrix products in place.

Chip presets (geometry, cost, precision, device physics, each constant with its source) are in
:mod:`.presets`; the default, ``pcm-occ``, follows OCC's published model (Siemieniuk et al., "OCC", IEEE TCAD 41(6), 2022; the
numbers are from its evaluation data, ``adam-smnk/Open-CIM-Compiler`` branch ``sim_build``,
``data/CIM_parallelization_factor.xlsx`` and ``data/CIM_stats.xlsx``; see
``shared/field-notes/crossbar.md`` §1.4). One "write" here is the programming of one whole
crossbar tile (``rows x cols`` cells), as in OCC's write counts.

Tiles, loop orders, residency and the product views are the cim paradigm's
(:mod:`onnx_cinm.paradigms.cim`; :class:`CrossbarParams` is its ``CrossbarArray``); this package
keeps the chip presets, device physics and non-idealities, the ``.xbar`` code generator and the
simulator adapter.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...errors import CinmError
from ...options import option
from ...paradigms.cim import layout, residency, schedule
from ...paradigms.cim.schedule import LOOP_ORDERS
from ...text import Column, si, table
from .. import register
from ..base import Cost, Device, OpInfo, Priced, Resources, Support
from . import codegen
from .nonideal import EFFECTS, NAMED
from .presets import PCM_HERMES, PCM_OCC, PRESETS, RERAM_ISAAC, RRAM_NEURRAM, CrossbarParams


@dataclass(frozen=True)
class CrossbarOptions:
    """The crossbar device's options (keys ``cim_<field>``; CLI ``--cim-<field>``)."""

    preset: str | None = option(None, help="crossbar chip preset: geometry, cost and device "
                                "parameters (sources in docs/crossbar-presets.md and 'onnx-cinm "
                                "devices'; default pcm-occ)", choices=lambda: tuple(PRESETS))
    rows: int | None = option(None, help="cells per crossbar column (default: the preset's, 64 "
                              "for pcm-occ, 128 for reram-isaac)", low=1, high=1 << 16)
    cols: int | None = option(None, help="cells per crossbar row (default: the preset's)",
                              low=1, high=1 << 16)
    crossbars: int | None = option(None, help="crossbars P shared by all crossbar kernels "
                                   "(default: the preset's, 4 for pcm-occ)", low=1, high=1 << 24)
    loop_order: str = option("weight_stationary", help="tile schedule: weight_stationary "
                             "(k, n, m: each weight tile written once and kept, serpentine "
                             "order) or naive (m, n, k: every tile rewritten per input row, for "
                             "comparison)", choices=lambda: tuple(LOOP_ORDERS))
    mode: str = option("ideal", help="data path of the emitted kernels: 'ideal' (exact fp32), "
                       "'q8' (8-bit weights with per-channel scales on 2-bit cells in "
                       "differential pairs, 8-bit DAC and ADC), 'q8-noisy' (q8 plus 2% seeded "
                       "read noise) or 'device' (the preset's precision and device physics, "
                       "docs/xbar-format.md); the check compares the exact reference bodies",
                       choices=lambda: tuple(NAMED))
    time_s: float = option(0.0, help="time after programming at which the device effects are "
                           "taken (0: just programmed)", unit="s", low=0.0)
    effects: tuple | None = option(None, help="the device effects of the mode (default: the "
                                   "mode's own; 'none' for none)", choices=lambda: tuple(EFFECTS))
    link_gbps: float | None = option(None, help="host<->crossbar link bandwidth (default 6.4, an "
                                     "assumption: ISAAC's HyperTransport order)", unit="GB/s",
                                     low=1e-6)


#: The options a crossbar plan reads (:func:`params_from_options` and the loop order).
_PLAN_OPTIONS = ("cim_preset", "cim_rows", "cim_cols", "cim_crossbars", "cim_loop_order",
                 "cim_mode", "cim_time_s", "cim_effects")

#: Host<->crossbar link, an *assumption*: one 6.4 GB/s off-chip link (the order of ISAAC's
#: HyperTransport link, recalled), 20 pJ/byte (the UPMEM cost model's host transfer estimate,
#: ``UpmemParams.host_xfer_j_per_byte``). The crossbar plan's own cost counts only the
#: DAC/MVM/ADC work. Override the bandwidth with option ``cim_link_gbps``.
LINK_BYTES_PER_S = 6.4e9
LINK_J_PER_BYTE = 20e-12

#: The plan attributes of a crossbar kernel (counts are tile writes and MVMs; times in
#: seconds, energies in joules, per inference unless ``_load``; ``cim_crossbars`` is what the
#: kernel uses, ``cim_device_crossbars`` the crossbars all kernels of the model share).
PLAN_ATTRS = {
    "cim_rows": "int", "cim_cols": "int", "cim_crossbars": "int", "cim_shared": "int",
    "cim_device_crossbars": "int", "cim_loop_order": "string", "cim_operand": "string",
    "cim_M": "int", "cim_K": "int", "cim_N": "int", "cim_groups": "int",
    "cim_tiles": "int", "cim_resident": "int", "cim_writes_load": "int",
    "cim_writes": "int", "cim_mvms": "int", "cim_latency_s": "float",
    "cim_energy_j": "float", "cim_mode": "string", "cim_preset": "string",
    "cim_time_s": "float", "cim_effects": "string",
}

#: Memo of :meth:`MemristorDevice.plan`, per parameter set: a plan depends only on the
#: product's shapes and operand constness, the options above and the crossbar count; placement
#: asks for the same plans many times (candidates, lowering, every polishing move). Plans are
#: immutable.
_PLANS: dict = {}
_PLANS_MAX = 20000


def _options_key(options: dict) -> tuple:
    return tuple(tuple(v) if isinstance(v, list) else v
                 for v in (options.get(k) for k in _PLAN_OPTIONS))


def params_from_options(options: dict, base: CrossbarParams = PCM_OCC) -> CrossbarParams:
    """The crossbar parameters selected by pass options (checked against
    :class:`CrossbarOptions` by the caller, :func:`onnx_cinm.passes.check_options`).

    Keys (all optional): ``cim_preset`` (a name of :data:`PRESETS`), ``cim_rows``, ``cim_cols``
    (cells per crossbar), ``cim_crossbars`` (``P``).
    """
    preset = options.get("cim_preset")
    if preset is not None:
        base = PRESETS[preset]
    over = {name: options[f"cim_{name}"] for name in ("rows", "cols", "crossbars")
            if options.get(f"cim_{name}") is not None}
    return replace(base, **over) if over else base


class MemristorDevice(Device):
    """Memristor crossbars: runs cinm Gemm and Gemv with one operand programmed into the cells.

    The programmed operand is the constant one (the weights, programmed once at load when they
    fit, see :mod:`.schedule`); a product of two activations can be placed here by a hint, and
    then the operand needing fewer tile writes is programmed every inference. Its nodes always
    run their ``.xbar`` file in the crossbar simulator (mode ``simulate``).
    """

    name = "memristor"
    paradigm = "cim"
    option_prefix = "cim"
    Options = CrossbarOptions
    attr_prefix = "cim"
    plan_attrs = PLAN_ATTRS
    modes = ("simulate",)
    plans_together = True

    def __init__(self, params: CrossbarParams = PCM_OCC):
        self.params = params

    def catalog(self) -> list[str]:
        """The chip presets for ``onnx-cinm devices``: each preset's summary and every field
        with its source (``*``: no primary source)."""
        out = ["presets (--cim-preset; fields marked * have no primary source):"]
        for name, p in PRESETS.items():
            out.append(f"  {name}: {p.summary()}")
            for key, src in p.sources:
                mark = "*" if key in p.unverified else " "
                out.append(f"    {mark}{key}: {getattr(p, key)} ({src})")
        return out

    def preset(self, name: str) -> CrossbarParams:
        """The parameters of chip preset ``name`` (KeyError if unknown)."""
        return PRESETS[name]

    # -- what it runs ---------------------------------------------------------------------
    def supports(self, op: OpInfo) -> Support:
        if op.op_type not in ("Gemm", "Gemv"):
            return Support(False, f"crossbars only compute matrix products, not {op.op_type}",
                           applicable=False)
        if len(op.inputs) < 2 or any(t.shape is None for t in op.inputs[:2]):
            return Support(False, "operand shapes unknown")
        for t in op.inputs[:2]:
            if t.dtype is None or np.dtype(t.dtype).name not in self.params.dtypes:
                return Support(False, f"dtype {t.dtype} not in {list(self.params.dtypes)}")
        if op.op_type == "Gemm" and (len(op.inputs[0].shape) < 2 or len(op.inputs[1].shape) < 2):
            return Support(False, "a Gemm operand has rank < 2")
        if op.op_type == "Gemm" and op.inputs[0].static_shape[-1] != op.inputs[1].static_shape[-2]:
            # a symbolic contracted dim taken as 1 against the weight's real one: no tiling exists
            return Support(False, f"contracted dim unknown at planning time "
                                  f"({op.inputs[0].shape} x {op.inputs[1].shape})")
        a, b = op.inputs[0].shape, op.inputs[1].shape
        if any(not isinstance(d, int) for d in b) or \
                (len(b) > 2 and any(not isinstance(d, int) for d in a[:-2])):
            # the programmed operand's tiles and group count are fixed at planning: a dim taken
            # as 1 there would not match the arrays at run time (only A's rows may vary)
            return Support(False, f"a weight or group dim unknown at planning time ({a} x {b}); "
                                  "size it with --dim NAME=SIZE")
        macs = op.flops // 2
        if macs < self.params.min_macs:
            return Support(False, f"{macs} MACs < {self.params.min_macs} (less than one tile of work)")
        operand, why = layout.constant_operand(op)
        if operand is None:
            return Support(True, f"{why}: the cheaper one would be reprogrammed every inference",
                           preferred=False)
        return Support(True, f"matrix product, {why}, {macs} MACs: weight-stationary on crossbars")

    # -- plan -------------------------------------------------------------------------------
    def plan(self, op: OpInfo, options: dict | None = None, *, crossbars: int | None = None,
             shared: bool = False) -> tuple:
        """``(CrossbarPlan, ProductView, params, programmed operand is constant, why)`` for ``op``
        alone on the device (or on ``crossbars`` of them, ``shared`` with other kernels: see
        :meth:`lower`).

        Options: see :func:`params_from_options`, plus ``cim_loop_order`` (``weight_stationary``
        or ``naive``). Raises CinmError on bad options.
        """
        options = options or {}
        return self._entry(op, options, _options_key(options), crossbars, shared)[0]

    def _entry(self, op: OpInfo, options: dict, okey: tuple, crossbars: int | None,
               shared: bool) -> list:
        """The memo entry of :meth:`plan`: ``[plan tuple, price figures (see :meth:`price_all`)
        or None until asked]``; ``okey`` is ``_options_key(options)``."""
        memo = _PLANS.get(id(self.params))
        if memo is None or memo[0] is not self.params:
            if len(_PLANS) > 8:
                _PLANS.clear()
            memo = _PLANS[id(self.params)] = (self.params, {})
        a, b = (op.inputs + (None, None))[:2]
        key = (okey, crossbars, shared, op.op_type, a and (a.dtype, a.shape, a.const),
               b and (b.dtype, b.shape, b.const))
        try:
            hit = memo[1].get(key)
        except TypeError:  # an unhashable option value: _plan names what is wrong with it
            return [self._plan(op, options, crossbars, shared), None]
        if hit is None:
            hit = [self._plan(op, options, crossbars, shared), None]
            if len(memo[1]) > _PLANS_MAX:
                memo[1].clear()
            memo[1][key] = hit
        return hit

    def _plan(self, op: OpInfo, options: dict, crossbars: int | None, shared: bool) -> tuple:
        params = params_from_options(options, self.params)
        order = options.get("cim_loop_order") or CrossbarOptions.loop_order
        operand, const, why = layout.choose_operand(op, params)
        v = layout.op_view(op, operand)
        # a programmed activation changes every inference: nothing can stay resident
        shared = (shared or not const) and LOOP_ORDERS[order] == "weight_stationary"
        p = schedule.plan_product(v, params, order, crossbars=crossbars, shared=shared)
        return p, v, params, const, why

    def check_options(self, options: dict) -> None:
        """CinmError if the data path options do not go together: effects for mode ``ideal``,
        mode ``device`` or physical effects without a chip preset (:func:`.nonideal.compose`)."""
        _validate(options, self.params)

    def cost(self, op: OpInfo, options: dict | None = None) -> Cost:
        """Modeled cost of one steady-state inference of ``op`` alone on the device (writes in
        whole tiles)."""
        p, _, params, _, _ = self.plan(op, options)
        return p.cost(params)

    def resources(self, options: dict) -> Resources:
        """The ``P`` crossbars all crossbar kernels share (``cim_crossbars`` or the preset's)."""
        return Resources(crossbars=params_from_options(options, self.params).crossbars)

    def price(self, op: OpInfo, options: dict) -> list[Priced]:
        """Two ways to run ``op``: *pinned* (its tiles kept programmed in crossbars of its own,
        priced as if alone; ``kept_crossbars`` = tiles kept) and *streamed* (through crossbars
        shared with other kernels: every tile written every inference, nothing kept). A kernel
        that keeps nothing (an activation programmed, or the naive order) has only the second.
        Raises CinmError on bad options."""
        p, _, params, _, _ = self.plan(op, options)
        alone = p.cost(params)
        if not p.writes_load:
            return [Priced(alone, streamed=True)]
        out = [Priced(alone, kept_crossbars=p.writes_load)]
        try:
            ps, _, params, _, _ = self.plan(op, options, shared=True)
            out.append(Priced(ps.cost(params), streamed=True))
        except CinmError:
            pass
        return out

    def transfer_cost(self, nbytes: int, to_device: bool, options: dict) -> Cost:
        """``nbytes`` over the host<->crossbar link (:data:`LINK_BYTES_PER_S`, or option
        ``cim_link_gbps``; :data:`LINK_J_PER_BYTE`)."""
        gbps = options.get("cim_link_gbps")
        bps = LINK_BYTES_PER_S if gbps is None else float(gbps) * 1e9
        return Cost(nbytes / bps, nbytes * LINK_J_PER_BYTE, 0, nbytes)

    def lower(self, items: list) -> list[dict]:
        """The plans of all the crossbar kernels of a model, which share the device's ``P``
        crossbars; ``items`` is ``[(OpInfo, options)]`` in execution order. Returns one dict of
        ``cim_*`` node attributes plus ``kernel`` per item.

        Allocation: the cim paradigm's residency rule
        (:func:`onnx_cinm.paradigms.cim.residency.allocate`): all kernels resident when their
        tiles fit together, else the knapsack pins whole kernels in ``P - 1`` crossbars and the
        rest stream through the others (``shared`` when several do); the naive order keeps no
        tile and needs no allocation.

        ``cim_crossbars`` is the number of crossbars the kernel uses, ``cim_device_crossbars``
        the ``P`` all kernels share; ``cim_shared`` says whether other kernels use them too.
        Raises CinmError on bad options.
        """
        return self._lower(items, self._attrs)

    def lower_paradigm(self, items: list) -> list[dict]:
        """The cim paradigm's part of :meth:`lower`: the tiles, loop order, operand, crossbars
        and residency (write and MVM counts) of each kernel, without the modeled cost, the
        data-path mode and the kernel path. Raises CinmError on bad options."""
        return self._lower(items, self._paradigm_attrs)

    def _lower(self, items: list, attrs_of) -> list[dict]:
        if not items:
            return []
        _validate(items[0][1], self.params)
        P, planned = self._allocate(items)
        out = []
        for (op, opts), e in zip(items, planned):
            attrs = attrs_of(op, opts, *e[0])
            attrs["cim_device_crossbars"] = P
            out.append(attrs)
        return out

    def price_all(self, items: list) -> list[Priced]:
        """What :meth:`lower`'s plans cost, without building the node attributes: per item the
        per-inference cost (tile writes per inference in ``cost.writes``), the tiles kept
        (``kept_crossbars``) and whether the kernel streams (shares crossbars or rewrites
        tiles). Raises CinmError on bad options."""
        if not items:
            return []
        _validate(items[0][1], self.params)
        out = []
        for e in self._allocate(items)[1]:
            if e[1] is None:
                p, _, params, _, _ = e[0]
                e[1] = Priced(p.cost(params), kept_crossbars=p.writes_load,
                              streamed=bool(p.shared) or p.writes_per_inference > 0)
            out.append(e[1])
        return out

    def recorded(self, attrs: dict) -> Priced | None:
        """The choice a lowered crossbar node made, from its ``cim_*`` attributes."""
        if "cim_latency_s" not in attrs:
            return None
        writes = int(attrs["cim_writes"])
        return Priced(Cost(float(attrs["cim_latency_s"]), float(attrs["cim_energy_j"]), writes, 0),
                      kept_crossbars=int(attrs.get("cim_writes_load", 0)),
                      streamed=bool(attrs.get("cim_shared", 0)) or writes > 0)

    def _allocate(self, items: list) -> tuple[int, list]:
        """``(P, [memo entry of :meth:`_entry` per item])`` under the allocation of
        :meth:`lower`."""
        options = items[0][1]
        params = params_from_options(options, self.params)
        P = params.crossbars
        okeys: dict = {}
        for _, opts in items:
            if id(opts) not in okeys:
                okeys[id(opts)] = _options_key(opts)

        def entry(op, opts, crossbars=None, shared=False):
            return self._entry(op, opts, okeys[id(opts)], crossbars, shared)

        alone = [entry(op, opts) for op, opts in items]
        order = LOOP_ORDERS[alone[0][0][0].loop_order]
        if order != "weight_stationary":
            return P, alone
        tiles = [a[0][0].tiles for a in alone]
        const = [a[0][3] for a in alone]
        return P, [entry(op, opts, used, shared) for (op, opts), (used, shared)
                   in zip(items, residency.allocate(tiles, const, P))]

    @staticmethod
    def _paradigm_attrs(op, options, p, v, params, const, why) -> dict:
        """The cim paradigm's attributes of plan ``p`` of view ``v`` (see :meth:`lower_paradigm`)."""
        attrs = {
            "cim_rows": p.rows, "cim_cols": p.cols, "cim_crossbars": p.crossbars,
            "cim_shared": int(p.shared), "cim_loop_order": p.loop_order,
            "cim_operand": v.operand, "cim_M": p.M, "cim_K": p.K, "cim_N": p.N,
            "cim_groups": p.groups, "cim_tiles": p.tiles, "cim_resident": int(p.resident),
            "cim_writes_load": p.writes_load, "cim_writes": p.writes_per_inference,
            "cim_mvms": p.mvms,
        }
        if not const:  # the placement reason does not say which activation is programmed
            attrs["placement"] = f"{op.attrs.get('placement', '')}; {why}"
        return attrs

    def _attrs(self, op, options, p, v, params, const, why) -> dict:
        c = p.cost(params)
        mode = options.get("cim_mode") or CrossbarOptions.mode
        time_s = options.get("cim_time_s", CrossbarOptions.time_s)
        effects = options.get("cim_effects")  # checked with the mode by lower (_validate)
        paradigm = self._paradigm_attrs(op, options, p, v, params, const, why)
        note = paradigm.pop("placement", None)
        attrs = {
            **paradigm, "cim_latency_s": float(c.latency_s),
            "cim_energy_j": float(c.energy_j), "cim_mode": mode,
            "kernel": f"memristor/{options['kernel_stem']}.xbar",
        }
        if params.name != PCM_OCC.name:  # absent: the default preset (models written before)
            attrs["cim_preset"] = params.name
        if mode != "ideal" and time_s:
            attrs["cim_time_s"] = float(time_s)
        if effects is not None:
            attrs["cim_effects"] = ",".join(effects)
        if note is not None:
            attrs["placement"] = note
        return attrs

    def inexact(self, attrs: dict, mode: str) -> str | None:
        """A crossbar data path other than ``ideal`` (``cim_mode``: q8, q8-noisy, device) is
        inexact by design."""
        m = attrs.get("cim_mode")
        return f"crossbar data path {m}" if m and m != "ideal" else None

    # -- reports ----------------------------------------------------------------------------
    def summary(self, plans: list) -> str:
        """Per crossbar kernel: crossbars used (``s``: shared with other kernels), tiles, tile
        writes (at load / per inference), MVMs, modeled latency and energy per inference (OCC
        cost model); then the totals. ``plans`` is ``[(node name, op type, attrs)]``."""
        plans = [p for p in plans if "cim_M" in p[2]]
        if not plans:
            return ""
        cols = (Column("crossbar kernel", width=30), Column("operand", ">"), Column("M x K x N", ">"),
                Column("xbars", ">"), Column("tiles", ">"), Column("writes@load", ">"),
                Column("writes/inf", ">"), Column("MVMs", ">"), Column("latency", ">"),
                Column("energy", ">"))
        rows = []
        tot = {"tiles": 0, "wl": 0, "w": 0, "mvms": 0, "lat": 0.0, "en": 0.0}
        for name, _op, a in plans:
            mkn = f"{a['cim_M']}x{a['cim_K']}x{a['cim_N']}" + (f"x{a['cim_groups']}g" if a["cim_groups"] > 1 else "")
            xb = f"{a['cim_crossbars']}{'s' if a.get('cim_shared') else ''}"
            rows.append((name, a["cim_operand"], mkn, xb, a["cim_tiles"], a["cim_writes_load"],
                         a["cim_writes"], a["cim_mvms"], si(a["cim_latency_s"], "s"),
                         si(a["cim_energy_j"], "J")))
            for k, key in (("tiles", "cim_tiles"), ("wl", "cim_writes_load"), ("w", "cim_writes"),
                           ("mvms", "cim_mvms"), ("lat", "cim_latency_s"), ("en", "cim_energy_j")):
                tot[k] += a[key]
        # crossbars in use: each resident kernel's own, plus the streaming pool once
        pool = [a["cim_crossbars"] for *_, a in plans if not a["cim_resident"]]
        used = sum(a["cim_crossbars"] for *_, a in plans if a["cim_resident"]) + max(pool, default=0)
        total = (f"total ({len(plans)} kernels)", "", "", used, tot["tiles"], tot["wl"], tot["w"],
                 tot["mvms"], si(tot["lat"], "s"), si(tot["en"], "J"))
        a0 = plans[0][2]
        note = (f"(crossbars of {a0['cim_rows']}x{a0['cim_cols']} shared by the model, "
                f"{a0['cim_loop_order']} order, {a0['cim_mode']} mode; resident kernels keep "
                "their tiles, the others stream through the rest ('s': evicted by each other); "
                "latency and energy per inference, kernels one after another)")
        return table(cols, rows, totals=[total], notes=[note])

    def recorded_options(self, plans: list) -> dict:
        """The crossbar options the plans were compiled with (``cim_rows``, ``cim_cols``,
        ``cim_loop_order`` and the crossbar count ``cim_device_crossbars`` of the first
        kernel), so a report judges residency with the crossbars the model was compiled for.
        Models written before ``cim_device_crossbars`` existed give the largest
        ``cim_crossbars`` of a kernel (a lower bound). ``plans`` as in :meth:`summary`."""
        plans = [a for *_, a in plans if "cim_rows" in a]
        if not plans:
            return {}
        at = plans[0]
        count = at.get("cim_device_crossbars") or max(a["cim_crossbars"] for a in plans)
        return {"cim_rows": at["cim_rows"], "cim_cols": at["cim_cols"],
                "cim_crossbars": count, "cim_loop_order": at["cim_loop_order"]}

    # -- code -------------------------------------------------------------------------------
    def _replan(self, op: OpInfo, attrs: dict):
        options = {"cim_rows": attrs["cim_rows"], "cim_cols": attrs["cim_cols"],
                   "cim_crossbars": attrs["cim_crossbars"], "cim_loop_order": attrs["cim_loop_order"],
                   "cim_preset": attrs.get("cim_preset")}
        params = params_from_options(options, self.params)
        v = layout.op_view(op, attrs["cim_operand"])
        p = schedule.plan_product(v, params, attrs["cim_loop_order"],
                                  shared=bool(attrs.get("cim_shared", 0)))
        return p, v, params

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write ``<stem>.xbar`` under ``root/memristor`` and return its path.

        The weights are not copied: the file names the model's tensors (``weight W G K N
        model:<programmed operand>``, and ``bias C model:<bias>`` when the bias fits the
        ``[G, 1, N]`` form), which :meth:`kernel` hands to the simulator from the model. So the
        model and its kernel folder hold one copy of every weight (``docs/xbar-format.md``).
        A programmed operand that is an activation is named too; the runtime supplies it.
        """
        p, v, params = self._replan(op, attrs)
        rel = Path(attrs["kernel"])
        outdir = Path(root) / rel.parent
        names = [t.name for t in op.inputs]
        prog = names[0] if v.operand == "A" else names[1]
        bias = None
        if len(names) > 2 and names[2] in consts and layout.bias_per_group(v, consts[names[2]].shape):
            bias = codegen.model_source(names[2])
        outdir.mkdir(parents=True, exist_ok=True)
        text = codegen.render(p, params, rel.stem, codegen.model_source(prog), bias,
                              **_mode(attrs, params))
        path = outdir / rel.name
        path.write_text(text)
        return [path]

    def kernel(self, op: OpInfo, attrs: dict, root, consts: dict | None = None,
               mode: str = "simulate"):
        """A callable running the node's ``.xbar`` kernel in the simulator (see
        :class:`onnx_cinm.devices.memristor.kernel.CrossbarKernel`)."""
        from .kernel import CrossbarKernel

        return CrossbarKernel(op, attrs, Path(root) / attrs["kernel"], consts or {})


def _validate(options: dict, base: CrossbarParams) -> None:
    """CinmError if the mode, effects, time and preset of ``options`` do not go together
    (e.g. effects for mode ``ideal``)."""
    _compose(options.get("cim_mode") or CrossbarOptions.mode, params_from_options(options, base),
             options.get("cim_time_s", CrossbarOptions.time_s), options.get("cim_effects"))


def _compose(name: str, params: CrossbarParams, time_s, effects):
    """The :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` named ``name`` for chip
    ``params``; CinmError if the mode, an effect or the time is bad."""
    from .nonideal import compose

    try:
        return compose(name, params, time_s, effects)
    except ValueError as e:
        raise CinmError(str(e)) from None


def _mode(attrs: dict, params: CrossbarParams) -> dict:
    """Keyword arguments selecting the non-ideal mode of the emitted file (ideal: none), from
    the node's ``cim_mode``, ``cim_time_s`` and ``cim_effects`` attributes."""
    name = attrs.get("cim_mode", "ideal")
    if name == "ideal":
        return {}
    effects = attrs.get("cim_effects")
    effects = None if effects is None else [e for e in effects.split(",") if e]
    return {"mode": _compose(name, params, attrs.get("cim_time_s", 0.0), effects)}


register(MemristorDevice())
