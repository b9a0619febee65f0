"""UPMEM emulator: build and run generated UPMEM kernels (``host.c`` + ``dpu.c``) without the SDK.

The kernel's sources are compiled with the system ``gcc`` against our own SDK-compatible headers
(``include/``: ``dpu.h`` on the host side; ``mram.h``, ``defs.h``, ``barrier.h``, ``mutex.h``,
``alloc.h``, ``perfcounter.h`` on the DPU side) and a small C runtime (``src/emu_host.c``):

* ``dpu.c`` becomes a shared object ``dpu.so`` (the "DPU binary" the host program loads);
  its writable data is the WRAM image of globals, copied per DPU and swapped in around each
  DPU's launch (globals are per DPU and persist across launches, as on hardware);
  ``__mram_noinit`` variables and ``DPU_MRAM_HEAP_POINTER`` map to a lazily mapped 64 MB MRAM
  per DPU; tasklets are pthreads.
* ``host.c`` is linked with the runtime into an executable ``host`` that runs exactly as it
  would on a machine with DPUs: ``host DPU_BINARY IN_FILES... OUT_FILES...`` (see
  ``docs/upmem-emulator.md``).

Every hardware rule (DMA size and alignment, MRAM range, 64 KB WRAM, <= 24 tasklets, host
transfer alignment, one push length for all DPUs) aborts the program with one line naming the
rule, the DPU, the tasklet and the source file and line; :func:`run_kernel` raises it as
:class:`UpmemRuleError`.

Builds are cached by content hash (sources, headers, runtime, flags, compiler version) under
:func:`cache_dir` (``$ONNX_CINM_CACHE``, else ``$XDG_CACHE_HOME/onnx-cinm/upmem``); a build is written to a temporary
directory and renamed into place, so concurrent processes never see half a build.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ... import usercache
from ...errors import CinmError

__all__ = ["UpmemEmuError", "UpmemBuildError", "UpmemRuleError", "build", "run_kernel",
           "run_program", "cache_dir", "RULES"]

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
SRC = HERE / "src"
#: exit status of a host program stopped by a hardware rule
RULE_EXIT = 86
#: rule names the runtime reports (``upmem-emu: rule <name>: ...``)
RULES = ("dma-size", "dma-wram-align", "dma-mram-align", "mram-range", "wram-size", "tasklets",
         "host-xfer-align", "host-xfer-range", "push-unequal-length", "deadlock", "dpu-fault")
#: warnings are errors: generated code must compile with -Wall -Wextra -Werror (issue 4)
CFLAGS = ("-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing")
_RULE_LINE = re.compile(r"^upmem-emu: rule ([a-z-]+): (.*)$", re.M)


class UpmemEmuError(CinmError):
    """A kernel failed to build or run in the emulator (not a hardware rule)."""


class UpmemBuildError(UpmemEmuError):
    """gcc rejected the kernel's sources; the message carries gcc's diagnostics."""


class UpmemRuleError(UpmemEmuError):
    """The DPU or host program broke a hardware rule.

    Attributes:
        rule: the rule's name (one of :data:`RULES`).
        message: the runtime's one-line report (rule, DPU, tasklet, file:line).
    """

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule
        self.message = message


def cache_dir() -> Path:
    """Where builds are cached: ``$ONNX_CINM_CACHE``, else ``$XDG_CACHE_HOME/onnx-cinm/upmem``
    (``~/.cache/onnx-cinm/upmem`` when XDG_CACHE_HOME is unset or empty, as the XDG base
    directory spec says and as the host roofline's cache does: :func:`onnx_cinm.usercache.cache_dir`);
    without a known home, a private temporary folder of this process, removed at its exit."""
    global _no_home
    env = os.environ.get("ONNX_CINM_CACHE")
    if env:
        return Path(env)
    folder = usercache.cache_dir("upmem")
    if folder is None:
        if _no_home is None:
            _no_home = tempfile.mkdtemp(prefix="onnx_cinm_upmem_")
            atexit.register(shutil.rmtree, _no_home, True)
        folder = _no_home
    return Path(folder)


#: The build folder of a process whose user has no known home (:func:`cache_dir`).
_no_home: str | None = None


def _gcc() -> str:
    return os.environ.get("CC", "gcc")


_GCC_VERSION: str | None = None


def _gcc_version() -> str:
    global _GCC_VERSION
    if _GCC_VERSION is None:
        try:
            _GCC_VERSION = subprocess.run([_gcc(), "--version"], capture_output=True, text=True,
                                          check=True).stdout.splitlines()[0]
        except (OSError, subprocess.CalledProcessError) as e:
            raise UpmemBuildError(f"the emulator needs a C compiler ({_gcc()}): {e}") from e
    return _GCC_VERSION


def _emu_sources_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(list(INCLUDE.glob("*.h")) + list(SRC.glob("*.c"))):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _atomic_build(key: str, make) -> Path:
    """Return ``cache/<key>``; if absent, ``make(tmpdir)`` fills a temp dir renamed into place."""
    root = cache_dir()
    final = root / key
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}-", dir=root))
    try:
        make(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _run_gcc(args: list[str], what: str) -> None:
    r = subprocess.run([_gcc(), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise UpmemBuildError(f"building {what} failed:\n{r.stderr.strip()}")


def _runtime_object() -> Path:
    """The emulator runtime compiled once per content hash: ``emu_host.o``."""
    key = "rt-" + hashlib.sha256((_emu_sources_digest() + _gcc_version() + " ".join(CFLAGS))
                                 .encode()).hexdigest()[:32]

    def make(tmp: Path) -> None:
        _run_gcc([*CFLAGS, "-fPIC", "-I", str(INCLUDE), "-c", str(SRC / "emu_host.c"),
                  "-o", str(tmp / "emu_host.o")], "the emulator runtime")

    return _atomic_build(key, make) / "emu_host.o"


def _make_var(makefile: Path, name: str) -> str | None:
    if not makefile.is_file():
        return None
    m = re.search(rf"^\s*{name}\s*\??=\s*(\S+)\s*$", makefile.read_text(), re.M)
    return m.group(1) if m else None


def kernel_defines(kernel_dir: Path) -> list[str]:
    """The ``-D`` flags the kernel's Makefile gives the DPU compiler: ``NR_TASKLETS`` (and
    ``STACK_SIZE_DEFAULT`` if set), read from ``NAME ?= value`` lines; NR_TASKLETS defaults to 1."""
    mk = Path(kernel_dir) / "Makefile"
    flags = [f"-DNR_TASKLETS={_make_var(mk, 'NR_TASKLETS') or 1}"]
    stack = _make_var(mk, "STACK_SIZE_DEFAULT")
    if stack:
        flags.append(f"-DSTACK_SIZE_DEFAULT={stack}")
    return flags


def build(kernel_dir, *, extra_dpu_flags: tuple = ()) -> Path:
    """Compile ``kernel_dir/{host.c,dpu.c}`` for the emulator (cached) and return the build
    directory holding ``host`` (the executable) and ``dpu.so`` (the DPU program).

    Args:
        kernel_dir: a directory with ``host.c``, ``dpu.c`` (and any ``*.h`` they include) and a
            ``Makefile`` whose ``NR_TASKLETS ?= N`` line gives the tasklet count.
        extra_dpu_flags: more gcc flags for ``dpu.c`` (tests use it for ``-DNR_TASKLETS=25``).

    Raises:
        UpmemBuildError: gcc failed (its diagnostics are in the message).
    """
    kdir = Path(kernel_dir)
    for f in ("host.c", "dpu.c"):
        if not (kdir / f).is_file():
            raise UpmemEmuError(f"{kdir}: no {f}")
    dflags = [*kernel_defines(kdir), *extra_dpu_flags]
    h = hashlib.sha256()
    h.update((_emu_sources_digest() + _gcc_version() + " ".join(CFLAGS) + " ".join(dflags)).encode())
    for p in sorted(kdir.iterdir()):
        if p.suffix in (".c", ".h") and p.is_file():
            h.update(p.name.encode() + b"\0" + p.read_bytes())
    key = "k-" + h.hexdigest()[:32]
    rt = _runtime_object()

    def make(tmp: Path) -> None:
        # the two compilations run concurrently
        dpu = subprocess.Popen(
            [_gcc(), *CFLAGS, "-fPIC", "-shared", "-I", str(INCLUDE), "-I", str(kdir), *dflags,
             str(kdir / "dpu.c"), str(SRC / "emu_dpu_meta.c"), "-o", str(tmp / "dpu.so"),
             "-Wl,-Bsymbolic"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        host = subprocess.Popen(
            [_gcc(), *CFLAGS, "-I", str(INCLUDE), "-I", str(kdir), str(kdir / "host.c"), str(rt),
             "-o", str(tmp / "host"), "-rdynamic", "-ldl", "-lpthread", "-lm"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        errs = []
        for proc, what in ((dpu, "dpu.c"), (host, "host.c")):
            _, err = proc.communicate()
            if proc.returncode != 0:
                errs.append(f"building {kdir / what} failed:\n{err.strip()}")
        if errs:
            raise UpmemBuildError("\n".join(errs))

    return _atomic_build(key, make)


def run_program(kernel_dir, args: list[str], *, cwd=None, timeout: float = 600,
                extra_dpu_flags: tuple = ()) -> tuple[subprocess.CompletedProcess, dict]:
    """Build (cached) and run ``host DPU_BINARY *args``; return ``(process, counters)``.

    Raises:
        UpmemRuleError: the program stopped on a hardware rule.
        UpmemEmuError: any other non-zero exit (stderr in the message).
    """
    bdir = build(kernel_dir, extra_dpu_flags=extra_dpu_flags)
    with tempfile.TemporaryDirectory(prefix="upmem-run-") as tmp:
        counters_path = Path(tmp) / "counters.json"
        env = dict(os.environ, UPMEM_EMU_COUNTERS=str(counters_path))
        t0 = time.perf_counter()
        proc = subprocess.run([str(bdir / "host"), str(bdir / "dpu.so"), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or tmp,
                              env=env)
        wall = time.perf_counter() - t0
        m = _RULE_LINE.search(proc.stderr)
        if proc.returncode == RULE_EXIT and m:
            raise UpmemRuleError(m.group(0), m.group(1))
        if proc.returncode != 0:
            raise UpmemEmuError(f"{kernel_dir}: host program exited with {proc.returncode}:\n"
                                f"{proc.stderr.strip()}")
        counters = json.loads(counters_path.read_text()) if counters_path.is_file() else {}
    counters["wall_s"] = wall
    return proc, counters


def read_manifest(kernel_dir) -> dict:
    """``kernel.json`` of a generated kernel (inputs, outputs, parameters), or ``{}``."""
    p = Path(kernel_dir) / "kernel.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def run_kernel(kernel_dir, inputs: list, outputs: list | None = None, *, timeout: float = 600
               ) -> tuple[list[np.ndarray], dict]:
    """Run a generated kernel on numpy inputs in the emulator.

    Args:
        kernel_dir: the kernel's directory (``host.c``, ``dpu.c``, ``Makefile``, ``kernel.json``,
            constant sidecar files).
        inputs: the runtime inputs, in the order of ``kernel.json["inputs"]`` leaving out the
            constants (entries with a ``const`` sidecar file, passed to the program from the
            kernel directory). Each is written C-contiguous as raw bytes; its dtype and shape
            must equal the manifest's (when there is one).
        outputs: ``[(shape, dtype), ...]``; default ``kernel.json["outputs"]``. A shape of
            ``None`` means "whatever length the program wrote" (1-D; e.g. Compress).

    Returns:
        ``(arrays, counters)``: the outputs, and the emulator's counters (``kernel_cycles``,
        ``kernel_s``, DMA calls and bytes per DPU and tasklet, host transfer bytes, ``wall_s``).

    Raises:
        ValueError: an input disagrees with the manifest.
        UpmemRuleError, UpmemBuildError, UpmemEmuError: see :func:`run_program`.
    """
    kdir = Path(kernel_dir).resolve()
    man = read_manifest(kdir)
    specs_in = man.get("inputs")
    if outputs is None:
        outputs = [(o["shape"], o["dtype"]) for o in man.get("outputs", [])]
    with tempfile.TemporaryDirectory(prefix="upmem-io-") as tmp:
        tmp = Path(tmp)
        args = []
        if specs_in is None:  # no manifest: every input is given
            specs_in = [{"const": None} for _ in inputs]
        runtime = [s for s in specs_in if not s.get("const")]
        if len(runtime) != len(inputs):
            raise ValueError(f"{kdir.name}: expected {len(runtime)} runtime inputs "
                             f"({', '.join(s.get('name', '?') for s in runtime)}), got {len(inputs)}")
        it = iter(inputs)
        for i, spec in enumerate(specs_in):
            if spec.get("const"):
                args.append(kdir / spec["const"])
                continue
            x = np.asarray(next(it))
            if "dtype" in spec:
                want_t, want_s = np.dtype(spec["dtype"]), tuple(spec["shape"])
                if x.dtype != want_t or x.shape != want_s:
                    raise ValueError(f"{kdir.name}: input {spec.get('name', i)} is "
                                     f"{x.dtype}{list(x.shape)}, the kernel was generated for "
                                     f"{want_t}{list(want_s)}")
            p = tmp / f"in{i}.bin"
            np.ascontiguousarray(x).tofile(p)
            args.append(p)
        outs = [tmp / f"out{i}.bin" for i in range(len(outputs))]
        _, counters = run_program(kdir, [*args, *outs], cwd=kdir, timeout=timeout)
        result = []
        for p, (shape, dtype) in zip(outs, outputs):
            a = np.fromfile(p, dtype=np.dtype(dtype))
            if shape is not None:
                shape = tuple(shape)
                if a.size != int(np.prod(shape)):
                    raise UpmemEmuError(f"{kdir.name}: {p.name} holds {a.size} elements, "
                                        f"expected {shape}")
                a = a.reshape(shape)
            result.append(a)
    return result, counters
