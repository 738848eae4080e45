#include "event_pool.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

namespace efccl::torch_backend {
namespace {

constexpr size_t kMaxFree = 256;  // events kept for reuse beyond this are destroyed

}  // namespace

std::shared_ptr<EventPool> EventPool::create(int device) {
  return std::shared_ptr<EventPool>(new EventPool(device));
}

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
}

std::shared_ptr<cudaEvent_t> EventPool::acquire() {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      event = free_.back();
      free_.pop_back();
    }
  }
  if (event == nullptr) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    TORCH_CHECK(e == cudaSuccess, "efccl: cudaEventCreateWithFlags on device ", device_, ": ",
                cudaGetErrorString(e));
  }
  std::shared_ptr<EventPool> self = shared_from_this();
  return std::shared_ptr<cudaEvent_t>(new cudaEvent_t(event), [self](cudaEvent_t* held) {
    self->give_back(*held);
    delete held;
  });
}

void EventPool::give_back(cudaEvent_t event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kMaxFree) {
      free_.push_back(event);
      return;
    }
  }
  (void)cudaEventDestroy(event);
}

}  // namespace efccl::torch_backend
