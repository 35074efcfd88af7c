/* stats.h: counts of the device work of one training step, for `-stats`.
 *
 * The GPU trainer fills them where they can be counted: on the CUDA emulation (dev/cuda_emu,
 * cuda_emu.h's counters) every field; on a real GPU only the element-wise byte estimates (the
 * launchers' own accounting, cuda_common.cuh ew_account) and the fields the trainer counts itself,
 * the rest -1 (logged as null). The CPU trainer has none (model_device_stats returns 0).
 * Per step (the loop subtracts the counts at the step's start from those after its update):
 *   launches     kernel launches (cuBLASLt GEMMs count as one launch each on the emulation)
 *   syncs        host synchronisations: stream/device synchronisations, synchronous device-to-host
 *                copies, and asynchronous device-to-host copies into pageable memory (which return
 *                only when the copy is done, as CUDA documents)
 *   loop_syncs   those of them issued inside the forward's and the backward's layer loops (the trainer
 *                counts them around its loops; 0 is the requirement, with or without protection)
 *   d2h          device-to-host copies
 *   dev_bytes    device memory allocated at the end of the step (not a difference), alloc_bytes: allocated
 *                during the step (grown workspaces, first-use buffers)
 *   ew_read, ew_written   bytes the element-wise kernels read and wrote (each launch's documented
 *                estimate of its compulsory traffic, cuda_common.cuh ew_account: every input element read
 *                once, every output written once; the element-wise, norm (the dw partial pass's own
 *                reads included), embedding, classifier and optimizer kernels; GEMMs, attention, the
 *                checks and the one-off kernels are not counted; -cost_out has every launch's record) */
#ifndef TSDC_STATS_H
#define TSDC_STATS_H

typedef struct {
    long long launches, syncs, loop_syncs, d2h, dev_bytes, alloc_bytes, ew_read, ew_written;
} DeviceStats;

#define DEVICE_STATS_UNKNOWN(s) do { (s)->launches = (s)->syncs = (s)->loop_syncs = (s)->d2h = -1; \
    (s)->dev_bytes = (s)->alloc_bytes = (s)->ew_read = (s)->ew_written = -1; } while (0)

#endif
