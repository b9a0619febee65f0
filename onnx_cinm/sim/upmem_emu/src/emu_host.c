/* onnx-cinm UPMEM emulator runtime (host executable side).
 *
 * Implements the host API of dpu.h and the DPU runtime of mram.h/defs.h/alloc.h/barrier.h/
 * mutex.h/perfcounter.h. The DPU program is a shared object (dpu.so) loaded with dlopen; its
 * writable segment (minus RELRO and the __mram_noinit section) is the WRAM image of globals.
 * Every DPU owns a copy of that image, swapped in before and out after its launch, so globals
 * are per DPU and persist across launches as on hardware. DPUs run one after another; each
 * DPU's tasklets are NR_TASKLETS pthreads. MRAM is a lazily mapped 64 MB buffer per DPU.
 *
 * Hardware rules (field notes upmem.md §1.3/§1.4) abort the process with exit status 86 and one
 * line on stderr: "upmem-emu: rule <name>: <what> [DPU d, tasklet t, at file:line]".
 *
 * Cost model (PrIM, Gómez-Luna et al. 2022, as summarised in field notes §1.5): a tasklet issues
 * at most one instruction per 11 cycles, the pipeline at most one per cycle; a DMA costs
 * alpha + 0.5 cycles/byte with alpha 77 (read) / 61 (write); compute and DMA overlap. The
 * authoritative model is onnx_cinm.devices.upmem.cost; this one only feeds perfcounter_get and
 * the counters file.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "dpu.h"
#include "defs.h"
#include "mram.h"
#include "alloc.h"
#include "barrier.h"
#include "mutex.h"
#include "perfcounter.h"

#define MRAM_BYTES (64ull << 20)   /* 64 MB per DPU (SDK docs) */
#define WRAM_BYTES 65536ull        /* 64 KB per DPU, v1A chips (SDK docs) */
#define MRAM_BASE 0x08000000ull    /* MRAM base of the DPU linker script (SDK dpu.lds) */
#define MAX_TASKLETS 24            /* v1A hardware threads (SDK docs) */
#define MAX_DPUS 2560              /* the largest published system (PrIM: 2,560 nominal) */
#define RULE_EXIT 86
#define DMA_ALPHA_READ 77.0        /* cycles, PrIM MRAM-latency (field notes §1.5) */
#define DMA_ALPHA_WRITE 61.0
#define DMA_BETA 0.5               /* cycles per byte */
#define ISSUE_CYCLES 11            /* revolver pipeline: one issue per tasklet per 11 cycles */
/* Instructions of one barrier_wait per tasklet; a barrier of T tasklets serializes on an atomic
 * bit: T x BARRIER_INSTR x 11 cycles (an estimate; the same constant as
 * onnx_cinm.devices.upmem.mapping.BARRIER_INSTR, checked by tests/test_upmem_emu.py). */
#define BARRIER_INSTR 6
#define FREQ_HZ 350e6              /* 2,556-DPU system (PrIM Table 1) */

typedef struct {
    uint64_t dma_reads, dma_writes, read_bytes, write_bytes, instr, barriers;
    uint64_t cs_instr; /* instructions counted while holding a mutex (critical sections) */
    double dma_cycles;
} tstat_t;

typedef struct {
    tstat_t now;   /* since the start of the current launch */
    tstat_t total; /* over all launches */
    tstat_t pc_base;
    tstat_t phase_base; /* `now` at the start of the current phase (between barriers) */
    uint64_t lock_instr; /* `now.instr` when the tasklet took its mutex */
    int locks;           /* mutexes held */
    int pc_mode;
} tasklet_t;

typedef struct {
    uint8_t *mram;
    uint8_t *image;
    uint8_t *heap;
    uint64_t heap_top, heap_peak;
    void *xfer_buf;
    int xfer_set;
    double cycles;
    double launch_cycles; /* cycles of the phases of the current launch closed so far */
    double sync_cycles;   /* cycles spent in barriers, all launches */
    uint64_t launches;
    tasklet_t t[MAX_TASKLETS];
} dpu_t;

typedef struct { uintptr_t start; size_t len; size_t img_off; } range_t;

typedef struct {
    uint32_t nr;
    dpu_t *dpus;
    void *handle;
    char path[4096];
    int (*main_fn)(void);
    uint32_t nr_tasklets, stack_size;
    range_t ranges[4];
    int nranges;
    size_t image_size;
    uintptr_t msec_start, msec_stop;
    uint64_t heap_base_off;
    uint8_t *pristine;
    double kernel_cycles;
    uint64_t launches, h2d_bytes, d2h_bytes, bcast_bytes, xfers;
} sys_t;

static sys_t *g_sys;
static dpu_t *g_cur;
static uint32_t g_cur_id;
static __thread int t_tid = -1;
static pthread_mutex_t g_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static uint32_t g_alive, g_blocked;

/* Tasklet thread pool: NR_TASKLETS threads created at the first launch and reused for every DPU
 * and launch (thread creation per DPU dominated runs with thousands of DPUs). */
static pthread_mutex_t pool_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;
static pthread_t pool_threads[24];
static uint32_t pool_size, pool_running;
static uint64_t pool_gen;
static int pool_quit;
static __thread jmp_buf t_halt;

