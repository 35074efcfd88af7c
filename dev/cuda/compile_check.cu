/* compile_check.cu: builds every launcher, kernel and template of llmc/cuda/cuda_common.cuh, matmul.cuh and
 * attention.cuh, so that `nvcc -Werror all-warnings` sees all of it. Nothing runs: the calls sit behind
 * a branch no command line takes (argc > 99), so the binary also links on a machine without a GPU.
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Werror all-warnings -o build/compile_check dev/cuda/compile_check.cu -lcublasLt -lcublas */
#include "../../llmc/cuda/cuda_common.cuh"
#include "../../llmc/cuda/matmul.cuh"
#include "../../llmc/cuda/attention.cuh"

/* instantiates the reduction helpers: out[block] = sum and max of in over the block's slice */
__global__ void compile_check_reduce_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float x = i < n ? in[i] : 0.0f;
    float s = block_reduce_sum(x);
    float s2 = block_reduce_sum(x * x); /* a second call in the same kernel */
    float m = warp_reduce_max(x);
    if (threadIdx.x == 0) { out[3 * blockIdx.x] = s; out[3 * blockIdx.x + 1] = s2; out[3 * blockIdx.x + 2] = m; }
}

int main(int argc, char** argv) {
    (void)argv;
    if (argc > 99) {
        cudaStream_t s = 0;
        cuda_device_check_or_exit("compile_check");
        const int B = 2, T = 5, H = 4, KV = 2, hd = 32, N = B * T, I = 64, O = 48;
        float* f = cuda_workspace_f32(0, 1 << 20);
        bf16* h = (bf16*)cuda_workspace_f32(1, 1 << 20);
        compile_check_reduce_kernel<<<1, 64, 0, s>>>(f, f + 1000, 64);
        cudaCheck(cudaGetLastError());
        matmul_init();
        matmul_bf16(f, 1, h, h + 4096, 8, 8, 8, 0, 1, 1.0f, 0.0f, 1, 0, 0, 0, s);
        matmul_bf16(h + 8192, 0, h, h + 4096, 8, 8, 8, 1, 0, 1.0f, 1.0f, 3, 64, 64, 64, s);
        linear_forward(h + 8192, h, h + 4096, N, I, O, s);
        linear_backward_dx(f, h, h + 4096, N, I, O, 1, s);
        linear_backward_dw(f, h, h + 4096, N, I, O, s);
        bf16* buf = (bf16*)cuda_workspace_f32(2, 1 << 20);
        bf16 *q = buf, *k = q + N * H * hd, *v = k + N * KV * hd, *out = v + N * KV * hd;
        bf16 *logits = out + N * H * hd, *probs = logits + B * H * T * T;
        bf16 *dq = probs + B * H * T * T, *dk = dq + N * H * hd, *dv = dk + N * KV * hd;
        attention_forward(out, logits, probs, q, k, v, B, T, H, KV, hd, s);
        attention_backward(dq, dk, dv, out, probs, q, k, v, B, T, H, KV, hd, s);
        cudaCheck(cudaStreamSynchronize(s));
        matmul_free();
        cuda_workspace_free_all();
#ifdef USE_NCCL
        ncclCheck(ncclGroupStart());
        ncclCheck(ncclGroupEnd());
#endif
    }
    printf("compile_check: built (nothing is run)\n");
    return 0;
}
