// DeviceExecutor's state (private to the executor's sources): per device, the uploaded tables,
// the executor-owned memory and what orders its launches; per executor, the program, the
// connections and the host-mapped stop signals and error records.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "connection_arena.h"
#include "connection_layout.h"
#include "cross_process.h"
#include "cuda_raii.h"
#include "efccl/device/device_executor.h"
#include "efccl/ef/premul_analysis.h"
#include "fused_overlap.h"
#include "kernel_params.h"

namespace efccl::device {

/// Everything one device of the executor owns.
struct LocalDevice {
  int device = 0;
  int sm_count = 0;
  std::vector<int> ranks;  ///< global ranks served by this device's launch, ascending
  uint32_t nblocks = 0;
  /// The threadblocks of every rank of the program on this device's GPU: this launch's and,
  /// where ranks of other processes share the GPU (PeerProcesses::gpus), theirs, whose
  /// launches must be co-resident with this one (their CTAs wait on each other's). >= nblocks.
  uint32_t gpu_nblocks = 0;
  DeviceBuffer threadblocks, ops, deps, operands, flags, sends, recvs, state, epochs;
  DeviceBuffer divide_segments;  ///< integer avg's result regions (DivideSegment)
  uint32_t ndivide_segments = 0;
  int64_t largest_divide_chunks = 0;
  std::size_t direct_ops[2] = {};  ///< ops with direct transfers: out of place, in place
  bool multi_ops = false;  ///< the program has mrc ops (they write other ranks' buffers)
  /// Direct transfers between processes: the launches of other processes on this GPU that
  /// this one meets (cross_process.h).
  XprocPlan xproc;
  /// Chosen CTA size per (dtype, reduction): 0 = not yet chosen, -1 = cannot be co-resident.
  int threads[ef::kNumDataTypes][4] = {};
  int max_blocks_seen[ef::kNumDataTypes][4] = {};
  /// Executor-owned memory per local rank (scratch, buffers the API does not provide).
  std::vector<DeviceBuffer> private_memory;
  std::vector<DeviceBuffer> retired;  ///< kept alive for graphs captured before a growth
  /// The previous (uncaptured) launch on this device and its stream: a launch on another
  /// stream waits for it, because two launches of one executor share FIFOs, flags and epoch.
  std::shared_ptr<DeviceEvent> last_launch;  ///< from LaunchEvents; set with launched_before
  cudaStream_t last_stream = nullptr;
  bool launched_before = false;
  /// The same for captured launches, per capture: a launch captured on another stream of the
  /// same capture waits for the previous one (an edge in the graph), as NCCL serializes a
  /// communicator's work within a graph. Launches of different captures are ordered by
  /// whoever replays the graphs.
  DeviceEvent last_captured_launch;
  cudaStream_t last_captured_stream = nullptr;
  unsigned long long last_capture_id = 0;
  bool captured_before = false;
};

/// One device's launch of one prepared call.
struct PreparedPart {
  std::size_t device_index = 0;  ///< into Impl::locals
  cudaStream_t stream = nullptr;
  bool eager = true;                  ///< the stream is not being captured
  unsigned long long capture_id = 0;  ///< the stream's capture when not eager
  int threads = 0;                    ///< the one-call kernel's CTA size (choose_threads)
  CallParams call{};
  std::vector<RankCallArgs> ranks;  ///< per local rank of the device
  DivideParams divide{};
  bool integer_avg = false;
  bool launched = false;  ///< its kernel is enqueued (run_batch: which calls ran after a failure)
  /// Its ranks' API buffer byte ranges [begin, end) on this device, whether or not it runs
  /// direct transfers: a fused launch turns direct transfers off in any two calls whose buffers
  /// overlap (its CTAs may run one call while the other's still read or write them).
  std::vector<ByteRange> buffer_ranges;
  /// Calls that meet other processes' launches (active): always a launch of their own.
  XprocParams xproc{};
};

/// A call checked and turned into per-device kernel parameters, ready to launch.
struct PreparedCall {
  DeviceExecutor* executor = nullptr;
  int dtype = 0;
  int reduction = kReduceSum;
  std::vector<PreparedPart> parts;  ///< empty: nothing to run (a zero-element chunk)
};

struct DeviceExecutor::Impl {
  ef::Program program;
  std::vector<int> rank_devices;
  ExecutorConfig config;
  /// Multi-process (PeerProcesses): which ranks run here, and each rank's arena group.
  /// Single-process: every rank is local and its location is its device.
  bool multiprocess = false;
  std::vector<bool> local_rank;
  std::vector<int64_t> location;
  std::string fingerprint;
  std::function<StatusOr<std::vector<std::string>>(const std::string&)> exchange;
  /// Network connections (PeerProcesses::hosts, connect_network); `network` keeps this
  /// process's ends alive, released after the executor's last launch.
  std::vector<uint64_t> hosts;
  std::function<StatusOr<NetworkEnds>(const std::vector<NetworkEndRequest>&)> connect_network;
  /// Direct transfers between processes on one GPU (PeerProcesses::gpus, direct, translate).
  std::vector<std::string> gpus;
  bool direct_between_processes = false;
  std::function<std::optional<uint64_t>(int, const void*, std::size_t, int)> translate;
  std::shared_ptr<void> network;
  std::size_t network_ends = 0;
  std::vector<int> devices;
  std::vector<LocalDevice> locals;
  std::vector<int> rank_local_device;  ///< rank -> index into locals
  std::vector<int> rank_local_index;   ///< rank -> index into that device's ranks
  std::size_t slot_bytes = 0;          ///< data bytes per slot (the config's, or the protocol's)
  bool flagged = false;                ///< LL or LL128 program: the kernel's flagged instantiation
  std::vector<ConnectionPlan> connections;  ///< every connection of the program
  ConnectionArena arena;  ///< their memory on this process's devices, in host memory, on slot devices
  std::string protocol_note;                ///< see DeviceExecutor::protocol_note
  /// Per mode (out-of-place, in-place): the first operand premulsum/avg cannot scale because
  /// it mixes pristine and written input chunks (ef::describe_mixed_operand); empty if none.
  std::string premul_mixed[2];
  MappedHostBuffer host_mapped;  ///< StopSignals, then one ErrorRecord per device

