/* onnx-cinm UPMEM emulator: DPU-side barrier.h. A barrier is a WRAM global (so per DPU);
 * every tasklet of the DPU blocks in barrier_wait until `count` have arrived. */
#ifndef ONNX_CINM_EMU_BARRIER_H
#define ONNX_CINM_EMU_BARRIER_H
#include <stdint.h>
typedef struct { uint32_t count; uint32_t waiting; uint32_t generation; } barrier_t;
#define BARRIER_INIT(name, cnt) barrier_t name = {(cnt), 0, 0}
void __emu_barrier_wait(barrier_t *barrier, const char *file, int line);
#define barrier_wait(b) __emu_barrier_wait((b), __FILE__, __LINE__)
#endif
