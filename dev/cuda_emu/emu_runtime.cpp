/* emu_runtime.cpp: the CUDA runtime emulation of train_sdc (dev/cuda_emu). The project's CUDA sources
 * (train_sdc.cu, test_sdc.cu, the llmc .cuh files) are built with the host C++ compiler against the declarations
 * in dev/cuda_emu/include (cuda_runtime.h, cuda_bf16.h, cublasLt.h, library_types.h, nccl.h: written
 * here, so no CUDA toolkit is needed) and run on the CPU with the semantics of the GPU where bugs hide.
 * Test infrastructure only: the product builds with nvcc, unchanged.
 *
 * Source to host compiler. dev/cuda_emu/cu2emu.py mirrors the sources into build/emu/src, rewriting
 * each launch `k<<<grid, block, smem, stream>>>(args)` into emu::launch(...) with a lambda that calls
 * the kernel, and each `__shared__ T x[N];` into EMU_SHARED(T, x, [N]); nothing else changes, lines
 * stay on their lines and a #line directive names the original file. Why a rewrite and not a macro:
 * the committed sources stay idiomatic CUDA (no launch macro, no second copy of a kernel, no #ifdef in
 * a kernel body), and the rewrite is mechanical and checked (it refuses what it cannot parse).
 *
 * Execution model.
 * - A launch runs to completion before it returns (streams execute synchronously and record
 *   nothing; events are complete when recorded, and a stream's wait on one has nothing to wait for). The blocks of a grid run in parallel over OpenMP threads (schedule dynamic), in an order
 *   set by EMU_SCHEDULE.
 * - Within a block every CUDA thread is a fiber with its own stack on the OS thread that runs the
 *   block. Fibers switch with a small context switch written here (x86-64 and aarch64: callee-saved
 *   registers and sp; ucontext elsewhere): swapcontext's signal-mask system call would dominate.
 *   Stacks (EMU_STACK_KB, default 64 KiB, mmap'ed with a guard page below) are assigned lazily: a
 *   thread that runs to its end without blocking hands its stack to the next thread; only blocked
 *   threads keep theirs.
 * - A fiber runs until it blocks (at __syncthreads or a warp intrinsic) or returns. A scheduling round
 *   resumes every runnable fiber once, in the schedule's order; then the warp operations whose lanes
 *   have all arrived complete, and then a barrier that every live thread has reached releases. A
 *   fiber that blocks switches straight to the round's next fiber (one context switch a blocking
 *   operation, not two through the scheduler: each switch's return lands on another stack, which the
 *   CPU's return prediction misses, so the switches were most of the emulator's time); the scheduler
 *   gets control back when a fiber exits (to hand its stack on) or the round's last fiber blocks. The
 *   order is the same as resuming each fiber from the scheduler in turn.
 * - __syncthreads(): releases when every thread of the block waits at the same __syncthreads (same
 *   file and line). Threads that exited, threads waiting at another __syncthreads, or threads waiting
 *   in a warp operation on a lane that waits at the barrier: an error naming the kernel, the block,
 *   the barrier's line and how many threads arrived (never a hang). (The CUDA programming guide makes
 *   a barrier in divergent code undefined; some hardware lets it pass, this emulator does not.)
 * - Warp intrinsics (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, __shfl_up_sync, __any_sync,
 *   __all_sync, __ballot_sync, __syncwarp): each lane deposits its value and yields; the operation
 *   completes when every lane named in the mask waits in a warp operation of the same kind with the
 *   same mask. A mask naming a lane that exited, does not exist, or waits at a block barrier, a
 *   lane not in its own mask, lanes of one mask in different operations, and a shuffle reading a lane
 *   outside the mask are errors naming the kernel.
 * - Tensor-core collectives (the twins of llmc/cuda/ptx.cuh): mma_bf16_16816 (mma.sync m16n8k16 .row.col
 *   bf16 -> fp32) and ldmatrix (m8n8 .b16, x1/x2/x4, optionally .trans) are warp operations like the
 *   shuffles, with the full mask: every one of the 32 lanes must wait at the same instruction (same kind,
 *   same shape, same file and line). A lane that exited, waits at a barrier, waits in another warp
 *   operation or at another call site, or a warp of fewer than 32 threads: an error naming the kernel and
 *   the line. Each lane deposits pointers to its operands; when all have arrived one function computes
 *   the whole warp's result (one collective per instruction, nothing allocated). The fragment layouts
 *   are the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type"; "Warp-level matrix
 *   load instruction: ldmatrix"), written out at mma_collective / ldmatrix_collective. mma arithmetic:
 *   d = (float)(sum_k a_k b_k + c), the 16 products exact and summed in double in k order, c last, one
 *   rounding; the hardware's order and internal precision inside an mma are not documented, so a GPU
 *   agrees to a few fp32 ulps of |c| + sum |a b|, not bitwise. d may alias c (every input is read before
 *   any output is written). ldmatrix: each row address read (lanes 0 .. 8 x num - 1; the others are
 *   ignored, as on the GPU) must be 16-byte aligned with its 16 bytes inside the block's dynamic arena or
 *   inside one __shared__ declaration; otherwise an error naming the lane and the address.
 * - cp.async (cp_async_16 / commit / wait<N> / wait_all): a per-thread queue. cp_async_16 checks the
 *   destination (16-byte aligned, 16 bytes in the block's shared memory as for ldmatrix), src_bytes
 *   (0..16) and the source (16-byte aligned; its src_bytes bytes inside a live device allocation; not
 *   read at all when src_bytes is 0), reads the source bytes at once and queues the 16 bytes (zero
 *   filled past src_bytes) with the number of the thread's open group. cp_async_commit closes the group;
 *   wait<N> writes to shared memory every queued copy of a committed group older than the newest N;
 *   wait_all commits and waits for everything. The data become visible only at the wait: until then the
 *   destination keeps its old contents (the poison, for a fresh buffer), and __syncthreads lands nothing
 *   (as on the GPU, where only the wait orders the copy), so a missing or late wait shows up as poison
 *   read, or as results that change with the schedule. A thread that exits with queued copies
 *   (uncommitted, or in committed groups never waited for) is an error naming the kernel and the first
 *   copy's line; an empty committed group carries nothing and is not reported. (A GPU may land a copy
 *   before its wait; code that is right here is right there, not the other way round.) cp.async is not a
 *   warp collective: each thread issues and waits for its own copies.
 * - __shared__: per block, a slot per declaration (keyed by the declaration's static tag), every
 *   thread of the block the same slot, poisoned with 0xFF when the block first reaches it; dynamic
 *   shared memory (extern __shared__) likewise at the start of the block's arena. Static plus dynamic
 *   is counted against the limit of the kernel (48 KiB, or with the cudaFuncSetAttribute(k,
 *   cudaFuncAttributeMaxDynamicSharedMemorySize, n) opt-in up to 227 KiB = 232448 bytes, the
 *   H100/H200 limit). Static sizes are learned when a block first reaches a declaration: a launch
 *   whose dynamic size does not fit next to the static size learned so far is refused
 *   (cudaErrorInvalidValue); a block that exceeds its limit while it runs stops the program (on a
 *   GPU, static shared memory over 48 KiB is refused by ptxas).
 * - Schedules: EMU_SCHEDULE=fwd (default) | rev | rand:SEED orders the fibers of every scheduling
 *   round and the blocks of every grid. A program whose results depend on it has a race between the
 *   threads of a block (a missing __syncthreads, a read of another thread's shared-memory slot before
 *   it is written) or between blocks.
 * - Determinism check: every device-to-host copy (cudaMemcpy / cudaMemcpyAsync to the host, in order)
 *   is folded into a 64-bit digest; EMU_DIGEST=FILE writes at exit the digest, the bytes copied, and
 *   one line per copy (its digest, size and the last kernel launched before it). run_twice.py runs a
 *   program under two schedules and compares (the first differing copy and the kernel before it).
 *
 * Launch checks (an error message naming the kernel on stderr; the launch does not run; the last error
 * is set as the runtime would): block over 1024 threads, blockDim.x/y over 1024 or z over 64, gridDim.x
 * over 2^31-1, gridDim.y/z over 65535, a zero dimension (cudaErrorInvalidConfiguration); shared memory
 * over the limit (cudaErrorInvalidValue); a launch from device code (an error: no dynamic parallelism).
 *
 * Device memory. cudaMalloc maps each buffer (size rounded up to 16 bytes, so pointers are 16-byte
 * aligned, not 256 as on a GPU) so that its end touches a PROT_NONE guard page, with another guard page
 * before the mapping; fills it with 0xFF (NaN as fp32 and bf16, -1 as an integer), and records it with
 * the allocating file:line. An access into a guard page (SIGSEGV, handled on an alternate stack in
 * every thread that runs fibers) prints "cuda_emu: kernel NAME: out-of-bounds access at ADDR: N bytes
 * past the end of a SIZE-byte device buffer allocated at FILE:LINE" (or "before the start") and exits
 * 1. Not seen: an overrun of less than 16 bytes (the rounding), an underrun inside the page below a
 * buffer, an access that lands inside another live buffer. cudaMemcpy[Async] and cudaMemset[Async]
 * check that each pointer lies where the direction says (device: inside a live allocation, with the
 * whole byte range; host: not inside one; pinned cudaMallocHost memory is host) and fail with
 * cudaErrorInvalidValue and a message otherwise; cudaMemcpyDefault infers the direction. cudaFree of a
 * pointer that is not the start of a live allocation: cudaErrorInvalidValue and a message.
 *
 * Device. A node of EMU_DEVICE_COUNT (default 8) emulated H200s ("cuda_emu (emulated H200)", sm_90,
 * 132 SMs, 141 GB), so mpirun -np R (R <= 8) gives each rank its local device; each process emulates
 * its own device (nothing is shared between processes but what NCCL/MPI carries). cudaSetDevice only
 * records the ordinal. EMU_NO_DEVICE=1 makes cudaGetDeviceCount report cudaErrorNoDevice (a machine
 * without a GPU). Counters (cuda_emu.h):
 * launches, host synchronisations (an asynchronous device-to-host copy into pageable memory counts as one:
 * CUDA returns from it only when the copy is done), device-to-host copies, device bytes now, at peak and
 * allocated in all; EMU_STATS=1
 * prints them at exit. EMU_PROFILE=N prints at exit the N kernels that took the most host time, with their
 * launches and blocks: the emulation's own cost (each barrier and warp operation switches every thread of the
 * block, 11-16 ns a thread on an AMD EPYC, Zen 5; the arithmetic runs at the host's scalar speed), which says where a
 * slow test spends its time, not what a GPU would.
 *
 * Device math is the host's libm (IEEE, no fast-math; the x86-64 baseline has no FMA, so no
 * contraction either): results agree with a GPU to rounding, not bit for bit.
 *
 * Cost-only mode (EMU_COST_ONLY=1): for a schedule too large to execute (a llama3.2-1b step), the program
 * runs its host code and every launch is checked (the launch checks above) and counted, but not run;
 * cuBLASLt and NCCL calls are checked and counted but compute nothing (cublaslt_emu.cpp, nccl_emu.cpp);
 * cudaMalloc reserves its mapping (MAP_NORESERVE) without the 0xFF fill, so no page is touched while
 * device_bytes and device_bytes_peak count as always; memsets and copies into device memory do nothing
 * (their pointers are still checked); device-to-host copies write zeros. The program itself must not
 * act on those zeros (train_sdc's -cost_out run keeps one attempt of one step: train_loop.h). What it is
 * for: the launch sequence, the launchers' work records (cuda_common.cuh launch_account) and the device
 * memory of a configuration, in seconds (scripts/cost_model.py).
 *
 * What the emulator cannot see: timing and performance; the memory model across blocks (blocks run
 * to completion, each block's writes are visible when it ends: missing __threadfence or volatile go
 * unseen); tensor-core rounding (the emulated mma rounds once, see above) and cuBLASLt's algorithm choices and their heuristics on real hardware;
 * the driver, PCIe/NVLink and NCCL transports; register pressure and occupancy (__launch_bounds__).
 *
 * Environment: EMU_SCHEDULE, EMU_DIGEST, EMU_STATS, EMU_PROFILE, EMU_NO_DEVICE, EMU_DEVICE_COUNT, EMU_STACK_KB,
 * EMU_COST_ONLY, OMP_NUM_THREADS. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "cuda_emu.h"
/* the runtime names the block's fields itself */
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef warpSize

