// ProcessGroupEfccl: torch.distributed's backend "efccl" (a c10d::Backend for CUDA tensors),
// every collective and point-to-point operation on one efccl communicator per group.
//
// Semantics follow ProcessGroupNCCL: an asynchronous call runs on the communicator's internal
// stream, ordered after the caller's current stream (an event), its tensors recorded on that
// stream for the caching allocator and held by the work; a synchronous call (async_op=False)
// runs on the caller's current stream. Works finish when their end event is reached; the
// watchdog fails the group on efccl's errors and at the group's timeout. Calls made while a CUDA
// graph is captured are captured (the communicator must exist before the capture).
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "communicator.h"
#include "event_pool.h"
#include "group_state.h"
#include "watchdog.h"
#include "work_efccl.h"

namespace efccl::torch_backend {

/// Options of an efccl group (efccl.torch.Options; torch passes it as pg_options).
struct EfcclOptions : c10d::Backend::Options {
  EfcclOptions() : c10d::Backend::Options("efccl") {}
  EfcclOptions(const EfcclOptions&) = default;

  bool high_priority_stream = false;
  /// Work.wait() blocks the CPU until the work finished (or the timeout passes).
  bool blocking_wait = false;
  /// EF JSON / MSCCL XML programs this group's communicator loads (besides EFCCL_ALGO_DIR /
  /// EFCCL_ALGO_FILES), each used for the collective it implements.
  std::vector<std::string> algorithm_files;

  c10::intrusive_ptr<EfcclOptions> copy() const { return c10::make_intrusive<EfcclOptions>(*this); }
};

/// One call as run() enqueues it.
struct CallSpec {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  const char* name = "";
  at::Device device{at::kCUDA};
  std::chrono::milliseconds timeout{c10d::kUnsetTimeout};  ///< kUnsetTimeout: the group's
  bool async_op = true;
  bool barrier = false;
  uint64_t bytes = 0;               ///< this rank's payload, for the statistics
  std::vector<at::Tensor> inputs;   ///< recorded on the call's stream, held until it finished
  std::vector<at::Tensor> outputs;  ///< likewise; also the work's result()
};

/// What an enqueue step returns: the first efccl function that failed, if any.
struct EfcclResult {
  ncclResult_t result = ncclSuccess;
  const char* function = "";
};

class ProcessGroupEfccl : public c10d::Backend {
 public:
  /// A group whose communicator is created on first use (or by eagerConnectSingleDevice)
  /// through `store`; with `split_from`, split from that group's communicator at once instead
  /// (new_group under a default group bound to a device: torch makes the other ranks of
  /// `split_from` call perform_nocolor_split meanwhile).
  ProcessGroupEfccl(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                    std::vector<int64_t> global_ranks, std::string group_name,
                    c10::intrusive_ptr<EfcclOptions> options,
                    c10::intrusive_ptr<ProcessGroupEfccl> split_from = {});
  /// A group around `comm` (split() made it).
  ProcessGroupEfccl(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                    std::vector<int64_t> global_ranks, std::string group_name,
                    c10::intrusive_ptr<EfcclOptions> options, std::shared_ptr<Communicator> comm);
  ~ProcessGroupEfccl() override;

  const std::string getBackendName() const override { return "efccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  c10::intrusive_ptr<EfcclOptions> options_copy() const;
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override {}  // every rank counts from 0 alike
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void eagerConnectSingleDevice(at::Device device) override;
  /// This rank's part of a split that it does not join (torch calls it on the default group's
  /// backend for the ranks outside a new group).
  void performNocolorSplit(at::Device device);
  /// Splits this group's communicator has taken part in.
  uint64_t commSplitCount() const { return split_count_.load(); }
  /// A split of this group's communicator (every rank of this group calls it, in the same
  /// order); null for NCCL_SPLIT_NOCOLOR.
  std::shared_ptr<Communicator> split_communicator(int color, int key,
                                                   const CommunicatorSettings& settings,
                                                   std::optional<at::Device> device);

  void shutdown() override;
  void abort() override;
  c10d::ErrorType getError() override;

  /// Whether the communicator exists.
  bool isInitialized() const { return comm_ptr_.load() != nullptr; }
  /// efccl.torch.stats(): the group's statistics as JSON text.
  std::string stats_json() const;
  const std::shared_ptr<GroupState>& state() const { return state_; }

 private:
  /// The communicator on `device`, created on first use; throws when it cannot be (and then
  /// fails the group: every rank must create it at the same call).
  Communicator& communicator(const at::Device& device);
  void adopt(std::shared_ptr<Communicator> comm);
  CommunicatorSettings settings_of(const EfcclOptions& options) const;
  /// The device a call without tensors (barrier, split) uses.
  at::Device default_device(std::optional<at::Device> hint) const;
  std::chrono::milliseconds timeout_of(std::chrono::milliseconds requested) const;

  /// Enqueues `spec` through `enqueue(comm, stream)` (which may also run torch operations:
  /// the call's stream is current meanwhile) and returns its work.
  c10::intrusive_ptr<c10d::Work> run(
      CallSpec& spec, c10::function_ref<EfcclResult(ncclComm_t, cudaStream_t)> enqueue);
  /// Throws the failure of an efccl call of `spec` (the group fails too, unless efccl only
  /// refused the arguments).
  [[noreturn]] void call_failed(const CallSpec& spec, uint64_t seq, const EfcclResult& r,
                                std::chrono::nanoseconds elapsed,
                                std::chrono::milliseconds timeout);
  /// Records `tensors` on `stream` for the caching allocator.
  static void record_on(const std::vector<at::Tensor>& tensors, c10::cuda::CUDAStream stream);
  /// `later` waits for what `earlier` has enqueued so far (an event).
  void order_after(c10::cuda::CUDAStream earlier, c10::cuda::CUDAStream later);
  void terminate(bool abort, const std::string& why);

  // Shared bodies of the list and coalesced forms.
  c10::intrusive_ptr<c10d::Work> allreduce_many(std::vector<at::Tensor>& tensors,
                                                const c10d::ReduceOp& op,
                                                std::chrono::milliseconds timeout, bool async_op,
                                                c10d::OpType type, const char* name);

  const c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<EfcclOptions> options_;
  const std::shared_ptr<GroupState> state_;
  std::shared_ptr<Watchdog> watchdog_;  ///< works hold it weakly

  mutable std::mutex comm_mutex_;
  std::shared_ptr<Communicator> comm_;
  std::atomic<Communicator*> comm_ptr_{nullptr};  ///< comm_ once set: the lock-free fast path
  std::shared_ptr<EventPool> events_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> split_count_{0};

  /// Between startCoalescing and endCoalescing (the calling thread's efccl group is open once
  /// the first call arrived).
  struct Coalescing {
    bool active = false;
    bool group_open = false;
    Communicator* comm = nullptr;
    std::optional<c10::cuda::CUDAStream> stream;
    c10::intrusive_ptr<WorkEfccl> work;
    std::vector<at::Tensor> inputs, outputs;
  } coalescing_;

  std::mutex lifecycle_mutex_;
  bool terminated_ = false;
};

}  // namespace efccl::torch_backend
