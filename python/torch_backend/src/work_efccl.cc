#include "work_efccl.h"

#include <ATen/core/jit_type.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <thread>

#include "watchdog.h"

namespace efccl::torch_backend {
namespace {

/// How long a blocking wait without a timeout of its own outlasts the work's deadline (the
/// watchdog normally fails the work at the deadline; this bounds a wait whose watchdog stopped).
constexpr std::chrono::seconds kWaitGrace(10);

}  // namespace

std::exception_ptr backend_error(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

WorkEfccl::WorkEfccl(std::shared_ptr<GroupState> group, std::weak_ptr<Communicator> comm,
                     std::weak_ptr<Watchdog> watchdog, c10d::OpType type, const char* name,
                     uint64_t seq, const at::Device& device, c10::cuda::CUDAStream stream,
                     std::chrono::milliseconds timeout, bool captured, bool blocking_wait)
    : c10d::Work(group->identity().rank, type),
      group_(std::move(group)),
      comm_(std::move(comm)),
      watchdog_(std::move(watchdog)),
      name_(name),
      seq_(seq),
      device_(device),
      stream_(stream),
      timeout_(timeout),
      started_(Clock::now()),
      captured_(captured),
      blocking_wait_(blocking_wait) {}

WorkEfccl::~WorkEfccl() = default;

void WorkEfccl::set_end_event(std::shared_ptr<cudaEvent_t> event) {
  std::lock_guard<std::mutex> lock(mutex_);
  end_event_ = std::move(event);
}

void WorkEfccl::mark_finished() {
  std::lock_guard<std::mutex> lock(mutex_);
  gpu_finished_ = true;
}

bool WorkEfccl::gpu_finished() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (gpu_finished_ || captured_) return true;
    if (!end_event_) return false;  // a coalesced block that has not ended yet
    const cudaError_t e = cudaEventQuery(*end_event_);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (!error_)
        error_ = backend_error("efccl " + describe() +
                               ": cudaEventQuery of its end event: " + cudaGetErrorString(e));
      return true;
    }
    gpu_finished_ = true;
  }
  check_async_error();  // outside the lock: failing the group visits every work
  return true;
}

void WorkEfccl::check_async_error() {
  if (group_->failed()) {
    // Finished before the failure was noticed: it may have run on an aborted communicator.
    if (std::shared_ptr<Communicator> c = comm_.lock(); c && c->revoked())
      fail("efccl " + describe() + ": " + group_->failure());
    return;
  }
  std::shared_ptr<Communicator> comm = comm_.lock();
  if (!comm) return;
  const std::string efccl_error = comm->async_error();
  if (efccl_error.empty()) return;
  if (std::shared_ptr<Watchdog> w = watchdog_.lock())
    fail(w->fail_for(*this, efccl_error));
  else
    fail("efccl " + describe() + " failed: " + efccl_error);
}

void WorkEfccl::fail(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = backend_error(message);
}

bool WorkEfccl::has_failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<bool>(error_);
}

bool WorkEfccl::isCompleted() { return has_failed() || gpu_finished(); }

bool WorkEfccl::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !error_;
}

std::exception_ptr WorkEfccl::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

std::vector<at::Tensor> WorkEfccl::result() { return outputs_; }

std::string WorkEfccl::describe() const {
  return std::string(name_) + " #" + std::to_string(seq_) + " on " + group_->identity().describe();
}

void WorkEfccl::order_current_stream() {
  std::shared_ptr<cudaEvent_t> event;
  bool finished = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    event = end_event_;
    finished = gpu_finished_;
  }
  if (!event) {
    TORCH_CHECK(finished, "efccl ", describe(),
                ": wait() on a call of a coalescing block before the block ended");
    return;
  }
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
  if (current == stream_) return;
  c10::cuda::CUDAGuard guard(device_);
  const cudaError_t e = cudaStreamWaitEvent(current.stream(), *event, 0);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    C10_THROW_ERROR(DistBackendError,
                    "efccl " + describe() + ": cudaStreamWaitEvent: " + cudaGetErrorString(e));
  }
}

void WorkEfccl::synchronize() {
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
  order_current_stream();
}

bool WorkEfccl::wait(std::chrono::milliseconds timeout) {
  if (!captured_ && (barrier_ || blocking_wait_ || timeout != kNoTimeout)) {
    const bool own_timeout = timeout != kNoTimeout;
    const Clock::time_point limit = own_timeout ? Clock::now() + timeout : deadline() + kWaitGrace;
    auto pause = std::chrono::microseconds(2);
    while (!isCompleted()) {
      if (Clock::now() >= limit) {
        if (own_timeout)
          C10_THROW_ERROR(DistBackendError, "efccl " + describe() + ": Work.wait(timeout=" +
                                                std::to_string(timeout.count()) +
                                                " ms) passed before the work finished");
        fail("efccl " + describe() + " did not finish within " + std::to_string(timeout_.count()) +
             " ms (the group's timeout)");
        break;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
  order_current_stream();
  return true;
}

void WorkEfccl::abort() {
  const std::string reason = "aborted by Work.abort() of " + describe();
  fail("efccl " + reason);
  group_->fail(reason);
  if (std::shared_ptr<Communicator> c = comm_.lock()) c->revoke();
}

c10::intrusive_ptr<c10::ivalue::Future> WorkEfccl::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device_});
    if (std::exception_ptr e = exception()) {
      future_->setError(e);
    } else {
      // CUDA futures record their completion on the current streams: the work's stream, after
      // the work (DDP's communication hooks chain on this).
      c10::cuda::CUDAStreamGuard guard(stream_);
      future_->markCompleted(c10::IValue(outputs_));
    }
  }
  return future_;
}

}  // namespace efccl::torch_backend
