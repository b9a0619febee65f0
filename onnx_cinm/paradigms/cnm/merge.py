"""Merges of the cnm paradigm: how the partial results of threads and units combine.

A kernel whose output depends on all of its input (a reduction, a histogram, a top-k, a scan,
a selection) leaves one partial result per thread of every unit. The merges:

- ``tree`` -- the threads of a unit combine their partials pairwise in the scratchpad,
  ``ceil(log2(threads))`` levels of :func:`tree_pairs` pairs each, then the host combines one
  partial per unit;
- ``host`` -- every thread's partial goes to the host, which combines them all (PrIM's
  default on UPMEM);
- ``mutex`` -- one shared partial per unit updated under a lock (PrIM HST-L);
- ``prefix`` -- per-thread counts or sums combined once into offsets; variable-length outputs
  are compacted on the host;
- ``handshake`` -- a thread-to-thread chain every block (PrIM SEL/SCAN);
- ``none`` -- outputs are independent (elementwise ops, matrix products, reductions of whole
  rows per unit).

:func:`rule` is the paradigm's default choice per kernel family; a device may choose another
(UPMEM falls back to ``mutex`` when private histograms do not fit WRAM, and prices PrIM's
choices for comparison).
"""
from __future__ import annotations

MERGES = ("none", "tree", "host", "mutex", "prefix", "handshake")

#: Default merge per kernel family (families not listed merge nothing).
_RULE = {"reduce": "tree", "topk": "tree", "histogram": "tree", "select": "prefix", "scan": "tree"}


def rule(kind: str, whole_rows: bool = False) -> str:
    """The default merge of kernel family ``kind`` (module docstring); ``whole_rows``: each
    unit reduces, ranks or scans whole rows, so nothing needs merging."""
    if kind in ("reduce", "topk", "scan") and whole_rows:
        return "none"
    return _RULE.get(kind, "none")


def tree_pairs(threads: int, stride: int) -> int:
    """Pairs merged at the tree level of ``stride``: threads ``d`` (a multiple of
    ``2 * stride``) with a partner ``d + stride < threads``."""
    return sum(1 for d in range(0, threads, 2 * stride) if d + stride < threads)
