"""Chip presets: the published numbers (recomputed here from the abstracts' figures, chips.md §1),
a source for every constant, and the CLI/docs listing what PRESETS holds."""
from pathlib import Path

import pytest

from onnx_cinm.devices.memristor import PCM_HERMES, PCM_OCC, PRESETS, RRAM_NEURRAM
from onnx_cinm.sim.crossbar.physics import DEVICE_MODELS
from onnx_cinm.devices.memristor.presets import CrossbarParams

DOC = Path(__file__).resolve().parents[1] / "docs" / "crossbar-presets.md"


def test_hermes_numbers_from_the_abstracts():
    # Le Gallo et al. 2023: 64 cores of 256 x 256; 63.1 TOPS at 9.76 TOPS/W (one-phase, 8-bit);
    # one MVM = 2 * 256 * 256 ops -> 131072 / (63.1e12 / 64) s and 131072 / 9.76e12 J
    assert (PCM_HERMES.rows, PCM_HERMES.cols, PCM_HERMES.crossbars) == (256, 256, 64)
    assert PCM_HERMES.mvm_latency_s == pytest.approx(132.9e-9, rel=1e-3)
    assert PCM_HERMES.mvm_energy_j == pytest.approx(13.43e-9, rel=1e-3)
    assert PCM_HERMES.adc_latency_s == pytest.approx(76.8e-9)  # 256 LSB x 300 ps
    assert (PCM_HERMES.weight_bits, PCM_HERMES.dac_bits, PCM_HERMES.adc_bits) == (8, 8, 8)
    assert DEVICE_MODELS[PCM_HERMES.device_model].g_max_us == 10.35  # aihwkit Hermes, 1 device


def test_neurram_numbers():
    # 48 cores x 65,536 cells = 3.1 M cells (chips.md §1.6); 4-bit weights (Wan et al. 2022)
    assert RRAM_NEURRAM.rows * RRAM_NEURRAM.cols * RRAM_NEURRAM.crossbars == 3_145_728
    assert RRAM_NEURRAM.weight_bits == 4
    assert RRAM_NEURRAM.mvm_energy_j == pytest.approx(256 * 1.45e-12)  # Accelergy per column


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_constant_has_a_source(name):
    p = PRESETS[name]
    default = CrossbarParams()
    skip = {"name", "dtypes", "min_macs", "technology", "sources", "unverified"}
    changed = [f for f in p.__dataclass_fields__ if f not in skip
               and getattr(p, f) != getattr(default, f)]
    missing = [f for f in changed if not p.source(f)]
    assert not missing, missing
    assert set(p.unverified) <= {k for k, _ in p.sources}
    assert p.device_model in DEVICE_MODELS
    assert p.min_macs == p.rows * p.cols


def test_default_preset_unchanged():
    assert next(iter(PRESETS)) == "pcm-occ" and PRESETS["pcm-occ"] == PCM_OCC
    assert (PCM_OCC.rows, PCM_OCC.crossbars, PCM_OCC.write_latency_s) == (64, 4, 2.5e-6)


def test_cli_and_docs_list_the_presets():
    from onnx_cinm.cli import _parser
    from onnx_cinm.devices import get_device
    from onnx_cinm.sweep import keys

    opt = _parser()._subparsers._group_actions[0].choices["optimize"]
    action = next(a for a in opt._actions if "--cim-preset" in a.option_strings)
    # the flag is generated from the option; unset, the device's own preset (pcm-occ) applies
    assert list(action.choices) == list(PRESETS) and action.default is None
    assert get_device("memristor").params is PCM_OCC and "default pcm-occ" in action.help
    assert keys()["crossbar.preset"]("rram-neurram") == {"cim_preset": "rram-neurram"}
    assert keys()["cim.preset"]("rram-neurram") == {"cim_preset": "rram-neurram"}
    text = DOC.read_text()
    for name in PRESETS:
        assert f"`{name}`" in text
