"""Device physics of analog crossbar cells: what programming, time and wires do to conductances.

Each effect is a pure function of numpy arrays and a seeded ``numpy.random.Generator``; each is
optional and they compose in the order :func:`realize` applies them (program -> drift -> 1/f
read noise -> stuck-at cells), then, per MVM, IR drop (:func:`ir_drop`) and the ADC transfer
(:func:`adc_convert`), with global drift compensation (:func:`gdc_factor`) in the digital
post-processing. Conductances are in microsiemens (uS), times in seconds, ``x = g_T / g_max`` is
the normalized target conductance. The simulator (:mod:`onnx_cinm.sim.crossbar`) maps cell
levels to conductances, calls these, and maps back.

Formulas and parameters are restated from the field notes ``shared/field-notes/chips.md`` §2
(facts and fitted formulas from IBM aihwkit, Sandia CrossSim, NeuroSim and MNSIM; no code was
taken from them):

- **Programming noise** (§2.1-2.4): ``g_prog = max(g_T + sigma_prog(x) * z, 0)``, ``z ~ N(0, 1)``
  per device; ``sigma_prog`` is the device model's polynomial (closed-loop write-verify).
- **Drift** (§2.1): ``g(t) = g_prog * ((t + t0) / t0) ** (-nu)``, time ``t`` counted from the end
  of programming (aihwkit's convention: the power law ``(t'/t0)^-nu`` with ``t' = t + t0``, so
  ``g(0) = g_prog``); ``nu = |N(mu_nu(x), sigma_nu(x))|`` per device, drawn once.
- **1/f read noise** (§2.1): ``g_read = max(g(t) + N(0, g(t) * Q_s(x) * sqrt(ln((t + t0 +
  t_read) / (2 t_read)))), 0)``, drawn once per realization at time ``t`` (the conductance the
  chip holds at ``t``; per-MVM fluctuations are the simulator's separate ``noise_sigma``).
- **Stuck-at cells** (§2.5, MNSIM semantics): one uniform draw per cell, ``u < p0``: stuck at
  0 (HRS), ``u >= 1 - p1``: stuck at ``g_max`` (LRS); a stuck cell neither takes its target nor
  drifts nor fluctuates.
- **Global drift compensation** (§2.1, Le Gallo et al. 2018; aihwkit ``GlobalDriftCompensation``):
  one factor per tile, ``alpha = sum|W_eff(0)| / sum|W_eff(t)|`` (:func:`gdc_factor`), where
  ``W_eff`` is what a calibration read of the tile returns for each one-hot input row: the
  weight the devices hold, ``G+ - G-`` of each pair, with the bit slices recombined by their
  significance (shift-add), as the digital output sees them. Applied to the tile's digital
  output after the ADC. It undoes a drift shared by every device exactly; with a
  state-dependent exponent it leaves an error that no single factor removes (see
  ``docs/crossbar-presets.md``, "Drift and its compensation").
- **IR drop**, first order (§2.6; our derivation, see :func:`ir_drop`).
- **ADC** offset, gain error and integral non-linearity (§2.7; see :func:`adc_convert`).

Device models (:data:`DEVICE_MODELS`): ``pcm-joshi2020`` (aihwkit ``PCMLikeNoiseModel``, §2.1),
``pcm-hermes-1dev`` (aihwkit ``HermesNoiseModel``, one device per polarity, §2.2),
``rram-wan2022`` (aihwkit ``ReRamWan2022NoiseModel``, §2.4: no drift law and no 1/f data).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DeviceModel", "DEVICE_MODELS", "program", "drift_exponents", "drift", "read_noise_1f",
           "stuck_at", "realize", "gdc_factor", "ir_drop", "ir_drop_matrix", "adc_convert",
           "tile_state",
           "column_currents", "adc_errors"]

_TINY = 1e-12


def _ln(x):
    return np.log(np.maximum(x, _TINY))


def _poly(c, x):
    """``sum_i c[i] * x**i``."""
    return np.polynomial.polynomial.polyval(x, c)


@dataclass(frozen=True)
class DeviceModel:
    """Statistical model of one analog memory device (chips.md §2).

    Attributes:
        name: key in :data:`DEVICE_MODELS`.
        g_max_us: largest programmed conductance, uS.
        t0_s: drift reference time ``t0``, s.
        t_read_s: read duration entering the 1/f noise, s.
        kind: ``"pcm-joshi"``, ``"pcm-hermes"`` or ``"rram-wan"``: selects the fitted formulas.
        source: where the formulas and constants come from.
    """

    name: str
    g_max_us: float
    t0_s: float
    t_read_s: float
    kind: str
    source: str

    # -- programming noise
    def prog_sigma(self, x, t_s: float = 0.0) -> np.ndarray:
        """Standard deviation (uS) of the programmed conductance at normalized target ``x``
        (array) and, for RRAM, time ``t_s`` after programming."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "pcm-joshi":  # §2.1, referenced to 25 uS
            s = _poly((0.26348, 1.9650, -1.1731), x) * (self.g_max_us / 25.0)
        elif self.kind == "pcm-hermes":  # §2.2, 1 device, uS
            s = _poly((0.15782, 2.32444, -2.16311, 0.68842), x)
        else:  # rram-wan: §2.4 fits at 1 s, 1 day, 2 days; log-time interpolation (ours)
            s = self._rram_sigma(x, t_s)
        return np.maximum(s, 0.0)

    _RRAM_FITS = ((1.0, (0.348, 16.030, -43.853, 45.393, -16.815)),
                  (86400.0, (0.701, 22.086, -50.773, 47.095, -16.458)),
                  (172800.0, (0.782, 20.274, -43.507, 37.062, -11.934)))

    def _rram_sigma(self, x, t_s):
        ts = [t for t, _ in self._RRAM_FITS]
        sig = [_poly(c, x) for _, c in self._RRAM_FITS]
        t = min(max(t_s, ts[0]), ts[-1])
        for (t_a, s_a), (t_b, s_b) in zip(zip(ts, sig), zip(ts[1:], sig[1:])):
            if t <= t_b:
                f = (math.log(t) - math.log(t_a)) / (math.log(t_b) - math.log(t_a))
                return s_a + f * (s_b - s_a)
        return sig[-1]

    # -- drift
    @property
    def drifts(self) -> bool:
        return self.kind != "rram-wan"

    def nu_mean(self, x) -> np.ndarray:
        """Mean drift exponent at ``x`` (0 for a device without a drift law)."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "pcm-joshi":
            return np.clip(-0.0155 * _ln(x) + 0.0244, 0.049, 0.1)
        if self.kind == "pcm-hermes":
            return np.where(x < 0.0945, np.clip(-0.0387 * _ln(x) - 0.0182, 0.072, 0.13),
                            _poly((0.0736, -0.0126, -0.0436), x))
        return np.zeros_like(x)

    def nu_std(self, x) -> np.ndarray:
        """Device-to-device standard deviation of the drift exponent at ``x``."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "pcm-joshi":
            return np.clip(-0.0125 * _ln(x) - 0.0059, 0.008, 0.045)
        if self.kind == "pcm-hermes":
            return np.where(x < 0.3039, np.clip(-0.0120 * _ln(x) - 0.0023, 0.0124, 0.04),
                            _poly((0.0104, 0.0116, -0.0165), x))
        return np.zeros_like(x)

    # -- 1/f read noise
    def read_q(self, x) -> np.ndarray:
        """1/f noise amplitude ``Q_s`` at ``x`` (0: no 1/f data for the device)."""
        x = np.asarray(x, dtype=np.float64)
        if self.kind == "pcm-joshi":
            return np.minimum(0.0088 / np.maximum(x ** 0.65, 1e-3), 0.2)
        if self.kind == "pcm-hermes":
            return np.where(x < 0.1591, np.clip(-0.0078 * _ln(x) + 0.0038, 0.0179, 0.04),
                            _poly((0.0088, 0.0768, -0.1352, 0.0664), x))
        return np.zeros_like(x)


