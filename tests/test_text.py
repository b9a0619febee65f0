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



#: A template the crossbar code generator renders (any would do: these tests compare compiled code).
_TEMPLATE = "memristor/kernel.xbar.j2"


def _plain_code(name: str) -> bytes:
    """The bytecode of ``name``'s render function as a Jinja environment without any cache
    compiles it (the same options as the code generators')."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("onnx_cinm", "templates"),
                             keep_trailing_newline=True)
    return env.get_template(name).root_render_func.__code__.co_code


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A temporary directory of the test's own, and no bytecode cache made yet."""
    import tempfile

    from onnx_cinm import text
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(text, "_CACHE", [])
    return tmp_path


def test_template_cache_is_written_and_a_corrupt_entry_compiled_afresh(fresh_cache):
    from onnx_cinm.text import template_environment
    first = template_environment(keep_trailing_newline=True).get_template(_TEMPLATE)
    cached = list(fresh_cache.glob("_jinja2-cache-*/*.cache"))
    assert len(cached) == 1  # compiled once, kept in the user's own folder under the tmp dir
    assert first.root_render_func.__code__.co_code == _plain_code(_TEMPLATE)
    cached[0].write_bytes(b"not a compiled template")
    again = template_environment(keep_trailing_newline=True).get_template(_TEMPLATE)
    assert again.root_render_func.__code__.co_code == _plain_code(_TEMPLATE)


def test_template_environment_without_a_cache_folder(fresh_cache, monkeypatch):
    import tempfile

    from onnx_cinm.text import template_environment
    blocker = fresh_cache / "file"
    blocker.write_text("a file where the temporary folder should be")
    monkeypatch.setattr(tempfile, "tempdir", str(blocker))
    env = template_environment(keep_trailing_newline=True)
    assert env.bytecode_cache is None  # compiled in every run, as without the cache
    assert env.get_template(_TEMPLATE).root_render_func.__code__.co_code == _plain_code(_TEMPLATE)
