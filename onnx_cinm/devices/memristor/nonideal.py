"""Named crossbar modes and device effects of the memristor device (``--cim-mode``,
``--cim-effects``): which :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` a chip preset and
a mode name stand for. The mode itself (every formula, the ``.xbar`` header keys) is the
simulator's, :mod:`onnx_cinm.sim.crossbar.mode`.
"""
from __future__ import annotations

from ...sim.crossbar.mode import DEVICE_EFFECTS, IDEAL, CrossbarMode

__all__ = ["Q8", "Q8_NOISY", "PRESETS", "preset", "EFFECTS", "TIMED", "NAMED", "compose"]

#: The ``q8`` precision: 8-bit weights on 2-bit cells (4 slices, differential pairs: ISAAC/PUMA
#: cells, field notes crossbar.md §2.5-2.6), 8-bit DAC and 8-bit ADC (ISAAC's ADC).
_Q8_BITS = {"weight_bits": 8, "cell_bits": 2, "differential": True, "dac_bits": 8, "adc_bits": 8}

#: Device effects by name (``--cim-effects``): the mode fields each sets, given the chip preset
#: ``p`` (a :class:`.presets.CrossbarParams`) and the time after programming ``t``.
#: ``read``: 2 % relative read noise per cell and MVM (aihwkit's PCM-like ``w_noise`` is 1.75 %,
#: crossbar.md §2.2); ``stuck``: 0.1 % of the cells stuck at 0 and 0.1 % at g_max (MNSIM 2.0's
#: default, which cites no source, chips.md §2.5: so in no mode's default, by name only);
#: ``adc``: a 1 LSB INL bow (typical |INL| <= 1
#: LSB, chips.md §2.7 [abs]) and a 0.5 LSB offset spread per column (ours: no published figure
#: for CIM ADCs, chips.md §4 item 9); ``irdrop``: the preset's wire resistances.
EFFECTS = {
    "read": lambda p, t: {"noise_sigma": 0.02},
    "prog": lambda p, t: {"prog_noise": 1.0},
    "drift": lambda p, t: {"drift": 1.0, "time_s": t},
    "read1f": lambda p, t: {"read_noise_1f": 1.0, "time_s": t},
    "gdc": lambda p, t: {"drift_compensation": True},
    "stuck": lambda p, t: {"stuck_at_0": 0.001, "stuck_at_1": 0.001},
    "irdrop": lambda p, t: {"wire_ohm_row": p.wire_ohm_row, "wire_ohm_col": p.wire_ohm_col},
    "adc": lambda p, t: {"adc_inl_lsb": 1.0, "adc_offset_lsb": 0.5},
}

#: The effects that depend on the time after programming (they read ``t``): a time changes
#: nothing on a data path without one of them.
TIMED = ("drift", "read1f")

#: Named modes (the ``cim_mode`` node attribute, ``--cim-mode``): precision plus effects.
#: ``q8``/``q8-noisy`` keep their numbers; ``device`` is the chip preset's own precision and
#: device model with programming noise, drift, 1/f noise, drift compensation and IR drop, unless
#: ``--cim-effects`` names others: each of these rests on a published device model or chip
#: (field notes chips.md §2.1-2.4: noise, drift, aihwkit's compensation; §2.6: IR drop, first
#: order, from interconnect figures). Every mode keeps the ADC's full-scale rule
#: (effect 6: the largest current any input can make), which leaves a typical 256-row column with
#: ReLU inputs a few LSB, so there the 8-bit ADC alone made OriNet's logits 18 % off and the
#: ``adc`` effect's 1 LSB of INL 558 %; run option ``adc_calibration data`` calibrates the ranges
#: on the first inference instead (4 % and 52 %), which a first input unlike the later ones
#: turns into clipping (docs/crossbar-presets.md). Not by default: ``read`` (the 1/f model
#: stands for the device's read noise), ``adc`` (HERMES calibrates its ADCs digitally,
#: chips.md §2.7) and ``stuck``: its 0.1 % + 0.1 % is MNSIM 2.0's ``Device_SAF`` default, for
#: which MNSIM's config cites no source (chips.md §2.5, crossbar.md §2.4); in the default it
#: dominated the device data path's error on OriNet and MTCNN's O-Net and reversed drift
#: compensation's measured benefit on O-Net (stuck cells do not drift, so the factor that
#: restores the drifted cells scales their error up too). ``--cim-effects`` names a whole set,
#: not an addition: the ``device`` set with stuck cells is
#: ``prog,drift,read1f,gdc,irdrop,stuck``; the run option ``stuck_at`` (``cim_stuck_at=0.001``,
#: ``evaluate --stuck-at``) adds stuck cells at any rate to whatever set is in force.
NAMED = {
    "ideal": None,
    "q8": ("q8", ()),
    "q8-noisy": ("q8", ("read",)),
    "device": ("chip", ("prog", "drift", "read1f", "gdc", "irdrop")),
}


