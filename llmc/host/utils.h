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
#include <unistd.h>

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

/* Checked output. Nothing the trainer writes may be lost or cut short without a word: every write,
 * flush, fsync and close is checked, and a failure (a full disk: ENOSPC; a quota; an I/O error) is one
 * line naming the file and the system's reason, and exit 1.
 *
 * OutFile: a whole file (checkpoint, predictions, calibration, profile) written atomically. It goes to
 * PATH.tmp, is flushed, fsynced and closed, then renamed over PATH: PATH is always either the previous
 * complete file or the new complete one. On any failure the partial PATH.tmp is removed before the
 * error, so a full disk is not left fuller and no half file lies beside the good one.
 *
 * StreamFile: an append-as-you-go file (the JSONL run log, the fault log, the propagation trace): each
 * record is written and flushed at once, so a crash loses at most the record being written; a failed
 * write or flush stops the run (a log cut mid-record is the failure this prevents from passing silently). */
typedef struct { FILE* fp; char path[2048], tmp[2080]; } OutFile;

static void outfile_fail(OutFile* f, const char* what) {
    int e = errno;
    if (f->fp) { fclose(f->fp); f->fp = NULL; }
    unlink(f->tmp);
    tsdc_fail("%s: %s: %s (the partial %s was removed)", f->path, what, strerror(e ? e : EIO), f->tmp);
}
static void outfile_open(OutFile* f, const char* path) {
    snprintf(f->path, sizeof(f->path), "%s", path);
    snprintf(f->tmp, sizeof(f->tmp), "%s.tmp", path);
    f->fp = fopen(f->tmp, "wb");
    if (!f->fp) tsdc_fail("%s: cannot create %s: %s", path, f->tmp, strerror(errno));
}
static void outfile_write(OutFile* f, const void* src, size_t n) {
    errno = 0;
    if (n && fwrite(src, 1, n, f->fp) != n) outfile_fail(f, "write failed");
}
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void outfile_printf(OutFile* f, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    int r = vfprintf(f->fp, fmt, ap);
    va_end(ap);
    if (r < 0) outfile_fail(f, "write failed");
}
/* flush, fsync, close, rename over the path: the file is complete and durable when this returns */
static void outfile_commit(OutFile* f) {
    errno = 0;
    if (fflush(f->fp) != 0 || ferror(f->fp)) outfile_fail(f, "write failed");
    if (fsync(fileno(f->fp)) != 0) outfile_fail(f, "fsync failed");
    FILE* fp = f->fp;
    f->fp = NULL;
    if (fclose(fp) != 0) outfile_fail(f, "close failed");
    if (rename(f->tmp, f->path) != 0) outfile_fail(f, "cannot rename the .tmp over it");
}

typedef struct { FILE* fp; char path[2048]; } StreamFile;

static void streamfile_open(StreamFile* f, const char* path, int append, const char* what) {
    snprintf(f->path, sizeof(f->path), "%s", path);
    f->fp = fopen(path, append ? "a" : "w");
    if (!f->fp) tsdc_fail("%s: cannot open %s for writing: %s", path, what, strerror(errno));
}
static void streamfile_check(StreamFile* f, int r) {
    if (r < 0 || fflush(f->fp) != 0 || ferror(f->fp)) {
        int e = errno ? errno : EIO;
        tsdc_fail("%s: write failed: %s (the run stops: its record would be lost)", f->path, strerror(e));
    }
}
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
/* one record: written and flushed, or the run stops with the file named */
static void streamfile_printf(StreamFile* f, const char* fmt, ...) {
    if (!f->fp) return;
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    int r = vfprintf(f->fp, fmt, ap);
    va_end(ap);
    streamfile_check(f, r);
}
static void streamfile_vline(StreamFile* f, const char* fmt, va_list ap) {
    if (!f->fp) return;
    errno = 0;
    int r = vfprintf(f->fp, fmt, ap);
    if (r >= 0 && fputc('\n', f->fp) == EOF) r = -1;
    streamfile_check(f, r);
}
/* flushed, fsynced (durable) and closed, each checked */
static void streamfile_close(StreamFile* f) {
    if (!f->fp) return;
    FILE* fp = f->fp;
    f->fp = NULL;
    errno = 0;
    if (fflush(fp) != 0 || ferror(fp) || (fsync(fileno(fp)) != 0 && errno != EINVAL && errno != EROFS) || fclose(fp) != 0)
        tsdc_fail("%s: write failed at close: %s", f->path, strerror(errno ? errno : EIO));
}

/* open an input file for reading, which must be a regular file: a directory opens under Linux but
 * reads as an error (and its size as 2^63), so it is refused here in one line */
#include <sys/stat.h>
static inline FILE* fopen_regular(const char* path, const char* what) {
    struct stat st;
    if (stat(path, &st) != 0) tsdc_fail("%s: cannot open %s: %s", path, what, strerror(errno));
    if (S_ISDIR(st.st_mode)) tsdc_fail("%s: is a directory, not a %s file", path, what);
    if (!S_ISREG(st.st_mode)) tsdc_fail("%s: not a regular file (a %s must be a file)", path, what);
    FILE* fp = fopen(path, "rb");
    if (!fp) tsdc_fail("%s: cannot open %s: %s", path, what, strerror(errno));
    return fp;
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
