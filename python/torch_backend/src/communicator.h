// One efccl communicator of a process group: its handle, its device and the internal stream
// its asynchronous work runs on; created through the group's store (init) or from a parent
// communicator (ncclCommSplit), revoked and destroyed safely while other threads use it.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "group_state.h"

namespace efccl::torch_backend {

/// What a group's communicator is created with.
struct CommunicatorSettings {
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};  ///< the group's timeout
  std::vector<std::string> algorithm_files;  ///< EF JSON / MSCCL XML programs for this group
  bool high_priority_stream = false;
};

/// Waits until every rank of `group` has set its key under `prefix` in `store`, at most
/// `timeout`; throws c10::DistBackendError naming the ranks that did not arrive and `what`.
void await_all_ranks(c10d::Store& store, const std::string& prefix, const GroupIdentity& group,
                     std::chrono::milliseconds timeout, const std::string& what);

class Communicator {
 public:
  /// A communicator of `group`'s ranks on `device`: every rank arrives through `store` (the ranks
  /// missing when `settings.timeout` passes are named), rank 0 publishes efccl's unique id there,
  /// and every rank joins with ncclCommInitRankConfig. `prefix` keeps the keys of successive
  /// creations apart. Throws c10::DistBackendError with efccl's message.
  static std::shared_ptr<Communicator> create(c10d::Store& store, const std::string& prefix,
                                              const GroupIdentity& group, const at::Device& device,
                                              const CommunicatorSettings& settings);

  Communicator(ncclComm_t comm, const at::Device& device, c10::cuda::CUDAStream stream,
               std::string origin);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// ncclCommSplit of this communicator, which every one of its ranks calls in the same order
  /// (`color` NCCL_SPLIT_NOCOLOR: this rank joins no new communicator; returns null). Every rank
  /// first arrives through `store` (this communicator's group's store; `prefix` unique per split),
  /// so a rank that never calls is named when `settings.timeout` passes.
  std::shared_ptr<Communicator> split(c10d::Store& store, const std::string& prefix,
                                      const GroupIdentity& group, int color, int key,
                                      const CommunicatorSettings& settings);

  ncclComm_t handle() const { return comm_; }
  const at::Device& device() const { return device_; }
  c10::cuda::CUDAStream stream() const { return stream_; }
  /// "init" or "split from ..." (for stats).
  const std::string& origin() const { return origin_; }
  /// Held around every efccl call on this communicator (destroy waits for them).
  std::mutex& call_mutex() { return call_mutex_; }

  /// efccl's asynchronous error ("" when none).
  std::string async_error();
  /// Makes the communicator's kernels and waiting calls give up (ncclCommRevoke); later calls
  /// fail. Safe while another thread is inside a call on it.
  void revoke();
  /// ncclCommDestroy (or ncclCommAbort when `abort` or revoked), once; waits for calls in
  /// progress on it to return.
  void destroy(bool abort);
  bool destroyed() const { return destroyed_.load(); }
  bool revoked() const { return revoked_.load(); }

 private:
  ncclComm_t comm_;
  const at::Device device_;
  c10::cuda::CUDAStream stream_;
  const std::string origin_;
  std::mutex call_mutex_;
  std::mutex state_mutex_;  ///< destroy against revoke and async_error
  std::atomic<bool> revoked_{false};
  std::atomic<bool> destroyed_{false};
};

/// The EFCCL_* values a communicator of these settings is created under (EnvironmentOverride):
/// the group's programs after the process's own, and the group's timeout where the process
/// sets none; `init_budget` bounds efccl's rendezvous.
std::vector<std::pair<std::string, std::string>> creation_environment(
    const CommunicatorSettings& settings, std::chrono::milliseconds init_budget);

}  // namespace efccl::torch_backend
