"""Statistical tests of the device-physics models against their specifications.

The expected values come from the published formulas as restated in the field notes
(``shared/field-notes/chips.md`` §2; the tables there were computed by hand), from the
folded-normal mean, from binomial counts, or from circuit analysis by hand / an exact nodal
solve; never from the code under test. Every statistical bound is stated as a multiple of the
sampling error, with the sample size chosen so a wrong model falls far outside it.
"""
import math

import numpy as np
import pytest

from onnx_cinm.sim.crossbar import physics
from onnx_cinm.sim.crossbar.physics import DEVICE_MODELS

JOSHI = DEVICE_MODELS["pcm-joshi2020"]
HERMES = DEVICE_MODELS["pcm-hermes-1dev"]
WAN = DEVICE_MODELS["rram-wan2022"]


# ---------------------------------------------------------------- programming noise

#: chips.md §2.1 table: sigma_prog (uS) at g_max = 25 uS for x = 0.2 .. 1.0 (rounded there;
#: the polynomial 0.26348 + 1.9650 x - 1.1731 x^2 gives 0.6096, 0.8616, 1.0194, 1.0830, 1.0554).
JOSHI_TABLE = {0.2: 0.6096, 0.4: 0.8616, 0.6: 1.0194, 0.8: 1.0830, 1.0: 1.0554}


@pytest.mark.parametrize("model, table", [
    (JOSHI, JOSHI_TABLE),
    # HERMES 1 device, chips.md §2.2 cubic 0.15782 + 2.32444 x - 2.16311 x^2 + 0.68842 x^3 (uS)
    (HERMES, {x: 0.15782 + 2.32444 * x - 2.16311 * x ** 2 + 0.68842 * x ** 3
              for x in (0.2, 0.4, 0.6, 0.8, 1.0)}),
])
def test_programming_noise_spread_at_five_conductances(model, table):
    n = 40000
    rng = np.random.default_rng(1)
    for x, sigma in table.items():
        g_t = np.full(n, x * model.g_max_us)
        g = physics.program(g_t, model, rng)
        # std of n Gaussian samples: standard error sigma / sqrt(2 (n - 1)); bound 4 SE (~1.4 %)
        se = sigma / math.sqrt(2 * (n - 1))
        assert abs(g.std(ddof=1) - sigma) < 4 * se, (x, g.std(ddof=1), sigma)
        assert abs(g.mean() - x * model.g_max_us) < 4 * sigma / math.sqrt(n)  # unbiased


def test_programming_noise_scales_with_g_max_and_clips_at_zero():
    # a 50 uS PCM-like device has twice the spread (chips.md §2.1: multiply by g_max / 25)
    big = physics.DeviceModel("pcm50", 50.0, 20.0, 250e-9, "pcm-joshi", "test")
    g = physics.program(np.full(40000, 25.0), big, np.random.default_rng(2))
    sigma = 2 * (0.26348 + 1.9650 * 0.5 - 1.1731 * 0.25)  # x = 0.5: 2 * 0.9527 uS
    assert abs(g.std(ddof=1) - sigma) < 4 * sigma / math.sqrt(2 * 39999)
    # target 0: sigma 0.26348 uS, clipped at >= 0 -> half the devices at exactly 0
    g0 = physics.program(np.zeros(40000), JOSHI, np.random.default_rng(3))
    assert g0.min() == 0.0
    assert abs(np.mean(g0 == 0) - 0.5) < 4 * 0.5 / math.sqrt(40000)


def test_rram_spread_grows_after_programming():
    # chips.md §2.4: at x = 0.31 sigma is ~2.30 uS at 1 s and ~4.0 uS at 1 day (peak near 0.39)
    x = 0.31
    s1 = sum(c * x ** i for i, c in enumerate((0.348, 16.030, -43.853, 45.393, -16.815)))
    s_day = sum(c * x ** i for i, c in enumerate((0.701, 22.086, -50.773, 47.095, -16.458)))
    assert WAN.prog_sigma(x, 1.0) == pytest.approx(s1)
    assert WAN.prog_sigma(x, 86400.0) == pytest.approx(s_day)
    assert s1 == pytest.approx(2.30, abs=0.01)
    # between the fitted times: linear in log t (1 s .. 1 day, geometric midpoint)
    assert WAN.prog_sigma(x, math.sqrt(86400.0)) == pytest.approx((s1 + s_day) / 2)
    assert not WAN.drifts and WAN.nu_mean(0.5) == 0


# ---------------------------------------------------------------- drift

def _folded_mean(mu, sigma):
    """E|N(mu, sigma)|."""
    return (sigma * math.sqrt(2 / math.pi) * math.exp(-mu * mu / (2 * sigma * sigma))
            + mu * math.erf(mu / (sigma * math.sqrt(2))))


