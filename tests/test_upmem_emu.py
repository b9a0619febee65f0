"""The UPMEM emulator: SDK semantics (per-DPU WRAM that persists, MRAM, tasklets, barriers,
mutexes, counters) and one deliberately broken program per hardware rule.

Each program here is a few lines of host C and DPU C written for the test; builds are cached by
content hash, so a second run compiles nothing.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from onnx_cinm.sim import upmem_emu as emu

HOST_HEAD = """\
#include <dpu.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
"""

DPU_HEAD = """\
#include <stdint.h>
#include <defs.h>
#include <mram.h>
#include <alloc.h>
#include <barrier.h>
#include <mutex.h>
#include <perfcounter.h>
"""


def _kernel(tmp_path, name, dpu_body, host_body, tasklets=4, stack=None):
    d = tmp_path / name
    d.mkdir()
    mk = f"NR_TASKLETS ?= {tasklets}\n" + (f"STACK_SIZE_DEFAULT ?= {stack}\n" if stack else "")
    (d / "Makefile").write_text(mk)
    (d / "dpu.c").write_text(DPU_HEAD + textwrap.dedent(dpu_body))
    (d / "host.c").write_text(HOST_HEAD + textwrap.dedent(host_body))
    return d


def _line_of(path, needle):
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(needle)


# A host that loads the program on N DPUs, launches once and frees.
def _launch_host(n=2):
    return f"""
    int main(int argc, char **argv) {{
        (void)argc;
        struct dpu_set_t set;
        DPU_ASSERT(dpu_alloc({n}, NULL, &set));
        DPU_ASSERT(dpu_load(set, argv[1], NULL));
        DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
        DPU_ASSERT(dpu_free(set));
        return 0;
    }}
    """


# ------------------------------------------------------------------------------------------
# semantics


STATE_DPU = """
__host uint64_t launches;          /* WRAM global: per DPU, persists across launches */
__host uint64_t seen[NR_TASKLETS];
__host uint64_t id;
__mram_noinit uint64_t table[16];  /* MRAM global, filled by the host by symbol */
BARRIER_INIT(bar, NR_TASKLETS);
MUTEX_INIT(lock);
__host uint64_t shared_sum;
__dma_aligned uint64_t buf[NR_TASKLETS][2];

