/* nccl_emu.cpp: NCCL for the CUDA emulation (dev/cuda_emu/include/nccl.h).
 *
 * Built with -DUSE_MPI: a communicator of n ranks is MPI_COMM_WORLD (duplicated) and must have n
 * processes with the same rank numbering (as train_sdc sets it up: one process per GPU under mpirun);
 * ncclCommInitRank checks that every rank got the same unique id (a missing broadcast is an error, as
 * it would hang NCCL). ncclAllReduce and ncclBroadcast are the MPI collectives on the buffers (device
 * memory is host memory in the emulation), in place when send == recv. fp32 sums of two ranks are
 * exact-order independent (a + b == b + a); with more ranks MPI's order is fixed for a given size.
 * Without MPI: one rank, and the collectives are copies.
 * Every buffer must be device memory (inside a live cudaMalloc buffer, the whole range): otherwise
 * ncclInvalidArgument and a message naming the call, as NCCL would fail on a host pointer. Streams are
 * synchronous (the emulated runtime runs everything at once). bf16/fp16 reductions are not emulated
 * (ncclInvalidArgument): train_sdc reduces fp32 gradients. EMU_COST_ONLY=1: ncclAllReduce checks its
 * arguments and returns without reducing (emu_runtime.cpp's cost-only mode). */
#include <nccl.h>
#include <cuda_emu.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

struct ncclComm {
    int nranks, rank;
#ifdef USE_MPI
    MPI_Comm mpi;
#endif
};

static ncclResult_t nccl_error(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t nccl_error(ncclResult_t r, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "cuda_emu nccl: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    va_end(ap);
    return r;
}

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

extern "C" {

ncclResult_t ncclGetVersion(int* v) {
    if (!v) return ncclInvalidArgument;
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return nccl_error(ncclInvalidArgument, "ncclGetUniqueId: null id");
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "cuda_emu-nccl pid %d", (int)getpid());
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return nccl_error(ncclInvalidArgument, "ncclCommInitRank: null comm");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return nccl_error(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
    if (strncmp(id.internal, "cuda_emu-nccl", 13) != 0)
        return nccl_error(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
    ncclComm* c = (ncclComm*)calloc(1, sizeof(ncclComm));
    c->nranks = nranks;
    c->rank = rank;
#ifdef USE_MPI
    int inited = 0, size = 1, me = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (nranks != 1) { free(c); return nccl_error(ncclInvalidUsage, "ncclCommInitRank: %d ranks need MPI, which is not initialised", nranks); }
        c->mpi = MPI_COMM_SELF;
    } else {
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if (size != nranks || me != rank) {
            free(c);
            return nccl_error(ncclInvalidUsage, "ncclCommInitRank: rank %d of %d, but this is MPI rank %d of %d (the emulation maps NCCL ranks to MPI_COMM_WORLD)",
                              rank, nranks, me, size);
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
        /* every rank must hold rank 0's id */
        ncclUniqueId root = id;
        MPI_Bcast(&root, sizeof(root), MPI_BYTE, 0, c->mpi);
        int same = memcmp(&root, &id, sizeof(id)) == 0, all = 0;
        MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, c->mpi);
        if (!all) {
            MPI_Comm_free(&c->mpi);
            free(c);
            return nccl_error(ncclInvalidUsage, "ncclCommInitRank: the ranks hold different unique ids (rank 0's id was not broadcast); NCCL would hang");
        }
    }
#else
    if (nranks != 1) { free(c); return nccl_error(ncclInvalidUsage, "ncclCommInitRank: %d ranks, but the emulation was built without MPI (one rank)", nranks); }
#endif
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
#ifdef USE_MPI
    if (c->mpi != MPI_COMM_SELF) MPI_Comm_free(&c->mpi);
#endif
    free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t c, int* n) { if (!c || !n) return ncclInvalidArgument; *n = c->nranks; return ncclSuccess; }
ncclResult_t ncclCommUserRank(const ncclComm_t c, int* r) { if (!c || !r) return ncclInvalidArgument; *r = c->rank; return ncclSuccess; }

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}
const char* ncclGetLastError(ncclComm_t) { return ""; }

static ncclResult_t check_buffers(const char* api, const void* send, void* recv, size_t bytes) {
    if (!emu_is_device_range(send, bytes))
        return nccl_error(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not inside a device buffer", api, send, bytes);
    if (!emu_is_device_range(recv, bytes))
        return nccl_error(ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not inside a device buffer", api, recv, bytes);
    return ncclSuccess;
}

#ifdef USE_MPI
static MPI_Datatype mpi_type(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}
#endif

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
    if (!c) return nccl_error(ncclInvalidArgument, "ncclAllReduce: null communicator");
    const size_t es = type_size(dt);
    if (!es) return nccl_error(ncclInvalidArgument, "ncclAllReduce: data type %d", (int)dt);
    if (dt == ncclFloat16 || dt == ncclBfloat16) return nccl_error(ncclInvalidArgument, "ncclAllReduce: fp16/bf16 reductions are not emulated");
    if (count == 0) return ncclSuccess;
    ncclResult_t r = check_buffers("ncclAllReduce", send, recv, count * es);
    if (r != ncclSuccess) return r;
    emu_note_launch("ncclAllReduce");
    if (emu_cost_only()) return ncclSuccess;   /* checked, not carried out (EMU_COST_ONLY) */
#ifdef USE_MPI
    if (c->mpi != MPI_COMM_SELF && c->nranks > 1) {
        if (count > 2147483647u) return nccl_error(ncclInvalidArgument, "ncclAllReduce: count %zu too large for the MPI emulation", count);
        MPI_Op mop = op == ncclSum || op == ncclAvg ? MPI_SUM : op == ncclProd ? MPI_PROD : op == ncclMax ? MPI_MAX : MPI_MIN;
        int e = MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mpi_type(dt), mop, c->mpi);
        if (e != MPI_SUCCESS) return nccl_error(ncclSystemError, "ncclAllReduce: MPI_Allreduce failed (%d)", e);
        if (op == ncclAvg) {
            if (dt == ncclFloat32) for (size_t i = 0; i < count; i++) ((float*)recv)[i] /= (float)c->nranks;
            else if (dt == ncclFloat64) for (size_t i = 0; i < count; i++) ((double*)recv)[i] /= (double)c->nranks;
            else return nccl_error(ncclInvalidArgument, "ncclAllReduce: ncclAvg on an integer type");
        }
        return ncclSuccess;
    }
#endif
    (void)op;
    if (send != recv) memmove(recv, send, count * es);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t dt, int root, ncclComm_t c, cudaStream_t) {
    if (!c) return nccl_error(ncclInvalidArgument, "ncclBroadcast: null communicator");
    const size_t es = type_size(dt);
    if (!es) return nccl_error(ncclInvalidArgument, "ncclBroadcast: data type %d", (int)dt);
    if (root < 0 || root >= c->nranks) return nccl_error(ncclInvalidArgument, "ncclBroadcast: root %d of %d ranks", root, c->nranks);
    if (count == 0) return ncclSuccess;
    ncclResult_t r = check_buffers("ncclBroadcast", c->rank == root ? send : recv, recv, count * es);
    if (r != ncclSuccess) return r;
    if (c->rank == root && send != recv) memmove(recv, send, count * es);
#ifdef USE_MPI
    if (c->mpi != MPI_COMM_SELF && c->nranks > 1) MPI_Bcast(recv, (int)(count * es), MPI_BYTE, root, c->mpi);
#endif
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

}  // extern "C"
