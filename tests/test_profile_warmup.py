"""The profile's wall column leaves the first run's one-time warm-up out.

The finding (s23): ``onnx-cinm run X.onnx --input D.npz --profile`` printed per-node wall means
that included the first run (kernel choice by CPU time, session set-up): run 0 took 712 ms, the
next three 37, 28, 26 ms, so the mean said about 200 ms. The figures below are hand counts.
"""
from __future__ import annotations

from onnx_cinm.runtime.profile import aggregate, steady, table


def _rec(run, node, wall, lat=None, dev="host", mode="onnxruntime"):
    return {"run": run, "node": node, "op_type": "Op", "device": dev, "mode": mode,
            "wall_s": wall, "latency_s": lat, "energy_j": None, "writes": 0, "bytes_moved": 0,
            "nodes": 1, "basis": None}


def _four_runs():
    # the finding's run times on one partition, plus a simulated node with a modeled latency
    recs = []
    for run, (w, x) in enumerate([(0.712, 0.010), (0.037, 0.002), (0.028, 0.003), (0.026, 0.001)]):
        recs += [_rec(run, "part", w), _rec(run, "xbar", x, lat=1e-6 * (run + 1),
                                             dev="memristor", mode="simulate")]
    return recs


def test_wall_is_median_after_first_run_and_modeled_is_mean():
    rows = {r["node"]: r for r in aggregate(_four_runs())}
    assert rows["part"]["wall_s"] == 0.028            # median of 37, 28, 26 ms
    assert rows["xbar"]["wall_s"] == 0.002            # median of 2, 3, 1 ms
    assert abs(rows["xbar"]["latency_s"] - 2.5e-6) < 1e-15  # mean of 1..4 us, all runs
    assert rows["part"]["runs"] == 4
    assert [r["run"] for r in steady(_four_runs())] == [1, 1, 2, 2, 3, 3]


def test_table_shows_first_run_apart():
    text = table(_four_runs())
    assert "first run, including one-time kernel selection: 722 ms" in text  # 712 + 10
    part = next(line for line in text.splitlines() if line.startswith("part ")).split()
    assert part[4:6] == ["28", "ms"]
    # per run after the first: host 37, 28, 26 -> 28; memristor 2, 3, 1 -> 2
    assert ("median wall per run (runs 2-4; the median of each run's sum, where a total row adds "
            "up its nodes' medians): host 28 ms, memristor 2 ms") in text


def test_total_rows_and_the_median_per_run_say_what_they_sum():
    """A fresh user, s27: run --profile's 'total' row and its 'median wall per run' line gave
    different figures without saying why. Nodes a (1, 5, 6 ms in runs 2-4) and b (6, 1, 5 ms):
    medians 5 + 5 = 10 ms in the total row; the runs' sums 7, 6, 11 ms have the median 7 ms."""
    recs = [_rec(0, "a", 0.9), _rec(0, "b", 0.9)]
    for run, (a, b) in enumerate([(0.001, 0.006), (0.005, 0.001), (0.006, 0.005)], start=1):
        recs += [_rec(run, "a", a), _rec(run, "b", b)]
    text = table(recs)
    total = next(line for line in text.splitlines() if line.startswith("total host")).split()
    assert total[-7:-5] == ["10", "ms"]  # wall, then modeled - energy - writes 0 bytes 0 B
    assert ("median wall per run (runs 2-4; the median of each run's sum, where a total row adds "
            "up its nodes' medians): host 7 ms") in text
    assert "a total row's: the sum of its nodes' medians" in text


def test_one_run_says_it_includes_the_warm_up():
    text = table([_rec(0, "part", 0.712)])
    assert "one run: its wall times include the one-time warm-up" in text
    assert "712 ms in all" in text
    assert "first run, including" not in text
    row = next(line for line in text.splitlines() if line.startswith("part ")).split()
    assert row[4:6] == ["712", "ms"]


def test_node_seen_only_in_the_first_run_keeps_its_time():
    # an If branch that ran only in run 0 still gets a wall figure, its only one
    recs = [_rec(0, "a", 0.5), _rec(0, "then", 0.2), _rec(1, "a", 0.1), _rec(2, "a", 0.3)]
    rows = {r["node"]: r for r in aggregate(recs)}
    assert rows["then"]["wall_s"] == 0.2 and rows["a"]["wall_s"] == 0.2  # median of 0.1, 0.3


def test_two_runs_name_the_one_timed_run():
    """Trial s27: ``run --profile`` with two runs printed '(runs 2-2)' for its one timed run."""
    text = table(_four_runs()[:4])  # runs 0 and 1
    assert ("median wall per run (run 2; the median of each run's sum, where a total row adds up "
            "its nodes' medians): host 37 ms, memristor 2 ms") in text
    assert "runs 2-2" not in text
