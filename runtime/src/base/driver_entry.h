// A CUDA driver function reached through the runtime (cudaGetDriverEntryPointByVersion), so that
// the runtime does not link libcuda: stream memory operations, address ranges.
#pragma once

#include <cuda_runtime_api.h>

namespace efccl::runtime {

/// The driver's function `name` with its CUDA 12.0 signature, or null when the driver has none.
inline void* driver_entry(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return entry;
}

}  // namespace efccl::runtime
