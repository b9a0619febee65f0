/* onnx-cinm UPMEM emulator: DPU-side mram.h. mram_read/mram_write are macros so a broken
 * transfer is reported with the caller's file and line. Rules (UPMEM SDK docs, field notes
 * upmem.md §1.3/§1.4): size in [8, 2048] and a multiple of 8; MRAM and WRAM addresses 8-byte
 * aligned; the MRAM range inside the DPU's 64 MB. */
#ifndef ONNX_CINM_EMU_MRAM_H
#define ONNX_CINM_EMU_MRAM_H
#include <stdint.h>
#include "attributes.h"
void __emu_mram_read(const void *from, void *to, unsigned int nb_of_bytes, const char *file, int line);
void __emu_mram_write(const void *from, void *to, unsigned int nb_of_bytes, const char *file, int line);
void *__emu_mram_heap_pointer(void);
#define mram_read(from, to, nb) __emu_mram_read((const void *)(from), (void *)(to), (nb), __FILE__, __LINE__)
#define mram_write(from, to, nb) __emu_mram_write((const void *)(from), (void *)(to), (nb), __FILE__, __LINE__)
#define DPU_MRAM_HEAP_POINTER ((__mram_ptr void *)__emu_mram_heap_pointer())
#endif
