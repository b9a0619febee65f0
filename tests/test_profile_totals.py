"""The profile's per-device totals: a figure no row of a device has stays "-" (not modeled).

The finding: ``onnx-cinm run lenet_opt.onnx --random 3 --profile`` printed the host's rows
with "-" for modeled latency and energy, and then a host total of "0 s 0 J" with basis
"plan", as if the host had been modeled and cost nothing.
"""
from __future__ import annotations

from onnx_cinm.runtime.profile import table, totals_by_device


def _records():
    rec = lambda node, dev, mode, wall, lat, en, basis, nodes=1: dict(  # noqa: E731
        run=0, node=node, op_type="Op", device=dev, mode=mode, wall_s=wall, latency_s=lat,
        energy_j=en, writes=0, bytes_moved=None if mode == "numpy" else 0, nodes=nodes,
        basis=basis)
    return [rec("im2col", "host", "numpy", 2e-3, None, None, "plan"),
            rec("host partition 0", "host", "onnxruntime", 1e-3, None, None, None, 2),
            rec("gemm", "memristor", "simulate", 5e-4, 104e-6, 10.5e-6, "run"),
            rec("gemm2", "memristor", "simulate", 5e-4, 13.3e-6, 1.34e-6, "run")]


def test_unmodeled_device_totals_are_none():
    tot = {t["device"]: t for t in totals_by_device(_records())}
    assert tot["host"]["latency_s"] is None and tot["host"]["energy_j"] is None
    assert tot["host"]["wall_s"] == 3e-3
    assert tot["memristor"]["latency_s"] == 104e-6 + 13.3e-6
    assert tot["memristor"]["energy_j"] == 10.5e-6 + 1.34e-6


def test_host_total_line_prints_dashes():
    lines = table(_records()).splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("total host"))
    mem = next(line for line in lines if line.startswith("total memristor")).split()
    # its label is longer than the node column but spans the empty op, device and mode cells
    # after it: the figures follow on its line
    assert lines[i].startswith("total host (1 partition, 2 nodes; 1 on numpy)  ")
    host = lines[i][len("total host (1 partition, 2 nodes; 1 on numpy)"):].split()
    # wall 3 ms, modeled -, energy -, no basis, writes 0, bytes 0 B
    assert host == ["3", "ms", "-", "-", "0", "0", "B"]
    assert "117" in mem and "us" in mem and "11.8" in mem and "run" in mem  # 117.3 us, 11.84 uJ


def test_a_device_with_no_wall_time_of_its_own_is_not_0_s_in_the_median_line():
    """upmem nodes in model mode run inside host partitions (wall None): the median-per-run
    line says so, as their total row's '-' does, instead of 'upmem 0 s' (a fresh user, s35:
    it read as free); the host's median is its runs' sum, 3 ms."""
    recs = []
    for run in range(3):
        recs += [{**r, "run": run} for r in _records()]
        recs.append(dict(run=run, node="relu", op_type="Relu", device="upmem", mode="model",
                         wall_s=None, latency_s=2e-6, energy_j=1e-6, writes=0, bytes_moved=0,
                         nodes=1, basis="plan", in_partition=True))
    text = table(recs)
    line = next(ln for ln in text.splitlines() if ln.startswith("median wall per run"))
    assert line.endswith("host 3 ms, memristor 1 ms, upmem - (in host partitions)"), line
