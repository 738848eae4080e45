// The GPU interpreter: runs an EF program on CUDA devices with exactly the results of the host
// reference executor (docs/ef-format.md): run() enqueues one kernel launch per device per call,
// run_batch() several calls in as few (fused) launches as possible.
//
//   auto executor = device::DeviceExecutor::create(program, {0, 0, 1, 1});  // rank -> GPU
//   device::RunArgs args{...};                // count, dtype, op, per-rank buffers, streams
//   Status s = executor.value()->run_and_wait(args);
//
// Several ranks may share a GPU; every threadblock of every local rank is one CTA of that
// device's launch, and the grid must be co-resident (checked before launching: a CTA spins on
// others). Connections are FIFOs of `connection_slots` slots in the receiver's memory, filled
// by the sender through peer access, in the program's protocol (Simple, LL, LL128; see
// docs/ef-format.md §5); a program may place a connection's slots in pinned host memory or on
// a slot device instead (ef::ConnectionPlacement, ExecutorConfig::slot_devices), and a
// connection between ranks on different hosts runs through the runtime's network proxies
// (PeerProcesses::hosts). Their counters and the dependency flags are never reset between
// calls, so a call can be captured in a CUDA graph and replayed.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/ef/program.h"
#include "efccl/common/status.h"
#include "efccl/ef/validate.h"

