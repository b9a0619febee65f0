"""Samsung HBM-PIM (Aquabolt-XL / FIMDRAM) device (paradigm ``cnm``), registered on import.

A 16-lane FP16 SIMD unit (PCU) beside every pair of DRAM banks, 128 per HBM2 cube at 300 MHz,
programmed through a 32-entry command register file (CRF) and driven by ordinary DRAM column
commands (Kwon et al., ISSCC 2021; Lee et al., ISCA 2021; figures and sources in
:mod:`.params`, ``shared/field-notes/chips.md`` §3.1). This package is the whole device: the
layers above reach it only through the registry and the :class:`~onnx_cinm.devices.Device`
contract; it is loaded through the entry point ``onnx_cinm.devices: hbm_pim``.

What it runs (its ISA: ADD, MUL, MAC, MAD, MOV, FILL, NOP, JUMP, EXIT; :mod:`.program`):

- ``Gemv`` with a constant matrix and ``Gemm`` with a constant 2-D operand: the GEMV kernel
  (MAC over GRF_A x bank into GRF_B), the weights resident in the banks; a Gemm runs it once per
  input vector (row of A, or column of B);
- elementwise ``Add`` and ``Mul`` of two operands of one static shape, or of an operand and a
  scalar (held in the SRF); ``Relu`` (MOV with the ReLU bit);
- in float16; float32 ops only with option ``hbm_pim_accept_float32`` (computed in FP16).

Modes (provider option ``hbm_pim_mode``): ``model`` (default: the reference body on the host,
charged the plan's cost) and ``simulate`` (the emitted program run by the functional model,
:mod:`.kernel`, whose FP16 semantics and tolerance are stated there).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...errors import CinmError
from ...graph import dtype_name
from ...options import check
from ...text import fold_rows, printable, si
from .. import register
from ..base import Cost, Device, OpInfo, Priced, Resources, Support
from .params import HbmPimOptions, HbmPimParams

if TYPE_CHECKING:
    from .program import PimPlan

# the ISA (.program), the cost model (.cost) and the code generator (.codegen) load at the first
# op this device plans: a float32 model never asks (each op is refused before a plan), and the
# commands that do not compile load this package for its options alone

#: The plan attributes of an HBM-PIM kernel (per inference unless ``_load``; seconds, joules).
PLAN_ATTRS = {
    "pim_op": "string", "pim_form": "string", "pim_precision": "string",
    "pim_pcus": "int", "pim_channels": "int", "pim_M": "int", "pim_K": "int",
    "pim_runs": "int", "pim_grf_tiles": "int", "pim_row_groups": "int",
    "pim_elements": "int", "pim_scalar": "int", "pim_instructions": "int",
    "pim_triggers": "int", "pim_resident_bytes": "int", "pim_pin_gbps": "string",
    "pim_latency_s": "float", "pim_energy_j": "float", "pim_load_s": "float",
    "pim_load_j": "float",
}

_ELTWISE = {"Add": "ADD", "Mul": "MUL", "Relu": "RELU"}


def _static(t) -> bool:
    return t.shape is not None and all(isinstance(d, int) for d in t.shape)


def gemv_form(op: OpInfo) -> tuple[str, int, int, int] | str:
    """``(form, M, K, runs)`` of a matrix product the GEMV kernel computes, or why not.

    Forms: ``gemv`` (cinm Gemv with a constant ``A[M, K]``; 1 run), ``gemm_b`` (Gemm with a
    constant ``B[K, N]``: ``W = B^T``, one run per row of A), ``gemm_a`` (Gemm with a constant
    ``A[M, K]`` and ``B[K, N]``: one run per column of B). Symbolic batch dims count as 1."""
    a, b = op.inputs[0], op.inputs[1]
    if a.shape is None or b.shape is None:
        return "operand shapes unknown"
    if op.op_type == "Gemv":
        if not (a.const and _static(a) and len(a.shape) == 2):
            return "the matrix is not a constant (the GEMV kernel keeps weights in the banks)"
        return "gemv", a.shape[0], a.shape[1], 1
    if b.const and _static(b) and len(b.shape) == 2 and len(a.shape) >= 2:
        if a.shape[-1] != b.shape[0]:
            return f"contracted dim unknown at planning time ({a.shape} x {b.shape})"
        return "gemm_b", b.shape[1], b.shape[0], math.prod(a.static_shape[:-1])
    if a.const and _static(a) and len(a.shape) == 2 and len(b.shape) == 2:
        if b.shape[0] != a.shape[1]:
            return f"contracted dim unknown at planning time ({a.shape} x {b.shape})"
        return "gemm_a", a.shape[0], a.shape[1], b.static_shape[1]
    return "no constant 2-D operand (the GEMV kernel keeps weights in the banks)"


def eltwise_form(op: OpInfo) -> tuple[str, int, int] | str:
    """``(PIM op, elements, scalar input or -1)`` of an elementwise op, or why not."""
    if any(not _static(t) for t in op.inputs + op.outputs):
        return "shapes must be static (the program's loop counts are fixed when it is emitted)"
    out = op.outputs[0]
    if op.op_type == "Relu":
        return "RELU", out.numel, -1
    a, b = op.inputs[0], op.inputs[1]
    if a.shape == b.shape == out.shape:
        return _ELTWISE[op.op_type], out.numel, -1
    for i, t in ((1, b), (0, a)):
        other = op.inputs[1 - i]
        if t.numel == 1 and other.shape == out.shape:
            return _ELTWISE[op.op_type], out.numel, i
    return f"broadcasting {a.shape} with {b.shape}: only same shapes or a scalar operand"


class HbmPimDevice(Device):
    """Samsung HBM-PIM: GEMV with resident FP16 weights and elementwise Add/Mul/Relu near the
    banks (see the package docstring; constants in :class:`.params.HbmPimParams`)."""

    name = "hbm_pim"
    paradigm = "cnm"
    option_prefix = "hbm_pim"
    Options = HbmPimOptions
    attr_prefix = "pim"
    plan_attrs = PLAN_ATTRS
    modes = ("model", "simulate")

    def __init__(self, params: HbmPimParams = HbmPimParams()):
        self.params = params

    # -- options --------------------------------------------------------------------------------
    def _opt(self, options: dict, field: str):
        key = f"{self.option_prefix}_{field}"
        return check(self.option_specs()[key], (options or {}).get(key))

    def _pcus(self, options: dict) -> int:
        pcus = self._opt(options, "pcus") or self.params.pcus
        per = self.params.pcus_per_channel
        if pcus % per:
            raise CinmError(f"option hbm_pim_pcus={pcus}: expected a multiple of {per} "
                            "(the PCUs of a pseudo-channel run in lockstep)")
        return pcus

    def check_options(self, options: dict) -> None:
        """CinmError unless ``hbm_pim_pcus`` is a multiple of the PCUs of a pseudo-channel (the
        schema checks its range; this rule is the device's), so a bad value is an error where
        options are checked, not a device that silently refuses every op."""
        self._pcus(options)

    # -- what it runs ---------------------------------------------------------------------------
    def _dtype(self, op: OpInfo) -> str | None:
        names = {None if t.dtype is None else dtype_name(t.dtype) for t in op.inputs + op.outputs}
        return names.pop() if len(names) == 1 else None

    def _form(self, op: OpInfo):
        if op.op_type in ("Gemv", "Gemm"):
            if len(op.inputs) < 2:
                return "a matrix product needs two operands"
            return gemv_form(op)
        if op.op_type in _ELTWISE:
            if len(op.inputs) != (1 if op.op_type == "Relu" else 2):
                return "unexpected operand count"
            return eltwise_form(op)
        return None

    def supports(self, op: OpInfo) -> Support:
        """What the PCUs run in FP16 (see the package docstring); a float32 op is refused as
        not applicable (it runs only under :meth:`supports_under` with
        ``hbm_pim_accept_float32``), so float32 models are placed as without this device."""
        return self._supports(op, accept_float32=False)

    def supports_under(self, op: OpInfo, options: dict) -> Support:
        """:meth:`supports`, float32 ops included when ``hbm_pim_accept_float32`` is true
        (then computed in FP16; the reason says so). Raises CinmError on a bad option value."""
        return self._supports(op, accept_float32=bool(self._opt(options, "accept_float32")))

    def _supports(self, op: OpInfo, accept_float32: bool) -> Support:
        if op.attrs.get("y_perm") is not None:  # writes_permuted: no
            return Support(False, "a Gemm written permuted (y_perm): the PCUs write A @ B as "
                                  "it is")
        if op.op_type not in ("Gemv", "Gemm") and op.op_type not in _ELTWISE:  # _form: None
            return Support(False, f"HBM-PIM's ISA computes GEMV, Add, Mul and Relu, not "
                                  f"{op.op_type}", applicable=False)
        dt = self._dtype(op)
        if dt == "float32" and not accept_float32:  # before the shape: not this device's dtype
            # (and before its form: placement asks for every op of a float32 model)
            return Support(False, "float32: the PCUs compute FP16 (hbm_pim_accept_float32=true "
                                  "rounds it to FP16)", applicable=False)
        form = self._form(op)
        if isinstance(form, str):
            return Support(False, form)
        if dt not in ("float16", "float32"):
            return Support(False, f"dtype {dt or 'mixed/unknown'}: the PCUs compute FP16")
        try:
            plan = self.plan(op, {})
        except CinmError as e:
            return Support(False, str(e))
        what = (f"GEMV kernel, {plan.M}x{plan.K} weights resident, {plan.runs} run(s)"
                if plan.op == "GEMV" else f"{plan.op} over {plan.n} elements")
        if dt == "float32":
            return Support(True, f"{what} on {plan.pcus} PCUs: float32 computed in FP16 "
                                 "(hbm_pim_accept_float32)")
        return Support(True, f"{what} on {plan.pcus} PCUs (FP16 near the banks)")

    def plan(self, op: OpInfo, options: dict) -> PimPlan:
        """The :class:`~.program.PimPlan` of ``op`` under ``options`` (``hbm_pim_pcus``).
        Raises CinmError if the device cannot run it or its data do not fit the banks."""
        from .program import plan_eltwise, plan_gemv

        pcus = self._pcus(options)
        form = self._form(op)
        if form is None or isinstance(form, str):
            raise CinmError(f"hbm_pim cannot run {op.op_type} '{op.name}': "
                            f"{form or 'not in its ISA'}")
        if op.op_type in ("Gemv", "Gemm"):
            _, M, K, runs = form
            plan = plan_gemv(M, K, runs, pcus, self.params.pcus_per_channel)
        else:
            pim_op, n, scalar = form
            const = tuple(i for i, t in enumerate(op.inputs) if t.const)
            plan = plan_eltwise(pim_op, n, pcus, scalar, self.params.pcus_per_channel, const)
        bank = self.params.capacity_bytes // (2 * self.params.pcus)
        if plan.bank_cols * self.params.column_bytes > bank:
            raise CinmError(f"hbm_pim: {op.op_type} '{op.name}' needs "
                            f"{plan.bank_cols * self.params.column_bytes} B per bank on "
                            f"{pcus} PCUs, more than a bank's {bank} B")
        return plan

    def _costed(self, op: OpInfo, options: dict):
        from .cost import kernel_cost

        plan = self.plan(op, options)
        return plan, kernel_cost(plan, self.params, self._opt(options, "pin_gbps"))

    def cost(self, op: OpInfo, options: dict) -> Cost:
        """Modeled cost of one inference of ``op`` (:mod:`.cost`): mode switches, the kernel's
        own interface traffic (CRF, broadcast inputs, partial sums) and its triggers at 300 MHz.
        Tensors crossing between the host and the device are priced by :meth:`transfer_cost`."""
        plan, c = self._costed(op, options)
        return Cost(c.latency_s, c.energy_j, 0, c.interface_bytes)

    def resources(self, options: dict) -> Resources:
        """The banks of the PCUs in use hold resident weights: ``capacity x pcus / 128`` bytes."""
        return Resources(memory_bytes=self.params.capacity_bytes * self._pcus(options)
                         // self.params.pcus)

    def price(self, op: OpInfo, options: dict) -> list[Priced]:
        """One choice: the kernel's cost, a GEMV's padded weights (or an elementwise op's
        constant operands) resident in the banks, loaded once. Raises CinmError as :meth:`plan`
        does."""
        plan, c = self._costed(op, options)
        return [Priced(Cost(c.latency_s, c.energy_j, 0, c.interface_bytes),
                       resident_bytes=c.resident_bytes, load_s=c.load_s, load_j=c.load_j)]

    def transfer_cost(self, nbytes: int, to_device: bool, options: dict) -> Cost:
        """``nbytes`` over the HBM interface of the channels in use, written to (or read from)
        the banks (:func:`.cost.transfer`: 307.2 GB/s, 3.9 + 1.56 pJ/bit by default)."""
        from .cost import transfer

        s, j = transfer(nbytes, self.params, self._pcus(options) // self.params.pcus_per_channel,
                        self._opt(options, "pin_gbps"))
        return Cost(s, j, 0, nbytes)

    # -- compiling ------------------------------------------------------------------------------
    def lower(self, items: list) -> list[dict]:
        """The ``pim_*`` attributes (:data:`PLAN_ATTRS`) plus ``kernel``
        (``hbm_pim/<stem>.pim``) of every ``(OpInfo, options)``; each kernel runs alone (the
        CRF holds one program). Raises CinmError on bad options, an op it cannot run, or a
        float32 op without ``hbm_pim_accept_float32``."""
        return [self._lower_one(op, options) for op, options in items]

    def _lower_one(self, op: OpInfo, options: dict) -> dict:
        f32 = self._dtype(op) == "float32"
        if f32 and not self._opt(options, "accept_float32"):
            raise CinmError(f"hbm_pim: {op.op_type} '{op.name}' is float32; the PCUs compute "
                            "FP16 (set hbm_pim_accept_float32=true to round it to FP16)")
        plan, c = self._costed(op, options)
        form = self._form(op)[0] if plan.op == "GEMV" else "eltwise"
        pin = self._opt(options, "pin_gbps")
        return {
            "pim_op": plan.op, "pim_form": form, "pim_precision": "fp32 as fp16" if f32 else "fp16",
            "pim_pcus": plan.pcus, "pim_channels": plan.channels, "pim_M": plan.M,
            "pim_K": plan.K, "pim_runs": plan.runs, "pim_grf_tiles": plan.tiles,
            "pim_row_groups": plan.groups, "pim_elements": plan.n, "pim_scalar": plan.scalar,
            "pim_instructions": len(plan.crf), "pim_triggers": c.triggers,
            "pim_resident_bytes": c.resident_bytes,
            # decimal text: a FLOAT attribute is float32, and 2.4 read back 2.4000000953674316
            "pim_pin_gbps": repr(float(self.params.pin_gbps if pin is None else pin)),
            "pim_latency_s": float(c.latency_s), "pim_energy_j": float(c.energy_j),
            "pim_load_s": float(c.load_s), "pim_load_j": float(c.load_j),
            "kernel": f"hbm_pim/{options['kernel_stem']}.pim",
        }

    def _replan(self, op: OpInfo, attrs: dict) -> PimPlan:
        """The plan a node's attributes record; CinmError if they do not describe it."""
        try:
            plan = self.plan(op, {"hbm_pim_pcus": int(attrs["pim_pcus"])})
        except KeyError as e:
            raise CinmError(f"hbm_pim: node '{op.name}' has no plan attribute {e}") from None
        if plan.op != attrs.get("pim_op") or len(plan.crf) != attrs.get("pim_instructions"):
            raise CinmError(f"hbm_pim: the plan of node '{op.name}' does not match its op")
        return plan

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write ``hbm_pim/<stem>.pim`` (CRF program, command stream, layout, counts;
        :mod:`.codegen`) and, for a GEMV, ``<stem>.W.npy`` (the weights in FP16 per PCU and
        bank) under ``root``. Raises CinmError if the path leaves ``root`` or a GEMV's weights
        are not among ``consts``."""
        from . import codegen

        path = codegen.kernel_path(root, attrs["kernel"])
        plan = self._replan(op, attrs)
        weights = None
        if plan.op == "GEMV":
            form = attrs.get("pim_form")
            name = op.inputs[1].name if form == "gemm_b" else op.inputs[0].name
            if name not in consts:
                raise CinmError(f"hbm_pim: the weights '{name}' of node '{op.name}' are not a "
                                "constant of the model")
            w = np.asarray(consts[name])
            weights = w.T if form == "gemm_b" else w
        return codegen.write(plan, attrs.get("pim_form", ""), attrs.get("pim_precision", "fp16"),
                             op.name, path, weights)

    def kernel(self, op: OpInfo, attrs: dict, root, consts: dict | None = None,
               mode: str = "simulate", run_options: dict | None = None,
               shared: dict | None = None):
        """The functional model running the node's emitted program (:class:`.kernel.
        HbmPimKernel`); None in mode ``model``."""
        if mode == "model":
            return None
        from . import codegen
        from .kernel import HbmPimKernel
        return HbmPimKernel(op, attrs, codegen.kernel_path(Path(root), attrs["kernel"]),
                            self.params)

    # -- reading plans back ---------------------------------------------------------------------
    def inexact(self, attrs: dict, mode: str, run_options: dict | None = None) -> str | None:
        """A GEMV simulated as the PCUs compute it accumulates in FP16 lanes (a float32 op, or an
        FP16 one whose reference accumulates wider), so it differs from onnxruntime by design;
        the elementwise kernels round once, as onnxruntime does."""
        if mode == "simulate" and attrs.get("pim_op") == "GEMV":
            return "HBM-PIM FP16 accumulation"
        if mode == "simulate" and attrs.get("pim_precision") == "fp32 as fp16":
            return "HBM-PIM float32 computed in FP16"
        return None

    def recorded(self, attrs: dict) -> Priced | None:
        """The choice a lowered HBM-PIM node made, from its ``pim_*`` attributes."""
        if "pim_latency_s" not in attrs:
            return None
        return Priced(Cost(float(attrs["pim_latency_s"]), float(attrs["pim_energy_j"]), 0, 0),
                      resident_bytes=int(attrs.get("pim_resident_bytes", 0)),
                      load_s=float(attrs.get("pim_load_s", 0.0)),
                      load_j=float(attrs.get("pim_load_j", 0.0)))

    def recorded_options(self, plans: list) -> dict:
        """``hbm_pim_pcus`` and ``hbm_pim_pin_gbps`` of the first kernel, and
        ``hbm_pim_accept_float32`` if any kernel computes float32 in FP16."""
        plans = [a for *_, a in plans if "pim_pcus" in a]
        if not plans:
            return {}
        out = {"hbm_pim_pcus": plans[0]["pim_pcus"], "hbm_pim_pin_gbps": float(plans[0]["pim_pin_gbps"])}
        if any(a.get("pim_precision") == "fp32 as fp16" for a in plans):
            out["hbm_pim_accept_float32"] = True
        return out

    def summary(self, plans: list, counted: list | None = None, fold: bool = True) -> str:
        """Per HBM-PIM kernel: its op and sizes, PCUs, K tiles x row groups (GEMV), CRF
        instructions, AB-PIM triggers per inference, modeled latency and energy per inference
        (:mod:`.cost`); then the totals. ``plans`` is ``[(node name, op type, attrs)]``; the
        per-inference totals (triggers, latency, energy) leave out the kernels ``counted``
        marks False (an If branch that does not run per inference), the resident bytes count
        every kernel. ``fold``: the kernels of one source op with the same figures in one row,
        ``<op> xN`` (:func:`onnx_cinm.text.fold_rows`)."""
        flags = [True] * len(plans) if counted is None else list(counted)
        keep = [k for k, p in enumerate(plans) if "pim_op" in p[2]]
        plans, flags = [plans[k] for k in keep], [flags[k] for k in keep]
        if not plans:
            return ""
        head = (f"{'HBM-PIM kernel':30s} {'op':>5s} {'size':>16s} {'PCUs':>5s} {'tiles x grp':>11s} "
                f"{'CRF':>4s} {'triggers':>9s} {'resident':>10s} {'latency':>10s} {'energy':>10s}")
        rows = [head, "-" * len(head)]
        tot = {"trig": 0, "res": 0, "lat": 0.0, "en": 0.0}
        cells = []
        for (name, _op, a), per_inf in zip(plans, flags):
            if a["pim_op"] == "GEMV":
                size = f"{a['pim_M']}x{a['pim_K']}" + (f" x{a['pim_runs']}" if a["pim_runs"] != 1 else "")
                tg = f"{a['pim_grf_tiles']}x{a['pim_row_groups']}"
            else:
                size, tg = f"{a['pim_elements']}", "-"
            cells.append((name, a["pim_op"], size, a["pim_pcus"], tg, a["pim_instructions"],
                          a["pim_triggers"], si(a["pim_resident_bytes"]) + "B",
                          si(a["pim_latency_s"]) + "s", si(a["pim_energy_j"]) + "J"))
            tot["res"] += a["pim_resident_bytes"]
            if per_inf:
                tot["trig"] += a["pim_triggers"]
                tot["lat"] += a["pim_latency_s"]
                tot["en"] += a["pim_energy_j"]
        folded = fold_rows(cells) if fold else [(list(c), [k]) for k, c in enumerate(cells)]
        for (name, op, size, pcus, tg, crf, trig, res, lat, en), members in folded:
            # a long name is cut, the count of a folded row ('... x200') kept
            count = f" x{len(members)}" if len(members) > 1 else ""
            shown = printable(name[:-len(count)] if count else name)[:30 - len(count)] + count
            rows.append(f"{shown:30s} {op:>5s} {size:>16s} {pcus:>5d} {tg:>11s} "
                        f"{crf:>4d} {trig:>9d} {res:>10s} {lat:>10s} {en:>10s}")
        rows.append("-" * len(head))
        n_inf = sum(flags)
        label = f"total ({len(plans)} kernels" + (f", {n_inf} per inference" if n_inf < len(plans)
                                                  else "") + ")"
        rows.append(f"{label:30s} {'':>5s} {'':>16s} {'':>5s} "
                    f"{'':>11s} {'':>4s} {tot['trig']:>9d} {si(tot['res']) + 'B':>10s} "
                    f"{si(tot['lat']) + 's':>10s} {si(tot['en']) + 'J':>10s}")
        f32 = sum(a.get("pim_precision") == "fp32 as fp16" for *_, a in plans)
        rows.append("(FP16 SIMD, 16 lanes per PCU at 300 MHz; triggers = AB-PIM column commands "
                    "per PCU per inference; latency and energy per inference, mode switches "
                    "included" + (f"; {f32} float32 kernel(s) computed in FP16" if f32 else "")
                    + ")")
        if len(folded) < len(cells):
            rows.append(f"({len(cells)} kernels in {len(folded)} rows: '<kernel> xN' stands for N "
                        "kernels of one source op, named by the first, with the same figures "
                        "each; the totals count every kernel; optimize -v lists them one by one)")
        return "\n".join(rows)


register(HbmPimDevice())
