"""An ``onnx.backend.base.Backend`` that runs models *through onnx-cinm*.

``CinmBackend.prepare(model)`` compiles the model with :func:`onnx_cinm.optimize` (golden check
off: the conformance suite brings its own expected outputs) and hands the optimized model to a
*runner*, which executes it. The default runner is stock onnxruntime on the CPU, which runs the
``cinm`` ops through their reference bodies (model-local functions). The runner is the seam where
the CINM execution provider plugs in: any callable ``runner(model) -> session`` whose session
has ``run(None, feeds) -> list[ndarray]`` and ``get_inputs()`` (the
``onnxruntime.InferenceSession`` shape) works, e.g. :func:`cinm_provider_runner`::

    rep = CinmBackend.prepare(model, runner=cinm_provider_runner)
    outputs = rep.run([x])

This makes onnx's own backend test machinery usable on onnx-cinm: ``onnx.backend.test.BackendTest
(CinmBackend, __name__)`` or, for the in-memory node cases of onnx >= 1.23, the loop in
``benchmarks/conformance.py``.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from .errors import CinmError

#: ``runner(model) -> session``; the session needs ``run(None, feeds)`` and ``get_inputs()``.
Runner = Callable[[onnx.ModelProto], Any]


def onnxruntime_runner(model: onnx.ModelProto, *, optimizations: bool = False) -> Any:
    """Create a stock onnxruntime CPU session for ``model`` (the default runner).

    Parameters
    ----------
    model : onnx.ModelProto
        The optimized model (cinm ops carry reference bodies, so stock ORT runs them).
    optimizations : bool
        Enable ORT's graph optimizations. Off by default, so that what is tested is our rewrite
        and not ORT's fusions (see :mod:`onnx_cinm.golden`).

    Returns
    -------
    onnxruntime.InferenceSession
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not optimizations:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4  # failures surface as Python exceptions; no duplicate log line
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def cinm_provider_runner(model: onnx.ModelProto) -> Any:
    """Create a session of the CINM execution provider (:mod:`onnx_cinm.runtime.session`).

    The model and its device kernels are written to a temporary folder (as ``onnx-cinm
    optimize`` writes them) and loaded from there; device nodes run in their kernels, host
    partitions in onnxruntime.

    Parameters
    ----------
    model : onnx.ModelProto
        The optimized model.

    Returns
    -------
    onnx_cinm.runtime.session.InferenceSession
    """
    import tempfile

    from . import artifacts
    from .runtime.session import InferenceSession

    with tempfile.TemporaryDirectory(prefix="onnx_cinm_backend_") as folder:
        path = f"{folder}/model.onnx"
        artifacts.save(model, path)
        return InferenceSession(path)


#: Runners by name (``benchmarks/conformance.py --runner NAME``).
RUNNERS: dict[str, Runner] = {"onnxruntime": onnxruntime_runner, "cinm": cinm_provider_runner}


class CinmBackendRep(BackendRep):
    """A prepared model: the optimized model and a session of the runner over it.

    Attributes
    ----------
    model : onnx.ModelProto
        The optimized model.
    result : onnx_cinm.OptimizeResult
        What :func:`onnx_cinm.optimize` returned (placements, stats, timings).
    session : object
        The runner's session.
    """

    def __init__(self, result, session, input_names: Sequence[str],
                 frozen: Sequence[str] = ()) -> None:
        self.result = result
        self.model = result.model
        self.session = session
        self.input_names = list(input_names)
        #: graph inputs of the original that were also initializers (overridable defaults in
        #: ONNX): compiled as constants, so a value fed for one is refused, never ignored
        self.frozen = set(frozen)

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """Run the optimized model.

        Parameters
        ----------
        inputs : list of numpy.ndarray, dict of str to numpy.ndarray, or one array
            Positional inputs follow the original model's non-initializer graph inputs, as
            onnx's backend test runner passes them.

        Returns
        -------
        tuple of numpy.ndarray
            The outputs in graph output order.

        Raises
        ------
        CinmError
            A value is fed for an initializer that the original also lists as a graph input
            (an overridable default in ONNX; compiled as a constant here), or too many inputs.
        """
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise CinmError(f"got {len(inputs)} inputs, the model takes {len(self.input_names)}")
            feeds = dict(zip(self.input_names, inputs))
        wanted = {i.name for i in self.session.get_inputs()}
        overridden = sorted(k for k in feeds if k in self.frozen and k not in wanted)
        if overridden:
            raise CinmError(f"input(s) {', '.join(overridden)} are initializers of the model (default "
                            "values); onnx-cinm compiles them as constants, so a value fed for "
                            "them cannot be used")
        # inputs the optimized model no longer reads (nothing depends on them) are dropped
        feeds = {k: np.asarray(v) for k, v in feeds.items() if k in wanted}
        return tuple(self.session.run(None, feeds))


class CinmBackend(Backend):
    """onnx backend: compile with onnx-cinm, then run with a runner (stock onnxruntime by default)."""

    #: The runner used when ``prepare`` gets none; a subclass may override it.
    runner: Runner = staticmethod(onnxruntime_runner)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", runner: Runner | None = None,
                check: int = 0, **optimize_options: Any) -> CinmBackendRep:
        """Optimize ``model`` with onnx-cinm and create a runner session for the result.

        Parameters
        ----------
        model : onnx.ModelProto
            The model; not modified.
        device : str
            Only ``"CPU"`` (the host running onnxruntime).
        runner : callable, optional
            ``runner(optimized_model) -> session``; defaults to :attr:`runner`.
        check : int
            Golden-check runs inside :func:`onnx_cinm.optimize` (default 0: the caller compares).
        **optimize_options
            Passed to :func:`onnx_cinm.optimize` (``skip``, ``place``, ``stop_after`` ...).

        Returns
        -------
        CinmBackendRep
        """
        from .pipeline import optimize

        super().prepare(model, device)
        inits = {t.name for t in model.graph.initializer}
        input_names = [i.name for i in model.graph.input if i.name not in inits]
        result = optimize(model, check=check, **optimize_options)
        session = (runner or cls.runner)(result.model)
        frozen = [i.name for i in model.graph.input if i.name in inits]
        return CinmBackendRep(result, session, input_names, frozen)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple:
        """``prepare(model, device, **kwargs).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple] | None = None, **kwargs: Any) -> tuple:
        """Not supported: onnx-cinm compiles whole models (build a one-node model instead)."""
        raise NotImplementedError("onnx-cinm runs whole models; wrap the node in a model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the CPU host (the runner executes on it)."""
        return Device(device).type == DeviceType.CPU


prepare = CinmBackend.prepare
run_model = CinmBackend.run_model
supports_device = CinmBackend.supports_device
