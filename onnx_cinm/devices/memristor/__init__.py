"""Memristor crossbar device (paradigm ``cim``): weight-stationary matrix products in place.

Chip presets (geometry, cost, precision, device physics, each constant with its source) are in
:mod:`.presets`; the default, ``pcm-hermes``, is IBM's HERMES 64-core PCM chip (Le Gallo et
al., Nat. Electron. 2023); ``pcm-occ`` follows OCC's published model, the CINM paper's
(Siemieniuk et al., "OCC", IEEE TCAD 41(6), 2022; the numbers are from its evaluation data,
``adam-smnk/Open-CIM-Compiler`` branch ``sim_build``, ``data/CIM_parallelization_factor.xlsx``
and ``data/CIM_stats.xlsx``; see ``shared/field-notes/crossbar.md`` §1.4). One "write" here is
the programming of one whole crossbar tile (``rows x cols`` cells), as in OCC's write counts.

Tiles, loop orders, residency and the product views are the cim paradigm's
(:mod:`onnx_cinm.paradigms.cim`; :class:`CrossbarParams` is its ``CrossbarArray``); this package
keeps the chip presets, device physics and non-idealities, the ``.xbar`` code generator and the
simulator adapter.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path, PurePath

import numpy as np

from ...errors import CinmError
from ...options import DEFAULT_OBJECTIVE, Alias, option, parse_duration, parse_pair
from ...paradigms.cim import layout, residency, schedule, wear as cim_wear
from ...paradigms.cim.schedule import LOOP_ORDERS
from ...text import Column, folded_kernels, si, table
from .. import register
from ...graph import CostPart, dtype_name
from ..base import (Cost, Device, OpInfo, Priced, Resources, Support, Wear, emit_memo,
                    write_kernel_file)
from . import codegen
from .nonideal import EFFECTS, NAMED
from .presets import (DEFAULT, INT_DTYPES, PCM_HERMES, PCM_OCC, PRESETS, RERAM_ISAAC, RRAM_NEURRAM,
                      CrossbarParams, resize)


#: The named modes' own effects, for the options' help: ``device`` leaves ``stuck`` out
#: (MNSIM's unsourced rate, :data:`.nonideal.NAMED`), so the help says how to name it.
_OWN_EFFECTS = ("; ".join(f"{m}: {','.join(spec[1])}" for m, spec in NAMED.items()
                          if spec and spec[1])
                + "; 'stuck' (MNSIM's unsourced 0.1 % of cells stuck at 0 and at g_max) "
                "only when named: prog,drift,read1f,gdc,irdrop,stuck")


@dataclass(frozen=True)
class CrossbarOptions:
    """The crossbar device's options (keys ``cim_<field>``; CLI ``--cim-<field>``)."""

    preset: str | None = option(None, help="crossbar chip preset: geometry, cost and device "
                                "parameters (sources in docs/crossbar-presets.md and 'onnx-cinm "
                                "devices'; default pcm-hermes; pcm-occ is the CINM paper's)",
                                choices=lambda: tuple(PRESETS),
                                aliases=(Alias(sweep="crossbar.preset"),))
    rows: int | None = option(None, help="cells per crossbar column (default: the preset's, 256 "
                              "for pcm-hermes, 64 for pcm-occ; another size scales the "
                              "preset's per-array energy, latency and area, "
                              "docs/crossbar-presets.md)", low=1, high=1 << 16,
                              aliases=(Alias(flag="--cim-size", sweep="crossbar.size",
                                             also=("cols",), parse=parse_pair, metavar="ROWSxCOLS",
                                             help="cells per crossbar, e.g. 128x128: --cim-rows "
                                                  "and --cim-cols at once"),))
    cols: int | None = option(None, help="cells per crossbar row (default: the preset's)",
                              low=1, high=1 << 16)
    crossbars: int | None = option(None, help="crossbars P shared by all crossbar kernels "
                                   "(default: the preset's, 64 for pcm-hermes, 4 for pcm-occ)",
                                   low=1, high=1 << 24, aliases=(Alias(sweep="crossbar.count"),))
    loop_order: str = option("weight_stationary", help="tile schedule: weight_stationary "
                             "(alias knm, its loop nest k, n, m outermost first: each weight "
                             "tile written once and kept, serpentine order) or naive (alias "
                             "mnk, loops m, n, k: every tile rewritten per input row, for "
                             "comparison)", choices=lambda: tuple(LOOP_ORDERS),
                             aliases=(Alias(sweep="crossbar.loop_order"),))
    mode: str = option("ideal", help="data path of the emitted kernels: 'ideal' (exact fp32), "
                       "'q8' (8-bit weights with per-channel scales on 2-bit cells in "
                       "differential pairs, 8-bit DAC and ADC), 'q8-noisy' (q8 plus 2% seeded "
                       "read noise) or 'device' (the preset's precision and device physics, "
                       "docs/xbar-format.md); the check compares the exact reference bodies",
                       choices=lambda: tuple(NAMED))
    time_s: float = option(0.0, help="time after programming at which the device effects are "
                           "taken (0: just programmed)", unit="s", low=0.0,
                           aliases=(Alias(flag="--cim-time", parse=parse_duration, metavar="T",
                                          help="--cim-time-s with a unit: 10s, 1h, 1d, 1y"),))
    effects: tuple | None = option(None, help="the device effects of the mode, the whole set "
                                   f"(default: the mode's own, {_OWN_EFFECTS}; 'none' for none)",
                                   choices=lambda: tuple(EFFECTS), metavar="E1,E2|none")
    link_gbps: float | None = option(None, help="host<->crossbar link bandwidth (default 6.4, an "
                                     "assumption: ISAAC's HyperTransport order)", unit="GB/s",
                                     low=1e-6)


@dataclass(frozen=True)
class CrossbarRunOptions:
    """The crossbar kernels' run options: provider options (keys ``cim_<field>``,
    ``--provider-option cim_time_s=3600``; ``onnx-cinm evaluate`` sweeps them) that change
    the data path of a run without compiling again. Unset: as the kernels were compiled
    (``cim_mode``, ``cim_time_s``, ``cim_effects`` of each node)."""

    mode: str | None = option(None, help="data path of this run (default: the one compiled "
                              "in)", choices=lambda: tuple(NAMED))
    effects: tuple | None = option(None, help="device effects of this run, the whole set "
                                   "(default: the compiled ones, or the mode's own when "
                                   f"--cim-mode changes it, {_OWN_EFFECTS}; 'none' for none)",
                                   choices=lambda: tuple(EFFECTS), metavar="E1,E2|none")
    time_s: float | None = option(None, help="time after programming at which the device "
                                  "effects are taken", unit="s", low=0.0)
    drift_compensation: bool | None = option(None, help="global drift compensation on or off "
                                             "(default: on when the effects include 'gdc')")
    adc_bits: int | None = option(None, help="ADC bits including the sign (0: an ideal ADC; "
                                  "default: the mode's)", low=0, high=16)
    stuck_at: float | None = option(None, help="fraction of cells stuck at 0, and as many "
                                    "stuck at g_max (default: the effects' own; 'stuck' is "
                                    "0.001)", low=0.0, high=0.5)
    seed: int | None = option(None, help="seed of the device and read-noise draws (default: "
                              "the compiled one, 0)", low=0, high=2 ** 31 - 1)
    adc_calibration: str | None = option(None, help="the ADC ranges: 'max', the largest "
                                         "current any input can make (every mode's default); "
                                         "'data', one range per tile and bit slice from the "
                                         "first inference with current (it should be "
                                         "representative: later inputs beyond it clip)",
                                         choices=("max", "data"))


