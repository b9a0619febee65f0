"""Samsung HBM-PIM (Aquabolt-XL / FIMDRAM) figures and the device's options.

Every constant names its source and a confidence tag, as in ``shared/field-notes/chips.md``
§3.1 (the notes restate the papers and repositories in their own words; nothing is copied):

- **[abs]** the paper's title or abstract: Kwon et al., "A 20nm 6GB Function-In-Memory DRAM,
  Based on HBM2 with a 1.2TFLOPS Programmable Computing Unit Using Bank-Level Parallelism",
  ISSCC 2021 (25.4); Lee et al., "Hardware Architecture and Software Stack for PIM Based on
  Commercial DRAM Technology", ISCA 2021; Kim et al., IEEE Micro 42(3), 2022.
- **[code]** the organisation, register files and ISA as the SAIT PIMSimulator encodes them
  (facts only; that repository's licence forbids reuse of its code).
- **[sec]** press or secondary write-ups; **[derived]** arithmetic from tagged numbers;
  **[unconfirmed]** no primary text found: a modeling assumption, override it if you know better.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...options import option


@dataclass(frozen=True)
class HbmPimParams:
    """One HBM-PIM cube (the figures ``onnx-cinm devices`` prints).

    Attributes:
        pcus: programmable computing units per cube, 128: one PCU per even/odd bank pair, 8 per
            pseudo-channel, 16 pseudo-channels [code] (chips.md §3.1).
        pcus_per_channel: 8 PCUs per pseudo-channel; a channel's PCUs run in lockstep [code].
        lanes: FP16 SIMD lanes per PCU, 16 [abs] (ISSCC 2021: 16-wide FP16 engine).
        clock_hz: PCU clock, 300 MHz [sec] (press; consistent with the 1.2 TFLOPS of the
            ISSCC title: 128 x 16 x 2 x 300e6 = 1.23e12 [derived]) [unconfirmed].
        column_bytes: bytes per column access, 32 (256 bit = 16 FP16 = the SIMD width) [code].
        crf_entries: command register file entries (32-bit instructions), 32 [code].
        grf_entries: GRF_A and GRF_B registers per PCU, 8 each of 256 bit [code].
        srf_entries: SRF scalars, 16 FP16 (SRF_M = 0..7, SRF_A = 8..15) [code].
        capacity_bytes: memory per cube, 6 GiB [abs] (ISSCC title "6GB").
        pin_gbps: external pin rate, Gb/s per pin, 2.4 (Aquabolt HBM2 [sec]; for the PIM
            part [unconfirmed]; PIMSimulator's config uses 2.0 [code]); 1024 pins per cube.
        pins: data pins per cube, 1024 (HBM2) [code].
        t_rc_s: DRAM row cycle charged per mode-switch access, 45 ns [unconfirmed]
            (a typical HBM2 tRC; no PIM figure found).
        mode_switch_accesses: reserved-row accesses per kernel launch, 8: SB->AB 4, AB->AB-PIM 1,
            AB-PIM->AB 1, AB->SB 2 [code] (PIMSimulator's transition sequence).
        external_j_per_bit: energy of a bit crossing the HBM interface, 3.9 pJ [unconfirmed]
            (the commonly quoted HBM2 figure, O'Connor et al., MICRO 2017; chips.md §3.1 found
            no primary HBM-PIM energy figure).
        internal_j_per_bit: energy of a bank bit read or written by a PCU, 1.56 pJ [derived]
            from the 3.9 pJ above and the ">60 % lower energy" of Kim et al. 2022 [abs]:
            3.9 x 0.4; as unconfirmed as its parts.
        alu_j_per_op: energy of one FP16 lane operation, 0 J (PIMSimulator's Ealu is 0 [code];
            no primary figure).
        dtypes: element types the PCUs compute: float16 [abs] (float32 only through option
            ``hbm_pim_accept_float32``, rounded to FP16).
    """

    pcus: int = 128
    pcus_per_channel: int = 8
    lanes: int = 16
    clock_hz: float = 300e6
    column_bytes: int = 32
    crf_entries: int = 32
    grf_entries: int = 8
    srf_entries: int = 16
    capacity_bytes: int = 6 * 2**30
    pin_gbps: float = 2.4
    pins: int = 1024
    t_rc_s: float = 45e-9
    mode_switch_accesses: int = 8
    external_j_per_bit: float = 3.9e-12
    internal_j_per_bit: float = 3.9e-12 * 0.4
    alu_j_per_op: float = 0.0
    dtypes: tuple = ("float16",)

    @property
    def internal_bytes_per_s(self) -> float:
        """Bank-to-PCU bandwidth of the cube: pcus x column_bytes x clock = 1.23 TB/s [derived]
        (chips.md §3.1, "4x" the external bandwidth, ISSCC abstract [abs])."""
        return self.pcus * self.column_bytes * self.clock_hz

    @property
    def external_bytes_per_s(self) -> float:
        """Host<->cube bandwidth: pins x pin rate / 8 = 307.2 GB/s [derived]."""
        return self.pins * self.pin_gbps * 1e9 / 8


@dataclass(frozen=True)
class HbmPimOptions:
    """The HBM-PIM device's options (keys ``hbm_pim_<field>``)."""

    pcus: int | None = option(None, help="PCUs the kernels use, a multiple of 8 (one "
                              "pseudo-channel); default 128, one cube", low=8, high=4 * 128)
    accept_float32: bool = option(False, help="also take float32 ops, computed in FP16 "
                                  "(inputs and weights rounded to FP16)")
    pin_gbps: float | None = option(None, help="external pin rate (default 2.4)", unit="Gb/s",
                                    low=0.1, high=100.0)
