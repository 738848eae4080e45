// Restores the calling thread's current CUDA device on scope exit: NCCL calls leave it as the
// caller set it, whatever devices the call itself had to visit.
#pragma once

#include <cuda_runtime_api.h>

namespace efccl::runtime {

class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
  }
  ~DeviceGuard() {
    int current = -1;
    // cudaGetDevice is a thread-local read; cudaSetDevice makes a context current: skip it
    // when nothing changed (every call of a group passes here).
    if (saved_ >= 0 && (cudaGetDevice(&current) != cudaSuccess || current != saved_))
      cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

}  // namespace efccl::runtime