/* ---------------------------------------------------------------------------------------- */
/* rule violations                                                                            */

static void rule(const char *name, long dpu, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6), noreturn));

static void rule(const char *name, long dpu, const char *file, int line, const char *fmt, ...)
{
    char msg[1024], who[64], tk[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (dpu >= 0) snprintf(who, sizeof who, "%ld", dpu); else snprintf(who, sizeof who, "all");
    if (t_tid >= 0) snprintf(tk, sizeof tk, "%d", t_tid); else snprintf(tk, sizeof tk, "host");
    fprintf(stderr, "upmem-emu: rule %s: %s [DPU %s, tasklet %s, at %s:%d]\n", name, msg, who, tk,
            file ? file : "?", line);
    fflush(stderr);
    _exit(RULE_EXIT);
}

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "upmem-emu: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    _exit(3);
}

const char *dpu_error_to_string(dpu_error_t s)
{
    static const char *names[] = {
        "success", "internal error", "system error", "driver error", "dpu allocation error",
        "invalid dpu set", "invalid thread id", "invalid wram access", "invalid iram access",
        "invalid mram access", "invalid symbol access", "mram busy", "transfer already set",
        "different dpu programs", "dpu fault", "invalid elf file", "timeout", "invalid profile",
        "unknown symbol"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown error";
}

/* ---------------------------------------------------------------------------------------- */
/* memory                                                                                    */

static uint8_t *mram_of(dpu_t *d)
{
    if (!d->mram) {
        void *p = mmap(NULL, MRAM_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fatal("cannot map 64 MB of MRAM");
        d->mram = p;
    }
    return d->mram;
}

static uint64_t mram_offset(const void *p, uint64_t n, const char *what, const char *file, int line)
{
    uintptr_t a = (uintptr_t)p;
    uint64_t off;
    if (g_sys->msec_start && a >= g_sys->msec_start && a < g_sys->msec_stop)
        off = a - g_sys->msec_start;
    else if (a >= MRAM_BASE && a < MRAM_BASE + MRAM_BYTES)
        off = a - MRAM_BASE;
    else
        rule("mram-range", g_cur_id, file, line,
             "%s: address %p is not in MRAM (0x%llx..0x%llx or a __mram_noinit variable)", what, p,
             (unsigned long long)MRAM_BASE, (unsigned long long)(MRAM_BASE + MRAM_BYTES));
    if (off + n > MRAM_BYTES)
        rule("mram-range", g_cur_id, file, line,
             "%s: MRAM bytes [%llu, %llu) exceed the 64 MB MRAM (%llu B)", what,
             (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)MRAM_BYTES);
    return off;
}

static void dma_check(const char *what, const void *mram, const void *wram, unsigned n,
                      const char *file, int line)
{
    if (t_tid < 0 || !g_cur) fatal("%s called outside a DPU tasklet (%s:%d)", what, file, line);
    if (n < 8 || n > 2048 || n % 8)
        rule("dma-size", g_cur_id, file, line,
             "%s of %u bytes (must be 8..2048 and a multiple of 8)", what, n);
    if ((uintptr_t)wram % 8)
        rule("dma-wram-align", g_cur_id, file, line,
             "%s: WRAM address %p is not 8-byte aligned", what, wram);
    if ((uintptr_t)mram % 8)
        rule("dma-mram-align", g_cur_id, file, line,
             "%s: MRAM address %p is not 8-byte aligned", what, mram);
}

void __emu_mram_read(const void *from, void *to, unsigned int n, const char *file, int line)
{
    dma_check("mram_read", from, to, n, file, line);
    uint64_t off = mram_offset(from, n, "mram_read", file, line);
    memcpy(to, mram_of(g_cur) + off, n);
    tstat_t *s = &g_cur->t[t_tid].now;
    s->dma_reads++;
    s->read_bytes += n;
    s->dma_cycles += DMA_ALPHA_READ + DMA_BETA * n;
}

void __emu_mram_write(const void *from, void *to, unsigned int n, const char *file, int line)
{
    dma_check("mram_write", to, from, n, file, line);
    uint64_t off = mram_offset(to, n, "mram_write", file, line);
    memcpy(mram_of(g_cur) + off, from, n);
    tstat_t *s = &g_cur->t[t_tid].now;
    s->dma_writes++;
    s->write_bytes += n;
    s->dma_cycles += DMA_ALPHA_WRITE + DMA_BETA * n;
}

void *__emu_mram_heap_pointer(void)
{
    return (void *)(uintptr_t)(MRAM_BASE + g_sys->heap_base_off);
}

static uint64_t heap_avail(void)
{
    uint64_t used = g_sys->image_size + (uint64_t)g_sys->nr_tasklets * g_sys->stack_size;
    return used >= WRAM_BYTES ? 0 : WRAM_BYTES - used;
}

void *__emu_mem_alloc(size_t size, const char *file, int line)
{
    pthread_mutex_lock(&g_mtx);
    dpu_t *d = g_cur;
    if (!d->heap) {
        d->heap = aligned_alloc(8, WRAM_BYTES);
        if (!d->heap) fatal("out of memory");
    }
    uint64_t sz = (size + 7) & ~7ull;
    if (d->heap_top + sz > heap_avail())
        rule("wram-size", g_cur_id, file, line,
             "mem_alloc(%zu): globals %zu B + %u tasklets x %u B stacks + heap %llu B > %llu B WRAM",
             size, g_sys->image_size, g_sys->nr_tasklets, g_sys->stack_size,
             (unsigned long long)(d->heap_top + sz), (unsigned long long)WRAM_BYTES);
    void *p = d->heap + d->heap_top;
    d->heap_top += sz;
    if (d->heap_top > d->heap_peak) d->heap_peak = d->heap_top;
    pthread_mutex_unlock(&g_mtx);
    return p;
}

void *mem_reset(void)
{
    pthread_mutex_lock(&g_mtx);
    g_cur->heap_top = 0;
    pthread_mutex_unlock(&g_mtx);
    return g_cur->heap;
}

/* ---------------------------------------------------------------------------------------- */
/* tasklets, barriers, mutexes, counters                                                      */

sysname_t me(void) { return (sysname_t)t_tid; }
int check_stack(void) { return (int)(g_sys->stack_size / 4); }

void __emu_count(uint64_t n)
{
    if (t_tid >= 0 && g_cur) g_cur->t[t_tid].now.instr += n;
}

/* Close the current phase of DPU d (the work since the last barrier of all tasklets) and return
 * its cycles, as onnx_cinm.devices.upmem.cost.kernel_cycles counts them: the largest of all
 * instructions (the pipeline issues one per cycle), the slowest tasklet's chain (11 cycles per
 * instruction plus its own DMA waits) and the DMA engine's busy cycles (one transfer at a time). */
static double close_phase(dpu_t *d, uint32_t nt)
{
    double sum = 0, chain = 0, dma = 0, cs = 0;
    for (uint32_t t = 0; t < nt; t++) {
        tstat_t *n = &d->t[t].now, *b = &d->t[t].phase_base;
        double di = (double)(n->instr - b->instr), dd = n->dma_cycles - b->dma_cycles;
        double c = ISSUE_CYCLES * di + dd;
        sum += di;
        dma += dd;
        cs += (double)(n->cs_instr - b->cs_instr);
        if (c > chain) chain = c;
        *b = *n;
    }
    /* critical sections of different tasklets serialize, each at one instruction per 11 cycles */
    cs *= ISSUE_CYCLES;
    double m = sum > chain ? sum : chain;
    m = m > cs ? m : cs;
    return m > dma ? m : dma;
}

static void block_or_deadlock(const char *what, const char *file, int line)
{
    g_blocked++;
    if (g_blocked >= g_alive)
        rule("deadlock", g_cur_id, file, line,
             "%s: every live tasklet (%u) is blocked (a barrier count larger than the "
             "tasklets that reach it)", what, g_alive);
}

void __emu_barrier_wait(barrier_t *b, const char *file, int line)
{
    pthread_mutex_lock(&g_mtx);
    g_cur->t[t_tid].now.barriers++;
    uint32_t gen = b->generation;
    if (++b->waiting >= b->count) {
        if (b->count == g_sys->nr_tasklets) {
            /* every tasklet is here: the phase ends; the barrier itself serializes */
            double sync = g_sys->nr_tasklets > 1 ? (double)g_sys->nr_tasklets * BARRIER_INSTR * ISSUE_CYCLES : 0;
            g_cur->launch_cycles += close_phase(g_cur, g_sys->nr_tasklets) + sync;
            g_cur->sync_cycles += sync;
        }
        g_blocked -= b->waiting - 1; /* the released waiters are runnable from now on */
        b->waiting = 0;
        b->generation++;
        pthread_cond_broadcast(&g_cond);
    } else {
        block_or_deadlock("barrier_wait", file, line);
        while (b->generation == gen) pthread_cond_wait(&g_cond, &g_mtx);
    }
    pthread_mutex_unlock(&g_mtx);
}

void mutex_lock(mutex_id_t m)
{
    pthread_mutex_lock(&g_mtx);
    while (m->locked) pthread_cond_wait(&g_cond, &g_mtx); /* not deadlock-checked */
    m->locked = 1;
    m->owner = (uint32_t)t_tid;
    tasklet_t *tk = &g_cur->t[t_tid];
    if (tk->locks++ == 0) tk->lock_instr = tk->now.instr;
    pthread_mutex_unlock(&g_mtx);
}

bool mutex_trylock(mutex_id_t m)
{
    pthread_mutex_lock(&g_mtx);
    bool ok = !m->locked;
    if (ok) {
        m->locked = 1;
        m->owner = (uint32_t)t_tid;
        tasklet_t *tk = &g_cur->t[t_tid];
        if (tk->locks++ == 0) tk->lock_instr = tk->now.instr;
    }
    pthread_mutex_unlock(&g_mtx);
    return ok;
}

void mutex_unlock(mutex_id_t m)
{
    pthread_mutex_lock(&g_mtx);
    tasklet_t *tk = &g_cur->t[t_tid];
    if (tk->locks > 0 && --tk->locks == 0) tk->now.cs_instr += tk->now.instr - tk->lock_instr;
    m->locked = 0;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_mtx);
}

static perfcounter_t pc_value(tasklet_t *t, const tstat_t *s)
{
    uint64_t instr = s->instr - t->pc_base.instr;
    if (t->pc_mode == COUNT_INSTRUCTIONS) return instr;
    uint32_t cpi = g_sys->nr_tasklets > ISSUE_CYCLES ? g_sys->nr_tasklets : ISSUE_CYCLES;
    return instr * cpi + (uint64_t)(s->dma_cycles - t->pc_base.dma_cycles);
}

perfcounter_t perfcounter_config(perfcounter_config_t config, bool reset_value)
{
    tasklet_t *t = &g_cur->t[t_tid];
    perfcounter_t old = pc_value(t, &t->now);
    if (config != COUNT_SAME) t->pc_mode = config;
    if (reset_value) t->pc_base = t->now;
    return old;
}

perfcounter_t perfcounter_get(void)
{
    tasklet_t *t = &g_cur->t[t_tid];
    return t->pc_mode == COUNT_NOTHING ? 0 : pc_value(t, &t->now);
}

static void tasklet_done(void)
{
    pthread_mutex_lock(&g_mtx);
    g_alive--;
    if (g_alive > 0 && g_blocked >= g_alive)
        rule("deadlock", g_cur_id, "?", 0,
             "tasklet %d returned while every other live tasklet (%u) waits in a barrier "
             "it will never complete", t_tid, g_alive);
    pthread_mutex_unlock(&g_mtx);
}

void halt(void)
{
    longjmp(t_halt, 1);
}

static void *pool_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    volatile uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool_mtx);
        while (pool_gen == seen && !pool_quit) pthread_cond_wait(&pool_start, &pool_mtx);
        if (pool_quit) {
            pthread_mutex_unlock(&pool_mtx);
            return NULL;
        }
        seen = pool_gen;
        pthread_mutex_unlock(&pool_mtx);
        t_tid = id;
        if (!setjmp(t_halt)) g_sys->main_fn();
        tasklet_done();
        t_tid = -1;
        pthread_mutex_lock(&pool_mtx);
        if (--pool_running == 0) pthread_cond_signal(&pool_done);
        pthread_mutex_unlock(&pool_mtx);
    }
}

