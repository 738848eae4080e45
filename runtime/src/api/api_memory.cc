// The NCCL ABI: memory allocation and buffer registration.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "api/entry_point.h"
#include "comm/buffer_registrations.h"
#include "comm/communicator.h"

using efccl::runtime::ApiStatus;
using efccl::runtime::run_entry_point;

EFCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return run_entry_point("ncclMemAlloc", [&] {
    if (ptr == nullptr) return ApiStatus::invalid_argument("ptr is NULL");
    *ptr = nullptr;
    if (size == 0) return ApiStatus::ok();
    if (cudaError_t e = cudaMalloc(ptr, size); e != cudaSuccess)
      return ApiStatus::cuda("cudaMalloc(" + std::to_string(size) + "): " + cudaGetErrorString(e));
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclMemAlloc)

EFCCL_API ncclResult_t ncclMemFree(void* ptr) {
  return run_entry_point("ncclMemFree", [&] {
    if (ptr == nullptr) return ApiStatus::ok();
    if (cudaError_t e = cudaFree(ptr); e != cudaSuccess)
      return ApiStatus::cuda(std::string("cudaFree: ") + cudaGetErrorString(e));
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclMemFree)

EFCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                        void** handle) {
  return run_entry_point("ncclCommRegister", [&] {
    if (handle == nullptr) return ApiStatus::invalid_argument("handle is NULL");
    *handle = nullptr;
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    return efccl::runtime::add_buffer_registration(comm, buff, size, false, handle);
  });
}
EFCCL_ALIAS(ncclCommRegister)

EFCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return run_entry_point("ncclCommDeregister", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    return efccl::runtime::remove_buffer_registration(comm, handle, false);
  });
}
EFCCL_ALIAS(ncclCommDeregister)

EFCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                              ncclWindow_t* win, int winFlags) {
  return run_entry_point("ncclCommWindowRegister", [&] {
    if (win == nullptr) return ApiStatus::invalid_argument("win is NULL");
    *win = nullptr;
    if ((winFlags & ~NCCL_WIN_COLL_SYMMETRIC) != 0)
      return ApiStatus::invalid_argument("invalid winFlags " + std::to_string(winFlags) +
                                         " (valid: NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC)");
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    void* h = nullptr;
    if (ApiStatus s = efccl::runtime::add_buffer_registration(comm, buff, size, true, &h); !s)
      return s;
    *win = static_cast<ncclWindow_t>(h);
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclCommWindowRegister)

EFCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return run_entry_point("ncclCommWindowDeregister", [&] {
    if (ApiStatus s = efccl::runtime::check_comm(comm); !s) return s;
    return efccl::runtime::remove_buffer_registration(comm, win, true);
  });
}
EFCCL_ALIAS(ncclCommWindowDeregister)