@pytest.mark.parametrize("model, x, mu, sd", [
    # chips.md §2.1: mu = clip(-0.0155 ln x + 0.0244, 0.049, 0.1), sd = clip(-0.0125 ln x - 0.0059, 0.008, 0.045)
    (JOSHI, 0.5, 0.049, 0.008),
    (JOSHI, 0.1, -0.0155 * math.log(0.1) + 0.0244, -0.0125 * math.log(0.1) - 0.0059),
    (JOSHI, 0.01, 0.0155 * 4.60517 + 0.0244, 0.045),  # mu 0.0958; |.| folds ~1.7 % of draws
    # chips.md §2.2 (HERMES): x >= 0.0945: mu = -0.0436 x^2 - 0.0126 x + 0.0736;
    # x >= 0.3039: sd = -0.0165 x^2 + 0.0116 x + 0.0104
    (HERMES, 0.5, -0.0436 * 0.25 - 0.0126 * 0.5 + 0.0736, -0.0165 * 0.25 + 0.0116 * 0.5 + 0.0104),
])
def test_drift_exponent_recovered_from_loglog_fit(model, x, mu, sd):
    n = 20000
    rng = np.random.default_rng(4)
    g0 = np.full(n, x * model.g_max_us)
    nu = physics.drift_exponents(np.full(n, x), model, rng)
    times = np.array([1.0, 60.0, 3600.0, 86400.0, 3.15e7])
    logt = np.log((times + model.t0_s) / model.t0_s)
    logg = np.log(np.stack([physics.drift(g0, nu, t, model) for t in times]))  # [T, n]
    # least-squares slope per device of log g against log((t + t0) / t0)
    lt = logt - logt.mean()
    slope = (lt[:, None] * (logg - logg.mean(axis=0))).sum(axis=0) / (lt * lt).sum()
    fitted = -slope
    expect_mean = _folded_mean(mu, sd)
    assert abs(fitted.mean() - expect_mean) < 4 * sd / math.sqrt(n), (fitted.mean(), expect_mean)
    if mu / sd > 4:  # folding negligible: the spread is sd itself (SE of a std: sd / sqrt(2n))
        assert abs(fitted.std() - sd) < 4 * sd / math.sqrt(2 * n)
    # the intercept is log g0: the law is anchored at t = 0 (g(0) = g_prog)
    assert np.allclose(physics.drift(g0, nu, 0.0, model), g0)


def test_mean_conductance_decay_matches_the_table():
    # chips.md §2.1 table: ((t + t0) / t0)^-nu for nu = 0.05 at 1 h, 1 day, 1 year: 0.77, 0.66, 0.49
    for t, want in ((3600.0, 0.77), (86400.0, 0.66), (3.15e7, 0.49)):
        assert physics.drift(np.array([1.0]), 0.05, t, JOSHI)[0] == pytest.approx(want, abs=0.006)


def test_read_noise_1f_amplitude():
    # chips.md §2.1: sigma = g Q_s sqrt(ln((t + t0 + t_read) / (2 t_read))); at x = 1, Q_s = 0.0088,
    # and the sqrt-log factor at t = 1 s is 4.19 (t0 = 20 s, t_read = 250 ns)
    n = 40000
    g = np.full(n, 25.0)
    out = physics.read_noise_1f(g, np.ones(n), 1.0, JOSHI, np.random.default_rng(5))
    sigma = 25.0 * 0.0088 * 4.19
    assert abs(out.std() - sigma) < 4 * sigma / math.sqrt(2 * n) + 25 * 0.0088 * 0.005
    assert WAN.read_q(0.5) == 0  # no 1/f data for RRAM: unchanged
    same = physics.read_noise_1f(g, np.ones(n), 1.0, WAN, np.random.default_rng(5))
    assert np.array_equal(same, g)


# ---------------------------------------------------------------- stuck-at faults

def test_stuck_at_fractions():
    n = 1000 * 1000
    code = physics.stuck_at((1000, 1000), 0.0175, 0.0904, np.random.default_rng(6))
    for c, p in ((1, 0.0175), (2, 0.0904)):
        frac = np.count_nonzero(code == c) / n
        assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / n), (c, frac)
    # stuck cells take 0 / g_max whatever their target, at every time
    g_t = np.full((200, 200), 12.5)
    g, g0 = physics.realize(g_t, JOSHI, np.random.default_rng(7), t_s=86400.0, drift_scale=1.0,
                            stuck_at_0=0.1, stuck_at_1=0.1)
    lo, hi = (g == 0).mean(), (g == 25.0).mean()
    assert abs(lo - 0.1) < 4 * math.sqrt(0.09 / 40000) and abs(hi - 0.1) < 4 * math.sqrt(0.09 / 40000)
    assert np.array_equal(g == 0, g0 == 0) and np.array_equal(g == 25.0, g0 == 25.0)
    healthy = (g > 0) & (g < 25.0)
    assert np.all(g[healthy] < 12.5)  # the healthy ones drifted down