#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(EMU_FORCE_UCONTEXT) || (!defined(__x86_64__) && !defined(__aarch64__))
#include <ucontext.h>
#define EMU_UCONTEXT 1   /* the portable (slow) fallback; -DEMU_FORCE_UCONTEXT tests it on x86-64 */
#endif

__thread emu::ThreadCtx* emu_tl_thread = nullptr;
__thread emu::BlockCtx* emu_tl_block = nullptr;

namespace {

/* ================================================================================ context switch */
#ifndef EMU_UCONTEXT
extern "C" void emu_ctx_switch(void** save_sp, void* new_sp);
#if defined(__x86_64__)
/* push the callee-saved registers, save sp, load the other sp, pop. The MXCSR and x87 control words
 * are not switched (ldmxcsr/fldcw are slow, and no fiber changes rounding modes or exception masks). */
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch,@function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch,.-emu_ctx_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
/* a new fiber's initial stack: the frame emu_ctx_switch pops, returning into entry */
static void* ctx_init(char* top, void (*entry)()) {
    uintptr_t t = ((uintptr_t)top) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)t;
    sp -= 2;                       /* after `ret`, rsp = t - 8: 8 mod 16, as after a call */
    sp[0] = (uint64_t)entry;       /* return address */
    sp[1] = 0;
    for (int i = 0; i < 6; i++) *--sp = 0;   /* rbp rbx r12 r13 r14 r15 */
    return sp;
}
#elif defined(__aarch64__)
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch,%function
emu_ctx_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mov x2, sp
    str x2, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    add sp, sp, #176
    ret
    .size emu_ctx_switch,.-emu_ctx_switch
    .section .note.GNU-stack,"",%progbits
    .text
)");
static void* ctx_init(char* top, void (*entry)()) {
    uintptr_t t = ((uintptr_t)top) & ~(uintptr_t)15;
    uint64_t* sp = (uint64_t*)(t - 176);
    memset(sp, 0, 176);
    sp[11] = (uint64_t)entry;      /* x30: `ret` jumps there */
    return sp;
}
#endif
#endif

/* ================================================================================ errors */
std::mutex g_print_mu;

[[noreturn]] void die_v(const char* fmt, va_list ap) {
    fflush(stdout);
    char buf[2048];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    fprintf(stderr, "cuda_emu: %s\n", buf);
    fflush(stderr);
    _exit(1);
}
[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    die_v(fmt, ap);
}

/* ================================================================================ configuration */
enum Sched { SCHED_FWD, SCHED_REV, SCHED_RAND };
struct Config {
    Sched sched = SCHED_FWD;
    uint64_t seed = 0;
    size_t stack_bytes = 64 << 10;
    bool no_device = false;
    int ndev = 8;
    bool stats = false;
    int profile = 0;               /* EMU_PROFILE=N: the N kernels that took the most host time, at exit */
    const char* digest_file = nullptr;
    bool cost_only = false;        /* EMU_COST_ONLY: launches checked and counted, not run */
    bool ready = false;
};
Config g_cfg;

/* ================================================================================ counters, digest */
emu_counters_t g_counters;
std::mutex g_mu;                   /* allocation table, kernel table, digest */
const char* g_last_kernel = "(none)";
std::string g_last_kernel_store;
struct CopyRec { uint64_t digest; size_t bytes; std::string kernel; };
std::vector<CopyRec> g_copies;
uint64_t g_digest = 0x243F6A8885A308D3ull;
uint64_t g_digest_bytes = 0;

inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}
uint64_t hash_bytes(const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, b + i, n - i);
    h = mix64(h ^ w ^ (uint64_t)(n - i) << 56);
    return h;
}
void digest_copy(const void* host, size_t n) {
    uint64_t d = hash_bytes(host, n);
    std::lock_guard<std::mutex> lk(g_mu);
    g_digest = mix64(g_digest ^ d) + n;
    g_digest_bytes += n;
    if (g_cfg.digest_file) g_copies.push_back(CopyRec{d, n, g_last_kernel});
    g_counters.d2h_copies++;
    g_counters.d2h_bytes += n;
}

void profile_report();
void at_exit_report() {
    fflush(stdout);
    if (g_cfg.digest_file) {
        std::string path = g_cfg.digest_file;
        const char* r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r) r = getenv("PMI_RANK");
        if (r && strcmp(r, "0") != 0) path += std::string(".rank") + r;
        FILE* f = fopen(path.c_str(), "w");
        if (f) {
            fprintf(f, "digest %016" PRIx64 "\nbytes %" PRIu64 "\ncopies %zu\n", g_digest, g_digest_bytes, g_copies.size());
            for (size_t i = 0; i < g_copies.size(); i++)
                fprintf(f, "%zu %016" PRIx64 " %zu %s\n", i, g_copies[i].digest, g_copies[i].bytes, g_copies[i].kernel.c_str());
            fclose(f);
        } else {
            fprintf(stderr, "cuda_emu: cannot write EMU_DIGEST file %s: %s\n", path.c_str(), strerror(errno));
        }
    }
    if (g_cfg.profile > 0) profile_report();
    if (g_cfg.stats)
        fprintf(stderr,
                "cuda_emu stats: %llu kernel launches, %llu host syncs (%llu pageable async copies), %llu device-to-host copies (%llu bytes), "
                "device memory now %zu bytes, peak %zu bytes, %llu allocations, digest %016" PRIx64 "\n",
                g_counters.launches, g_counters.host_syncs, g_counters.pageable_async, g_counters.d2h_copies, g_counters.d2h_bytes, g_counters.device_bytes,
                g_counters.device_bytes_peak, g_counters.allocations, g_digest);
}

void install_signal_handlers();