static void pool_start_if_needed(uint32_t n)
{
    if (pool_size) return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (uint32_t t = 0; t < n; t++)
        if (pthread_create(&pool_threads[t], &attr, pool_worker, (void *)(intptr_t)t) != 0)
            fatal("cannot create tasklet thread");
    pthread_attr_destroy(&attr);
    pool_size = n;
}

static void pool_stop(void)
{
    if (!pool_size) return;
    pthread_mutex_lock(&pool_mtx);
    pool_quit = 1;
    pthread_cond_broadcast(&pool_start);
    pthread_mutex_unlock(&pool_mtx);
    for (uint32_t t = 0; t < pool_size; t++) pthread_join(pool_threads[t], NULL);
    pool_size = 0;
    pool_quit = 0;
    pool_gen = 0;
}

/* Run the loaded program's main on every tasklet of the current DPU; return when all are done. */
static void run_tasklets(uint32_t n)
{
    pool_start_if_needed(n);
    pthread_mutex_lock(&pool_mtx);
    pool_running = n;
    pool_gen++;
    pthread_cond_broadcast(&pool_start);
    while (pool_running) pthread_cond_wait(&pool_done, &pool_mtx);
    pthread_mutex_unlock(&pool_mtx);
}

/* ---------------------------------------------------------------------------------------- */
/* host API                                                                                   */

