"""A roofline model of the host CPU: nominal by default, measured on request.

Cost placement compares every device with running the op on the host. The host's cost of an op
is a roofline: ``latency = max(flops / flops_per_s, bytes / bytes_per_s)`` seconds, where
``bytes`` are the data the op moves (its inputs and outputs; none for an op whose output
aliases its input, such as Reshape, and only the small output of Shape and Size:
:func:`onnx_cinm.devices.host.data_bytes`), and ``energy = latency * power_w`` joules.

By default the figures are :data:`NOMINAL` (50 GFLOP/s, 10 GB/s, 30 W): fixed, not measured, so
placement is reproducible -- the same model and options give the same placement on every run
and machine. A measurement is not: on a shared machine the probe read 6.3, 6.7, 145, 7.1 and 6.3
GFLOP/s in five fresh caches (issue 12), and that flipped placements. Where the host's own
figures matter, ask for them:

* ``measure`` (pass option ``host_roofline="measure"``, CLI ``--host-roofline measure``, or
  ``ONNX_CINM_HOST_ROOFLINE=measure``): a small numpy probe (:func:`measure`) -- a float32
  matrix product (2 * n^3 FLOPs) and a large array copy (read plus write bytes), each timed
  several times, the *median* taken (robust to a stray fast or slow repetition). The result is
  cached as JSON in ``$XDG_CACHE_HOME/onnx-cinm/host_roofline.json`` (``~/.cache/onnx-cinm/`` by
  default), keyed by the host name, CPU count and numpy version, so the probe runs once per
  machine; delete the file to measure again.
* ``"GFLOPS,GBPS[,WATTS]"``: figures of your own.

Precedence: the ``host_roofline`` option, then ``ONNX_CINM_HOST_ROOFLINE``, then :data:`NOMINAL`.
``optimize`` prints the figures it used and records them in the model (:data:`METADATA_KEY`), and
``report`` reuses them.

``power_w`` is not measured (no portable power counter): 30 W is an *assumption*, the same order
as the host power the UPMEM cost model charges while the host works (``UpmemParams
.host_power_w``, itself an estimate), so host and DPU energies are on one footing.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import frontend, usercache
from .errors import CinmError

#: Host power while it computes, watts (*assumption*, see the module docstring).
DEFAULT_POWER_W = 30.0


@dataclass(frozen=True)
class HostRoofline:
    """Peak rates of the host.

    Attributes:
        flops_per_s: arithmetic throughput, FLOP/s (nominal 50e9, or a measured float32 matrix
            product).
        bytes_per_s: memory bandwidth, bytes/s (nominal 10e9, or a measured array copy, read +
            write bytes).
        power_w: power while computing, watts (*assumption*: 30 W).
        source: where the figures come from (``nominal``, ``measured ...``, ``env ...``,
            ``option``).
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

    def text(self) -> str:
        """The figures for a person: ``50 GFLOP/s, 10 GB/s, 30 W (nominal)``."""
        return (f"{self.flops_per_s / 1e9:.3g} GFLOP/s, {self.bytes_per_s / 1e9:.3g} GB/s, "
                f"{self.power_w:.3g} W ({self.source})")


#: Fixed figures for tests and reproducible benchmarks (not a measurement): 50 GFLOP/s, 10 GB/s,
#: 30 W -- the order of one desktop core with AVX2 and one DDR4 channel.
NOMINAL = HostRoofline(50e9, 10e9, DEFAULT_POWER_W, "nominal")


#: The ``metadata_props`` key under which ``optimize`` records the figures it used (JSON).
METADATA_KEY = "onnx_cinm.host_roofline"
#: The spelling that asks for the probe.
MEASURE = "measure"


def parse(text: str, source: str = "option") -> HostRoofline:
    """``"GFLOPS,GBPS[,WATTS]"``, ``"nominal"`` or ``"measure"`` (the cached probe,
    :func:`measured`) as a :class:`HostRoofline`.

    Raises CinmError on anything else (non-numbers, non-positive values).
    """
    if text.strip().lower() == "nominal":
        return NOMINAL
    if text.strip().lower() == MEASURE:
        return measured()
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) not in (2, 3) or not all(v > 0 and v < float("inf") for v in vals):
        where = f" (from {source})" if source != "option" else ""
        raise CinmError(f"host roofline expects GFLOPS,GBPS[,WATTS] with positive numbers "
                        f"(or 'nominal' or 'measure'), got '{text}'{where}")
    power = vals[2] if len(vals) == 3 else DEFAULT_POWER_W
    return HostRoofline(vals[0] * 1e9, vals[1] * 1e9, power, source)


