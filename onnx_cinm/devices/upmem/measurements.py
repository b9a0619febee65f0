"""Published UPMEM measurements and the cost model's figure for each (the calibration table).

Every row is one measurement on real UPMEM hardware, with its source, and a function of the
cost-model parameters that gives the model's figure for the same case.
``benchmarks/upmem_calibration.py`` prints them side by side with the ratio;
``tests/test_upmem_cost.py`` holds the calibration rows to :data:`TOLERANCE`.

Rows are of two roles:

* ``calibration``: the model must reproduce them within :data:`TOLERANCE` (15 %);
* ``held-out``: other sizes of the same experiments, not used to fit anything, printed to show
  where the model's two straight lines (a fixed cost plus bytes over a bandwidth, with a knee
  at 64 KiB per DPU) are off: at 32 ranks and 4-16 KiB per DPU the host moves data up to 26 %
  more slowly than the line through 1 KiB and 64 KiB says.

Sources:

* ``UPMEM_1.txt``: Loremkang/upmem-sdk-light ``results/UPMEM_1.txt`` (the UPMEM SDK's own
  ``dpu_push_xfer`` on 32 ranks = 2,048 DPUs; per-call "Send Lat"/"Recv Lat", first sweep).
* ``issue 14``: measurements on UPMEM servers and PrIM's raw logs as quoted in issue 14 (not
  re-read here: *quoted*).
* ``PrIM``: Gomez-Luna et al., IEEE Access 2022, §3 (field notes upmem.md §1.5; the arithmetic
  values there are *recalled*, and issue 14 reports PrIM's raw logs agree with them within 1-3 %).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cost import DEFAULT_PARAMS, UpmemParams, op_instructions

#: the calibration target: model / measurement within 1 +- 15 %
TOLERANCE = 0.15

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class Measurement:
    """One published measurement and how the model computes the same figure.

    Attributes:
        case: what was measured, in words.
        value: the measured figure, in ``unit``.
        unit: ``us``, ``ms``, ``GB/s`` (1e9 bytes/s), ``MOPS`` or ``MB/s``.
        source: where the figure comes from (see the module docstring).
        model: ``params -> figure`` in the same unit.
        role: ``calibration`` or ``held-out``.
    """

    case: str
    value: float
    unit: str
    source: str
    model: Callable[[UpmemParams], float]
    role: str = "calibration"

    def ratio(self, params: UpmemParams = DEFAULT_PARAMS) -> float:
        """Model figure over the measured one."""
        return self.model(params) / self.value


def _push_ms(kib: int, dpus: int, to: bool):
    return lambda p: p.push_s(kib * KIB, dpus, to_dpu=to) * 1e3


def _push_us(kib: int, dpus: int, to: bool):
    return lambda p: p.push_s(kib * KIB, dpus, to_dpu=to) * 1e6


def _one_dpu_gbps(nbytes: int):
    return lambda p: nbytes / p.push_s(nbytes, 1) / 1e9


def _mops(dtype: str, op: str):
    # PrIM's throughput loop: WRAM load, the operation, WRAM store and 3 loop-control
    # instructions, one instruction per cycle with >= 11 tasklets (cost.py docstring)
    from .cost import PRIM_LOOP_BODY
    return lambda p: p.frequency_hz / 1e6 / (op_instructions(op, dtype) + PRIM_LOOP_BODY)


def _mram_read_mbps(nbytes: int):
    return lambda p: nbytes * p.frequency_hz / p.dma_cycles(nbytes) / 1e6


MEASUREMENTS: list[Measurement] = [
    Measurement("CPU->DPU, 32 ranks x 64 DPUs, 512 KiB per DPU (24.3 GB/s)", 44.2215, "ms",
                "UPMEM_1.txt", _push_ms(512, 2048, True)),
    Measurement("DPU->CPU, 32 ranks x 64 DPUs, 512 KiB per DPU (11.8 GB/s)", 91.1763, "ms",
                "UPMEM_1.txt", _push_ms(512, 2048, False)),
    Measurement("CPU->DPU, 32 ranks x 64 DPUs, 1 KiB per DPU", 563.79, "us",
                "UPMEM_1.txt", _push_us(1, 2048, True)),
    Measurement("DPU->CPU, 32 ranks x 64 DPUs, 1 KiB per DPU", 1059.33, "us",
                "UPMEM_1.txt", _push_us(1, 2048, False)),
    Measurement("CPU->DPU, 32 ranks x 64 DPUs, 64 KiB per DPU", 8.77697, "ms",
                "UPMEM_1.txt", _push_ms(64, 2048, True)),
    Measurement("DPU->CPU, 32 ranks x 64 DPUs, 64 KiB per DPU", 15.2639, "ms",
                "UPMEM_1.txt", _push_ms(64, 2048, False)),
    Measurement("CPU->DPU, 4 ranks, 256 DPUs x 64 KiB", 2351.0, "us", "issue 14",
                _push_us(64, 256, True)),
    Measurement("DPU->CPU, 4 ranks, 256 DPUs x 64 KiB", 4018.0, "us", "issue 14",
                _push_us(64, 256, False)),
    Measurement("empty dpu_launch on 4 ranks (256 DPUs)", 183.0, "us", "issue 14",
                lambda p: p.launch_overhead_s(256) * 1e6),
    Measurement("CPU->DPU, 1 DPU, 4 MiB (low end of 0.177-0.196 GB/s at 4-8 MiB)", 0.177, "GB/s",
                "issue 14 (PrIM raw logs)", _one_dpu_gbps(4 * MIB)),
    Measurement("CPU->DPU, 1 DPU, 8 MiB (high end of 0.177-0.196 GB/s at 4-8 MiB)", 0.196, "GB/s",
                "issue 14 (PrIM raw logs)", _one_dpu_gbps(8 * MIB)),
    Measurement("INT32 ADD, 1 DPU, >= 11 tasklets", 58.56, "MOPS", "PrIM", _mops("int32", "add")),
    Measurement("INT64 ADD, 1 DPU, >= 11 tasklets", 50.16, "MOPS", "PrIM", _mops("int64", "add")),
    Measurement("FLOAT ADD, 1 DPU, >= 11 tasklets", 4.91, "MOPS", "PrIM", _mops("float32", "add")),
    Measurement("DOUBLE ADD, 1 DPU, >= 11 tasklets", 3.32, "MOPS", "PrIM", _mops("float64", "add")),
    Measurement("INT32 MUL, 1 DPU, >= 11 tasklets", 10.27, "MOPS", "PrIM", _mops("int32", "mul")),
    Measurement("MRAM->WRAM DMA of 2048 B (sustained, recalled)", 628.0, "MB/s", "PrIM",
                _mram_read_mbps(2048)),
    # held out: other per-DPU sizes of the UPMEM_1.txt sweep (not used to fit anything)
    *[Measurement(f"CPU->DPU, 32 ranks x 64 DPUs, {k} KiB per DPU", ms, "ms", "UPMEM_1.txt",
                  _push_ms(k, 2048, True), role="held-out")
      for k, ms in ((4, 1.24502), (16, 2.69443), (128, 14.0274), (256, 24.1149))],
    *[Measurement(f"DPU->CPU, 32 ranks x 64 DPUs, {k} KiB per DPU", ms, "ms", "UPMEM_1.txt",
                  _push_ms(k, 2048, False), role="held-out")
      for k, ms in ((4, 2.27853), (16, 6.01871), (128, 24.4034), (256, 45.1042))],
]