static sys_t *sys_of(struct dpu_set_t set)
{
    if (!set.sys || set.sys != g_sys) fatal("DPU set used after dpu_free or never allocated");
    return set.sys;
}

/* A crash inside a tasklet (e.g. dereferencing an __mram_ptr, which holds a fake address, or an
 * integer division by zero) is reported like a rule, with the DPU and tasklet. */
static void on_fault(int sig)
{
    char msg[256];
    const char *what = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "signal";
    if (t_tid >= 0)
        snprintf(msg, sizeof msg, "upmem-emu: rule dpu-fault: %s in a tasklet (a direct dereference of an "
                 "__mram_ptr, a WRAM access out of bounds, or a division by zero) [DPU %u, tasklet %d, at ?:0]\n",
                 what, g_cur_id, t_tid);
    else
        snprintf(msg, sizeof msg, "upmem-emu: error: %s in the host program\n", what);
    ssize_t w = write(2, msg, strlen(msg));
    (void)w;
    _exit(t_tid >= 0 ? RULE_EXIT : 3);
}

dpu_error_t dpu_alloc(uint32_t nr_dpus, const char *profile, struct dpu_set_t *set)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
    (void)profile;
    if (g_sys) return DPU_ERR_ALLOCATION; /* one allocation per process in the emulator */
    if (nr_dpus == DPU_ALLOCATE_ALL) {
        const char *e = getenv("UPMEM_EMU_NR_DPUS");
        nr_dpus = e ? (uint32_t)strtoul(e, NULL, 10) : 64;
    }
    if (nr_dpus == 0 || nr_dpus > MAX_DPUS) return DPU_ERR_ALLOCATION;
    sys_t *s = calloc(1, sizeof *s);
    s->nr = nr_dpus;
    s->dpus = calloc(nr_dpus, sizeof(dpu_t));
    if (!s->dpus) return DPU_ERR_ALLOCATION;
    g_sys = s;
    set->first = 0;
    set->count = nr_dpus;
    set->sys = s;
    return DPU_OK;
}

