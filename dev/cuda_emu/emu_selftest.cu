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
 * EMU_DIGEST digests under EMU_SCHEDULE=fwd and rev while the correct reduction does not.
 * The twins of llmc/cuda/ptx.cuh against tests/ptx_ref.h (the scalar reference written from the PTX ISA's
 * fragment tables): mma_bf16_16816 on random bf16 A, B and non-zero C in two warps, bitwise the
 * documented arithmetic, also with d aliasing c; ldmatrix x1/x2/x4, plain and .trans, from static and
 * dynamic shared memory with permuted row addresses; cp.async groups (wait<1> lands the older group
 * only, the newer keeps its poison; src_bytes 0..16 with zero fill; __syncthreads lands nothing; wait_all
 * lands the open group; a missing wait reads poison, differently under fwd and rev); pack_bf16x2's
 * rounding; and in child processes: an mma with a lane exited, lanes at two call sites, lanes at a
 * __syncthreads, a 16-thread warp; an ldmatrix address misaligned, in global memory, past the end of the dynamic arena; a thread
 * exiting with committed-unwaited or uncommitted copies; a cp.async destination in global memory or
 * misaligned, a source past the end of its buffer or in host memory. */
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

#include "../../llmc/cuda/ptx.cuh"
#include "../../tests/ptx_ref.h"

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


/* ------------------------------------------------------------ tensor-core and cp.async (ptx.cuh) */
/* one mma per warp (warp w uses fragment set w): d1 = A B + C into a fresh d, d2 with d aliasing c */
__global__ void mma_kernel(float* d1, float* d2, const uint32_t* aw, const uint32_t* bw, const float* cw) {
    const int t = threadIdx.x;
    const uint32_t a[4] = {aw[t * 4], aw[t * 4 + 1], aw[t * 4 + 2], aw[t * 4 + 3]};
    const uint32_t b[2] = {bw[t * 2], bw[t * 2 + 1]};
    const float c[4] = {cw[t * 4], cw[t * 4 + 1], cw[t * 4 + 2], cw[t * 4 + 3]};
    float d[4];
    mma_bf16_16816(d, a, b, c);
    float x[4] = {c[0], c[1], c[2], c[3]};
    mma_bf16_16816(x, a, b, x);
    for (int i = 0; i < 4; i++) { d1[t * 4 + i] = d[i]; d2[t * 4 + i] = x[i]; }
}

/* 32 rows of 8 b16 in shared memory (static, or the dynamic arena with dyn), lane l gives row perm[l];
 * out[lane * 4 + i] = register i of ldmatrix_x{num}[_trans] */
__global__ void ldmatrix_kernel(uint32_t* out, const uint16_t* rows, const int* perm, int num, int trans, int dyn) {
    __shared__ __align__(16) uint16_t st[32 * 8];
    extern __shared__ uint16_t dy[];
    uint16_t* sm = dyn ? dy : st;
    const int l = threadIdx.x;
    for (int c = 0; c < 8; c++) sm[l * 8 + c] = rows[l * 8 + c];
    __syncthreads();
    const void* p = &sm[perm[l] * 8];
    uint32_t r[4] = {0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu, 0xdeadbeefu};
    if (num == 1 && !trans) { uint32_t q[1]; ldmatrix_x1(q, p); r[0] = q[0]; }
    if (num == 2 && !trans) { uint32_t q[2]; ldmatrix_x2(q, p); r[0] = q[0]; r[1] = q[1]; }
    if (num == 4 && !trans) ldmatrix_x4(r, p);
    if (num == 1 && trans) { uint32_t q[1]; ldmatrix_x1_trans(q, p); r[0] = q[0]; }
    if (num == 2 && trans) { uint32_t q[2]; ldmatrix_x2_trans(q, p); r[0] = q[0]; r[1] = q[1]; }
    if (num == 4 && trans) ldmatrix_x4_trans(r, p);
    for (int i = 0; i < 4; i++) out[l * 4 + i] = r[i];
}

/* cp.async groups, one warp, rows of 16 bytes: out row blocks (64 rows each)
 *   0: rows t (group 0, 16 bytes) and 32 + t (group 1, t % 17 bytes) as thread t sees them after wait<1>
 *   1: the same after wait<0>
 *   2: row (t + 1) % 32 of the neighbour after wait<0> and a __syncthreads, and row 32 + t seen by its
 *      writer after a __syncthreads but before its wait_all (a copy issued after the first waits)
 *   3: after that wait_all: rows t (a zero fill, src_bytes 0 from a null pointer, uncommitted before the
 *      wait_all) and 32 + t */