def cache_path() -> Path | None:
    """Where the measured roofline is cached (``$XDG_CACHE_HOME/onnx-cinm/host_roofline.json``,
    :func:`onnx_cinm.usercache.cache_dir`); None without a known home (measured every time)."""
    folder = usercache.cache_dir("")
    return None if folder is None else Path(folder) / "host_roofline.json"


def _machine_key() -> str:
    import numpy as np

    return f"{platform.node()}|{os.cpu_count()}|{platform.machine()}|numpy {np.__version__}"


def measure(n: int = 512, copy_mb: int = 64, reps: int = 7) -> HostRoofline:
    """Measure this CPU: the median of ``reps`` timed float32 ``n x n`` products (2 n^3 FLOPs
    each) and of ``reps`` copies of a ``copy_mb`` MB array (2 x size bytes each: read and
    write), after a warm-up of each. The median, not the best, so one repetition that ran alone
    on an idle machine (or was descheduled) does not decide. About 0.5 s."""
    import statistics  # here: only a measurement needs it (2.5 ms of every start-up)

    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up (BLAS thread pool, page faults)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    flops = 2.0 * n ** 3 / max(statistics.median(times), 1e-9)
    src = np.ones(copy_mb * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    bw = 2.0 * src.nbytes / max(statistics.median(times), 1e-9)
    # no power meter here: the power stays the nominal figure, and the source says so
    return HostRoofline(flops, bw, DEFAULT_POWER_W,
                        f"measured on {platform.node() or 'this host'}; power nominal")


_memo: HostRoofline | None = None


def measured() -> HostRoofline:
    """This machine's measured roofline: cached (see the module docstring), measured with
    :func:`measure` and cached if missing. A cache that cannot be read or written is ignored
    (the probe simply runs again)."""
    global _memo
    if _memo is not None:
        return _memo
    path, key = cache_path(), _machine_key()
    try:
        if path is None:
            raise OSError("no cache folder")
        data = json.loads(path.read_text())
        if data.get("key") == key:
            r = data["roofline"]
            _memo = HostRoofline(float(r["flops_per_s"]), float(r["bytes_per_s"]),
                                 float(r.get("power_w", DEFAULT_POWER_W)), str(r["source"]))
            return _memo
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    _memo = measure()
    try:
        if path is None:
            raise OSError("no cache folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        frontend.write_file_atomic(path, json.dumps({"key": key, "roofline": asdict(_memo)}, indent=1))
    except OSError:
        pass
    return _memo


def get(option=None) -> HostRoofline:
    """The host roofline to use: ``option`` (a HostRoofline or a string for :func:`parse`),
    then the ``ONNX_CINM_HOST_ROOFLINE`` environment variable, then :data:`NOMINAL`."""
    if isinstance(option, HostRoofline):
        return option
    if isinstance(option, str) and option:
        return parse(option)
    env = os.environ.get("ONNX_CINM_HOST_ROOFLINE")
    if env:
        return parse(env, "env ONNX_CINM_HOST_ROOFLINE")
    return NOMINAL


def to_json(roof: HostRoofline) -> str:
    """The figures as JSON for :data:`METADATA_KEY`."""
    return json.dumps(asdict(roof), sort_keys=True)


def recorded(model) -> HostRoofline | None:
    """The figures a model was optimized with (its :data:`METADATA_KEY`), or None if it has
    none or they are malformed."""
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            try:
                r = json.loads(p.value)
                roof = HostRoofline(float(r["flops_per_s"]), float(r["bytes_per_s"]),
                                    float(r["power_w"]), str(r["source"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                return None
            ok = all(0 < v < float("inf") for v in (roof.flops_per_s, roof.bytes_per_s,
                                                    roof.power_w))
            return roof if ok else None
    return None