  StopSignals* signals() const;
  ErrorRecord* record(std::size_t device_index) const;

  // Construction (device_executor.cc).
  Status build();
  Status check_slot_devices() const;
  Status enable_peer_access_between_connected_devices();
  /// Asks the runtime for this process's ends of the network connections and hands their
  /// blocks to the arena.
  Status connect_network_ends();
  Status build_device(LocalDevice& local, const ef::PremulMap* outofplace,
                      const ef::PremulMap* inplace);
  /// Each local device's meeting with other processes' launches (after the arenas are mapped).
  Status plan_meetings();

  // Executor-owned memory (owned_memory.cc).
  /// Grows every local rank's executor-owned memory to what calls of `count` (`chunk_elements`
  /// per chunk) need, and to at least `at_least` bytes (a batch's several uses of the executor).
  Status ensure_private_memory(uint64_t chunk_elements, uint64_t count, std::size_t element_size,
                               uint64_t at_least = 0);
  /// Lays rank `local.ranks[local_index]`'s program buffers over the user's, exactly as the
  /// host executor does. `private_offset`: where this call's share of the executor-owned
  /// memory starts.
  Status map_buffers(const LocalDevice& local, std::size_t local_index, const RunArgs& args,
                     uint64_t chunk_elements, std::size_t element_size, std::size_t private_offset,
                     RankCallArgs& out) const;
  /// Which share of the executor-owned memory a call uses: a batch that runs the executor
  /// several times gives each use its own (calls of one batch may overlap on the GPU).
  struct PrivateUse {
    uint64_t instances = 1;  ///< uses in the batch
    uint64_t stride = 0;     ///< bytes per use (the largest use's need)
    uint64_t offset = 0;     ///< this use's share
  };
  /// The most executor-owned bytes a local rank needs for `args` (0 when the count does not
  /// apply; prepare reports that).
  StatusOr<uint64_t> largest_private_bytes(const RunArgs& args) const;

  // Launch (launch.cc).
  Status choose_threads(LocalDevice& local, int dtype, int reduction, int* threads);
  Status prepare(DeviceExecutor* self, const RunArgs& args, const PrivateUse& use,
                 PreparedCall* out);
  /// Eager launches: the launch on part.stream waits for this executor's previous launch on the
  /// device when that was on another stream; captured ones likewise within one capture.
  Status order_after_last_launch(PreparedPart& part);
  /// After the part's launch: integer avg's division, and the record of this launch. With
  /// `recorded` (eager fused launches), the caller launched the division and recorded that
  /// event after the whole launch: the part only refers to it.
  Status after_launch(PreparedPart& part, int dtype,
                      const std::shared_ptr<DeviceEvent>* recorded = nullptr);
  /// The one-call kernel for one device of a prepared call.
  Status launch_part(PreparedPart& part, int dtype, int reduction);

  // Batches (batch.cc).
  static Status launch_fused_parts(
      int device, int sm_count, cudaStream_t stream, int dtype, int reduction,
      const std::vector<std::pair<PreparedCall*, PreparedPart*>>& parts, uint32_t max_ctas,
      BatchReport* report);

  // Errors (device_executor.cc).
  std::string describe(std::size_t device_index, const ErrorRecord& e) const;
};

/// Counts interpreter launches (interpreter_launch_count).
void count_interpreter_launch();

/// The kernel's Reduction for an operator (avg and premulsum reduce with sum after scaling).
int reduction_of(ef::RedOp op);

}  // namespace efccl::device
