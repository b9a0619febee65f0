/* onnx-cinm UPMEM emulator: DPU-side barrier.h. A barrier is a WRAM global (so per DPU);
 * every tasklet of the DPU blocks in barrier_wait until `count` have arrived.
 * BARRIER_INIT is file-scope only, as in the SDK (see attributes.h), and its count must be a
 * constant in 1..127 (the SDK encodes it in a byte; field notes upmem.md §1.3). */
#ifndef ONNX_CINM_EMU_BARRIER_H
#define ONNX_CINM_EMU_BARRIER_H
#include <stdint.h>
#include "attributes.h"
typedef struct { uint32_t count; uint32_t waiting; uint32_t generation; } barrier_t;
#define BARRIER_INIT(name, cnt) \
    _Static_assert((cnt) >= 1 && (cnt) < 128, "BARRIER_INIT: the count must be a constant in 1..127"); \
    __EMU_FILE_SCOPE_ONLY(barrier, name) \
    barrier_t name = {(cnt), 0, 0}
void __emu_barrier_wait(barrier_t *barrier, const char *file, int line);
#define barrier_wait(b) __emu_barrier_wait((b), __FILE__, __LINE__)
#endif