# ---------------------------------------------------------------- IR drop

def test_ir_drop_two_by_two_by_hand():
    # all four cells G, both inputs 1 V, wire a per cell along rows, b along columns.
    # Cell currents (zeroth order) all G. Row i: segment 0 carries 2G, segment 1 carries G:
    #   dV_row(i, 0) = 2aG, dV_row(i, 1) = 3aG.
    # Column j: the segment below row 0 carries G, below row 1 (to the sense) 2G:
    #   dV_col(0, j) = 3bG, dV_col(1, j) = 2bG.
    # y_0 = G(1 - 2aG - 3bG) + G(1 - 2aG - 2bG) = G(2 - 4aG - 5bG)
    # y_1 = G(1 - 3aG - 3bG) + G(1 - 3aG - 2bG) = G(2 - 6aG - 5bG)
    G, a, b = 1e-4, 100.0, 200.0  # aG = 0.01, bG = 0.02
    y = physics.ir_drop(np.ones((1, 2)), np.full((2, 2), G), a, b)[0]
    assert y / G == pytest.approx([2 - 0.04 - 0.10, 2 - 0.06 - 0.10], rel=1e-12)
    # linear in the input voltages, and no wires: the ideal product
    x = np.array([[0.3, -0.7]])
    g = np.array([[1e-4, 2e-5], [5e-5, 8e-5]])
    assert np.allclose(physics.ir_drop(2 * x, g, a, b), 2 * physics.ir_drop(x, g, a, b))
    assert np.allclose(physics.ir_drop(x, g, 0.0, 0.0), x @ g)


def test_ir_drop_matrix_is_the_nested_sums_of_the_model():
    """The folded matrix (one product per MVM) gives the currents of the model's nested sums
    (physics.ir_drop's docstring), evaluated here loop by loop on a 4 x 5 array."""
    rng = np.random.default_rng(3)
    r, c, a, b = 4, 5, 30.0, 70.0
    x = rng.standard_normal((2, r))
    g = rng.random((r, c)) * 1e-4
    want = np.zeros((2, c))
    for k in range(2):
        cur = x[k][:, None] * g  # I_ij
        for j in range(c):
            for i in range(r):
                dv_row = a * sum(cur[i, jj] for m in range(j + 1) for jj in range(m, c))
                dv_col = b * sum(cur[ii, j] for m in range(i, r) for ii in range(m + 1))
                want[k, j] += g[i, j] * (x[k, i] - dv_row - dv_col)
    np.testing.assert_allclose(x @ physics.ir_drop_matrix(g, a, b), want, rtol=1e-12)
    np.testing.assert_allclose(physics.ir_drop(x, g, a, b), want, rtol=1e-12)
    np.testing.assert_array_equal(physics.ir_drop_matrix(g, 0.0, 0.0), g)


def _exact_nodal(x, g, a, b):
    """Column currents from a full nodal solve of the same topology (drivers at column 0 of each
    row, sense at virtual ground below the last row)."""
    r, c = g.shape
    n = 2 * r * c
    row = lambda i, j: i * c + j  # noqa: E731
    col = lambda i, j: r * c + i * c + j  # noqa: E731
    A = np.zeros((n, n))
    rhs = np.zeros(n)

    def link(p, q, cond):
        A[p, p] += cond
        A[p, q] -= cond
        A[q, q] += cond
        A[q, p] -= cond

    for i in range(r):
        for j in range(c):
            link(row(i, j), col(i, j), g[i, j])
            if j == 0:  # driver -> first row node
                A[row(i, 0), row(i, 0)] += 1 / a
                rhs[row(i, 0)] += x[i] / a
            else:
                link(row(i, j - 1), row(i, j), 1 / a)
            if i == r - 1:  # last column node -> sense (0 V)
                A[col(i, j), col(i, j)] += 1 / b
            else:
                link(col(i, j), col(i + 1, j), 1 / b)
    v = np.linalg.solve(A, rhs)
    return np.array([v[col(r - 1, j)] / b for j in range(c)])