__global__ void cp_async_kernel(uint16_t* out, const uint16_t* src) {
    __shared__ __align__(16) uint16_t s[64 * 8];
    const int t = threadIdx.x;
    cp_async_16(&s[t * 8], src + t * 8, 16);
    cp_async_commit();
    cp_async_16(&s[(32 + t) * 8], src + (32 + t) * 8, t % 17);
    cp_async_commit();
    cp_async_wait<1>();
    for (int c = 0; c < 8; c++) { out[t * 8 + c] = s[t * 8 + c]; out[(32 + t) * 8 + c] = s[(32 + t) * 8 + c]; }
    cp_async_wait<0>();
    for (int c = 0; c < 8; c++) { out[(64 + t) * 8 + c] = s[t * 8 + c]; out[(96 + t) * 8 + c] = s[(32 + t) * 8 + c]; }
    __syncthreads();
    for (int c = 0; c < 8; c++) out[(128 + t) * 8 + c] = s[((t + 1) % 32) * 8 + c];
    __syncthreads();
    cp_async_16(&s[(32 + t) * 8], src + t * 8, 16);
    cp_async_commit();
    cp_async_16(&s[t * 8], nullptr, 0);
    __syncthreads();
    for (int c = 0; c < 8; c++) out[(160 + t) * 8 + c] = s[(32 + t) * 8 + c];
    cp_async_wait_all();
    for (int c = 0; c < 8; c++) { out[(192 + t) * 8 + c] = s[t * 8 + c]; out[(224 + t) * 8 + c] = s[(32 + t) * 8 + c]; }
}

/* a missing wait: thread t copies row t, the block reads every row after a __syncthreads; with `wait`
 * the copier waits before the barrier (right), without it only after the read (the bug) */
__global__ void cp_async_nowait_kernel(uint16_t* out, const uint16_t* src, int wait) {
    __shared__ __align__(16) uint16_t s[32 * 8];
    const int t = threadIdx.x;
    cp_async_16(&s[t * 8], src + t * 8, 16);
    cp_async_commit();
    if (wait) cp_async_wait<0>();
    __syncthreads();
    for (int c = 0; c < 8; c++) out[t * 8 + c] = s[((t + 5) % 32) * 8 + c];
    if (!wait) cp_async_wait<0>();
}

__global__ void pack_kernel(uint32_t* out, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = pack_bf16x2(x[2 * i], x[2 * i + 1]);
}

