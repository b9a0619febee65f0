"""A trained model without downloads: scikit-learn's bundled digits set, an MLP, skl2onnx.

``load_digits`` ships inside scikit-learn (1,797 8x8 images, 16 grey levels), so this builds a
real, trained classifier offline in a few seconds. Used by ``models/build_models.py`` and the
tests (accuracy of the optimized model must equal scikit-learn's).
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import onnx

from ..errors import CinmError

__all__ = ["DigitsMLP", "build_digits_mlp", "main"]


class DigitsMLP(NamedTuple):
    """What :func:`build_digits_mlp` returns (a tuple, so it also unpacks in four)."""

    model: onnx.ModelProto
    X_test: np.ndarray   #: float32 [450, 64], pixel values / 16.0 in [0, 1]
    y_test: np.ndarray   #: int64 [450], digit labels 0..9
    accuracy: float      #: scikit-learn's accuracy on (X_test, y_test), in [0, 1]


def build_digits_mlp() -> DigitsMLP:
    """Train ``MLPClassifier((64, 32))`` on the digits set and export it with skl2onnx.

    The data are scaled by 1/16 (pixels become [0, 1]); the model expects that scaling. Split:
    ``train_test_split(X / 16.0, y, test_size=0.25, random_state=0)`` (1,347 train, 450 test);
    classifier ``MLPClassifier((64, 32), max_iter=300, random_state=0)`` (about 98 % test
    accuracy, ~2-6 s on 2 cores).

    Returns
    -------
    DigitsMLP
        ``model``: ONNX opset 17 (+ ``ai.onnx.ml``), input ``X`` float32 [batch, 64], outputs
        ``label`` int64 [batch] and ``probabilities`` float32 [batch, 10] (no ZipMap). Graph:
        Cast, 3x(MatMul, Add), 2x Relu, Softmax, ArgMax, ``ai.onnx.ml.ArrayFeatureExtractor``.
        ``X_test`` float32 [450, 64], ``y_test`` int64 [450], ``accuracy`` float.

    Raises
    ------
    CinmError
        scikit-learn or skl2onnx is not installed (``pip install onnx-cinm[test]``).
    """
    try:
        from skl2onnx import to_onnx
        from skl2onnx.common.data_types import FloatTensorType
        from sklearn.datasets import load_digits
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.model_selection import train_test_split
        from sklearn.neural_network import MLPClassifier
        from threadpoolctl import threadpool_limits
    except ImportError as e:
        raise CinmError(
            f"the digits model needs scikit-learn and skl2onnx ({e.name or e} is missing); "
            "pip install 'onnx-cinm[test]'"
        ) from None

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.25,
                                                        random_state=0)
    clf = MLPClassifier((64, 32), max_iter=300, random_state=0)
    # one BLAS thread: as fast for these tiny matrices, and no oversubscription when the
    # machine is busy (multi-threaded BLAS took 8x longer under load)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X_train, y_train)
    X_test = X_test.astype(np.float32)
    y_test = y_test.astype(np.int64)
    accuracy = float(clf.score(X_test, y_test))
    model = to_onnx(
        clf,
        initial_types=[("X", FloatTensorType([None, 64]))],
        target_opset={"": 17, "ai.onnx.ml": 3},
        options={id(clf): {"zipmap": False}},
    )
    # name the unknown batch dimension, as in the bundled examples
    for vi in list(model.graph.input) + list(model.graph.output):
        dim0 = vi.type.tensor_type.shape.dim[0]
        if not dim0.HasField("dim_value"):
            dim0.dim_param = "batch"
    model.graph.name = "digits_mlp"
    return DigitsMLP(model, X_test, y_test, accuracy)


def main(argv: list[str] | None = None) -> int:
    """``python -m onnx_cinm.examples.digits [MODEL.onnx] [TEST.npz]``: write the digits MLP
    (default ``digits.onnx``) and its labeled test set (default ``digits_test.npz``: ``X``
    float32 [450, 64], ``labels`` int64 [450]) for ``onnx-cinm optimize`` and ``evaluate``.
    Returns the exit status: 0, or 1 with one line on stderr (scikit-learn or skl2onnx
    missing, a file that cannot be written: each file is written whole or not at all)."""
    import argparse
    import io
    import sys

    from ..frontend import save_model, write_file_atomic

    parser = argparse.ArgumentParser(prog="python -m onnx_cinm.examples.digits",
                                     description=main.__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="digits.onnx")
    parser.add_argument("data", nargs="?", default="digits_test.npz")
    args = parser.parse_args(argv)
    try:
        digits = build_digits_mlp()
        buf = io.BytesIO()
        np.savez(buf, X=digits.X_test, labels=digits.y_test)
        save_model(digits.model, args.model)
        try:
            write_file_atomic(args.data, buf.getvalue())
        except OSError as e:
            raise CinmError(f"cannot write '{args.data}': {e.strerror or e}") from None
    except CinmError as e:
        print(f"onnx-cinm: error: {e}", file=sys.stderr)
        return 1
    print(f"written: {args.model} (scikit-learn's accuracy {100 * digits.accuracy:.2f} %), "
          f"{args.data} ({len(digits.y_test)} labeled test images)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