void init_once() {
    static std::once_flag once;
    std::call_once(once, [] {
        const char* s = getenv("EMU_SCHEDULE");
        if (s && *s) {
            if (!strcmp(s, "fwd")) g_cfg.sched = SCHED_FWD;
            else if (!strcmp(s, "rev")) g_cfg.sched = SCHED_REV;
            else if (!strncmp(s, "rand:", 5)) { g_cfg.sched = SCHED_RAND; g_cfg.seed = strtoull(s + 5, nullptr, 10); }
            else die("EMU_SCHEDULE=%s: want fwd, rev or rand:SEED", s);
        }
        const char* k = getenv("EMU_STACK_KB");
        if (k && *k) g_cfg.stack_bytes = (size_t)atoi(k) << 10;
        if (g_cfg.stack_bytes < (16 << 10)) g_cfg.stack_bytes = 16 << 10;
        const char* dc = getenv("EMU_DEVICE_COUNT");
        if (dc && *dc) g_cfg.ndev = atoi(dc) < 1 ? 1 : atoi(dc);
        const char* nd = getenv("EMU_NO_DEVICE");
        g_cfg.no_device = nd && *nd && strcmp(nd, "0");
        const char* st = getenv("EMU_STATS");
        g_cfg.stats = st && *st && strcmp(st, "0");
        const char* pf = getenv("EMU_PROFILE");
        g_cfg.profile = pf && *pf ? atoi(pf) : 0;
        const char* dg = getenv("EMU_DIGEST");
        g_cfg.digest_file = dg && *dg ? dg : nullptr;
        const char* co = getenv("EMU_COST_ONLY");
        g_cfg.cost_only = co && *co && strcmp(co, "0");
        install_signal_handlers();
        atexit(at_exit_report);
        g_cfg.ready = true;
    });
}

/* ================================================================================ last error */
cudaError_t g_last_error = cudaSuccess;
cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last_error = e;
    return e;
}
__attribute__((format(printf, 2, 3))) cudaError_t api_error(cudaError_t e, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "cuda_emu: %s\n", buf);
    fflush(stderr);
    return set_error(e);
}

/* ================================================================================ device memory */
size_t g_page = 4096;
struct Alloc {
    char* map;        /* mmap start (front guard page) */
    size_t map_len;
    char* user;       /* what cudaMalloc returned */
    size_t size;      /* as requested */
    size_t size16;    /* rounded to 16: user + size16 is the start of the back guard page */
    const char* file;
    int line;
};
std::map<uintptr_t, Alloc> g_allocs;           /* by user pointer */
std::map<uintptr_t, size_t> g_pinned;          /* cudaMallocHost: host memory */

/* the live allocation containing [p, p + n) (n 0: containing p), or null; caller holds g_mu */
const Alloc* find_alloc(const void* p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return nullptr;
    --it;
    const Alloc& al = it->second;
    uintptr_t s = (uintptr_t)al.user;
    if (a < s || a >= s + (al.size ? al.size : 1)) return nullptr;
    (void)n;
    return &al;
}

/* ================================================================================ kernels */
constexpr size_t SMEM_DEFAULT = 48 << 10;
constexpr size_t SMEM_OPTIN = 232448;       /* H100/H200: 227 KiB */
struct KernelInfo {
    std::string name;
    size_t max_dyn_optin = 0;                 /* cudaFuncAttributeMaxDynamicSharedMemorySize */
    size_t static_bytes = 0;                  /* learned: largest static shared use seen in a block */
    unsigned long long launches = 0, blocks = 0;   /* EMU_PROFILE: what ran, and the host seconds it took */
    double seconds = 0;
};
std::unordered_map<const void*, KernelInfo> g_kernels;

/* EMU_PROFILE=N: where the emulation's time goes, by kernel (host seconds: the fiber switches at barriers and warp
 * operations, and the arithmetic at the host's scalar speed; it says nothing of a GPU's time) */
void profile_report() {
    std::vector<const KernelInfo*> v;
    double total = 0;
    for (const auto& kv : g_kernels) { v.push_back(&kv.second); total += kv.second.seconds; }
    std::sort(v.begin(), v.end(), [](const KernelInfo* a, const KernelInfo* b) { return a->seconds > b->seconds; });
    fprintf(stderr, "cuda_emu profile: %.2f s in %zu kernels\n", total, v.size());
    for (size_t i = 0; i < v.size() && (int)i < g_cfg.profile; i++)
        fprintf(stderr, "  %8.3f s %5.1f%% %8llu launches %10llu blocks  %s\n", v[i]->seconds, total > 0 ? 100 * v[i]->seconds / total : 0.0,
                v[i]->launches, v[i]->blocks, v[i]->name.c_str());
}

/* ================================================================================ fibers */
enum FState { F_NEW = 0, F_READY, F_RUNNING, F_BARRIER, F_WARP, F_DONE };

struct Stack { char* base; size_t len; char* top; };

/* one pending cp.async: the 16 bytes it will write (read from the source at the issue), where, its group */
struct CpAsync {
    unsigned char data[16];
    char* dst;
    unsigned group;
    int line;
    const char* file;
};

struct Fiber : emu::ThreadCtx {
    int lin;
    int state;
    void* sp;
    Stack* stack;
    /* warp op */
    int wkind;
    unsigned wmask;
    int warg, wwidth;
    unsigned long long wval, wres;
    /* the call site of the warp op or barrier it waits at */
    const char* file;
    int line;
    /* a tensor-core collective's operands: pointers into the lane's own frame (valid while it waits) */
    const void* wop[4];
    /* cp.async: the copies issued and not yet landed (from cp_head on, in issue order) and the number of
     * groups committed so far (the open group's number) */
    std::vector<CpAsync> cpq;
    size_t cp_head;
    unsigned cp_groups;
#ifdef EMU_UCONTEXT
    ucontext_t uc;
#endif
};

struct SharedSite { const void* tag; size_t off; size_t bytes; const char* file; int line; const char* name; };

struct Launch {
    const char* name;
    const void* fn;
    const char* file;
    int line;
    emu::BodyFn body;
    const void* ctx;
    dim3 grid, block;
    size_t smem;
    size_t limit;          /* static + dynamic allowed */
    KernelInfo* ki;
};

struct Block : emu::BlockCtx {
    const Launch* L;
    int n;                 /* threads */
    size_t lin;            /* linear block index */
    std::vector<SharedSite> sites;
    size_t arena_used;     /* dynamic (rounded) + static so far */
    size_t static_used;
    int ndone, nbar, nwarp; /* threads exited, waiting at a barrier, waiting in a warp op */
};

struct Worker {
    void* sched_sp = nullptr;
#ifdef EMU_UCONTEXT
    ucontext_t sched_uc;
#endif
    std::vector<Stack*> free_stacks;
    std::vector<Stack*> all_stacks;
    std::vector<Fiber> fibers;
    std::vector<int> order;
    /* the round being run: its fibers in order (order's data), how many, the one running */
    const int* run = nullptr;
    int nrun = 0, pos = 0;
    char* arena = nullptr;
    Block block;
    /* the device buffer the last cp.async source lay in (no buffer is freed while a launch runs) */
    const char* src_lo = nullptr;
    const char* src_hi = nullptr;
    char* altstack = nullptr;
};
__thread Worker* tl_worker = nullptr;
__thread const Launch* tl_launch = nullptr;     /* the launch this OS thread works on */
const Launch* volatile g_cur_launch = nullptr;  /* for the signal handler */
std::mutex g_stacks_mu;
std::vector<Stack*> g_all_stacks;               /* every fiber stack (the signal handler's overflow test) */

Worker* worker() {
    Worker* w = tl_worker;
    if (w) return w;
    w = new Worker();
    w->arena = (char*)aligned_alloc(256, SMEM_OPTIN + 256);
    /* the SIGSEGV handler runs on this stack (a fiber may have overflowed its own) */
    size_t alt = 64 << 10;
    w->altstack = (char*)malloc(alt);
    stack_t ss;
    ss.ss_sp = w->altstack;
    ss.ss_size = alt;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    tl_worker = w;
    return w;
}

Stack* get_stack(Worker* w) {
    if (!w->free_stacks.empty()) {
        Stack* s = w->free_stacks.back();
        w->free_stacks.pop_back();
        return s;
    }
    size_t len = g_cfg.stack_bytes + g_page;
    char* p = (char*)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die("cannot map a fiber stack of %zu bytes: %s", len, strerror(errno));
    mprotect(p, g_page, PROT_NONE);   /* guard page below the stack */
    Stack* s = new Stack{p, len, p + len};
    w->all_stacks.push_back(s);
    {
        std::lock_guard<std::mutex> lk(g_stacks_mu);
        g_all_stacks.push_back(s);
    }
    return s;
}

const char* kind_name(int k) {
    switch (k) {
    case emu::W_SHFL_IDX: return "__shfl_sync";
    case emu::W_SHFL_XOR: return "__shfl_xor_sync";
    case emu::W_SHFL_DOWN: return "__shfl_down_sync";
    case emu::W_SHFL_UP: return "__shfl_up_sync";
    case emu::W_ANY: return "__any_sync";
    case emu::W_ALL: return "__all_sync";
    case emu::W_BALLOT: return "__ballot_sync";
    case emu::W_SYNCWARP: return "__syncwarp";
    case emu::W_MMA: return "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (mma_bf16_16816)";
    case emu::W_LDMATRIX: return "ldmatrix.sync.aligned.m8n8.shared.b16 (ldmatrix_*)";
    }
    return "?";
}

