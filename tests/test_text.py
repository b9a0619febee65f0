"""The one number formatter and the one table printer (issue 13: four SI formatters and five
hand-aligned table printers, each slightly different)."""
from __future__ import annotations

import pytest

from onnx_cinm.text import Column, si, table


@pytest.mark.parametrize("x, unit, want", [
    (1.5e-6, "s", "1.5 us"), (2.5e9, "FLOP", "2.5 GFLOP"), (0, "J", "0 J"), (512, "", "512"),
    (149_000, "B", "149 kB"), (-3e-9, "J", "-3 nJ"), (4.2e12, "B", "4.2 TB"),
    (999.96, "B", "1 kB"),          # rounds up to the next prefix, not "1e+03 B"
    (1e-14, "s", "1.00e-14 s"), (None, "s", "-"),
])
def test_si(x, unit, want):
    assert si(x, unit) == want


def test_table_aligns_escapes_cuts_and_adds_totals():
    text = table(["name", Column("n", ">"), Column("shape", ">", width=5, keep="end")],
                 [("a\nb", 1, "1x2x3x4"), ("ccc\u202e", 1234, "7")],
                 totals=[("total", 1235)], notes=["a note"])
    assert text.splitlines() == [
        "name          n  shape",   # columns 9, 4 and 5 wide, two spaces apart
        "----------------------",
        "a\\nb          1  2x3x4",   # a newline is escaped, not a second row; the shape's end kept
        "ccc\\u202e  1234      7",   # a bidi override is escaped
        "----------------------",
        "total      1235",
        "a note",
    ]
    # without a header: rows alone; a column that fits cells up to 3 characters lets a longer
    # one stand whole instead of widening every row
    assert table([Column("k", fit=3), "v"], [("ab", "x"), ("abcdef", "y")], header=False,
                 indent="  ").splitlines() == ["  ab  x", "  abcdef  y"]
