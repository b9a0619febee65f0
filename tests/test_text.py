"""The one number formatter and the one table printer (issue 13: four SI formatters and five
hand-aligned table printers, each slightly different)."""
from __future__ import annotations

import pytest

from onnx_cinm.text import Column, fold_rows, si, source_name, table


@pytest.mark.parametrize("x, unit, want", [
    (1.5e-6, "s", "1.5 us"), (2.5e9, "FLOP", "2.5 GFLOP"), (0, "J", "0 J"), (512, "", "512"),
    (149_000, "B", "149 kB"), (-3e-9, "J", "-3 nJ"), (4.2e12, "B", "4.2 TB"),
    (999.96, "B", "1 kB"),          # rounds up to the next prefix, not "1e+03 B"
    (4e-13, "J", "400 fJ"), (1e-14, "s", "10 fs"), (1e-19, "J", "1.00e-19 J"), (None, "s", "-"),
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
    # one stand whole on its own line instead of widening every row, the rest of its row
    # below in the columns (a fresh user, s27: deepcut's long kernel names shifted their rows)
    assert table([Column("k", fit=3), "v"], [("ab", "x"), ("abcdef", "y")], header=False,
                 indent="  ").splitlines() == ["  ab  x", "  abcdef", "      y"]
    assert table([Column("k", fit=3), Column("n", ">")], [("ab", 1), ("abcdef", 22)],
                 totals=[("total of all", 23)]).splitlines() == [
        "k    n", "------", "ab   1", "abcdef", "    22", "------", "total of all", "    23"]
    assert table([Column("k", fit=3), "v"], [("abcdef", "")]).splitlines()[2] == "abcdef"
    # a long cell followed by empty cells spans them when it fits there (a profile's total row
    # over the op, device and mode columns); a longer one still stands on its own line
    cols = [Column("k", fit=3), "op", "dev", Column("n", ">")]
    rows = [("ab", "Gemm", "host", 1)]
    assert table(cols, rows, totals=[("total (3 x)", "", "", 23)]).splitlines()[-1] == \
        "total (3 x)     23"  # k 2 + 2 + op 4 + 2 + dev 4 = 14 wide, then "  " and n
    assert table(cols, rows, totals=[("total of all of it", "", "", 23)]).splitlines()[-2:] == \
        ["total of all of it", "                23"]


def test_fold_rows_folds_one_source_ops_repeats_and_keeps_the_sums():
    # an unrolled recurrence's steps: Gemm_2..Gemm_4 share a tile set (same figures), Gemm_1
    # owns it (other figures), Gemm is the input projection; wall times differ per row
    rows = [("r/Gemm", "201x266", 26.7e-6, 5.0),
            ("r/Gemm_1", "1x25", 1.0e-7, 1.0),
            ("host partition 1", "3 nodes", None, 2.0),
            ("r/Gemm_2", "1x25", 1.33e-7, 3.0),
            ("host partition 2", "3 nodes", None, 4.0),
            ("r/Gemm_3", "1x25", 1.33e-7, 6.0),
            ("q/Gemm_2", "1x25", 1.33e-7, 1.0),   # another source op: not folded with r's
            ("r/Gemm_4", "1x25", 1.33e-7, None)]
    got = fold_rows(rows, add=(3,), times=(2,))
    assert [(c, m) for c, m in got] == [
        (["r/Gemm", "201x266", 26.7e-6, 5.0], [0]),
        (["r/Gemm_1", "1x25", 1.0e-7, 1.0], [1]),
        (["host partition 1 x2", "3 nodes", None, 6.0], [2, 4]),
        (["r/Gemm_2 x3", "1x25", pytest.approx(3 * 1.33e-7), 9.0], [3, 5, 7]),  # None adds nothing
        (["q/Gemm_2", "1x25", 1.33e-7, 1.0], [6])]
    # the folded rows' counts and summed columns add up to the rows given
    assert sum(len(m) for _, m in got) == len(rows)
    assert sum(c[3] for c, _ in got) == pytest.approx(5 + 1 + 2 + 3 + 4 + 6 + 1)
    assert sum(c[2] or 0 for c, _ in got) == pytest.approx(26.7e-6 + 1e-7 + 4 * 1.33e-7)
    # a skipped column (an index) does not split a group and keeps the first row's value
    assert fold_rows([(7, "a/Add_1", 1), (9, "a/Add_2", 1), (11, "a/Add_3", 2)], name=1,
                     skip=(0,)) == [([7, "a/Add_1 x2", 1], [0, 1]), ([11, "a/Add_3", 2], [2])]
    assert source_name("lstm_node_3/Gemm_17") == "lstm_node_3/Gemm"
    assert source_name("lstm_node_3/Gemm") == "lstm_node_3/Gemm"
    assert source_name("/dec/If_1[else] host partition 0") == "/dec/If_1[else] host partition"


def test_fold_rows_never_folds_ops_an_exporter_named_alike():
    """Conv_0 and Conv_2 (a legacy exporter's names; restored host ops keep them) are two
    layers of their own, even with equal figures: not one op's copies, so two rows; so are
    a/Conv_1 and b/Conv_1 (copies of two source ops)."""
    rows = [("Conv_0", "Conv", 1.0), ("Relu_1", "Relu", 2.0), ("Conv_2", "Conv", 1.0),
            ("a/Conv_1", "Conv", 1.0), ("b/Conv_1", "Conv", 1.0)]
    got = fold_rows(rows)
    assert [c for c, _ in got] == [list(r) for r in rows]
    assert [m for _, m in got] == [[0], [1], [2], [3], [4]]
    assert source_name("Conv_2") is None and source_name("Conv") is None


def test_two_groups_of_one_source_op_get_two_labels():
    """oskut-ws's BiLSTM (s24 trial #7): the two directions' input projections fold, and so do
    the two first recurrent steps, each pair with figures of its own; both rows were labelled
    'LSTM__93/Gemm x2'. Each is now named by its first member."""
    rows = [("LSTM__93/Gemm", "1554x61x768", 1.01e-3),
            ("LSTM__93/Gemm_1", "74x192x768", 2.0e-5),
            ("LSTM__93/Gemm_22", "1554x61x768", 1.01e-3),
            ("LSTM__93/Gemm_23", "74x192x768", 2.0e-5)]
    got = fold_rows(rows)
    assert [(c[0], m) for c, m in got] == [("LSTM__93/Gemm x2", [0, 2]),
                                           ("LSTM__93/Gemm_1 x2", [1, 3])]
    labels = [c[0] for c, _ in got]
    assert len(set(labels)) == len(labels)


def test_a_long_device_table_shows_its_rows_of_most_energy(monkeypatch):
    """A summary table of more rows than TABLE_ROWS (a transformer's distinct kernels) keeps
    the TABLE_ROWS rows of the most energy, in their order, and says what it left out; -v
    (fold False) keeps every row. (TABLE_ROWS set to 40 for the counts below.)"""
    from onnx_cinm import text
    from onnx_cinm.text import folded_kernels

    monkeypatch.setattr(text, "TABLE_ROWS", 40)
    TABLE_ROWS = 40
    n = TABLE_ROWS + 5
    # kernel i of its own source op, energy (i % 7) + 1 J; plus three steps of one recurrence
    rows = [(f"k{i}/Gemm", i) for i in range(n)] + [(f"r/Gemm_{j}", "step") for j in (1, 2, 3)]
    energy = [float(i % 7 + 1) for i in range(n)] + [0.2, 0.2, 0.2]  # the steps: 0.6 J folded
    got, note = folded_kernels(rows, True, energy=energy)
    # 46 rows after folding; the 6 of least energy: the recurrence (0.6 J) and five of the
    # seven kernels of 1 J (i % 7 == 0: i = 0, 7, ..., 42; ties keep the earlier rows)
    left = {14, 21, 28, 35, 42}
    assert [c[0] for c in got] == [f"k{i}/Gemm" for i in range(n) if i not in left]
    assert len(got) == TABLE_ROWS
    total = sum(energy)
    assert (f"6 rows of 8 kernels left out: {100 * (5 * 1.0 + 0.6) / total:.1f}% of the "
            "kernels' energy") in note
    assert "48 kernels in 46 rows" in note
    every, note_v = folded_kernels(rows, False, energy=energy)
    assert len(every) == n + 3 and note_v == ""