[[noreturn]] __attribute__((format(printf, 2, 3))) void kernel_die(const Block* b, const char* fmt, ...) {
    char buf[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lk(g_print_mu);
    die("kernel %s (launched at %s:%d), block (%u,%u,%u) of grid (%u,%u,%u), %d threads: %s", b->L->name, b->L->file, b->L->line,
        b->blockIdx.x, b->blockIdx.y, b->blockIdx.z, b->gridDim.x, b->gridDim.y, b->gridDim.z, b->n, buf);
}

/* a thread that ends with cp.async copies not landed: the wait is missing (on a GPU the copies would
 * land in the shared memory of a block that no longer exists, or of the next one) */
void check_cp_async_at_exit(Block* b, Fiber* f) {
    if (f->cp_head >= f->cpq.size()) return;
    const CpAsync& e = f->cpq[f->cp_head];
    const size_t n = f->cpq.size() - f->cp_head;
    if (e.group == f->cp_groups)
        kernel_die(b, "thread (%u,%u,%u) exits with %zu cp.async copies never committed nor waited for (the first issued at %s:%d): "
                   "cp_async_commit and cp_async_wait<N> / cp_async_wait_all are missing", f->idx.x, f->idx.y, f->idx.z, n, e.file, e.line);
    kernel_die(b, "thread (%u,%u,%u) exits with %zu cp.async copies in %u committed group(s) not waited for (the first issued at %s:%d): "
               "a cp_async_wait<N> / cp_async_wait_all is missing", f->idx.x, f->idx.y, f->idx.z, n, f->cp_groups - e.group, e.file, e.line);
}

/* save the running context into (sp, uc) and resume (to_sp, to_uc): the fields of a fiber or of the scheduler (the
 * unused pair is dropped by the preprocessor, so it need not exist) */
#ifdef EMU_UCONTEXT
#define EMU_SWITCH(sp, uc, to_sp, to_uc) swapcontext(&(uc), &(to_uc))
#else
#define EMU_SWITCH(sp, uc, to_sp, to_uc) emu_ctx_switch(&(sp), (to_sp))
#endif

void fiber_entry() {
    Worker* w = tl_worker;
    Fiber* f = static_cast<Fiber*>(emu_tl_thread);
    w->block.L->body(w->block.L->ctx);
    check_cp_async_at_exit(&w->block, f);
    f->state = F_DONE;
    w->block.ndone++;
    EMU_SWITCH(f->sp, f->uc, w->sched_sp, w->sched_uc);
    __builtin_unreachable();
}

#ifdef EMU_UCONTEXT
void uc_entry() { fiber_entry(); }
#endif

/* make a fiber runnable: a new one gets a stack and an initial frame that enters fiber_entry */
inline void prepare(Worker* w, Fiber* f) {
    if (f->state == F_NEW) {
        f->stack = get_stack(w);
#ifdef EMU_UCONTEXT
        getcontext(&f->uc);
        f->uc.uc_stack.ss_sp = f->stack->base + g_page;
        f->uc.uc_stack.ss_size = f->stack->len - g_page;
        f->uc.uc_link = nullptr;
        makecontext(&f->uc, uc_entry, 0);
#else
        f->sp = ctx_init(f->stack->top, fiber_entry);
#endif
    }
    f->state = F_RUNNING;
    emu_tl_thread = f;
}

/* from the scheduler: run the round's fibers from w->pos on. A fiber that blocks passes control straight
 * to the next fiber of the round (yield_to_next), so the scheduler gets it back only when a fiber exits
 * (its stack is handed on here, to the next new fiber) or the round's last fiber blocks. The order is
 * the round's, exactly as if the scheduler resumed each fiber in turn: one switch a blocking operation
 * instead of two. */
void run_round(Worker* w, std::vector<Fiber>& fib) {
    while (w->pos < w->nrun) {
        Fiber* f = &fib[w->run[w->pos]];
        prepare(w, f);
        EMU_SWITCH(w->sched_sp, w->sched_uc, f->sp, f->uc);
        emu_tl_thread = nullptr;
        /* the fiber that came back: the round's fiber at w->pos, exited or the last to block */
        Fiber* g = &fib[w->run[w->pos]];
        if (g->state == F_DONE) {
            w->free_stacks.push_back(g->stack);
            g->stack = nullptr;
        }
        w->pos++;
    }
}

/* from a fiber that blocks: on to the round's next fiber, or back to the scheduler after the last */
inline void yield_to_next(Fiber* f) {
    Worker* w = tl_worker;
    if (w->pos + 1 < w->nrun) {
        Fiber* g = &w->fibers[w->run[++w->pos]];
        prepare(w, g);
        EMU_SWITCH(f->sp, f->uc, g->sp, g->uc);
    } else {
        EMU_SWITCH(f->sp, f->uc, w->sched_sp, w->sched_uc);
    }
    emu_tl_thread = f;
}

inline Fiber* current_fiber(const char* what, const char* file, int line) {
    Fiber* f = static_cast<Fiber*>(emu_tl_thread);
    if (!f) die("%s called outside a kernel (host code) at %s:%d", what, file, line);
    return f;
}

/* ------------------------------------------------------------------ tensor-core collectives */
const char* tensor_shape(int kind, int arg) {
    static const char* names[] = {"", " x1", " x2", "", " x4", "", "", "", "", " x1.trans", " x2.trans", "", " x4.trans"};
    return kind == emu::W_LDMATRIX && arg >= 0 && arg < 13 ? names[arg] : "";
}

/* [p, p + n) inside the block's shared memory: the dynamic arena, or one __shared__ declaration reached
 * so far. Null when it is; otherwise what it is instead (for the message). */
const char* smem_range_problem(const Worker* w, const Block* b, const void* p, size_t n) {
    const char* c = (const char*)p;
    const char* a = w->arena;
    if (c >= a && c + n <= a + b->L->smem) return nullptr;
    for (const SharedSite& s : b->sites)
        if (c >= a + s.off && c + n <= a + s.off + s.bytes) return nullptr;
    if (c >= a && c < a + SMEM_OPTIN + 256) return "shared memory outside the dynamic arena and every __shared__ declaration (or across the end of one)";
    return "not shared memory (generic address outside the block's shared memory window)";
}

inline float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
inline float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* mma.m16n8k16 .row.col bf16 -> fp32 over the 32 lanes of warp `base`. Fragment layouts: PTX ISA,
 * "Matrix Fragments for mma.m16n8k16 with floating point type" (g = lane >> 2, t = lane & 3):
 *   A (16 x 16): register r of lane holds A[g + 8 (r & 1)][2t + 8 (r >> 1) + h], h = 0 low half, 1 high
 *   B (16 x 8):  register r holds B[2t + 8 r + h][g]
 *   C, D (16 x 8): element i holds [g + 8 (i >> 1)][2t + (i & 1)]
 * Arithmetic: d = (float)(sum_k A[m][k] B[k][n] + c), the products exact (bf16 x bf16 fits a double
 * exactly) and summed in double in k order 0..15, c added last, one rounding to fp32. All lanes' inputs
 * are read before any d is written (d may alias c). */
void mma_collective(std::vector<Fiber>& fib, int base) {
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const Fiber& f = fib[base + lane];
        const uint32_t* a = (const uint32_t*)f.wop[1];
        const uint32_t* bb = (const uint32_t*)f.wop[2];
        const float* c = (const float*)f.wop[3];
        const int g = lane >> 2, t = lane & 3;
        for (int r = 0; r < 4; r++) {
            const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
            A[row][col] = bf16_lo(a[r]);
            A[row][col + 1] = bf16_hi(a[r]);
        }
        for (int r = 0; r < 2; r++) {
            const int k = 2 * t + 8 * r;
            B[k][g] = bf16_lo(bb[r]);
            B[k + 1][g] = bf16_hi(bb[r]);
        }
        for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = c[i];
    }
    float D[16][8];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double s = 0.0;
            for (int k = 0; k < 16; k++) s += (double)A[m][k] * (double)B[k][n];
            D[m][n] = (float)(s + (double)C[m][n]);
        }
    for (int lane = 0; lane < 32; lane++) {
        float* d = (float*)fib[base + lane].wop[0];
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++) d[i] = D[g + 8 * (i >> 1)][2 * t + (i & 1)];
    }
}

/* ldmatrix.m8n8.x{1,2,4}[.trans].b16 over the 32 lanes of warp `base` (PTX ISA, "Warp-level matrix load
 * instruction: ldmatrix"): lanes 8i .. 8i+7 give the row addresses of matrix i; lane l receives in
 * register i the elements [l >> 2][2 (l & 3) + h] of matrix i (h = 0 low half), of its transpose with
 * .trans. Every address read must be 16-byte aligned with its 16 bytes in the block's shared memory. */
