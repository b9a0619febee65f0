"""Leaf simulators of the device layer: what runs a device's kernel artifact without the chip.

- :mod:`.crossbar`: the ``.xbar`` command-file parser and memristor crossbar simulator, with its
  data-path modes (:mod:`.crossbar.mode`) and device physics (:mod:`.crossbar.physics`);
- :mod:`.upmem_emu`: the UPMEM emulator (builds a kernel's ``host.c``/``dpu.c`` with gcc against
  SDK-compatible headers and runs it);
- :mod:`.blas`: the matrix kernels the simulators run their products on.

These are leaf packages (issue 13): they import nothing of onnx_cinm but :mod:`onnx_cinm.errors`;
a device package imports its simulator and passes in what the simulator needs (a file, arrays,
a mode), never the reverse. ``lint-imports`` (pyproject ``[tool.importlinter]``) checks it.
"""
