"""Crossbar chip presets: geometry, precision, cost and device-physics parameters of published chips.

Every constant carries its source in :attr:`CrossbarParams.sources` (shown by ``onnx-cinm
devices`` and tabulated in ``docs/crossbar-presets.md``). Section numbers refer to the field
notes ``shared/field-notes/chips.md`` (``§1`` presets, ``§2`` device models) and
``shared/field-notes/crossbar.md``; the labels are theirs: ``[abs]`` a paper's abstract,
``[code]`` a named repository file that encodes a paper's numbers, ``[sec]`` a secondary source,
``[derived]`` arithmetic shown here. Fields listed in :attr:`CrossbarParams.unverified` have no
primary source (chips.md ``[unconfirmed]``, or an estimate of ours): treat them as placeholders.

The cost fields (``rows`` .. ``adc_energy_j``, ``dac_energy_j``, ``adc_latency_s``,
``adcs_per_array`` and the three areas) feed the cost model and its breakdown into array,
ADC/DAC and periphery (:mod:`onnx_cinm.paradigms.cim.schedule`); the precision fields feed the
``device`` data path (``--cim-mode device``), ``device_model`` and the wire resistances feed the
simulator's :mod:`onnx_cinm.sim.crossbar.physics`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

__all__ = ["CrossbarParams", "PCM_OCC", "RERAM_ISAAC", "PCM_HERMES", "RRAM_NEURRAM", "PRESETS",
           "DEFAULT", "INT_DTYPES", "resize"]

#: Integer products the crossbars take besides float32: the zero-point-corrected int8/uint8
#: operands of MatMulInteger, ConvInteger, QLinear* and QDQ products (``to_cinm``), computed
#: exactly (``.xbar`` ``dtype int32``, docs/xbar-format.md), with their constant integer
#: weights in cells as they are (``int_cells``); only under ``--cim-mode ideal``.
INT_DTYPES = ("int32",)


@dataclass(frozen=True)
class CrossbarParams:
    """Crossbar geometry, cost, precision and device parameters of one chip.

    Field defaults: OCC's PCM model (field notes crossbar.md §1.4), the ``pcm-occ`` preset:
    64 x 64 cells (OCC ``TILE_SIZE = 64``, CINM's default), 4 crossbars (``NUM_TILES = 4``),
    a tile write 2.5e-6 s and 2e-10 J (OCC "Write", 200 pJ), an MVM 1e-6 s and 2e-13 J (OCC
    "Read", 0.2 pJ), periphery 2.1e-9 J per cycle (OCC "Mixed-signal energy") at 1e9 Hz (OCC
    "1 GHz"), endurance 3.2e7 writes (as given for OCC's PCM model in the crossbar issue;
    NVMain's default mean endurance is 1e6), ADC energy 0 (OCC folds the ADCs into its
    mixed-signal periphery energy; the preset says so with ``folded``, the defaults fold
    nothing: a chip built on them publishes its parts apart). The device's default preset is :data:`DEFAULT`; every
    preset names the source of each of its figures (``sources``). ``rows`` .. ``min_macs``
    feed the cost model; ``technology`` .. ``unverified`` describe the chip (see the module
    docstring). The attributes below say what each field means (``onnx-cinm devices`` prints
    them beside the default preset's values), not any one chip's figure.

    Attributes:
        rows, cols: cells per crossbar.
        crossbars: crossbars on the device.
        write_latency_s: time to program one tile, seconds.
        write_energy_j: energy to program one tile, joules.
        mvm_latency_s: time of one matrix-vector product on a tile, seconds.
        mvm_energy_j: energy of one MVM, joules.
        periphery_energy_per_cycle_j: mixed-signal periphery energy per busy cycle of
            ``clock_hz``, joules.
        endurance_writes: writes a cell survives.
        clock_hz: clock of the periphery, Hz; one busy cycle costs
            ``periphery_energy_per_cycle_j``.
        adc_energy_j: energy of one analog-to-digital conversion (one column of one MVM), joules
            (0: folded into the periphery's or the array's energy, or not published).
        dtypes: operand types: float32, and int32 (quantized products, exact; ideal mode only).
        min_macs: the paper heuristic's "enough work": a matmul with fewer multiply-accumulates
            than one tile holds (rows * cols) stays off the crossbar.
        name: preset name, for reports and ``--cim-preset``.
        technology: ``"PCM"`` or ``"ReRAM"``.
        node_nm: CMOS node in nm (0: not published).
        weight_bits: the chip's signed weight precision, bits (``--cim-mode device``).
        cell_bits: bits per cell; an analog cell holding a whole magnitude: ``weight_bits - 1``.
        dac_bits: input (DAC) precision including the sign, bits.
        adc_bits: output (ADC) precision including the sign, bits.
        dac_energy_j: energy of one DAC drive (one row of one MVM), joules (0: folded into
            ``mvm_energy_j`` or not published).
        adc_latency_s: time of one conversion, seconds (0: not published).
        adcs_per_array: ADCs converting one crossbar's columns (0: not published); one MVM
            spends ``adc_latency_s * ceil(cols / adcs_per_array)`` converting.
        cell_area_mm2: area of one crossbar's cell array, mm^2 (0: not published).
        adc_dac_area_mm2: area of one crossbar's ADCs and DACs, mm^2 (0: not published).
        dac_area_mm2: the DACs' part of ``adc_dac_area_mm2`` (one DAC per row), mm^2; the rest
            is the ADCs' (:func:`resize` scales the two apart).
        periphery_area_mm2: area of the rest of one crossbar's periphery, mm^2.
        folded: the cost terms (``"adc_dac"``, ``"periphery"``) whose energy and area the
            preset's published figures include in another term's (``folded_into``) because the
            publication gives only the sum.
        folded_into: the term whose figures hold the ``folded`` ones: ``"array"`` (a chip's
            TOPS/W and core area with its converters inside: ``mvm_energy_j``,
            ``cell_area_mm2``) or ``"periphery"`` (OCC's mixed-signal energy per cycle, its
            ADCs and DACs inside).
        mvm_energy_per: what ``mvm_energy_j`` is published per, for :func:`resize`: ``"cell"``
            (a cell-array read energy, or a folded total scaled per cell) or ``"column"``
            (per-column neuron/sense energies, NeuRRAM's).
        scaled_from: ``(rows, cols)`` of the published array when :func:`resize` scaled the
            per-array figures to another size; ``()`` for the published size.
        device_model: name of the device model in
            :data:`onnx_cinm.sim.crossbar.physics.DEVICE_MODELS` (programming noise, drift, read
            noise, conductance range).
        wire_ohm_row, wire_ohm_col: wire resistance per cell pitch along a row / a column,
            ohms, for the first-order IR-drop model
            (:func:`onnx_cinm.sim.crossbar.physics.ir_drop`).
        sources: ``((field, source), ...)``: where each non-default constant comes from.
        unverified: fields whose value has no primary source (placeholders; see ``sources``).
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
    dtypes: tuple = ("float32",) + INT_DTYPES
    min_macs: int = 64 * 64
    name: str = "pcm-occ"
    technology: str = "PCM"
    node_nm: float = 0.0
    weight_bits: int = 8
    cell_bits: int = 2
    dac_bits: int = 8
    adc_bits: int = 8
    dac_energy_j: float = 0.0
    adc_latency_s: float = 0.0
    adcs_per_array: int = 0
    cell_area_mm2: float = 0.0
    adc_dac_area_mm2: float = 0.0
    dac_area_mm2: float = 0.0
    periphery_area_mm2: float = 0.0
    folded: tuple = ()
    folded_into: str = "array"
    mvm_energy_per: str = "cell"
    scaled_from: tuple = ()
    device_model: str = "pcm-joshi2020"
    wire_ohm_row: float = 0.0
    wire_ohm_col: float = 0.0
    sources: tuple = field(default=(), compare=False, repr=False)
    unverified: tuple = field(default=(), compare=False, repr=False)

    @property
    def array_area_mm2(self) -> float:
        """Area of one crossbar with its converters and periphery, mm^2 (0: not published)."""
        return self.cell_area_mm2 + self.adc_dac_area_mm2 + self.periphery_area_mm2

    @property
    def chip_area_mm2(self) -> float:
        """Area of all ``crossbars`` arrays with their converters and periphery, mm^2 (the
        arrays only: no buffers, network or host interface; 0: not published)."""
        return self.crossbars * self.array_area_mm2

    def source(self, name: str) -> str:
        """The recorded source of field ``name`` ('' if none)."""
        return dict(self.sources).get(name, "")

    def summary(self) -> str:
        """One line: geometry, precision, per-MVM and per-write cost, device model."""
        scaled = (f" (figures scaled from {self.scaled_from[0]}x{self.scaled_from[1]})"
                  if self.scaled_from else "")
        return (f"{self.technology} {self.rows}x{self.cols}{scaled} x {self.crossbars}, "
                f"w{self.weight_bits}/cell{self.cell_bits}/dac{self.dac_bits}/adc{self.adc_bits} bits, "
                f"MVM {self.mvm_latency_s * 1e9:.4g} ns {self.mvm_energy_j * 1e12:.4g} pJ, "
                f"write {self.write_latency_s * 1e6:.4g} us {self.write_energy_j * 1e9:.4g} nJ "
                f"per tile, device {self.device_model}")


def resize(params: CrossbarParams, rows: int, cols: int) -> CrossbarParams:
    """``params`` with arrays of ``rows x cols`` cells, its per-array figures scaled from the
    preset's published ``R0 x C0`` array (``params`` itself when the size is the published one,
    so a preset's own size gives exactly its published figures; a resized preset is scaled
    from its published size, never from another resize).

    With ``r = rows / R0``, ``c = cols / C0``, the rules (docs/crossbar-presets.md, "Other
    array sizes"; the per-row/per-column structure of an array is crossbar.md §2.1-2.2 and
    chips.md §1.2, §1.5, §1.6):

    - cell array: ``cell_area_mm2`` and a cell-array read ``mvm_energy_j`` x ``r * c`` (per
      cell); a preset whose ``mvm_energy_j`` is per-column neuron energy
      (``mvm_energy_per == "column"``, NeuRRAM's sample + integrate) x ``c``. A folded total
      (``folded``: HERMES's core area and TOPS/W with ADCs and periphery inside) is scaled per
      cell too: an approximation, since the ADCs inside it go with the columns only;
    - programming: ``write_energy_j`` x ``r * c`` (per cell), ``write_latency_s`` x ``r``
      (row by row, as the HERMES and NeuRRAM placeholders and NVSim's cell figures are built);
    - converters: ``adc_energy_j`` per conversion and ``dac_energy_j`` per drive are kept (the
      plan counts one per used column and one per used row of every MVM, so an array's
      converter energy already goes with ``c`` and ``r``); ADCs per array
      ``ceil(cols / (C0 / A0))``: as many as keep each ADC serving at most the published
      columns, at least one; the ADCs' area per ADC, the DACs' area (``dac_area_mm2``, one per
      row) x ``r``;
    - one MVM: the published conversion share of ``mvm_latency_s``
      (:func:`~onnx_cinm.paradigms.cim.schedule.conversion_share`) x the ratio of columns each
      ADC serves, the rest kept (the analog read time does not depend on the array size); a
      preset that publishes no conversion time (``adc_latency_s`` or ``adcs_per_array`` 0)
      keeps its ``mvm_latency_s``;
    - periphery (drivers, decoders, shift-and-add along the edges): ``periphery_area_mm2`` and
      ``periphery_energy_per_cycle_j`` x ``(rows + cols) / (R0 + C0)``;
    - ``min_macs`` (the paper heuristic's one tile of work) becomes ``rows * cols``.

    Geometry-free fields (crossbar count, clock, precision, device model, wire resistance per
    cell, endurance) are kept. ``scaled_from`` records ``(R0, C0)`` for the reports.
    Raises ValueError if ``rows`` or ``cols`` is below 1, or if ``params`` is itself resized
    and another size is asked (resize the published preset instead).
    """
    if rows < 1 or cols < 1:
        raise ValueError(f"a crossbar needs at least 1x1 cells, not {rows}x{cols}")
    r0, c0 = params.scaled_from or (params.rows, params.cols)
    if (rows, cols) == (params.rows, params.cols):  # its own size (a resized chip's too)
        return params
    if params.scaled_from:  # scale from the published array, never from another resize
        raise ValueError(f"{params.name} is already resized from {r0}x{c0}")
    if (rows, cols) == (r0, c0):
        return params
    r, c = rows / r0, cols / c0
    cells, edge = r * c, (rows + cols) / (r0 + c0)
    adcs, mvm_latency = params.adcs_per_array, params.mvm_latency_s
    adc_area = params.adc_dac_area_mm2 - params.dac_area_mm2
    if params.adcs_per_array:
        served0 = c0 / params.adcs_per_array
        adcs = max(1, math.ceil(cols / served0 - 1e-9))
        adc_area *= adcs / params.adcs_per_array
        if params.adc_latency_s and params.mvm_latency_s:
            t0 = params.adc_latency_s * math.ceil(c0 / params.adcs_per_array)
            conv = min(params.mvm_latency_s, t0)
            mvm_latency = (params.mvm_latency_s - conv
                           + conv * math.ceil(cols / adcs) / math.ceil(c0 / params.adcs_per_array))
    else:
        adc_area *= c
    dac_area = params.dac_area_mm2 * r
    per_mvm = c if params.mvm_energy_per == "column" else cells
    return replace(params, rows=rows, cols=cols, scaled_from=(r0, c0), min_macs=rows * cols,
                   write_latency_s=params.write_latency_s * r,
                   write_energy_j=params.write_energy_j * cells,
                   mvm_latency_s=mvm_latency, mvm_energy_j=params.mvm_energy_j * per_mvm,
                   periphery_energy_per_cycle_j=params.periphery_energy_per_cycle_j * edge,
                   adcs_per_array=adcs, cell_area_mm2=params.cell_area_mm2 * cells,
                   adc_dac_area_mm2=adc_area + dac_area, dac_area_mm2=dac_area,
                   periphery_area_mm2=params.periphery_area_mm2 * edge)


_OCC = "OCC data (crossbar.md §1.4)"
_OCC_MIXED = (_OCC + ": one 'Mixed-signal energy' per CIM cycle and no converter (ADC/DAC) "
              "figure apart")
#: Wire resistance per cell for every chip preset: aihwkit ``IOParametersIRDropT``'s 0.15 ohm
#: (chips.md §2.6), unverified for any of these chips. NeuroSim's geometry gives 1.9 / 5.6 ohm
#: (22 nm) or 2.5 / 7.6 ohm (14 nm) per dense 1T1R cell [derived], but with those a 256-row
#: array at 10-40 uS has ``r * g * n^2 / 2`` of order 1, outside the first-order IR-drop model
#: (:func:`onnx_cinm.sim.crossbar.physics.ir_drop`) and at odds with the chips' published
#: accuracy.
_WIRE = "aihwkit IOParametersIRDropT 0.15 ohm (chips.md §2.6)"
#: OCC's PCM model (field notes crossbar.md §1.4): the default parameters. OCC models no precision
#: and no device: the precision is the ``q8`` mode's and the device the standard PCM statistical
#: model (chips.md §2.1), both ours, hence unverified for this preset.
PCM_OCC = CrossbarParams(
    sources=(("rows", _OCC + " TILE_SIZE"), ("cols", _OCC + " TILE_SIZE"),
             ("crossbars", _OCC + " NUM_TILES"), ("write_latency_s", _OCC + " 'Write'"),
             ("write_energy_j", _OCC + " 'Write'"), ("mvm_latency_s", _OCC + " 'Read'"),
             ("mvm_energy_j", _OCC + " 'Read'"),
             ("periphery_energy_per_cycle_j", _OCC + " 'Mixed-signal energy'"),
             ("endurance_writes", "crossbar issue (OCC's PCM model)"), ("clock_hz", _OCC),
             ("weight_bits", "q8 mode (ISAAC/PUMA cells, crossbar.md §2.5-2.6)"),
             ("cell_bits", "q8 mode"), ("dac_bits", "q8 mode"), ("adc_bits", "q8 mode"),
             ("device_model", "aihwkit PCMLikeNoiseModel (chips.md §2.1)"),
             ("folded", _OCC_MIXED), ("folded_into", _OCC_MIXED)),
    unverified=("endurance_writes", "weight_bits", "cell_bits", "dac_bits", "adc_bits",
                "device_model"),
    folded=("adc_dac",), folded_into="periphery",
)

#: A ReRAM crossbar after ISAAC/PUMA geometry and NVSim/MNSIM cell figures (field notes
#: crossbar.md §2.4-2.6 and §2.8):
#:
#: - 128 x 128 cells (ISAAC; PUMA ``MVMU_DIM 128``; NeuroSim's default subarray);
#: - a tile write, with its periphery: PUMA's ISAAC-derived whole-array constants
#:   (``puma-simulator`` ``include/constants.py``, "models from ISAAC paper", chips.md §1.2)
#:   ``xbar_wr_lat`` 351 / 32 us = 10.97 us and 676,000 / 32 pJ = 21.1 nJ per 128 x 128 array
#:   [code, derived] (the earlier NVSim cell figures, 10 ns and 0.6 pJ per cell row by row,
#:   gave 1.28 us and 9.83 nJ without the periphery);
#: - one MVM (a crossbar read cycle) 100 ns (ISAAC / PUMA ``xbar_ip_lat``), cell read energy
#:   0.1 pJ (NVSim) over 128 * 128 cells = 1.64 nJ;
#: - 8-bit ADC 1.67 pJ per conversion (ISAAC, via the ``hwcomponents_library`` model), 1.2 GS/s,
#:   1200 um^2, 8 ADCs per IMA of 8 crossbars: one per crossbar (chips.md §1.2); 1-bit DAC
#:   0.42 pJ per drive, 170 um^2 per 8 x 128 DACs (chips.md §1.2);
#: - area per crossbar [derived]: cells 25 um^2 (PUMA ``xbar_area_dict``), ADC and 128 DACs
#:   1200 + 170 / 8 = 1221.25 um^2, shift-and-add 4 x 60 um^2 per IMA / 8 crossbars = 30 um^2
#:   (the IMA's and tile's buffers and network are not counted);
#: - no separate always-on periphery term (the ADCs carry it, as in ISAAC);
#: - endurance 1e6 writes (NVMain's default mean; HfOx RRAM endurance-model abstract);
#: - ISAAC stores 16-bit weights in 8 slices of 2-bit cells with offset encoding (chips.md §1.1);
#:   ISAAC publishes no device noise, so the ReRAM model is NeuRRAM's cells (chips.md §2.4).
#: Not calibrated against a chip: an "ISAAC-like" profile for comparisons, as crossbar.md §6
#: suggests; 4 crossbars, not ISAAC's 8 per IMA x 12 IMAs per tile x (unconfirmed) 168 tiles.
RERAM_ISAAC = CrossbarParams(
    rows=128, cols=128, crossbars=4,
    write_latency_s=351e-6 / 32, write_energy_j=676_000e-12 / 32,
    mvm_latency_s=100e-9, mvm_energy_j=128 * 128 * 0.1e-12,
    periphery_energy_per_cycle_j=0.0, endurance_writes=1e6, clock_hz=1e9,
    adc_energy_j=1.67e-12, min_macs=128 * 128, name="reram-isaac",
    technology="ReRAM", node_nm=32, weight_bits=16, cell_bits=2, dac_bits=16, adc_bits=8,
    dac_energy_j=0.42e-12, adc_latency_s=1 / 1.2e9, adcs_per_array=1, cell_area_mm2=25e-6,
    adc_dac_area_mm2=(1200 + 170 / 8) * 1e-6, dac_area_mm2=170 / 8 * 1e-6, periphery_area_mm2=4 * 60e-6 / 8,
    device_model="rram-wan2022",
    wire_ohm_row=0.15, wire_ohm_col=0.15,
    sources=(("rows", "ISAAC 128x128 (crossbar.md §2.6)"), ("cols", "ISAAC (crossbar.md §2.6)"),
             ("crossbars", "ours: a 4-crossbar profile"),
             ("write_latency_s", "PUMA constants.py xbar_wr_lat 351/32 us, ISAAC-derived "
              "(chips.md §1.2) [code]"),
             ("write_energy_j", "PUMA constants.py 676,000/32 pJ per array write (chips.md "
              "§1.2) [code, derived]"),
             ("mvm_latency_s", "PUMA xbar_ip_lat (chips.md §1.2)"),
             ("mvm_energy_j", "NVSim 0.1 pJ cell read (crossbar.md §2.8)"),
             ("endurance_writes", "NVMain default; HfOx RRAM abstract (crossbar.md §2.8)"),
             ("adc_energy_j", "ISAAC ADC via hwcomponents IsaacADC (chips.md §1.2)"),
             ("periphery_energy_per_cycle_j", "0: ISAAC's ADCs carry it (crossbar.md §2.6)"),
             ("adc_latency_s", "ISAAC ADC 1.2 GS/s (chips.md §1.2)"),
             ("dac_energy_j", "hwcomponents IsaacDAC (chips.md §1.2)"),
             ("adcs_per_array", "ISAAC 8 ADCs per IMA of 8 crossbars (chips.md §1.1)"),
             ("cell_area_mm2", "PUMA xbar_area_dict 128x128 25 um^2 (chips.md §1.2)"),
             ("adc_dac_area_mm2", "hwcomponents IsaacADC 1200 um^2 + IsaacDAC 170/8 um^2 "
              "(chips.md §1.2) [derived]"),
             ("dac_area_mm2", "hwcomponents IsaacDAC 170 um^2 per 8 x 128 DACs (chips.md §1.2)"),
             ("periphery_area_mm2", "hwcomponents IsaacShiftAdd 4 x 60 um^2 per IMA / 8 "
              "(chips.md §1.2) [derived]"),
             ("node_nm", "ISAAC 32 nm (chips.md §1.1)"),
             ("weight_bits", "ISAAC 16 b weights (chips.md §1.1)"),
             ("cell_bits", "ISAAC 2 b cells (chips.md §1.1)"),
             ("dac_bits", "ISAAC 1 b x 16 cycles, 16-bit inputs (chips.md §1.1)"),
             ("adc_bits", "ISAAC 8 b SAR (chips.md §1.2)"),
             ("device_model", "aihwkit ReRamWan2022NoiseModel (chips.md §2.4)"),
             ("wire_ohm_row", _WIRE), ("wire_ohm_col", _WIRE)),
    unverified=("crossbars", "device_model", "wire_ohm_row", "wire_ohm_col", "periphery_area_mm2"),
)

_HERMES = "Le Gallo et al., Nat. Electron. 2023 [abs] (chips.md §1.5)"
_HCORE = "Khaddam-Aljameh et al., JSSC 2022 [abs] (chips.md §1.5)"
#: IBM HERMES 64-core PCM chip (Le Gallo et al., Nat. Electron. 6, 2023; HERMES core:
#: Khaddam-Aljameh et al., JSSC 2022; field notes chips.md §1.5, §2.2):
#:
#: - 64 cores of 256 x 256 PCM unit cells, 14 nm CMOS [abs];
#: - 8-bit inputs and outputs; 256 CCO ADCs per core at 300 ps per LSB [abs] -> a worst-case 8-bit
#:   conversion 256 * 0.3 ns = 76.8 ns [derived];
#: - one MVM in one-phase mode: 63.1 TOPS and 9.76 TOPS/W over 64 cores, 2 * 256 * 256 = 131,072
#:   ops per MVM [abs] -> 131072 / (63.1e12 / 64) = 132.9 ns and 131072 / 9.76e12 = 13.43 nJ per
#:   core-MVM [derived], ADCs and periphery included (so no separate ADC or periphery term).
#:   The four-phase (high-precision) mode is 4x slower: 16.1 TOPS, 2.48 TOPS/W;
#: - weights as one analog conductance per polarity (1 device each; g_max 10.35 uS, aihwkit
#:   ``HermesNoiseModel``, chips.md §2.2): 8-bit signed weights, a 7-bit magnitude per cell;
#: - core area 0.62 mm^2 [derived, unverified]: the core's 1.59 TOPS/mm^2 [abs] at the one-phase
#:   core throughput 0.986 TOPS (63.1 / 64); the core's cells, ADCs and periphery are not
#:   published apart, so the whole core counts as ``cell_area_mm2`` (``folded``);
#: - 256 ADCs per core [abs]: one conversion each per MVM, 76.8 of the 132.9 ns;
#: - programming (closed-loop program-verify) time and energy: not found in the chip's
#:   abstracts, the Nature Electronics figure captions (Extended Data Fig. 5 describes the
#:   two-device program-verify algorithm, no time or energy), aihwkit's docs, Joshi et al. 2020
#:   or Le Gallo's program-verify precision paper (searched this session): placeholders of
#:   ours, one row at a time with a PCM SET pulse of 150 ns (NVSim sample_PCRAM, crossbar.md
#:   §2.8): 256 * 150 ns = 38.4 us, and OCC's per-cell write energy (200 pJ per 4096 cells) for
#:   65,536 cells = 3.2 nJ; both without the (unpublished) verify iterations. They enter a
#:   model's cost only when its weights do not fit the 64 cores (programming at load is not
#:   per inference);
#: - endurance: OCC's PCM figure (unverified for this chip);
#: - wire resistance per cell: 0.15 ohm (``_WIRE``), unverified for this chip.
PCM_HERMES = CrossbarParams(
    rows=256, cols=256, crossbars=64,
    write_latency_s=256 * 150e-9, write_energy_j=256 * 256 * 200e-12 / 4096,
    mvm_latency_s=131072 / (63.1e12 / 64), mvm_energy_j=131072 / 9.76e12,
    periphery_energy_per_cycle_j=0.0, endurance_writes=3.2e7, clock_hz=1e9, adc_energy_j=0.0,
    min_macs=256 * 256, name="pcm-hermes", technology="PCM", node_nm=14, weight_bits=8,
    cell_bits=7, dac_bits=8, adc_bits=8, adc_latency_s=256 * 0.3e-9, adcs_per_array=256,
    cell_area_mm2=0.62, folded=("adc_dac", "periphery"),
    device_model="pcm-hermes-1dev", wire_ohm_row=0.15, wire_ohm_col=0.15,
    sources=(("rows", _HCORE + " 256x256"), ("cols", _HCORE), ("crossbars", _HERMES + " 64 cores"),
             ("write_latency_s", "ours: 256 rows x 150 ns PCM SET (NVSim, crossbar.md §2.8)"),
             ("write_energy_j", "ours: OCC per-cell write energy x 65,536 cells"),
             ("mvm_latency_s", _HERMES + " 63.1 TOPS one-phase [derived]"),
             ("mvm_energy_j", _HERMES + " 9.76 TOPS/W one-phase [derived]"),
             ("periphery_energy_per_cycle_j", "0: in the chip's TOPS/W (mvm_energy_j)"),
             ("endurance_writes", "OCC's PCM figure (crossbar issue)"),
             ("clock_hz", _HCORE + " 1 GHz"), ("node_nm", _HERMES + " 14 nm"),
             ("weight_bits", _HERMES + " 8-bit in/out MVM"),
             ("cell_bits", "analog: the 7-bit magnitude in one device (aihwkit Hermes, chips.md §2.2)"),
             ("dac_bits", _HERMES + " 8-bit inputs"), ("adc_bits", _HERMES + " 8-bit outputs"),
             ("adc_latency_s", _HCORE + " 300 ps/LSB x 256 [derived]"),
             ("adcs_per_array", _HCORE + " 256 CCO ADCs per core"),
             ("cell_area_mm2", _HCORE + " 1.59 TOPS/mm^2 [derived]: the whole core"),
             ("folded", "ADCs and periphery inside the chip's TOPS/W and the core's TOPS/mm^2"),
             ("device_model", "aihwkit HermesNoiseModel, 1 device (chips.md §2.2)"),
             ("wire_ohm_row", _WIRE), ("wire_ohm_col", _WIRE)),
    unverified=("write_latency_s", "write_energy_j", "endurance_writes", "cell_area_mm2",
                "wire_ohm_row", "wire_ohm_col"),
)

_NEURRAM = "Wan et al., Nature 608, 2022 [abs] (chips.md §1.6)"
_ACCELERGY = "Accelergy hwcomponents neurram.py [code/sec] (chips.md §1.6)"
#: NeuRRAM (Wan et al., Nature 608, 2022; field notes chips.md §1.6, §2.4):
#:
#: - 48 cores of 256 x 256 RRAM (16 x 16 corelets of 16 x 16 cells [sec]; the 48 from the issue,
#:   3.1 M cells [derived]); 130 nm [unconfirmed];
#: - 4-bit weights [abs] as an analog differential pair (a 3-bit magnitude per cell; the pair
#:   is our reading, unverified); input and output bit widths [unconfirmed]: 4-bit DAC and
#:   8-bit ADC placeholders;
#: - one MVM per 1 us cycle, per column 1.2 pJ analog sample + 0.25 pJ integrator, so 256 * 1.45 pJ
#:   = 371 pJ per MVM, plus 0.3 pJ per ADC read (Accelergy's estimates of the paper's circuits
#:   [code/sec]);
#: - the per-column sample and integrator energies are the neurons' (periphery), counted in
#:   ``mvm_energy_j`` (``folded``); cell read energy and areas are not published;
#: - programming (iterative write-verify, Extended Data Fig. 3 of the paper: incremental
#:   SET/RESET pulses until the conductance is within an acceptance range; no time or energy
#:   given in the captions found) [unconfirmed]: NVSim's ReRAM cell (10 ns, 0.6 pJ per
#:   switch, crossbar.md §2.8), row by row: 256 * 10 ns = 2.56 us and 65,536 * 0.6 pJ = 39.3 nJ
#:   per tile, without verify iterations; endurance 1e6 (NVMain default) [unconfirmed];
#: - device: aihwkit ``ReRamWan2022NoiseModel`` (g_max 40 uS, fitted on this chip's data,
#:   chips.md §2.4); wire resistance: aihwkit IRDropT's 0.15 ohm per cell (chips.md §2.6),
#:   unverified for this chip.
RRAM_NEURRAM = CrossbarParams(
    rows=256, cols=256, crossbars=48,
    write_latency_s=256 * 10e-9, write_energy_j=256 * 256 * 0.6e-12,
    mvm_latency_s=1e-6, mvm_energy_j=256 * (1.2e-12 + 0.25e-12),
    periphery_energy_per_cycle_j=0.0, endurance_writes=1e6, clock_hz=1e6, adc_energy_j=0.3e-12,
    min_macs=256 * 256, name="rram-neurram", technology="ReRAM", node_nm=130, weight_bits=4,
    cell_bits=3, dac_bits=4, adc_bits=8, device_model="rram-wan2022", folded=("periphery",),
    mvm_energy_per="column",
    wire_ohm_row=0.15, wire_ohm_col=0.15,
    sources=(("rows", "review fig. of " + _NEURRAM + " [sec]"), ("cols", "same [sec]"),
             ("crossbars", "issue 15 / chips.md §1.6 (48 cores)"),
             ("write_latency_s", "ours: NVSim ReRAM 10 ns x 256 rows (crossbar.md §2.8)"),
             ("write_energy_j", "ours: NVSim ReRAM 0.6 pJ x 65,536 cells (crossbar.md §2.8)"),
             ("mvm_latency_s", _ACCELERGY + " 1 us cycle"),
             ("mvm_energy_j", _ACCELERGY + " sample + integrator per column"),
             ("adc_energy_j", _ACCELERGY + " 0.3 pJ per read"),
             ("periphery_energy_per_cycle_j", "0: the per-column sample/integrate energies"),
             ("folded", "the neurons' sample/integrate energies in mvm_energy_j"),
             ("mvm_energy_per", _ACCELERGY + " per-column neuron energies"),
             ("endurance_writes", "NVMain default (crossbar.md §2.8)"),
             ("clock_hz", _ACCELERGY + " 1 us cycle"),
             ("node_nm", "chips.md §1.1 [unconfirmed]"),
             ("weight_bits", _NEURRAM + " 4-bit-weight models"),
             ("cell_bits", "ours: analog pair, 3-bit magnitude"),
             ("dac_bits", "placeholder [unconfirmed]"), ("adc_bits", "placeholder [unconfirmed]"),
             ("device_model", "aihwkit ReRamWan2022NoiseModel (chips.md §2.4)"),
             ("wire_ohm_row", _WIRE), ("wire_ohm_col", _WIRE)),
    unverified=("crossbars", "write_latency_s", "write_energy_j", "endurance_writes", "node_nm",
                "cell_bits", "dac_bits", "adc_bits", "wire_ohm_row", "wire_ohm_col"),
)

#: The default chip (``--cim-preset`` unset): IBM's HERMES 64-core PCM chip, the only preset
#: whose geometry, precision, MVM time and energy all come from a measured chip and whose
#: device model was fitted on it; 4.19 M weights on chip hold the small and mid-size models
#: (docs/crossbar-presets.md, "Which default"). ``pcm-occ`` reproduces the CINM paper.
DEFAULT = PCM_HERMES

#: Parameter presets by name (``--cim-preset``; the first is the default, :data:`DEFAULT`).
PRESETS = {p.name: p for p in (PCM_HERMES, PCM_OCC, RERAM_ISAAC, RRAM_NEURRAM)}