def test_ir_drop_first_order_matches_exact_circuit_to_second_order():
    rng = np.random.default_rng(8)
    g = rng.uniform(1e-6, 25e-6, (6, 5))
    x = rng.uniform(-1, 1, 6)
    for a, b in ((2.5, 7.6), (25.0, 76.0)):
        exact = _exact_nodal(x, g, a, b)
        ideal = x @ g
        first = physics.ir_drop(x[None], g, a, b)[0]
        # the first-order model captures the drop up to a residual of order (n r g)^2
        assert np.all(np.abs(first - exact) <= 0.05 * np.abs(ideal - exact) + 1e-18), (a, b)
    # at 10x the wire resistance the residual grows ~100x, i.e. quadratically
    small = np.abs(physics.ir_drop(x[None], g, 2.5, 7.6)[0] - _exact_nodal(x, g, 2.5, 7.6)).max()
    large = np.abs(physics.ir_drop(x[None], g, 25.0, 76.0)[0] - _exact_nodal(x, g, 25.0, 76.0)).max()
    assert 50 < large / small < 200


# ---------------------------------------------------------------- ADC

def test_adc_offset_gain_and_inl():
    u = np.array([[-127.0, -63.5, 0.0, 40.2, 127.0, 300.0]])
    codes, clipped = physics.adc_convert(u, 127)
    assert codes.tolist() == [[-127, -64, 0, 40, 127, 127]] and clipped == 1  # ideal: rint, clip
    # +2 LSB offset, +1 % gain: rint(1.01 u + 2)
    codes, _ = physics.adc_convert(np.array([[0.0, 60.0, -100.0]]), 127, offset=2.0, gain=0.01)
    assert codes.tolist() == [[2, 63, -99]]  # 62.6 -> 63, -99 exactly
    # 1 LSB INL bow: +1 at mid-scale, +0.75 at half-scale, 0 at the ends
    codes, _ = physics.adc_convert(np.array([[0.0, 63.5, 127.0, -127.0]]), 127, inl=1.0)
    assert codes.tolist() == [[1, 64, 127, -127]]
    assert physics.adc_convert(np.array([[63.4]]), 127, inl=1.0)[0][0, 0] == 64  # 63.4 + 0.7508


# ---------------------------------------------------------------- in the simulator

from onnx_cinm.devices.memristor import PCM_HERMES, PCM_OCC, RERAM_ISAAC  # noqa: E402
from onnx_cinm.devices.memristor.codegen import emit_kernel  # noqa: E402
from onnx_cinm.devices.memristor.nonideal import Q8, Q8_NOISY, compose  # noqa: E402
from onnx_cinm.devices.memristor.presets import resize  # noqa: E402
from onnx_cinm.paradigms.cim.schedule import plan  # noqa: E402
from onnx_cinm.sim.crossbar import CrossbarSimulator, XbarError, load_file  # noqa: E402
from onnx_cinm.sim.crossbar.mode import CrossbarMode  # noqa: E402

#: analog cells (one 7-bit magnitude per device), ideal DAC and ADC: only the device acts
ANALOG = dict(mode="quantized", weight_bits=8, cell_bits=7, dac_bits=0, adc_bits=0)
YEAR = 365.25 * 86400.0


def _run(tmp_path, W, X, mode, rows=None, cols=None):
    K, N = W.shape
    prm = PCM_OCC if rows is None else type(PCM_OCC)(rows=rows, cols=cols, crossbars=1)
    p = plan(len(X), K, N, prm, "weight_stationary")
    emit_kernel(p, prm, W, tmp_path, "k", mode=mode)
    out, _ = CrossbarSimulator(tmp_path / "k.xbar").run({"X": X})
    return out["Y"][0].astype(np.float64)


def test_todays_modes_are_named_combinations_with_their_numbers():
    assert Q8 == CrossbarMode("quantized", weight_bits=8, cell_bits=2, differential=True,
                              dac_bits=8, adc_bits=8)
    assert Q8_NOISY == CrossbarMode("quantized", weight_bits=8, cell_bits=2, differential=True,
                                    dac_bits=8, adc_bits=8, noise_sigma=0.02)
    assert not Q8.physical and not Q8_NOISY.physical
    assert [k for k, _ in Q8.header_items()][-1] == "seed"  # no device keys in a q8 header
    dev = compose("device", PCM_HERMES, 86400.0)
    assert (dev.weight_bits, dev.cell_bits, dev.dac_bits, dev.adc_bits) == (8, 7, 8, 8)
    assert dev.device == "pcm-hermes-1dev" and dev.time_s == 86400.0 and dev.drift_compensation
    assert compose("device", PCM_HERMES, 0.0, ["prog"]).drift == 0
    with pytest.raises(ValueError, match="unknown crossbar effect"):
        compose("device", PCM_HERMES, 0.0, ["warp"])
    with pytest.raises(ValueError, match="needs a chip"):
        compose("device")