/* failure cases */
__global__ void mma_missing_lane_kernel(float* out) {
    if (threadIdx.x >= 16) return;
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    mma_bf16_16816(d, a, b, d);
    out[threadIdx.x] = d[0];
}
__global__ void mma_other_site_kernel(float* out) {
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) mma_bf16_16816(d, a, b, d);
    else mma_bf16_16816(d, a, b, d);
    out[threadIdx.x] = d[0];
}
__global__ void mma_barrier_kernel(float* out) {
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) mma_bf16_16816(d, a, b, d);   /* the other half waits at the barrier */
    __syncthreads();
    out[threadIdx.x] = d[0];
}
__global__ void ldmatrix_bad_kernel(uint32_t* out, const uint16_t* global, int how) {
    __shared__ __align__(16) uint16_t s[32 * 8];
    extern __shared__ uint16_t dy[];
    const int l = threadIdx.x;
    for (int c = 0; c < 8; c++) s[l * 8 + c] = (uint16_t)c;
    __syncthreads();
    const void* p = &s[l * 8];
    if (how == 0) p = &s[l * 8 + 4];            /* 8 bytes off: misaligned */
    if (how == 1 && l == 3) p = global + 8;     /* a device buffer, not shared memory */
    if (how == 2) p = &dy[16 + (l & 7) * 0];    /* dynamic arena of 40 bytes: [32, 48) runs past its end */
    uint32_t r[4];
    ldmatrix_x4(r, p);
    out[l] = r[0];
}
__global__ void cp_async_bad_kernel(uint16_t* out, const uint16_t* src, const uint16_t* host, int how) {
    __shared__ __align__(16) uint16_t s[32 * 8];
    const int t = threadIdx.x;
    if (how == 0) { cp_async_16(&s[t * 8], src + t * 8, 16); cp_async_commit(); }             /* exits, committed, never waited */
    if (how == 1) cp_async_16(&s[t * 8], src + t * 8, 16);                                      /* exits, never committed */
    if (how == 2) { cp_async_16(out + t * 8, src + t * 8, 16); cp_async_wait_all(); }           /* destination in global memory */
    if (how == 3) { cp_async_16(&s[t * 8], src + 248, 16); cp_async_wait_all(); }              /* a 504-byte buffer: 8 bytes past its end */
    if (how == 4) { cp_async_16(&s[t * 8], host, 16); cp_async_wait_all(); }                     /* host memory */
    if (how == 5) { cp_async_16(&s[t * 8 + 4], src, 16); cp_async_wait_all(); }                  /* misaligned destination */
    out[t] = s[t * 8];
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
    } else if (!strcmp(name, "mma_missing_lane")) {
        mma_missing_lane_kernel<<<1, 32>>>(d);
    } else if (!strcmp(name, "mma_other_site")) {
        mma_other_site_kernel<<<1, 32>>>(d);
    } else if (!strcmp(name, "mma_barrier")) {
        mma_barrier_kernel<<<1, 32>>>(d);
    } else if (!strcmp(name, "mma_partial_warp")) {
        mma_other_site_kernel<<<1, 16>>>(d);
    } else if (!strncmp(name, "ldmatrix_", 9)) {
        const int how = !strcmp(name, "ldmatrix_misaligned") ? 0 : !strcmp(name, "ldmatrix_global") ? 1 : 2;
        uint16_t* g = nullptr;
        cudaMalloc(&g, 256 * sizeof(uint16_t));
        ldmatrix_bad_kernel<<<1, 32, 40>>>((uint32_t*)d, g, how);
    } else if (!strcmp(name, "cp_async_nowait") || !strcmp(name, "cp_async_waited")) {
        uint16_t src[32 * 8];
        for (int i = 0; i < 32 * 8; i++) src[i] = (uint16_t)(i * 7 + 1);
        uint16_t *ds = nullptr, *dout = nullptr;
        cudaMalloc(&ds, sizeof(src));
        cudaMalloc(&dout, sizeof(src));
        cudaMemcpy(ds, src, sizeof(src), cudaMemcpyHostToDevice);
        cp_async_nowait_kernel<<<1, 32>>>(dout, ds, !strcmp(name, "cp_async_waited"));
        uint16_t o[32 * 8];
        cudaMemcpy(o, dout, sizeof(o), cudaMemcpyDeviceToHost);
        int right = 0, poison = 0;
        for (int t = 0; t < 32; t++)
            for (int c = 0; c < 8; c++) { right += o[t * 8 + c] == src[((t + 5) % 32) * 8 + c]; poison += o[t * 8 + c] == 0xFFFF; }
        printf("poison %d right %d\n", poison, right);
        return 0;
    } else if (!strncmp(name, "cp_async_", 9)) {
        static const char* names[] = {"cp_async_exit_unwaited", "cp_async_exit_uncommitted", "cp_async_dst_global", "cp_async_src_overrun",
                                      "cp_async_src_host", "cp_async_dst_misaligned"};
        int how = -1;
        for (int i = 0; i < 6; i++) if (!strcmp(name, names[i])) how = i;
        if (how < 0) { fprintf(stderr, "no such case: %s\n", name); return 2; }
        uint16_t *src = nullptr, *out = nullptr;
        cudaMalloc(&src, (how == 3 ? 252 : 256) * sizeof(uint16_t));
        cudaMalloc(&out, 32 * 8 * sizeof(uint16_t));
        static uint16_t host[64] __attribute__((aligned(16)));
        cp_async_bad_kernel<<<1, 32>>>(out, src, host, how);
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


/* ------------------------------------------------------------ tensor-core and cp.async (ptx.cuh) */
static uint64_t g_lcg = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    g_lcg = g_lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_lcg >> 32);
}
/* a random finite bf16 of magnitude about 2^-4 .. 2^4 */
static uint16_t rnd_bf16(void) {
    const uint32_t r = rnd32();
    const uint32_t sign = (r >> 31) << 15, exp = 123 + (r >> 8) % 9, man = r & 0x7f;
    return (uint16_t)(sign | exp << 7 | man);
}