static void write_counters(void);

dpu_error_t dpu_free(struct dpu_set_t set)
{
    sys_t *s = sys_of(set);
    if (set.first != 0 || set.count != s->nr) return DPU_ERR_INVALID_DPU_SET;
    write_counters();
    pool_stop();
    for (uint32_t i = 0; i < s->nr; i++) {
        if (s->dpus[i].mram) munmap(s->dpus[i].mram, MRAM_BYTES);
        free(s->dpus[i].image);
        free(s->dpus[i].heap);
    }
    free(s->dpus);
    free(s->pristine);
    free(s);
    g_sys = NULL;
    return DPU_OK;
}

dpu_error_t dpu_get_nr_dpus(struct dpu_set_t set, uint32_t *nr)
{
    sys_of(set);
    *nr = set.count;
    return DPU_OK;
}

dpu_error_t dpu_get_nr_ranks(struct dpu_set_t set, uint32_t *nr)
{
    sys_of(set);
    *nr = (set.count + 63) / 64;
    return DPU_OK;
}

bool __emu_dpu_iter(const struct dpu_set_t *set, struct dpu_set_t *dpu, uint32_t index)
{
    if (index >= set->count) return false;
    dpu->first = set->first + index;
    dpu->count = 1;
    dpu->sys = set->sys;
    return true;
}

struct phdr_ctx { uintptr_t base; int found; uintptr_t rw_start, rw_end, relro_start, relro_end; };

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct phdr_ctx *c = data;
    if (info->dlpi_addr != c->base || c->found) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W)) {
            c->rw_start = a;
            c->rw_end = a + ph->p_memsz;
            c->found = 1;
        } else if (ph->p_type == PT_GNU_RELRO) {
            c->relro_start = a;
            c->relro_end = a + ph->p_memsz;
        }
    }
    return 0;
}

static void add_range(sys_t *s, uintptr_t a, uintptr_t b)
{
    if (b <= a) return;
    range_t *r = &s->ranges[s->nranges++];
    r->start = a;
    r->len = b - a;
    r->img_off = s->image_size;
    s->image_size += r->len;
}

dpu_error_t __emu_dpu_load(struct dpu_set_t set, const char *path, struct dpu_program_t **program,
                           const char *file, int line)
{
    sys_t *s = sys_of(set);
    if (program) *program = NULL;
    if (s->handle) {
        if (strcmp(path, s->path) == 0) return DPU_OK; /* same program: every DPU has it */
        return DPU_ERR_DIFFERENT_DPU_PROGRAMS;
    }
    char full[4096];
    snprintf(full, sizeof full, "%s%s", strchr(path, '/') ? "" : "./", path);
    void *h = dlopen(full, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "upmem-emu: dpu_load: %s\n", dlerror());
        return DPU_ERR_ELF_INVALID_FILE;
    }
    const uint32_t *nt = dlsym(h, "__emu_nr_tasklets");
    const uint32_t *ss = dlsym(h, "__emu_stack_size");
    char *(*ms)(void) = (char *(*)(void))dlsym(h, "__emu_mram_section_start");
    char *(*me_)(void) = (char *(*)(void))dlsym(h, "__emu_mram_section_stop");
    int (*mainf)(void) = (int (*)(void))dlsym(h, "main");
    if (!nt || !ss || !ms || !me_ || !mainf) {
        fprintf(stderr, "upmem-emu: dpu_load: %s is not a DPU program built by the emulator\n", path);
        return DPU_ERR_ELF_INVALID_FILE;
    }
    snprintf(s->path, sizeof s->path, "%s", path);
    s->handle = h;
    s->main_fn = mainf;
    s->nr_tasklets = *nt;
    s->stack_size = *ss;
    s->msec_start = (uintptr_t)ms();
    s->msec_stop = (uintptr_t)me_();
    if (s->nr_tasklets < 1 || s->nr_tasklets > MAX_TASKLETS)
        rule("tasklets", -1, file, line, "%s was built with NR_TASKLETS=%u (the DPU has 1..%d tasklets)",
             path, s->nr_tasklets, MAX_TASKLETS);
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm) fatal("dlinfo failed for %s", path);
    struct phdr_ctx c = {.base = lm->l_addr};
    dl_iterate_phdr(phdr_cb, &c);
    if (!c.found) fatal("no writable segment in %s", path);
    /* WRAM image = writable segment minus RELRO minus the __mram_noinit section. */
    uintptr_t lo = c.rw_start, hi = c.rw_end;
    if (c.relro_end > lo && c.relro_start <= lo) lo = c.relro_end < hi ? c.relro_end : hi;
    if (s->msec_start && s->msec_stop > s->msec_start && s->msec_start >= lo && s->msec_start < hi) {
        add_range(s, lo, s->msec_start);
        add_range(s, s->msec_stop, hi);
    } else {
        add_range(s, lo, hi);
    }
    uint64_t msize = s->msec_stop > s->msec_start ? s->msec_stop - s->msec_start : 0;
    s->heap_base_off = (msize + 7) & ~7ull;
    uint64_t wram = s->image_size + (uint64_t)s->nr_tasklets * s->stack_size;
    if (wram > WRAM_BYTES)
        rule("wram-size", -1, file, line,
             "%s: globals %zu B + %u tasklets x %u B stacks = %llu B > %llu B WRAM", path,
             s->image_size, s->nr_tasklets, s->stack_size, (unsigned long long)wram,
             (unsigned long long)WRAM_BYTES);
    if (msize > MRAM_BYTES)
        rule("mram-range", -1, file, line, "%s: __mram_noinit variables take %llu B > 64 MB", path,
             (unsigned long long)msize);
    s->pristine = malloc(s->image_size ? s->image_size : 1);
    for (int i = 0; i < s->nranges; i++)
        memcpy(s->pristine + s->ranges[i].img_off, (void *)s->ranges[i].start, s->ranges[i].len);
    for (uint32_t i = 0; i < s->nr; i++) {
        s->dpus[i].image = malloc(s->image_size ? s->image_size : 1);
        memcpy(s->dpus[i].image, s->pristine, s->image_size);
    }
    return DPU_OK;
}

