"""The ``.xbar`` command-file format: parser and simulator of memristor crossbar kernels.

The format is documented in ``docs/xbar-format.md`` (version 1). In short: a header (format
version, geometry, dtype, mode, order, residency, cost parameters), declarations of named regions
(``input``, ``weight``, ``bias``, ``output``; a constant is a tensor of the model, which the
caller passes in, or a ``.npy`` sidecar beside the file), a ``LOAD``
section run once when the kernel is loaded and a ``RUN`` section run per inference, with the
commands ``PROGRAM``, ``MVM``, ``ACC``, ``BARRIER``, ``ADD``, ``READ`` and the block
``FOR ROWS b ... END``.

The simulator executes the file, never the ONNX node. It keeps the crossbars' contents across
inferences (a resident tile is not rewritten when ``residency on``) and counts, per inference:
tile and cell writes, skipped (resident) writes, MVMs (one per streamed row per tile), ADC
conversions (one per used column per MVM; times the bit slices in quantized mode), DAC
conversions, saturated ADC conversions, the maximum writes any cell received so far (wear),
and the modeled latency and energy (:class:`Counters` defines each; the same model as
:mod:`onnx_cinm.paradigms.cim.schedule`): each crossbar has a clock; ``PROGRAM`` adds
``write_latency_s``, ``MVM`` adds ``rows * mvm_latency_s``, ``BARRIER`` sets every clock to the
latest; energy is ``writes * write_energy_j + MVMs * mvm_energy_j + ADC * adc_energy_j +
DAC * dac_energy_j + busy_seconds * clock_hz * periphery_energy_per_cycle_j``.

Data path: numpy, vectorized over rows: one ``MVM`` is one ``(rows x k) @ (k x n)`` product; a
``FOR ROWS`` block is executed once over all rows for the data, while its counters are derived
from its first, one full and its last iteration (iterations in between are identical: the body
programs every crossbar it streams through, so each iteration starts from the same state).

Modes. ``mode ideal``: exact fp32 products and fp32 accumulation. It is the hot path of
whole-model runs, so its products are deferred: each ``ACC`` records which input block meets
which tile, and the records are summed at the next ``ADD``/``READ`` (or the end of the run) in
ascending k order per column block -- one ``X[g] @ W[g]`` matmul when a group's records cover
its weight tiles exactly once. The counters still come from walking every command. A caller may compute an ideal data path
itself, when :meth:`CrossbarSimulator.affine` says it is a plain ``X @ W + b``, and run the
simulator for the counters alone (``run(..., data=False)``). ``mode quantized`` (header keys ``weight_bits``, ``cell_bits``,
``differential``, ``dac_bits``, ``adc_bits``, ``adc_range``, ``noise_sigma``, ``seed``): every MVM
runs the non-ideal data path of :mod:`onnx_cinm.sim.crossbar.mode` (per-channel weight
quantization computed at load from the weights, bit slices, differential pairs or offset, DAC,
seeded read noise, ADC), vectorized over rows and columns in float64 (integer levels, exact),
one matmul for all bit slices side by side; the result is dequantized to float32 in the
crossbar's latch. Quantized mode costs several times the ideal mode's time per MVM. Device
effects (header keys ``device``, ``prog_noise``, ``drift``, ``time_s``, ... of
``docs/xbar-format.md``, "Device effects") are drawn per programmed tile and per ADC by
:mod:`onnx_cinm.sim.crossbar.physics`; without them the data path is unchanged.

Integer kernels. ``dtype int32`` (ideal mode only; header keys ``weight_bits``, ``cell_bits``
and ``differential`` say how the weights sit in cells): the weights are integers in
``-Lw .. Lw`` programmed as they are, never re-quantized; each is cut into ``S`` bit slices of
``cell_bits`` (differential pairs, or offset cells), as :mod:`.mode` describes, so a tile
writes ``S * (2 if differential else 1)`` cells per weight and an MVM makes ``S`` ADC
conversions per column. With an ideal DAC and ADC the shift-add of the slice products is the
integer product itself, so the data path computes ``X @ W`` once, on integer-valued float64
arrays: every partial sum is an integer below 2**53 (|x| < 2**16, |w| < 2**15, K < 2**21), so
the float64 products and sums are exact, and the result is returned as int32 (wrapping as
onnxruntime's int32 MatMul does). fp32 would not be exact: int8 x uint8 sums pass 2**24 from
K = 518 on.

This package is a leaf: it imports nothing of onnx_cinm but :mod:`onnx_cinm.errors` and
:mod:`onnx_cinm.sim.blas`; the memristor device (:mod:`onnx_cinm.devices.memristor`) writes
the files and runs them through it, never the reverse.

Modules: :mod:`.simulator` (the parser and simulator; its public names -- :func:`parse`,
:func:`load_file`, :class:`CrossbarSimulator`, :func:`simulate`, :class:`XbarError`,
:class:`Counters`, :class:`XbarProgram`, :class:`Region`, :class:`Cmd`, :class:`ForRows` -- are
re-exported here and load it on first use), :mod:`.mode` (the data-path modes) and
:mod:`.physics` (device effects). This module holds the format's constants alone, so the
memristor device's code generator, which writes files but runs none, does not load the
simulator.
"""
from __future__ import annotations

FORMAT_VERSION = 1

#: Cost parameters a file may set in its header, with defaults (OCC's PCM model, field notes
#: crossbar.md §1.4).
COST_KEYS = {"write_latency_s": 2.5e-6, "write_energy_j": 2e-10, "mvm_latency_s": 1e-6,
             "mvm_energy_j": 2e-13, "adc_energy_j": 0.0, "periphery_energy_per_cycle_j": 2.1e-9,
             "clock_hz": 1e9, "dac_energy_j": 0.0}

#: Prefix of a constant region's source naming a tensor of the model the file belongs to
#: (``weight W 1 512 1000 model:fc.weight``), percent-encoded: the caller supplies it.
MODEL_SOURCE = "model:"


#: The simulator's public names, re-exported from :mod:`.simulator` on first use.
_SIMULATOR_NAMES = frozenset({"XbarError", "Cmd", "ForRows", "Region", "XbarProgram", "Counters",
                              "parse", "load_file", "CrossbarSimulator", "simulate"})


def __getattr__(name: str):  # lazy: writing a file does not load the simulator
    if name in _SIMULATOR_NAMES:
        from . import simulator

        return getattr(simulator, name)
    if name in ("simulator", "mode", "physics"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