static void test_mma(void) {
    printf("mma_bf16_16816 against the ISA's fragment tables (tests/ptx_ref.h): 2 warps, random bf16 A, B, non-zero C\n");
    const int nw = 2;
    uint16_t A[nw][256], B[nw][128];
    float C[nw][128], D[nw][128];
    uint32_t aw[nw * 32][4], bw[nw * 32][2];
    float cw[nw * 32][4];
    for (int w = 0; w < nw; w++) {
        for (int i = 0; i < 256; i++) A[w][i] = rnd_bf16();
        for (int i = 0; i < 128; i++) { B[w][i] = rnd_bf16(); C[w][i] = ptx_ref_bf16(rnd_bf16()) * 3.0f; }
        ptx_ref_fragments(A[w], B[w], C[w], aw + 32 * w, bw + 32 * w, cw + 32 * w);
        ptx_ref_mma(A[w], B[w], C[w], D[w], nullptr);
    }
    uint32_t *daw, *dbw;
    float *dcw, *d1, *d2;
    cudaMalloc(&daw, sizeof(aw)); cudaMalloc(&dbw, sizeof(bw)); cudaMalloc(&dcw, sizeof(cw));
    cudaMalloc(&d1, sizeof(cw)); cudaMalloc(&d2, sizeof(cw));
    cudaMemcpy(daw, aw, sizeof(aw), cudaMemcpyHostToDevice);
    cudaMemcpy(dbw, bw, sizeof(bw), cudaMemcpyHostToDevice);
    cudaMemcpy(dcw, cw, sizeof(cw), cudaMemcpyHostToDevice);
    mma_kernel<<<1, 32 * nw>>>(d1, d2, daw, dbw, dcw);
    float h1[nw * 32][4], h2[nw * 32][4];
    cudaMemcpy(h1, d1, sizeof(h1), cudaMemcpyDeviceToHost);
    cudaMemcpy(h2, d2, sizeof(h2), cudaMemcpyDeviceToHost);
    int bad = 0, bad_alias = 0;
    for (int w = 0; w < nw; w++)
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) {
                int r, c;
                ptx_ref_c_elem(lane, i, &r, &c);
                const float want = D[w][r * 8 + c], got = h1[32 * w + lane][i];
                if (memcmp(&want, &got, 4)) {
                    if (bad < 4) printf("      warp %d lane %d d[%d] (row %d col %d): got %.9g want %.9g\n", w, lane, i, r, c, got, want);
                    bad++;
                }
                bad_alias += memcmp(&h1[32 * w + lane][i], &h2[32 * w + lane][i], 4) != 0;
            }
    check(bad == 0, "every lane's d[0..3] equals the reference bitwise (exact products summed in double, + c, one rounding): %d wrong", bad);
    check(bad_alias == 0, "d aliasing c gives the same bits: %d differ", bad_alias);
    cudaFree(daw); cudaFree(dbw); cudaFree(dcw); cudaFree(d1); cudaFree(d2);
}

static void test_ldmatrix(void) {
    printf("ldmatrix x1/x2/x4, plain and .trans, static and dynamic shared memory, permuted row addresses\n");
    uint16_t rows[32 * 8];
    for (int i = 0; i < 32 * 8; i++) rows[i] = (uint16_t)rnd32();
    int perm[32];
    for (int l = 0; l < 32; l++) perm[l] = (l * 11 + 5) % 32;   /* lane l gives row perm[l] */
    uint16_t *drows;
    int* dperm;
    uint32_t* dout;
    cudaMalloc(&drows, sizeof(rows)); cudaMalloc(&dperm, sizeof(perm)); cudaMalloc(&dout, 32 * 4 * sizeof(uint32_t));
    cudaMemcpy(drows, rows, sizeof(rows), cudaMemcpyHostToDevice);
    cudaMemcpy(dperm, perm, sizeof(perm), cudaMemcpyHostToDevice);
    /* matrix j row r = the row lane 8j + r points at */
    uint16_t mats[4][8][8];
    for (int j = 0; j < 4; j++) for (int r = 0; r < 8; r++) for (int c = 0; c < 8; c++) mats[j][r][c] = rows[perm[8 * j + r] * 8 + c];
    const int nums[3] = {1, 2, 4};
    for (int dyn = 0; dyn < 2; dyn++)
        for (int trans = 0; trans < 2; trans++)
            for (int k = 0; k < 3; k++) {
                const int num = nums[k];
                ldmatrix_kernel<<<1, 32, dyn ? 32 * 8 * sizeof(uint16_t) : 0>>>(dout, drows, dperm, num, trans, dyn);
                uint32_t h[32 * 4];
                cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost);
                int bad = 0;
                for (int l = 0; l < 32; l++)
                    for (int i = 0; i < 4; i++) {
                        const uint32_t want = i < num ? ptx_ref_ldmatrix(mats, i, l, trans) : 0xdeadbeefu;
                        if (h[l * 4 + i] != want) {
                            if (bad < 3) printf("      lane %d r[%d]: got 0x%08x want 0x%08x\n", l, i, h[l * 4 + i], want);
                            bad++;
                        }
                    }
                check(bad == 0, "ldmatrix_x%d%s (%s shared memory): every lane's registers as the ISA's table: %d wrong", num, trans ? "_trans" : "",
                      dyn ? "dynamic" : "static", bad);
            }
    cudaFree(drows); cudaFree(dperm); cudaFree(dout);
}

