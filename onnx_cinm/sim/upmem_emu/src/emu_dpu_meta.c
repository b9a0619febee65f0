/* onnx-cinm UPMEM emulator: linked into every emulated DPU program (dpu.so). It records the
 * program's compile-time facts (NR_TASKLETS, stack size) and the bounds of its __mram_noinit
 * section for the runtime in the host executable. */
#include <stdint.h>
#ifndef NR_TASKLETS
#define NR_TASKLETS 1
#endif
/* The SDK sets each tasklet's stack with STACK_SIZE_DEFAULT / STACK_SIZE_TASKLET_<n> (multiples
 * of 8; field notes upmem.md §1.3). 1024 B is our assumed default; pass -DSTACK_SIZE_DEFAULT=..
 * to change it. */
#ifndef STACK_SIZE_DEFAULT
#define STACK_SIZE_DEFAULT 1024
#endif
extern char __start_emu_mram[] __attribute__((weak, visibility("hidden")));
extern char __stop_emu_mram[] __attribute__((weak, visibility("hidden")));
const uint32_t __emu_nr_tasklets = NR_TASKLETS;
const uint32_t __emu_stack_size = STACK_SIZE_DEFAULT;
char *__emu_mram_section_start(void) { return __start_emu_mram; }
char *__emu_mram_section_stop(void) { return __stop_emu_mram; }