static void swap_image(sys_t *s, dpu_t *d, int in)
{
    for (int i = 0; i < s->nranges; i++) {
        range_t *r = &s->ranges[i];
        if (in) memcpy((void *)r->start, d->image + r->img_off, r->len);
        else memcpy(d->image + r->img_off, (void *)r->start, r->len);
    }
}

dpu_error_t __emu_dpu_launch(struct dpu_set_t set, dpu_launch_policy_t policy, const char *file, int line)
{
    (void)policy; /* DPU_ASYNCHRONOUS runs synchronously too; dpu_sync is then a no-op */
    sys_t *s = sys_of(set);
    if (!s->handle) return DPU_ERR_INTERNAL;
    (void)file; (void)line;
    double launch_max = 0;
    for (uint32_t k = 0; k < set.count; k++) {
        uint32_t id = set.first + k;
        dpu_t *d = &s->dpus[id];
        g_cur = d;
        g_cur_id = id;
        for (uint32_t t = 0; t < s->nr_tasklets; t++) {
            memset(&d->t[t].now, 0, sizeof(tstat_t));
            memset(&d->t[t].phase_base, 0, sizeof(tstat_t));
            d->t[t].locks = 0;
        }
        d->launch_cycles = 0;
        swap_image(s, d, 1);
        g_alive = s->nr_tasklets;
        g_blocked = 0;
        run_tasklets(s->nr_tasklets);
        swap_image(s, d, 0);
        /* cycles of this launch: the phases between barriers (close_phase) and the barriers */
        double cyc = d->launch_cycles + close_phase(d, s->nr_tasklets);
        for (uint32_t t = 0; t < s->nr_tasklets; t++) {
            tstat_t *n = &d->t[t].now, *tot = &d->t[t].total;
            tot->dma_reads += n->dma_reads; tot->dma_writes += n->dma_writes;
            tot->read_bytes += n->read_bytes; tot->write_bytes += n->write_bytes;
            tot->instr += n->instr; tot->barriers += n->barriers; tot->dma_cycles += n->dma_cycles;
            d->t[t].pc_base = (tstat_t){0};
        }
        d->cycles += cyc;
        d->launches++;
        if (cyc > launch_max) launch_max = cyc;
    }
    g_cur = NULL;
    s->kernel_cycles += launch_max;
    s->launches++;
    return DPU_OK;
}

dpu_error_t dpu_sync(struct dpu_set_t set)
{
    sys_of(set);
    return DPU_OK;
}

dpu_error_t dpu_prepare_xfer(struct dpu_set_t set, void *buffer)
{
    sys_t *s = sys_of(set);
    for (uint32_t k = 0; k < set.count; k++) {
        s->dpus[set.first + k].xfer_buf = buffer;
        s->dpus[set.first + k].xfer_set = buffer != NULL;
    }
    return DPU_OK;
}

typedef struct { int mram; uint64_t off, size; } symref_t;

/* The dynamic symbol of `name` in the DPU program (for its st_size). dladdr1 is not enough: it
 * returns any symbol at the address (e.g. the linker's __start_emu_mram). GNU ld lays .dynsym
 * out right before .dynstr, which bounds the table. */
static const ElfW(Sym) *find_dynsym(sys_t *s, const char *name)
{
    struct link_map *lm = NULL;
    if (dlinfo(s->handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm) return NULL;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)d->d_un.d_ptr;
        if (d->d_tag == DT_STRTAB) strtab = (const char *)d->d_un.d_ptr;
    }
    if (!symtab || !strtab || (const char *)symtab >= strtab) return NULL;
    size_t n = (size_t)(strtab - (const char *)symtab) / sizeof(ElfW(Sym));
    for (size_t i = 1; i < n; i++)
        if (symtab[i].st_shndx != SHN_UNDEF && strcmp(strtab + symtab[i].st_name, name) == 0 &&
            ELF64_ST_VISIBILITY(symtab[i].st_other) == STV_DEFAULT)
            return &symtab[i];
    return NULL;
}

