"""A toy near-bank SIMD device in the style of Samsung HBM-PIM, as an onnx-cinm plugin.

It exists to prove that a device is a package: it registers through the ``onnx_cinm.devices``
entry point (see ``pyproject.toml``), subclasses the device contract
(:class:`onnx_cinm.devices.Device`: ``supports``, ``cost``, ``transfer_cost``) and nothing above
the registry knows it. It is a *cost-model* device: it keeps the contract's default ``lower``
and ``emit`` (no plan, no kernel), so ops placed on it are kept in the model with their
reference bodies and run on the host by the execution provider. Its colour in the report's
pictures and its option's other spellings (a flag with a unit, a sweep key) are declared here
too, and the CLI, sweeps and report take them without an edit.

Model: one HBM2 stack whose banks each pair with a SIMD unit; an op streams its operands out of
the banks at the internal bandwidth and the units compute at their peak rate, so one op takes
``launch_s + max(flops / peak_flops, bank_bytes / internal_bps)`` seconds. Weights of a Gemv are
resident in the banks (loaded once); activations cross the external HBM interface
(``transfer_cost``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx_cinm.devices import Cost, Device, OpInfo, Support
from onnx_cinm.options import Alias, option, parse_duration


@dataclass(frozen=True)
class HbmPimParams:
    """Parameters of the toy device, each with unit and source.

    Attributes:
        pcus: SIMD units per stack: 128 (Lee et al., ISSCC 2021, "A 20nm 6GB Function-In-Memory
            DRAM ... HBM2 with a 1.2TFLOPS Programmable Computing Unit": one unit per two banks;
            *recalled*).
        lanes: FP16 lanes per unit: 16 (same source, *recalled*).
        clock_hz: unit clock, Hz: 300e6 (same source, *recalled*; 128 x 16 x 2 x 300 MHz =
            1.23 TFLOP/s, the paper's headline figure).
        internal_bps: bank-to-unit bandwidth of the stack, bytes/s: 4 x the external bandwidth,
            1.23e12 (*assumption*, in line with the "4x bandwidth" claims of bank-level PIM).
        external_bps: host<->stack bandwidth, bytes/s: 307e9 (HBM2: 1024-bit bus at 2.4 Gb/s
            per pin).
        flop_j: energy per FLOP, joules: 1e-12 (*assumption*: FP16 SIMD near the banks).
        bank_byte_j: energy per byte read from a bank into a unit, joules: 4e-12 (*assumption*:
            no off-chip I/O, ~0.5 pJ/bit).
        external_byte_j: energy per byte over the HBM interface, joules: 32e-12 (*assumption*:
            ~4 pJ/bit for HBM2 I/O).
        launch_s: fixed cost of one PIM kernel (mode switch, command stream), seconds: 2e-6
            (*assumption*).
        dtypes: element types it accepts (FP32 models are computed in FP16 by the real device;
            this toy only models the cost).
    """

    pcus: int = 128
    lanes: int = 16
    clock_hz: float = 300e6
    internal_bps: float = 1.23e12
    external_bps: float = 307e9
    flop_j: float = 1e-12
    bank_byte_j: float = 4e-12
    external_byte_j: float = 32e-12
    launch_s: float = 2e-6
    dtypes: tuple = ("float32", "float16")

    @property
    def peak_flops(self) -> float:
        """FLOP/s: units x lanes x 2 (fused multiply-add) x clock."""
        return self.pcus * self.lanes * 2 * self.clock_hz


_ELEMENTWISE = {"Add", "Sub", "Mul", "Max", "Min", "Relu", "Abs", "Neg", "Clip", "LeakyRelu",
                "Elementwise"}


def _nbytes(t) -> int:
    return 0 if t.dtype is None else t.numel * np.dtype(t.dtype).itemsize


@dataclass(frozen=True)
class ToyPimOptions:
    """The toy device's options (keys ``toy_pim_<field>``)."""

    launch_s: float | None = option(
        None, help="fixed cost of one kernel (default: the params', 2 us)", unit="s", low=0.0,
        aliases=(Alias(flag="--toy-pim-launch", sweep="toy.launch", parse=parse_duration,
                       metavar="T", help="--toy-pim-launch-s with a unit"),))


class HbmPimDevice(Device):
    """Near-bank SIMD units in an HBM2 stack: elementwise ops and Gemv (paradigm ``cnm``)."""

    name = "toy_pim"
    paradigm = "cnm"
    option_prefix = "toy_pim"
    Options = ToyPimOptions
    colour = "#17becf"

    def __init__(self, params: HbmPimParams = HbmPimParams()):
        self.params = params

    def supports(self, op: OpInfo) -> Support:
        kind = op.op_type
        if kind not in _ELEMENTWISE and kind != "Gemv":
            return Support(False, f"near-bank SIMD runs elementwise ops and Gemv, not {kind}",
                           applicable=False)
        for t in op.inputs + op.outputs:
            if t.dtype is None or np.dtype(t.dtype).name not in self.params.dtypes:
                return Support(False, f"dtype {t.dtype} of {t.name!r} not in {list(self.params.dtypes)}")
        if kind == "Gemv" and not op.inputs[0].const:
            return Support(False, "Gemv needs its matrix resident in the banks (a constant)")
        return Support(True, f"{kind} on near-bank SIMD units")

    def cost(self, op: OpInfo, options: dict | None = None) -> Cost:
        """Seconds and joules of one inference of ``op`` (see the module docstring); the bytes
        read from the banks are all inputs (the resident matrix of a Gemv included)."""
        p = self.params
        bank = sum(_nbytes(t) for t in op.inputs) + sum(_nbytes(t) for t in op.outputs)
        launch = (options or {}).get("toy_pim_launch_s")
        lat = (p.launch_s if launch is None else launch) + max(op.flops / p.peak_flops,
                                                               bank / p.internal_bps)
        en = op.flops * p.flop_j + bank * p.bank_byte_j
        return Cost(latency_s=lat, energy_j=en, writes=0, bytes_moved=bank)

    def transfer_cost(self, nbytes: int, to_device: bool, options: dict | None = None) -> Cost:
        """Moving ``nbytes`` between host memory and the stack over the HBM interface."""
        p = self.params
        return Cost(latency_s=nbytes / p.external_bps, energy_j=nbytes * p.external_byte_j,
                    writes=0, bytes_moved=nbytes)
