// CUDA runtime errors as efccl::Status, naming the call that failed.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "efccl/common/status.h"

namespace efccl::device {

/// `what`: the call and its context, e.g. "cudaMalloc(4096 bytes) on device 1".
inline Status cuda_error(const std::string& what, cudaError_t e) {
  return Status::error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace efccl::device

/// Returns cuda_error(what, e) from the enclosing function when `call` fails.
#define EFCCL_CUDA_RETURN(call, what)                                                \
  do {                                                                               \
    const cudaError_t efccl_e = (call);                                              \
    if (efccl_e != cudaSuccess) return ::efccl::device::cuda_error((what), efccl_e); \
  } while (0)
