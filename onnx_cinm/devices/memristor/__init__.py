"""Memristor crossbar device (paradigm ``cim``): weight-stationary matrix products in place.

Parameters follow OCC's published model (Siemieniuk et al., "OCC", IEEE TCAD 41(6), 2022; the
numbers are from its evaluation data, ``adam-smnk/Open-CIM-Compiler`` branch ``sim_build``,
``data/CIM_parallelization_factor.xlsx`` and ``data/CIM_stats.xlsx``; see
``shared/field-notes/crossbar.md`` §1.4). One "write" here is the programming of one whole
crossbar tile (``rows x cols`` cells), as in OCC's write counts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import register
from ..base import OpInfo, Support


@dataclass(frozen=True)
class CrossbarParams:
    """Crossbar geometry and OCC's PCM cost parameters.

    Attributes:
        rows, cols: cells per crossbar (64 x 64: OCC ``TILE_SIZE = 64``, CINM's default).
        crossbars: crossbars on the device (4: OCC ``NUM_TILES = 4``).
        write_latency_s: time to program one tile, seconds (2.5e-6: OCC "Write").
        write_energy_j: energy to program one tile, joules (2e-10: OCC "Write", 200 pJ).
        mvm_latency_s: time of one matrix-vector product on a tile, seconds (1e-6: OCC "Read").
        mvm_energy_j: energy of one MVM, joules (2e-13: OCC "Read", 0.2 pJ).
        periphery_energy_per_cycle_j: mixed-signal periphery energy per cycle at 1 GHz, joules
            (2.1e-9: OCC "Mixed-signal energy").
        endurance_writes: writes a cell survives (3.2e7, as given for OCC's PCM model in the
            crossbar issue; NVMain's default mean endurance is 1e6).
        clock_hz: clock of the periphery, Hz (1e9: OCC "1 GHz"); one busy cycle costs
            ``periphery_energy_per_cycle_j``.
        adc_energy_j: energy of one analog-to-digital conversion (one column of one MVM), joules
            (0 for the OCC preset: OCC folds the ADCs into its mixed-signal periphery energy).
        dtypes: element types the ideal (exact fp32) mode accepts.
        min_macs: the paper heuristic's "enough work": a matmul with fewer multiply-accumulates
            than one tile holds (rows * cols) stays off the crossbar.
        name: preset name, for reports.
    """

    rows: int = 64
    cols: int = 64
    crossbars: int = 4
    write_latency_s: float = 2.5e-6
    write_energy_j: float = 2e-10
    mvm_latency_s: float = 1e-6
    mvm_energy_j: float = 2e-13
    periphery_energy_per_cycle_j: float = 2.1e-9
    endurance_writes: float = 3.2e7
    clock_hz: float = 1e9
    adc_energy_j: float = 0.0
    dtypes: tuple = ("float32",)
    min_macs: int = 64 * 64
    name: str = "pcm-occ"


#: OCC's PCM model (field notes crossbar.md §1.4): the default parameters.
PCM_OCC = CrossbarParams()

#: A ReRAM crossbar after ISAAC/PUMA geometry and NVSim/MNSIM cell figures (field notes
#: crossbar.md §2.4-2.6 and §2.8):
#:
#: - 128 x 128 cells (ISAAC; PUMA ``MVMU_DIM 128``; NeuroSim's default subarray);
#: - a tile write programs one row at a time, all cells of a row in parallel (MNSIM
#:   ``Crossbar.py``), 10 ns per row (NVSim ``sample_RRAM.cell`` SET/RESET 10 ns; MNSIM
#:   ``Write_Latency``): 128 x 10 ns = 1.28 us per tile;
#: - 0.6 pJ per cell switch (NVSim ``sample_RRAM.cell``): 128 * 128 * 0.6 pJ = 9.83 nJ per tile;
#: - one MVM (a crossbar read cycle) 100 ns (ISAAC / PUMA ``xbar_ip_lat``), cell read energy
#:   0.1 pJ (NVSim) over 128 * 128 cells = 1.64 nJ;
#: - 8-bit ADC 1.67 pJ per conversion (ISAAC, via the ``hwcomponents_library`` model);
#: - no separate always-on periphery term (the ADCs carry it, as in ISAAC);
#: - endurance 1e6 writes (NVMain's default mean; HfOx RRAM endurance-model abstract).
#: Not calibrated against a chip: an "ISAAC-like" profile for comparisons, as §6 suggests.
RERAM_ISAAC = CrossbarParams(
    rows=128, cols=128, crossbars=4,
    write_latency_s=128 * 10e-9, write_energy_j=128 * 128 * 0.6e-12,
    mvm_latency_s=100e-9, mvm_energy_j=128 * 128 * 0.1e-12,
    periphery_energy_per_cycle_j=0.0, endurance_writes=1e6, clock_hz=1e9,
    adc_energy_j=1.67e-12, min_macs=128 * 128, name="reram-isaac",
)

#: Parameter presets by name.
PRESETS = {p.name: p for p in (PCM_OCC, RERAM_ISAAC)}


@dataclass
class MemristorDevice:
    """Memristor crossbars: runs cinm Gemm with a constant B and Gemv with a constant A."""

    name: str = "memristor"
    paradigm: str = "cim"
    params: CrossbarParams = CrossbarParams()

    def supports(self, op: OpInfo) -> Support:
        if op.op_type not in ("Gemm", "Gemv"):
            return Support(False, f"crossbars only compute matrix products, not {op.op_type}",
                           applicable=False)
        weights = op.inputs[1] if op.op_type == "Gemm" else op.inputs[0]
        if not weights.const:
            return Support(False, "no constant operand to program into the crossbar")
        if weights.dtype is None or np.dtype(weights.dtype).name not in self.params.dtypes:
            return Support(False, f"dtype {weights.dtype} not in {list(self.params.dtypes)}")
        macs = op.flops // 2
        if macs < self.params.min_macs:
            return Support(False, f"{macs} MACs < {self.params.min_macs} (less than one tile of work)")
        return Support(True, f"matrix product with constant weights {weights.shape}, {macs} MACs: "
                             "weight-stationary on crossbars")


register(MemristorDevice())
