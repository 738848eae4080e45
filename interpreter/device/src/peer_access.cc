// Peer access, once per (from, to) pair and process.
#include "peer_access.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "cuda_raii.h"
#include "cuda_status.h"

namespace efccl::device {

Status enable_peer_access(int from, int to) {
  static std::mutex mutex;
  static std::set<std::pair<int, int>> enabled;
  std::lock_guard<std::mutex> lock(mutex);
  if (enabled.count({from, to})) return Status::ok();
  DeviceScope scope(from);
  const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // enabled outside efccl; clear the non-sticky error
  } else if (e != cudaSuccess) {
    return cuda_error(
        "cudaDeviceEnablePeerAccess(" + std::to_string(from) + " -> " + std::to_string(to) + ")",
        e);
  }
  enabled.insert({from, to});
  return Status::ok();
}

}  // namespace efccl::device
