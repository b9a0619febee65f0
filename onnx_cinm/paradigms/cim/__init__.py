"""The ``cim`` paradigm: matrix products on crossbar arrays, for any crossbar chip.

A crossbar device computes ``Y[g] = X[g] @ W[g]`` with ``W[g]`` (``K x N``) programmed into the
cells of ``rows x cols`` arrays and the rows of ``X[g]`` streamed through them (field notes
``crossbar.md`` §1.2, §3; OCC, Siemieniuk et al., IEEE TCAD 41(6), 2022). This package holds
what does not depend on the chip:

- :mod:`.layout` -- which operand of a cinm Gemm/Gemv is programmed and the views
  (:class:`~.layout.ProductView`) that turn the node's arrays into ``W[G, K, N]`` and
  ``X[G, rows, K]`` and back;
- :mod:`.schedule` -- the tile grid, the loop orders (``weight_stationary`` serpentine,
  ``naive``), tile writes, MVMs, ADC conversions and their cost (:class:`~.schedule.CrossbarPlan`);
- :mod:`.residency` -- which kernels of a model keep their tiles programmed when they share
  ``P`` crossbars (the pinning knapsack).

It is written against :class:`CrossbarArray`; a chip's parameter class satisfies it by having
those attributes (the memristor device's ``CrossbarParams`` does, with every constant sourced
in ``devices/memristor/presets.py``). A device package keeps its presets, device physics,
code generation and simulator adapter, and calls this package for the plan.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CrossbarArray(Protocol):
    """What the cim paradigm needs to know about a crossbar chip.

    Geometry (counts) and the cost figures of :meth:`.schedule.CrossbarPlan.cost`:

    Attributes:
        rows: cells per crossbar column (word lines; ``K`` is tiled by it).
        cols: cells per crossbar row (bit lines; ``N`` is tiled by it).
        crossbars: crossbars ``P`` on the chip, shared by all its kernels.
        write_latency_s: programming one tile into one crossbar, seconds.
        write_energy_j: programming one tile, joules.
        mvm_latency_s: one vector through one programmed tile, seconds.
        mvm_energy_j: one such MVM, joules.
        adc_energy_j: one analog-to-digital conversion (one column of one MVM), joules.
        clock_hz: periphery clock, Hz (busy time x clock = busy cycles).
        periphery_energy_per_cycle_j: mixed-signal periphery energy per busy cycle, joules.
        dac_energy_j: one DAC drive (one row of one MVM), joules.
        adc_latency_s: one conversion, seconds (0: not separated from ``mvm_latency_s``).
        adcs_per_array: ADCs serving one array's columns (0: not published).
        cell_area_mm2, adc_dac_area_mm2, periphery_area_mm2: area per array of the cells, of
            its converters and of the rest of its periphery, mm^2 (0: not published).
        folded: the cost terms (``"adc_dac"``, ``"periphery"``) the chip publishes only inside
            another term's figures (``folded_into``); their parts are marked
            ``CostPart.folded`` and their energy and area stay 0.
        folded_into: optional (not required of a chip: ``"array"`` without it), the term
            whose figures hold the ``folded`` ones (``"array"``: the MVM energy and cell area;
            ``"periphery"``: the periphery's energy per cycle, OCC's).
    """

    rows: int
    cols: int
    crossbars: int
    write_latency_s: float
    write_energy_j: float
    mvm_latency_s: float
    mvm_energy_j: float
    adc_energy_j: float
    clock_hz: float
    periphery_energy_per_cycle_j: float
    dac_energy_j: float
    adc_latency_s: float
    adcs_per_array: int
    cell_area_mm2: float
    adc_dac_area_mm2: float
    periphery_area_mm2: float
    folded: tuple


__all__ = ["CrossbarArray"]