namespace efccl::device {

/// The data bytes of one connection slot when ExecutorConfig::slot_bytes is 0:
///  * Simple 512 KiB (NCCL's Simple step): at 128 KiB a ring allreduce over 2 H200s peaked at
///    250 GB/s busbw with 32 threadblocks, at 512 KiB at 314 GB/s (docs/performance.md);
///  * LL128 120 KiB: 1024 lines of 128 bytes, 128 KiB of wire;
///  * LL 32 KiB (NCCL's LL step), 64 KiB of wire: LL is for latency, and its receivers poll
///    every line.
std::size_t default_slot_bytes(ef::Protocol protocol);

/// Fixed for the executor's lifetime (they size the device memory it allocates).
struct ExecutorConfig {
  /// Data bytes of one connection slot (0: default_slot_bytes of the program's protocol). A
  /// unit (one tile of one chunk) has max(1, slot_bytes / sizeof(element)) elements. Results
  /// do not depend on it (§5). LL slots take twice as many bytes of memory, LL128 slots 128
  /// for every 120.
  std::size_t slot_bytes = 0;
  /// Slots per connection (NCCL_STEPS); validation's capacity check uses the same number.
  int connection_slots = ef::kDefaultConnectionSlots;
  /// CTA size; halved (down to 64) for a (datatype, operator) kernel whose grid would not be
  /// co-resident otherwise. A multiple of 32 in [64, 512].
  int max_threads_per_block = 256;
  /// Tests only: accept programs that validation proves to block (rules `deadlock` and
  /// `capacity`); they run into the timeout, which reports the blocked threadblock. Every other
  /// rule is always enforced, so a malformed program never reaches the GPU.
  bool allow_blocking_programs = false;
  /// Tests only: every connection's counters (push and pop positions, head, tail) start here
  /// instead of 0, e.g. just below where LL flags wrap (2^31) or LL slots are cleared (2^30).
  /// Not with network connections (their proxies count from 0).
  uint64_t first_position = 0;
  /// The CUDA device of each slot device the program names (one per Program::slot_devices).
  /// A connection placed on slot device k keeps its slots, tail and head in that GPU's memory:
  /// the sender writes them and the receiver reads them through peer access (each must have
  /// it to that GPU), and no kernel runs there for it. Any visible GPU may serve, also a GPU
  /// of one of the connection's ranks (on one GPU, every slot device is that GPU). A
  /// multi-process executor reads only the entries of slot devices holding connections that
  /// this process's ranks receive (the receiver's process allocates the memory); the others
  /// may be -1.
  std::vector<int> slot_devices;
};

/// One end of a network connection (a connection whose ranks run on different hosts) that this
/// process runs, as create() asks the runtime for its memory (PeerProcesses::connect_network).
struct NetworkEndRequest {
  int32_t sender = 0;  ///< program ranks
  int32_t receiver = 0;
  int32_t channel = 0;
  bool send = false;        ///< the sending end (else the receiving end)
  uint32_t nslots = 0;      ///< slots of the connection
  uint64_t slot_bytes = 0;  ///< wire bytes per slot
};

/// Where the runtime put one end: a block of pinned host memory that the GPU reaches at `device`,
/// laid out as the proxy transport's slot region (docs/net.md): `tail`, `head`, the slots'
/// sizes (u32 each) and the slots at these offsets. The slots of a sending end are filled here
/// and sent by its proxy; those of a receiving end are filled by its proxy.
struct NetworkEndMemory {
  char* device = nullptr;
  uint64_t tail_offset = 0;
  uint64_t head_offset = 0;
  uint64_t sizes_offset = 0;
  uint64_t slots_offset = 0;
};

/// The runtime's answer to a list of NetworkEndRequest: one NetworkEndMemory per request, in
/// order, and what keeps the blocks and their connections alive (the executor holds it until
/// it is destroyed, after its last launch).
struct NetworkEnds {
  std::vector<NetworkEndMemory> ends;
  std::shared_ptr<void> owner;
};

/// Multi-process executors: the program's ranks are served by several processes, each running
/// an executor for its own ranks. Connection memory lives where the single-process executor
/// puts it (FIFO slots and tail at the receiver, head at the sender; a placed connection's
/// slots, tail and head in pinned host memory or on a slot device, owned by the receiver's
/// process); each process allocates its part and shares it, GPU memory through CUDA IPC and
/// host memory through POSIX shared memory (a name in /dev/shm that is removed as soon as the
/// sender's process has mapped it, or when the executor goes). The layout is computed from the
/// program and `location` alone, so every process derives the same offsets; only one handle
/// per arena is exchanged.
struct PeerProcesses {
  /// Per rank: true where this process runs the rank (its `rank_devices` entry is its GPU;
  /// other ranks' entries are ignored).
  std::vector<bool> local;
  /// Per rank: ranks with equal values share one process and GPU (one launch, one arena).
  /// Every process must pass the same vector.
  std::vector<int64_t> location;
  /// Identifies the program and call shape; processes whose fingerprints differ are running
  /// different programs, which create() reports instead of letting the kernels hang.
  std::string fingerprint;
  /// Sends this process's blob to every other process serving ranks of the program and
  /// returns, per rank, the blob of the process serving it (entries of local ranks are
  /// ignored). Called once, inside create(), at the same point by every process.
  std::function<StatusOr<std::vector<std::string>>(const std::string& mine)> exchange;
  /// Per rank: the host it runs on (empty: every rank on one host). A connection whose ranks are
  /// on different hosts is a network connection: each end's slots and counters are a block of
  /// its own host's pinned memory, joined to the other end by the runtime's proxies; the
  /// program's placement of it does not apply. Every process must pass the same vector.
  std::vector<uint64_t> hosts;
  /// Connects this process's ends of the network connections (requests in connection order)
  /// and returns their memory. Called once, inside create(), after `exchange`, by every process
  /// that runs such an end (each with its own ends); required when `hosts` makes any.
  std::function<StatusOr<NetworkEnds>(const std::vector<NetworkEndRequest>& ends)> connect_network;
  /// Direct transfers between processes on one GPU (docs/device-executor.md): per rank, its GPU
  /// (equal non-empty strings: the same GPU; empty: unknown); `direct` lets ranks of different
  /// processes on one GPU move data directly where the program allows, when every buffer of a
  /// call can be reached from the other processes (`translate`). Every process must pass the
  /// same vector and flag (the fingerprint should say the flag).
  std::vector<std::string> gpus;
  bool direct = false;
  /// Where the process of rank `reader` reaches [p, p + bytes) of local rank `rank`'s memory
  /// (a registered buffer that process mapped), or nothing. Called at calls of at least
  /// kXprocMinBytes per rank buffer.
  std::function<std::optional<uint64_t>(int rank, const void* p, std::size_t bytes, int reader)>
      translate;
};

/// Calls whose `count` elements per rank buffer take fewer bytes keep the slots between ranks
/// of different processes on one GPU (their launches then need not meet). Two processes on an
/// H200 under MPS (docs/performance.md): direct was slower than the slots up to 1 MiB and
/// faster from 4 MiB.
inline constexpr std::size_t kXprocMinBytes = std::size_t{2} << 20;

/// One call, as the NCCL API describes it.
struct RunArgs {
  uint64_t count = 0;  ///< NCCL's count argument for the program's collective
  ef::DataType dtype = ef::DataType::kFloat32;
  ef::RedOp op = ef::RedOp::kSum;
  bool inplace = false;
  /// premulsum: one scalar per rank (empty: 1.0 for every rank). avg derives 1/nranks itself.
  std::vector<double> premul_scalars;
  /// Per rank (index = rank): the API's send and receive buffers, device pointers on the
  /// rank's GPU (multi-process: entries of other processes' ranks are ignored). Null where
  /// the API has none for the rank (e.g. the output of a non-root rank
  /// of reduce). In-place calls alias them exactly as NCCL does (docs/ef-format.md §2; checked).
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  /// One stream per entry of DeviceExecutor::devices(), in that order.
  std::vector<cudaStream_t> streams;
  /// A wait that sees no progress for this long fails the call (must be > 0).
  std::chrono::nanoseconds timeout = std::chrono::seconds(10);
  /// Ranks sharing a GPU in one launch move data directly between their buffers where the
  /// program allows (ef::analyze_direct; docs/device-executor.md, "Direct transfers"); false
  /// keeps every transfer in the connections' slots (EFCCL_DIRECT=0).
  bool direct = true;
};

class DeviceExecutor;

/// One call of DeviceExecutor::run_batch.
struct BatchCall {
  DeviceExecutor* executor = nullptr;
  const RunArgs* args = nullptr;
};

/// What run_batch enqueued (logs and tests).
struct BatchReport {
  std::size_t launches = 0;     ///< interpreter launches, fused or not
  std::size_t fused_calls = 0;  ///< device parts of calls that ran inside a fused launch
  /// After a failed launch: the calls (indexes into the batch) with at least one device part
  /// that was not launched, ascending; empty when every launch went out.
  std::vector<std::size_t> not_run;
};

/// Tests only: how run_batch places calls.
struct BatchOptions {
  /// Place each fused launch's calls on at most this many CTAs (0: as many as are co-resident),
  /// so that calls share CTAs, one after the other.
  uint32_t max_ctas = 0;
  /// Make launch number `fail_launch` of the batch (0-based, in the order run_batch enqueues
  /// its launches) fail before it is enqueued, as a refused CUDA launch would.
  std::size_t fail_launch = SIZE_MAX;
};

/// Interpreter launches (one-call and fused) this process has enqueued so far (tests).
uint64_t interpreter_launch_count();

/// Owns everything one program needs on its GPUs: uploaded op tables, connection FIFOs,
/// dependency flags, scratch. Its launches share that memory, so it orders them itself: a launch
/// on another stream than its previous one waits for that one (an event; within one CUDA-graph
/// capture, an edge of the graph). Launches in different graphs are ordered by whoever
/// replays them.
class DeviceExecutor {
 public:
  /// Validates `program` (ef::validate with config.connection_slots), enables peer access
  /// between the GPUs it connects, and uploads it. `rank_devices[r]` is rank r's CUDA device.
  /// `peers`: null when this process runs every rank; otherwise see PeerProcesses (reset()
  /// is then refused: counters shared with other processes cannot be cleared from one side).
  /// May be called while the caller captures a CUDA graph (the thread runs in relaxed capture
  /// mode meanwhile; nothing is enqueued on a capturing stream).
  static StatusOr<std::unique_ptr<DeviceExecutor>> create(const ef::Program& program,
                                                          std::vector<int> rank_devices,
                                                          const ExecutorConfig& config = {},
                                                          const PeerProcesses* peers = nullptr);
  /// Waits for launches still in flight, then frees the device memory. Synchronises the
  /// devices: never destroy an executor while one of its devices' streams is being captured.
  ~DeviceExecutor();
  DeviceExecutor(const DeviceExecutor&) = delete;
  DeviceExecutor& operator=(const DeviceExecutor&) = delete;