void ldmatrix_collective(Worker* w, Block* b, std::vector<Fiber>& fib, int base, int num, bool trans) {
    uint16_t M[4][8][8];
    for (int i = 0; i < num; i++)
        for (int r = 0; r < 8; r++) {
            const Fiber& f = fib[base + 8 * i + r];
            const void* p = f.wop[0];
            if ((uintptr_t)p & 15)
                kernel_die(b, "ldmatrix.x%d%s at %s:%d: lane %d of warp %d (row %d of matrix %d) gives the address %p, not 16-byte aligned", num,
                           trans ? ".trans" : "", f.file, f.line, 8 * i + r, base / 32, r, i, p);
            const char* why = smem_range_problem(w, b, p, 16);
            if (why)
                kernel_die(b, "ldmatrix.x%d%s at %s:%d: lane %d of warp %d (row %d of matrix %d) gives the address %p: %s", num, trans ? ".trans" : "",
                           f.file, f.line, 8 * i + r, base / 32, r, i, p, why);
            memcpy(M[i][r], p, 16);
        }
    for (int lane = 0; lane < 32; lane++) {
        uint32_t* out = (uint32_t*)fib[base + lane].wop[1];
        const int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < num; i++)
            out[i] = trans ? (uint32_t)M[i][2 * t][g] | (uint32_t)M[i][2 * t + 1][g] << 16 : (uint32_t)M[i][g][2 * t] | (uint32_t)M[i][g][2 * t + 1] << 16;
    }
}

/* complete every warp operation whose lanes have all arrived; true if any did */
bool resolve_warps(Block* b, std::vector<Fiber>& fib, std::vector<int>& run) {
    bool any = false;
    const int n = b->n;
    for (int base = 0; base < n; base += 32) {
        const int nl = std::min(32, n - base);
        for (int l = 0; l < nl; l++) {
            Fiber* f = &fib[base + l];
            if (f->state != F_WARP) continue;
            const unsigned M = f->wmask;
            const int kind = f->wkind;
            if (!((M >> l) & 1u))
                kernel_die(b, "%s at %s:%d: thread (%u,%u,%u) (warp %d lane %d) is not in its own mask 0x%08x", kind_name(kind), f->file,
                           f->line, f->idx.x, f->idx.y, f->idx.z, base / 32, l, M);
            const bool tensor = kind >= emu::W_MMA;
            bool ready = true;
            for (int j = 0; j < 32; j++) {
                if (!((M >> j) & 1u)) continue;
                if (j >= nl && tensor)
                    kernel_die(b, "%s at %s:%d: warp %d has %d threads (the block has %d): the instruction needs all 32 lanes of the warp",
                               kind_name(kind), f->file, f->line, base / 32, nl, n);
                if (j >= nl)
                    kernel_die(b, "%s at %s:%d: mask 0x%08x names lane %d of warp %d, which does not exist (the block has %d threads)",
                               kind_name(kind), f->file, f->line, M, j, base / 32, n);
                Fiber* g = &fib[base + j];
                if (g->state == F_DONE)
                    kernel_die(b, "%s at %s:%d (lane %d of warp %d): mask 0x%08x names lane %d, which has exited", kind_name(kind), f->file,
                               f->line, l, base / 32, M, j);
                if (g->state != F_WARP) { ready = false; continue; }
                if (g->wmask != M || g->wkind != kind)
                    kernel_die(b, "warp %d: lane %d waits in %s at %s:%d with mask 0x%08x, lane %d in %s at %s:%d with mask 0x%08x",
                               base / 32, l, kind_name(kind), f->file, f->line, M, j, kind_name(g->wkind), g->file, g->line, g->wmask);
                if (tensor && (g->warg != f->warg || g->line != f->line || (g->file != f->file && strcmp(g->file, f->file))))
                    kernel_die(b, "warp %d: lane %d waits in %s%s at %s:%d, lane %d in %s%s at %s:%d (every lane of the warp must execute the same "
                               "instruction)", base / 32, l, kind_name(kind), tensor_shape(kind, f->warg), f->file, f->line, j, kind_name(kind),
                               tensor_shape(kind, g->warg), g->file, g->line);
            }
            if (!ready) continue;
            if (tensor) {
                if (kind == emu::W_MMA) mma_collective(fib, base);
                else ldmatrix_collective(tl_worker, b, fib, base, f->warg & 7, (f->warg >> 3) & 1);
                for (int j = 0; j < 32; j++) {
                    fib[base + j].state = F_READY;
                    b->nwarp--;
                    run.push_back(base + j);
                }
                any = true;
                continue;
            }
            /* every lane of M has arrived: compute each lane's result */
            unsigned long long red = 0;
            if (kind == emu::W_ANY || kind == emu::W_ALL || kind == emu::W_BALLOT) {
                unsigned ballot = 0;
                for (int j = 0; j < nl; j++)
                    if (((M >> j) & 1u) && fib[base + j].wval) ballot |= 1u << j;
                red = kind == emu::W_BALLOT ? ballot : kind == emu::W_ANY ? (ballot != 0) : (ballot == M);
            }
            for (int j = 0; j < nl; j++) {
                if (!((M >> j) & 1u)) continue;
                Fiber* g = &fib[base + j];
                if (kind <= emu::W_SHFL_UP) {
                    const int w = g->wwidth;
                    if (w <= 0 || w > 32 || (w & (w - 1)))
                        kernel_die(b, "%s at %s:%d: width %d is not a power of 2 in 1..32", kind_name(kind), g->file, g->line, w);
                    const int seg = j & ~(w - 1);
                    int src = j;
                    if (kind == emu::W_SHFL_IDX) src = seg + (g->warg & (w - 1));
                    else if (kind == emu::W_SHFL_XOR) { src = j ^ g->warg; if (src >= seg + w) src = j; }
                    else if (kind == emu::W_SHFL_DOWN) { src = j + g->warg; if (src >= seg + w) src = j; }
                    else { src = j - g->warg; if (src < seg) src = j; }
                    if (src < 0 || src >= 32 || !((M >> src) & 1u))
                        kernel_die(b, "%s at %s:%d: lane %d of warp %d reads lane %d, which is not in the mask 0x%08x (undefined on a GPU)",
                                   kind_name(kind), g->file, g->line, j, base / 32, src, M);
                    g->wres = fib[base + src].wval;
                } else {
                    g->wres = red;
                }
                g->state = F_READY;
                b->nwarp--;
                run.push_back(base + j);
            }
            any = true;
        }
    }
    return any;
}

/* nothing can run, no warp op can complete, the barrier cannot release: say why and stop */
[[noreturn]] void diagnose(Block* b, std::vector<Fiber>& fib) {
    const int n = b->n;
    int nbar = 0, ndone = 0, nwarp = 0;
    const Fiber* first_bar = nullptr;
    for (int i = 0; i < n; i++) {
        const Fiber* f = &fib[i];
        if (f->state == F_BARRIER) { nbar++; if (!first_bar) first_bar = f; }
        else if (f->state == F_DONE) ndone++;
        else if (f->state == F_WARP) nwarp++;
    }
    /* a warp op waiting for a lane that waits at the barrier */
    for (int i = 0; i < n; i++) {
        const Fiber* f = &fib[i];
        if (f->state != F_WARP) continue;
        const int base = i & ~31;
        for (int j = 0; j < 32; j++)
            if (((f->wmask >> j) & 1u) && base + j < n && fib[base + j].state == F_BARRIER)
                kernel_die(b, "%s at %s:%d (thread %d) waits for lane %d of its warp, which waits at __syncthreads at %s:%d "
                           "(a barrier or warp operation in divergent code)",
                           kind_name(f->wkind), f->file, f->line, i, j, fib[base + j].file, fib[base + j].line);
    }
    if (first_bar)
        kernel_die(b, "divergent __syncthreads at %s:%d: %d of %d threads arrived, %d exited, %d wait in warp operations", first_bar->file,
                   first_bar->line, nbar, n, ndone, nwarp);
    kernel_die(b, "deadlock: %d threads wait in warp operations that cannot complete", nwarp);
}

void run_block(Worker* w, const Launch* L, uint3 bidx) {
    Block* b = &w->block;
    b->blockIdx = bidx;
    b->blockDim = L->block;
    b->gridDim = L->grid;
    b->L = L;
    b->n = (int)(L->block.x * L->block.y * L->block.z);
    b->lin = ((size_t)bidx.z * L->grid.y + bidx.y) * L->grid.x + bidx.x;
    b->sites.clear();
    b->arena_used = (L->smem + 15) & ~(size_t)15;
    b->static_used = 0;
    if (L->smem) memset(w->arena, 0xFF, L->smem);
    emu_tl_block = b;
    std::vector<Fiber>& fib = w->fibers;
    const int n = b->n;
    if ((int)fib.size() < n) fib.resize(n);
    const unsigned bx = L->block.x, by = L->block.y;
    for (int i = 0; i < n; i++) {
        Fiber* f = &fib[i];
        f->lin = i;
        f->idx.x = i % bx;
        f->idx.y = (i / bx) % by;
        f->idx.z = i / (bx * by);
        f->state = F_NEW;
        f->stack = nullptr;
        f->file = nullptr;
        f->line = 0;
        f->cpq.clear();
        f->cp_head = 0;
        f->cp_groups = 0;
    }
    w->src_lo = w->src_hi = nullptr;
    b->ndone = b->nbar = b->nwarp = 0;
    /* run: the fibers runnable in this round, in thread order; the schedule permutes it */
    std::vector<int>& run = w->order;
    run.resize(n);
    for (int i = 0; i < n; i++) run[i] = i;
    for (uint64_t round = 0;; round++) {
        const int nr = (int)run.size();
        if (g_cfg.sched == SCHED_REV) {
            std::reverse(run.begin(), run.end());
        } else if (g_cfg.sched == SCHED_RAND) {
            uint64_t s = mix64(g_cfg.seed * 0x9E3779B97F4A7C15ull + ((b->lin << 20) ^ round));
            for (int i = nr - 1; i > 0; i--) {
                s = mix64(s + 0x9E3779B97F4A7C15ull);
                std::swap(run[i], run[(int)(s % (uint64_t)(i + 1))]);
            }
        }
        w->run = run.data();
        w->nrun = nr;
        w->pos = 0;
        run_round(w, fib);
        run.clear();
        if (b->ndone == n) break;
        if (b->nwarp > 0 && resolve_warps(b, fib, run)) continue;
        if (b->nbar == n) {
            /* every thread waits at a barrier: the same one? */
            for (int i = 1; i < n; i++)
                if (fib[i].line != fib[0].line || (fib[i].file != fib[0].file && strcmp(fib[i].file, fib[0].file)))
                    kernel_die(b, "divergent __syncthreads: thread %d waits at %s:%d, thread 0 at %s:%d", i, fib[i].file, fib[i].line,
                               fib[0].file, fib[0].line);
            for (int i = 0; i < n; i++) { fib[i].state = F_READY; run.push_back(i); }
            b->nbar = 0;
            continue;
        }
        diagnose(b, fib);
    }
    /* the static shared memory this kernel uses, for the next launch's check */
    if (b->static_used > L->ki->static_bytes) {
        std::lock_guard<std::mutex> lk(g_mu);
        if (b->static_used > L->ki->static_bytes) L->ki->static_bytes = b->static_used;
    }
    emu_tl_block = nullptr;
}

