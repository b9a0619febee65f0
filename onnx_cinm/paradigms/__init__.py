"""The paradigm level: how a paradigm computes a device-agnostic cinm op, for any chip of it.

Between the device contract (:mod:`onnx_cinm.devices.base`) and the device packages sit the
paradigms of the CINM paper (Khan et al., arXiv 2301.07486, §3: the ``cim`` and ``cnm``
dialects between ``cinm`` and the device dialects):

- :mod:`.cim` -- compute *in* memory (crossbar arrays): tiles of a ``[G, K, N]`` product on
  ``rows x cols`` arrays, loop orders, write and MVM counts, residency and pinning of kernels
  sharing ``P`` crossbars, the views of a Gemm/Gemv as such a product. Written against
  :class:`.cim.CrossbarArray`.
- :mod:`.cnm` -- compute *near* memory (a processing unit beside each memory bank): workgroups
  (units, threads, lanes, elements per unit), data distribution (scatter, broadcast, gather),
  memory layout and merges of partial results. Written against :class:`.cnm.NearMemoryArray`.

A device package of a paradigm fills the paradigm's protocol with its sourced constants and
imports the paradigm's code; the paradigm never imports a device package (import-linter layer
contract), so a second crossbar chip or a second near-memory device reuses it unchanged.
"""