static void test_cp_async(void) {
    printf("cp.async: groups, wait_group N, wait_all, zero fill; the data visible only at the wait\n");
    uint16_t src[64 * 8];
    for (int i = 0; i < 64 * 8; i++) src[i] = (uint16_t)(rnd32() & 0x7fff);   /* never the poison 0xFFFF */
    uint16_t *dsrc, *dout;
    cudaMalloc(&dsrc, sizeof(src));
    cudaMalloc(&dout, 256 * 8 * sizeof(uint16_t));
    cudaMemcpy(dsrc, src, sizeof(src), cudaMemcpyHostToDevice);
    cp_async_kernel<<<1, 32>>>(dout, dsrc);
    uint16_t h[256 * 8];
    cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost);
    /* the landed value of a row copied with n source bytes: n bytes of the source, then zeros */
    auto landed = [&](int row, int srow, int nbytes, int c) -> uint16_t {
        uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(v, &src[srow * 8], (size_t)nbytes);
        (void)row;
        return v[c];
    };
    int bad_g0 = 0, bad_g1_early = 0, bad_g1 = 0, bad_nb = 0, bad_sync = 0, bad_zero = 0, bad_all = 0;
    for (int t = 0; t < 32; t++)
        for (int c = 0; c < 8; c++) {
            bad_g0 += h[t * 8 + c] != src[t * 8 + c];
            bad_g1_early += h[(32 + t) * 8 + c] != 0xFFFF;
            bad_g0 += h[(64 + t) * 8 + c] != src[t * 8 + c];
            bad_g1 += h[(96 + t) * 8 + c] != landed(32 + t, 32 + t, t % 17, c);
            bad_nb += h[(128 + t) * 8 + c] != src[((t + 1) % 32) * 8 + c];
            bad_sync += h[(160 + t) * 8 + c] != landed(32 + t, 32 + t, t % 17, c);
            bad_zero += h[(192 + t) * 8 + c] != 0;
            bad_all += h[(224 + t) * 8 + c] != src[t * 8 + c];
        }
    check(bad_g0 == 0, "group 0 landed at wait<1> and still there after wait<0>: %d wrong", bad_g0);
    check(bad_g1_early == 0, "group 1 (the newest) not landed at wait<1>: the destination keeps its poison: %d elements not poison", bad_g1_early);
    check(bad_g1 == 0, "group 1 landed at wait<0> with src_bytes t %% 17 (0..16) read and the rest zero: %d wrong", bad_g1);
    check(bad_nb == 0, "another thread's copies visible after its wait and a __syncthreads: %d wrong", bad_nb);
    check(bad_sync == 0, "__syncthreads lands nothing: a copy issued before it is not visible after it (the old contents): %d wrong", bad_sync);
    check(bad_zero == 0 && bad_all == 0, "wait_all lands the uncommitted group: zero fill (src_bytes 0, null source) %d wrong, copy %d wrong", bad_zero,
          bad_all);
    /* a missing wait, in child processes under the schedules fwd and rev (the reads of a row whose writer
     * runs later in the schedule see poison, those whose writer already passed its late wait the data) */
    for (int wait = 1; wait >= 0; wait--) {
        const char* args[] = {"--case", wait ? "cp_async_waited" : "cp_async_nowait", nullptr};
        setenv("EMU_SCHEDULE", "fwd", 1);
        Child a = run_child(args, nullptr);
        setenv("EMU_SCHEDULE", "rev", 1);
        Child b = run_child(args, nullptr);
        unsetenv("EMU_SCHEDULE");
        int pa = -1, ra = -1, pb = -1, rb = -1;
        sscanf(a.out.c_str(), "poison %d right %d", &pa, &ra);
        sscanf(b.out.c_str(), "poison %d right %d", &pb, &rb);
        const bool ok = a.status == 0 && b.status == 0 && (wait ? ra == 256 && rb == 256 : pa > 0 && pb > 0 && pa + ra == 256 && pb + rb == 256 && a.out != b.out);
        if (wait) check(ok, "wait<0> before the __syncthreads: the block reads the copied rows: fwd %d, rev %d of 256 right", ra, rb);
        else check(ok, "the wait after the read (a missing wait): poison seen (fwd %d, rev %d of 256 elements), the rest depends on the schedule (fwd %d, "
                   "rev %d right)", pa, pb, ra, rb);
    }
    cudaFree(dsrc); cudaFree(dout);
}

