// The efccl functions the backend calls, resolved from one libefccl.so opened with RTLD_LOCAL.
//
// torch has already loaded its own NCCL (libnccl.so.2), which exports the same nccl* names as
// libefccl.so. Linking against either, or resolving names globally, could bind the backend's
// calls to torch's NCCL. Instead the backend dlopens libefccl.so privately (RTLD_LOCAL: its
// symbols join no global scope, so nothing of torch's binds to it either) and takes every
// function from that handle with dlsym; load() then checks that the functions really live in
// an efccl library (its ELF note), not in an NCCL found under the same name.
#pragma once

#include <nccl.h>

#include <string>

#include "efccl/runtime/extensions.h"

namespace efccl::torch_backend {

/// The table of efccl entry points; every pointer is set once load() succeeded, except the
/// optional extensions (null when the library predates them).
struct EfcclLibrary {
  std::string path;  ///< the file opened
  int version = 0;   ///< ncclGetVersion of the library
  void* handle = nullptr;

  ncclResult_t (*GetVersion)(int*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommRevoke)(ncclComm_t, int) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*AlltoAll)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                           cudaStream_t) = nullptr;
  ncclResult_t (*Gather)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*Scatter)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                          cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t,
                                       ncclComm_t) = nullptr;
  ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t) = nullptr;

  /// efccl extension (optional): every program selection of the process, in the calling thread.
  ncclResult_t (*SetSelectionCallback)(efcclSelectionCallback_t, void*) = nullptr;
};

/// Opens `path` privately and resolves the table; throws std::runtime_error naming the file and
/// what is wrong (not found, not an efccl library, a missing function). Loading again with the
/// same path returns the same table; another path after a successful load is an error.
const EfcclLibrary& load_efccl_library(const std::string& path);

/// The loaded table; throws when load_efccl_library has not succeeded yet.
const EfcclLibrary& efccl_library();

/// Whether load_efccl_library has succeeded.
bool efccl_library_loaded();

/// "<function> failed: <efccl's result string>: <efccl's last error>" for a failed call.
std::string describe_failure(const char* function, ncclResult_t result);

}  // namespace efccl::torch_backend
