/* onnx-cinm UPMEM emulator: DPU-side mram.h with the SDK's signatures
 *   void mram_read(const __mram_ptr void *from, void *to, unsigned int nb_of_bytes);
 *   void mram_write(const void *from, __mram_ptr void *to, unsigned int nb_of_bytes);
 * Rules (UPMEM SDK docs, field notes upmem.md §1.3/§1.4): size in [8, 2048] and a multiple of
 * 8; MRAM and WRAM addresses 8-byte aligned; the MRAM range inside the DPU's 64 MB.
 *
 * Compile time, as the SDK's clang does: the arguments are type-checked against the
 * signatures above (under clang `__mram_ptr` is an address space, so a WRAM pointer where an
 * MRAM one belongs is an error), and a constant size outside the rules is an error (clang:
 * `diagnose_if`, as the SDK's mram.h; gcc: `__builtin_constant_p` and an `error` attribute,
 * effective at -O1 and above, which the emulator uses). Run time: the emulator aborts with the
 * caller's file and line on any broken rule (the calls are macros for that). */
#ifndef ONNX_CINM_EMU_MRAM_H
#define ONNX_CINM_EMU_MRAM_H
#include <stdint.h>
#include "attributes.h"
void __emu_mram_read(const void *from, void *to, unsigned int nb_of_bytes, const char *file, int line);
void __emu_mram_write(const void *from, void *to, unsigned int nb_of_bytes, const char *file, int line);
void *__emu_mram_heap_pointer(void);

#if defined(__clang__)
#define __EMU_DMA_SIZE_RULES(fn, nb) \
    __attribute__((diagnose_if((nb) < 8 || (nb) > 2048, fn ": the size must be in [8, 2048] bytes", "error"))) \
    __attribute__((diagnose_if((nb) % 8 != 0, fn ": the size must be a multiple of 8 bytes", "error")))
#define __EMU_DMA_SIZE_CHECK(nb) ((void)0)
#else
#define __EMU_DMA_SIZE_RULES(fn, nb)
extern void __emu_dma_size_error(void)
    __attribute__((error("mram_read/mram_write: a constant size must be a multiple of 8 in [8, 2048] bytes")));
#define __EMU_DMA_SIZE_CHECK(nb) \
    ((__builtin_constant_p(nb) && ((nb) < 8 || (nb) > 2048 || (nb) % 8 != 0)) ? __emu_dma_size_error() : (void)0)
#endif

static inline __attribute__((always_inline)) void
__emu_mram_read_typed(const __mram_ptr void *from, void *to, unsigned int nb_of_bytes, const char *file, int line)
    __EMU_DMA_SIZE_RULES("mram_read", nb_of_bytes)
{
    __emu_mram_read((const void *)from, to, nb_of_bytes, file, line);
}

static inline __attribute__((always_inline)) void
__emu_mram_write_typed(const void *from, __mram_ptr void *to, unsigned int nb_of_bytes, const char *file, int line)
    __EMU_DMA_SIZE_RULES("mram_write", nb_of_bytes)
{
    __emu_mram_write(from, (void *)to, nb_of_bytes, file, line);
}

#define mram_read(from, to, nb) \
    (__EMU_DMA_SIZE_CHECK(nb), __emu_mram_read_typed((from), (to), (nb), __FILE__, __LINE__))
#define mram_write(from, to, nb) \
    (__EMU_DMA_SIZE_CHECK(nb), __emu_mram_write_typed((from), (to), (nb), __FILE__, __LINE__))
#define DPU_MRAM_HEAP_POINTER ((__mram_ptr void *)__emu_mram_heap_pointer())
#endif