static void test_pack(void) {
    printf("pack_bf16x2 (cvt.rn.bf16x2.f32): round to nearest even, lo in the low half\n");
    std::vector<float> x;
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0x00000001u,
                                0x80008000u, 0x00018000u, 0x7fc00001u, 0xffa00000u, 0x00000000u, 0x80000000u, 0x3effffffu, 0x42f6e979u};
    for (uint32_t u : special) x.push_back(__uint_as_float(u));
    while (x.size() < 2048) x.push_back(__uint_as_float(rnd32()));
    const int n = (int)x.size() / 2;
    float* dx;
    uint32_t* dout;
    cudaMalloc(&dx, x.size() * sizeof(float));
    cudaMalloc(&dout, n * sizeof(uint32_t));
    cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
    pack_kernel<<<(n + 127) / 128, 128>>>(dout, dx, n);
    std::vector<uint32_t> h(n);
    cudaMemcpy(h.data(), dout, n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (int half = 0; half < 2; half++) {
            const uint16_t got = (uint16_t)(h[i] >> (16 * half)), want = ptx_ref_bf16_rn(x[2 * i + half]);
            const bool ok = ptx_ref_bf16_is_nan(want) ? ptx_ref_bf16_is_nan(got) : got == want;
            if (!ok) { if (bad < 3) printf("      %a: got 0x%04x want 0x%04x\n", x[2 * i + half], got, want); bad++; }
        }
    check(bad == 0, "%d pairs (ties, overflow to inf, subnormals, NaN, random bits) as the reference rounding: %d halves wrong", n, bad);
    cudaFree(dx); cudaFree(dout);
}

static void test_ptx_failures(void) {
    printf("tensor-core and cp.async misuse, each in a child process: exit status 1 and a message naming the kernel\n");
    expect_failure("mma_missing_lane", "mma_missing_lane_kernel", "which has exited");
    expect_failure("mma_other_site", "mma_other_site_kernel", "every lane of the warp must execute the same instruction");
    expect_failure("mma_barrier", "mma_barrier_kernel", "which waits at __syncthreads");
    expect_failure("mma_partial_warp", "mma_other_site_kernel", "needs all 32 lanes");
    expect_failure("ldmatrix_misaligned", "ldmatrix_bad_kernel", "not 16-byte aligned");
    expect_failure("ldmatrix_global", "ldmatrix_bad_kernel", "not shared memory");
    expect_failure("ldmatrix_past_end", "ldmatrix_bad_kernel", "across the end of one");
    expect_failure("cp_async_exit_unwaited", "cp_async_bad_kernel", "committed group(s) not waited for");
    expect_failure("cp_async_exit_uncommitted", "cp_async_bad_kernel", "never committed nor waited for");
    expect_failure("cp_async_dst_global", "cp_async_bad_kernel", "destination");
    expect_failure("cp_async_src_overrun", "cp_async_bad_kernel", "overrun the 504-byte device buffer");
    expect_failure("cp_async_src_host", "cp_async_bad_kernel", "is not device memory");
    expect_failure("cp_async_dst_misaligned", "cp_async_bad_kernel", "is not 16-byte aligned");
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
    test_mma();
    test_ldmatrix();
    test_cp_async();
    test_pack();
    test_ptx_failures();
    test_race();
    printf("emu_selftest: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
