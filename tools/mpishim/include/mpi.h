/* efccl's MPI shim: exactly the part of MPI that nccl-tests 2.19 uses, nothing more, so that
 * `make MPI=1 MPI_HOME=<build>/mpishim` builds multi-process nccl-tests without an MPI
 * installation. Ranks are the processes started by efccl-mprun (they meet through its
 * rendezvous server, EFCCL_MPRUN_ADDR, then talk over TCP); without efccl-mprun a process is a
 * job of one rank. Any other MPI function is deliberately not declared: a program that needs
 * it fails to compile instead of calling a stub.
 *
 * Errors are fatal (MPI_ERRORS_ARE_FATAL): the process prints the reason on stderr and exits
 * with status 1. Every wait for a peer gives up after EFCCL_MPISHIM_TIMEOUT seconds (default
 * 300). Calls are MPI_THREAD_SINGLE: make them from one thread. */
#ifndef EFCCL_MPISHIM_MPI_H_
#define EFCCL_MPISHIM_MPI_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef int MPI_Comm;     /* a communicator handle */
typedef int MPI_Datatype; /* a datatype handle */
typedef int MPI_Op;       /* a reduction operator handle */

#define MPI_SUCCESS 0

/* Handles; 0 (a value-initialised handle) is never valid. */
#define MPI_COMM_NULL ((MPI_Comm)0x44000000)
#define MPI_COMM_WORLD ((MPI_Comm)0x44000001)

#define MPI_DATATYPE_NULL ((MPI_Datatype)0x4c000000)
#define MPI_BYTE ((MPI_Datatype)0x4c000001)
#define MPI_INT ((MPI_Datatype)0x4c000002)
#define MPI_LONG ((MPI_Datatype)0x4c000003)
#define MPI_LONG_LONG ((MPI_Datatype)0x4c000004)
#define MPI_INT64_T ((MPI_Datatype)0x4c000005)
#define MPI_DOUBLE ((MPI_Datatype)0x4c000006)

#define MPI_SUM ((MPI_Op)0x58000001)
#define MPI_MIN ((MPI_Op)0x58000002)
#define MPI_MAX ((MPI_Op)0x58000003)

/* As sendbuf: the contribution is already in recvbuf (MPI_Allreduce, MPI_Allgather, the root
 * of MPI_Gather). */
#define MPI_IN_PLACE ((void*)-1)

int MPI_Init(int* argc, char*** argv);
/* Collective over MPI_COMM_WORLD; no MPI call may follow. */
int MPI_Finalize(void);
/* Ends the whole job: efccl-mprun stops every rank; this process exits with errorcode (1 when
 * errorcode is not in 1..255). */
int MPI_Abort(MPI_Comm comm, int errorcode);

int MPI_Comm_rank(MPI_Comm comm, int* rank);
int MPI_Comm_size(MPI_Comm comm, int* size);
/* Ranks of one color (>= 0) form a communicator, ordered by key, then by rank in comm. */
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm);
/* Sets *comm to MPI_COMM_NULL. */
int MPI_Comm_free(MPI_Comm* comm);

int MPI_Barrier(MPI_Comm comm);
int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm);
int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
               int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm);
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm);
/* MPI_SUM, MPI_MIN, MPI_MAX on every datatype but MPI_BYTE; every rank gets the same result
 * (reduced in rank order). */
int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif /* EFCCL_MPISHIM_MPI_H_ */
