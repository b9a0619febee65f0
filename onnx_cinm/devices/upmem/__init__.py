"""UPMEM device (paradigm ``cnm``): a DPU next to every DRAM bank.

Parameters: one :class:`~onnx_cinm.devices.upmem.cost.UpmemParams` per DPU generation
(:data:`~onnx_cinm.devices.upmem.cost.TARGETS`), from the UPMEM SDK documentation (2025.1.0
mirror) and Gómez-Luna et al., "Benchmarking a New Paradigm: ... a Real Processing-in-Memory
System", IEEE Access 10 (2022), arXiv:2105.03814 (PrIM); see ``shared/field-notes/upmem.md``
§1.1. The device's own :attr:`UpmemDevice.params` is the default generation: the cost model,
mapping, search and code generator all read it (or the generation option ``upmem_target``
names).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from ...errors import CinmError
from ...graph import dtype_name
from ...options import option
from .. import register
from ..base import Cost, Device, OpInfo, Priced, Resources, Support
from .cost import DEFAULT_PARAMS, TARGETS, UpmemParams


def _targets() -> tuple:
    return tuple(TARGETS)


@dataclass(frozen=True)
class UpmemOptions:
    """The UPMEM device's options (keys ``upmem_<field>``; CLI ``--upmem-<field>``)."""

    dpus: int | None = option(None, help=f"most DPUs one op may use; the mapping picks the count "
                              f"with the lowest modeled time up to this (default "
                              f"{DEFAULT_PARAMS.dpus})", low=1, high=1 << 16)
    tasklets: int | None = option(None, help=f"tasklets per DPU (default {DEFAULT_PARAMS.tasklets}; "
                                  "at most " + ", ".join(f"{p.max_tasklets} on {n}"
                                                         for n, p in TARGETS.items()) + ")",
                                  low=1, high=max(p.max_tasklets for p in TARGETS.values()))
    target: str | None = option(None, help="DPU generation of the cost model: " + "; ".join(
        f"{n} ({p.max_tasklets} tasklets, {p.wram_bytes} B WRAM, {p.frequency_hz / 1e6:g} MHz"
        + (", the default)" if n == DEFAULT_PARAMS.name else ")") for n, p in TARGETS.items()),
                                choices=_targets)
    search: bool = option(False, help="search DPUs, tasklets and WRAM blocks per op under the "
                          "cost model (deterministic, bounded; never slower than the mapping "
                          "rule)")


#: The plan attributes of a UPMEM kernel (see :meth:`.mapping.CnmPlan.attrs`).
PLAN_ATTRS = {
    "cnm_dpus": "int", "cnm_tasklets": "int", "cnm_block_bytes": "int",
    "cnm_mram_bytes": "int", "cnm_inputs": "strings", "cnm_merge": "string",
    "cnm_latency_s": "float", "cnm_energy_j": "float", "cnm_load_s": "float",
    "cnm_load_j": "float", "cnm_search": "string", "cnm_grid": "ints", "cnm_target": "string",
    "cnm_lanes": "int",
}


#: The plan attributes the code generator reads (:func:`.codegen.emit_op`): with the op's
#: signature, the key of the memo of :meth:`UpmemDevice._check_emittable`.
_EMIT_KEYS = ("cnm_dpus", "cnm_tasklets", "cnm_block_bytes", "cnm_grid", "cnm_lanes",
              "cnm_target")
#: Memo of :meth:`UpmemDevice._check_emittable`: key -> None (emittable) or (message, op name).
_EMITTABLE: dict = {}
#: Memo of :meth:`UpmemDevice.supports` past its dtype checks, by the op's signature
#: (:func:`.mapping._op_key`: what the kernel choice, the plan and the emitter's check read)
#: and the device's parameters: ``(Support, op name)``. The ops of one shape (a network's
#: repeated layers) get one answer; a refusal naming the op it was given for is reworded.
_SUPPORTS: dict = {}
#: Memo of :meth:`UpmemDevice.price`: (op signature, DPUs, tasklets, generation, search) ->
#: its :class:`Priced` (frozen: shared by the ops of one signature).
_PRICES: dict = {}
_PLANS_MAX = 20000


def _plain(value):
    """A plan attribute's value as a part of the key of :data:`_EMITTABLE`: a list (the
    ``cnm_grid`` lowering writes) as the tuple the plan search keeps, so that lowering's
    check finds placement's answer (the emitter reads the grid as ``[int(x) for x in ...]``:
    the two are one grid); anything else as it is."""
    return tuple(value) if isinstance(value, list) else value


