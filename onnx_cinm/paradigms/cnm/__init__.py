"""The ``cnm`` paradigm: data-parallel ops on processing units beside memory banks, any such chip.

A compute-near-memory device has many *units*, each with its own memory (a DRAM bank or bank
pair), a small local scratchpad, some hardware threads and a SIMD width (field notes
``upmem.md``; Khan et al., arXiv 2301.07486, §3 ``cnm`` dialect: workgroups, scatter/gather,
merges). The host moves data in and out; each unit only sees its own memory. This package holds
what does not depend on the chip:

- :mod:`.workgroup` -- how many units (:func:`~.workgroup.unit_counts`, the 2-D grids of a
  matrix product, :func:`~.workgroup.workgroups`), elements per unit
  (:func:`~.workgroup.share`), the scratchpad block per thread
  (:func:`~.workgroup.scratch_block`) and blocks per thread (:func:`~.workgroup.blocks`);
- :mod:`.distribution` -- scatter or broadcast of each input (``"name:scatter"``), which
  constant bytes stay resident in the units' memory, the grid of a matrix product and the
  memory layout of one unit (:func:`~.distribution.memory_layout`);
- :mod:`.merge` -- how partial results of the units and threads merge (tree, host, prefix, ...).

It is written against :class:`NearMemoryArray`, which a device fills from its sourced
constants. Two examples:

======================  ===================================  =======================================
field                   UPMEM (``devices/upmem``)            bank-level FP16 PIM (chips.md §3)
======================  ===================================  =======================================
``units``               DPUs (2048; one per 64 MB bank)      PIM units (128 per cube, 1 per 2 banks)
``units_per_group``     64 DPUs per rank                     8 PIM units per pseudo-channel
``memory_bytes``        64 MiB MRAM per DPU                  the two banks of a unit
``scratch_bytes``       64 KiB WRAM per DPU                  GRF_A + GRF_B: 16 x 256 bit = 512 B
``threads``             24 tasklets (16 on v1B)              1 (one instruction stream)
``lanes``               1 (scalar 32-bit core)               16 FP16 lanes
``align_bytes``         8 (DMA granularity)                  32 (one 256-bit column access)
``block_max_bytes``     2048 (largest DMA)                   32
======================  ===================================  =======================================

(UPMEM: SDK documentation and PrIM, ``shared/field-notes/upmem.md`` §1.1; bank-level PIM: the
DRAM-PIM figures of ``shared/field-notes/chips.md`` §3.)

A device package builds its array once (``NearMemoryArray(units=..., ...)``), asks this
package for the workgroup, the distribution of each input, the layout of a unit's memory and
the merge, and keeps for itself what is the chip's: its cost model, its code generator
(kernels, command streams) and its runtime adapter. The paradigm never imports a device.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NearMemoryArray:
    """What the cnm paradigm needs to know about a near-memory chip (sizes in bytes).

    Attributes:
        units: processing units a kernel may use at most (UPMEM: DPUs).
        units_per_group: units one host transfer or launch drives together (UPMEM: 64 DPUs of a
            rank; bank-level PIM: the units of a pseudo-channel).
        memory_bytes: memory of one unit, bytes (UPMEM: 64 MiB of MRAM).
        scratch_bytes: local scratchpad of one unit, bytes (UPMEM: 64 KiB of WRAM; bank-level PIM: its
            general register files).
        threads: hardware threads of one unit at most (UPMEM: 24 tasklets; bank-level PIM: 1).
        lanes: SIMD lanes of one thread (UPMEM: 1; bank-level PIM: 16 FP16 lanes).
        align_bytes: granularity of a transfer between a unit's memory and its scratchpad, and
            of every memory region (UPMEM: 8-byte DMA; bank-level PIM: one 32-byte column).
        block_max_bytes: the largest such transfer, bytes (UPMEM: 2048).
    """

    units: int
    units_per_group: int
    memory_bytes: int
    scratch_bytes: int
    threads: int
    lanes: int = 1
    align_bytes: int = 8
    block_max_bytes: int = 2048

    def __post_init__(self):
        for name in ("units", "units_per_group", "memory_bytes", "scratch_bytes", "threads",
                     "lanes", "align_bytes", "block_max_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"NearMemoryArray.{name} must be a positive integer, got {v!r}")


__all__ = ["NearMemoryArray"]
