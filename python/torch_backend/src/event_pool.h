// CUDA events (timing disabled) reused across calls: creating and destroying one per
// collective would cost more than the rest of the host path. A pooled event goes back to its
// pool when its holder (a work, or a call in progress) drops it; the pool lives as long as any
// of its events, so works may outlive their process group.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

namespace efccl::torch_backend {

class EventPool : public std::enable_shared_from_this<EventPool> {
 public:
  /// A pool of events of device `device`.
  static std::shared_ptr<EventPool> create(int device);
  ~EventPool();

  /// An event, recorded or not; returns to the pool when the last holder drops it. Throws when
  /// CUDA cannot create one.
  std::shared_ptr<cudaEvent_t> acquire();

  int device() const { return device_; }

 private:
  explicit EventPool(int device) : device_(device) {}
  void give_back(cudaEvent_t event);

  const int device_;
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
};

}  // namespace efccl::torch_backend