def test_device_header_round_trip(tmp_path):
    mode = replace_mode = compose("device", PCM_HERMES, 3600.0, ["prog", "drift", "gdc", "adc"])
    W = np.ones((4, 3), np.float32)
    _run(tmp_path, W, np.ones((2, 4), np.float32), replace_mode)
    assert load_file(tmp_path / "k.xbar").mode == mode
    text = (tmp_path / "k.xbar").read_text()
    assert "time_s 3600.0\n" in text and "stuck_at_0" not in text  # only the effects that are on


@pytest.mark.parametrize("line, msg", [
    ("drift -1", "drift must be >= 0"),
    ("device pcm-unknown", "device must be one of"),
    ("prog_noise 1.0", "device must name a device model"),
    ("drift_compensation maybe", "must be on or off"),
    ("stuck_at_0 0.7\nstuck_at_1 0.6\ndevice pcm-joshi2020", "stuck_at_0 \\+ stuck_at_1"),
])
def test_bad_device_header_values_name_the_line(tmp_path, line, msg):
    W = np.ones((4, 3), np.float32)
    _run(tmp_path, W, np.ones((2, 4), np.float32), Q8)
    path = tmp_path / "k.xbar"
    path.write_text(path.read_text().replace("seed 0\n", f"seed 0\n{line}\n"))
    with pytest.raises(XbarError, match=rf"k\.xbar:\d+: .*{msg}"):
        load_file(path)


@pytest.mark.parametrize("t", [3600.0, 86400.0, 3.15e7])
def test_drift_in_the_simulator_follows_the_power_law(tmp_path, t):
    # every weight +1 (the G+ cell of each pair at level Lc, x = 1; G- at 0, which stays 0), all
    # inputs 1: output j / 256 is the mean of 256 factors ((t + t0)/t0)^-nu, nu ~ N(0.049, 0.008)
    # at x = 1, t0 = 20 s (chips.md §2.1), whose mean is exp(-mu L + sd^2 L^2 / 2),
    # L = ln((t + t0)/t0). The mean over all 65,536 cells has relative SE ~ sd L / 256
    # (<= 4.5e-4 for L <= 14.3): bound 4 SE.
    W = np.ones((256, 256), np.float32)
    mode = CrossbarMode(**ANALOG, device="pcm-joshi2020", drift=1.0, time_s=t)
    y = _run(tmp_path, W, np.ones((1, 256), np.float32), mode, rows=256, cols=256)
    L = math.log((t + 20.0) / 20.0)
    want = math.exp(-0.049 * L + 0.008 ** 2 * L * L / 2)
    assert abs(y.mean() / 256 / want - 1) < 4 * 0.008 * L / 256, (y.mean() / 256, want)


@pytest.mark.parametrize("t", [86400.0, 3.15e7])
def test_global_drift_compensation_recovers_the_scale(tmp_path, t):
    # mixed-sign weights, random inputs: without compensation the outputs shrink by ~0.66 (1 day)
    # and ~0.50 (1 year) (the factors above); with it the least-squares gain is 1 up to the
    # spread of nu: relative sd ~ 0.008 L / sqrt(n_eff) with n_eff >= 2000 effective cells
    # (<= 0.0026): bound 0.01.
    rng = np.random.default_rng(9)
    W = np.where(rng.random((256, 256)) < 0.5, -1.0, 1.0).astype(np.float32)
    X = rng.random((64, 256)).astype(np.float32)
    ref = X.astype(np.float64) @ W
    gain = {}
    for gdc in (False, True):
        mode = CrossbarMode(**ANALOG, device="pcm-joshi2020", drift=1.0, time_s=t,
                            drift_compensation=gdc)
        y = _run(tmp_path, W, X, mode, rows=256, cols=256)
        gain[gdc] = (y * ref).sum() / (ref * ref).sum()
    assert abs(gain[True] - 1) < 0.01 and gain[False] < 0.7, gain


def test_gdc_factor_is_the_ratio_of_mean_absolute_readouts():
    # aihwkit GlobalDriftCompensation (chips.md §2.1): one-hot reads, mean |output| at
    # programming over mean |output| now; signed weights count by magnitude
    assert physics.gdc_factor(np.array([[2.0, -2.0]]), np.array([[1.0, -0.5]])) == 4.0 / 1.5
    assert physics.gdc_factor(np.zeros(3), np.ones(3)) == 1.0


