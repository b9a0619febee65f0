"""Data distribution of the cnm paradigm: scatter, broadcast, residency, grids and memory layout.

Each input of a cnm kernel is either **scattered** (each unit gets its own equal, padded share:
elements, rows or column blocks) or **broadcast** (every unit gets the whole tensor); outputs
are **gathered** from every unit. A plan records this per input as ``"<name>:scatter"`` or
``"<name>:broadcast"`` (:func:`entry`). Constant inputs (weights) stay resident in the units'
memory across inferences, so only the non-constant bytes move per inference
(:func:`resident`).

A matrix product ``[rows x k] @ [k x cols]`` runs on a grid of ``row blocks x column blocks``
units (:func:`grid`): A is scattered by row blocks (broadcast when there is one), B by column
blocks (broadcast when there is one). One column block is the classic mapping; one row block
suits a fully connected layer at batch 1; both at once suit convolutions with few output
pixels.
"""
from __future__ import annotations

SCATTER = "scatter"
BROADCAST = "broadcast"


def entry(name: str, how: str) -> str:
    """The plan's record of one input: ``"<name>:scatter"`` or ``"<name>:broadcast"``."""
    return f"{name}:{how}"


def split(record: str) -> tuple[str, str]:
    """``(name, how)`` of an :func:`entry` (the name may itself contain ``:``)."""
    name, how = record.rsplit(":", 1)
    return name, how


def grid(units: int, col_blocks: int, rows: int, cols: int,
         batched: bool) -> tuple[int, int, str] | None:
    """``(row blocks, column blocks, mode)`` of a ``rows x cols`` product on ``units`` units
    split into ``col_blocks`` column blocks, or None if there is no such grid (``col_blocks``
    does not divide ``units``; more column blocks than columns, or column blocks of a batched
    B; more row blocks than rows). ``mode`` is ``rows`` (one column block), ``cols`` (one row
    block) or ``grid``."""
    dc = max(1, int(col_blocks))
    if units % dc or (dc > 1 and (batched or dc > cols)) or units // dc > max(rows, 1):
        return None
    dr = units // dc
    return dr, dc, "rows" if dc == 1 else ("cols" if dr == 1 else "grid")


def grid_inputs(row_blocks: int, col_blocks: int) -> tuple[str, str]:
    """How A and B of a product on a :func:`grid` move: A scattered by row blocks unless there is
    one, B by column blocks unless there is one."""
    return (SCATTER if row_blocks > 1 else BROADCAST), (SCATTER if col_blocks > 1 else BROADCAST)


def resident(inputs) -> tuple[int, int]:
    """``(scattered, broadcast)`` bytes per unit that stay resident: ``inputs`` is
    ``[(bytes per unit, how, constant)]``; the constant ones are loaded once, not per
    inference."""
    scattered = sum(b for b, how, const in inputs if const and how == SCATTER)
    broadcast = sum(b for b, how, const in inputs if const and how == BROADCAST)
    return scattered, broadcast


def memory_layout(regions) -> list[tuple[str, int, int]]:
    """``[(region, offset, bytes)]`` of one unit's memory from ``[(region, bytes)]`` in order:
    back to back from offset 0, empty regions left out. Regions sized in whole aligned words
    (as the plans make them) keep every offset aligned; the layout is the same on every unit,
    since one host transfer moves one length to all units."""
    out, off = [], 0
    for name, size in regions:
        if size:
            out.append((name, off, size))
            off += size
    return out
