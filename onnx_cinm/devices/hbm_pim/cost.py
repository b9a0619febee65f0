"""The HBM-PIM cost model: latency and energy of one kernel from its command stream's counts.

Per inference of a kernel (:class:`~.program.PimPlan`, constants of
:class:`~.params.HbmPimParams` with their sources):

- **mode switches** SB->AB->AB-PIM->AB->SB: ``mode_switch_accesses`` reserved-row accesses of
  ``t_rc_s`` each, all channels in parallel (8 x 45 ns = 360 ns);
- **host writes and reads over the HBM interface**, at ``channels x 64 pins x pin rate / 8``
  (19.2 GB/s per pseudo-channel at 2.4 Gb/s; 307.2 GB/s for 16): the CRF program (4 bursts of
  32 B per channel), the SRF (32 B per channel when an operand is a scalar), the broadcast GRF
  writes of the stream (each ``write`` step is 8 columns of 32 B per channel: a 128-value input
  tile into GRF_A, or zeros into GRF_B) and, for GEMV, the partial sums read back (8 rows x
  32 B per PCU and row group);
- **PIM execution**: one trigger (column command) per PCU clock, ``triggers / clock_hz``; the
  data a trigger touches is one 32 B column per PCU, so this equals the bank bytes over the
  internal bandwidth ``pcus x 32 B x 300 MHz`` (1.23 TB/s for 128 PCUs);
- **energy**: interface bytes x 8 x ``external_j_per_bit`` + bank accesses x pcus x 32 B x 8 x
  ``internal_j_per_bit`` + lane operations x ``alu_j_per_op`` (0).

Not modeled: row activations inside a stream (the bank rows are assumed open, an optimistic
limit), refresh, the host's lane reduction (assumed to overlap the read-back) and host driver
time. The one-time **load** of a GEMV's resident weights (or an elementwise op's constant
operands) is their padded bytes over the interface, written into the banks: ``bytes / external bandwidth`` seconds and ``bytes x 8 x
(external + internal J/bit)`` joules.
"""
from __future__ import annotations

from dataclasses import dataclass

from .params import HbmPimParams
from .program import PimPlan

#: Bytes of the CRF program as the host writes it: 4 bursts of 32 B (32 x 32-bit words).
CRF_BYTES = 4 * 32


@dataclass(frozen=True)
class KernelCost:
    """Modeled figures of one kernel.

    Attributes:
        latency_s, energy_j: per inference, seconds and joules.
        mode_s, interface_s, pim_s: the latency's parts (mode switches, host writes/reads, PIM
            triggers), seconds.
        interface_bytes: bytes the kernel itself moves over the HBM interface per inference.
        triggers: AB-PIM column commands per PCU per inference.
        resident_bytes: bank bytes its constants occupy (padded GEMV weights), 0 if none.
        load_s, load_j: one-time load of the resident weights, seconds and joules.
    """

    latency_s: float
    energy_j: float
    mode_s: float
    interface_s: float
    pim_s: float
    interface_bytes: int
    triggers: int
    resident_bytes: int = 0
    load_s: float = 0.0
    load_j: float = 0.0


def interface_bytes_per_s(params: HbmPimParams, channels: int, pin_gbps: float | None) -> float:
    """Host<->device bandwidth of ``channels`` pseudo-channels: ``channels x pins/16 x pin rate
    / 8`` bytes per second (307.2 GB/s for 16 at 2.4 Gb/s)."""
    rate = params.pin_gbps if pin_gbps is None else float(pin_gbps)
    per_channel = params.pins // 16  # 64 pins per pseudo-channel (HBM2) [code]
    return channels * per_channel * rate * 1e9 / 8


def resident_bytes(plan: PimPlan, params: HbmPimParams) -> int:
    """Bank bytes a kernel keeps across inferences: a GEMV's padded weights, or the padded
    regions of an elementwise op's constant operands (both banks of every PCU)."""
    if plan.op != "GEMV":
        return len(plan.resident) * plan.pcus * 2 * plan.cols * params.column_bytes
    return plan.pcus * 2 * plan.groups * (plan.tiles // 2) * 64 * params.column_bytes


def kernel_cost(plan: PimPlan, params: HbmPimParams, pin_gbps: float | None = None,
                runs: int | None = None) -> KernelCost:
    """The :class:`KernelCost` of ``plan`` (``runs`` program runs per inference: the plan's by
    default, the actual batch when the runtime counts them)."""
    runs = plan.runs if runs is None else runs
    c = plan.counts()
    bw = interface_bytes_per_s(params, plan.channels, pin_gbps)
    col = params.column_bytes
    host = plan.channels * CRF_BYTES
    if plan.scalar >= 0:
        host += plan.channels * col
    host += runs * c["grf_writes"] * col * plan.channels
    if plan.op == "GEMV":
        host += runs * plan.pcus * plan.groups * 8 * col
    triggers = runs * c["triggers"]
    mode_s = params.mode_switch_accesses * params.t_rc_s
    interface_s = host / bw
    pim_s = triggers / params.clock_hz
    energy = (host * 8 * params.external_j_per_bit
              + runs * c["bank_accesses"] * plan.pcus * col * 8 * params.internal_j_per_bit
              + runs * c["lane_ops"] * plan.pcus * params.alu_j_per_op)
    res = resident_bytes(plan, params)
    load_s = res / bw
    load_j = res * 8 * (params.external_j_per_bit + params.internal_j_per_bit)
    return KernelCost(mode_s + interface_s + pim_s, energy, mode_s, interface_s, pim_s, host,
                      triggers, res, load_s, load_j)


def transfer(nbytes: int, params: HbmPimParams, channels: int,
             pin_gbps: float | None) -> tuple[float, float]:
    """``(seconds, joules)`` of moving ``nbytes`` of a tensor between the host and the banks:
    over the interface of ``channels`` pseudo-channels, each bit also written to or read from
    a bank (``external + internal`` J/bit)."""
    bw = interface_bytes_per_s(params, channels, pin_gbps)
    return nbytes / bw, nbytes * 8 * (params.external_j_per_bit + params.internal_j_per_bit)
