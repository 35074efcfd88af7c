/* compile_check_elementwise.cu: instantiates every launcher of the element-wise / reduction CUDA
 * files (rmsnorm, rope, mlp, residual, convert, embedding, classifier, adamw, global_norm) so that
 * each kernel template is compiled for the target architecture. It does not run anything unless
 * called with 100+ arguments (never, in practice): it exists to be compiled, e.g.
 *   nvcc -O3 -arch=sm_90 -Xcompiler -Wall dev/cuda/compile_check_elementwise.cu -o /tmp/cc_elem
 *   nvcc -O3 -arch=sm_80 -Xcompiler -Wall dev/cuda/compile_check_elementwise.cu -o /tmp/cc_elem */
#include <stdio.h>
#include "../../llmc/cuda/cuda_common.cuh"
#include "../../llmc/cuda/convert.cuh"
#include "../../llmc/cuda/rmsnorm.cuh"
#include "../../llmc/cuda/rope.cuh"
#include "../../llmc/cuda/mlp.cuh"
#include "../../llmc/cuda/residual.cuh"
#include "../../llmc/cuda/embedding.cuh"
#include "../../llmc/cuda/classifier.cuh"
#include "../../llmc/cuda/adamw.cuh"
#include "../../llmc/cuda/global_norm.cuh"

int main(int argc, char** argv) {
    (void)argv;
    if (argc > 99) {
        cudaStream_t s = 0;
        bf16 *a = NULL, *b = NULL, *c = NULL, *d = NULL;
        float *f = NULL, *f2 = NULL, *f3 = NULL, *f4 = NULL;
        int* tok = NULL;
        size_t n = (size_t)argc;
        int N = argc, C = argc, V = argc;
        /* convert */
        f32_to_bf16(a, f, n, s);
        bf16_to_f32(f, a, n, s);
        /* rmsnorm */
        rmsnorm_forward(a, f, b, c, N, C, 1e-5f, s);
        rmsnorm_forward(a, f, b, NULL, N, C, 1e-5f, s);
        rmsnorm_backward(a, f2, b, c, d, f, N, C, 1e-5f, 1, s);
        rmsnorm_backward(a, NULL, b, c, NULL, f, N, C, 1e-5f, 0, s);
        /* rope */
        rope_forward(a, b, f, f2, 2, 3, 4, 64, ROPE_HF, s);
        rope_backward(a, b, f, f2, 2, 3, 4, 64, ROPE_NANOCHAT, s);
        /* mlp */
        silu_forward(a, b, n, s);
        silu_backward(a, b, c, n, s);
        mul_forward(a, b, c, n, s);
        mul_backward(a, b, c, d, a, n, s);
        relu2_forward(a, b, n, s);
        relu2_backward(a, b, c, n, s);
        /* residual */
        residual_forward(a, b, c, n, s);
        /* embedding */
        embedding_forward(a, tok, b, N, C, s);
        embedding_backward(f, a, tok, N, C, s);
        /* classifier */
        softcap_forward(a, n, 15.0f, s);
        crossentropy_forward(f, f2, a, tok, N, V, s);
        crossentropy_softcap_backward(a, a, f2, tok, N, V, 1.0f / N, 15.0f, s);
        /* optimizer */
        adamw_update(f, a, f2, f3, f4, n, 1.0f, 0.99f, 0.9f, 0.95f, 1e-8f, 1e-3f, 0.5f, s);
        double g2 = global_norm_squared(f, n, s);
        printf("%g\n", g2);
        cuda_workspace_free_all();
    }
    printf("compile_check_elementwise: nothing to run (compile-only check)\n");
    return 0;
}
