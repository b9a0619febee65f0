/* onnx-cinm UPMEM emulator: host-side dpu.h with the UPMEM SDK's names and signatures
 * (field notes upmem.md §1.2). Transfer functions are macros so that a broken transfer is
 * reported with the caller's file and line; they still return dpu_error_t and nest in
 * DPU_ASSERT like the SDK's. */
#ifndef ONNX_CINM_EMU_DPU_H
#define ONNX_CINM_EMU_DPU_H
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum {
    DPU_OK = 0, DPU_ERR_INTERNAL, DPU_ERR_SYSTEM, DPU_ERR_DRIVER, DPU_ERR_ALLOCATION,
    DPU_ERR_INVALID_DPU_SET, DPU_ERR_INVALID_THREAD_ID, DPU_ERR_INVALID_WRAM_ACCESS,
    DPU_ERR_INVALID_IRAM_ACCESS, DPU_ERR_INVALID_MRAM_ACCESS, DPU_ERR_INVALID_SYMBOL_ACCESS,
    DPU_ERR_MRAM_BUSY, DPU_ERR_TRANSFER_ALREADY_SET, DPU_ERR_DIFFERENT_DPU_PROGRAMS,
    DPU_ERR_DPU_FAULT, DPU_ERR_ELF_INVALID_FILE, DPU_ERR_TIMEOUT, DPU_ERR_INVALID_PROFILE,
    DPU_ERR_UNKNOWN_SYMBOL
} dpu_error_t;

typedef enum { DPU_XFER_TO_DPU, DPU_XFER_FROM_DPU } dpu_xfer_t;
typedef enum { DPU_XFER_DEFAULT = 0, DPU_XFER_NO_RESET = 1 << 0, DPU_XFER_ASYNC = 1 << 1 } dpu_xfer_flags_t;
typedef enum { DPU_SYNCHRONOUS, DPU_ASYNCHRONOUS } dpu_launch_policy_t;

#define DPU_ALLOCATE_ALL 0xFFFFFFFFu
#define DPU_MRAM_HEAP_POINTER_NAME "__sys_used_mram_end"

struct dpu_program_t;
struct dpu_symbol_t { uint32_t address; uint32_t size; };
/* A set of DPUs [first, first + count) of one allocation; a single DPU has count 1. */
struct dpu_set_t { uint32_t first; uint32_t count; void *sys; };

const char *dpu_error_to_string(dpu_error_t status);

dpu_error_t dpu_alloc(uint32_t nr_dpus, const char *profile, struct dpu_set_t *dpu_set);
dpu_error_t dpu_free(struct dpu_set_t dpu_set);
dpu_error_t dpu_get_nr_dpus(struct dpu_set_t dpu_set, uint32_t *nr_dpus);
dpu_error_t dpu_get_nr_ranks(struct dpu_set_t dpu_set, uint32_t *nr_ranks);
dpu_error_t __emu_dpu_load(struct dpu_set_t dpu_set, const char *binary_path, struct dpu_program_t **program,
                           const char *file, int line);
dpu_error_t __emu_dpu_launch(struct dpu_set_t dpu_set, dpu_launch_policy_t policy, const char *file, int line);
#define dpu_load(set, path, program) __emu_dpu_load((set), (path), (program), __FILE__, __LINE__)
#define dpu_launch(set, policy) __emu_dpu_launch((set), (policy), __FILE__, __LINE__)
dpu_error_t dpu_sync(struct dpu_set_t dpu_set);
dpu_error_t dpu_prepare_xfer(struct dpu_set_t dpu_set, void *buffer);

dpu_error_t __emu_push_xfer(struct dpu_set_t dpu_set, dpu_xfer_t xfer, const char *symbol_name,
                            uint32_t symbol_offset, size_t length, dpu_xfer_flags_t flags,
                            const char *file, int line);
dpu_error_t __emu_broadcast_to(struct dpu_set_t dpu_set, const char *symbol_name, uint32_t symbol_offset,
                               const void *src, size_t length, dpu_xfer_flags_t flags,
                               const char *file, int line);
dpu_error_t __emu_copy_to(struct dpu_set_t dpu_set, const char *symbol_name, uint32_t symbol_offset,
                          const void *src, size_t length, const char *file, int line);
dpu_error_t __emu_copy_from(struct dpu_set_t dpu_set, const char *symbol_name, uint32_t symbol_offset,
                            void *dst, size_t length, const char *file, int line);
#define dpu_push_xfer(set, xfer, name, off, len, flags) \
    __emu_push_xfer((set), (xfer), (name), (off), (len), (flags), __FILE__, __LINE__)
#define dpu_broadcast_to(set, name, off, src, len, flags) \
    __emu_broadcast_to((set), (name), (off), (src), (len), (flags), __FILE__, __LINE__)
#define dpu_copy_to(set, name, off, src, len) __emu_copy_to((set), (name), (off), (src), (len), __FILE__, __LINE__)
#define dpu_copy_from(set, name, off, dst, len) __emu_copy_from((set), (name), (off), (dst), (len), __FILE__, __LINE__)

/* Iteration: DPU_FOREACH(set, dpu) or DPU_FOREACH(set, dpu, index). */
bool __emu_dpu_iter(const struct dpu_set_t *set, struct dpu_set_t *dpu, uint32_t index);
#define __EMU_FOREACH_PICK(a, b, c, name, ...) name
#define __EMU_FOREACH2(set, dpu) for (uint32_t __emu_it = 0; __emu_dpu_iter(&(set), &(dpu), __emu_it); __emu_it++)
#define __EMU_FOREACH3(set, dpu, i) for ((i) = 0; __emu_dpu_iter(&(set), &(dpu), (i)); (i)++)
#define DPU_FOREACH(...) __EMU_FOREACH_PICK(__VA_ARGS__, __EMU_FOREACH3, __EMU_FOREACH2, unused)(__VA_ARGS__)

#define DPU_ASSERT(statement) do { dpu_error_t __emu_err = (statement); if (__emu_err != DPU_OK) { \
    fprintf(stderr, "%s:%d(%s): DPU Error (%s)\n", __FILE__, __LINE__, __func__, dpu_error_to_string(__emu_err)); \
    exit(EXIT_FAILURE); } } while (0)
#endif
