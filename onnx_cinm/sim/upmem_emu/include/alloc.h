/* onnx-cinm UPMEM emulator: DPU-side alloc.h. mem_alloc is a bump allocator in the WRAM left
 * after the globals and the tasklet stacks (8-byte aligned, no free); over 64 KB is a rule error. */
#ifndef ONNX_CINM_EMU_ALLOC_H
#define ONNX_CINM_EMU_ALLOC_H
#include <stddef.h>
void *__emu_mem_alloc(size_t size, const char *file, int line);
void *mem_reset(void);
#define mem_alloc(size) __emu_mem_alloc((size), __FILE__, __LINE__)
#endif
