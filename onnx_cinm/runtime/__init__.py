"""Runtime: device kernels and simulators (``crossbar``: the ``.xbar`` simulator)."""
