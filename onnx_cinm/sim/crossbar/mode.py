"""Non-ideal crossbar modes: what the analog data path of one MVM does to the numbers.

A :class:`CrossbarMode` is written into the header of a ``.xbar`` file (``docs/xbar-format.md``,
"Modes") and executed by :mod:`onnx_cinm.sim.crossbar`. ``ideal`` (the default) is exact
fp32; ``quantized`` models, in this order, the effects listed in the field notes
``shared/field-notes/crossbar.md`` (section numbers below refer to that file):

1. **Weight quantization** (§4 "Quantise first"): each output channel ``n`` of ``W[g]`` (one
   column, over all of ``K``, not per tile) gets the symmetric scale
   ``s_w[g, n] = max_k |W[g, k, n]| / Lw`` with ``Lw = 2**(weight_bits - 1) - 1``, computed in
   float64 from the float32 weights (an all-zero column gets scale 1); the integer weight is
   ``q = clip(rint(W / s_w), -Lw, Lw)`` (``rint``: round half to even). The scales are derived
   from the weights when the file is loaded, so a file needs no extra sidecar; they are kept in
   digital post-processing (the ADC output is multiplied by them).
2. **Signed weights** (§4 "Signed weights"): ``differential on``: a pair of cells per weight and
   slice, ``G+ = max(q, 0)``, ``G- = max(-q, 0)`` (one-sided: the unused cell is at level 0), the
   two currents subtracted in analog on the column pair, so one ADC conversion reads the pair
   (CrossSim ``BalancedCore`` with subtraction in the crossbar). ``differential off``: one cell
   holds ``q + Lw`` (offset encoding, ``0 .. 2 * Lw``) and the offset ``Lw * sum_i x_i`` is
   subtracted digitally after the ADC (CrossSim ``OffsetCore DIGITAL_OFFSET``).
3. **Bit slicing** (§4 "Bit slicing"): the stored non-negative integer (``|q|``: ``weight_bits -
   1`` bits; offset: ``weight_bits`` bits) is cut into ``S`` slices of ``cell_bits`` bits, slice
   ``s`` holding bits ``[s * cell_bits, (s + 1) * cell_bits)`` in its own cell (levels ``0 ..
   2**cell_bits - 1``); each slice is read by its own ADC and the results are shift-added
   digitally: ``y = sum_s 2**(s * cell_bits) * y_s``. ``S = ceil((weight_bits - 1) / cell_bits)``
   for differential, ``ceil(weight_bits / cell_bits)`` for offset (int8 on 2-bit cells: 4 slices,
   8 cells per weight with differential pairs, as ISAAC/PUMA; §2.5, §2.6).
4. **DAC** (§4 "Input slicing"; single pass, like aihwkit's pulse-width DAC, §2.2): every input
   vector (one row of ``X`` restricted to the ``rows_used`` inputs of the tile it streams through)
   is scaled by its own ``s_x = max_i |x_i|`` (a zero vector: 1) onto ``[-1, 1]``; with
   ``dac_bits = b > 0`` it is rounded to the ``2**b - 1`` signed levels ``-Lx .. Lx``,
   ``Lx = 2**(b - 1) - 1`` (sign-magnitude DAC); ``dac_bits = 0`` applies the scaled value
   unrounded (an ideal DAC, ``Lx = 1``). One DAC cycle per MVM.
5. **Read noise** (§2.1 CrossSim ``read_noise``, §2.2 aihwkit ``w_noise``): every programmed
   cell's level ``G`` is read as ``G * (1 + noise_sigma * e)``, ``e ~ N(0, 1)`` independent per
   cell and per MVM (re-sampled at every read, seeded). The sum over a column of independent
   Gaussians is drawn in one go: the column current gets ``N(0, noise_sigma**2 * sum_i x_i**2 * G_i**2)``
   (``G+`` and ``G-`` both counted for a pair). A cell at level 0 (the off state) is noiseless.
6. **ADC** (§2.6 ISAAC resolution rule, §4 "ADC precision"): each slice column of each MVM is
   converted by a signed ``adc_bits = b`` ADC with ``2**b - 1`` levels ``-La .. La``,
   ``La = 2**(b - 1) - 1``, over ``[-F, F]``. Full-scale rule (per column, fixed when the tile is
   programmed, "calibrated" to its conductances): ``F = adc_range * Lx * sum_i |D_i|``, where
   ``D_i`` is the cell level (``G+ - G-`` for a pair) on row ``i`` of the column: the largest
   current any input within the DAC range can produce, so with ``adc_range = 1`` a noiseless
   column never clips; ``adc_range < 1`` trades clipping for resolution. Values outside
   ``[-F, F]`` saturate (counted as ``adc_clipped``). ``adc_bits = 0``: an ideal ADC.
   ``adc_calibration = "data"`` (field notes ``crossbar.md`` §4 "ADC precision": calibrate
   the ranges, CrossSim's ``CALIBRATED`` option, since lossless needs about
   ``log2(rows) + b_cell + b_dac`` bits, 8 + 7 + 8 on a 256-row pcm-hermes column, far more
   than its 8-bit ADC): one ``F = adc_range * max |I|`` per tile and bit slice instead, over
   every column of the slice, ``I`` the currents of the target levels (``DAC levels @ D``, no
   device effect) over the first inference through the tile that carries current (its
   calibration set, as a chip's ADC ranges are set on sample data after programming; kept for
   the simulator's lifetime, also when the tile is programmed again); a slice without current
   keeps the full-scale rule. CrossSim calibrates per layer, offline; one range per tile here,
   not one per column: a range per column set by one input vector (a dense layer at batch 1)
   clipped the next vectors' larger currents. With the full-scale rule a typical column of a
   256-row tile with non-negative inputs spans only a few LSB, so an ADC error of 1 LSB is of
   the order of the signal; calibrated, the quantization error of a conversion is at most
   ``F / (2 La)``, and a first inference unlike the later ones clips them.

7. **Device physics** (optional, all off by default; :mod:`.physics`, field notes
   ``chips.md`` §2): each physical cell's level ``l`` (``0 .. Lc``, ``Lc = 2**cell_bits - 1``) is
   the target conductance ``g_T = l / Lc * g_max`` of the ``device`` model; when a tile is
   programmed the simulator draws, in this order, programming noise (``prog_noise`` scales the
   model's sigma), drift to ``time_s`` seconds after programming (``drift`` scales the
   exponents), 1/f read noise at that time (``read_noise_1f``) and stuck-at cells
   (``stuck_at_0``, ``stuck_at_1`` rates), and computes with the resulting conductances (back in
   level units ``g / g_max * Lc``). The ADC full scale stays calibrated to the *target* levels
   (set when the tile is programmed), so drift shows as lost signal. ``drift_compensation``
   multiplies each tile's digital output by ``sum|W after programming| / sum|W at time_s|``,
   ``W`` the tile's weights as a one-hot calibration read sees them (``G+ - G-``, slices
   recombined by significance; global drift compensation, :func:`.physics.gdc_factor`).
   ``wire_ohm_row``/``wire_ohm_col`` add first-order IR drop to every MVM (each array of a pair
   on its own wires). ``adc_offset_lsb`` and ``adc_gain_std``
   are the standard deviations of a per-column offset (LSB) and relative gain error, drawn once
   per crossbar; ``adc_inl_lsb`` a parabolic INL bow peaking at mid-scale. The device draws use
   their own generator, seeded from ``seed``, so they never change the read-noise draws.

With ``adc_bits = 0`` and ``noise_sigma = 0`` the quantized mode is exact integer arithmetic:
``y = (x_levels @ q) * s_x * s_w`` (slices and pairs recombine exactly).

Counting (simulator counters, quantized mode): a programmed tile of ``r x c`` weights occupies
``r * c * S * (2 if differential else 1)`` physical cells, and ``cell_writes`` counts those; one
MVM reads all ``S`` (pairs of) arrays in parallel and makes ``c * S`` ADC conversions (one per
slice column, the pair subtracted in analog) and ``r`` DAC conversions. Latency, tile writes and
MVMs are counted per logical tile as in ideal mode.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["CrossbarMode", "IDEAL", "MODES", "DEVICE_EFFECTS", "ADC_CALIBRATIONS"]

MODES = ("ideal", "quantized")
#: ADC full-scale rules (effect 6): the column's largest possible current, or calibrated on data
ADC_CALIBRATIONS = ("max", "data")
_MAX_BITS = 16
#: device-effect fields (effect 7), in header order
_PHYSICS_KEYS = ("device", "prog_noise", "drift", "read_noise_1f", "time_s", "drift_compensation",
                 "stuck_at_0", "stuck_at_1", "wire_ohm_row", "wire_ohm_col", "adc_offset_lsb",
                 "adc_gain_std", "adc_inl_lsb")
_PHYSICS_FLOATS = ("noise_sigma", "prog_noise", "drift", "read_noise_1f", "time_s", "stuck_at_0",
                   "stuck_at_1", "wire_ohm_row", "wire_ohm_col", "adc_offset_lsb", "adc_gain_std",
                   "adc_inl_lsb")
#: effects that act on conductances, so need a device model (its g_max and formulas)
DEVICE_EFFECTS = ("prog_noise", "drift", "read_noise_1f", "stuck_at_0", "stuck_at_1",
                  "wire_ohm_row", "wire_ohm_col")


@dataclass(frozen=True)
class CrossbarMode:
    """How a crossbar computes (see the module docstring for every formula and its source).

    Attributes:
        mode: ``"ideal"`` (exact fp32; every other field must keep its default) or
            ``"quantized"``.
        weight_bits: signed weight precision, 2..16 bits (levels ``-Lw .. Lw``,
            ``Lw = 2**(weight_bits-1) - 1``), one scale per output channel.
        cell_bits: bits stored per cell (1..weight_bits); the weight is cut into ``S`` slices.
        differential: True: differential pair per weight and slice; False: offset encoding.
        dac_bits: input (DAC) precision including the sign, 0 (ideal DAC) or 2..16.
        adc_bits: ADC precision including the sign, 0 (ideal ADC) or 2..16.
        adc_range: fraction (0, 1] of the column's largest possible current (or, with
            ``adc_calibration "data"``, of its largest calibration current) taken as the ADC
            full scale ``F``.
        noise_sigma: relative read noise per cell per MVM (standard deviation as a fraction of
            the cell's level), finite, >= 0.
        seed: seed of the read-noise generator, int >= 0 (one generator per simulator); the
            device effects draw from a second generator seeded from it.
        device: device model name in :data:`.physics.DEVICE_MODELS` ('' : none); required by
            every effect below but the ADC ones.
        prog_noise, drift, read_noise_1f: scales (>= 0; 0 off, 1 the published model) of the
            device's programming noise, drift exponents and 1/f read noise.
        time_s: seconds after programming at which the conductances are taken (>= 0).
        drift_compensation: global drift compensation of each tile's output.
        stuck_at_0, stuck_at_1: fractions of cells stuck at 0 / at ``g_max`` (sum <= 1).
        wire_ohm_row, wire_ohm_col: wire resistance per cell, ohms (IR drop; 0 off).
        adc_offset_lsb, adc_gain_std, adc_inl_lsb: ADC offset sigma (LSB), relative gain sigma
            and peak INL (LSB); need ``adc_bits > 0``.
        adc_calibration: how the ADC full scale is set (effect 6): ``"max"``, per slice
            column, the largest current any input can make; ``"data"``, per tile and slice,
            the largest current of the first inference through the tile.

    Raises:
        ValueError: on an unknown mode, a parameter out of range, or a non-default parameter in
            ideal mode (one line naming the field).
    """

    mode: str = "ideal"
    weight_bits: int = 8
    cell_bits: int = 2
    differential: bool = True
    dac_bits: int = 8
    adc_bits: int = 8
    adc_range: float = 1.0
    noise_sigma: float = 0.0
    seed: int = 0
    device: str = ""
    prog_noise: float = 0.0
    drift: float = 0.0
    read_noise_1f: float = 0.0
    time_s: float = 0.0
    drift_compensation: bool = False
    stuck_at_0: float = 0.0
    stuck_at_1: float = 0.0
    wire_ohm_row: float = 0.0
    wire_ohm_col: float = 0.0
    adc_offset_lsb: float = 0.0
    adc_gain_std: float = 0.0
    adc_inl_lsb: float = 0.0
    adc_calibration: str = "max"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("weight_bits", "cell_bits", "dac_bits", "adc_bits", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an int, got {v!r}")
        for name in ("differential", "drift_compensation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("adc_range",) + _PHYSICS_FLOATS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v \
                    or v in (float("inf"), float("-inf")):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not 2 <= self.weight_bits <= _MAX_BITS:
            raise ValueError(f"weight_bits must be in 2..{_MAX_BITS}, got {self.weight_bits}")
        if not 1 <= self.cell_bits <= self.weight_bits:
            raise ValueError(f"cell_bits must be in 1..weight_bits ({self.weight_bits}), "
                             f"got {self.cell_bits}")
        for name in ("dac_bits", "adc_bits"):
            v = getattr(self, name)
            if v != 0 and not 2 <= v <= _MAX_BITS:
                raise ValueError(f"{name} must be 0 (ideal) or in 2..{_MAX_BITS}, got {v}")
        if not 0 < self.adc_range <= 1:
            raise ValueError(f"adc_range must be in (0, 1], got {self.adc_range}")
        if self.adc_calibration not in ADC_CALIBRATIONS:
            raise ValueError(f"adc_calibration must be one of {', '.join(ADC_CALIBRATIONS)}, "
                             f"got {self.adc_calibration!r}")
        if self.noise_sigma < 0:
            raise ValueError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        self._check_physics()
        if self.mode == "ideal":
            for f in fields(self):
                if f.name != "mode" and getattr(self, f.name) != f.default:
                    raise ValueError(f"ideal mode takes no {f.name} (got "
                                     f"{getattr(self, f.name)!r}); use mode='quantized'")

    def _check_physics(self) -> None:
        from .physics import DEVICE_MODELS

        if not isinstance(self.device, str):
            raise ValueError(f"device must be a str, got {self.device!r}")
        for name in _PHYSICS_FLOATS:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.device and self.device not in DEVICE_MODELS:
            raise ValueError(f"device must be one of {', '.join(DEVICE_MODELS)}, got "
                             f"{self.device!r}")
        if self.stuck_at_0 + self.stuck_at_1 > 1:
            raise ValueError(f"stuck_at_0 + stuck_at_1 must be <= 1, got "
                             f"{self.stuck_at_0 + self.stuck_at_1}")
        needs_device = [n for n in DEVICE_EFFECTS if getattr(self, n)]
        if needs_device and not self.device:
            raise ValueError(f"device must name a device model for {needs_device[0]}")
        adc = [n for n in ("adc_offset_lsb", "adc_gain_std", "adc_inl_lsb") if getattr(self, n)]
        if adc and not self.adc_bits:
            raise ValueError(f"{adc[0]} needs adc_bits > 0")

    @property
    def physical(self) -> bool:
        """Whether any device effect (module docstring, effect 7) is on."""
        return any(getattr(self, f.name) != f.default for f in fields(self)
                   if f.name in _PHYSICS_KEYS)

    # -- derived quantities (integers; see the module docstring)
    @property
    def ideal(self) -> bool:
        return self.mode == "ideal"

    @property
    def weight_levels(self) -> int:
        """``Lw = 2**(weight_bits - 1) - 1``: the largest weight magnitude level."""
        return 2 ** (self.weight_bits - 1) - 1

    @property
    def slices(self) -> int:
        """``S``: cells (pairs, if differential) per weight; 1 in ideal mode."""
        if self.ideal:
            return 1
        bits = self.weight_bits - 1 if self.differential else self.weight_bits
        return -(-bits // self.cell_bits)

    @property
    def cells_per_weight(self) -> int:
        """Physical cells holding one weight: ``S * (2 if differential else 1)``; 1 if ideal."""
        if self.ideal:
            return 1
        return self.slices * (2 if self.differential else 1)

    def header_items(self) -> list[tuple[str, str]]:
        """``(key, value)`` header lines of a ``.xbar`` file in a fixed order (ideal: mode only)."""
        items = [("mode", self.mode)]
        if not self.ideal:
            items += [("weight_bits", str(self.weight_bits)), ("cell_bits", str(self.cell_bits)),
                      ("differential", "on" if self.differential else "off"),
                      ("dac_bits", str(self.dac_bits)), ("adc_bits", str(self.adc_bits)),
                      ("adc_range", repr(float(self.adc_range))),
                      ("noise_sigma", repr(float(self.noise_sigma))), ("seed", str(self.seed))]
            if self.adc_calibration != "max":  # written only when not the default
                items.append(("adc_calibration", self.adc_calibration))
            if self.physical:  # the device effects that are on, in a fixed order
                defaults = {f.name: f.default for f in fields(self)}
                for name in _PHYSICS_KEYS:
                    v = getattr(self, name)
                    if v == defaults[name]:
                        continue
                    items.append((name, v if isinstance(v, str) else
                                  ("on" if v else "off") if isinstance(v, bool) else repr(float(v))))
        return items


#: Exact fp32 (the default everywhere).
IDEAL = CrossbarMode()
