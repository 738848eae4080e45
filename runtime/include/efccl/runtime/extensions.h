/* efccl's C extensions beyond the NCCL ABI. libefccl.so exports them beside nccl* and pnccl*;
 * a program that may run on either library looks them up with dlsym (a real NCCL lacks them).
 * The PyTorch backend (python/torch_backend) uses them for efccl.torch.stats(). */
#pragma once

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One program selection: which program runs (or was skipped for) one collective call, or the
 * plan of a set of sends and receives (collective "p2p"). The strings live until the callback
 * returns. */
typedef struct {
  const char* collective; /* "allreduce", ..., or "p2p" */
  const char* program;    /* the program's name */
  const char* source;     /* "builtin", "runtime", or the user file's path */
  const char* reason;     /* why it was chosen, or why it was skipped */
  int skipped;            /* 1: a user program claimed the call but could not run it */
  unsigned long long count;
  int nranks;
} efcclSelection_t;

typedef void (*efcclSelectionCallback_t)(const efcclSelection_t* selection, void* user);

/* Calls `callback(selection, user)` for every selection of the process from now on, in the
 * thread whose call made it (the one that called the collective, or ncclGroupEnd), under the
 * communicator's lock: the callback must return quickly and call no efccl function. NULL
 * removes it. Returns ncclSuccess. */
ncclResult_t efcclSetSelectionCallback(efcclSelectionCallback_t callback, void* user);

#ifdef __cplusplus
}
#endif
