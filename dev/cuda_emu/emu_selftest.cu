/* emu_selftest.cu: tests of the CUDA emulation itself (dev/cuda_emu): that it computes what a GPU
 * computes, and that it FAILS where a GPU would fail, each with a message naming the kernel.
 * Written in CUDA (built through cu2emu.py like the project's sources).
 *
 *   ./emu_selftest            every test; the failure cases run in child processes (this binary with
 *                             --case NAME, so the parent's OpenMP threads are never forked) whose exit
 *                             status and stderr are checked
 *   ./emu_selftest --case NAME    one failure case (exits non-zero when the emulator catches it)
 *
 * Checked: thread/block indices of 3-D grids; block reductions through shared memory and shuffles
 * under every schedule; every warp intrinsic's result (including partial masks and widths); integer
 * atomics across parallel blocks; cudaMalloc poison (0xFF) and shared-memory poison; the launch
 * limits (threads per block, block and grid dimensions, zero dimensions, dynamic shared memory over
 * 48 KiB without the opt-in, with it, and over the 227 KiB opt-in limit) with the error codes and the
 * kernel not run; wrong-direction and out-of-range cudaMemcpy / cudaMemset, cudaFree of a pointer
 * that is not an allocation; the counters; and in child processes: a divergent __syncthreads (some
 * threads exited; threads at different barriers), a warp intrinsic whose mask names an exited lane,
 * a shuffle reading a lane outside its mask, out-of-bounds reads and writes (past the end, before
 * the start) of a cudaMalloc buffer, static shared memory over 48 KiB, and a planted intra-block race
 * (a shared-memory reduction without its __syncthreads) that gives different results and different
 * EMU_DIGEST digests under EMU_SCHEDULE=fwd and rev while the correct reduction does not. */
#include <cuda_runtime.h>
#include <cuda_emu.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

static int n_pass = 0, n_fail = 0;
static void check(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("  ");
    vprintf(fmt, ap);
    va_end(ap);
    printf("  %s\n", ok ? "OK" : "NOT OK");
    fflush(stdout);
    (ok ? n_pass : n_fail)++;
}

/* ----------------------------------------------------------------------------------- kernels */
__global__ void index_kernel(unsigned* out) {
    const unsigned bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[bx * nt + tx] = (blockIdx.x << 24) | (blockIdx.y << 20) | (blockIdx.z << 16) | (threadIdx.x << 8) | (threadIdx.y << 4) | threadIdx.z;
}

/* sum of x over each block: warp butterflies, then warp 0 through shared memory */
__global__ void block_sum_kernel(float* out, const float* x) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