_MISS = object()
#: The modules :func:`_module` imported (the mapping and the code generator pull in numpy and
#: the templates: imported on first use, not with the device; then asked hundreds of times).
_MODULES: dict = {}


def _module(name: str):
    """This package's submodule ``name`` (``mapping``, ``codegen``), imported on first use; its
    attributes are read at each call (a test may replace one)."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(f"{__name__}.{name}")
    return mod


class UpmemDevice(Device):
    """UPMEM DPUs: runs every cinm op on the supported dtypes.

    Run modes (provider option ``upmem_mode``): ``model`` (the default: the node runs its
    reference body on the host, numpy-exact and fast, and the profile charges the cost model)
    and ``emulate`` (the generated C runs in the UPMEM emulator).
    """

    name = "upmem"
    colour = "#1f77b4"  # in the report's pictures
    paradigm = "cnm"
    option_prefix = "upmem"
    Options = UpmemOptions
    attr_prefix = "cnm"
    plan_attrs = PLAN_ATTRS
    modes = ("model", "emulate")

    def __init__(self, params: UpmemParams = DEFAULT_PARAMS):
        self.params = params
        #: the selectable generations, this device's own parameters under their name
        self.targets = {**TARGETS, params.name: params}

    def supports(self, op: OpInfo) -> Support:
        if op.attrs.get("y_perm") is not None:  # writes_permuted: no
            return Support(False, "a Gemm written permuted (y_perm): the DPU kernels write "
                                  "A @ B as it is")
        for t in op.inputs + op.outputs:
            if t.dtype is None or dtype_name(t.dtype) not in self.params.dtypes:
                return Support(False, f"dtype {t.dtype} of {t.name!r} not supported by DPU kernels")
        mapping = _module("mapping")
        try:  # the op's signature, asked once for this memo, the plan's and the emitter's
            key = mapping._op_key(op)
            memo_key = (key, mapping.params_key(self.params))
            hit = _SUPPORTS.get(memo_key)
        except TypeError:  # an attribute that cannot be a key: all answer without their memo
            key = memo_key = hit = None
        if hit is None:
            support = self._supports(op, key)
            if memo_key is not None:
                if len(_SUPPORTS) > _PLANS_MAX:
                    _SUPPORTS.clear()
                _SUPPORTS[memo_key] = (support, op.name)
            return support
        support, name = hit
        if name != op.name and repr(name) in support.reason:  # a refusal naming its op
            return Support(support.ok, support.reason.replace(repr(name), repr(op.name)),
                           support.applicable, support.preferred)
        return support

    def _supports(self, op: OpInfo, key: tuple | None) -> Support:
        """:meth:`supports` past its dtype checks, without its memo (``key``: the op's
        :func:`.mapping._op_key`, None when it has none)."""
        codegen = _module("codegen")
        try:  # the generated kernels decide what runs on DPUs
            kernel = codegen.kernel_for(op, target=self.params)
        except ValueError as e:
            return Support(False, f"no DPU kernel: {e}")
        try:  # the data must fit the DPUs' MRAM (and the op the mapping's limits)
            plan = self.plan(op, op_key=key)
        except CinmError as e:
            return Support(False, str(e))
        if key is not None:  # placement prices the op next, under these default options
            self._remember_price(op, plan, (key, *self._workgroup({}),
                                            _module("mapping").params_key(self.params), False))
        try:  # and the code generator must be able to write its kernel (issue 17 #2)
            g = plan.g
            self._check_emittable(op, {"cnm_dpus": plan.dpus, "cnm_tasklets": plan.tasklets,
                                       "cnm_block_bytes": plan.block_bytes,
                                       "cnm_grid": g.get("grid"), "cnm_lanes": g.get("lanes"),
                                       "cnm_target": plan.params.name}, key, kernel, plan.params)
        except ValueError as e:
            return Support(False, f"no DPU kernel at this size: {e}")
        return Support(True, f"data-parallel op near memory ({kernel[0]} kernel)")

    def _check_emittable(self, op: OpInfo, attrs: dict, op_key: tuple | None = None,
                         kernel: tuple | None = None, target: UpmemParams | None = None) -> None:
        """ValueError if the code generator would refuse ``op`` with plan ``attrs``.

        Memoized per op signature (:func:`.mapping._op_key`: type, attributes, dtypes, shapes;
        not the names) and plan: placement asks for every op, lowering again, and the ops of
        one shape (a network's repeated layers) get the same answer. The plan's own
        attributes (``cnm_dpus``, ``cnm_tasklets``, ``cnm_block_bytes``, ``cnm_grid``,
        ``cnm_lanes``, ``cnm_target``; a list as a tuple) are part of the key; a refusal
        names the op it is given for. ``op_key``: :func:`.mapping._op_key` of ``op``;
        ``kernel``: :func:`.codegen.kernel_for` of ``op`` on :attr:`params` (a plan for another
        target asks again); ``target``: the generation ``attrs`` name, which the caller's
        ``kernel`` is for; when the caller has them."""
        mapping = _module("mapping")
        if target is None:
            target = self._planned_target(attrs)
            if target is not self.params:
                kernel = None
        try:
            key = (op_key or mapping._op_key(op), mapping.params_key(target),
                   tuple(map(_plain, map(attrs.get, _EMIT_KEYS))))
            hit = _EMITTABLE.get(key, _MISS)
        except TypeError:  # an attribute that cannot be a key: check without the memo
            key, hit = None, _MISS
        if hit is _MISS:
            try:
                _module("codegen").check_emittable(op, attrs, target=target, kernel=kernel)
                hit = None
            except ValueError as e:
                hit = (str(e), op.name)
            if key is not None:
                if len(_EMITTABLE) > _PLANS_MAX:
                    _EMITTABLE.clear()
                _EMITTABLE[key] = hit
        if hit is not None:
            message, name = hit
            raise ValueError(message.replace(repr(name), repr(op.name)) if name != op.name
                             else message)

    def _planned_target(self, attrs: dict) -> UpmemParams:
        """The generation a plan was made for (attribute ``cnm_target``, else :attr:`params`).
        Raises CinmError on an unknown name."""
        return self.target({"upmem_target": attrs.get("cnm_target")})

    # -- cnm mapping (onnx_cinm.devices.upmem.mapping / .cost) -----------------------------------
    def target(self, options: dict) -> UpmemParams:
        """The parameters of the DPU generation named by option ``upmem_target`` (``v1a`` or
        ``v1b``, :data:`~onnx_cinm.devices.upmem.cost.TARGETS`; the name is checked by the
        schema, :class:`UpmemOptions`), by default :attr:`params`."""
        return self.targets[options.get("upmem_target") or self.params.name]

    def _workgroup(self, options: dict) -> tuple[int, int]:
        """``(max DPUs, tasklets)`` from pass options ``upmem_dpus`` / ``upmem_tasklets``
        (checked against :class:`UpmemOptions` before); CinmError if the tasklets exceed the
        target's (:attr:`UpmemParams.max_tasklets`)."""
        target = self.target(options)
        most = target.max_tasklets
        tasklets = options.get("upmem_tasklets")
        if tasklets is not None and tasklets > most:
            raise CinmError(f"option upmem_tasklets={tasklets}: a {target.name} DPU runs "
                            f"1..{most} tasklets")
        return (options.get("upmem_dpus") or target.dpus, tasklets or min(target.tasklets, most))

    def check_options(self, options: dict) -> None:
        """CinmError if ``upmem_tasklets`` exceeds what the ``upmem_target`` DPU runs."""
        self._workgroup(options)

    def plan(self, op: OpInfo, options: dict | None = None, op_key: tuple | None = None):
        """The :class:`~onnx_cinm.devices.upmem.mapping.CnmPlan` of ``op`` (DPU count chosen by
        modeled time, up to ``upmem_dpus``; ``upmem_tasklets`` tasklets; the WRAM, tasklet
        limit and clock of ``upmem_target``); with ``upmem_search`` true, the best plan a
        search over DPUs, tasklets and WRAM blocks finds, never slower than the rule's.
        ``op_key``: :func:`.mapping._op_key` of ``op`` when the caller has it."""
        options = options or {}
        dpus, tasklets = self._workgroup(options)
        if options.get("upmem_search", UpmemOptions.search):  # the rule's plan is the search's floor (onnx_cinm.devices.upmem.search)
            from .search import search_plan
            return search_plan(op, max_dpus=dpus, tasklets=tasklets, params=self.target(options))
        return _module("mapping").plan_op(op, max_dpus=dpus, tasklets=tasklets,
                                          params=self.target(options), op_key=op_key)

    def cost(self, op: OpInfo, options: dict | None = None) -> Cost:
        """Modeled cost of one inference of ``op`` under ``options`` (``upmem_dpus``,
        ``upmem_tasklets``, ``upmem_target``, ``upmem_search``): end-to-end seconds (scatter,
        launch, kernel, gather, host merge) and estimated joules."""
        return self.plan(op, options).to_cost()

    def resources(self, options: dict) -> Resources:
        """MRAM of the DPUs in use (``upmem_dpus`` or all) for resident constants, bytes."""
        target = self.target(options)
        dpus = options.get("upmem_dpus") or target.dpus
        return Resources(memory_bytes=int(dpus) * target.mram_bytes)

    def price(self, op: OpInfo, options: dict) -> list[Priced]:
        """One choice: the plan's cost, its constant inputs resident in MRAM (loaded once).

        Memoized (:data:`_PRICES`) per op signature (:func:`.mapping._op_key`: the plan's cost
        and the constants' bytes read nothing else; not the names) and what the options
        resolve to (DPUs, tasklets, generation, search): placement asks for every op right
        after :meth:`supports` planned it (which keeps the answer for the default options),
        and the ops of one shape get one answer. Raises CinmError like :meth:`plan` (a failure
        is not kept)."""
        mapping = _module("mapping")
        dpus, tasklets = self._workgroup(options)
        try:
            key = (mapping._op_key(op), dpus, tasklets, mapping.params_key(self.target(options)),
                   bool(options.get("upmem_search", UpmemOptions.search)))
            hit = _PRICES.get(key)
        except TypeError:  # an attribute that cannot be a key: price without the memo
            key = hit = None
        if hit is None:
            hit = self._remember_price(op, self.plan(op, options), key)
        return [hit]

    @staticmethod
    def _remember_price(op: OpInfo, plan, key: tuple | None) -> Priced:
        """:meth:`price`'s choice for ``op`` with ``plan``, kept in :data:`_PRICES` under
        ``key`` (none: not kept)."""
        hit = Priced(plan.to_cost(), resident_bytes=sum(t.nbytes for t in op.inputs if t.const))
        if key is not None:
            if len(_PRICES) > _PLANS_MAX:
                _PRICES.clear()
            _PRICES[key] = hit
        return hit

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
        plan = self.plan(op, options)
        attrs = plan.attrs()
        attrs["cnm_target"] = plan.params.name
        attrs["kernel"] = f"upmem/{options['kernel_stem']}"
        try:
            self._check_emittable(op, attrs)
        except ValueError as e:
            raise CinmError(f"upmem: no DPU kernel for {op.op_type} {op.name!r} with these "
                            f"options: {e}") from None
        return attrs

    def summary(self, plans: list, counted: list | None = None, fold: bool = True,
                ops: list | None = None) -> str:
        """A table of the UPMEM kernels of ``plans`` (``[(node name, op type, attrs)]``, as
        :meth:`Device.summary <onnx_cinm.devices.base.Device.summary>`): per kernel its op, its
        first output's shape, DPUs and tasklets (``cnm_dpus``, ``cnm_tasklets``), the modeled
        latency (seconds) and estimated energy (joules) per inference (``cnm_latency_s``,
        ``cnm_energy_j``: :meth:`.mapping.CnmPlan.cost`), the bytes moved between the host and
        the DPUs per inference (the cost model's, the plan made again from ``ops``; ``-``
        without them) and the one-time load (``cnm_load_s`` seconds, ``cnm_load_j`` joules:
        the DPU program, ``UpmemParams.program_load_s`` = 60 ms from Cinnamon's 40-80 ms, and
        the constants kept in MRAM); a totals row (per-inference figures over the kernels
        ``counted`` does not mark False, the load over all; DPUs: the most one kernel takes)
        and footnotes saying what each figure counts (:mod:`.table`). ``ops``: the
        :class:`~onnx_cinm.devices.base.OpInfo` of each plan's node, or None (a node in an If
        branch). Empty if no plan is a UPMEM kernel."""
        from .table import summary
        return summary(plans, counted, fold, ops, self._planned_target)

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write the node's kernel (``host.c``, ``dpu.c``, ``Makefile``, ``kernel.json``,
        constant sidecars) into ``root / attrs["kernel"]``; see
        :func:`onnx_cinm.devices.upmem.codegen.emit_op`. Raises ValueError if no kernel fits."""
        from .codegen import emit_op
        return emit_op(op, attrs, consts, root, target=self._planned_target(attrs))

    def kernel(self, op: OpInfo, attrs: dict, root, consts: dict | None = None,
               mode: str = "emulate", run_options: dict | None = None,
               shared: dict | None = None):
        """A callable running the node's kernel in the UPMEM emulator, generated again from
        the plan (the folder's C must equal it; see
        :class:`onnx_cinm.devices.upmem.kernel.UpmemKernel`); None in mode ``model``."""
        if mode == "model":
            return None
        from .kernel import UpmemKernel
        return UpmemKernel(op, attrs, root, consts, emit=self.emit)


register(UpmemDevice())