static dpu_error_t resolve(sys_t *s, const char *name, symref_t *r)
{
    if (!s->handle) return DPU_ERR_INTERNAL;
    if (strcmp(name, DPU_MRAM_HEAP_POINTER_NAME) == 0) {
        r->mram = 1;
        r->off = s->heap_base_off;
        r->size = MRAM_BYTES - s->heap_base_off;
        return DPU_OK;
    }
    void *a = dlsym(s->handle, name);
    if (!a) return DPU_ERR_UNKNOWN_SYMBOL;
    const ElfW(Sym) *sym = find_dynsym(s, name);
    if (!sym) return DPU_ERR_UNKNOWN_SYMBOL;
    uintptr_t p = (uintptr_t)a;
    if (s->msec_start && p >= s->msec_start && p < s->msec_stop) {
        r->mram = 1;
        r->off = p - s->msec_start;
        r->size = sym->st_size;
        return DPU_OK;
    }
    for (int i = 0; i < s->nranges; i++) {
        if (p >= s->ranges[i].start && p < s->ranges[i].start + s->ranges[i].len) {
            r->mram = 0;
            r->off = s->ranges[i].img_off + (p - s->ranges[i].start);
            r->size = sym->st_size;
            return DPU_OK;
        }
    }
    return DPU_ERR_INVALID_SYMBOL_ACCESS; /* e.g. a const (IRAM/rodata) or a function */
}

static void xfer_check(const char *what, const char *name, const symref_t *r, uint64_t off,
                       uint64_t len, long dpu, const char *file, int line)
{
    unsigned align = r->mram ? 8 : 4;
    if (off % align || len % align)
        rule("host-xfer-align", dpu, file, line,
             "%s '%s' offset %llu length %llu: %s transfers need offset and length multiples of %u",
             what, name, (unsigned long long)off, (unsigned long long)len, r->mram ? "MRAM" : "WRAM", align);
    if (off + len > r->size)
        rule(r->mram ? "mram-range" : "host-xfer-range", dpu, file, line,
             "%s '%s' bytes [%llu, %llu) exceed the symbol's %llu bytes", what, name,
             (unsigned long long)off, (unsigned long long)(off + len), (unsigned long long)r->size);
}

