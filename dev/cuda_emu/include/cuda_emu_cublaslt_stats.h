/* cuda_emu_cublaslt_stats.h (CUDA emulation): counters of the emulated cuBLASLt (dev/cuda_emu/cublaslt_emu.cpp). */
#ifndef CUDA_EMU_CUBLASLT_STATS_H
#define CUDA_EMU_CUBLASLT_STATS_H

#ifdef __cplusplus
extern "C" {
#endif

/* cublasLtMatmul calls that returned CUBLAS_STATUS_SUCCESS since the process started */
unsigned long long cublaslt_emu_matmul_calls(void);
/* floating-point operations (2*m*n*k per batch) of those calls */
unsigned long long cublaslt_emu_matmul_flops(void);

#ifdef __cplusplus
}
#endif
#endif /* CUDA_EMU_CUBLASLT_STATS_H */
