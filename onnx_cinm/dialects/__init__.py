"""Dialects: the cinm op set (:mod:`.cinm`) and the plan attributes devices declare for it.

Devices declare their plan attributes here (:func:`declare_plan_attrs`) when they register,
without importing onnx (``onnx-cinm --help`` lists device presets and must stay fast); the
cinm dialect adds them to its op schemas when it is imported, or at once if it already is.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

#: Plan attribute type names devices may use (mapped to ``onnx.AttributeProto`` types by cinm).
ATTR_TYPE_NAMES = ("int", "float", "string", "ints", "floats", "strings")

#: Every declared plan attribute: ``{name: type name}``.
DECLARED_PLAN_ATTRS: dict[str, str] = {}

#: How many :func:`declarations_batched` blocks are open: while any is, the loaded dialect's
#: schemas wait for its end to take the declarations in.
_batched = 0


@contextmanager
def declarations_batched():
    """Plan attributes declared inside reach the loaded cinm dialect's op schemas once, at the
    end (each update registers every op's schema again: 5 ms, once per device otherwise). A
    declaration is still checked at once."""
    global _batched
    _batched += 1
    try:
        yield
    finally:
        _batched -= 1
        cinm = sys.modules.get(f"{__name__}.cinm")
        if not _batched and cinm is not None:
            cinm.sync_plan_attrs()


def declare_plan_attrs(attrs: dict) -> None:
    """Declare plan attributes ``{name: type name}`` (:data:`ATTR_TYPE_NAMES`) for every cinm op.
    Raises ValueError if a type is unknown, a name is already declared with another type, or
    (once the dialect is loaded) a name is one of the dialect's own attributes."""
    for name, t in attrs.items():
        if t not in ATTR_TYPE_NAMES:
            raise ValueError(f"plan attribute '{name}': unknown type {t!r} "
                             f"(known: {', '.join(ATTR_TYPE_NAMES)})")
        if DECLARED_PLAN_ATTRS.get(name, t) != t:
            raise ValueError(f"plan attribute '{name}' is already declared with another type")
    cinm = sys.modules.get(f"{__name__}.cinm")
    if cinm is not None:
        cinm.check_plan_attrs(attrs)
    DECLARED_PLAN_ATTRS.update(attrs)
    if cinm is not None and not _batched:
        cinm.sync_plan_attrs()
