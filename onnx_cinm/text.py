"""Text for people: names from a model made safe to print, and numbers with SI prefixes.

Node, tensor and output names are arbitrary strings in ONNX. Printed raw, a newline in a name
breaks a table row in two, and a Unicode bidi override (U+202E and friends, the "Trojan Source"
characters, CVE-2021-42574) reorders the rest of the line as a terminal shows it. Every table
and message that shows such a name passes it through :func:`printable`.
"""
from __future__ import annotations

import unicodedata


def _safe(c: str) -> bool:
    return c.isprintable() and unicodedata.category(c) != "Cf"


def printable(text: str) -> str:
    """``text`` with control characters (newline, tab, ESC, ...) and Unicode format characters
    (category Cf: bidi overrides and isolates, zero-width joiners) written as Python escapes
    (``\\n``, ``\\u202e``); other text, accents and CJK included, unchanged."""
    text = str(text)
    if all(_safe(c) for c in text):
        return text
    return "".join(c if _safe(c) else c.encode("unicode_escape").decode("ascii") for c in text)


def si(x: float) -> str:
    """``x`` with an SI prefix, e.g. ``1.25 M`` or ``3.10 u`` (followed by the unit)."""
    if x == 0:
        return "0 "
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    if x >= 1:
        return f"{x:.0f} " if float(x).is_integer() else f"{x:.2f} "
    for unit, scale in (("m", 1e-3), ("u", 1e-6), ("n", 1e-9), ("p", 1e-12)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.2e} "