def test_gdc_weighs_bit_slices_by_significance(tmp_path):
    # Regression (issue 15): the calibration read must see the weight the output sees, slices
    # recombined by significance. 8-bit weights on 4-bit HERMES cells: every weight +1 is
    # q = 127 = 7 * 16 + 15, slice 0 at level 15 (x = 1) and slice 1 at level 7 (x = 7/15).
    # chips.md §2.2 at 1 year (L = ln((t + 200 s) / 200 s) = 11.97): x = 1 has mu_nu 0.0174,
    # sd 0.0055 -> E f0 = exp(-mu L + sd^2 L^2 / 2) = 0.814; x = 7/15 has mu_nu 0.0582, sd
    # 0.0122 -> E f1 = 0.504. The output is 15 f0 + 112 f1 per cell pair: a factor from the
    # significance-weighted readout, 127 / (15 E f0 + 112 E f1), restores it (gain 1 up to the
    # nu spread over 65,536 cells, < 0.002); the old unweighted conductance sum gave
    # 22 / (15 E f0 + 7 E f1), a gain of (15 E f0 + 112 E f1) * 22 / (127 (15 E f0 + 7 E f1))
    # = 0.755.
    rng = np.random.default_rng(4)
    W = np.ones((256, 256), np.float32)
    X = rng.random((64, 256)).astype(np.float32)
    ref = X.astype(np.float64) @ W
    mode = CrossbarMode(**{**ANALOG, "cell_bits": 4}, device="pcm-hermes-1dev", drift=1.0,
                        time_s=YEAR, drift_compensation=True)
    y = _run(tmp_path, W, X, mode, rows=256, cols=256)
    gain = (y * ref).sum() / (ref * ref).sum()
    assert abs(gain - 1) < 0.01, gain


def _hermes_nu(x):
    """chips.md §2.2, restated: (mu_nu, sigma_nu) of the 1-device HERMES model at ``x``."""
    x = np.asarray(x, np.float64)
    lx = np.log(x)
    mu = np.where(x < 0.0945, np.clip(-0.0387 * lx - 0.0182, 0.072, 0.13),
                  -0.0436 * x * x - 0.0126 * x + 0.0736)
    sd = np.where(x < 0.3039, np.clip(-0.0120 * lx - 0.0023, 0.0124, 0.04),
                  -0.0165 * x * x + 0.0116 * x + 0.0104)
    return mu, sd


@pytest.mark.parametrize("small, want_none, want_gdc", [
    (None, 0.194, 0.066),         # one state: compensation leaves only the spread of nu
    (32 / 127, 0.232, 0.154),     # two states: a mismatch no single factor removes
])
def test_gdc_error_with_state_dependent_drift_follows_the_derivation(tmp_path, small, want_none,
                                                                     want_gdc):
    # Derivation (docs/crossbar-presets.md, "Drift and its compensation"): after drift each
    # weight w is w f, f = ((t + t0) / t0)^-nu with nu ~ N(mu(x), sd(x)) per device, so
    # E f = exp(-mu L + sd^2 L^2 / 2), E f^2 = exp(-2 mu L + 2 sd^2 L^2). With zero-mean iid
    # inputs the relative RMS output error of a tile scaled by a is
    #   R(a)^2 = sum w^2 (a^2 E f^2 - 2 a E f + 1) / sum w^2,
    # and global compensation picks a = sum |w| / sum |w| E f. One state (all |w| = 1, x = 1):
    # R(a)^2 = E f^2 / (E f)^2 - 1 = exp(sd^2 L^2) - 1, the spread alone (0.066 at 1 year), vs
    # 0.194 uncompensated. Two states (|w| = 1 and 32/127, half each), HERMES at 1 year:
    # E f = 0.814 and 0.452, a = 1.35, R = 0.154 compensated vs 0.232 uncompensated: a factor
    # 1.5, not the 2.9 of the one-state case, and above the best single factor's 0.128. Each R
    # is estimated from 65,536 outputs and 65,536 devices (relative SE < 1 %): bound 4 %.
    rng = np.random.default_rng(12)
    mag = np.ones((256, 256))
    if small is not None:
        mag[rng.random(mag.shape) < 0.5] = small
        mag[0] = 1.0  # every column's largest weight maps to g_max
    W = (mag * np.where(rng.random(mag.shape) < 0.5, -1.0, 1.0)).astype(np.float32)
    X = rng.standard_normal((256, 256)).astype(np.float32)
    ref = X.astype(np.float64) @ W
    mu, sd = _hermes_nu(mag)
    L = math.log((YEAR + 200.0) / 200.0)
    ef, ef2 = np.exp(-mu * L + sd * sd * L * L / 2), np.exp(-2 * mu * L + 2 * sd * sd * L * L)
    a = mag.sum() / (mag * ef).sum()
    w2 = mag * mag

    def predicted(a):
        return math.sqrt((w2 * (a * a * ef2 - 2 * a * ef + 1)).sum() / w2.sum())

    assert predicted(1.0) == pytest.approx(want_none, abs=0.001)
    assert predicted(a) == pytest.approx(want_gdc, abs=0.001)
    for gdc, want in ((False, predicted(1.0)), (True, predicted(a))):
        mode = CrossbarMode(**ANALOG, device="pcm-hermes-1dev", drift=1.0, time_s=YEAR,
                            drift_compensation=gdc)
        y = _run(tmp_path, W, X, mode, rows=256, cols=256)
        got = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert got == pytest.approx(want, rel=0.04), (gdc, got, want)


