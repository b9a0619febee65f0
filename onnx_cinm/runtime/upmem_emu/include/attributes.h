/* onnx-cinm UPMEM emulator: DPU-side attributes (SDK names, our definitions).
 * On a real DPU `__mram_ptr` is an address-space qualifier; here MRAM pointers are plain
 * pointers holding small fake addresses (0x08000000 + offset, the DPU linker's MRAM base) that
 * mram_read/mram_write translate into the current DPU's 64 MB buffer. Never dereference one. */
#ifndef ONNX_CINM_EMU_ATTRIBUTES_H
#define ONNX_CINM_EMU_ATTRIBUTES_H
#define __mram_ptr
#define __dma_aligned __attribute__((aligned(8)))
#define __host __attribute__((aligned(8), used))
#define __keep __attribute__((used))
/* Uninitialised MRAM globals: a NOBITS section of the DPU shared object whose bytes are never
 * used; addresses inside it are translated to per-DPU MRAM offsets [0, section size). */
#define __mram_noinit __attribute__((section("emu_mram,\"aw\",@nobits#"), aligned(8), used))
#endif
