"""onnx-cinm: compile ONNX models for compute-in-memory and compute-near-memory devices.

``optimize(model_or_path, ...)`` runs the whole compiler and returns an
:class:`~onnx_cinm.pipeline.OptimizeResult`; see :func:`onnx_cinm.pipeline.optimize`.

The compiler (onnx, numpy, onnxruntime) is imported on first use, so ``onnx-cinm --help`` is
quick and a Ctrl-C while the command line starts up is handled like any other interrupt.
"""
import time as _time

#: ``time.perf_counter()`` when this package's first line ran: the command line's clock bounds
#: a process start that came long before it (:func:`onnx_cinm.cli.clock.mark`)
_FIRST_LINE = _time.perf_counter()

__version__ = "0.1.0"

__all__ = ["optimize", "OptimizeResult", "__version__"]


def __getattr__(name: str):
    if name in ("optimize", "OptimizeResult"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'onnx_cinm' has no attribute {name!r}")