/* ================================================================================ signals */
void segv_handler(int sig, siginfo_t* si, void*) {
    char msg[1024];
    uintptr_t a = (uintptr_t)si->si_addr;
    const Launch* L = g_cur_launch;
    char where[512];
    if (L) snprintf(where, sizeof(where), "kernel %s (launched at %s:%d)", L->name, L->file, L->line);
    else snprintf(where, sizeof(where), "host code (no kernel running; last kernel %s)", g_last_kernel);
    const char* what = sig == SIGSEGV ? "out-of-bounds access" : "bus error";
    int n = 0;
    /* a device buffer's guard pages */
    for (auto& kv : g_allocs) {
        const Alloc& al = kv.second;
        uintptr_t ms = (uintptr_t)al.map, us = (uintptr_t)al.user, ue = us + al.size16;
        if (a >= ue && a < ue + g_page) {
            n = snprintf(msg, sizeof(msg), "cuda_emu: %s: %s at %p: %zu bytes past the end of a %zu-byte device buffer allocated at %s:%d\n",
                         where, what, si->si_addr, (size_t)(a - (us + al.size)), al.size, al.file, al.line);
            break;
        }
        if (a >= ms && a < us) {
            n = snprintf(msg, sizeof(msg), "cuda_emu: %s: %s at %p: %zu bytes before the start of a %zu-byte device buffer allocated at %s:%d\n",
                         where, what, si->si_addr, (size_t)(us - a), al.size, al.file, al.line);
            break;
        }
    }
    if (!n) {
        for (Stack* s : g_all_stacks)
            if (a >= (uintptr_t)s->base && a < (uintptr_t)s->base + g_page) {
                const emu::ThreadCtx* t = emu_tl_thread;
                n = snprintf(msg, sizeof(msg), "cuda_emu: %s: stack overflow of an emulated thread (%u,%u,%u) (EMU_STACK_KB=%zu is too small)\n",
                             where, t ? t->idx.x : 0, t ? t->idx.y : 0, t ? t->idx.z : 0, g_cfg.stack_bytes >> 10);
                break;
            }
    }
    if (!n) {
        const emu::ThreadCtx* t = emu_tl_thread;
        if (t)
            n = snprintf(msg, sizeof(msg), "cuda_emu: %s: invalid memory access at %p by thread (%u,%u,%u) (not a device buffer's guard page)\n",
                         where, si->si_addr, t->idx.x, t->idx.y, t->idx.z);
        else
            n = snprintf(msg, sizeof(msg), "cuda_emu: %s: invalid memory access at %p (signal %d)\n", where, si->si_addr, sig);
    }
    fflush(stdout);
    ssize_t unused = write(2, msg, (size_t)n);
    (void)unused;
    _exit(1);
}

void install_signal_handlers() {
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

/* ================================================================================ memcpy checks */
enum Where { W_HOST, W_DEVICE };
const char* kind_str(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
    }
    return "(invalid kind)";
}

/* checks one side of a copy: p must be where `want` says, and a device range must fit its allocation */
cudaError_t check_side(const char* api, const char* side, const void* p, size_t n, Where want, const char* kind) {
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc* al = find_alloc(p, 0);
    if (want == W_DEVICE) {
        if (!al)
            return api_error(cudaErrorInvalidValue, "%s(%s): %s pointer %p is not device memory (not inside a live cudaMalloc buffer)",
                             api, kind, side, p);
        size_t off = (size_t)((const char*)p - al->user);
        if (n > al->size - off)
            return api_error(cudaErrorInvalidValue,
                             "%s(%s): %s range of %zu bytes at offset %zu overruns the %zu-byte device buffer allocated at %s:%d by %zu bytes",
                             api, kind, side, n, off, al->size, al->file, al->line, n - (al->size - off));
    } else if (al) {
        return api_error(cudaErrorInvalidValue, "%s(%s): %s pointer %p is device memory (a buffer allocated at %s:%d), not host memory", api,
                         kind, side, p, al->file, al->line);
    }
    return cudaSuccess;
}

