"""Non-ideal crossbar mode: expected numbers are computed here with numpy (or by hand), from the
definitions in ``onnx_cinm/sim/crossbar/mode.py``, never taken from the simulator."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import numpy_helper

from onnx_cinm.devices.memristor import PCM_OCC
from onnx_cinm.devices.memristor.codegen import emit_kernel, render
from onnx_cinm.devices.memristor.nonideal import Q8, preset
from onnx_cinm.paradigms.cim.schedule import plan
from onnx_cinm.sim.crossbar import CrossbarSimulator, XbarError, parse
from onnx_cinm.sim.crossbar.mode import IDEAL, CrossbarMode

F64 = np.float64


# ------------------------------------------------------------------ independent references


def ref_weights(W, bits):
    """Per-output-channel symmetric quantization: (integers q, scales s), W ~ q * s."""
    L = 2 ** (bits - 1) - 1
    s = np.abs(W.astype(F64)).max(axis=0) / L
    s[s == 0] = 1.0
    return np.clip(np.rint(W.astype(F64) / s), -L, L), s


def ref_inputs(Xk, dac_bits):
    """Per-vector DAC: (levels, scale per row) with Xk ~ levels * scale."""
    sx = np.abs(Xk.astype(F64)).max(axis=1, keepdims=True)
    sx[sx == 0] = 1.0
    if dac_bits == 0:
        return Xk / sx, sx
    L = 2 ** (dac_bits - 1) - 1
    return np.rint(Xk / sx * L), sx / L


def ref_exact(X, W, rows, wbits, dac_bits):
    """Quantized product with ideal ADC and no noise: sum over k tiles of (xl @ q) * sx * sw."""
    q, sw = ref_weights(W, wbits)
    Y = np.zeros((X.shape[0], W.shape[1]))
    for k0 in range(0, W.shape[0], rows):
        xl, sx = ref_inputs(X[:, k0:k0 + rows], dac_bits)
        Y += (xl @ q[k0:k0 + rows]) * sx
    return Y * sw


def ref_sliced(X, W, rows, cols, m: CrossbarMode):
    """The slice-by-slice model, written with explicit loops over tiles, slices and columns:
    column currents of every slice, ADC with F = adc_range * Lx * sum|levels|, shift-add."""
    q, sw = ref_weights(W, m.weight_bits)
    Lw = 2 ** (m.weight_bits - 1) - 1
    Lx = 2 ** (m.dac_bits - 1) - 1 if m.dac_bits else 1
    La = 2 ** (m.adc_bits - 1) - 1
    nbits = m.weight_bits - 1 if m.differential else m.weight_bits
    S = -(-nbits // m.cell_bits)
    Y = np.zeros((X.shape[0], W.shape[1]))
    clipped = 0
    for k0 in range(0, W.shape[0], rows):
        xl, sx = ref_inputs(X[:, k0:k0 + rows], m.dac_bits)
        for n0 in range(0, W.shape[1], cols):
            qt = q[k0:k0 + rows, n0:n0 + cols]
            stored = np.abs(qt) if m.differential else qt + Lw
            for j in range(qt.shape[1]):
                acc = np.zeros(X.shape[0])
                for s in range(S):
                    level = np.floor(stored[:, j] / 2 ** (s * m.cell_bits)) % 2 ** m.cell_bits
                    signed = level * np.sign(qt[:, j]) if m.differential else level
                    current = xl @ signed
                    F = m.adc_range * Lx * np.abs(signed).sum()
                    if F > 0:
                        code = np.rint(current / (F / La))
                        clipped += int((np.abs(code) > La).sum())
                        current = np.clip(code, -La, La) * (F / La)
                    acc += current * 2 ** (s * m.cell_bits)
                if not m.differential:
                    acc -= Lw * xl.sum(axis=1)
                Y[:, n0 + j] += acc * sx[:, 0]
    return Y * sw, clipped


def _emit(tmp_path, X, W, mode, P=4, order="weight_stationary", m_block=1, name="k"):
    prm = replace(PCM_OCC, crossbars=P)
    pl = plan(X.shape[0], W.shape[0], W.shape[1], prm, order, m_block=m_block)
    paths = emit_kernel(pl, prm, W, tmp_path, name, mode=mode)
    return pl, paths


def _data(M, K, N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((M, K)).astype(np.float32)
    W = rng.standard_normal((K, N)).astype(np.float32)
    W[:, 3] = 0.0  # an all-zero output channel (scale 1, no current)
    X[2] = 0.0     # an all-zero input vector
    return X, W


# ------------------------------------------------------------------------------ the mode


def test_mode_validation_and_derived_counts():
    assert IDEAL.ideal and IDEAL.slices == 1 and IDEAL.cells_per_weight == 1
    assert preset("q8") == Q8 and (Q8.weight_bits, Q8.adc_bits, Q8.mode) == (8, 8, "quantized")
    # int8 on 2-bit cells: 7 magnitude bits -> 4 slices, 8 cells with pairs; offset: 8 bits, 4
    assert (Q8.slices, Q8.cells_per_weight) == (4, 8)
    offset = replace(Q8, differential=False)
    assert (offset.slices, offset.cells_per_weight) == (4, 4)
    assert replace(Q8, cell_bits=3).slices == 3 and replace(Q8, cell_bits=1).slices == 7
    assert replace(Q8, cell_bits=8).slices == 1
    bad = [dict(mode="noisy"), dict(mode="quantized", weight_bits=1),
           dict(mode="quantized", weight_bits=17), dict(mode="quantized", cell_bits=9),
           dict(mode="quantized", cell_bits=0), dict(mode="quantized", adc_bits=1),
           dict(mode="quantized", dac_bits=-1), dict(mode="quantized", adc_range=0.0),
           dict(mode="quantized", adc_range=1.5), dict(mode="quantized", noise_sigma=-0.1),
           dict(mode="quantized", noise_sigma=float("nan")), dict(mode="quantized", seed=-1),
           dict(mode="quantized", differential=1), dict(mode="quantized", weight_bits=8.0),
           dict(weight_bits=4), dict(noise_sigma=0.01)]
    for kw in bad:
        with pytest.raises(ValueError) as e:
            CrossbarMode(**kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown crossbar mode"):
        preset("q7")


def test_header_lines_round_trip(tmp_path):
    X, W = _data(5, 100, 70)
    m = CrossbarMode("quantized", weight_bits=6, cell_bits=3, differential=False, dac_bits=5,
                     adc_bits=7, adc_range=0.5, noise_sigma=0.01, seed=7)
    pl, paths = _emit(tmp_path, X, W, m)
    text = paths[0].read_text()
    for line in ("mode quantized", "weight_bits 6", "cell_bits 3", "differential off",
                 "dac_bits 5", "adc_bits 7", "adc_range 0.5", "noise_sigma 0.01", "seed 7"):
        assert f"\n{line}\n" in text
    assert parse(text, "k.xbar").mode == m
    # ideal (None or IDEAL) writes only 'mode ideal', as before the modes existed
    t0 = render(pl, PCM_OCC, "k", "k.W.npy")
    assert t0 == render(pl, PCM_OCC, "k", "k.W.npy", mode=IDEAL)
    assert "\nmode ideal\n" in t0 and "weight_bits" not in t0 and "seed" not in t0
    assert parse(t0).mode == IDEAL


# ------------------------------------------------------------------------------ data path


@pytest.mark.parametrize("differential", [True, False])
@pytest.mark.parametrize("wbits,cbits,dac", [(8, 2, 8), (8, 1, 0), (5, 3, 6), (8, 8, 8), (4, 2, 0)])
def test_slices_and_pairs_recombine_exactly(tmp_path, differential, wbits, cbits, dac):
    X, W = _data(9, 150, 70)  # Kt = 3 (last tile 22 rows), Nt = 2 (last 6 columns)
    m = CrossbarMode("quantized", weight_bits=wbits, cell_bits=cbits, differential=differential,
                     dac_bits=dac, adc_bits=0)
    pl, paths = _emit(tmp_path, X, W, m)
    out, c = CrossbarSimulator(paths[0]).run({"X": X})
    ref = ref_exact(X, W, 64, wbits, dac)
    np.testing.assert_allclose(out["Y"][0], ref, rtol=2e-6, atol=1e-6 * np.abs(ref).max())
    assert c.adc_clipped == 0


@pytest.mark.parametrize("m", [
    Q8,
    CrossbarMode("quantized", weight_bits=8, cell_bits=2, dac_bits=6, adc_bits=5, adc_range=0.3),
    CrossbarMode("quantized", weight_bits=6, cell_bits=4, differential=False, dac_bits=0,
                 adc_bits=6, adc_range=0.25),
])
def test_adc_matches_slice_by_slice_reference(tmp_path, m):
    X, W = _data(6, 100, 70, seed=1)
    X = np.abs(X)  # non-negative, like activations after a ReLU
    pl, paths = _emit(tmp_path, X, W, m)
    out, c = CrossbarSimulator(paths[0]).run({"X": X})
    ref, clipped = ref_sliced(X, W, 64, 64, m)
    np.testing.assert_allclose(out["Y"][0], ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    assert c.adc_clipped == clipped
    if m.adc_range < 1:
        assert clipped > 0
    # the ADC changes the numbers (vs the ideal-ADC product) but only by a little at these bits
    exact = ref_exact(X, W, 64, m.weight_bits, m.dac_bits)
    assert not np.allclose(out["Y"][0], exact, rtol=1e-7, atol=0)


XBAR_Q = """XBAR 1
crossbars 1
rows 2
cols 1
dtype float32
mode quantized
weight_bits 3
cell_bits 2
differential on
dac_bits 0
adc_bits 3
adc_range {r}
noise_sigma 0
seed 0
input X 1 2
weight W 1 2 1 w.npy
output Y 1 1
RUN
PROGRAM 0 W 0 0 0
MVM 0 X 0 0
ACC Y 0 0 0
BARRIER
END
"""


def test_adc_by_hand_and_clipping(tmp_path):
    # W = [1, -0.5]: Lw = 3, scale 1/3, q = [3, rint(-1.5) = -2]; one slice (2 magnitude bits).
    np.save(tmp_path / "w.npy", np.array([[[1.0], [-0.5]]], np.float32))
    X = np.array([[1.0, 1.0], [1.0, 0.0], [2.0, 2.0]], np.float32)
    # adc_range 1: F = 1 * (3 + 2) = 5, 3 bits: La = 3, step 5/3.
    # row 0: x/sx = [1, 1], current 3 - 2 = 1, code rint(0.6) = 1 -> 5/3, y = 5/3 * 1 * 1/3
    # row 1: current 3, code rint(1.8) = 2 -> 10/3, y = 10/9; row 2: as row 0 times sx = 2
    (tmp_path / "k.xbar").write_text(XBAR_Q.format(r=1))
    out, c = CrossbarSimulator(tmp_path / "k.xbar").run({"X": X})
    np.testing.assert_allclose(out["Y"][0, :, 0], [5 / 9, 10 / 9, 10 / 9], rtol=1e-6)
    assert (c.adc_clipped, c.adc_conversions, c.cell_writes, c.dac_conversions) == (0, 3, 4, 6)
    # adc_range 0.25: F = 1.25, step 1.25/3; row 0: code rint(2.4) = 2 -> 2.5/3, y = 2.5/9;
    # row 1: current 3, code rint(7.2) = 7 > 3: saturates at 3 -> 1.25, y = 1.25/3
    (tmp_path / "k.xbar").write_text(XBAR_Q.format(r=0.25))
    out, c = CrossbarSimulator(tmp_path / "k.xbar").run({"X": X})
    np.testing.assert_allclose(out["Y"][0, :, 0], [2.5 / 9, 1.25 / 3, 5 / 9], rtol=1e-6)
    assert c.adc_clipped == 1


def test_adc_calibrated_on_the_first_inference_by_hand(tmp_path):
    # q = [3, -2] as above; adc_calibration data: the first run's currents (x/sx @ q) are
    # [1, 3, 1], so F = 3 and, La = 3, the step is 1: every code exact, y = I * sx / 3
    np.save(tmp_path / "w.npy", np.array([[[1.0], [-0.5]]], np.float32))
    (tmp_path / "k.xbar").write_text(XBAR_Q.format(r=1).replace("seed 0", "seed 0\n"
                                                                "adc_calibration data"))
    sim = CrossbarSimulator(tmp_path / "k.xbar")
    X = np.array([[1.0, 1.0], [1.0, 0.0], [2.0, 2.0]], np.float32)
    out, c = sim.run({"X": X})
    np.testing.assert_allclose(out["Y"][0, :, 0], [1 / 3, 1, 2 / 3], rtol=1e-6)
    # the range stays the calibrated one: x = [1, -1] makes current 3 + 2 = 5 > F = 3, so it
    # saturates at code 3 (y = 1) where the full-scale rule (F = 5) would have held it
    out, c = sim.run({"X": np.array([[1.0, -1.0]], np.float32)})
    np.testing.assert_allclose(out["Y"][0, :, 0], [1.0], rtol=1e-6)
    assert c.adc_clipped == 1
    # the named modes keep the full-scale rule (no header key); the run option calibrates
    from onnx_cinm.devices.memristor import PCM_HERMES
    from onnx_cinm.devices.memristor.nonideal import compose
    dev = compose("device", PCM_HERMES, effects=())
    assert (dev.adc_calibration, Q8.adc_calibration) == ("max", "max")
    assert "adc_calibration" not in dict(dev.header_items())
    cal = compose("device", PCM_HERMES, effects=(), adc_calibration="data")
    assert ("adc_calibration", "data") in cal.header_items()
    with pytest.raises(ValueError, match="mode 'ideal' has no ADC calibration"):
        compose("ideal", adc_calibration="data")
    with pytest.raises(XbarError, match="adc_calibration must be one of max, data"):
        parse(XBAR_Q.format(r=1).replace("seed 0", "seed 0\nadc_calibration min"))


@pytest.mark.parametrize("inl", [0.0, 1.0])
def test_calibrated_adc_error_within_its_lsb(tmp_path, inl):
    # One 256-row column block with ReLU-like (non-negative) inputs, 7-bit cells (one slice, as
    # pcm-hermes), ideal DAC, 8-bit ADC calibrated on these inputs: each conversion is off the
    # exact current by at most half an LSB of F = max|I| over the tile (one range per tile and
    # slice, plus the INL bow, <= inl LSB), F / 127 in current units; bound checked with numpy,
    # per output.
    rng = np.random.default_rng(5)
    X = np.maximum(rng.standard_normal((300, 256)), 0).astype(np.float32)
    W = rng.standard_normal((256, 32)).astype(np.float32)
    m = CrossbarMode("quantized", weight_bits=8, cell_bits=7, dac_bits=0, adc_bits=8,
                     adc_calibration="data", adc_inl_lsb=inl)
    prm = replace(PCM_OCC, rows=256, cols=32, crossbars=1)
    paths = emit_kernel(plan(300, 256, 32, prm, "weight_stationary"), prm, W, tmp_path, "k",
                        mode=m)
    Y = CrossbarSimulator(paths[0]).run({"X": X})[0]["Y"][0].astype(F64)
    q, sw = ref_weights(W, 8)
    sx = np.abs(X.astype(F64)).max(axis=1, keepdims=True)
    current = (X / sx) @ q
    lsb = np.abs(current).max() / 127
    bound = (0.5 + inl) * lsb * sx * sw
    err = np.abs(Y - current * sx * sw)
    assert (err <= bound * (1 + 1e-5) + 1e-6).all()
    # the full-scale rule's LSB (Lx * sum|q| / 127) is several times the calibrated one here
    assert (np.abs(q).sum(axis=0) / 127 > 4 * lsb).all()



def test_adc_calibrated_range_is_one_per_tile_slice_by_hand(tmp_path):
    # Two columns, one slice: W = [[1, 0.5], [-0.5, 0.5]], per-column scales 1/3 and 1/6, so
    # q = [[3, 3], [-2, 3]]. The first input [1, 1] makes currents [1, 6]: one range for the
    # tile, F = 6, La = 3, step 2: codes rint(0.5) = 0 and 3 -> y = [0, 6 * 1/6 = 1]
    np.save(tmp_path / "w.npy", np.array([[[1.0, 0.5], [-0.5, 0.5]]], np.float32))
    text = (XBAR_Q.format(r=1).replace("seed 0", "seed 0\nadc_calibration data")
            .replace("cols 1", "cols 2").replace("weight W 1 2 1", "weight W 1 2 2")
            .replace("output Y 1 1", "output Y 1 2"))
    (tmp_path / "k.xbar").write_text(text)
    sim = CrossbarSimulator(tmp_path / "k.xbar")
    out, c = sim.run({"X": np.array([[1.0, 1.0]], np.float32)})
    np.testing.assert_allclose(out["Y"][0, 0], [0.0, 1.0], atol=1e-7)
    # the next input [1, 0] makes currents [3, 3]: inside the tile's range (codes rint(1.5)
    # = 2 -> 4), y = [4/3, 4/6], nothing clipped; a range per column (F = 1 for column 0)
    # would have clipped column 0 at code 3 -> current 1, y0 = 1/3 for a true 1
    out, c = sim.run({"X": np.array([[1.0, 0.0]], np.float32)})
    np.testing.assert_allclose(out["Y"][0, 0], [4 / 3, 2 / 3], rtol=1e-6)
    assert c.adc_clipped == 0
    # a first inference without current (all zeros: a warm-up run) calibrates nothing: the
    # next one with current sets the range, so the same figures follow (before, the zeros
    # fixed the full-scale rule, F = 5 and 6 here, for the simulator's lifetime)
    sim = CrossbarSimulator(tmp_path / "k.xbar")
    out, _ = sim.run({"X": np.zeros((1, 2), np.float32)})
    np.testing.assert_array_equal(out["Y"][0, 0], [0.0, 0.0])
    out, _ = sim.run({"X": np.array([[1.0, 1.0]], np.float32)})
    np.testing.assert_allclose(out["Y"][0, 0], [0.0, 1.0], atol=1e-7)
    out, c = sim.run({"X": np.array([[1.0, 0.0]], np.float32)})
    np.testing.assert_allclose(out["Y"][0, 0], [4 / 3, 2 / 3], rtol=1e-6)

def test_read_noise_seeded_and_sized(tmp_path):
    rng = np.random.default_rng(3)
    X = np.abs(rng.standard_normal((4000, 60))).astype(np.float32)
    W = rng.standard_normal((60, 8)).astype(np.float32)
    # one slice (cell_bits = weight_bits), ideal ADC and DAC: the only randomness is the noise
    base = CrossbarMode("quantized", weight_bits=8, cell_bits=8, dac_bits=0, adc_bits=0)
    runs = {}
    for name, m in {"clean": base, "s7": replace(base, noise_sigma=0.05, seed=7),
                    "s7b": replace(base, noise_sigma=0.05, seed=7),
                    "s8": replace(base, noise_sigma=0.05, seed=8)}.items():
        _, paths = _emit(tmp_path, X, W, m, name=name)
        sim = CrossbarSimulator(paths[0])
        runs[name] = [sim.run({"X": X})[0]["Y"][0] for _ in range(2)]
    np.testing.assert_array_equal(runs["s7"][0], runs["s7b"][0])   # same seed: same draws
    np.testing.assert_array_equal(runs["s7"][1], runs["s7b"][1])
    assert not np.array_equal(runs["s7"][0], runs["s8"][0])         # other seed: other draws
    assert not np.array_equal(runs["s7"][0], runs["s7"][1])         # re-sampled every read
    np.testing.assert_array_equal(runs["clean"][0], runs["clean"][1])
    np.testing.assert_allclose(runs["clean"][0], ref_exact(X, W, 64, 8, 0), rtol=2e-6, atol=1e-6)
    # each cell read as G (1 + sigma e): the column gets N(0, sigma^2 sum_i x_i^2 q_i^2), in
    # output units times (sx * sw)^2
    q, sw = ref_weights(W, 8)
    sx = np.abs(X.astype(F64)).max(axis=1, keepdims=True)
    std = 0.05 * np.sqrt((X / sx) ** 2 @ q ** 2) * sx * sw
    z = (runs["s7"][0] - runs["clean"][0]) / std
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1) < 0.05


@pytest.mark.parametrize("mode", ["q8-noisy data", "device data"])
def test_rows_in_blocks_give_what_one_block_gives(tmp_path, monkeypatch, mode):
    # a quantized MVM runs its rows in blocks of _ROW_BLOCK_BYTES of currents (at batch 8 a
    # whole activation made 1 GB temporaries, trial s36). Every row is its own: a block of 256
    # rows at a time gives what one block of all 1,000 gives, the read-noise draws (row after
    # row, as one draw), the ADC calibrated on every row of the first inference and its
    # saturation count included.
    from onnx_cinm.devices.memristor import PCM_HERMES
    from onnx_cinm.devices.memristor.nonideal import compose
    from onnx_cinm.sim.crossbar import simulator

    kind, cal = mode.split()
    m = compose(kind, PCM_HERMES, adc_calibration=cal)
    X, W = _data(1000, 150, 70, seed=5)
    _, paths = _emit(tmp_path, X, W, m, name="k")
    runs = {}
    for block in (1 << 40, 1):  # one block of every row; then the least, 256 rows
        monkeypatch.setattr(simulator, "_ROW_BLOCK_BYTES", block)
        sim = CrossbarSimulator(paths[0])
        runs[block] = [sim.run({"X": X * s}) for s in (1.0, 3.0)]  # the second one clips
    for (one, c1), (blocks, c2) in zip(runs[1 << 40], runs[1]):
        np.testing.assert_array_equal(one["Y"], blocks["Y"])
        assert c1.adc_clipped == c2.adc_clipped
    assert runs[1][1][1].adc_clipped > 0


def test_counters_scale_with_slices_and_orders_agree(tmp_path):
    X, W = _data(10, 150, 70, seed=2)  # Kt = 3, Nt = 2: T = 6 tiles on P = 4
    m = replace(Q8, adc_range=0.5)
    pl, paths = _emit(tmp_path, X, W, m, name="ws")
    sim = CrossbarSimulator(paths[0])
    # load programs the first 4 tiles in (k, n) order: (64x64, 64x6) twice -> 2 * (4096 + 384)
    assert sim.load_counters.cell_writes == 2 * (64 * 64 + 64 * 6) * 4 * 2
    out_ws, c = sim.run({"X": X})
    # first (forward) inference writes the last two tiles: 22x64 and 22x6 weights, 8 cells each
    assert c.cell_writes == (22 * 64 + 22 * 6) * 8 and c.tile_writes == 2
    assert c.mvms == 10 * 6 and c.adc_conversions == 10 * 3 * 70 * 4
    assert c.dac_conversions == 10 * 150 * 2  # every row's K inputs once per n tile
    assert c.max_cell_writes == 2
    _, paths = _emit(tmp_path, X, W, m, order="naive", m_block=3, name="naive")
    out_nv, cn = CrossbarSimulator(paths[0]).run({"X": X})
    np.testing.assert_array_equal(out_nv["Y"], out_ws["Y"])  # same data path, any loop order
    assert cn.adc_clipped == c.adc_clipped > 0
    assert cn.cell_writes == 4 * (150 * 70) * 8  # 4 row blocks, every tile written per block


BAD_HEADER = """XBAR 1
crossbars 1
rows 2
cols 2
dtype float32
mode quantized
weight_bits 8
cell_bits 2
adc_bits 8
input X 1 3
weight W 1 3 2 w.npy
output Y 1 2
RUN
PROGRAM 0 W 0 0 0
MVM 0 X 0 0
ACC Y 0 0 0
BARRIER
END
"""


@pytest.mark.parametrize("edit,line,msg", [
    (("mode quantized", "mode fuzzy"), 6, "'mode' must be one of ideal, quantized"),
    (("mode quantized", "mode ideal"), 7, "'weight_bits' needs 'mode quantized'"),
    (("weight_bits 8", "weight_bits 1"), 7, "weight_bits must be in 2..16"),
    (("weight_bits 8", "weight_bits eight"), 7, "weight_bits must be an integer"),
    (("cell_bits 2", "cell_bits 9"), 8, r"cell_bits must be in 1..weight_bits \(8\)"),
    (("adc_bits 8", "adc_bits 1"), 9, "adc_bits must be 0"),
    (("adc_bits 8", "adc_bits 8 9"), 9, "expected 'adc_bits <value>'"),
    (("adc_bits 8", "adc_bits 8\ndifferential maybe"), 10, "'differential' must be on or off"),
    (("adc_bits 8", "adc_bits 8\nnoise_sigma -0.5"), 10, "noise_sigma must be >= 0"),
    (("adc_bits 8", "adc_bits 8\nnoise_sigma loud"), 10, "noise_sigma must be a number"),
    (("adc_bits 8", "adc_bits 8\nadc_range 2"), 10, r"adc_range must be in \(0, 1\]"),
    (("adc_bits 8", "adc_bits 8\nseed -3"), 10, "seed must be >= 0"),
    (("adc_bits 8", "adc_bits 8\nweight_bits 4"), 10,
     r"header key 'weight_bits' given twice \(line 7\)"),
])
def test_bad_mode_lines_name_the_line(edit, line, msg):
    with pytest.raises(XbarError, match=rf"^k\.xbar:{line}: {msg}"):
        parse(BAD_HEADER.replace(*edit), "k.xbar")


def test_doc_quantized_header_is_q8():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "xbar-format.md").read_text()
    block = doc.split("## Modes")[1].split("```")[1]
    ours = "mode quantized\nweight_bits 8\ncell_bits 2\nadc_bits 8\n"
    text = BAD_HEADER.replace(ours, block.strip() + "\n")
    assert "seed 0\nadc_range" not in text and "noise_sigma 0.0\n" in text  # the doc's block
    assert parse(text, "k.xbar").mode == Q8


def test_defaults_for_omitted_mode_keys():
    m = parse(BAD_HEADER, "k.xbar").mode
    assert m == CrossbarMode("quantized", weight_bits=8, cell_bits=2, adc_bits=8)


# ------------------------------------------------------------------------ the acceptance


def _mlp_accuracy(digits, tmp_path, mode, tag):
    """Digits MLP with its three MatMuls run by emitted .xbar kernels; bias, ReLU, argmax here."""
    g = digits.model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    layers = []
    for node in g.node:
        if node.op_type == "MatMul":
            layers.append([inits[node.input[1]], None])
        elif node.op_type == "Add":
            layers[-1][1] = inits[node.input[1]]
    assert [W.shape for W, _ in layers] == [(64, 64), (64, 32), (32, 10)]
    h = digits.X_test
    for i, (W, b) in enumerate(layers):
        pl = plan(h.shape[0], W.shape[0], W.shape[1], PCM_OCC, "weight_stationary")
        paths = emit_kernel(pl, PCM_OCC, W, tmp_path, f"{tag}{i}", mode=mode)
        out, _ = CrossbarSimulator(paths[0]).run({"X": h})
        h = out["Y"][0] + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0)
    pred = inits["classes"][h.argmax(axis=1)]
    return float((pred == digits.y_test).mean())


def test_digits_mlp_q8_within_one_point(digits_mlp, tmp_path):
    fp32 = _mlp_accuracy(digits_mlp, tmp_path, None, "ideal")
    assert fp32 == pytest.approx(digits_mlp.accuracy)  # ideal mode = scikit-learn's accuracy
    q8 = _mlp_accuracy(digits_mlp, tmp_path, Q8, "q8")
    assert q8 >= fp32 - 0.01, (q8, fp32)
    # and with 2 % read noise (three seeds), still within a point on average
    noisy = [_mlp_accuracy(digits_mlp, tmp_path, replace(Q8, noise_sigma=0.02, seed=s), f"n{s}")
             for s in range(3)]
    assert np.mean(noisy) >= fp32 - 0.01, (noisy, fp32)
