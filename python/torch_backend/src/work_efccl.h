// The Work an efccl process group returns: one enqueued efccl call (or group of calls) on a
// CUDA stream, finished when its end event has been reached. As ProcessGroupNCCL's: wait()
// orders the caller's current stream after the work (the CPU blocks only for a barrier, with a
// timeout, or in blocking-wait mode); errors found by the group's watchdog are rethrown.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "communicator.h"
#include "group_state.h"

namespace efccl::torch_backend {

class Watchdog;

/// An exception_ptr holding c10::DistBackendError(`message`) (torch.distributed.DistBackendError
/// in Python).
std::exception_ptr backend_error(const std::string& message);

class WorkEfccl : public c10d::Work {
 public:
  using Clock = std::chrono::steady_clock;

  /// `timeout`: how long the work may take before the watchdog fails the group. `captured`: it
  /// was recorded into a CUDA graph (it never runs as such; waiting orders the capture).
  WorkEfccl(std::shared_ptr<GroupState> group, std::weak_ptr<Communicator> comm,
            std::weak_ptr<Watchdog> watchdog, c10d::OpType type, const char* name, uint64_t seq,
            const at::Device& device, c10::cuda::CUDAStream stream,
            std::chrono::milliseconds timeout, bool captured, bool blocking_wait);
  ~WorkEfccl() override;

  /// Set after enqueueing: the event recorded on the work's stream after its last call.
  void set_end_event(std::shared_ptr<cudaEvent_t> event);
  /// Finished without an event (an empty coalescing block).
  void mark_finished();
  /// The work is a barrier: wait() blocks the CPU until it has finished.
  void set_barrier() { barrier_ = true; }
  /// Tensors returned by result() and the future, kept as long as the work.
  void set_outputs(std::vector<at::Tensor> outputs) { outputs_ = std::move(outputs); }
  /// Tensors kept until the watchdog sees the work finished (inputs, temporaries).
  void stash(const at::Tensor& t) { stash_.push_back(t); }

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }

  // For the watchdog.
  /// Whether the GPU has reached the end event (a captured work or one without event: true).
  /// The first time it has, efccl's asynchronous error is checked: a kernel that gave up also
  /// reaches the event, and must fail the work, not finish it.
  bool gpu_finished();
  /// Fails the work with `message` unless it failed already.
  void fail(const std::string& message);
  bool has_failed() const;
  void release_stash() { stash_.clear(); }
  Clock::time_point started() const { return started_; }
  Clock::time_point deadline() const { return started_ + timeout_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const char* name() const { return name_; }
  /// "allreduce #12 on process group 'NAME' (rank R of N)".
  std::string describe() const;
  bool captured() const { return captured_; }

 private:
  /// The caller's current stream on the work's device waits for the end event.
  void order_current_stream();
  /// After the end event was first reached: fails the work (and the group) on efccl's error.
  void check_async_error();

  const std::shared_ptr<GroupState> group_;
  const std::weak_ptr<Communicator> comm_;
  const std::weak_ptr<Watchdog> watchdog_;
  const char* const name_;
  const uint64_t seq_;
  const at::Device device_;
  const c10::cuda::CUDAStream stream_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point started_;
  const bool captured_;
  const bool blocking_wait_;
  bool barrier_ = false;
  std::shared_ptr<cudaEvent_t> end_event_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> stash_;
  std::exception_ptr error_;   ///< under Work::mutex_
  bool gpu_finished_ = false;  ///< under Work::mutex_: the end event was reached
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace efccl::torch_backend