def compose(name: str, chip=None, time_s: float = 0.0, effects=None, *, seed: int = 0,
            adc_bits: int | None = None, stuck_at: float | None = None,
            drift_compensation: bool | None = None, adc_calibration: str | None = None,
            timed: bool = False) -> CrossbarMode:
    """The mode named ``name`` (a key of :data:`NAMED`) for chip preset ``chip`` (needed by
    ``device``), ``time_s`` seconds after programming, with the effects ``effects`` (names of
    :data:`EFFECTS`; None: the mode's own).

    The keywords change one quantity of the result, whatever the mode and effects say (the run
    options of the crossbar kernels, ``onnx-cinm evaluate``'s sweeps): ``seed`` of the device
    and read-noise draws; ``adc_bits`` (0: an ideal ADC); ``stuck_at``: the fraction of cells
    stuck at 0 and, as many, stuck at ``g_max`` (the ``stuck`` effect is 1e-3); global drift
    compensation on or off; ``adc_calibration`` (``"max"``, the full-scale rule, every
    mode's own; ``"data"``: calibrated on the first inference, mode.py effect 6). Mode
    ``ideal`` takes none of them but ``seed`` (it draws nothing).
    ``timed``: the caller asks for a time after programming (a run option, not the compiled
    one), so the effects must include one of :data:`TIMED`. Raises ValueError on an unknown name or effect, or a value the mode refuses."""
    if name not in NAMED:
        raise ValueError(f"unknown crossbar mode {name!r} (known: {', '.join(NAMED)})")
    spec = NAMED[name]
    if spec is None:
        if effects:
            raise ValueError("mode 'ideal' takes no effects")
        given = [what for what, v in (("ADC bits", adc_bits), ("stuck-at cells", stuck_at),
                                      ("drift compensation", drift_compensation),
                                      ("ADC calibration", adc_calibration)) if v is not None]
        if given:
            raise ValueError(f"mode 'ideal' has no {given[0]} (exact fp32 arithmetic); choose "
                             f"mode {', '.join(repr(n) for n in NAMED if n != 'ideal')}")
        return IDEAL
    precision, default = spec
    chosen = tuple(default if effects is None else effects)
    bad = [e for e in chosen if e not in EFFECTS]
    if bad:
        raise ValueError(f"unknown crossbar effect {bad[0]!r} (known: {', '.join(EFFECTS)})")
    if timed and not set(chosen) & set(TIMED):
        raise ValueError(f"a time after programming changes nothing on mode {name!r} with "
                         f"effects {','.join(chosen) or 'none'}: none of them depends on the "
                         f"time ({', '.join(TIMED)}); choose mode 'device' (its effects include "
                         "drift) or add effect 'drift'")
    if precision == "chip":
        if chip is None:
            raise ValueError("mode 'device' needs a chip preset")
        kw = {"weight_bits": chip.weight_bits, "cell_bits": chip.cell_bits, "differential": True,
              "dac_bits": chip.dac_bits, "adc_bits": chip.adc_bits}
    else:
        kw = dict(_Q8_BITS)
    for e in chosen:
        kw.update(EFFECTS[e](chip, float(time_s)))
    kw["seed"] = seed
    if adc_bits is not None:
        kw["adc_bits"] = adc_bits
    if stuck_at is not None:
        kw["stuck_at_0"] = kw["stuck_at_1"] = float(stuck_at)
    if drift_compensation is not None:
        kw["drift_compensation"] = drift_compensation
    if adc_calibration is not None:
        kw["adc_calibration"] = adc_calibration
    if any(k in kw for k in DEVICE_EFFECTS):
        if chip is None:
            raise ValueError(f"effects {', '.join(chosen)} need a chip preset")
        kw["device"] = chip.device_model
    return CrossbarMode("quantized", **kw)


#: 8-bit weights on 2-bit cells, 8-bit DAC and ADC, no read noise (``compose("q8")``).
Q8 = compose("q8")

#: Q8 plus 2 % relative read noise per cell (``compose("q8-noisy")``).
Q8_NOISY = compose("q8-noisy")

#: Fixed modes by name (the chip-independent ones of :data:`NAMED`).
PRESETS = {"ideal": IDEAL, "q8": Q8, "q8-noisy": Q8_NOISY}


def preset(name: str) -> CrossbarMode:
    """The mode named ``name`` (a key of :data:`PRESETS`). Raises ValueError if unknown."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown crossbar mode {name!r} (known: {', '.join(PRESETS)})") from None
