// Events recorded after eager interpreter launches, pooled per device.
#pragma once

#include <memory>

#include "cuda_raii.h"
#include "efccl/common/status.h"

namespace efccl::device {

/// Events recorded after eager launches, per device. One fused launch records one event that
/// every executor in it refers to (rather than one record per executor); an event is recorded
/// again only when no executor refers to it any more. Never freed (events outlive executors,
/// and the process's CUDA teardown would destroy them anyway).
class LaunchEvents {
 public:
  /// A free event of `device` (the current device), created when none is free.
  static StatusOr<std::shared_ptr<DeviceEvent>> acquire(int device);
};

}  // namespace efccl::device
