"""Shared fixtures: real models found offline in installed wheels, the trained digits MLP.

Fixtures
--------
light_model_paths : dict[str, Path]         (session)
    The nine ``onnx/backend/test/data/light/light_<name>.onnx`` of the installed onnx wheel,
    keyed by short name (``"resnet50"``, ``"vgg19"``, ...).
light_expected_paths : dict[str, list[Path]]   (session)
    Same keys -> ``[light_<name>_output_0.pb, ...]`` next to the model, one file per graph
    output, in output order (the runner's rule: all of them exist or the list is empty).
    With :func:`helpers.light_feeds` as inputs, ORT reproduces them exactly.
ppocr_model_paths : dict[str, Path]          (session)
    ``det``/``rec``/``cls`` -> PP-OCR model inside the ``rapidocr_onnxruntime`` wheel.
ppocr_input_shapes : dict[str, list[int]]    (session)
    ``det`` [1, 3, 320, 320], ``rec`` [1, 3, 48, 320], ``cls`` [1, 3, 48, 192]; each model's
    single input is named ``x``, so pass ``shapes={"x": ppocr_input_shapes["det"]}``.
silero_dir : Path                            (session)
    ``silero_vad/data`` of the ``silero-vad`` 6.2.3 wheel: Conv + LSTM voice-activity models,
    flat and If-based.
digits_mlp : onnx_cinm.examples.digits.DigitsMLP   (session)
    ``(model, X_test, y_test, accuracy)``, trained once per session (~3 s).
tmp_model_dir : Path                         (function)
    A fresh empty directory per test for writing models.

Helpers (``from helpers import ...``): ``assert_matches_ort``, ``light_feeds``, ``load_pb``.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# `helpers` sits next to this file; make it importable under --import-mode=importlib too
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import LIGHT_DIR, PPOCR_FILES, assert_matches_ort, light_feeds, load_pb  # noqa: F401

LIGHT_NAMES = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
               "shufflenet", "squeezenet", "vgg19", "zfnet512"]

PPOCR_INPUT_SHAPES = {
    "det": [1, 3, 320, 320],
    "rec": [1, 3, 48, 320],
    "cls": [1, 3, 48, 192],
}


@pytest.fixture(scope="session")
def light_model_paths() -> dict[str, Path]:
    paths = {name: LIGHT_DIR / f"light_{name}.onnx" for name in LIGHT_NAMES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        pytest.fail(f"light models missing from the installed onnx wheel: {', '.join(missing)} "
                    "(onnx 1.20-1.23 ship them under onnx/backend/test/data/light)", pytrace=False)
    return paths


@pytest.fixture(scope="session")
def light_expected_paths(light_model_paths) -> dict[str, list[Path]]:
    import onnx

    out = {}
    for name, path in light_model_paths.items():
        n_out = len(onnx.load(str(path), load_external_data=False).graph.output)
        files = [path.with_name(f"{path.stem}_output_{i}.pb") for i in range(n_out)]
        out[name] = files if all(f.is_file() for f in files) else []
    return out


@pytest.fixture(scope="session")
def ppocr_model_paths() -> dict[str, Path]:
    # find_spec does not import the package (importing it needs cv2, which we do not install)
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    hint = "pip install --no-deps rapidocr-onnxruntime==1.4.4"
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"rapidocr_onnxruntime is not installed; {hint}", pytrace=False)
    models = Path(list(spec.submodule_search_locations)[0]) / "models"
    paths = {key: models / fname for key, fname in PPOCR_FILES.items()}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        pytest.fail(f"PP-OCR models {', '.join(missing)} not found in {models}; {hint} "
                    "(versions before 1.2 did not bundle the models)", pytrace=False)
    return paths


@pytest.fixture(scope="session")
def ppocr_input_shapes() -> dict[str, list[int]]:
    return {k: list(v) for k, v in PPOCR_INPUT_SHAPES.items()}


@pytest.fixture(scope="session")
def silero_dir() -> Path:
    spec = importlib.util.find_spec("silero_vad")  # without importing it (that needs torch)
    hint = "pip install --no-deps silero-vad==6.2.3"
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(f"silero_vad is not installed; {hint}", pytrace=False)
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not (data / "silero_vad_16k_sequence.onnx").is_file():
        pytest.fail(f"the Silero VAD models are not in {data}; {hint}", pytrace=False)
    return data


@pytest.fixture(scope="session")
def digits_mlp():
    from onnx_cinm.examples.digits import build_digits_mlp

    return build_digits_mlp()


@pytest.fixture
def tmp_model_dir(tmp_path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    return d