def test_stuck_cells_in_the_simulator(tmp_path):
    # all weights +1: G+ at g_max, G- at 0. G+ stuck at 0 w.p. 0.1 (stuck at g_max changes
    # nothing), G- stuck at g_max w.p. 0.05: mean effective weight 1 - 0.1 - 0.05 = 0.85;
    # with all-ones inputs each output sums 256 pairs (per-pair variance <= 0.14): the mean over
    # 256 outputs has SE <= sqrt(0.14 / 65536) = 0.0015, bound 4 SE = 0.006
    W = np.ones((256, 256), np.float32)
    X = np.ones((1, 256), np.float32)
    mode = CrossbarMode(**ANALOG, device="pcm-joshi2020", stuck_at_0=0.1, stuck_at_1=0.05)
    y = _run(tmp_path, W, X, mode, rows=256, cols=256)
    assert abs(y.mean() / 256 - 0.85) < 0.006


def test_device_default_sticks_no_cell_and_named_stuck_sticks_its_rate(tmp_path):
    # W all +1 on pcm-hermes (one 7-bit slice per weight, differential): G+ at g_max, G- at 0;
    # one-hot inputs read every weight back (Y = W). With the device mode's default effects
    # but the noisy ones off (programming noise, drift, 1/f noise, IR drop) and an ideal ADC,
    # every weight must read 1: a cell stuck at 0 (G+) or at g_max (G-) would read 0.
    from dataclasses import replace

    W = np.ones((256, 256), np.float32)
    X = np.eye(256, dtype=np.float32)
    quiet = dict(prog_noise=0.0, drift=0.0, read_noise_1f=0.0, wire_ohm_row=0.0,
                 wire_ohm_col=0.0, adc_bits=0)
    default = replace(compose("device", PCM_HERMES), **quiet)
    y = _run(tmp_path, W, X, default, rows=256, cols=256)
    assert np.count_nonzero(np.abs(y - 1.0) > 0.5) == 0
    np.testing.assert_allclose(y, 1.0, rtol=1e-5)
    # named, the stuck effect is MNSIM's 0.1 % at 0 and 0.1 % at g_max per device: a weight
    # reads wrong when its G+ sticks at 0 or its G- at g_max, p = 1 - (1 - 1e-3)^2 per weight
    # (independent draws); 65536 weights: n p = 131, binomial SD 11.4, bound 4 SD
    named = replace(compose("device", PCM_HERMES, 0.0, ["stuck"]), adc_bits=0)
    y = _run(tmp_path, W, X, named, rows=256, cols=256)
    n, p = W.size, 1 - (1 - 1e-3) ** 2
    bad = np.count_nonzero(np.abs(y - 1.0) > 0.5)
    assert abs(bad - n * p) < 4 * math.sqrt(n * p * (1 - p)), bad


def test_ir_drop_in_the_simulator_by_hand(tmp_path):
    # a 2 x 2 tile of weights 1 on pcm-joshi cells (G = g_max = 25 uS), inputs 1: see
    # test_ir_drop_two_by_two_by_hand, y_0 = 2 - 4aG - 5bG, y_1 = 2 - 6aG - 5bG (times the unit
    # weight); a = 100 ohm, b = 200 ohm: aG = 0.0025, bG = 0.005 -> [1.965, 1.96]
    mode = CrossbarMode(**ANALOG, device="pcm-joshi2020", wire_ohm_row=100.0, wire_ohm_col=200.0)
    y = _run(tmp_path, np.ones((2, 2), np.float32), np.ones((1, 2), np.float32), mode, 2, 2)
    assert y[0] == pytest.approx([1.965, 1.96], rel=1e-6)