int main(void) {
    uint32_t t = me();
    if (t == 0) { launches++; mem_reset(); }
    barrier_wait(&bar);
    /* each tasklet reads two table words, writes them back plus its DPU id */
    mram_read(&table[2 * t], buf[t], 16);
    seen[t] += buf[t][0] + buf[t][1];
    buf[t][0] += id;
    buf[t][1] += id;
    mram_write(buf[t], &table[2 * t], 16);
    mutex_lock(lock);
    shared_sum += t + 1;
    mutex_unlock(lock);
    EMU_COUNT(10);
    barrier_wait(&bar);
    return 0;
}
"""

STATE_HOST = """
int main(int argc, char **argv) {
    (void)argc;
    struct dpu_set_t set, dpu;
    uint32_t i, nr;
    DPU_ASSERT(dpu_alloc(3, NULL, &set));
    DPU_ASSERT(dpu_load(set, argv[1], NULL));
    DPU_ASSERT(dpu_get_nr_dpus(set, &nr));
    uint64_t ids[3], table[3][16];
    DPU_FOREACH(set, dpu, i) {
        ids[i] = 100 * (i + 1);
        for (int k = 0; k < 16; k++) table[i][k] = 1000 * i + k;
        DPU_ASSERT(dpu_prepare_xfer(dpu, &ids[i]));
    }
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_TO_DPU, "id", 0, 8, DPU_XFER_DEFAULT));
    DPU_FOREACH(set, dpu, i) { DPU_ASSERT(dpu_prepare_xfer(dpu, table[i])); }
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_TO_DPU, "table", 0, sizeof table[0], DPU_XFER_DEFAULT));
    DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
    DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
    uint64_t launches[3], seen[3][4], sums[3];
    DPU_FOREACH(set, dpu, i) { DPU_ASSERT(dpu_prepare_xfer(dpu, &launches[i])); }
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_FROM_DPU, "launches", 0, 8, DPU_XFER_DEFAULT));
    DPU_FOREACH(set, dpu, i) { DPU_ASSERT(dpu_prepare_xfer(dpu, seen[i])); }
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_FROM_DPU, "seen", 0, sizeof seen[0], DPU_XFER_DEFAULT));
    DPU_FOREACH(set, dpu, i) {
        DPU_ASSERT(dpu_copy_from(dpu, "shared_sum", 0, &sums[i], 8));
        DPU_ASSERT(dpu_copy_from(dpu, "table", 0, table[i], sizeof table[i]));
    }
    printf("nr %u copy_from_all %d\\n", nr, (int)dpu_copy_from(set, "id", 0, ids, 8));
    for (i = 0; i < 3; i++)
        printf("dpu %u launches %llu seen %llu %llu %llu %llu sum %llu t0 %llu t15 %llu\\n", i,
               (unsigned long long)launches[i], (unsigned long long)seen[i][0],
               (unsigned long long)seen[i][1], (unsigned long long)seen[i][2],
               (unsigned long long)seen[i][3], (unsigned long long)sums[i],
               (unsigned long long)table[i][0], (unsigned long long)table[i][15]);
    DPU_ASSERT(dpu_free(set));
    return 0;
}
"""


def test_globals_are_per_dpu_and_persist_mram_noinit_barriers_mutexes(tmp_path):
    k = _kernel(tmp_path, "state", STATE_DPU, STATE_HOST, tasklets=4)
    proc, c = emu.run_program(k, [])
    lines = proc.stdout.splitlines()
    assert lines[0] == f"nr 3 copy_from_all {int(5)}"  # DPU_ERR_INVALID_DPU_SET on a multi-DPU set
    for i in range(3):
        base, dpu_id = 1000 * i, 100 * (i + 1)
        # launch 1 sees table words 2t, 2t+1; launch 2 sees them plus id each
        seen = [2 * (base + 2 * t) + 1 + 2 * (base + 2 * t) + 1 + 2 * dpu_id for t in range(4)]
        sums = 2 * (1 + 2 + 3 + 4)
        t0, t15 = base + 2 * dpu_id, base + 15  # tasklets cover words 0..7 only
        assert lines[1 + i] == (f"dpu {i} launches 2 seen {seen[0]} {seen[1]} {seen[2]} {seen[3]} "
                                f"sum {sums} t0 {t0} t15 {t15}")
    # counters: 3 DPUs x 4 tasklets x 2 launches, one 16-byte read and write each
    tot = c["totals"]
    assert tot["dma_reads"] == tot["dma_writes"] == 24
    assert tot["dma_read_bytes"] == tot["dma_write_bytes"] == 24 * 16
    assert tot["instructions"] == 24 * 10
    assert tot["barriers"] == 24 * 2
    assert c["launches"] == 2 and c["nr_dpus"] == 3 and c["nr_tasklets"] == 4
    # per launch and DPU, phases between barriers: before the first barrier nothing; the barrier
    # 4 tasklets x 6 instructions x 11 = 264; then DMA 4 x (77 + 8) + 4 x (61 + 8) = 616 cycles >
    # one tasklet's chain 10 x 11 + 85 + 69 = 264 > 40 instructions; the second barrier 264
    assert c["kernel_cycles"] == pytest.approx(2 * (264 + 616 + 264))
    assert c["per_dpu"][0]["sync_cycles"] == pytest.approx(2 * 2 * 264)
    assert c["per_dpu"][1]["tasklets"][3]["dma_reads"] == 2
    assert c["h2d_bytes"] == 3 * 8 + 3 * 128


def test_cycles_count_barriers_and_serialized_critical_sections(tmp_path):
    """Phases between barriers are costed like the cost model's kernel_cycles, barriers cost
    T x 6 x 11 cycles, and critical sections of different tasklets serialize."""
    dpu = """
    BARRIER_INIT(bar, NR_TASKLETS);
    MUTEX_INIT(lock);
    __host uint64_t total;
    int main(void) {
        EMU_COUNT(50);
        barrier_wait(&bar);
        mutex_lock(lock);
        total += 1;
        EMU_COUNT(100);
        mutex_unlock(lock);
        EMU_COUNT(20);
        return 0;
    }
    """
    host = """
    int main(int argc, char **argv) {
        (void)argc;
        struct dpu_set_t set;
        DPU_ASSERT(dpu_alloc(1, NULL, &set));
        DPU_ASSERT(dpu_load(set, argv[1], NULL));
        DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
        DPU_ASSERT(dpu_free(set));
        return 0;
    }
    """
    _, c = emu.run_program(_kernel(tmp_path, "cs", dpu, host, tasklets=16), [])
    # phase 1: 16 x 50 = 800 instructions, one tasklet's chain 50 x 11 = 550 -> 800 cycles;
    # barrier: 16 x 6 x 11 = 1056; phase 2: 16 critical sections of 100 instructions in a row at
    # 11 cycles each = 17,600 (> 16 x 120 = 1,920 issued, > chain 120 x 11 = 1,320)
    assert c["kernel_cycles"] == pytest.approx(800 + 1056 + 17600)
    assert c["per_dpu"][0]["sync_cycles"] == pytest.approx(1056)


def test_emulator_barrier_cost_is_the_mapping_constant():
    src = (Path(emu.__file__).parent / "src" / "emu_host.c").read_text()
    m = re.search(r"#define BARRIER_INSTR (\d+)", src)
    from onnx_cinm.devices.upmem import mapping
    assert m and int(m.group(1)) == mapping.BARRIER_INSTR


def test_perfcounter_counts_instructions_and_modeled_cycles(tmp_path):
    dpu = """
    __host uint64_t cyc[NR_TASKLETS];
    __host uint64_t ins[NR_TASKLETS];
    __dma_aligned uint64_t b[NR_TASKLETS][4];
    int main(void) {
        uint32_t t = me();
        perfcounter_config(COUNT_CYCLES, true);
        EMU_COUNT(100);
        mram_read(DPU_MRAM_HEAP_POINTER, b[t], 32);
        cyc[t] = perfcounter_get();
        perfcounter_config(COUNT_INSTRUCTIONS, true);
        EMU_COUNT(7);
        ins[t] = perfcounter_get();
        return 0;
    }
    """
    host = """
    int main(int argc, char **argv) {
        (void)argc;
        struct dpu_set_t set;
        uint64_t cyc[16], ins[16];
        DPU_ASSERT(dpu_alloc(1, NULL, &set));
        DPU_ASSERT(dpu_load(set, argv[1], NULL));
        DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
        DPU_ASSERT(dpu_copy_from(set, "cyc", 0, cyc, sizeof cyc));
        DPU_ASSERT(dpu_copy_from(set, "ins", 0, ins, sizeof ins));
        printf("%llu %llu\\n", (unsigned long long)cyc[15], (unsigned long long)ins[15]);
        DPU_ASSERT(dpu_free(set));
        return 0;
    }
    """
    proc, _ = emu.run_program(_kernel(tmp_path, "pc", dpu, host, tasklets=16), [])
    # 100 instructions x max(11, 16 tasklets) + 77 + 0.5 x 32 DMA cycles; then 7 instructions
    assert proc.stdout.split() == [str(100 * 16 + 77 + 16), "7"]


# ------------------------------------------------------------------------------------------
# one broken program per hardware rule


def _expect_rule(k, rule, dpu=None, tasklet=None, file_line=None, extra=()):
    with pytest.raises(emu.UpmemRuleError) as ei:
        emu.run_program(k, [], extra_dpu_flags=extra)
    e = ei.value
    assert e.rule == rule, e.message
    assert e.message.startswith(f"upmem-emu: rule {rule}: ")
    m = re.search(r"\[DPU (\S+), tasklet (\S+), at (.+):(\d+)\]$", e.message)
    assert m, e.message
    if dpu is not None:
        assert m.group(1) == str(dpu), e.message
    if tasklet is not None:
        assert m.group(2) == str(tasklet), e.message
    if file_line is not None:
        assert m.group(3).endswith(file_line[0]) and int(m.group(4)) == file_line[1], e.message
    return e


def _dma_prog(stmt, guard="me() == 2"):
    return f"""
    __dma_aligned uint64_t buf[NR_TASKLETS][512];
    __host uint64_t dummy;
    int main(void) {{
        uint32_t t = me();
        uintptr_t heap = (uintptr_t)DPU_MRAM_HEAP_POINTER;
        (void)heap; (void)t;
        if (dummy == 0 && ({guard})) {{
            {stmt} /* BROKEN */
        }}
        return 0;
    }}
    """


@pytest.mark.parametrize("size", [4, 12, 2056, 4096])
def test_rule_dma_size(tmp_path, size):
    # a size known only at run time (``dummy`` is 0): a constant one is a compile error now,
    # as with the SDK (tests/test_upmem_toolchain.py)
    k = _kernel(tmp_path, "dmasize", _dma_prog(
        f"mram_read((__mram_ptr void const *)heap, buf[t], {size}u + (unsigned)dummy);"), _launch_host(2))
    e = _expect_rule(k, "dma-size", dpu=0, tasklet=2,
                     file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))
    assert f"{size} bytes" in e.message


def test_rule_dma_wram_alignment(tmp_path):
    k = _kernel(tmp_path, "wal", _dma_prog(
        "mram_write((char *)buf[t] + 4, (__mram_ptr void *)heap, 8);"), _launch_host(2))
    _expect_rule(k, "dma-wram-align", dpu=0, tasklet=2,
                 file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))


def test_rule_dma_mram_alignment(tmp_path):
    k = _kernel(tmp_path, "mal", _dma_prog(
        "mram_read((__mram_ptr void const *)(heap + 12), buf[t], 16);"), _launch_host(2))
    _expect_rule(k, "dma-mram-align", dpu=0, tasklet=2,
                 file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))


def test_rule_mram_out_of_range(tmp_path):
    k = _kernel(tmp_path, "mrange", _dma_prog(
        "mram_read((__mram_ptr void const *)(heap + (64u << 20) - 8), buf[t], 16);"),
        _launch_host(2))
    _expect_rule(k, "mram-range", dpu=0, tasklet=2,
                 file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))


def test_rule_wram_over_64k_by_mem_alloc(tmp_path):
    dpu = """
    BARRIER_INIT(bar, NR_TASKLETS);
    int main(void) {
        if (me() == 0) mem_reset();
        barrier_wait(&bar);
        void *p = mem_alloc(4096); /* BROKEN: 16 x 4 KB + 16 KB of stacks > 64 KB */
        (void)p;
        return 0;
    }
    """
    k = _kernel(tmp_path, "heap", dpu, _launch_host(1), tasklets=16)
    e = _expect_rule(k, "wram-size", dpu=0, file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))
    assert "> 65536 B WRAM" in e.message


def test_rule_wram_over_64k_by_globals_and_stacks(tmp_path):
    dpu = """
    __dma_aligned uint64_t big[7000];  /* 56 000 B of globals + 11 x 1 KB stacks > 64 KB */
    int main(void) { big[me()] = 1; return 0; }
    """
    host = _launch_host(1)
    k = _kernel(tmp_path, "globals", dpu, host, tasklets=11)
    e = _expect_rule(k, "wram-size", file_line=("host.c", _line_of(k / "host.c", "dpu_load")))
    assert "11 tasklets x 1024 B stacks" in e.message


def test_rule_more_than_24_tasklets(tmp_path):
    k = _kernel(tmp_path, "tasklets", "int main(void) { return 0; }\n", _launch_host(1),
                tasklets=25)
    e = _expect_rule(k, "tasklets", file_line=("host.c", _line_of(k / "host.c", "dpu_load")))
    assert "NR_TASKLETS=25" in e.message


HOST_XFER = """
int main(int argc, char **argv) {
    (void)argc;
    struct dpu_set_t set, dpu;
    uint32_t i;
    static uint64_t bufs[4][64];
    (void)dpu; (void)i;
    DPU_ASSERT(dpu_alloc(4, NULL, &set));
    DPU_ASSERT(dpu_load(set, argv[1], NULL));
    %s
    DPU_ASSERT(dpu_free(set));
    return 0;
}
"""


@pytest.mark.parametrize("stmt", [
    'DPU_FOREACH(set, dpu, i) { DPU_ASSERT(dpu_prepare_xfer(dpu, bufs[i])); }\n'
    '    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_TO_DPU, DPU_MRAM_HEAP_POINTER_NAME, 4, 64, DPU_XFER_DEFAULT)); /* BROKEN */',
    'DPU_ASSERT(dpu_broadcast_to(set, DPU_MRAM_HEAP_POINTER_NAME, 0, bufs[0], 60, DPU_XFER_DEFAULT)); /* BROKEN */',
])
def test_rule_host_transfer_alignment(tmp_path, stmt):
    k = _kernel(tmp_path, "hx", "int main(void) { return 0; }\n", HOST_XFER % stmt)
    _expect_rule(k, "host-xfer-align", file_line=("host.c", _line_of(k / "host.c", "BROKEN")))


def test_rule_push_needs_a_buffer_for_every_dpu(tmp_path):
    stmt = ('DPU_FOREACH(set, dpu, i) { if (i != 2) DPU_ASSERT(dpu_prepare_xfer(dpu, bufs[i])); }\n'
            '    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_TO_DPU, DPU_MRAM_HEAP_POINTER_NAME, 0, 64, '
            'DPU_XFER_DEFAULT)); /* BROKEN */')
    k = _kernel(tmp_path, "pu", "int main(void) { return 0; }\n", HOST_XFER % stmt)
    _expect_rule(k, "push-unequal-length", dpu=2,
                 file_line=("host.c", _line_of(k / "host.c", "BROKEN")))


def test_rule_push_from_dpus_longer_than_each_buffer(tmp_path):
    # per-DPU buffers 64 B apart, but 128 B pulled from each: unequal per-DPU lengths
    stmt = ('DPU_FOREACH(set, dpu, i) { DPU_ASSERT(dpu_prepare_xfer(dpu, (char *)bufs + 64 * i)); }\n'
            '    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_FROM_DPU, DPU_MRAM_HEAP_POINTER_NAME, 0, 128, '
            'DPU_XFER_DEFAULT)); /* BROKEN */')
    k = _kernel(tmp_path, "po", "int main(void) { return 0; }\n", HOST_XFER % stmt)
    _expect_rule(k, "push-unequal-length", file_line=("host.c", _line_of(k / "host.c", "BROKEN")))


def test_barrier_count_larger_than_tasklets_is_reported_not_hung(tmp_path):
    dpu = """
    BARRIER_INIT(bar, NR_TASKLETS + 1);
    int main(void) { barrier_wait(&bar); /* BROKEN */ return 0; }
    """
    k = _kernel(tmp_path, "dl", dpu, _launch_host(1), tasklets=3)
    _expect_rule(k, "deadlock", dpu=0, file_line=("dpu.c", _line_of(k / "dpu.c", "BROKEN")))


def test_build_error_carries_gcc_diagnostics(tmp_path):
    k = _kernel(tmp_path, "bad", "int main(void) { int unused; return 0; }\n", _launch_host(1))
    with pytest.raises(emu.UpmemBuildError, match="unused"):
        emu.build(k)


def test_halt_ends_one_tasklet_and_the_next_launch_still_runs_all(tmp_path):
    dpu = """
    __host uint64_t done[NR_TASKLETS];
    int main(void) {
        uint32_t t = me();
        if (t == 1) halt();
        done[t] += 1;
        return 0;
    }
    """
    host = """
    int main(int argc, char **argv) {
        (void)argc;
        struct dpu_set_t set;
        uint64_t done[3];
        DPU_ASSERT(dpu_alloc(2, NULL, &set));
        DPU_ASSERT(dpu_load(set, argv[1], NULL));
        DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
        DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
        struct dpu_set_t dpu;
        DPU_FOREACH(set, dpu) {
            DPU_ASSERT(dpu_copy_from(dpu, "done", 0, done, sizeof done));
            printf("%llu %llu %llu\\n", (unsigned long long)done[0], (unsigned long long)done[1],
                   (unsigned long long)done[2]);
        }
        DPU_ASSERT(dpu_free(set));
        return 0;
    }
    """
    proc, c = emu.run_program(_kernel(tmp_path, "halt", dpu, host, tasklets=3), [])
    assert proc.stdout.splitlines() == ["2 0 2", "2 0 2"]
    assert c["launches"] == 2


def _build_in_subprocess(args):
    import os

    kdir, cache = args
    os.environ["ONNX_CINM_CACHE"] = cache
    return str(emu.build(kdir))


def test_concurrent_builds_of_one_kernel_agree(tmp_path):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    k = _kernel(tmp_path, "conc", "int main(void) { return 0; }\n", _launch_host(1))
    cache = str(tmp_path / "cache")
    # spawn, not fork: a fork taken while onnxruntime's threads hold locks can hang the child
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as ex:
        dirs = list(ex.map(_build_in_subprocess, [(k, cache)] * 3))
    assert len(set(dirs)) == 1
    built = [p.name for p in (tmp_path / "cache").iterdir()]
    assert not [n for n in built if n.startswith(".")]  # no temporary directory left behind
    assert {p.name for p in (tmp_path / "cache" / dirs[0].rsplit("/", 1)[1]).iterdir()} == {"host", "dpu.so"}


def test_dereferencing_an_mram_pointer_is_a_dpu_fault(tmp_path):
    dpu = """
    __host uint64_t out;
    int main(void) {
        if (me() == 1) out = *(__mram_ptr uint64_t *)DPU_MRAM_HEAP_POINTER; /* BROKEN */
        return 0;
    }
    """
    e = _expect_rule(_kernel(tmp_path, "deref", dpu, _launch_host(1), tasklets=2), "dpu-fault",
                     dpu=0, tasklet=1)
    assert "SIGSEGV" in e.message