#: The preset of a crossbar node without ``cim_preset``: models written before the default
#: became ``pcm-hermes`` recorded no preset for the then default ``pcm-occ``.
OLD_DEFAULT = PCM_OCC.name

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
#: kernel uses, ``cim_device_crossbars`` the crossbars all kernels of the model share;
#: ``cim_*_parts_*`` the latency, energy and area of the kernel's array, ADC/DAC and periphery,
#: :data:`PART_TERMS`, summing to ``cim_latency_s`` and ``cim_energy_j``; ``cim_bytes_moved``
#: the bytes in and out per inference, the plan's
#: :attr:`~onnx_cinm.paradigms.cim.schedule.CrossbarPlan.bytes_moved`, which the runtime's
#: kernel counts alike). Kernels
#: over one tile set (the same constant, programmed the same way) carry ``cim_tile_users``
#: (kernels over the set); all but its first carry ``cim_tile_owner`` (the node whose kernel
#: programs the tiles, at load) and, at the device level, ``cim_tile_kernel`` (that kernel's
#: file; all of them name the same tensor of the model). A kernel streaming through the shared
#: pool (``cim_shared``) carries ``cim_first_crossbar``, the crossbar of the pool its first
#: tile goes to: the streaming kernels continue one round-robin over the pool, in execution
#: order (:meth:`MemristorDevice.lower`).
PLAN_ATTRS = {
    "cim_rows": "int", "cim_cols": "int", "cim_crossbars": "int", "cim_shared": "int",
    "cim_device_crossbars": "int", "cim_loop_order": "string", "cim_operand": "string",
    "cim_M": "int", "cim_K": "int", "cim_N": "int", "cim_groups": "int",
    "cim_tiles": "int", "cim_resident": "int", "cim_writes_load": "int",
    "cim_writes": "int", "cim_mvms": "int", "cim_latency_s": "float",
    "cim_energy_j": "float", "cim_mode": "string", "cim_preset": "string",
    "cim_time_s": "float", "cim_effects": "string",
    "cim_tile_users": "int", "cim_tile_owner": "string", "cim_tile_kernel": "string",
    "cim_latency_parts_s": "floats", "cim_energy_parts_j": "floats", "cim_area_parts_mm2": "floats",
    "cim_bytes_moved": "int", "cim_link_gbps": "float", "cim_first_crossbar": "int",
}

#: The terms of the cost breakdown (``Cost.parts``, plan attributes ``cim_*_parts_*`` in this
#: order; :mod:`onnx_cinm.paradigms.cim.schedule`).
PART_TERMS = ("array", "adc_dac", "periphery")

#: The widest integer weight a cell mapping takes (signed bits; the ``.xbar`` limit).
MAX_INT_WEIGHT_BITS = 16


def int_cells(W: np.ndarray | None, params: CrossbarParams) -> list[tuple[str, str]]:
    """The ``.xbar`` header lines putting the integer weights ``W`` in cells without
    re-quantization: ``weight_bits`` just wide enough for ``max |W|`` (signed, at least 2;
    :data:`MAX_INT_WEIGHT_BITS` for an operand programmed at run time, ``W`` None), the
    preset's ``cell_bits`` per slice (at most the magnitude's bits) and differential pairs, as
    the ``device`` mode maps weights (field notes crossbar.md §4: int8 on 2-bit cells is 4
    slices, 8 cells per weight). Raises CinmError when ``W`` needs more than
    :data:`MAX_INT_WEIGHT_BITS`."""
    top = (1 << (MAX_INT_WEIGHT_BITS - 1)) - 1 if W is None else int(np.abs(W).max(initial=0))
    bits = max(2, top.bit_length() + 1)
    if bits > MAX_INT_WEIGHT_BITS:
        raise CinmError(f"integer weights up to {top} need {bits} bits; a crossbar cell mapping "
                        f"takes at most {MAX_INT_WEIGHT_BITS}")
    return [("weight_bits", str(bits)), ("cell_bits", str(min(params.cell_bits, bits - 1))),
            ("differential", "on")]


def _is_int(op: OpInfo) -> bool:
    return any(t.dtype is not None and dtype_name(t.dtype) in INT_DTYPES for t in op.inputs[:2])


#: Memo of :meth:`MemristorDevice.plan`, per parameter set: a plan depends only on the
#: product's shapes and operand constness, the options above and the crossbar count; placement
#: asks for the same plans many times (candidates, lowering, every polishing move). Plans are
#: immutable.
_PLANS: dict = {}
_PLANS_MAX = 20000


def _options_key(options: dict) -> tuple:
    """The values of :data:`_PLAN_OPTIONS` in ``options`` (None: not given), lists as tuples."""
    key = tuple(map(options.get, _PLAN_OPTIONS))
    # a list is rare (``cim_effects``): one scan of the types, not a generator per value (a
    # list subclass stays a list: unhashable, so :meth:`MemristorDevice._entry` plans unmemoized)
    return key if list not in map(type, key) else tuple(
        tuple(v) if isinstance(v, list) else v for v in key)


def params_from_options(options: dict, base: CrossbarParams = DEFAULT) -> CrossbarParams:
    """The crossbar parameters selected by pass options (checked against
    :class:`CrossbarOptions` by the caller, :func:`onnx_cinm.passes.check_options`).

    Keys (all optional): ``cim_preset`` (a name of :data:`PRESETS`), ``cim_rows``, ``cim_cols``
    (cells per crossbar: another size than the preset's scales its per-array energy, latency
    and area, :func:`.presets.resize`), ``cim_crossbars`` (``P``).
    """
    preset, rows, cols, count = (options.get("cim_preset"), options.get("cim_rows"),
                                 options.get("cim_cols"), options.get("cim_crossbars"))
    try:
        key = (id(base), preset, rows, cols, count, type(rows), type(cols), type(count))
        hit = _PARAMS.get(key)
    except TypeError:  # an unhashable option value: computed, not remembered
        key = hit = None
    if hit is not None and hit[0] is base:
        return hit[1]
    given = base
    if preset is not None:
        base = PRESETS[preset]
    if rows is not None or cols is not None:
        base = resize(base, base.rows if rows is None else rows,
                      base.cols if cols is None else cols)
    params = base if count is None else replace(base, crossbars=count)
    if key is not None:
        if len(_PARAMS) >= 64:
            _PARAMS.clear()
        _PARAMS[key] = (given, params)  # the base held: its id is not reused while cached
    return params


