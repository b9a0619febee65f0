"""Runtime: the CINM execution provider and the device simulators.

``InferenceSession`` (:mod:`.session`) runs an optimized model like onnxruntime's session, with
crossbar nodes in the ``.xbar`` simulator (:mod:`.crossbar`) and UPMEM nodes by the cost model
or in the emulator (:mod:`.upmem_emu`).
"""


def __getattr__(name):  # lazy: importing the simulator alone does not load onnxruntime
    if name in ("InferenceSession", "PROVIDER"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
