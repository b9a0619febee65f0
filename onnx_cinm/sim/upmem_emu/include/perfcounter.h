/* onnx-cinm UPMEM emulator: DPU-side perfcounter.h. perfcounter_get returns the calling
 * tasklet's modeled cycles since the last reset: instructions x max(11, NR_TASKLETS) (the
 * 11-cycle revolver pipeline shared by the tasklets, PrIM §3) plus its DMA cycles
 * (77 + 0.5 B per read, 61 + 0.5 B per write; PrIM MRAM-latency, field notes §1.5), or its
 * instruction count under COUNT_INSTRUCTIONS. */
#ifndef ONNX_CINM_EMU_PERFCOUNTER_H
#define ONNX_CINM_EMU_PERFCOUNTER_H
#include <stdint.h>
#include <stdbool.h>
typedef uint64_t perfcounter_t;
typedef enum { COUNT_SAME, COUNT_CYCLES, COUNT_INSTRUCTIONS, COUNT_NOTHING } perfcounter_config_t;
#ifndef CLOCKS_PER_SEC
#define CLOCKS_PER_SEC 350000000
#endif
perfcounter_t perfcounter_config(perfcounter_config_t config, bool reset_value);
perfcounter_t perfcounter_get(void);
#endif