#: :func:`params_from_options` by ``(id(base), preset, rows, cols, crossbars)`` and the types
#: of the numbers (``64`` and ``64.0`` are equal keys): ``(base, params)``. Both are frozen,
#: so a hit is the value computed again (a node's plan, price and kernel each ask;
#: ``dataclasses.replace`` of 40 fields was the most of it)
_PARAMS: dict = {}


class MemristorDevice(Device):
    """Memristor crossbars: runs cinm Gemm and Gemv with one operand programmed into the cells.

    The programmed operand is the constant one (the weights, programmed once at load when they
    fit, see :mod:`.schedule`); a product of two activations can be placed here by a hint, and
    then the operand needing fewer tile writes is programmed every inference. Its nodes always
    run their ``.xbar`` file in the crossbar simulator (mode ``simulate``).
    """

    name = "memristor"
    colour = "#d62728"  # in the report's pictures
    paradigm = "cim"
    option_prefix = "cim"
    Options = CrossbarOptions
    RunOptions = CrossbarRunOptions
    attr_prefix = "cim"
    plan_attrs = PLAN_ATTRS
    modes = ("simulate",)
    plans_together = True

    def __init__(self, params: CrossbarParams = DEFAULT):
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
        """Whether ``op`` can run on the default chip's crossbars (see :meth:`supports_under`)."""
        return self._supports(op, self.params.min_macs)

    def writes_permuted(self, op: OpInfo, perm: list[int]) -> bool:
        """A crossbar Gemm writes its result in any layout: the kernel lays the simulator's
        output buffer out so the permuted result is contiguous when it can (a Conv's NCHW at
        batch 1: ``Y^T = W^T X^T``, :class:`~.kernel.CrossbarKernel`), else permutes it once
        in numpy."""
        return op.op_type == "Gemm"

    def supports_under(self, op: OpInfo, options: dict) -> Support:
        """:meth:`supports` on the chip the options select: the paper heuristic's "enough
        work" is one tile of that chip (``rows * cols`` MACs, after ``cim_preset``,
        ``cim_rows``, ``cim_cols``); an op with less is still priced by cost placement.
        Integer products under a non-ideal data path (``cim_mode`` q8, q8-noisy, device) are
        refused: those re-quantize per channel, the integer path does not."""
        try:
            p = params_from_options(options, self.params)
        except (KeyError, TypeError, ValueError):  # a bad option: check_options names it
            p = self.params
        s = self._supports(op, p.rows * p.cols)
        mode = options.get("cim_mode") or CrossbarOptions.mode
        if s.ok and mode != "ideal" and op.op_type in ("Gemm", "Gemv") and _is_int(op):
            return Support(False, f"integer product: its weights go to cells as they are, which "
                                  f"--cim-mode {mode} would re-quantize (use ideal)")
        return s

    def _supports(self, op: OpInfo, min_macs: int) -> Support:
        if op.op_type not in ("Gemm", "Gemv"):
            return Support(False, f"crossbars only compute matrix products, not {op.op_type}",
                           applicable=False)
        if len(op.inputs) < 2 or any(t.shape is None for t in op.inputs[:2]):
            return Support(False, "operand shapes unknown")
        dtypes = tuple(self.params.dtypes)
        for t in op.inputs[:2]:
            if t.dtype is None or dtype_name(t.dtype) not in dtypes:
                return Support(False, f"dtype {t.dtype} not in {list(dtypes)}")
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
        if macs < min_macs:
            # the paper heuristic's "enough work"; cost placement still prices it
            return Support(True, f"{macs} MACs < {min_macs} (less than one tile of work)",
                           preferred=False)
        operand, why = layout.constant_operand(op)
        if _is_int(op):
            if operand is None:
                return Support(True, f"integer product, {why}: the cheaper one would be "
                                     f"reprogrammed every inference ({MAX_INT_WEIGHT_BITS}-bit "
                                     "cell mapping)", preferred=False)
            return Support(True, f"integer product, {why}, {macs} MACs: int weights in cells as "
                                 "they are, exact int32 accumulation")
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
        or None until asked, the entry of the same kernel on another kernel's tiles (see
        :meth:`_allocate`) or None until asked]``; ``okey`` is ``_options_key(options)``."""
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
            return [self._plan(op, options, crossbars, shared), None, None]
        if hit is None:
            hit = [self._plan(op, options, crossbars, shared), None, None]
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
        priced as if alone; ``kept_crossbars`` = tiles kept, ``tile_set`` names them, so kernels
        over the same weights keep one copy) and *streamed* (through crossbars
        shared with other kernels: every tile written every inference, nothing kept). A kernel
        that keeps nothing (an activation programmed, or the naive order) has only the second.
        Raises CinmError on bad options."""
        p, v, params, const, _ = self.plan(op, options)
        alone = p.cost(params)
        if not p.writes_load:
            return [Priced(alone, streamed=True)]
        out = [Priced(alone, kept_crossbars=p.writes_load, tile_set=_tile_set(op, v) if const else "")]
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
        tiles fit together, else whole kernels are pinned (the knapsack's choice for some
        capacity up to ``P - 1``, the one whose streamed rest is best by the options'
        ``objective`` under their endurance budget, :func:`_goal`) and the rest stream through
        the others (``shared`` when several do); the naive order keeps no
        tile and needs no allocation. A kernel whose options say ``per_inference`` False (in
        an If branch the planning probe did not see taken) saves no write per inference by
        being pinned: the knapsack values it 0, so the kernels that run get the crossbars.

        ``cim_crossbars`` is the number of crossbars the kernel uses, ``cim_device_crossbars``
        the ``P`` all kernels share; ``cim_shared`` says whether other kernels use them too.
        The kernels streaming through the shared pool continue one round-robin over it
        (``cim_first_crossbar``, :func:`_first_crossbars`), so their tile writes per
        inference spread over the pool as the wear figures assume (:meth:`wear`), instead of
        each kernel's starting at its first crossbar. Raises CinmError on bad options.
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
        P, planned, owners = self._allocate(items)
        firsts = _first_crossbars(items, [e[0][0] for e in planned])
        out = []
        for i, ((op, opts), e, (owner, uses)) in enumerate(zip(items, planned, owners)):
            ent = e[0]
            if firsts[i]:
                ent = (replace(ent[0], first=firsts[i]), *ent[1:])
            attrs = attrs_of(op, opts, *ent)
            attrs["cim_device_crossbars"] = P
            if uses > 1:
                attrs["cim_tile_users"] = uses
            if owner != i:
                attrs["cim_tile_owner"] = items[owner][0].name
                if "kernel" in attrs:
                    attrs["cim_tile_kernel"] = f"memristor/{items[owner][1]['kernel_stem']}.xbar"
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
        parts = ()
        if "cim_energy_parts_j" in attrs:
            folded, into = _folded_terms(attrs)
            parts = tuple(CostPart(t, float(lat), float(en), float(ar), into if t in folded else "")
                          for t, lat, en, ar in zip(
                              PART_TERMS, attrs["cim_latency_parts_s"], attrs["cim_energy_parts_j"],
                              attrs["cim_area_parts_mm2"]))
        return Priced(Cost(float(attrs["cim_latency_s"]), float(attrs["cim_energy_j"]), writes,
                           int(attrs.get("cim_bytes_moved", 0)), parts),
                      kept_crossbars=int(attrs.get("cim_writes_load", 0)),
                      streamed=bool(attrs.get("cim_shared", 0)) or writes > 0)

    def _allocate(self, items: list) -> tuple[int, list, list]:
        """``(P, [memo entry of :meth:`_entry` per item], [(owner index, uses) per item])``
        under the allocation of :meth:`lower`: kernels over one tile set (:func:`_tile_owners`)
        share it, counted once in the residency; its first kernel (the owner) programs it at
        load, the others have no load writes of their own. Under the naive order no tile is
        kept, and every kernel is its own owner."""
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
            return P, alone, [(i, 1) for i in range(len(items))]
        owner = _tile_owners(items, alone)
        sets = [i for i in range(len(items)) if owner[i] == i]
        uses = {i: 0 for i in sets}
        runs = {i: 0 for i in sets}  # the knapsack's value: kernels that run per inference
        for (_, opts), o in zip(items, owner):
            uses[o] += 1
            runs[o] += 1 if opts.get("per_inference", True) else 0
        goal = _goal(items, alone, owner, sets, params)
        alloc = dict(zip(sets, residency.allocate([alone[i][0][0].tiles for i in sets],
                                                  [alone[i][0][3] for i in sets], P,
                                                  [runs[i] for i in sets], goal=goal)))
        out = []
        for i, (op, opts) in enumerate(items):
            e = entry(op, opts, *alloc[owner[i]])
            if owner[i] != i:  # the set's first kernel programs the tiles at load
                if e[2] is None:  # kept in the entry: an unrolled recurrence's steps are
                    # hundreds of such kernels, priced again for every polishing move
                    p = replace(e[0][0], writes_load=0, cell_writes_load=0)
                    e[2] = [(p, *e[0][1:]), None, None]
                e = e[2]
            out.append(e)
        return P, out, [(owner[i], uses[owner[i]]) for i in range(len(items))]

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
        if p.shared:
            attrs["cim_first_crossbar"] = p.first
        base = op.attrs.get("placement", "")
        if not const and why not in base:  # the reason does not say which activation is
            attrs["placement"] = f"{base}; {why}"  # programmed (said once, not per lowering)
        return attrs

    def _attrs(self, op, options, p, v, params, const, why) -> dict:
        c = p.cost(params)
        mode = options.get("cim_mode") or CrossbarOptions.mode
        time_s = options.get("cim_time_s", CrossbarOptions.time_s)
        effects = options.get("cim_effects")  # checked with the mode by lower (_validate)
        paradigm = self._paradigm_attrs(op, options, p, v, params, const, why)
        note = paradigm.pop("placement", None)
        parts = {p.term: p for p in c.parts}
        attrs = {
            **paradigm, "cim_latency_s": float(c.latency_s),
            "cim_energy_j": float(c.energy_j), "cim_mode": mode,
            "kernel": f"memristor/{options['kernel_stem']}.xbar",
            # always recorded: a model written before the default changed has none (pcm-occ)
            "cim_preset": params.name,
            "cim_latency_parts_s": [float(parts[t].latency_s) for t in PART_TERMS],
            "cim_energy_parts_j": [float(parts[t].energy_j) for t in PART_TERMS],
            "cim_area_parts_mm2": [float(parts[t].area_mm2) for t in PART_TERMS],
            "cim_bytes_moved": int(c.bytes_moved),
        }
        if mode != "ideal" and time_s:
            attrs["cim_time_s"] = float(time_s)
        if options.get("cim_link_gbps") is not None:  # so report prices the transfers alike
            attrs["cim_link_gbps"] = float(options["cim_link_gbps"])
        if effects is not None:
            attrs["cim_effects"] = ",".join(effects)
        if note is not None:
            attrs["placement"] = note
        return attrs

    def inexact(self, attrs: dict, mode: str, run_options: dict | None = None) -> str | None:
        """A crossbar data path other than ``ideal`` (``cim_mode``, or run option ``mode``: q8,
        q8-noisy, device) is inexact by design. With programming noise or stuck-at-g_max cells
        among its effects, the text says how large they are against g_max: each alone moves a
        network not trained with them far off, as the same model drawn in numpy on the float
        weights does (OriNet's logits, relative RMS error over seeds: programming noise 0.3 to
        0.9, cells stuck 0.3 to 0.9; ``docs/crossbar-presets.md``), so a large error there is
        the device model, not a fault of the simulator."""
        m = (run_options or {}).get("mode") or attrs.get("cim_mode")
        if not m or m == "ideal":
            return None
        try:
            mode = _run_mode(attrs, self.params, run_options or {})
        except CinmError:  # the session refused these options already
            return f"crossbar data path {m}"
        parts = []
        if mode.prog_noise:
            from ...sim.crossbar.physics import DEVICE_MODELS

            dev = DEVICE_MODELS[mode.device]
            lo, hi = (float(dev.prog_sigma(x, mode.time_s)) * mode.prog_noise / dev.g_max_us * 100
                      for x in (0.0, 1.0))
            parts.append(f"{dev.name}: programming noise of {lo:.2g} to {hi:.2g} % of g_max per "
                         "cell, the published device model")
        if mode.stuck_at_1:
            parts.append(f"{mode.stuck_at_1 * 100:.2g} % of cells stuck at g_max (MNSIM's rate, "
                         "unsourced), each a full-scale weight")
        if not parts:
            return f"crossbar data path {m}"
        return (f"crossbar data path {m} ({'; '.join(parts)}: a network not trained with them "
                "may not tolerate them; cim_effects=none leaves the quantization alone)")

    # -- reports ----------------------------------------------------------------------------
    def summary(self, plans: list, counted: list | None = None, fold: bool = True) -> str:
        """Per crossbar kernel: crossbars used (``s``: shared with other kernels; ``=``: the
        tiles of an earlier kernel over the same weights), tiles, tile writes (at load / per
        inference), MVMs, modeled latency and energy per inference, the energy of its array,
        ADC/DAC and periphery, the conversions' share of the latency and the area of its
        crossbars; then the totals, in which a tile set shared by several kernels counts once
        and the crossbars and area are those in use: each resident kernel's own plus those of
        the streaming pool its kernels write (:func:`_streamed_crossbars`: the streamed tiles
        continue one round-robin over the pool, :meth:`wear`).
        ``plans`` is ``[(node name, op type, attrs)]``; the per-inference totals (writes/inf,
        MVMs, latency, energy and its parts) leave out the kernels ``counted`` marks False
        (their figures shown in parentheses), the load-time ones (crossbars, tiles,
        writes@load, area) count every kernel. ``fold``: the kernels of one source op with
        the same figures in one row, ``<op> xN`` (:func:`onnx_cinm.text.fold_rows`)."""
        flags = [True] * len(plans) if counted is None else list(counted)
        keep = [k for k, p in enumerate(plans) if "cim_M" in p[2]]
        plans, flags = [plans[k] for k in keep], [flags[k] for k in keep]
        if not plans:
            return ""
        cols = (Column("crossbar kernel", fit=64), Column("operand", ">"), Column("M x K x N", ">"),
                Column("xbars", ">"), Column("tiles", ">"), Column("writes@load", ">"),
                Column("writes/inf", ">"), Column("MVMs", ">"), Column("latency", ">"),
                Column("energy", ">"), *(Column(_ENERGY_COLUMN[t], ">") for t in PART_TERMS),
                Column("t adc/dac", ">"), Column("area", ">"))
        a0 = plans[0][2]
        preset = a0.get("cim_preset", OLD_DEFAULT)
        folded, into = _folded_terms(a0)
        # a term the preset publishes only inside another's figure: '-', not a free 0 J
        shown = [(lambda j: "-") if term in folded else (lambda j: si(j, "J"))
                 for term in PART_TERMS]
        rows = []
        tot = {"tiles": 0, "wl": 0, "w": 0, "mvms": 0, "lat": 0.0, "en": 0.0}
        parts_tot = [[0.0, 0.0, 0.0] for _ in PART_TERMS]  # latency, energy, area per term
        per_crossbar = 0.0  # area of one crossbar of the streaming pool
        for (name, _op, a), per_inf in zip(plans, flags):
            mkn = f"{a['cim_M']}x{a['cim_K']}x{a['cim_N']}" + (f"x{a['cim_groups']}g" if a["cim_groups"] > 1 else "")
            xb = f"{a['cim_crossbars']}{'s' if a.get('cim_shared') else ''}"
            xb = f"={xb}" if a.get("cim_tile_owner") else xb
            lat_p = list(a.get("cim_latency_parts_s") or [0.0] * 3)
            en_p = list(a.get("cim_energy_parts_j") or [0.0] * 3)
            ar_p = list(a.get("cim_area_parts_mm2") or [0.0] * 3)
            share = lat_p[1] / a["cim_latency_s"] if a["cim_latency_s"] else 0.0
            inf = (lambda text: text) if per_inf else (lambda text: f"({text})")
            rows.append((name, a["cim_operand"], mkn, xb, a["cim_tiles"], a["cim_writes_load"],
                         inf(a["cim_writes"]), inf(a["cim_mvms"]), inf(si(a["cim_latency_s"], "s")),
                         inf(si(a["cim_energy_j"], "J")), inf(shown[0](en_p[0])),
                         inf(shown[1](en_p[1])), inf(shown[2](en_p[2])), inf(f"{100 * share:.0f}%"),
                         _mm2(sum(ar_p))))
            if not a.get("cim_tile_owner"):
                tot["tiles"] += a["cim_tiles"]
            tot["wl"] += a["cim_writes_load"]
            for k, key in (("w", "cim_writes"), ("mvms", "cim_mvms"), ("lat", "cim_latency_s"),
                           ("en", "cim_energy_j")):
                tot[k] += a[key] if per_inf else 0
            for i in range(len(PART_TERMS)):
                parts_tot[i][0] += lat_p[i] if per_inf else 0.0
                parts_tot[i][1] += en_p[i] if per_inf else 0.0
                if a["cim_resident"] and not a.get("cim_tile_owner"):  # a shared set once
                    parts_tot[i][2] += ar_p[i]
            if not a["cim_resident"] and a["cim_tiles"]:  # one crossbar of the pool's area
                per_crossbar = max(per_crossbar, sum(ar_p) / min(a["cim_crossbars"], a["cim_tiles"]))
        # crossbars in use: each resident kernel's own, plus those of the streaming pool written
        streaming = _streamed_crossbars(plans)
        used = sum(a["cim_crossbars"] for *_, a in plans
                   if a["cim_resident"] and not a.get("cim_tile_owner")) + streaming
        shared_area = per_crossbar * streaming
        t_conv = parts_tot[1][0] / tot["lat"] if tot["lat"] else 0.0
        area = sum(p[2] for p in parts_tot) + shared_area
        n_inf = sum(flags)
        label = f"total ({len(plans)} kernels" + (
            f", {n_inf} per inference)" if n_inf < len(plans) else ")")
        total = (label, "", "", used, tot["tiles"], tot["wl"], tot["w"],
                 tot["mvms"], si(tot["lat"], "s"), si(tot["en"], "J"), shown[0](parts_tot[0][1]),
                 shown[1](parts_tot[1][1]), shown[2](parts_tot[2][1]), f"{100 * t_conv:.0f}%",
                 _mm2(area))
        note = (f"({preset} crossbars of {a0['cim_rows']}x{a0['cim_cols']} shared by the model, "
                f"{a0['cim_loop_order']} order, {a0['cim_mode']} mode; resident kernels keep "
                "their tiles, the others stream through the rest ('s': evicted by each other; '=': "
                "on the tiles of an earlier kernel over the same weights); M x K x N: the "
                "product's rows, reduction length and columns, 'xGg' G groups of that size (a "
                "grouped convolution, one product per group); latency and energy per inference, "
                "kernels one after another, on the crossbars only: the transfers of their "
                "inputs and outputs over the host link are not in them (report adds them); E "
                "array/adc/dac/periph: energy of the cells (writes and MVMs), the converters and "
                "the rest of the periphery; t adc/dac: the conversions' share of the latency; "
                "area: the kernel's crossbars with their converters and periphery (the total: of "
                "the crossbars in use), '-' if not published)")
        notes = [note, _use_note(plans, used)]
        rows, fold_note = folded_kernels(rows, fold, ", e.g. the steps of an unrolled recurrence",
                                         energy=[float(a["cim_energy_j"]) for *_, a in plans])
        if fold_note:
            notes.append(fold_note)
        if n_inf < len(plans):
            notes.append("(figures in parentheses: a kernel the per-inference totals leave out, "
                         "of an If branch that does not run per inference; it counts at load)")
        notes += self.cost_notes(self.recorded_options(plans))
        if folded:
            notes.append(f"({preset} publishes {' and '.join(folded)} energy and area only "
                         f"inside the {into}'s figures: they are counted under "
                         f"{_ENERGY_COLUMN[into]}, and their energy columns show '-')")
        return table(cols, rows, totals=[total], notes=notes)

    def wear(self, plans: list, counted: list | None = None,
             seconds_per_inference: float | None = None) -> Wear | None:
        """Wear of the crossbar cells under the crossbar kernels of ``plans`` (as in
        :meth:`summary`, ``counted`` too: the per-inference figures leave out the kernels it
        marks False): the tile writes per inference of the kernels that stream (resident ones
        write at load only) rotate round-robin over the crossbars they stream through, the
        largest ``cim_crossbars`` of a streaming kernel (the pool :meth:`summary` counts once),
        so the most-written cells take ``ceil(tile writes / streamed crossbars)`` writes per
        inference (:mod:`onnx_cinm.paradigms.cim.wear`, the even wear cost placement's
        ``--max-writes-per-cell`` budget assumes). Endurance: the recorded preset's
        ``endurance_writes`` with its source (``presets.py``: 3.2e7 writes for the PCM presets,
        OCC's figure, unverified; 1e6 for the ReRAM/RRAM ones, NVMain's default, field notes
        ``crossbar.md`` §2.8). ``seconds_per_inference``: the period of back-to-back
        inferences, seconds (None: the crossbar kernels' modeled latency per inference, a
        lower bound of the period, so the lifetime in seconds is one too). The note (when the
        lifetime at back-to-back inference is under
        :data:`~onnx_cinm.paradigms.cim.wear.SHORT_LIFETIME_S`, one year) names cost
        placement's endurance budget, which bounds these same most-written cells
        (``--max-writes-per-cell E --lifetime-inferences N``; ``--max-writes-per-cell 0``:
        written at load only). None if no plan is a crossbar kernel."""
        flags = [True] * len(plans) if counted is None else list(counted)
        kept = [(a, f) for (_, _, a), f in zip(plans, flags) if "cim_M" in a]
        if not kept:
            return None
        attrs = [a for a, _ in kept]
        writes = sum(a["cim_writes"] for a, f in kept if f)
        pool = max((a["cim_crossbars"] for a in attrs if not a["cim_resident"]), default=0)
        own = seconds_per_inference is None
        period = sum(a["cim_latency_s"] for a, f in kept if f) if own else seconds_per_inference
        params = params_from_options(self.recorded_options(plans), self.params)
        w = cim_wear.wear(writes, pool, params.endurance_writes, period)
        source = (params.source("endurance_writes") or "preset") + (
            ", unverified" if "endurance_writes" in params.unverified else "")
        head = f"wear ({params.name}, a cell endures {w.endurance:.3g} writes: {source})"
        load = sum(a["cim_writes_load"] for a in attrs)
        if not w.per_cell:
            return Wear(w.figures(), f"{head}: no tile writes per inference: the cells are "
                        f"written only at load ({load} tile writes), inference does not wear them")
        what = ("the crossbar kernels' own latency: a lower bound" if own
                else "the model's modeled latency")
        one = w.tile_writes == 1
        same = "the same one every inference" if one else "round-robin, the same ones every inference"
        spread = (f"land{'s' * one} on {w.tile_writes} of the {w.crossbars} streamed crossbars "
                  f"({same})" if w.tile_writes < w.crossbars
                  else f"{'goes' if one else 'go'} round-robin over {w.crossbars} streamed "
                       f"crossbar{'s' * (w.crossbars != 1)}")
        line = (f"{head}: {w.tile_writes} tile write{'s' * (not one)}/inference "
                f"{spread}, {w.per_cell:.3g} "
                f"write{'s' * (w.per_cell != 1)} per cell per "
                f"inference; worn out after {w.inferences:.3g} inferences, "
                f"{cim_wear.duration(w.seconds)} back to back at {si(w.seconds_per_inference, 's')} "
                f"per inference ({what})")
        note = ""
        if w.short:
            note = (f"note: the crossbars wear out in under a year of back-to-back inference; "
                    f"cost placement's endurance budget keeps them longer: --max-writes-per-cell "
                    f"{w.endurance:.3g} --lifetime-inferences N holds these most-written cells to "
                    f"their endurance over N inferences, --max-writes-per-cell 0 writes the cells "
                    f"only at load (both move kernels off the crossbars where they must)")
        return Wear(w.figures(), line, note)

    def option_warnings(self, options: dict) -> list[str]:
        """A time after programming (``cim_time_s``, ``--cim-time``) given for the ``ideal``
        data path: exact fp32 arithmetic has no device effects to age, so the kernels record
        no time (``evaluate`` refuses the same combination as a run option)."""
        mode = options.get("cim_mode") or CrossbarOptions.mode
        time_s = options.get("cim_time_s")
        if mode == "ideal" and time_s:
            return [(f"cim_time_s={time_s:g} s (--cim-time) changes nothing on crossbar mode "
                     "'ideal' (exact fp32 arithmetic, no device effects): no time is recorded; "
                     "choose a data path with device effects, --cim-mode device")]
        return []

    def cost_notes(self, options: dict) -> list[str]:
        """The note that the chip's per-array figures are scaled from its published array
        (:func:`.presets.resize`) when ``options`` select another size; [] otherwise (or when
        the options are bad: their check names them)."""
        try:
            p = params_from_options(options, self.params)
        except (KeyError, TypeError, ValueError):
            return []
        if not p.scaled_from:
            return []
        r0, c0 = p.scaled_from
        return [(f"(crossbar figures scaled from {r0}x{c0}, {p.name}'s published array, to "
                 f"{p.rows}x{p.cols}: per cell, per converted column and row, per array edge; "
                 "docs/crossbar-presets.md, 'Other array sizes')")]

    def recorded_options(self, plans: list) -> dict:
        """The crossbar options the plans were compiled with (``cim_preset``, ``cim_rows``, ``cim_cols``,
        ``cim_loop_order``, ``cim_link_gbps`` if given and the crossbar count
        ``cim_device_crossbars`` of the first kernel), so a report judges residency with the crossbars the model was compiled for.
        Models written before ``cim_device_crossbars`` existed give the largest
        ``cim_crossbars`` of a kernel (a lower bound). ``plans`` as in :meth:`summary`."""
        plans = [a for *_, a in plans if "cim_rows" in a]
        if not plans:
            return {}
        at = plans[0]
        count = at.get("cim_device_crossbars") or max(a["cim_crossbars"] for a in plans)
        out = {"cim_preset": at.get("cim_preset", OLD_DEFAULT), "cim_rows": at["cim_rows"],
               "cim_cols": at["cim_cols"], "cim_crossbars": count,
               "cim_loop_order": at["cim_loop_order"]}
        if "cim_link_gbps" in at:  # a link other than the default, given to optimize
            out["cim_link_gbps"] = at["cim_link_gbps"]
        return out

    # -- code -------------------------------------------------------------------------------
    def _replan(self, op: OpInfo, attrs: dict):
        v = layout.op_view(op, attrs["cim_operand"])
        p, params = plan_recorded(v, attrs, self.params)
        return p, v, params

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write ``<stem>.xbar`` under ``root/memristor`` and return its path.

        The weights are not copied: the file names the model's tensors (``weight W G K N
        model:<programmed operand>``, and ``bias C model:<bias>`` when the bias fits the
        ``[G, 1, N]`` form), which :meth:`kernel` hands to the simulator from the model. So the
        model and its kernel folder hold one copy of every weight (``docs/xbar-format.md``).
        A programmed operand that is an activation is named too; the runtime supplies it.
        Kernels over one tile set (``cim_tile_kernel``: the tiles of an earlier kernel over the
        same weights) name the same tensor; that kernel's load programs the tiles.
        """
        memo = emit_memo("memristor")  # kernels of one shape (DenseNet's 3x3 convolutions):
        # planned and their file's fixed text rendered once per save
        ins = op.inputs
        try:
            key = (op.op_type, attrs["cim_operand"], ins[0].static_shape, ins[1].static_shape,
                   attrs["cim_rows"], attrs["cim_cols"], attrs["cim_crossbars"],
                   attrs["cim_loop_order"], attrs.get("cim_preset", OLD_DEFAULT),
                   bool(attrs.get("cim_shared", 0)), int(attrs.get("cim_first_crossbar", 0)))
            hit = memo.get(key)
        except (IndexError, KeyError, TypeError):  # made again, for its own error
            key = hit = None
        if hit is None:
            hit = self._replan(op, attrs)
            if key is not None:
                memo[key] = hit
        p, v, params = hit
        rel = PurePath(attrs["kernel"])
        outdir = os.path.join(root, rel.parent)  # strings: a Path per step cost more than the rest
        names = [t.name for t in op.inputs]
        prog = names[0] if v.operand == "A" else names[1]
        bias = None
        if len(names) > 2 and names[2] in consts and layout.bias_per_group(v, _shape(op, consts)):
            bias = codegen.model_source(names[2])
        mode = _mode(attrs, params)
        if _is_int(op):  # integer weights in cells as they are (dtype int32)
            A, B = consts.get(names[0]), consts.get(names[1])
            mode = {"int_cells": int_cells(layout.weights(v, A, B) if prog in consts else None,
                                           params)}
            parts = codegen.render_parts(p, params, bias is not None, **mode)
        else:  # the text around the name and sources, once per plan, array, mode and bias
            # (the plan's fields in the text, not the rows streamed: DenseNet's convolutions of
            # one weight shape in every block)
            try:
                shape = (codegen.text_key(p), id(params), attrs.get("cim_mode", "ideal"), attrs.get("cim_effects"),
                         attrs.get("cim_time_s", 0.0), bias is not None)
                hit = memo.get(shape)
            except TypeError:  # an unhashable attribute: rendered, not remembered
                shape = hit = None
            if hit is None or hit[0] is not params:  # the array itself (its id may be reused)
                hit = (params, codegen.render_parts(p, params, bias is not None, **mode))
                if shape is not None:
                    memo[shape] = hit
            parts = hit[1]
        text = codegen.fill(parts, rel.stem, codegen.model_source(prog), bias)
        path = os.path.join(outdir, rel.name)
        try:  # one folder for every crossbar kernel: made by the first (no look before each)
            return [write_kernel_file(path, text)]
        except (FileNotFoundError, NotADirectoryError):
            os.makedirs(outdir, exist_ok=True)  # raises as before when it cannot be made
            return [write_kernel_file(path, text)]

    def kernel(self, op: OpInfo, attrs: dict, root, consts: dict | None = None,
               mode: str = "simulate", run_options: dict | None = None,
               shared: dict | None = None):
        """A callable running the node's ``.xbar`` kernel in the simulator (see
        :class:`onnx_cinm.devices.memristor.kernel.CrossbarKernel`), in the data path the file
        was compiled with, or the one ``run_options`` (:class:`CrossbarRunOptions` fields)
        make of it; kernels given the same ``shared`` dict hold one simulator copy of the
        weights they program from the same constant (the steps of an unrolled recurrence).
        Raises CinmError if they do not go together (an ideal data path at a time
        after programming)."""
        from .kernel import CrossbarKernel

        data_path = _run_mode(attrs, self.params, run_options) if run_options else None
        return CrossbarKernel(op, attrs, Path(root) / attrs["kernel"], consts or {}, data_path,
                              shared, base=self.params)

    def from_patches(self, kernel, geometry: tuple, activation: str | None = None,
                     groups: int = 1):
        """:meth:`CrossbarKernel.patch_runner` of a crossbar kernel (ideal mode, programmed
        weights: the product computed as a convolution of the Im2Col's input)."""
        from .kernel import CrossbarKernel

        return kernel.patch_runner(geometry, activation, groups) \
            if isinstance(kernel, CrossbarKernel) else None


def plan_recorded(v, attrs: dict, base: CrossbarParams = DEFAULT) -> tuple:
    """``(plan, params)``: the :class:`~onnx_cinm.paradigms.cim.schedule.CrossbarPlan` of the
    product ``v`` (a :class:`~onnx_cinm.paradigms.cim.layout.ProductView`) under the plan
    options a crossbar node records (``cim_rows``, ``cim_cols``, ``cim_crossbars``,
    ``cim_loop_order``, ``cim_preset``, ``cim_shared``, ``cim_first_crossbar``), and the
    :class:`~.presets.CrossbarParams` they select from ``base``. What :meth:`MemristorDevice.emit`
    writes a kernel from, and what a kernel whose programmed operand is an activation is
    planned again from at a run's sizes (:class:`.kernel.CrossbarKernel`). Raises KeyError
    for a missing attribute, ValueError for a size the planner refuses."""
    options = {"cim_rows": attrs["cim_rows"], "cim_cols": attrs["cim_cols"],
               "cim_crossbars": attrs["cim_crossbars"], "cim_loop_order": attrs["cim_loop_order"],
               "cim_preset": attrs.get("cim_preset", OLD_DEFAULT)}
    params = params_from_options(options, base)
    p = schedule.plan_product(v, params, attrs["cim_loop_order"],
                              shared=bool(attrs.get("cim_shared", 0)),
                              first=int(attrs.get("cim_first_crossbar", 0)))
    return p, params


def _first_crossbars(items: list, plans: list) -> list[int]:
    """Per kernel (``items`` ``[(OpInfo, options)]`` in execution order, ``plans`` their
    :class:`~onnx_cinm.paradigms.cim.schedule.CrossbarPlan`), the crossbar of the shared pool
    its first tile goes to (0 for a kernel that does not stream through it): the streamed
    kernels that run every inference continue one round-robin over the pool in execution
    order, then those that do not (an If branch the planning probe saw untaken), so the tile
    writes of an inference land ``ceil(writes / pool)`` times at most on any crossbar
    (:mod:`onnx_cinm.paradigms.cim.wear`). Each kernel starting at the pool's first crossbar
    wrote it once per streaming kernel: two attention products of a GRU decoder at batch 3,
    3 tiles each over a pool of 48, wrote crossbars 0-2 twice per inference, while the wear
    line said once (trial s36)."""
    out = [0] * len(plans)
    at = 0
    for runs in (True, False):
        for i, ((_, opts), p) in enumerate(zip(items, plans)):
            if p.shared and bool(opts.get("per_inference", True)) == runs:
                out[i] = at % p.crossbars
                at += p.writes_per_inference
    return out


#: The crossbar table's energy column of each cost term.
_ENERGY_COLUMN = {"array": "E array", "adc_dac": "E adc/dac", "periphery": "E periph"}


def _folded_terms(attrs: dict) -> tuple[tuple, str]:
    """``(terms, into)``: the cost terms the preset a crossbar node was planned for publishes
    only inside another term's figures, and that term (``CrossbarParams.folded`` and
    ``folded_into``; ``((), "array")`` for a preset not known here)."""
    p = PRESETS.get(attrs.get("cim_preset", OLD_DEFAULT))
    return (p.folded, p.folded_into) if p is not None else ((), "array")


def _streamed_crossbars(plans: list) -> int:
    """The crossbars of the streaming pool the kernels of ``plans`` (``[(name, op type,
    attrs)]``) write: a kernel streaming alone (not ``cim_shared``: more tiles than its
    crossbars, serpentine) every crossbar of its ``cim_crossbars``; kernels sharing the pool
    continue one round-robin over it (``cim_first_crossbar``), so their tile writes per
    inference, all of them summed, up to the pool's size. 0 when no kernel streams."""
    alone = [a["cim_crossbars"] for *_, a in plans if not a["cim_resident"] and not a.get("cim_shared")]
    pool = max((a["cim_crossbars"] for *_, a in plans if a.get("cim_shared")), default=0)
    writes = sum(a["cim_writes"] for *_, a in plans if a.get("cim_shared"))
    return max(max(alone, default=0), min(pool, writes))


def _use_note(plans: list, used: int) -> str:
    """The summary's line on the chip's crossbars: how many the kernels of ``plans`` (``[(name,
    op type, attrs)]``, every kernel loaded: an If's branches' too) use of
    the ``cim_device_crossbars`` they share, kept by resident kernels and streamed through by
    the others; ``EXCEEDS`` when ``used`` is more than the chip has (plans made apart, as by
    a compiler that planned each If branch as if it had the whole chip)."""
    chip = max((int(a.get("cim_device_crossbars") or 0) for *_, a in plans), default=0)
    kept = sum(a["cim_crossbars"] for *_, a in plans
               if a["cim_resident"] and not a.get("cim_tile_owner"))
    streamed = [name for name, _, a in plans if not a["cim_resident"]]
    text = f"crossbars: {used} in use"
    if chip:
        text += f" of the chip's {chip}"
    text += f", {kept} kept by resident kernels"
    if streamed:
        shown = ", ".join(streamed[:3]) + (f" and {len(streamed) - 3} more" if len(streamed) > 3
                                           else "")
        pool = max(a["cim_crossbars"] for *_, a in plans if not a["cim_resident"])
        of = f" of a pool of {pool}" if used - kept < pool else ""
        text += f", {used - kept}{of} streamed through by {len(streamed)} kernel" \
                f"{'s' * (len(streamed) != 1)} ({shown})"
    if chip and used > chip:
        text += f"; EXCEEDS the chip's {chip} crossbars (plans made apart: compile again)"
    return f"({text})"


def _tile_owners(items: list, planned: list) -> list[int]:
    """Per kernel, the index of the first kernel over the same tile set (itself if none before
    it): the same constant initializer (by name) programmed as the same operand into the same
    ``[G, K, N]`` view. ``planned`` holds the memo entries (:meth:`MemristorDevice._entry`) of
    ``items`` alone. A kernel whose programmed operand is an activation shares nothing."""
    first: dict = {}
    out = []
    for i, ((op, _), e) in enumerate(zip(items, planned)):
        _, v, _, const, _ = e[0]
        if not const:
            out.append(i)
            continue
        out.append(first.setdefault(_tile_set(op, v), i))
    return out


def _goal(items: list, alone: list, owner: list, sets: list,
          params: CrossbarParams) -> residency.Goal:
    """What the residency choice of :meth:`MemristorDevice._allocate` minimizes: the options'
    ``objective`` (the key cost placement minimizes, default
    :data:`~onnx_cinm.options.DEFAULT_OBJECTIVE`, energy) over the crossbar kernels that run
    per inference, under the endurance budget the options give (``max_writes_per_cell`` over
    ``lifetime_inferences``, cost placement's constraint), so that more crossbars never make
    the objective worse (:class:`~onnx_cinm.paradigms.cim.residency.Goal`). Per tile set: the
    rows its running kernels stream (``M`` of each kernel's plan alone, summed); for ``edp``,
    the energy no allocation changes (each running kernel's energy alone less its writes')."""
    opts = items[0][1]
    # the objective and the budget are cost placement's: the heuristic placement keeps the
    # default split, as its help says (--objective and the budget apply to cost placement only)
    cost = opts.get("placement") != "heuristic"
    objective = (opts.get("objective") if cost else None) or DEFAULT_OBJECTIVE
    rows = {i: 0 for i in sets}
    fixed = 0.0
    e_write = residency.tile_write_energy_j(params)
    for (_, o), e, own in zip(items, alone, owner):
        if not o.get("per_inference", True):
            continue
        p = e[0][0]
        rows[own] += p.M
        if objective == "edp":
            fixed += p.cost(e[0][2]).energy_j - p.writes_per_inference * e_write
    budget = opts.get("max_writes_per_cell") if cost else None
    return residency.Goal(params, [rows[i] for i in sets], objective, fixed,
                          None if budget is None else float(budget),
                          float(opts.get("lifetime_inferences") or 1.0))


def _tile_set(op: OpInfo, v) -> str:
    """The tile set of ``op``'s constant programmed operand under view ``v``: its initializer's
    name, the op type, the operand and the ``[G, K, N]`` view (kernels with the same one program
    the same tiles)."""
    t = op.inputs[0] if v.operand == "A" else op.inputs[1]
    return f"{t.name}|{op.op_type}|{v.operand}|{v.G}x{v.K}x{v.N}"


def _mm2(area: float) -> str:
    """An area in mm^2 for the kernel table, to 3 significant digits as the table's other
    figures (``0.00511 mm2``, ``2.48 mm2``, ``1234 mm2`` rounded whole); '-': not published."""
    if not area:
        return "-"
    text = f"{area:.3g}"
    return f"{area:.0f} mm2" if "e" in text else f"{text} mm2"


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


def _run_mode(attrs: dict, base: CrossbarParams, run: dict):
    """The :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` of a run: the node's compiled
    data path (``cim_mode``, ``cim_time_s``, ``cim_effects``, its preset) changed by the run
    options ``run`` (:class:`CrossbarRunOptions` fields). CinmError if they do not fit."""
    params = params_from_options({"cim_preset": attrs.get("cim_preset")}, base)
    compiled = attrs.get("cim_mode", "ideal")
    name = run.get("mode") or compiled
    effects = run.get("effects")
    if effects is None and name == compiled and attrs.get("cim_effects") is not None:
        effects = [e for e in attrs["cim_effects"].split(",") if e]
    time_s = run.get("time_s")
    if name == "ideal" and time_s:
        raise CinmError("crossbar mode 'ideal' has no time after programming (exact fp32 "
                        "arithmetic); choose a data path with device effects: cim_mode=device "
                        "(evaluate --cim-mode device)")
    if time_s is None:
        time_s = attrs.get("cim_time_s", 0.0)
    try:
        from .nonideal import compose

        return compose(name, params, time_s, effects, seed=run.get("seed") or 0,
                       adc_bits=run.get("adc_bits"), stuck_at=run.get("stuck_at"),
                       drift_compensation=run.get("drift_compensation"),
                       adc_calibration=run.get("adc_calibration"),
                       timed=run.get("time_s") is not None)
    except ValueError as e:
        raise CinmError(f"crossbar run options: {e}") from None


def _shape(op: OpInfo, consts: dict) -> tuple:
    """The shape of the constant third input of ``op`` (the bias), read without converting
    the array: its info's when the info is a constant's (an initializer's dims, which the
    array has), else the array's."""
    info = op.inputs[2]
    if info.const and info.shape is not None and all(type(d) is int for d in info.shape):
        return tuple(info.shape)
    return consts[info.name].shape


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