  /// The CUDA devices used, ascending; RunArgs::streams follows this order.
  const std::vector<int>& devices() const;
  const ef::Program& program() const;

  /// Sizes the executor-owned buffers (scratch, and program buffers the API does not provide)
  /// for calls up to `count` elements of `dtype`. run() grows them on demand, also while a
  /// stream is being captured (the allocation switches the thread to relaxed capture mode and
  /// is not part of the graph). Buffers replaced by a growth stay allocated until the executor
  /// goes, so earlier captured graphs remain valid.
  Status reserve(uint64_t count, ef::DataType dtype);

  /// Enqueues the call: one interpreter launch per device (plus, for avg on integers, a small
  /// division kernel after it). Returns without waiting; errors found later by the kernels
  /// surface through wait() / error_status().
  Status run(const RunArgs& args);
  /// Synchronises the call's streams, then reports error_status().
  Status wait(const RunArgs& args);
  Status run_and_wait(const RunArgs& args);

  /// Enqueues several calls, of one or more executors, in as few launches as possible: per
  /// (device, stream), consecutive calls of one (datatype, operator) kernel become one fused
  /// launch (up to kMaxFusedCalls calls and kMaxFusedRanks ranks each; Simple, LL and LL128
  /// programs together; collectives that only move data count as bytes, whatever their type).
  /// Each device runs the calls in the order given, so every device and process running a
  /// batch's calls must give them in the same relative order (NCCL's rule for grouped calls).
  /// As in an NCCL group, the calls may overlap on the GPU, also two calls of one executor
  /// (each gets its own executor-owned memory): no call may read what another call writes.
  /// Nothing is launched when a call's arguments are bad. After a failed launch nothing more
  /// is launched; the error and BatchReport::not_run name the calls that did not run (wholly
  /// or on some devices), and only the executors of calls launched on some of their devices
  /// but not all are aborted (their launched parts would wait for the others).
  static Status run_batch(const std::vector<BatchCall>& calls, BatchReport* report = nullptr,
                          const BatchOptions& options = {});

