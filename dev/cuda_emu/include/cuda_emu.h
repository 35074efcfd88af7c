/* cuda_emu.h (CUDA emulation, dev/cuda_emu): the emulator's own C API, for tests that want to know what
 * the emulated program did (kernel launches, host synchronisations, device memory). Not part of CUDA:
 * code that uses it must guard the include with #ifdef __CUDA_EMU__. EMU_STATS=1 prints the same
 * counters to stderr at exit. */
#ifndef CUDA_EMU_H
#define CUDA_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    unsigned long long launches;     /* kernel launches that ran (a launch refused by a check is not counted) */
    unsigned long long host_syncs;   /* cudaStreamSynchronize, cudaDeviceSynchronize, synchronous
                                        device-to-host cudaMemcpy calls, and asynchronous ones into
                                        pageable memory (CUDA returns from those when the copy is done) */
    unsigned long long d2h_copies;   /* device-to-host copies (sync and async) */
    unsigned long long d2h_bytes;
    size_t device_bytes;             /* device memory allocated now (cudaMalloc sizes as requested) */
    size_t device_bytes_peak;        /* the most allocated at one time */
    unsigned long long allocations;  /* cudaMalloc calls that succeeded */
    unsigned long long allocated_bytes;  /* their sizes summed (never decreases) */
    unsigned long long pageable_async;   /* asynchronous device-to-host copies into pageable memory (in host_syncs) */
} emu_counters_t;

/* the counters since the start of the process */
const emu_counters_t* emu_counters(void);
/* the digest of all device-to-host copies so far (see EMU_DIGEST in emu_runtime.cpp) */
unsigned long long emu_digest(void);
/* a library emulation (cuBLASLt) running "device work" on the host: names it as the last launch, so
 * digests and error messages name it */
void emu_note_launch(const char* name);
/* 1 in cost-only mode (EMU_COST_ONLY=1, emu_runtime.cpp): launches, GEMMs and collectives are checked and
 * counted but not run, device memory is reserved but never touched, device-to-host copies give zeros */
int emu_cost_only(void);
/* 1 when [p, p + bytes) lies inside one live device allocation */
int emu_is_device_range(const void* p, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