/* the same reduction through a shared array, tree style; `racy` drops the __syncthreads of the tree */
__global__ void tree_sum_kernel(float* out, const float* x, int racy) {
    __shared__ float s[256];
    s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        if (!racy) __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

/* every warp intrinsic, lane by lane: out[lane * 16 + k] */
__global__ void warp_ops_kernel(int* out) {
    const int lane = threadIdx.x;
    int* o = out + lane * 16;
    o[0] = __shfl_sync(0xffffffffu, lane * 10, 7);            /* broadcast from lane 7 */
    o[1] = __shfl_xor_sync(0xffffffffu, lane * 10, 5);        /* lane ^ 5 */
    o[2] = __shfl_down_sync(0xffffffffu, lane * 10, 3);       /* lane + 3, own value at the top */
    o[3] = __shfl_up_sync(0xffffffffu, lane * 10, 2);         /* lane - 2, own value at the bottom */
    o[4] = __shfl_xor_sync(0xffffffffu, lane * 10, 1, 8);     /* width 8 */
    o[5] = __shfl_down_sync(0xffffffffu, lane * 10, 6, 8);    /* width 8: stays in the group */
    o[6] = __any_sync(0xffffffffu, lane == 13);
    o[7] = __all_sync(0xffffffffu, lane < 31);
    o[8] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    if (lane < 16) o[9] = __shfl_xor_sync(0x0000ffffu, lane * 10, 8);   /* half-warp mask */
    else o[9] = __shfl_xor_sync(0xffff0000u, lane * 10, 8);
    __syncwarp();
    double d = __shfl_sync(0xffffffffu, (double)lane + 0.5, 31);
    o[10] = (int)(d * 2);
    unsigned long long u = __shfl_xor_sync(0xffffffffu, (unsigned long long)lane << 40, 16);
    o[11] = (int)(u >> 40);
}

__global__ void atomic_kernel(int* counter, unsigned* flags) {
    atomicAdd(counter, 1);
    if (atomicExch(flags + (threadIdx.x & 7), 1u) == 0) atomicAdd(counter + 1, 1);
}

/* reads shared memory nobody wrote (poison) and a buffer element nobody wrote */
__global__ void poison_kernel(unsigned* out, const float* unwritten) {
    __shared__ unsigned sh[64];
    if (threadIdx.x == 0) {
        out[0] = sh[5];
        float f = unwritten[3];
        out[1] = f != f;   /* NaN */
        memcpy(&out[2], &f, 4);
    }
}

__global__ void dyn_smem_kernel(int* out, int n) {
    extern __shared__ int dyn[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) dyn[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long s = 0;
        for (int i = 0; i < n; i++) s += dyn[i];
        out[0] = (int)(s % 1000003);
    }
}

__global__ void nop_kernel(int* out) {
    if (out) out[0] = 1;
}

/* ------------------------------------------------------------------ failure cases (children) */
__global__ void divergent_exit_kernel(float* out) {
    __shared__ float s[64];
    if (threadIdx.x >= 16) return;
    s[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) & 15];
}
__global__ void divergent_lines_kernel(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.0f;
}
__global__ void warp_exited_kernel(float* out) {
    if (threadIdx.x >= 16) return;
    float v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    out[threadIdx.x] = v;
}
__global__ void warp_mask_read_kernel(float* out) {
    /* the mask names the low half only, but lane ^ 16 reads the high half */
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (float)threadIdx.x, 16);
    else out[threadIdx.x] = __shfl_xor_sync(0xffff0000u, (float)threadIdx.x, 16);
}
__global__ void oob_read_kernel(float* out, const float* in, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i < n ? i : 0] = in[i];    /* i == n: one past the end */
}
__global__ void oob_write_kernel(float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n + 4) out[i] = 1.0f;              /* 4 elements past the end */
}
__global__ void oob_before_kernel(float* out, int n) {
    const int i = (int)threadIdx.x;
    if (i < n) out[i - 1] = 1.0f;              /* out[-1] */
}
__global__ void big_static_smem_kernel(float* out) {
    __shared__ float big[12800];   /* 51200 bytes: over 48 KiB */
    big[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = big[threadIdx.x];
}

/* ------------------------------------------------------------------------------ child runner */
struct Child { int status; std::string out, err; };
static Child run_child(const char* const* args, const char* env_assign) {
    int po[2], pe[2];
    if (pipe(po) || pipe(pe)) { perror("pipe"); exit(1); }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(po[1], 1);
        dup2(pe[1], 2);
        close(po[0]); close(pe[0]); close(po[1]); close(pe[1]);
        if (env_assign) putenv((char*)env_assign);
        std::vector<char*> argv;
        argv.push_back((char*)"/proc/self/exe");
        for (int i = 0; args[i]; i++) argv.push_back((char*)args[i]);
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    Child c;
    char buf[4096];
    /* small outputs: read stdout then stderr (the children write little) */
    ssize_t k;
    while ((k = read(po[0], buf, sizeof(buf))) > 0) c.out.append(buf, (size_t)k);
    while ((k = read(pe[0], buf, sizeof(buf))) > 0) c.err.append(buf, (size_t)k);
    close(po[0]);
    close(pe[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return c;
}

static std::string first_line(const std::string& s) {
    size_t e = s.find('\n');
    return e == std::string::npos ? s : s.substr(0, e);
}

/* a failure case: exit status 1 (the emulator's error exit, not a crash or a hang) and stderr naming
 * the kernel and the expected phrase */
static void expect_failure(const char* name, const char* kernel, const char* phrase) {
    const char* args[] = {"--case", name, nullptr};
    Child c = run_child(args, nullptr);
    bool ok = c.status == 1 && c.err.find(kernel) != std::string::npos && c.err.find(phrase) != std::string::npos;
    check(ok, "%-22s exit %d, stderr names %s and says \"%s\": %s", name, c.status, kernel, phrase, ok ? "yes" : "NO");
    if (!ok) printf("      stderr: %s\n      stdout: %s\n", c.err.c_str(), first_line(c.out).c_str());
    else printf("      %s\n", first_line(c.err).c_str());
}

static int run_case(const char* name) {
    float* d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    if (!strcmp(name, "divergent_exit")) {
        divergent_exit_kernel<<<1, 64>>>(d);
    } else if (!strcmp(name, "divergent_lines")) {
        divergent_lines_kernel<<<1, 64>>>(d);
    } else if (!strcmp(name, "warp_exited_lane")) {
        warp_exited_kernel<<<1, 32>>>(d);
    } else if (!strcmp(name, "warp_mask_read")) {
        warp_mask_read_kernel<<<1, 32>>>(d);
    } else if (!strcmp(name, "oob_read")) {
        float* in = nullptr;
        cudaMalloc(&in, 1000 * sizeof(float));   /* 4000 bytes, a multiple of 16: the end touches the guard page */
        cudaMemset(in, 0, 1000 * sizeof(float));
        float* out = nullptr;
        cudaMalloc(&out, 1000 * sizeof(float));
        oob_read_kernel<<<4, 256>>>(out, in, 1000);
    } else if (!strcmp(name, "oob_write")) {
        float* out = nullptr;
        cudaMalloc(&out, 1000 * sizeof(float));
        oob_write_kernel<<<4, 256>>>(out, 1000);
    } else if (!strcmp(name, "oob_before")) {
        float* out = nullptr;
        cudaMalloc(&out, 1024 * sizeof(float));  /* a whole page: the guard page is right below */
        oob_before_kernel<<<1, 32>>>(out, 32);
    } else if (!strcmp(name, "static_smem_48k")) {
        big_static_smem_kernel<<<1, 64>>>(d);
    } else if (!strncmp(name, "race", 4)) {
        /* print the block sums of the racy (race_racy) or correct (race_ok) tree reduction */
        const int nb = 8;
        float h[nb * 256];
        for (int i = 0; i < nb * 256; i++) h[i] = (float)((i * 37) % 101) * 0.25f;
        float *x = nullptr, *o = nullptr;
        cudaMalloc(&x, sizeof(h));
        cudaMalloc(&o, nb * sizeof(float));
        cudaMemcpy(x, h, sizeof(h), cudaMemcpyHostToDevice);
        tree_sum_kernel<<<nb, 256>>>(o, x, !strcmp(name, "race_racy"));
        float r[nb];
        cudaMemcpy(r, o, sizeof(r), cudaMemcpyDeviceToHost);
        for (int i = 0; i < nb; i++) printf("%.9g ", r[i]);
        printf("\n");
        return 0;
    } else {
        fprintf(stderr, "no such case: %s\n", name);
        return 2;
    }
    cudaDeviceSynchronize();
    cudaError_t e = cudaGetLastError();
    printf("case %s: the emulator did not stop the program (last error %s)\n", name, cudaGetErrorString(e));
    return 0;   /* not caught: the parent reports it */
}

/* ------------------------------------------------------------------------------------- tests */
static void test_indices(void) {
    printf("thread and block indices (grid (3,2,2), block (4,3,2))\n");
    dim3 grid(3, 2, 2), block(4, 3, 2);
    const int nt = 24, nb = 12;
    unsigned* d = nullptr;
    cudaMalloc(&d, nb * nt * sizeof(unsigned));
    index_kernel<<<grid, block>>>(d);
    unsigned h[nb * nt];
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (unsigned bz = 0; bz < 2; bz++) for (unsigned by = 0; by < 2; by++) for (unsigned bx = 0; bx < 3; bx++)
        for (unsigned tz = 0; tz < 2; tz++) for (unsigned ty = 0; ty < 3; ty++) for (unsigned tx = 0; tx < 4; tx++) {
            unsigned b = bx + 3 * (by + 2 * bz), t = tx + 4 * (ty + 3 * tz);
            unsigned want = (bx << 24) | (by << 20) | (bz << 16) | (tx << 8) | (ty << 4) | tz;
            bad += h[b * nt + t] != want;
        }
    check(bad == 0, "every thread of every block saw its own threadIdx/blockIdx: %d wrong", bad);
    cudaFree(d);
}

static void test_reductions(void) {
    printf("block reductions through shuffles and shared memory (1000 blocks of 256, in parallel)\n");
    const int nb = 1000, nt = 256;
    float* h = (float*)malloc(sizeof(float) * nb * nt);
    for (int i = 0; i < nb * nt; i++) h[i] = (float)((i % 17) - 8);
    float *x, *o, *o2;
    cudaMalloc(&x, sizeof(float) * nb * nt);
    cudaMalloc(&o, sizeof(float) * nb);
    cudaMalloc(&o2, sizeof(float) * nb);
    cudaMemcpy(x, h, sizeof(float) * nb * nt, cudaMemcpyHostToDevice);
    block_sum_kernel<<<nb, nt>>>(o, x);
    tree_sum_kernel<<<nb, nt>>>(o2, x, 0);
    float r[nb], r2[nb];
    cudaMemcpy(r, o, sizeof(r), cudaMemcpyDeviceToHost);
    cudaMemcpy(r2, o2, sizeof(r2), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < nb; b++) {
        double s = 0;
        for (int t = 0; t < nt; t++) s += h[b * nt + t];
        bad += r[b] != (float)s || r2[b] != (float)s;
    }
    check(bad == 0, "butterfly + shared and tree reductions equal the exact sums: %d blocks wrong", bad);
    free(h);
    cudaFree(x); cudaFree(o); cudaFree(o2);
}

static void test_warp_ops(void) {
    printf("warp intrinsics, lane by lane\n");
    int* d;
    cudaMalloc(&d, 32 * 16 * sizeof(int));
    cudaMemset(d, 0, 32 * 16 * sizeof(int));
    warp_ops_kernel<<<1, 32>>>(d);
    int h[32 * 16];
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    int bad = 0;
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++) if (l % 3 == 0) ballot |= 1u << l;
    for (int l = 0; l < 32; l++) {
        const int* o = h + l * 16;
        int want[12];
        want[0] = 70;
        want[1] = (l ^ 5) * 10;
        want[2] = (l + 3 < 32 ? l + 3 : l) * 10;
        want[3] = (l - 2 >= 0 ? l - 2 : l) * 10;
        want[4] = (l ^ 1) * 10;
        want[5] = ((l & 7) + 6 < 8 ? l + 6 : l) * 10;
        want[6] = 1;
        want[7] = 0;
        want[8] = (int)ballot;
        want[9] = (l ^ 8) * 10;
        want[10] = 63;
        want[11] = l ^ 16;
        for (int k = 0; k < 12; k++)
            if (o[k] != want[k]) { if (bad < 5) printf("      lane %d op %d: got %d want %d\n", l, k, o[k], want[k]); bad++; }
    }
    check(bad == 0, "__shfl_sync/xor/down/up (widths 32 and 8, half-warp masks, int/double/u64), __any/__all/__ballot_sync: %d wrong", bad);
    cudaFree(d);
}

static void test_atomics_poison(void) {
    printf("atomics across parallel blocks; poisoned device and shared memory\n");
    int* c;
    unsigned* flags;
    cudaMalloc(&c, 2 * sizeof(int));
    cudaMalloc(&flags, 8 * sizeof(unsigned));
    cudaMemset(c, 0, 2 * sizeof(int));
    cudaMemset(flags, 0, 8 * sizeof(unsigned));
    atomic_kernel<<<500, 128>>>(c, flags);
    int hc[2];
    cudaMemcpy(hc, c, sizeof(hc), cudaMemcpyDeviceToHost);
    check(hc[0] == 500 * 128 && hc[1] == 8, "atomicAdd counted %d (want %d); atomicExch first-setter count %d (want 8)", hc[0], 500 * 128, hc[1]);
    float* unw;
    unsigned* o;
    cudaMalloc(&unw, 16 * sizeof(float));
    cudaMalloc(&o, 3 * sizeof(unsigned));
    poison_kernel<<<1, 32>>>(o, unw);
    unsigned ho[3];
    cudaMemcpy(ho, o, sizeof(ho), cudaMemcpyDeviceToHost);
    check(ho[0] == 0xFFFFFFFFu && ho[1] == 1 && ho[2] == 0xFFFFFFFFu,
          "unwritten __shared__ reads 0x%08x (want 0xffffffff); unwritten cudaMalloc float is NaN: %s (bits 0x%08x)", ho[0], ho[1] ? "yes" : "NO", ho[2]);
    cudaFree(c); cudaFree(flags); cudaFree(unw); cudaFree(o);
}

/* a launch that must be refused: the error code, and the kernel did not run */
static void expect_refused(const char* what, dim3 grid, dim3 block, size_t smem, cudaError_t want) {
    int* d;
    cudaMalloc(&d, sizeof(int));
    cudaMemset(d, 0, sizeof(int));
    cudaGetLastError();
    unsigned long long before = emu_counters()->launches;
    nop_kernel<<<grid, block, smem>>>(d);
    cudaError_t e = cudaGetLastError();
    int h = -1;
    cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    check(e == want && h == 0 && emu_counters()->launches == before, "%-44s -> %s (want %s), kernel ran: %s", what, cudaGetErrorName(e),
          cudaGetErrorName(want), h ? "YES" : "no");
    cudaFree(d);
}

static void test_launch_limits(void) {
    printf("launch limits (each refused with the runtime's error, the kernel not run; the messages above name nop_kernel)\n");
    fflush(stdout);
    expect_refused("1025 threads a block", dim3(1), dim3(1025), 0, cudaErrorInvalidConfiguration);
    expect_refused("block (32,32,2): 2048 threads", dim3(1), dim3(32, 32, 2), 0, cudaErrorInvalidConfiguration);
    expect_refused("blockDim.z 65", dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration);
    expect_refused("gridDim.y 65536", dim3(1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration);
    expect_refused("gridDim.z 65536", dim3(1, 1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration);
    expect_refused("gridDim.x 2^31", dim3(2147483648u), dim3(32), 0, cudaErrorInvalidConfiguration);
    expect_refused("a zero grid dimension", dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration);
    expect_refused("a zero block dimension", dim3(1), dim3(0), 0, cudaErrorInvalidConfiguration);
    expect_refused("48 KiB + 1 dynamic shared, no opt-in", dim3(1), dim3(32), 49153, cudaErrorInvalidValue);
    /* the limits themselves are allowed */
    int* d;
    cudaMalloc(&d, sizeof(int));
    cudaGetLastError();
    nop_kernel<<<dim3(1, 65535, 1), dim3(32)>>>(nullptr);
    nop_kernel<<<dim3(1), dim3(1024)>>>(nullptr);
    cudaError_t e1 = cudaGetLastError();
    nop_kernel<<<dim3(1), dim3(1, 1, 64), 49152>>>(nullptr);
    cudaError_t e2 = cudaGetLastError();
    check(e1 == cudaSuccess && e2 == cudaSuccess, "at the limits (grid.y 65535; 1024 threads; block.z 64 with 48 KiB dynamic): %s, %s",
          cudaGetErrorName(e1), cudaGetErrorName(e2));
    /* the opt-in: 100 KiB dynamic works after cudaFuncSetAttribute; 227 KiB + 1 is refused */
    const int n = 100 * 1024 / 4;
    cudaError_t a1 = cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4);
    cudaMemset(d, 0, sizeof(int));
    dyn_smem_kernel<<<2, 256, n * 4>>>(d, n);
    cudaError_t e3 = cudaGetLastError();
    int h = 0;
    cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    long long s = (long long)n * (n - 1) / 2;
    check(a1 == cudaSuccess && e3 == cudaSuccess && h == (int)(s % 1000003), "opt-in to 100 KiB: launch %s, the kernel used all of it: %s",
          cudaGetErrorName(e3), h == (int)(s % 1000003) ? "yes" : "NO");
    cudaError_t a2 = cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448 + 1);
    check(a2 == cudaErrorInvalidValue, "cudaFuncSetAttribute over the 227 KiB opt-in limit -> %s (want cudaErrorInvalidValue)", cudaGetErrorName(a2));
    cudaGetLastError();
    cudaFuncSetAttribute(dyn_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232448);
    dyn_smem_kernel<<<1, 32, 232448 + 16>>>(d, 16);
    cudaError_t e4 = cudaGetLastError();
    check(e4 == cudaErrorInvalidValue, "a launch with 227 KiB + 16 dynamic shared, opted in to 227 KiB -> %s (want cudaErrorInvalidValue)",
          cudaGetErrorName(e4));
    cudaFree(d);
}

static void test_memcpy_checks(void) {
    printf("cudaMemcpy / cudaMemset / cudaFree checks (each message above names the call)\n");
    fflush(stdout);
    float* d;
    cudaMalloc(&d, 100 * sizeof(float));
    float h[200];
    memset(h, 0, sizeof(h));
    cudaGetLastError();
    struct { const char* what; cudaError_t got; } cases[] = {
        {"HostToDevice with a device source", cudaMemcpy(d, d, 16, cudaMemcpyHostToDevice)},
        {"HostToDevice with a host destination", cudaMemcpy(h, h + 8, 16, cudaMemcpyHostToDevice)},
        {"DeviceToHost with a host source", cudaMemcpy(h, h + 8, 16, cudaMemcpyDeviceToHost)},
        {"DeviceToHost with a device destination", cudaMemcpy(d, d + 8, 16, cudaMemcpyDeviceToHost)},
        {"DeviceToDevice with a host side", cudaMemcpy(d, h, 16, cudaMemcpyDeviceToDevice)},
        {"HostToDevice past the end of the buffer", cudaMemcpy(d + 50, h, 51 * sizeof(float), cudaMemcpyHostToDevice)},
        {"cudaMemcpyAsync DeviceToHost past the end", cudaMemcpyAsync(h, d + 1, 100 * sizeof(float), cudaMemcpyDeviceToHost, 0)},
        {"cudaMemset past the end", cudaMemset(d + 99, 0, 8)},
        {"cudaMemset of host memory", cudaMemset(h, 0, 8)},
        {"cudaFree of a pointer inside a buffer", cudaFree(d + 1)},
        {"cudaFree of a host pointer", cudaFree(h)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check(cases[i].got == cudaErrorInvalidValue, "%-44s -> %s (want cudaErrorInvalidValue)", cases[i].what, cudaGetErrorName(cases[i].got));
    cudaError_t ok1 = cudaMemcpy(d, h, 100 * sizeof(float), cudaMemcpyDefault);
    cudaError_t ok2 = cudaMemcpy(h, d, 100 * sizeof(float), cudaMemcpyDefault);
    cudaError_t ok3 = cudaFree(d);
    cudaError_t twice = cudaFree(d);
    check(ok1 == cudaSuccess && ok2 == cudaSuccess && ok3 == cudaSuccess && twice == cudaErrorInvalidValue,
          "cudaMemcpyDefault infers both directions: %s %s; cudaFree %s, again -> %s", cudaGetErrorName(ok1), cudaGetErrorName(ok2),
          cudaGetErrorName(ok3), cudaGetErrorName(twice));
    cudaGetLastError();
}

static void test_counters(void) {
    printf("counters\n");
    emu_counters_t a = *emu_counters();
    int* d;
    cudaMalloc(&d, 1 << 20);
    nop_kernel<<<3, 32>>>(d);
    nop_kernel<<<1, 32>>>(d);
    int h;
    cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpyAsync(&h, d, sizeof(int), cudaMemcpyDeviceToHost, 0);   /* pageable: returns when done, a sync */
    int* pinned = NULL;
    cudaMallocHost((void**)&pinned, 2 * sizeof(int));
    cudaMemcpyAsync(pinned, d, 2 * sizeof(int), cudaMemcpyDeviceToHost, 0);   /* pinned: no sync */
    cudaStreamSynchronize(0);
    cudaDeviceSynchronize();
    emu_counters_t b = *emu_counters();
    cudaFree(d);
    cudaFreeHost(pinned);
    emu_counters_t c = *emu_counters();
    check(b.launches - a.launches == 2 && b.host_syncs - a.host_syncs == 4 && b.pageable_async - a.pageable_async == 1 &&
              b.d2h_copies - a.d2h_copies == 3 && b.device_bytes - a.device_bytes == (1 << 20) &&
              b.allocated_bytes - a.allocated_bytes == (1 << 20) && b.device_bytes_peak >= b.device_bytes && c.device_bytes == a.device_bytes,
          "launches +%llu (2), host syncs +%llu (4: a sync copy, a pageable async copy, a stream and a device sync; not the pinned "
          "async copy), D2H copies +%llu (3), device bytes +%zu then back",
          b.launches - a.launches, b.host_syncs - a.host_syncs, b.d2h_copies - a.d2h_copies, b.device_bytes - a.device_bytes);
}

static void test_failures(void) {
    printf("failures a GPU would have, each in a child process: exit status 1 and a message naming the kernel\n");
    expect_failure("divergent_exit", "divergent_exit_kernel", "divergent __syncthreads");
    expect_failure("divergent_lines", "divergent_lines_kernel", "divergent __syncthreads");
    expect_failure("warp_exited_lane", "warp_exited_kernel", "which has exited");
    expect_failure("warp_mask_read", "warp_mask_read_kernel", "not in the mask");
    expect_failure("oob_read", "oob_read_kernel", "0 bytes past the end of a 4000-byte device buffer allocated at dev/cuda_emu/emu_selftest.cu");
    expect_failure("oob_write", "oob_write_kernel", "past the end of a 4000-byte device buffer");
    expect_failure("oob_before", "oob_before_kernel", "4 bytes before the start of a 4096-byte device buffer");
    expect_failure("static_smem_48k", "big_static_smem_kernel", "over the 48 KiB");
}

static std::string digest_of(const char* file) {
    FILE* f = fopen(file, "r");
    if (!f) return "(no digest file)";
    char line[128] = "";
    if (!fgets(line, sizeof(line), f)) line[0] = 0;
    fclose(f);
    return first_line(line);
}

static void test_race(void) {
    printf("a planted race (tree reduction in shared memory without its __syncthreads): schedules fwd and rev\n");
    std::string tmp = "/tmp/emu_selftest_" + std::to_string((long)getpid());
    std::string env_d1 = "EMU_DIGEST=" + tmp + ".fwd", env_d2 = "EMU_DIGEST=" + tmp + ".rev";
    const char* racy[] = {"--case", "race_racy", nullptr};
    const char* good[] = {"--case", "race_ok", nullptr};
    for (int k = 0; k < 2; k++) {
        const char** args = k ? good : racy;
        setenv("EMU_SCHEDULE", "fwd", 1);
        Child a = run_child(args, env_d1.c_str());
        setenv("EMU_SCHEDULE", "rev", 1);
        Child b = run_child(args, env_d2.c_str());
        setenv("EMU_SCHEDULE", "rand:7", 1);
        Child c = run_child(args, nullptr);
        unsetenv("EMU_SCHEDULE");
        std::string da = digest_of((tmp + ".fwd").c_str()), db = digest_of((tmp + ".rev").c_str());
        bool differ = a.out != b.out && da != db;
        bool ok = a.status == 0 && b.status == 0 && c.status == 0 && (k ? (!differ && a.out == c.out) : differ);
        check(ok, "%s: fwd \"%s\" / rev \"%s\"; digests %s", k ? "with __syncthreads: results and digests equal" : "racy: results and digests differ",
              first_line(a.out).substr(0, 40).c_str(), first_line(b.out).substr(0, 40).c_str(), da == db ? "equal" : "differ");
        unlink((tmp + ".fwd").c_str());
        unlink((tmp + ".rev").c_str());
    }
}

int main(int argc, char** argv) {
    if (argc == 3 && !strcmp(argv[1], "--case")) return run_case(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: emu_selftest [--case NAME]\n");
        return 2;
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    printf("emu_selftest: the CUDA emulation (dev/cuda_emu) against what a GPU does\n");
    test_indices();
    test_reductions();
    test_warp_ops();
    test_atomics_poison();
    test_launch_limits();
    test_memcpy_checks();
    test_counters();
    test_failures();
    test_race();
    printf("emu_selftest: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
