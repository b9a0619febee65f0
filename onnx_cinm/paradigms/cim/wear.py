"""Cell wear and lifetime of a crossbar chip under a model's plans (any crossbar chip).

A tile write programs each cell of one crossbar once. The weight-stationary schedules spread a
device's streamed tiles round-robin over the crossbars they stream through, each streaming
kernel continuing where the one before it stopped (its plan's ``first`` crossbar, node
attribute ``cim_first_crossbar``), so wear is as even
over those crossbars as whole writes allow (the assumption cost placement's endurance budget
makes, field notes ``crossbar.md`` §3 "Wear": rotate the tile-to-crossbar assignment to level
wear); crossbars kept by resident kernels are written once, at load. The assignment is fixed
by the kernel programs, so it does not move on from one inference to the next (a kernel's
serpentine order walks the same crossbars back and forth): every inference writes the same
crossbars the same number of times, and the most-written of ``C`` crossbars taking ``T`` tile
writes round-robin takes ``ceil(T / C)`` of them. Hence, per inference,

    writes per cell of the most-written cells = ceil(tile writes per inference / streamed crossbars)

and with a cell enduring ``E`` writes (a preset's ``endurance_writes``) the chip lasts

    lifetime = E / writes per cell per inference   inferences

(``crossbar.md`` §3: lifetime ≈ endurance × B / max per-cell writes per batch, here B = 1
inference; ``cinnamon.md`` §6: lifetime = Wmax · size / write traffic), that is ``lifetime x
seconds per inference`` seconds when inferences run back to back. Writes at load (at most one
per cell per model load) are not counted.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A lifetime shorter than this at back-to-back inference is flagged (seconds): one year
#: (365.25 days). Our own threshold, not a published figure: a span over which a deployed
#: accelerator may be expected to keep working; a chip worn out sooner needs its weights kept
#: resident or its streaming budgeted.
SHORT_LIFETIME_S = 365.25 * 86400.0


def writes_per_cell(tile_writes, crossbars, lifetime: float = 1.0):
    """Writes per cell of the most-written cells over ``lifetime`` inferences from
    ``tile_writes`` tile writes per inference spread round-robin over ``crossbars`` crossbars
    (one write per cell per tile write; a count of 0 crossbars is taken as 1):
    ``ceil(tile_writes / crossbars)`` per inference, the module docstring's rule. Whole writes,
    because the writes do not rotate on across inferences: a crossbar written in one inference
    is written again in the next (a kernel streaming alone rewrites the same ones: its
    serpentine order keeps the others' tiles), so 1 tile write over 3 crossbars is 1 write per
    cell per inference, not 1/3, and 10 over 4 are 3 (two crossbars take 3, two take 2), not
    2.5. Numbers or numpy arrays (elementwise)."""
    per_inference = np.ceil(np.asarray(tile_writes) / np.maximum(crossbars, 1))
    return lifetime * per_inference


@dataclass(frozen=True)
class Wear:
    """The wear of a crossbar chip's most-written cells under one model's plans.

    Attributes:
        tile_writes: tile writes per inference (all kernels the inference runs).
        crossbars: crossbars the streamed tiles rotate over (0: none streamed).
        per_cell: writes per cell per inference of the most-written cells.
        endurance: writes a cell survives (the preset's ``endurance_writes``).
        seconds_per_inference: the period of back-to-back inferences, seconds.
        inferences: inferences until the most-written cells reach ``endurance`` (``inf``:
            no writes per inference, the cells are written only at load).
        seconds: ``inferences * seconds_per_inference`` (``inf`` likewise).
    """

    tile_writes: int
    crossbars: int
    per_cell: float
    endurance: float
    seconds_per_inference: float
    inferences: float
    seconds: float

    @property
    def short(self) -> bool:
        """True if the chip wears out within :data:`SHORT_LIFETIME_S` at back-to-back inference."""
        return self.seconds < SHORT_LIFETIME_S

    def figures(self) -> dict:
        """The figures as a JSON-ready dict (``inf`` as None: no wear per inference)."""
        fin = (lambda x: x if math.isfinite(x) else None)
        return {"tile_writes_per_inference": self.tile_writes, "streamed_crossbars": self.crossbars,
                "writes_per_cell_per_inference": self.per_cell, "endurance_writes": self.endurance,
                "seconds_per_inference": self.seconds_per_inference,
                "lifetime_inferences": fin(self.inferences), "lifetime_s": fin(self.seconds),
                "short": self.short, "short_threshold_s": SHORT_LIFETIME_S}


def wear(tile_writes: int, crossbars: int, endurance: float,
         seconds_per_inference: float) -> Wear:
    """The :class:`Wear` of ``tile_writes`` tile writes per inference rotating over
    ``crossbars`` streamed crossbars of cells enduring ``endurance`` writes, inferences running
    back to back every ``seconds_per_inference`` seconds. Raises ValueError if ``endurance``
    is not positive or a count or the period is negative."""
    if endurance <= 0 or tile_writes < 0 or crossbars < 0 or seconds_per_inference < 0:
        raise ValueError(f"bad wear figures: {tile_writes} tile writes, {crossbars} crossbars, "
                         f"endurance {endurance}, {seconds_per_inference} s per inference")
    per_cell = float(writes_per_cell(tile_writes, crossbars)) if tile_writes else 0.0
    inferences = endurance / per_cell if per_cell else math.inf
    return Wear(int(tile_writes), int(crossbars), per_cell, float(endurance),
                float(seconds_per_inference), inferences,
                inferences * seconds_per_inference if per_cell else math.inf)


def duration(seconds: float) -> str:
    """``seconds`` in the largest fitting unit of s, min, h, days, years (3 significant
    digits), e.g. ``'2.5 h'``, ``'41.3 years'``."""
    for unit, size in (("years", 365.25 * 86400.0), ("days", 86400.0), ("h", 3600.0),
                       ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