def test_device_effects_are_seeded(tmp_path):
    rng = np.random.default_rng(10)
    W = rng.standard_normal((64, 32)).astype(np.float32)
    X = rng.standard_normal((8, 64)).astype(np.float32)
    mode = compose("device", PCM_HERMES, 86400.0)
    a = _run(tmp_path, W, X, mode)
    b = _run(tmp_path, W, X, mode)
    from dataclasses import replace

    c = _run(tmp_path, W, X, replace(mode, seed=1))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_kernels_over_the_same_weights_draw_their_tiles_once(tmp_path, monkeypatch):
    """Kernels over the same weights (an unrolled recurrence's steps) seed their device effects
    alike, so each drew the same conductances: the draws are made once and shared, and every
    output is what drawing apart gives. 200 x 40 weights on 128 x 32 crossbars: 2 x 2 tiles,
    so 4 draws (a hand count) for any number of such kernels; another seed draws its own."""
    from dataclasses import replace

    from onnx_cinm.sim.crossbar import simulator

    rng = np.random.default_rng(12)
    W = rng.standard_normal((200, 40)).astype(np.float32)
    X = rng.standard_normal((3, 200)).astype(np.float32)
    mode = compose("device", PCM_HERMES, 86400.0)
    prm = type(PCM_OCC)(rows=128, cols=32, crossbars=4)
    p = plan(len(X), 200, 40, prm, "weight_stationary")
    for name, m in (("a", mode), ("b", mode), ("c", replace(mode, seed=1))):
        emit_kernel(p, prm, W, tmp_path, name, mode=m)
    draws = []
    real = physics.tile_state
    monkeypatch.setattr(physics, "tile_state", lambda *a: draws.append(1) or real(*a))
    sims = [CrossbarSimulator(tmp_path / f"{k}.xbar") for k in "ab"]
    ya, yb = (s.run({"X": X})[0]["Y"] for s in sims)
    assert len(draws) == 4 and np.array_equal(ya, yb)
    CrossbarSimulator(tmp_path / "c.xbar").run({"X": X})
    assert len(draws) == 8

    class Unkept(dict):  # nothing is shared: each simulator draws its own tiles
        def __setitem__(self, key, value):
            pass

    monkeypatch.setattr(simulator, "_PROGRAMMED", Unkept())
    apart = CrossbarSimulator(tmp_path / "b.xbar").run({"X": X})[0]["Y"]
    assert len(draws) == 12 and np.array_equal(apart, yb)


def test_simulators_given_one_weight_array_quantize_it_once(tmp_path):
    """Simulators of kernels given one weight array and one ``checked`` dict (a session's:
    the steps of an unrolled recurrence) hold one copy of its quantized levels, read-only,
    and compute what a simulator of their own computes."""
    rng = np.random.default_rng(13)
    W = rng.standard_normal((200, 40)).astype(np.float32)
    X = rng.standard_normal((3, 200)).astype(np.float32)
    prm = type(PCM_OCC)(rows=128, cols=32, crossbars=4)
    emit_kernel(plan(len(X), 200, 40, prm, "weight_stationary"), prm, W, tmp_path, "k",
                mode=compose("device", PCM_HERMES, 86400.0))
    shared: dict = {}
    W3 = W[None]
    a, b = (CrossbarSimulator(tmp_path / "k.xbar", {"W": W3}, checked=shared) for _ in "ab")
    assert a._q["W"] is b._q["W"] and not a._q["W"].flags.writeable
    alone = CrossbarSimulator(tmp_path / "k.xbar", {"W": W3})
    assert alone._q["W"] is not a._q["W"]
    ya, yb, y1 = (s.run({"X": X})[0]["Y"] for s in (a, b, alone))
    assert np.array_equal(ya, y1) and np.array_equal(yb, y1)


def test_cli_device_mode_and_preset_costs_reach_the_kernels(tmp_path):
    from onnx_cinm.cli import main

    out = tmp_path / "m.onnx"
    assert main(["optimize", "--example", "mlp", "--cim-preset", "reram-isaac", "--cim-size",
                 "64x64", "--cim-mode", "device", "--cim-time", "1d", "--cim-effects",
                 "prog,drift", "-o", str(out), "-q"]) == 0
    texts = [p.read_text() for p in (tmp_path / "m.cinm" / "memristor").glob("*.xbar")]
    assert texts
    for text in texts:
        # the preset's own costs (regression: the kernels carried pcm-occ's whatever the preset),
        # scaled to 64x64: one ADC converting 64 columns, not 128, of its 100 ns MVM
        assert f"cost mvm_latency_s {resize(RERAM_ISAAC, 64, 64).mvm_latency_s!r}\n" in text
        assert resize(RERAM_ISAAC, 64, 64).mvm_latency_s == pytest.approx(50e-9)
        assert "device rram-wan2022\n" in text and "time_s 86400.0\n" in text
        assert "weight_bits 16\n" in text and "drift_compensation" not in text
