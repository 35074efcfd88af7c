/* utils.h: error handling shared by every train_sdc program.
 * Every call that can fail is wrapped (fopenCheck, mallocCheck, freadCheck, ...). Errors about user
 * input go through tsdc_fail(): one line "error: <what>: <problem>" on stderr and exit(1), never a
 * crash. Under MPI the whole job is aborted so that no rank hangs waiting for the failed one. */
#ifndef TSDC_UTILS_H
#define TSDC_UTILS_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef USE_MPI
/* the C API only: in a C++ build OpenMPI's and MPICH's mpi.h also declare their C++ bindings, which
 * need libmpi_cxx, not in `mpicc --showme:link`: g++ (the CUDA emulation's build of the .cu files)
 * emits their vtables and fails to link (undefined MPI::Comm::Comm()); nvcc happens not to */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif

static inline void tsdc_abort(int code) {
#ifdef USE_MPI
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) {
        int size = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (size > 1) { fflush(stdout); fflush(stderr); MPI_Abort(MPI_COMM_WORLD, code); }
    }
#endif
    exit(code);
}

/* one-line error and exit(1) */
static inline void tsdc_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    tsdc_abort(1);
}

static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    if (!fp) tsdc_fail("%s: cannot open (mode %s): %s [%s:%d]", path, mode, strerror(errno), file, line);
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (!p) tsdc_fail("out of memory allocating %zu bytes [%s:%d]", size, file, line);
    return p;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) tsdc_fail("out of memory allocating %zu x %zu bytes [%s:%d]", n, size, file, line);
    return p;
}
#define callocCheck(n, size) calloc_check(n, size, __FILE__, __LINE__)

/* read exactly n bytes or fail naming the file: a short read means a truncated file */
static inline void fread_exact(void* dst, size_t n, FILE* fp, const char* path) {
    if (n && fread(dst, 1, n, fp) != n) tsdc_fail("%s: truncated file (short read of %zu bytes)", path, n);
}
static inline void fwrite_exact(const void* src, size_t n, FILE* fp, const char* path) {
    if (n && fwrite(src, 1, n, fp) != n) tsdc_fail("%s: write failed: %s", path, strerror(errno));
}

static inline long long file_size_of(FILE* fp, const char* path) {
    if (fseeko(fp, 0, SEEK_END) != 0) tsdc_fail("%s: cannot seek", path);
    long long n = (long long)ftello(fp);
    if (fseeko(fp, 0, SEEK_SET) != 0) tsdc_fail("%s: cannot seek", path);
    return n;
}

#include <time.h>
/* CPU time of the process (all threads), seconds: step costs that a loaded machine does not inflate */
static inline double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static inline double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
