/* onnx-cinm UPMEM emulator: DPU-side mutex.h (MUTEX_INIT, MUTEX_GET, mutex_lock/unlock).
 * MUTEX_INIT is file-scope only, as in the SDK (see attributes.h). */
#ifndef ONNX_CINM_EMU_MUTEX_H
#define ONNX_CINM_EMU_MUTEX_H
#include <stdint.h>
#include <stdbool.h>
#include "attributes.h"
struct __emu_mutex { uint32_t locked; uint32_t owner; };
typedef struct __emu_mutex *mutex_id_t;
#define MUTEX_INIT(name) \
    __EMU_FILE_SCOPE_ONLY(mutex, name) \
    struct __emu_mutex __emu_mutex_##name = {0, 0}; mutex_id_t name = &__emu_mutex_##name
#define MUTEX_GET(name) (name)
void mutex_lock(mutex_id_t mutex);
bool mutex_trylock(mutex_id_t mutex);
void mutex_unlock(mutex_id_t mutex);
#endif
