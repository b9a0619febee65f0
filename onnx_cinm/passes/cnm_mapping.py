"""Pass ``cnm_mapping``: map every op placed on a compute-near-memory device (cnm paradigm level).

For each cinm node whose ``device`` has paradigm ``cnm`` (UPMEM), the device chooses, with the
cnm paradigm's rules (:mod:`onnx_cinm.paradigms.cnm`), the workgroup (ranks x DPUs x
tasklets), how each input is scattered or broadcast, the MRAM layout, the WRAM block per
tasklet and how partial results merge, and the pass stores that paradigm-level plan as node
attributes (UPMEM: ``cnm_dpus``, ``cnm_tasklets``, ``cnm_grid``, ``cnm_lanes``,
``cnm_block_bytes``, ``cnm_mram_bytes``, ``cnm_inputs``, ``cnm_merge``). The modeled cost and the ``kernel`` path
follow at the device level (pass ``device_lowering``). Like ``cim_tiling`` it only walks the
graph; the device decides (:func:`onnx_cinm.passes.device_lowering.lower_paradigm`).

Options read (by the device): ``upmem_dpus`` (most DPUs a workgroup may use, default 2048),
``upmem_tasklets`` (tasklets per DPU, 1..24, default 16), ``upmem_target`` (``v1a``, default,
or ``v1b``: at most 16 tasklets and 63,488 B of WRAM), ``upmem_search`` (search DPUs, tasklets
and WRAM blocks per op, :mod:`onnx_cinm.devices.upmem.search`; default false).
"""
from __future__ import annotations

import onnx

from . import PassContext, register_pass
from .device_lowering import lower_paradigm


@register_pass("cnm_mapping", keeps_shapes=True)
def cnm_mapping(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Map ops placed on UPMEM onto DPU workgroups, WRAM blocks and merges (cnm paradigm level)."""
    model, stats = lower_paradigm(model, ctx, "cnm")
    ctx.stats["cnm_mapping"] = stats
    return model