  /// Non-blocking: the first failure posted by a kernel (timeout, abort), naming the rank,
  /// threadblock, op, iteration and what it waited for; ok when there is none.
  Status error_status() const;
  /// Thread-safe: makes every waiting CTA give up within about a millisecond.
  void abort();
  /// Waits for this executor's eager launches enqueued so far (launches replayed from captured
  /// graphs are the replayer's), not for the rest of its devices' work.
  Status wait_launches();

  /// Device memory of the connections (FIFO slots and counters) on the device that holds the
  /// most of it.
  std::size_t connection_bytes() const;
  /// The data bytes of one slot (ExecutorConfig::slot_bytes, or the protocol's default).
  std::size_t slot_bytes() const;
  /// Empty, or (LL128 programs) which connections run over LL instead and why, for the log.
  const std::string& protocol_note() const;
  /// How many ends of network connections (PeerProcesses::hosts) this process runs; their
  /// proxies should be kicked before a launch.
  std::size_t network_ends() const;
  /// Ops whose pop or push moves data directly between two ranks sharing a launch instead of
  /// through slots, in calls of the given mode (ef::analyze_direct; RunArgs::direct).
  std::size_t direct_ops(bool inplace) const;
  /// After a failure or abort: waits for the devices, clears every counter, flag and error,
  /// and makes the executor usable again.
  Status reset();

  struct Impl;

 private:
  explicit DeviceExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace efccl::device