#: Device models by name (chips.md §2.1, §2.2, §2.4).
DEVICE_MODELS = {m.name: m for m in (
    DeviceModel("pcm-joshi2020", 25.0, 20.0, 250e-9, "pcm-joshi",
                "Nandakumar et al. ICECS 2019 / Joshi et al. Nat. Commun. 2020 via aihwkit "
                "PCMLikeNoiseModel (chips.md §2.1)"),
    DeviceModel("pcm-hermes-1dev", 10.35, 200.0, 512e-9, "pcm-hermes",
                "Le Gallo 2023 / Khaddam-Aljameh 2022 via aihwkit HermesNoiseModel, 1 device "
                "(chips.md §2.2)"),
    DeviceModel("rram-wan2022", 40.0, 1.0, 0.0, "rram-wan",
                "Wan et al. Nature 2022 via aihwkit ReRamWan2022NoiseModel (chips.md §2.4)"),
)}


# ------------------------------------------------------------------------- conductance effects


def program(g_t: np.ndarray, model: DeviceModel, rng: np.random.Generator, scale: float = 1.0,
            t_s: float = 0.0) -> np.ndarray:
    """Programmed conductances (uS): ``max(g_T + scale * sigma_prog(g_T / g_max) * z, 0)``.

    ``g_t``: target conductances, uS, any shape; ``t_s`` only matters for RRAM (its spread grows
    after programming, chips.md §2.4)."""
    g_t = np.asarray(g_t, dtype=np.float64)
    sigma = model.prog_sigma(g_t / model.g_max_us, t_s) * scale
    return np.maximum(g_t + sigma * rng.standard_normal(g_t.shape), 0.0)


