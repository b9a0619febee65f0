"""onnx-cinm: compile ONNX models for compute-in-memory and compute-near-memory devices.

``optimize(model_or_path, ...)`` runs the whole compiler and returns an
:class:`~onnx_cinm.pipeline.OptimizeResult`; see :func:`onnx_cinm.pipeline.optimize`.
"""
__version__ = "0.1.0"

from .pipeline import OptimizeResult, optimize  # noqa: E402

__all__ = ["optimize", "OptimizeResult", "__version__"]
