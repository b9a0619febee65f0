"""Runtime: the CINM execution provider (:mod:`.session`) and its profile (:mod:`.profile`).

``InferenceSession`` runs an optimized model like onnxruntime's session; each device node runs
the kernel its device returns (:meth:`onnx_cinm.devices.base.Device.kernel`: crossbar nodes in
the ``.xbar`` simulator :mod:`onnx_cinm.sim.crossbar`, UPMEM nodes by the cost model or in the
emulator :mod:`onnx_cinm.sim.upmem_emu`).
"""


def __getattr__(name):  # lazy: importing the profile alone does not load onnxruntime
    if name in ("InferenceSession", "PROVIDER"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