static void do_xfer(sys_t *s, dpu_t *d, const symref_t *r, uint64_t off, void *buf, uint64_t len, int to)
{
    if (!len) return;
    uint8_t *p = r->mram ? mram_of(d) + r->off + off : d->image + r->off + off;
    if (to) memcpy(p, buf, len); else memcpy(buf, p, len);
    (void)s;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

dpu_error_t __emu_push_xfer(struct dpu_set_t set, dpu_xfer_t xfer, const char *name, uint32_t off,
                            size_t len, dpu_xfer_flags_t flags, const char *file, int line)
{
    sys_t *s = sys_of(set);
    symref_t r;
    dpu_error_t e = resolve(s, name, &r);
    if (e != DPU_OK) return e;
    for (uint32_t k = 0; k < set.count; k++)
        if (!s->dpus[set.first + k].xfer_set)
            rule("push-unequal-length", set.first + k, file, line,
                 "dpu_push_xfer '%s': DPU %u has no prepared buffer; a push moves the same %zu bytes "
                 "to or from every DPU of the set (pad and prepare a buffer for each)",
                 name, set.first + k, len);
    if (xfer == DPU_XFER_FROM_DPU && set.count > 1 && len) {
        uintptr_t *ps = malloc(set.count * 2 * sizeof(uintptr_t));
        for (uint32_t k = 0; k < set.count; k++) {
            ps[2 * k] = (uintptr_t)s->dpus[set.first + k].xfer_buf;
            ps[2 * k + 1] = set.first + k;
        }
        qsort(ps, set.count, 2 * sizeof(uintptr_t), cmp_ptr);
        for (uint32_t k = 0; k + 1 < set.count; k++)
            if (ps[2 * k] + len > ps[2 * k + 2])
                rule("push-unequal-length", (long)ps[2 * k + 1], file, line,
                     "dpu_push_xfer FROM '%s' of %zu bytes: the host buffers of DPUs %lu and %lu "
                     "overlap (each DPU's buffer must hold the whole pushed length)",
                     name, len, (unsigned long)ps[2 * k + 1], (unsigned long)ps[2 * k + 3]);
        free(ps);
    }
    xfer_check("dpu_push_xfer", name, &r, off, len, -1, file, line);
    for (uint32_t k = 0; k < set.count; k++) {
        dpu_t *d = &s->dpus[set.first + k];
        do_xfer(s, d, &r, off, d->xfer_buf, len, xfer == DPU_XFER_TO_DPU);
        if (!(flags & DPU_XFER_NO_RESET)) { d->xfer_buf = NULL; d->xfer_set = 0; }
    }
    if (xfer == DPU_XFER_TO_DPU) s->h2d_bytes += (uint64_t)len * set.count;
    else s->d2h_bytes += (uint64_t)len * set.count;
    s->xfers++;
    return DPU_OK;
}

dpu_error_t __emu_broadcast_to(struct dpu_set_t set, const char *name, uint32_t off, const void *src,
                               size_t len, dpu_xfer_flags_t flags, const char *file, int line)
{
    (void)flags;
    sys_t *s = sys_of(set);
    symref_t r;
    dpu_error_t e = resolve(s, name, &r);
    if (e != DPU_OK) return e;
    xfer_check("dpu_broadcast_to", name, &r, off, len, -1, file, line);
    for (uint32_t k = 0; k < set.count; k++)
        do_xfer(s, &s->dpus[set.first + k], &r, off, (void *)src, len, 1);
    s->bcast_bytes += len;
    s->xfers++;
    return DPU_OK;
}

dpu_error_t __emu_copy_to(struct dpu_set_t set, const char *name, uint32_t off, const void *src,
                          size_t len, const char *file, int line)
{
    sys_t *s = sys_of(set);
    symref_t r;
    dpu_error_t e = resolve(s, name, &r);
    if (e != DPU_OK) return e;
    xfer_check("dpu_copy_to", name, &r, off, len, set.count == 1 ? (long)set.first : -1, file, line);
    for (uint32_t k = 0; k < set.count; k++)
        do_xfer(s, &s->dpus[set.first + k], &r, off, (void *)src, len, 1);
    s->h2d_bytes += (uint64_t)len * set.count;
    s->xfers++;
    return DPU_OK;
}

dpu_error_t __emu_copy_from(struct dpu_set_t set, const char *name, uint32_t off, void *dst,
                            size_t len, const char *file, int line)
{
    sys_t *s = sys_of(set);
    if (set.count != 1) return DPU_ERR_INVALID_DPU_SET;
    symref_t r;
    dpu_error_t e = resolve(s, name, &r);
    if (e != DPU_OK) return e;
    xfer_check("dpu_copy_from", name, &r, off, len, set.first, file, line);
    do_xfer(s, &s->dpus[set.first], &r, off, dst, len, 0);
    s->d2h_bytes += len;
    s->xfers++;
    return DPU_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* counters file (JSON), written by dpu_free when UPMEM_EMU_COUNTERS names a path             */

static void write_tstat(FILE *f, const tstat_t *t)
{
    fprintf(f, "{\"dma_reads\": %llu, \"dma_writes\": %llu, \"dma_read_bytes\": %llu, "
               "\"dma_write_bytes\": %llu, \"instructions\": %llu, \"barriers\": %llu, \"dma_cycles\": %.1f}",
            (unsigned long long)t->dma_reads, (unsigned long long)t->dma_writes,
            (unsigned long long)t->read_bytes, (unsigned long long)t->write_bytes,
            (unsigned long long)t->instr, (unsigned long long)t->barriers, t->dma_cycles);
}

static void write_counters(void)
{
    const char *path = getenv("UPMEM_EMU_COUNTERS");
    sys_t *s = g_sys;
    if (!path || !*path || !s) return;
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return; }
    tstat_t all = {0};
    uint64_t heap_peak = 0;
    for (uint32_t i = 0; i < s->nr; i++) {
        for (uint32_t t = 0; t < s->nr_tasklets; t++) {
            tstat_t *x = &s->dpus[i].t[t].total;
            all.dma_reads += x->dma_reads; all.dma_writes += x->dma_writes;
            all.read_bytes += x->read_bytes; all.write_bytes += x->write_bytes;
            all.instr += x->instr; all.barriers += x->barriers; all.dma_cycles += x->dma_cycles;
        }
        if (s->dpus[i].heap_peak > heap_peak) heap_peak = s->dpus[i].heap_peak;
    }
    fprintf(f, "{\"nr_dpus\": %u, \"nr_tasklets\": %u, \"launches\": %llu, \"kernel_cycles\": %.1f, "
               "\"kernel_s\": %.9g, \"frequency_hz\": %.0f, \"h2d_bytes\": %llu, \"d2h_bytes\": %llu, "
               "\"broadcast_bytes\": %llu, \"host_xfers\": %llu, \"wram_globals_bytes\": %zu, "
               "\"stack_bytes\": %u, \"wram_heap_peak_bytes\": %llu, \"totals\": ",
            s->nr, s->nr_tasklets, (unsigned long long)s->launches, s->kernel_cycles,
            s->kernel_cycles / FREQ_HZ, FREQ_HZ, (unsigned long long)s->h2d_bytes,
            (unsigned long long)s->d2h_bytes, (unsigned long long)s->bcast_bytes,
            (unsigned long long)s->xfers, s->image_size, s->stack_size, (unsigned long long)heap_peak);
    write_tstat(f, &all);
    fprintf(f, ", \"per_dpu\": [");
    for (uint32_t i = 0; i < s->nr; i++) {
        fprintf(f, "%s{\"cycles\": %.1f, \"sync_cycles\": %.1f, \"launches\": %llu, \"tasklets\": [",
                i ? ", " : "", s->dpus[i].cycles, s->dpus[i].sync_cycles,
                (unsigned long long)s->dpus[i].launches);
        for (uint32_t t = 0; t < s->nr_tasklets; t++) {
            if (t) fprintf(f, ", ");
            write_tstat(f, &s->dpus[i].t[t].total);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    fclose(f);
}