/* [p, p + n) inside one cudaMallocHost buffer */
bool is_pinned(const void* p, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_pinned.upper_bound((uintptr_t)p);
    if (it == g_pinned.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

bool is_device(const void* p) {
    std::lock_guard<std::mutex> lk(g_mu);
    return find_alloc(p, 0) != nullptr;
}

cudaError_t do_memcpy(const char* api, void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool sync) {
    init_once();
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return api_error(cudaErrorInvalidValue, "%s(%s): null pointer (dst %p, src %p)", api, kind_str(kind), dst, src);
    Where ws, wd;
    switch (kind) {
    case cudaMemcpyHostToHost: ws = W_HOST; wd = W_HOST; break;
    case cudaMemcpyHostToDevice: ws = W_HOST; wd = W_DEVICE; break;
    case cudaMemcpyDeviceToHost: ws = W_DEVICE; wd = W_HOST; break;
    case cudaMemcpyDeviceToDevice: ws = W_DEVICE; wd = W_DEVICE; break;
    case cudaMemcpyDefault: ws = is_device(src) ? W_DEVICE : W_HOST; wd = is_device(dst) ? W_DEVICE : W_HOST; break;
    default: return api_error(cudaErrorInvalidMemcpyDirection, "%s: invalid cudaMemcpyKind %d", api, (int)kind);
    }
    cudaError_t e = check_side(api, "source", src, n, ws, kind_str(kind));
    if (e != cudaSuccess) return e;
    e = check_side(api, "destination", dst, n, wd, kind_str(kind));
    if (e != cudaSuccess) return e;
    if (!g_cfg.cost_only || (ws == W_HOST && wd == W_HOST)) memmove(dst, src, n);
    else if (wd == W_HOST) memset(dst, 0, n);   /* cost-only: device memory is never touched, the host gets zeros */
    if (ws == W_DEVICE && wd == W_HOST) {
        digest_copy(dst, n);
        /* an asynchronous copy into pageable (not cudaMallocHost) memory returns only when it is done (CUDA's
         * "API synchronization behavior"): a host synchronisation like the synchronous copy */
        if (sync || !is_pinned(dst, n)) g_counters.host_syncs++;
        if (!sync && !is_pinned(dst, n)) g_counters.pageable_async++;
    }
    return cudaSuccess;
}

cudaError_t do_memset(const char* api, void* p, int v, size_t n) {
    init_once();
    if (n == 0) return cudaSuccess;
    cudaError_t e = check_side(api, "destination", p, n, W_DEVICE, "device memory");
    if (e != cudaSuccess) return e;
    if (!g_cfg.cost_only) memset(p, v, n);
    return cudaSuccess;
}

}  // namespace

/* ================================================================================ device side API */
namespace emu {

void syncthreads(const char* file, int line) {
    Fiber* f = current_fiber("__syncthreads", file, line);
    f->state = F_BARRIER;
    tl_worker->block.nbar++;
    f->file = file;
    f->line = line;
    yield_to_next(f);
}

unsigned long long warp_op(int kind, unsigned mask, unsigned long long bits, int arg, int width, const char* file, int line) {
    Fiber* f = current_fiber(kind_name(kind), file, line);
    f->state = F_WARP;
    tl_worker->block.nwarp++;
    f->wkind = kind;
    f->wmask = mask;
    f->wval = bits;
    f->warg = arg;
    f->wwidth = width;
    f->file = file;
    f->line = line;
    yield_to_next(f);
    return f->wres;
}

void* shared_slot(const void* tag, size_t bytes, size_t align, const char* file, int line, const char* name) {
    Worker* w = tl_worker;
    Block* b = w ? &w->block : nullptr;
    if (!b || !emu_tl_thread) die("__shared__ %s (%s:%d) used outside a kernel", name, file, line);
    for (const SharedSite& s : b->sites)
        if (s.tag == tag) return w->arena + s.off;
    if (align < 16) align = 16;
    size_t off = (b->arena_used + align - 1) & ~(align - 1);
    const size_t stat = b->static_used + bytes;
    if (stat > SMEM_DEFAULT)
        kernel_die(b, "__shared__ %s at %s:%d: static shared memory reaches %zu bytes, over the 48 KiB a kernel may declare statically "
                   "(ptxas refuses it; use dynamic shared memory and the opt-in)", name, file, line, stat);
    if (off + bytes > b->L->limit)
        kernel_die(b, "__shared__ %s at %s:%d: static (%zu) + dynamic (%zu) shared memory = %zu bytes, over the kernel's limit of %zu bytes%s",
                   name, file, line, stat, b->L->smem, off + bytes, b->L->limit,
                   b->L->limit == SMEM_DEFAULT ? " (48 KiB without the cudaFuncAttributeMaxDynamicSharedMemorySize opt-in)" : "");
    memset(w->arena + off, 0xFF, bytes);
    b->sites.push_back(SharedSite{tag, off, bytes, file, line, name});
    b->arena_used = off + bytes;
    b->static_used = stat;
    return w->arena + off;
}

void* dynamic_shared(const char* file, int line) {
    Worker* w = tl_worker;
    if (!w || !emu_tl_thread) die("extern __shared__ (%s:%d) used outside a kernel", file, line);
    return w->arena;
}

void launch_impl(const char* name, const void* fn, const LaunchCfg& cfg, const char* file, int line, BodyFn body, const void* ctx) {
    init_once();
    if (emu_tl_thread) die("kernel %s launched from device code at %s:%d (dynamic parallelism is not emulated)", name, file, line);
    KernelInfo* ki;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        ki = &g_kernels[fn];
        if (ki->name.empty()) ki->name = name;
    }
    const dim3 g = cfg.grid, bk = cfg.block;
    const unsigned long long nthreads = (unsigned long long)bk.x * bk.y * bk.z;
    char why[256] = "";
    cudaError_t err = cudaSuccess;
    if (!g.x || !g.y || !g.z || !bk.x || !bk.y || !bk.z) {
        snprintf(why, sizeof(why), "a zero dimension: grid (%u,%u,%u), block (%u,%u,%u)", g.x, g.y, g.z, bk.x, bk.y, bk.z);
        err = cudaErrorInvalidConfiguration;
    } else if (nthreads > 1024) {
        snprintf(why, sizeof(why), "block (%u,%u,%u) has %llu threads, more than 1024", bk.x, bk.y, bk.z, nthreads);
        err = cudaErrorInvalidConfiguration;
    } else if (bk.x > 1024 || bk.y > 1024 || bk.z > 64) {
        snprintf(why, sizeof(why), "block (%u,%u,%u) over the limits (1024, 1024, 64)", bk.x, bk.y, bk.z);
        err = cudaErrorInvalidConfiguration;
    } else if (g.x > 2147483647u || g.y > 65535u || g.z > 65535u) {
        snprintf(why, sizeof(why), "grid (%u,%u,%u) over the limits (2^31-1, 65535, 65535)", g.x, g.y, g.z);
        err = cudaErrorInvalidConfiguration;
    }
    size_t limit = ki->max_dyn_optin ? SMEM_OPTIN : SMEM_DEFAULT;
    if (err == cudaSuccess) {
        const size_t dyn_allowed = ki->max_dyn_optin ? ki->max_dyn_optin : SMEM_DEFAULT;
        if (cfg.smem > dyn_allowed) {
            snprintf(why, sizeof(why), "%zu bytes of dynamic shared memory, over the %zu bytes allowed%s", cfg.smem, dyn_allowed,
                     ki->max_dyn_optin ? " (cudaFuncAttributeMaxDynamicSharedMemorySize)" : " without the cudaFuncAttributeMaxDynamicSharedMemorySize opt-in");
            err = cudaErrorInvalidValue;
        } else if (cfg.smem + ki->static_bytes > limit) {
            snprintf(why, sizeof(why), "%zu bytes of dynamic + %zu bytes of static shared memory, over the limit of %zu bytes", cfg.smem,
                     ki->static_bytes, limit);
            err = cudaErrorInvalidValue;
        }
    }
    if (err != cudaSuccess) {
        api_error(err, "kernel %s (launched at %s:%d): launch refused: %s", name, file, line, why);
        return;
    }
    Launch L;
    L.name = ki->name.c_str();
    L.fn = fn;
    L.file = file;
    L.line = line;
    L.body = body;
    L.ctx = ctx;
    L.grid = g;
    L.block = bk;
    L.smem = cfg.smem;
    L.limit = limit;
    L.ki = ki;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        g_counters.launches++;
        g_last_kernel = L.name;
    }
    if (g_cfg.cost_only) return;   /* checked and counted, not run */
    g_cur_launch = &L;
    const uint64_t nb = (uint64_t)g.x * g.y * g.z;
    /* the block order: fwd, rev, or an affine permutation i -> (a i + c) mod nb with gcd(a, nb) = 1 */
    uint64_t pa = 1, pc = 0;
    if (g_cfg.sched == SCHED_RAND && nb > 1) {
        uint64_t s = mix64(g_cfg.seed ^ 0x5bd1e995u ^ g_counters.launches);
        pc = s % nb;
        pa = (mix64(s) % nb) | 1;
        auto gcd = [](uint64_t x, uint64_t y) { while (y) { uint64_t t = x % y; x = y; y = t; } return x; };
        while (gcd(pa, nb) != 1) pa += 2;
    }
    auto block_of = [&](uint64_t i) -> uint3 {
        uint64_t k = g_cfg.sched == SCHED_REV ? nb - 1 - i : g_cfg.sched == SCHED_RAND ? (uint64_t)(((unsigned __int128)pa * i + pc) % nb) : i;
        uint3 r;
        r.x = (unsigned)(k % g.x);
        r.y = (unsigned)((k / g.x) % g.y);
        r.z = (unsigned)(k / ((uint64_t)g.x * g.y));
        return r;
    };
    const int nthr = omp_get_max_threads();
    const auto t0 = std::chrono::steady_clock::now();
    if (nb == 1 || nthr <= 1) {
        Worker* w = worker();
        tl_launch = &L;
        for (uint64_t i = 0; i < nb; i++) run_block(w, &L, block_of(i));
        tl_launch = nullptr;
    } else {
        const long long nbl = (long long)nb;
#pragma omp parallel for schedule(dynamic, 4)
        for (long long i = 0; i < nbl; i++) {
            Worker* w = worker();
            tl_launch = &L;
            run_block(w, &L, block_of((uint64_t)i));
            tl_launch = nullptr;
        }
    }
    ki->launches++;
    ki->blocks += nb;
    ki->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g_cur_launch = nullptr;
}

/* the tensor-core collectives: the lane deposits its operands and yields; resolve_warps computes all
 * 32 lanes' results at once (mma_collective, ldmatrix_collective) when the whole warp has arrived */
void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c, const char* file, int line) {
    Fiber* f = current_fiber("mma_bf16_16816", file, line);
    f->wop[0] = d;
    f->wop[1] = a;
    f->wop[2] = b;
    f->wop[3] = c;
    warp_op(W_MMA, 0xffffffffu, 0, 0, 32, file, line);
}

void ldmatrix(uint32_t* r, int num, bool trans, const void* smem_row, const char* file, int line) {
    Fiber* f = current_fiber("ldmatrix", file, line);
    f->wop[0] = smem_row;
    f->wop[1] = r;
    warp_op(W_LDMATRIX, 0xffffffffu, 0, num | (trans ? 8 : 0), 32, file, line);
}

/* cp.async: checked and its source read at the issue, queued on the thread, written to shared memory only
 * at the wait that covers its group */
void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes, const char* file, int line) {
    Fiber* f = current_fiber("cp_async_16", file, line);
    Worker* w = tl_worker;
    Block* b = &w->block;
    if (src_bytes < 0 || src_bytes > 16)
        kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): src_bytes %d, not in 0..16", file, line, f->idx.x, f->idx.y, f->idx.z, src_bytes);
    if ((uintptr_t)smem_dst & 15)
        kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): destination %p is not 16-byte aligned", file, line, f->idx.x, f->idx.y, f->idx.z,
                   smem_dst);
    const char* why = smem_range_problem(w, b, smem_dst, 16);
    if (why) kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): destination %p: %s", file, line, f->idx.x, f->idx.y, f->idx.z, smem_dst, why);
    CpAsync e;
    memset(e.data, 0, 16);
    if (src_bytes > 0) {
        const char* src = (const char*)gmem_src;
        if ((uintptr_t)src & 15)
            kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): source %p is not 16-byte aligned", file, line, f->idx.x, f->idx.y, f->idx.z, src);
        if (!(src >= w->src_lo && src + src_bytes <= w->src_hi)) {
            std::lock_guard<std::mutex> lk(g_mu);
            const Alloc* al = find_alloc(src, 0);
            if (!al)
                kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): source %p is not device memory (not inside a live cudaMalloc buffer)", file,
                           line, f->idx.x, f->idx.y, f->idx.z, src);
            const size_t off = (size_t)(src - al->user);
            if ((size_t)src_bytes > al->size - off)
                kernel_die(b, "cp_async_16 at %s:%d: thread (%u,%u,%u): the %d source bytes at offset %zu overrun the %zu-byte device buffer "
                           "allocated at %s:%d", file, line, f->idx.x, f->idx.y, f->idx.z, src_bytes, off, al->size, al->file, al->line);
            w->src_lo = al->user;
            w->src_hi = al->user + al->size;
        }
        memcpy(e.data, src, (size_t)src_bytes);
    }
    e.dst = (char*)smem_dst;
    e.group = f->cp_groups;
    e.file = file;
    e.line = line;
    f->cpq.push_back(e);
}

