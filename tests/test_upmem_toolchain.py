"""The real UPMEM toolchain's rules, checked without the SDK (issue 14).

The DPU compiler of the UPMEM SDK is a clang (``dpu-upmem-dpurte-clang``): 32-bit pointers,
``__mram_ptr`` an address space, ``mram_read``/``mram_write`` size checks at compile time, and
clang's warnings under the generated Makefile's ``-Wall -Wextra -Werror``. The emulator builds
with gcc, which misses some of them (an unused ``static inline`` function is a clang warning,
not a gcc one). So every kind of generated ``dpu.c`` is compiled here with clang under the DPU
data model (``--target=i386``: ILP32 like the DPU; ``-ffreestanding``, since the DPU program
includes only ``<stdint.h>`` and the SDK headers and needs no 32-bit libc), and every ``host.c``
with both gcc and clang, all with ``-Wall -Wextra -Werror``; and the emulator headers are shown
to reject what the SDK's reject. clang comes from Debian (``.ci/run`` installs it).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from onnx_cinm.devices.upmem import codegen
from onnx_cinm.sim import upmem_emu as emu

CLANG = shutil.which("clang")
GCC = shutil.which("gcc")
#: the DPU data model: 32-bit int, long and pointers, no hosted libc
DPU_MODEL = ("--target=i386-unknown-linux-gnu", "-ffreestanding")
WARN = ("-Wall", "-Wextra", "-Werror")


def _clang() -> str:
    if not CLANG:  # CI installs it (.ci/run); a missing clang must not pass silently
        pytest.fail("clang is not installed: apt-get install clang (the DPU compiler is a clang)")
    return CLANG


def _cases():
    """``(kind, dtype, shapes, params)``: every kernel kind, every dtype it takes and every
    variant that changes the generated code (merge strategies, PrIM's tiles, operators)."""
    for dt in codegen.ELEMENTWISE_DTYPES:
        for op in codegen.BINARY:
            yield "binary", dt, [(5, 37), (37,)], dict(op=op)
        for op in codegen.UNARY:
            if dt != "float32" and (op in codegen.TRANSCENDENTAL or op in ("LeakyRelu", "HardSigmoid", "Gelu")):
                continue
            yield "unary", dt, [(37,)], dict(op=op, **({"min": -1, "max": 1} if op == "Clip" else {}))
    yield "unary", "float32", [(37,)], dict(op="Gelu", approximate="tanh")
    for dt in codegen.DTYPES:
        for relu in (False, True):
            yield "gemm", dt, [(5, 9), (9, 6), (6,)], dict(bias=True, relu=relu)
        yield "gemm", dt, [(2, 5, 9), (9, 6)], dict(prim_tiles=True)
        yield "gemv", dt, [(13, 9), (9,)], {}
        yield "mlp", dt, [(5, 9), (9, 6), (6,)], {}
        for rk in codegen.REDUCE:
            for merge in ("tree", "host"):
                yield "reduce", dt, [(4, 37)], dict(reduce=rk, axes=[1], keepdims=0, merge=merge)
            yield "reduce", dt, [(4, 37)], dict(reduce=rk, axes=[0], keepdims=1)
        for merge in ("tree", "mutex"):
            yield "histogram", dt, [(99,)], dict(bins=13, min=-50, max=60, merge=merge)
        yield "histogram", dt, [(99,)], dict(bins=16, min=0, max=64)
        yield "compress", dt, [(37,), (37,)], {}
        for ex, rv in ((0, 0), (1, 1)):
            yield "scan", dt, [(37,)], dict(axis=0, exclusive=ex, reverse=rv)
        yield "transpose", dt, [(9, 7)], dict(perm=[1, 0])
        yield "transpose", dt, [(4, 3, 30)], dict(perm=[2, 0, 1])
        for largest in (0, 1):
            yield "topk", dt, [(37,)], dict(k=3, axis=0, largest=largest)
        yield "im2col", dt, [(1, 2, 9, 11)], dict(kernel_shape=[3, 3], strides=[2, 1],
                                                  pads=[1, 0, 1, 2], dilations=[1, 2])
    for dt in ("bool", "uint8", "uint16", "uint32", "uint64"):
        yield "popcount", dt, [(37,)], {}
    for metric in ("dot", "cos"):
        yield "simsearch", "float32", [(3, 17), (20, 17)], dict(k=4, metric=metric)
    # rows (slices of rows split over 2 tasklets) that fit one block (64 B here) and rows
    # (slices) streamed through it; LayerNorm with and without B
    for shape in ((5, 9), (3, 37)):
        for lanes in (1, 2):
            yield "softmax", "float32", [shape], dict(lanes=lanes)
            yield "layernorm", "float32", [shape, shape[1:], shape[1:]], dict(axis=-1, epsilon=1e-5,
                                                                              lanes=lanes)
    yield "layernorm", "float32", [(3, 37), (37,)], dict(axis=1, epsilon=1e-5)


def test_the_corpus_covers_every_kernel_kind():
    assert {c[0] for c in _cases()} == set(codegen.KINDS)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """``{kind: [kernel dirs]}``: every case of :func:`_cases` emitted (7 DPUs, 11 tasklets),
    the first of each kind also with PrIM's unrolling (1)."""
    root = tmp_path_factory.mktemp("toolchain")
    out: dict = {}
    for i, (kind, dt, shapes, params) in enumerate(_cases()):
        for unroll in ((8, 1) if kind not in out else (8,)):
            d = root / f"{i:03d}-{kind}-{dt}-u{unroll}"
            codegen.emit_kernel(kind, dt, shapes, dpus=7, tasklets=11, block_bytes=64, outdir=d,
                                unroll=unroll, **dict(params))
            out.setdefault(kind, []).append(d)
    return out


def _compile(cmd: list, files: list) -> None:
    r = subprocess.run([*cmd, *map(str, files)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


@pytest.mark.parametrize("kind", codegen.KINDS)
def test_every_dpu_program_compiles_with_clang_under_the_dpu_data_model(corpus, kind):
    _compile([_clang(), *DPU_MODEL, "-fsyntax-only", *WARN, "-I", str(emu.INCLUDE),
              "-DNR_TASKLETS=11"], [d / "dpu.c" for d in corpus[kind]])


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("kind", codegen.KINDS)
def test_every_host_program_compiles_with_gcc_and_clang(corpus, kind, cc):
    exe = _clang() if cc == "clang" else GCC
    # the generated Makefile's HOST_CFLAGS (-O3 -std=c11 -Wall -Wextra -Werror), syntax only
    _compile([exe, "-std=c11", "-fsyntax-only", *WARN, "-I", str(emu.INCLUDE)],
             [d / "host.c" for d in corpus[kind]])


def test_float32_transcendentals_define_only_the_helpers_they_call(tmp_path):
    """Regression (issue 14): float32 Exp/Log/Sqrt/Sigmoid/Tanh carried every software math
    helper; clang rejects the unused ``static inline`` ones under -Werror (gcc says nothing)."""
    want = {"Exp": {"emu_exp", "emu_exp2i"}, "Sigmoid": {"emu_exp", "emu_exp2i"},
            "Tanh": {"emu_expm1", "emu_exp", "emu_exp2i"}, "Log": {"emu_log"}, "Sqrt": {"emu_sqrt"}}
    for op, helpers in want.items():
        codegen.emit_kernel("unary", "float32", [(9,)], dpus=1, tasklets=1, block_bytes=64,
                            outdir=tmp_path / op, op=op)
        src = (tmp_path / op / "dpu.c").read_text()
        defined = {h for h in codegen.MATH_HELPER_DEPS if f"static inline double {h}(" in src}
        assert defined == helpers, op


# -- the emulator headers reject what the SDK's reject -----------------------------------------

_PRELUDE = """#include <stdint.h>
#include <defs.h>
#include <mram.h>
#include <barrier.h>
#include <mutex.h>
__dma_aligned uint64_t buf[32];
"""
_GOOD = """BARRIER_INIT(b, NR_TASKLETS);
MUTEX_INIT(m);
int main(void)
{
    uintptr_t heap = (uintptr_t)DPU_MRAM_HEAP_POINTER;
    unsigned n = (unsigned)buf[0];
    mram_read((__mram_ptr void const *)(heap + 8), buf, 64);
    mram_read((__mram_ptr void const *)heap, buf, n);   /* not constant: checked at run time */
    mram_write(buf, (__mram_ptr void *)(heap + 64), 2048);
    barrier_wait(&b);
    return 0;
}
"""
#: (name, compilers that must reject it, body of main, expected diagnostic fragment)
_BAD = [
    ("swapped mram_read arguments", ("clang",),
     "mram_read(buf, DPU_MRAM_HEAP_POINTER, 64);", "changes address space"),
    ("swapped mram_write arguments", ("clang",),
     "mram_write(DPU_MRAM_HEAP_POINTER, buf, 64);", "changes address space"),
    ("constant size not a multiple of 8", ("clang", "gcc"),
     "mram_read(DPU_MRAM_HEAP_POINTER, buf, 12);", "multiple of 8"),
    ("constant size over 2048", ("clang", "gcc"),
     "mram_write(buf, DPU_MRAM_HEAP_POINTER, 4096);", "2048"),
    ("constant size under 8", ("clang", "gcc"),
     "mram_read(DPU_MRAM_HEAP_POINTER, buf, 0);", "2048"),
    ("BARRIER_INIT at block scope", ("clang", "gcc"),
     "BARRIER_INIT(local, NR_TASKLETS); barrier_wait(&local);", "must_be_at_file_scope"),
    ("MUTEX_INIT at block scope", ("clang", "gcc"),
     "MUTEX_INIT(local); mutex_lock(local);", "must_be_at_file_scope"),
]


def _dpu_compile(tmp_path, cc: str, src: str) -> subprocess.CompletedProcess:
    f = tmp_path / "dpu.c"
    f.write_text(src)
    if cc == "clang":
        cmd = [_clang(), *DPU_MODEL, "-fsyntax-only"]
    else:  # as the emulator builds the DPU program (the size check needs -O1 or more)
        cmd = [GCC, *emu.CFLAGS, "-c", "-o", str(tmp_path / "dpu.o")]
    return subprocess.run([*cmd, *WARN, "-I", str(emu.INCLUDE), "-DNR_TASKLETS=16", str(f)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("cc", ["clang", "gcc"])
def test_a_correct_dpu_program_compiles(tmp_path, cc):
    r = _dpu_compile(tmp_path, cc, _PRELUDE + _GOOD)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("cc", ["clang", "gcc"])
@pytest.mark.parametrize("name,rejecters,body,msg", _BAD, ids=[b[0] for b in _BAD])
def test_the_headers_reject_what_the_sdk_rejects(tmp_path, cc, name, rejecters, body, msg):
    if cc not in rejecters:
        pytest.skip(f"gcc has no address spaces: {name} is caught by the clang check only")
    src = _PRELUDE + "int main(void)\n{\n    " + body + "\n    return 0;\n}\n"
    r = _dpu_compile(tmp_path, cc, src)
    assert r.returncode != 0, f"{cc} accepted {name}"
    assert msg in r.stderr, r.stderr


def test_a_barrier_count_over_127_is_rejected(tmp_path):
    """The SDK encodes a barrier's count in a byte (< 128, field notes upmem.md §1.3)."""
    src = _PRELUDE + "BARRIER_INIT(b, 128);\nint main(void) { barrier_wait(&b); return 0; }\n"
    for cc in ("clang", "gcc"):
        r = _dpu_compile(tmp_path, cc, src)
        assert r.returncode != 0 and "1..127" in r.stderr, (cc, r.stderr)


def test_a_kernel_built_by_clang_runs_in_the_emulator(tmp_path, monkeypatch):
    """With CC=clang the emulator's DPU program carries real address-space casts; it must
    still compute the right thing."""
    import numpy as np

    _clang()
    monkeypatch.setenv("CC", CLANG)
    monkeypatch.setattr(emu, "_GCC_VERSION", None)
    monkeypatch.setenv("ONNX_CINM_CACHE", str(tmp_path / "cache"))
    codegen.emit_kernel("binary", "int32", [(100,), (100,)], dpus=3, tasklets=5, block_bytes=64,
                        outdir=tmp_path / "k", op="Sub")
    a = np.arange(100, dtype=np.int32) * 7 - 300
    b = np.arange(100, dtype=np.int32)[::-1].copy()
    (y,), _ = emu.run_kernel(tmp_path / "k", [a, b])
    np.testing.assert_array_equal(y, a - b)
    assert Path(tmp_path / "cache").is_dir()
