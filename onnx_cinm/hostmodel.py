"""A roofline model of the host CPU, measured once and cached.

Cost placement compares every device with running the op on the host. The host's cost of an op
is a roofline: ``latency = max(flops / flops_per_s, bytes / bytes_per_s)`` seconds, where
``bytes`` are the op's inputs and outputs, and ``energy = latency * power_w`` joules.

``flops_per_s`` and ``bytes_per_s`` are measured on this machine by a small numpy probe
(:func:`measure`): a float32 matrix product (2 * n^3 FLOPs) and a large array copy (read plus
write bytes), best of a few repetitions. The result is cached as JSON in
``$XDG_CACHE_HOME/onnx-cinm/host_roofline.json`` (``~/.cache/onnx-cinm/`` by default), keyed by
the host name, CPU count and numpy version, so the probe runs once per machine.

Override, in this order of precedence (an explicit option wins over the environment):

* the ``host_roofline`` pass option (a :class:`HostRoofline` or a ``"GFLOPS,GBPS[,WATTS]"`` string;
  CLI ``--host-roofline``);
* ``ONNX_CINM_HOST_ROOFLINE="GFLOPS,GBPS[,WATTS]"`` in the environment, e.g. ``"50,10"``;
* :data:`NOMINAL` (``"nominal"``): fixed, unmeasured figures for deterministic tests.

``power_w`` is not measured (no portable power counter): 30 W is an *assumption*, the same order
as the host power the UPMEM cost model charges while the host works (``UpmemCostParams
.host_power_w``, itself an estimate), so host and DPU energies are on one footing.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import frontend
from .errors import CinmError

#: Host power while it computes, watts (*assumption*, see the module docstring).
DEFAULT_POWER_W = 30.0


@dataclass(frozen=True)
class HostRoofline:
    """Peak rates of the host.

    Attributes:
        flops_per_s: arithmetic throughput, FLOP/s (measured float32 matrix product).
        bytes_per_s: memory bandwidth, bytes/s (measured array copy, read + write bytes).
        power_w: power while computing, watts (*assumption*: 30 W).
        source: where the figures come from (``measured ...``, ``env``, ``option``, ``nominal``).
    """

    flops_per_s: float
    bytes_per_s: float
    power_w: float = DEFAULT_POWER_W
    source: str = "nominal"

    def latency_s(self, flops: float, nbytes: float) -> float:
        """Roofline time of ``flops`` FLOPs touching ``nbytes`` bytes, seconds."""
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)

    def energy_j(self, flops: float, nbytes: float) -> float:
        """Energy of the same work, joules (time x ``power_w``)."""
        return self.latency_s(flops, nbytes) * self.power_w


#: Fixed figures for tests and reproducible benchmarks (not a measurement): 50 GFLOP/s, 10 GB/s,
#: 30 W -- the order of one desktop core with AVX2 and one DDR4 channel.
NOMINAL = HostRoofline(50e9, 10e9, DEFAULT_POWER_W, "nominal")


def parse(text: str, source: str = "option") -> HostRoofline:
    """``"GFLOPS,GBPS[,WATTS]"`` (or ``"nominal"``) as a :class:`HostRoofline`.

    Raises CinmError on anything else (non-numbers, non-positive values).
    """
    if text.strip().lower() == "nominal":
        return NOMINAL
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) not in (2, 3) or not all(v > 0 and v < float("inf") for v in vals):
        where = f" (from {source})" if source != "option" else ""
        raise CinmError(f"host roofline expects GFLOPS,GBPS[,WATTS] with positive numbers "
                        f"(or 'nominal'), got '{text}'{where}")
    power = vals[2] if len(vals) == 3 else DEFAULT_POWER_W
    return HostRoofline(vals[0] * 1e9, vals[1] * 1e9, power, source)


def cache_path() -> Path:
    """Where the measured roofline is cached (``$XDG_CACHE_HOME/onnx-cinm/host_roofline.json``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "onnx-cinm" / "host_roofline.json"


def _machine_key() -> str:
    import numpy as np

    return f"{platform.node()}|{os.cpu_count()}|{platform.machine()}|numpy {np.__version__}"


def measure(n: int = 512, copy_mb: int = 64, reps: int = 3) -> HostRoofline:
    """Measure this CPU: best of ``reps`` float32 ``n x n`` products (2 n^3 FLOPs each) and
    copies of a ``copy_mb`` MB array (2 x size bytes each: read and write). About 0.3 s."""
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up (BLAS thread pool, page faults)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    flops = 2.0 * n ** 3 / max(best, 1e-9)
    src = np.ones(copy_mb * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    bw = 2.0 * src.nbytes / max(best, 1e-9)
    return HostRoofline(flops, bw, DEFAULT_POWER_W, f"measured on {platform.node() or 'this host'}")


_memo: HostRoofline | None = None


def get(option=None) -> HostRoofline:
    """The host roofline to use: ``option`` (a HostRoofline or a string for :func:`parse`),
    then the ``ONNX_CINM_HOST_ROOFLINE`` environment variable, then the cached measurement
    (measured and cached if missing).

    A cache that cannot be read or written is ignored (the probe simply runs again).
    """
    global _memo
    if isinstance(option, HostRoofline):
        return option
    if isinstance(option, str) and option:
        return parse(option)
    env = os.environ.get("ONNX_CINM_HOST_ROOFLINE")
    if env:
        return parse(env, "env ONNX_CINM_HOST_ROOFLINE")
    if _memo is not None:
        return _memo
    path, key = cache_path(), _machine_key()
    try:
        data = json.loads(path.read_text())
        if data.get("key") == key:
            r = data["roofline"]
            _memo = HostRoofline(float(r["flops_per_s"]), float(r["bytes_per_s"]),
                                 float(r.get("power_w", DEFAULT_POWER_W)), str(r["source"]))
            return _memo
    except (OSError, ValueError, KeyError, TypeError):
        pass
    _memo = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        frontend.write_file_atomic(path, json.dumps({"key": key, "roofline": asdict(_memo)}, indent=1))
    except OSError:
        pass
    return _memo
