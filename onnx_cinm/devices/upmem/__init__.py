"""UPMEM device (paradigm ``cnm``): a DPU next to every DRAM bank.

Parameters are from the UPMEM SDK documentation (2025.1.0 mirror) and Gómez-Luna et al.,
"Benchmarking a New Paradigm: ... a Real Processing-in-Memory System", IEEE Access 10 (2022),
arXiv:2105.03814 (PrIM); see ``shared/field-notes/upmem.md`` §1.1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import CinmError
from ...options import option
from .. import register
from ..base import Cost, Device, OpInfo, Priced, Resources, Support
from .cost import TARGETS


@dataclass(frozen=True)
class UpmemParams:
    """UPMEM system parameters.

    Attributes:
        dpus: DPUs available (2048 by default; PrIM's system has 2,556 working DPUs of 2,560).
        dpus_per_rank: 64 (8 chips x 8 DPUs; PrIM Table 1).
        tasklets: tasklets per DPU used by default (16; the hardware allows at most 24, SDK docs).
        frequency_hz: DPU clock, Hz (350e6 on the 2,556-DPU system; PrIM Table 1).
        wram_bytes: scratchpad per DPU, bytes (65,536; SDK docs).
        mram_bytes: DRAM bank per DPU, bytes (64 MiB; SDK docs).
        dtypes: element types the kernels handle (integers natively; float32 emulated in software).
    """

    dpus: int = 2048
    dpus_per_rank: int = 64
    tasklets: int = 16
    frequency_hz: float = 350e6
    wram_bytes: int = 65536
    mram_bytes: int = 64 * 2**20
    dtypes: tuple = ("float32", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                     "uint64", "bool")


@dataclass(frozen=True)
class UpmemOptions:
    """The UPMEM device's options (keys ``upmem_<field>``; CLI ``--upmem-<field>``)."""

    dpus: int | None = option(None, help="most DPUs one op may use; the mapping picks the count "
                              "with the lowest modeled time up to this (default 2048)",
                              low=1, high=1 << 16)
    tasklets: int | None = option(None, help="tasklets per DPU (default 16; at most 24 on v1a, "
                                  "16 on v1b)", low=1,
                                  high=max(t.max_tasklets for t in TARGETS.values()))
    target: str = option("v1a", help="DPU generation of the cost model (v1a: PrIM's chips, 24 "
                         "tasklets, 64 KB WRAM, 350 MHz; v1b: 16 tasklets, 63,488 B WRAM, "
                         "400 MHz)", choices=tuple(TARGETS))
    search: bool = option(False, help="search DPUs, tasklets and WRAM blocks per op under the "
                          "cost model (deterministic, bounded; never slower than the mapping "
                          "rule)")


#: The plan attributes of a UPMEM kernel (see :meth:`.mapping.CnmPlan.attrs`).
PLAN_ATTRS = {
    "cnm_dpus": "int", "cnm_tasklets": "int", "cnm_block_bytes": "int",
    "cnm_mram_bytes": "int", "cnm_inputs": "strings", "cnm_merge": "string",
    "cnm_latency_s": "float", "cnm_energy_j": "float", "cnm_load_s": "float",
    "cnm_load_j": "float", "cnm_search": "string", "cnm_grid": "ints",
}


class UpmemDevice(Device):
    """UPMEM DPUs: runs every cinm op on the supported dtypes.

    Run modes (provider option ``upmem_mode``): ``model`` (the default: the node runs its
    reference body on the host, numpy-exact and fast, and the profile charges the cost model)
    and ``emulate`` (the generated C runs in the UPMEM emulator).
    """

    name = "upmem"
    paradigm = "cnm"
    option_prefix = "upmem"
    Options = UpmemOptions
    attr_prefix = "cnm"
    plan_attrs = PLAN_ATTRS
    modes = ("model", "emulate")

    def __init__(self, params: UpmemParams = UpmemParams()):
        self.params = params

    def supports(self, op: OpInfo) -> Support:
        for t in op.inputs + op.outputs:
            if t.dtype is None or np.dtype(t.dtype).name not in self.params.dtypes:
                return Support(False, f"dtype {t.dtype} of {t.name!r} not supported by DPU kernels")
        from .codegen import kernel_for  # the generated kernels decide what runs on DPUs
        try:
            kind = kernel_for(op)[0]
        except ValueError as e:
            return Support(False, f"no DPU kernel: {e}")
        try:  # the data must fit the DPUs' MRAM (and the op the mapping's limits)
            plan = self.plan(op)
        except CinmError as e:
            return Support(False, str(e))
        try:  # and the code generator must be able to write its kernel (issue 17 #2)
            self._check_emittable(op, {"cnm_dpus": plan.dpus, "cnm_tasklets": plan.tasklets,
                                       "cnm_block_bytes": plan.block_bytes,
                                       "cnm_grid": plan.g.get("grid")})
        except ValueError as e:
            return Support(False, f"no DPU kernel at this size: {e}")
        return Support(True, f"data-parallel op near memory ({kind} kernel)")

    def _check_emittable(self, op: OpInfo, attrs: dict) -> None:
        """ValueError if the code generator would refuse ``op`` with plan ``attrs``."""
        from .codegen import check_emittable
        check_emittable(op, attrs, default_dpus=min(self.params.dpus, 64),
                        default_tasklets=self.params.tasklets)

    # -- cnm mapping (onnx_cinm.devices.upmem.mapping / .cost) -----------------------------------
    def target(self, options: dict):
        """The cost-model parameters of the DPU generation named by option ``upmem_target``
        (``v1a``, the default, or ``v1b``; :data:`~onnx_cinm.devices.upmem.cost.TARGETS`).
        (The name is checked by the schema, :class:`UpmemOptions`.)"""
        return TARGETS[options.get("upmem_target") or UpmemOptions.target]

    def _workgroup(self, options: dict) -> tuple[int, int]:
        """``(max DPUs, tasklets)`` from pass options ``upmem_dpus`` / ``upmem_tasklets``
        (checked against :class:`UpmemOptions` before); CinmError if the tasklets exceed the
        target's (24 on v1A, 16 on v1B)."""
        most = self.target(options).max_tasklets
        tasklets = options.get("upmem_tasklets")
        if tasklets is not None and tasklets > most:
            raise CinmError(f"option upmem_tasklets={tasklets}: a "
                            f"{options.get('upmem_target') or UpmemOptions.target} "
                            f"DPU runs 1..{most} tasklets")
        return (options.get("upmem_dpus") or self.params.dpus,
                tasklets or min(self.params.tasklets, most))

    def check_options(self, options: dict) -> None:
        """CinmError if ``upmem_tasklets`` exceeds what the ``upmem_target`` DPU runs."""
        self._workgroup(options)

    def plan(self, op: OpInfo, options: dict | None = None):
        """The :class:`~onnx_cinm.devices.upmem.mapping.CnmPlan` of ``op`` (DPU count chosen by
        modeled time, up to ``upmem_dpus``; ``upmem_tasklets`` tasklets; the WRAM, tasklet
        limit and clock of ``upmem_target``); with ``upmem_search`` true, the best plan a
        search over DPUs, tasklets and WRAM blocks finds, never slower than the rule's."""
        options = options or {}
        dpus, tasklets = self._workgroup(options)
        if options.get("upmem_search", UpmemOptions.search):  # the rule's plan is the search's floor (onnx_cinm.devices.upmem.search)
            from .search import search_plan
            return search_plan(op, max_dpus=dpus, tasklets=tasklets, params=self.target(options))
        from .mapping import plan_op
        return plan_op(op, max_dpus=dpus, tasklets=tasklets, params=self.target(options))

    def cost(self, op: OpInfo, options: dict | None = None) -> Cost:
        """Modeled cost of one inference of ``op`` under ``options`` (``upmem_dpus``,
        ``upmem_tasklets``, ``upmem_target``, ``upmem_search``): end-to-end seconds (scatter,
        launch, kernel, gather, host merge) and estimated joules."""
        return self.plan(op, options).to_cost()

    def resources(self, options: dict) -> Resources:
        """MRAM of the DPUs in use (``upmem_dpus`` or all) for resident constants, bytes."""
        dpus = options.get("upmem_dpus") or self.params.dpus
        return Resources(memory_bytes=int(dpus) * self.params.mram_bytes)

    def price(self, op: OpInfo, options: dict) -> list[Priced]:
        """One choice: the plan's cost, its constant inputs resident in MRAM (loaded once)."""
        plan = self.plan(op, options)
        return [Priced(plan.to_cost(), resident_bytes=sum(t.nbytes for t in op.inputs if t.const))]

    def recorded(self, attrs: dict) -> Priced | None:
        """The choice a lowered UPMEM node made, from its ``cnm_*`` attributes."""
        if "cnm_latency_s" not in attrs:
            return None
        return Priced(Cost(float(attrs["cnm_latency_s"]), float(attrs["cnm_energy_j"]), 0, 0),
                      load_s=float(attrs.get("cnm_load_s", 0.0)),
                      load_j=float(attrs.get("cnm_load_j", 0.0)))

    def lower_paradigm(self, items: list) -> list[dict]:
        """The cnm paradigm's part of :meth:`lower`: workgroup, scratchpad block, memory,
        distribution and merge of each op's plan (:meth:`.mapping.CnmPlan.paradigm_attrs`), no
        cost and no kernel path. Raises CinmError on bad options or an op that does not fit."""
        return [self.plan(op, options).paradigm_attrs() for op, options in items]

    def lower(self, items: list) -> list[dict]:
        """Plan attributes (``cnm_*``, :data:`PLAN_ATTRS`) plus ``kernel`` for each
        ``(OpInfo, options)`` of ``items`` (every kernel is planned on its own: the DPUs run
        one kernel at a time). Raises CinmError on bad ``upmem_*`` options, an op that does not
        fit, or a kernel the code generator cannot write with its plan."""
        return [self._lower_one(op, options) for op, options in items]

    def _lower_one(self, op: OpInfo, options: dict) -> dict:
        """Plan attributes (``cnm_*``, see ``cinm.PLAN_ATTRS``) plus ``kernel``.
        Raises CinmError on bad ``upmem_dpus``/``upmem_tasklets``, an op that does not fit, or a
        kernel the code generator cannot write with this plan."""
        attrs = self.plan(op, options).attrs()
        attrs["kernel"] = f"upmem/{options['kernel_stem']}"
        try:
            self._check_emittable(op, attrs)
        except ValueError as e:
            raise CinmError(f"upmem: no DPU kernel for {op.op_type} {op.name!r} with these "
                            f"options: {e}") from None
        return attrs

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write the node's kernel (``host.c``, ``dpu.c``, ``Makefile``, ``kernel.json``,
        constant sidecars) into ``root / attrs["kernel"]``; see
        :func:`onnx_cinm.devices.upmem.codegen.emit_op`. Raises ValueError if no kernel fits."""
        from .codegen import emit_op
        return emit_op(op, attrs, consts, root, default_dpus=min(self.params.dpus, 64),
                       default_tasklets=self.params.tasklets)

    def kernel(self, op: OpInfo, attrs: dict, root, consts: dict | None = None,
               mode: str = "emulate"):
        """A callable running the node's kernel in the UPMEM emulator, generated again from
        the plan (the folder's C must equal it; see
        :class:`onnx_cinm.devices.upmem.kernel.UpmemKernel`); None in mode ``model``."""
        if mode == "model":
            return None
        from .kernel import UpmemKernel
        return UpmemKernel(op, attrs, root, consts, emit=self.emit)


register(UpmemDevice())
