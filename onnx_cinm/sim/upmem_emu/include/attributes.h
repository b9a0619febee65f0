/* onnx-cinm UPMEM emulator: DPU-side attributes (SDK names, our definitions).
 *
 * `__mram_ptr`: on a real DPU an address-space qualifier (clang `address_space(255)`, SDK
 * attributes.h, field notes upmem.md §1.3), so an MRAM pointer and a WRAM pointer are distinct
 * types: passing one where the other is expected (e.g. swapped mram_read arguments) is a
 * compile error. Under clang we define it the same way, so the emulator and the DPU-data-model
 * syntax check (tests/test_upmem_toolchain.py) reject what the SDK rejects. gcc has no such
 * qualifier: there it is empty. Either way an MRAM pointer holds a small fake address
 * (0x08000000 + offset, the DPU linker's MRAM base) that mram_read/mram_write translate into
 * the current DPU's 64 MB buffer. Never dereference one. */
#ifndef ONNX_CINM_EMU_ATTRIBUTES_H
#define ONNX_CINM_EMU_ATTRIBUTES_H
#if defined(__clang__)
#define __mram_ptr __attribute__((address_space(255)))
#else
#define __mram_ptr
#endif
#define __dma_aligned __attribute__((aligned(8)))
#define __host __attribute__((aligned(8), used))
#define __keep __attribute__((used))
/* Uninitialised MRAM globals: a NOBITS section of the DPU shared object whose bytes are never
 * used; addresses inside it are translated to per-DPU MRAM offsets [0, section size). */
#define __mram_noinit __attribute__((section("emu_mram,\"aw\",@nobits#"), aligned(8), used))
/* File-scope-only macros (BARRIER_INIT, MUTEX_INIT): the SDK's expand to section-placed
 * globals that only exist at file scope; ours add a function definition, which C allows only
 * at file scope (gcc: "invalid storage class for function", clang: "function definition is
 * not allowed here"), so a block-scope use fails to compile here too. */
#define __EMU_FILE_SCOPE_ONLY(what, name) \
    static void __attribute__((unused)) __emu_##what##_must_be_at_file_scope_##name(void) {}
#endif