def drift_exponents(x: np.ndarray, model: DeviceModel, rng: np.random.Generator,
                    scale: float = 1.0) -> np.ndarray:
    """Per-device drift exponents ``nu = scale * |N(mu_nu(x), sigma_nu(x))|`` (chips.md §2.1)."""
    x = np.asarray(x, dtype=np.float64)
    return scale * np.abs(model.nu_mean(x) + model.nu_std(x) * rng.standard_normal(x.shape))


def drift(g_prog: np.ndarray, nu: np.ndarray, t_s: float, model: DeviceModel) -> np.ndarray:
    """``g_prog * ((t + t0) / t0) ** (-nu)``: conductances ``t_s`` seconds after programming."""
    return g_prog * ((t_s + model.t0_s) / model.t0_s) ** (-np.asarray(nu))


def read_noise_1f(g: np.ndarray, x: np.ndarray, t_s: float, model: DeviceModel,
                  rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """1/f noise accumulated since programming (chips.md §2.1): ``max(g + N(0, g * Q_s(x) *
    sqrt(ln((t + t0 + t_read) / (2 t_read)))), 0)``; ``x`` the normalized *target* (aihwkit
    uses the programmed value; the difference is second order)."""
    q = model.read_q(x) * scale
    if model.t_read_s <= 0 or not np.any(q):
        return g
    t = t_s + model.t0_s
    f = math.sqrt(math.log((t + model.t_read_s) / (2 * model.t_read_s)))
    return np.maximum(g + g * q * f * rng.standard_normal(np.shape(g)), 0.0)


def stuck_at(shape, p0: float, p1: float, rng: np.random.Generator) -> np.ndarray:
    """Per-cell fault codes (int8): 0 healthy, 1 stuck at 0 (HRS), 2 stuck at ``g_max`` (LRS);
    one uniform draw per cell, ``u < p0`` -> 1, ``u >= 1 - p1`` -> 2 (MNSIM semantics, §2.5)."""
    u = rng.random(shape)
    code = np.zeros(shape, dtype=np.int8)
    code[u < p0] = 1
    code[u >= 1.0 - p1] = 2
    return code


def realize(g_t: np.ndarray, model: DeviceModel, rng: np.random.Generator, *, t_s: float = 0.0,
            prog_noise: float = 0.0, drift_scale: float = 0.0, read_noise: float = 0.0,
            stuck_at_0: float = 0.0, stuck_at_1: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The conductances (uS) of cells programmed to ``g_t`` (uS), ``t_s`` seconds later, and the
    same just after programming (the drift-compensation reference): ``(g_at_t, g_at_0)``.

    Each effect is off at scale / rate 0. The draws are made in a fixed order (programming
    noise, drift exponents, 1/f noise, faults), each only when its effect is on, so enabling one
    effect never changes the others' draws for a given seed.
    """
    g_t = np.asarray(g_t, dtype=np.float64)
    x = g_t / model.g_max_us
    g0 = program(g_t, model, rng, prog_noise, t_s) if prog_noise else g_t.copy()
    g = g0
    if drift_scale and model.drifts:
        g = drift(g0, drift_exponents(x, model, rng, drift_scale), t_s, model)
    if read_noise:
        g = read_noise_1f(g, x, t_s, model, rng, read_noise)
    if stuck_at_0 or stuck_at_1:
        code = stuck_at(g_t.shape, stuck_at_0, stuck_at_1, rng)
        for arr in (g0, g) if g is not g0 else (g0,):
            arr[code == 1] = 0.0
            arr[code == 2] = model.g_max_us
    return g, g0


def gdc_factor(w_ref: np.ndarray, w_now: np.ndarray) -> float:
    """Global drift compensation factor ``sum|w_ref| / sum|w_now|`` (1 if either sum is 0).

    ``w_ref``, ``w_now``: the tile's effective weights (any shape, any unit) as a calibration
    read returns them just after programming and at inference time: the output of each one-hot
    input row, i.e. ``G+ - G-`` of each pair with the bit slices recombined by significance.
    The ratio of the mean absolute readouts is aihwkit's ``GlobalDriftCompensation`` (chips.md
    §2.1). Summing raw conductances instead weighs a low-order slice as much as the high-order
    one that dominates the output, and counts both devices of a pair."""
    a, b = float(np.abs(w_ref).sum()), float(np.abs(w_now).sum())
    return a / b if a > 0 and b > 0 else 1.0


def _recombined(D: np.ndarray, slices: int, cell_bits: int) -> np.ndarray:
    """``[r, S * c]`` slice-major signed levels -> ``[r, c]`` weights in LSB units (shift-add)."""
    r, sc = D.shape
    shift = 2.0 ** (cell_bits * np.arange(slices))
    return np.einsum("rsc,s->rc", D.reshape(r, slices, sc // slices), shift)


# ------------------------------------------------------------------------- per-MVM effects


def ir_drop(x: np.ndarray, g_s: np.ndarray, r_row: float, r_col: float) -> np.ndarray:
    """Column currents of one array with first-order IR drop: ``[M, c]`` (units of ``x * g_s``).

    ``x``: ``[M, r]`` row voltages (any unit; the model is linear in them); ``g_s``: ``[r, c]``
    cell conductances in siemens; ``r_row``, ``r_col``: wire resistance per cell pitch, ohms.

    Assumptions (our first-order model; chips.md §2.6 describes the published ones):
    row ``i`` is driven at its column-0 end, column ``j`` is sensed at virtual ground below row
    ``r - 1``; cells are linear conductances with ideal access devices; every wire segment
    (driver -> column 0, column ``m - 1`` -> ``m``; row ``m`` -> ``m + 1``, row ``r - 1`` -> sense)
    has the same resistance. First order in ``r * g``: the wire currents are those of the ideal
    array, ``I_ij = g_ij x_i``, and each cell sees its row voltage lowered and its column
    voltage raised by the drops they cause:

    - ``dV_row(i, j) = r_row * sum_{m <= j} sum_{j' >= m} I_ij'``
    - ``dV_col(i, j) = r_col * sum_{m >= i} sum_{i' <= m} I_i'j``
    - ``y_j = sum_i g_ij * (x_i - dV_row(i, j) - dV_col(i, j))``.

    Exact to first order; it overestimates the drop when ``n * r * g`` nears 1 (the drops then
    reduce the currents that cause them). Worked 2 x 2 example in
    ``tests/test_crossbar_physics.py``. Linear in ``x``, so computed as ``x @``
    :func:`ir_drop_matrix` ``(g_s)``.
    """
    return np.asarray(x, dtype=np.float64) @ ir_drop_matrix(g_s, r_row, r_col)


def ir_drop_matrix(g_s: np.ndarray, r_row: float, r_col: float) -> np.ndarray:
    """The ``[r, c]`` matrix ``G'`` with ``ir_drop(x, g_s, r_row, r_col) == x @ G'`` for every
    ``x``: the model of :func:`ir_drop` folded into the array once (it is linear in the row
    voltages), so an MVM with IR drop costs one product, as without.

    With ``I_ij = g_ij x_i`` the two drops of :func:`ir_drop` are, summing the nested sums:
    ``dV_row(i, j) = r_row * x_i * A_ij``, ``A_ij = sum_{m <= j} sum_{j' >= m} g_ij'``; and
    ``dV_col(i, j) = r_col * sum_i' x_i' g_i'j (r - max(i, i'))`` (segment ``m`` below row ``m``
    carries row ``i'`` when ``m >= i'`` and lies below cell ``i`` when ``m >= i``). So
    ``y_j = sum_i x_i (g_ij - r_row g_ij A_ij - r_col g_ij B_ij)`` with
    ``B_ij = sum_i'' g_i''j (r - max(i, i''))``: ``G' = g - r_row g*A - r_col g*B``.
    ``g_s`` in siemens, ``r_row``, ``r_col`` in ohms; ``G'`` in siemens.
    """
    g = np.asarray(g_s, dtype=np.float64)
    if not (r_row or r_col):
        return g
    out = g.copy()
    if r_row:
        tail = np.flip(np.cumsum(np.flip(g, 1), axis=1), 1)  # sum_{j' >= m} g_ij'
        out -= r_row * g * np.cumsum(tail, axis=1)
    if r_col:
        n = g.shape[0]
        idx = np.arange(n)
        reach = n - np.maximum(idx[:, None], idx[None, :])  # r - max(i, i'')
        out -= r_col * g * (reach.astype(np.float64) @ g)
    return out


def adc_convert(u: np.ndarray, levels: int, offset: np.ndarray | float = 0.0,
                gain: np.ndarray | float = 0.0, inl: float = 0.0) -> tuple[np.ndarray, int]:
    """A signed ADC with ``2 * levels + 1`` codes ``-levels .. levels`` (chips.md §2.7).

    ``u``: the ideal input in LSB units (``[M, n]``); ``offset`` (LSB) and ``gain`` (relative
    error) per column (broadcast over ``n``); ``inl``: peak integral non-linearity in LSB, a
    parabolic bow ``inl * (1 - (u / levels)**2)``: zero at both ends of the range, largest at
    mid-scale (the endpoint-fit INL of a converter with a quadratic transfer error). Returns
    ``(codes, saturated count)``: ``clip(rint((1 + gain) * u + offset + bow), -levels, levels)``.
    """
    v = u
    if np.any(gain) or np.any(offset):
        v = u * (1.0 + np.asarray(gain)) + offset
    if inl:
        v = v + inl * (1.0 - np.minimum((u / levels) ** 2, 1.0))
    v = np.rint(v)
    clipped = int(np.count_nonzero(np.abs(v) > levels))
    return np.clip(v, -levels, levels), clipped


# ------------------------------------------------------------------------- simulator interface


def tile_state(planes: np.ndarray, sign: np.ndarray, mode, rng: np.random.Generator) -> dict:
    """The cells of one tile as programmed, in the simulator's level units.

    ``planes``: ``[r, S * c]`` float64 cell levels ``0 .. Lc`` (``Lc = 2**cell_bits - 1``), the
    ``S`` bit slices side by side; ``sign``: ``[r, S * c]`` the sign of each weight (a
    differential pair programs ``G+`` where it is positive, ``G-`` where negative); ``mode``: a
    :class:`.mode.CrossbarMode` with ``physical`` set. Levels map to target conductances
    ``l / Lc * g_max`` of ``mode.device`` and go through :func:`realize` at ``mode.time_s``.

    Returns ``{"D": [r, S*c] signed effective levels (G+ - G-, or the offset cell), "G2": summed
    squared levels (the per-read noise variance), "alpha": the drift-compensation factor (1 when
    off; :func:`gdc_factor` of the recombined weights just after programming and at
    ``mode.time_s``, read exactly: the calibration averages many reads), "ir": the ``[r, S*c]``
    signed sum over the arrays of each one's :func:`ir_drop_matrix` in siemens when IR drop
    is on (each array of a pair on its own wires), else None, "siemens_per_level":
    g_max / Lc in siemens}``.
    """
    model = DEVICE_MODELS[mode.device] if mode.device else None
    arrays = ([(1.0, planes * (sign > 0)), (-1.0, planes * (sign < 0))] if mode.differential
              else [(1.0, planes)])
    if model is None:  # ADC effects only: the ideal levels
        return {"D": planes * sign if mode.differential else planes, "G2": planes * planes,
                "alpha": 1.0, "ir": None, "siemens_per_level": 1.0}
    per_level = model.g_max_us / (2 ** mode.cell_bits - 1)  # uS per level
    D = np.zeros_like(planes)
    D0 = np.zeros_like(planes)  # as just after programming: the calibration reference
    G2 = np.zeros_like(planes)
    ir = [] if (mode.wire_ohm_row or mode.wire_ohm_col) else None
    for s, lv in arrays:
        g, g0 = realize(lv * per_level, model, rng, t_s=mode.time_s, prog_noise=mode.prog_noise,
                        drift_scale=mode.drift, read_noise=mode.read_noise_1f,
                        stuck_at_0=mode.stuck_at_0, stuck_at_1=mode.stuck_at_1)
        D += s * g / per_level
        D0 += s * g0 / per_level
        G2 += (g / per_level) ** 2
        if ir is not None:  # each array of a pair on its own wires, folded into one matrix
            ir.append(s * ir_drop_matrix(g * 1e-6, mode.wire_ohm_row, mode.wire_ohm_col))
    alpha = 1.0
    if mode.drift_compensation:
        alpha = gdc_factor(_recombined(D0, mode.slices, mode.cell_bits),
                           _recombined(D, mode.slices, mode.cell_bits))
    return {"D": D, "G2": G2, "alpha": alpha, "ir": None if ir is None else sum(ir),
            "siemens_per_level": per_level * 1e-6}


def column_currents(xl: np.ndarray, state: dict, mode) -> np.ndarray:
    """``[M, S*c]`` column currents in level units for DAC levels ``xl`` ``[M, r]``: ``xl @ D``,
    or with IR drop (:func:`ir_drop`) each array of a pair on its own wires."""
    if state["ir"] is None:
        return xl @ state["D"]
    return xl @ state["ir"] / state["siemens_per_level"]


def adc_errors(mode, crossbars: int, columns: int, rng: np.random.Generator):
    """Per-crossbar, per-column ADC ``(offset [P, columns] LSB, gain [P, columns])``, drawn once
    (zeros when the effect is off)."""
    shape = (crossbars, columns)
    offset = (rng.standard_normal(shape) * mode.adc_offset_lsb if mode.adc_offset_lsb
              else np.zeros(shape))
    gain = rng.standard_normal(shape) * mode.adc_gain_std if mode.adc_gain_std else np.zeros(shape)
    return offset, gain
