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
        dtypes: element types the ideal (exact fp32) mode accepts.
        min_macs: the paper heuristic's "enough work": a matmul with fewer multiply-accumulates
            than one tile holds (rows * cols) stays off the crossbar.
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
    dtypes: tuple = ("float32",)
    min_macs: int = 64 * 64


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
