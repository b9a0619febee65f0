/* onnx-cinm UPMEM emulator: DPU-side defs.h (SDK names: me(), NR_TASKLETS, halt). */
#ifndef ONNX_CINM_EMU_DEFS_H
#define ONNX_CINM_EMU_DEFS_H
#include <stdint.h>
#include "attributes.h"
#ifndef NR_TASKLETS
#define NR_TASKLETS 1
#endif
#define UPMEM_EMU 1
typedef uint32_t sysname_t;
sysname_t me(void);
void halt(void);
int check_stack(void);
/* Emulator-only instruction accounting: a DPU program may call EMU_COUNT(n) to say "n
 * instruction-equivalents happened here"; on a real DPU define it as ((void)0). */
void __emu_count(uint64_t n);
#define EMU_COUNT(n) __emu_count((uint64_t)(n))
#endif