void cp_async_commit(const char* file, int line) {
    Fiber* f = current_fiber("cp_async_commit", file, line);
    f->cp_groups++;
}

/* land every copy of a committed group older than the newest n */
void cp_async_wait(int n, const char* file, int line) {
    Fiber* f = current_fiber("cp_async_wait", file, line);
    size_t h = f->cp_head;
    const size_t end = f->cpq.size();
    while (h < end && f->cpq[h].group + (unsigned)n < f->cp_groups) {
        memcpy(f->cpq[h].dst, f->cpq[h].data, 16);
        h++;
    }
    if (h == end) {
        f->cpq.clear();
        h = 0;
    }
    f->cp_head = h;
}

/* cp.async.wait_all = commit_group + wait_group 0 */
void cp_async_wait_all(const char* file, int line) {
    cp_async_commit(file, line);
    cp_async_wait(0, file, line);
}

uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) | (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

}  // namespace emu

/* ================================================================================ host API */
extern "C" {

const emu_counters_t* emu_counters(void) { return &g_counters; }
unsigned long long emu_digest(void) { return g_digest; }
void emu_note_launch(const char* name) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_last_kernel_store = name;
    g_last_kernel = g_last_kernel_store.c_str();
}
int emu_cost_only(void) {
    init_once();
    return g_cfg.cost_only ? 1 : 0;
}
int emu_is_device_range(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lk(g_mu);
    const Alloc* al = find_alloc(p, 0);
    return al && bytes <= al->size - (size_t)((const char*)p - al->user);
}

cudaError_t cudaMalloc_at(void** ptr, size_t size, const char* file, int line) {
    init_once();
    if (!ptr) return api_error(cudaErrorInvalidValue, "cudaMalloc at %s:%d: null result pointer", file, line);
    *ptr = nullptr;
    if (size == 0) return cudaSuccess;   /* as the runtime: success, a null pointer */
    const size_t size16 = (size + 15) & ~(size_t)15;
    const size_t data_pages = (size16 + g_page - 1) / g_page * g_page;
    const size_t map_len = g_page + data_pages + g_page;
    char* m = (char*)mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return set_error(cudaErrorMemoryAllocation);
    mprotect(m, g_page, PROT_NONE);
    mprotect(m + g_page + data_pages, g_page, PROT_NONE);
    char* user = m + g_page + data_pages - size16;
    if (!g_cfg.cost_only) memset(user, 0xFF, size16);   /* cost-only: reserved, never touched */
    {
        std::lock_guard<std::mutex> lk(g_mu);
        g_allocs[(uintptr_t)user] = Alloc{m, map_len, user, size, size16, file, line};
        g_counters.device_bytes += size;
        g_counters.allocations++;
        g_counters.allocated_bytes += size;
        if (g_counters.device_bytes > g_counters.device_bytes_peak) g_counters.device_bytes_peak = g_counters.device_bytes;
    }
    *ptr = user;
    return cudaSuccess;
}
cudaError_t (cudaMalloc)(void** ptr, size_t size) { return cudaMalloc_at(ptr, size, "(unknown)", 0); }

cudaError_t cudaFree(void* p) {
    init_once();
    if (!p) return cudaSuccess;
    Alloc al;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_allocs.find((uintptr_t)p);
        if (it == g_allocs.end()) {
            const Alloc* in = find_alloc(p, 0);
            if (in)
                return api_error(cudaErrorInvalidValue, "cudaFree(%p): not the start of a device buffer (%zu bytes into the buffer allocated at %s:%d)",
                                 p, (size_t)((char*)p - in->user), in->file, in->line);
            return api_error(cudaErrorInvalidValue, "cudaFree(%p): not a live device allocation (freed twice, or never allocated by cudaMalloc)", p);
        }
        al = it->second;
        g_allocs.erase(it);
        g_counters.device_bytes -= al.size;
    }
    munmap(al.map, al.map_len);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
    init_once();
    if (!ptr) return set_error(cudaErrorInvalidValue);
    void* p = malloc(size ? size : 1);
    if (!p) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mu);
    g_pinned[(uintptr_t)p] = size;
    *ptr = p;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }
cudaError_t cudaFreeHost(void* p) {
    init_once();
    if (!p) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_pinned.find((uintptr_t)p);
        if (it == g_pinned.end()) return api_error(cudaErrorInvalidValue, "cudaFreeHost(%p): not memory from cudaMallocHost", p);
        g_pinned.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) { return do_memcpy("cudaMemcpy", dst, src, n, kind, true); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
    return do_memcpy("cudaMemcpyAsync", dst, src, n, kind, false);
}
cudaError_t cudaMemset(void* p, int v, size_t n) { return do_memset("cudaMemset", p, v, n); }
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) { return do_memset("cudaMemsetAsync", p, v, n); }

struct CUstream_st { int magic; };
cudaError_t cudaStreamCreate(cudaStream_t* s) {
    init_once();
    if (!s) return set_error(cudaErrorInvalidValue);
    *s = new CUstream_st{0x5743};
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s || s->magic != 0x5743) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream", (void*)s);
    s->magic = 0;
    delete s;
    return cudaSuccess;
}
/* Events: streams run synchronously, so an event is complete when it is recorded and a wait on it has
 * nothing to wait for; the calls check their handles (a destroyed or never-created event, a stream that is
 * not live: cudaErrorInvalidResourceHandle), as the order they express is what the GPU needs. */
struct CUevent_st { int magic; };
cudaError_t cudaEventCreate(cudaEvent_t* e) {
    init_once();
    if (!e) return set_error(cudaErrorInvalidValue);
    *e = new CUevent_st{0x4576};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e || e->magic != 0x4576) return api_error(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", (void*)e);
    e->magic = 0;
    delete e;
    return cudaSuccess;
}
static bool stream_ok(cudaStream_t s) { return !s || s->magic == 0x5743; }   /* 0: the default stream */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e || e->magic != 0x4576) return api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p): not a live event", (void*)e);
    if (!stream_ok(s)) return api_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: stream %p is not live", (void*)s);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e || e->magic != 0x4576) return api_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize(%p): not a live event", (void*)e);
    g_counters.host_syncs++;
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    if (!e || e->magic != 0x4576) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent(%p): not a live event", (void*)e);
    if (!stream_ok(s)) return api_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: stream %p is not live", (void*)s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
    init_once();
    g_counters.host_syncs++;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    init_once();
    g_counters.host_syncs++;
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
    cudaError_t e = g_last_error;
    g_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
    }
}
const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int* count) {
    init_once();
    if (!count) return set_error(cudaErrorInvalidValue);
    if (g_cfg.no_device) {
        *count = 0;
        return set_error(cudaErrorNoDevice);
    }
    *count = g_cfg.ndev;
    return cudaSuccess;
}
int g_device = 0;
cudaError_t cudaGetDevice(int* d) {
    if (!d) return set_error(cudaErrorInvalidValue);
    *d = g_device;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    init_once();
    if (g_cfg.no_device) return set_error(cudaErrorNoDevice);
    if (d < 0 || d >= g_cfg.ndev) return api_error(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulated node has %d devices", d, g_cfg.ndev);
    g_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    init_once();
    if (!p) return set_error(cudaErrorInvalidValue);
    if (g_cfg.no_device) return set_error(cudaErrorNoDevice);
    if (d < 0 || d >= g_cfg.ndev) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "cuda_emu (emulated H200)");
    p->totalGlobalMem = (size_t)141 * 1000 * 1000 * 1000;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    p->clockRate = 1980000;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->memoryClockRate = 2619000;
    p->memoryBusWidth = 6144;
    p->l2CacheSize = 50 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = g_cfg.no_device ? 0 : CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    const size_t total = (size_t)141 * 1000 * 1000 * 1000;
    if (total_bytes) *total_bytes = total;
    if (free_bytes) *free_bytes = total - g_counters.device_bytes;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute_emu(const void* fn, cudaFuncAttribute attr, int value) {
    init_once();
    if (!fn) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(g_mu);
    KernelInfo& ki = g_kernels[fn];
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value + ki.static_bytes > SMEM_OPTIN) {
            fflush(stdout);
            fprintf(stderr, "cuda_emu: cudaFuncSetAttribute(MaxDynamicSharedMemorySize, %d): over the %zu-byte opt-in limit%s\n", value,
                    SMEM_OPTIN, ki.static_bytes ? " with the kernel's static shared memory" : "");
            return set_error(cudaErrorInvalidValue);
        }
        ki.max_dyn_optin = (size_t)value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return set_error(cudaErrorInvalidValue);
}

}  // extern "C"
