/* dist.h: data parallelism over MPI on the CPU (the CUDA trainer adds NCCL on top of the same
 * launch). Built without MPI (no mpicc), every call degenerates to the single-process case.
 * Gradients are summed with MPI_Allreduce; the loss was already scaled by 1/(R*A*B*T), so the sum
 * is the average. Weights are compared across ranks by their checksum (dist_check_same). */
#ifndef TSDC_DIST_H
#define TSDC_DIST_H

#include <stdint.h>
#include <stdlib.h>
#include "utils.h"

typedef struct { int rank, world; } Dist;

#ifdef USE_MPI
#define mpiCheck(call) do { int e_ = (call); if (e_ != MPI_SUCCESS) { char s_[MPI_MAX_ERROR_STRING]; int n_; \
    MPI_Error_string(e_, s_, &n_); tsdc_fail("MPI error %s [%s:%d]", s_, __FILE__, __LINE__); } } while (0)
#endif

/* the number of processes a launcher (mpirun/mpiexec of OpenMPI, MPICH, Intel MPI, MVAPICH; srun;
 * PMIx) started, read from its environment, and the name of the variable; 1 when none says more */
static long dist_launcher_size(const char** var) {
    static const char* const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                                       "SLURM_STEP_NUM_TASKS", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char* v = getenv(vars[i]);
        long n = v ? strtol(v, NULL, 10) : 0;
        if (n > 1) { *var = vars[i]; return n; }
    }
    return 1;
}

static void dist_init(Dist* d, int* argc, char*** argv) {
    d->rank = 0; d->world = 1;
#ifdef USE_MPI
    mpiCheck(MPI_Init(argc, argv));
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
#else
    /* built without MPI but started as one of several processes: each would train alone on the same
     * data and write the same files, so refuse at once (one line, from the first process only) */
    const char* var = NULL;
    long n = dist_launcher_size(&var);
    if (n > 1) {
        const char* r = getenv("OMPI_COMM_WORLD_RANK");
        if (!r) r = getenv("PMI_RANK");
        if (!r) r = getenv("PMIX_RANK");
        if (!r) r = getenv("SLURM_PROCID");
        if (!r || atoi(r) == 0) {
            const char* name = strrchr((*argv)[0], '/');
            name = name ? name + 1 : (*argv)[0];
            fprintf(stderr, "error: %s was built without MPI but started as one of %ld processes (%s=%ld): install "
                    "OpenMPI (apt-get install openmpi-bin libopenmpi-dev) and rebuild with make (it then finds mpicc), "
                    "or run one process\n", name, n, var, n);
        }
        fflush(stderr);
        exit(1);
    }
    (void)argc;
#endif
}
static void dist_finalize(Dist* d) {
    (void)d;
#ifdef USE_MPI
    MPI_Finalize();
#endif
}
static void dist_allreduce_sum_f32(Dist* d, float* x, size_t n) {
    (void)d; (void)x; (void)n;
#ifdef USE_MPI
    if (d->world > 1) {
        const size_t chunk = (size_t)1 << 28;
        for (size_t off = 0; off < n; off += chunk) {
            int cnt = (int)(n - off < chunk ? n - off : chunk);
            mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        }
    }
#endif
}
static void dist_allreduce_sum_f64(Dist* d, double* x, int n) {
    (void)d; (void)x; (void)n;
#ifdef USE_MPI
    if (d->world > 1) mpiCheck(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
#endif
}
/* all-gather one double per rank into out[world] (rank order) */
static void dist_allgather_f64(Dist* d, double x, double* out) {
#ifdef USE_MPI
    if (d->world > 1) { mpiCheck(MPI_Allgather(&x, 1, MPI_DOUBLE, out, 1, MPI_DOUBLE, MPI_COMM_WORLD)); return; }
#endif
    (void)d; out[0] = x;
}
static void dist_barrier(Dist* d) {
    (void)d;
#ifdef USE_MPI
    if (d->world > 1) mpiCheck(MPI_Barrier(MPI_COMM_WORLD));
#endif
}
static void dist_bcast_bytes(Dist* d, void* buf, size_t n, int root) {
    (void)d; (void)buf; (void)n; (void)root;
#ifdef USE_MPI
    if (d->world > 1) mpiCheck(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
#endif
}
/* all-gather equal blocks of doubles in place: rank r's block is buf[r*n .. r*n+n) on entry (the
 * others are ignored) and every block is filled on return */
static void dist_allgather_f64_block(Dist* d, double* buf, size_t n) {
#ifdef USE_MPI
    if (d->world > 1) { mpiCheck(MPI_Allgather(MPI_IN_PLACE, (int)n, MPI_DOUBLE, buf, (int)n, MPI_DOUBLE, MPI_COMM_WORLD)); return; }
#endif
    (void)d; (void)buf; (void)n;
}
/* every rank passes its weight checksum; a mismatch is an error naming the ranks */
static void dist_check_same(Dist* d, uint64_t h, const char* when) {
#ifdef USE_MPI
    if (d->world > 1) {
        uint64_t* all = (uint64_t*)mallocCheck(sizeof(uint64_t) * d->world);
        mpiCheck(MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD));
        for (int r = 1; r < d->world; r++)
            if (all[r] != all[0])
                tsdc_fail("weights differ across ranks %s: rank 0 hash %016llx, rank %d hash %016llx", when,
                          (unsigned long long)all[0], r, (unsigned long long)all[r]);
        free(all);
    }
#else
    (void)d; (void)h; (void)when;
#endif
}
static int dist_built_with_mpi(void) {
#ifdef USE_MPI
    return 1;
#else
    return 0;
#endif
}

#endif
