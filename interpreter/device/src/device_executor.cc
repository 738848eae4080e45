// DeviceExecutor: turns a validated ef::Program into the kernel's tables (kernel_params.h),
// owns the device memory behind them, and launches one interpreter kernel per device per call.
#include "efccl/device/device_executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "efccl/ef/premul_analysis.h"
#include "interpreter_kernel.h"
#include "kernel_params.h"

namespace efccl::device {
namespace {

static_assert(static_cast<int>(ef::OpCode::kSend) == kOpSend &&
                  static_cast<int>(ef::OpCode::kRecv) == kOpRecv &&
                  static_cast<int>(ef::OpCode::kCopy) == kOpCopy &&
                  static_cast<int>(ef::OpCode::kReduce) == kOpReduce &&
                  static_cast<int>(ef::OpCode::kRecvCopySend) == kOpRecvCopySend &&
                  static_cast<int>(ef::OpCode::kRecvReduceCopy) == kOpRecvReduceCopy &&
                  static_cast<int>(ef::OpCode::kRecvReduceSend) == kOpRecvReduceSend &&
                  static_cast<int>(ef::OpCode::kRecvReduceCopySend) == kOpRecvReduceCopySend &&
                  static_cast<int>(ef::OpCode::kNop) == kOpNop,
              "OpKind mirrors ef::OpCode");
static_assert(static_cast<int>(ef::BufferKind::kInput) == kBufferInput &&
                  static_cast<int>(ef::BufferKind::kOutput) == kBufferOutput &&
                  static_cast<int>(ef::BufferKind::kScratch) == kBufferScratch,
              "BufferIndex mirrors ef::BufferKind");
static_assert(sizeof(KernelParams) <= 4096, "kernel parameters must fit the classic 4 KiB limit");

Status cuda_error(const std::string& what, cudaError_t e) {
  return Status::error(what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define EFCCL_CUDA_RETURN(call, what)                               \
  do {                                                              \
    const cudaError_t efccl_e = (call);                             \
    if (efccl_e != cudaSuccess) return cuda_error((what), efccl_e); \
  } while (0)

/// Puts the calling thread in relaxed stream-capture mode for a scope. Creating an executor and
/// growing its scratch allocate and wait for private streams; under a global or thread-local
/// capture (PyTorch's default is global) those calls would invalidate the capture. None of them
/// touches a capturing stream: memory is zeroed on private non-blocking streams, and nothing
/// synchronises a device. NCCL switches modes around its allocations the same way.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

/// Makes `device` current for a scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    // Only when something changed it (cudaGetDevice is a thread-local read, cudaSetDevice is
    // not free, and scopes sit on every launch).
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

/// cudaMalloc'd memory on one device, zero-filled.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      DeviceScope scope(device_);
      cudaFree(ptr_);
    }
  }

  Status allocate(int device, std::size_t bytes) {
    DeviceScope scope(device);
    device_ = device;
    bytes_ = bytes;
    EFCCL_CUDA_RETURN(
        cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 16)),
        "cudaMalloc(" + std::to_string(bytes) + " bytes) on device " + std::to_string(device));
    return zero_now(std::max<std::size_t>(bytes, 16));
  }
  template <typename T>
  Status upload(int device, const std::vector<T>& values) {
    if (Status s = allocate(device, values.size() * sizeof(T)); !s) return s;
    if (values.empty()) return Status::ok();
    DeviceScope scope(device);
    // On a private stream, waited for: a pageable cudaMemcpy may return before its DMA lands,
    // and the first launch (on a non-blocking stream) would not wait for it.
    cudaStream_t s = nullptr;
    EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaError_t e = cudaMemcpyAsync(ptr_, values.data(), values.size() * sizeof(T),
                                    cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    EFCCL_CUDA_RETURN(e, "uploading the program to device " + std::to_string(device));
    return Status::ok();
  }
  Status zero() {
    if (ptr_ == nullptr) return Status::ok();
    DeviceScope scope(device_);
    return zero_now(bytes_);
  }
  /// Zeroes the first `bytes` and waits for exactly that: cudaMemset would run on the legacy
  /// stream, which kernels on non-blocking streams do not wait for (a first launch could read
  /// stale flags), and a device-wide sync would wait for other, possibly spinning, kernels.
  Status zero_now(std::size_t bytes) {
    cudaStream_t s = nullptr;
    EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaError_t e = cudaMemsetAsync(ptr_, 0, bytes, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    EFCCL_CUDA_RETURN(e, "zeroing " + std::to_string(bytes) + " bytes on device " + std::to_string(device_));
    return Status::ok();
  }

  template <typename T = char>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

/// Pinned host memory mapped into every device's address space (host writes, GPU polls).
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  ~MappedHostBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  Status allocate(std::size_t bytes) {
    EFCCL_CUDA_RETURN(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                      "cudaHostAlloc (mapped)");
    std::memset(ptr_, 0, bytes);
    bytes_ = bytes;
    return Status::ok();
  }
  char* get() const { return static_cast<char*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

/// premulsum's scalar as an integer type sees it: truncated toward zero into int64_t
/// (saturating, NaN -> 0), then wrapped to the type by the kernel (host::scale_elements).
int64_t integer_scalar(double scalar) {
  if (std::isnan(scalar)) return 0;
  constexpr double kLimit = 9223372036854775808.0;  // 2^63
  if (scalar >= kLimit) return std::numeric_limits<int64_t>::max();
  if (scalar < -kLimit) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(scalar);
}

bool is_integer(ef::DataType t) { return !ef::is_floating(t); }

/// A connection (sender, receiver, channel) and where its two ends live.
struct ConnectionPlan {
  int sender = 0, receiver = 0, channel = 0;
  int send_tb = -1, recv_tb = -1;
  WireFormat wire = kWireSimple;
  std::size_t recv_offset = 0;  ///< in the receiver device's FIFO arena
  std::size_t send_offset = 0;  ///< in the sender device's counter arena
  int send_index = -1;          ///< in the sender device's SendConnection table
  int recv_index = -1;          ///< in the receiver device's RecvConnection table
};

/// Wire bytes of a slot that carries `slot_bytes` data bytes in `wire` (a tile has at most
/// max(slot_bytes, 8) bytes: max(1, slot_bytes / size) elements of at most 8 bytes).
std::size_t slot_wire_bytes(WireFormat wire, std::size_t slot_bytes) {
  const std::size_t groups =
      (std::max<std::size_t>(slot_bytes, 8) + kGroupDataBytes - 1) / kGroupDataBytes;
  switch (wire) {
    case kWireLL:
      return align_up(groups * kLLGroupWireBytes, kLL128LineBytes);
    case kWireLL128:
      return groups * kLL128LineBytes;
    case kWireSimple:
      break;
  }
  return align_up(std::max<std::size_t>(slot_bytes, 16), 16);
}

/// Empty when a connection from device `from` to device `to` (this process's) may carry LL128
/// lines, else why not. LL128 relies on a warp's 128-byte store reaching the receiver's memory
/// as a unit, which NVIDIA's own LL128 relies on for NVLink on compute capability 9.0 (Hopper)
/// and later, and which PCIe does not promise. Native peer atomics stand for NVLink here:
/// CUDA offers them between NVLink peers and not over PCIe.
StatusOr<std::string> ll128_obstacle(int from, int to) {
  for (int d : {from, to}) {
    int major = 0;
    EFCCL_CUDA_RETURN(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d),
                      "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
    if (major < 9)
      return "device " + std::to_string(d) + " has compute capability " + std::to_string(major) +
             ".x (LL128 needs 9.0 or later)";
  }
  if (from == to) return std::string();
  int atomics = 0;
  EFCCL_CUDA_RETURN(
      cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, from, to),
      "cudaDeviceGetP2PAttribute(NativeAtomicSupported)");
  if (atomics == 0)
    return "devices " + std::to_string(from) + " and " + std::to_string(to) +
           " are not NVLink peers (no native peer atomics)";
  return std::string();
}

// Layout of one connection's memory.
constexpr std::size_t kTailOffset = 0;                       // receiver: written by the sender
constexpr std::size_t kRecvPositionOffset = kCounterStride;  // receiver: its pop count
constexpr std::size_t kSlotsOffset = 2 * kCounterStride;     // receiver: the slots
constexpr std::size_t kHeadOffset = 0;                       // sender: written by the receiver
constexpr std::size_t kSendPositionOffset = kCounterStride;  // sender: its push count
constexpr std::size_t kSendEndBytes = 2 * kCounterStride;

}  // namespace

/// Everything one device of the executor owns.
/// A CUDA event on one device, created on first use, destroyed with its owner.
class DeviceEvent {
 public:
  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& o) noexcept { *this = std::move(o); }
  DeviceEvent& operator=(DeviceEvent&& o) noexcept {
    std::swap(event_, o.event_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~DeviceEvent() {
    if (event_ != nullptr) {
      DeviceScope scope(device_);
      cudaEventDestroy(event_);
    }
  }
  /// The event, created on `device` (the current device) when first asked for.
  StatusOr<cudaEvent_t> get(int device) {
    if (event_ == nullptr) {
      device_ = device;
      EFCCL_CUDA_RETURN(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                        "cudaEventCreate on device " + std::to_string(device));
    }
    return event_;
  }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

/// Events recorded after eager launches, per device. One fused launch records one event that
/// every executor in it refers to (rather than one record per executor); an event is recorded
/// again only when no executor refers to it any more. Never freed (events outlive executors,
/// and the process's CUDA teardown would destroy them anyway).
class LaunchEvents {
 public:
  /// A free event of `device` (the current device), created when none is free.
  static StatusOr<std::shared_ptr<DeviceEvent>> acquire(int device) {
    static std::mutex mutex;
    static auto* pools = new std::map<int, Pool>();
    std::lock_guard<std::mutex> lock(mutex);
    Pool& pool = (*pools)[device];
    for (std::size_t k = 0; k < pool.events.size(); ++k) {
      const std::size_t i = (pool.next + k) % pool.events.size();
      if (pool.events[i].use_count() == 1) {  // only the pool holds it
        pool.next = i + 1;
        return pool.events[i];
      }
    }
    auto event = std::make_shared<DeviceEvent>();
    if (auto e = event->get(device); !e) return e.status();
    pool.events.push_back(event);
    return event;
  }

 private:
  struct Pool {
    std::vector<std::shared_ptr<DeviceEvent>> events;
    std::size_t next = 0;
  };
};

struct LocalDevice {
  int device = 0;
  int sm_count = 0;
  std::vector<int> ranks;  ///< global ranks served by this device's launch, ascending
  uint32_t nblocks = 0;
  DeviceBuffer threadblocks, ops, deps, flags, sends, recvs, state, epochs;
  DeviceBuffer divide_segments;  ///< integer avg's result regions (DivideSegment)
  uint32_t ndivide_segments = 0;
  int64_t largest_divide_chunks = 0;
  DeviceBuffer fifo_arena;     ///< slots and counters of connections received here
  DeviceBuffer counter_arena;  ///< head and position of connections sent from here
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

struct PreparedCall;
struct PreparedPart;

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
  /// Per location: base of its FIFO arena and of its counter arena (this process's own).
  std::map<int64_t, char*> fifo_base, counter_base;
  /// Per (location of another process, local device): its arenas as mapped for that device
  /// (CUDA IPC maps a handle once per device context).
  std::map<std::pair<int64_t, int>, char*> remote_fifo_base, remote_counter_base;
  /// cudaIpcOpenMemHandle mappings (device, pointer), closed when the Impl goes, also after a
  /// failed create().
  std::vector<std::pair<int, void*>> opened;
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    for (const auto& [device, p] : opened) {
      DeviceScope scope(device);
      cudaIpcCloseMemHandle(p);
    }
  }
  std::vector<int> devices;
  std::vector<LocalDevice> locals;
  std::vector<int> rank_local_device;  ///< rank -> index into locals
  std::vector<int> rank_local_index;   ///< rank -> index into that device's ranks
  std::size_t slot_bytes = 0;          ///< data bytes per slot (the config's, or the protocol's)
  std::size_t slot_stride = 0;         ///< wire bytes per slot, the same for every connection
  bool flagged = false;                ///< LL or LL128 program: the kernel's flagged instantiation
  std::vector<ConnectionPlan> connections;  ///< every connection of the program
  std::string protocol_note;                ///< see DeviceExecutor::protocol_note
  /// Per mode (out-of-place, in-place): the first operand premulsum/avg cannot scale because
  /// it mixes pristine and written input chunks (ef::describe_mixed_operand); empty if none.
  std::string premul_mixed[2];
  MappedHostBuffer host_mapped;  ///< StopSignals, then one ErrorRecord per device

  StopSignals* signals() const { return reinterpret_cast<StopSignals*>(host_mapped.get()); }
  ErrorRecord* record(std::size_t device_index) const {
    return reinterpret_cast<ErrorRecord*>(host_mapped.get() + align_up(sizeof(StopSignals), 64)) +
           device_index;
  }

  Status build();
  Status choose_wire_formats();
  Status write_first_positions();
  Status share_arenas(const std::map<int64_t, std::size_t>& fifo_size,
                      const std::map<int64_t, std::size_t>& counter_size);
  Status build_device(LocalDevice& local, const std::vector<ConnectionPlan>& connections,
                      const ef::PremulMap* outofplace, const ef::PremulMap* inplace);
  /// Grows every local rank's executor-owned memory to what calls of `chunk_elements` need,
  /// and to at least `at_least` bytes (a batch's several uses of the executor).
  Status ensure_private_memory(uint64_t chunk_elements, std::size_t element_size,
                               std::size_t at_least = 0);
  std::size_t private_bytes(int rank, uint64_t chunk_elements, uint64_t count,
                            std::size_t element_size) const;
  Status choose_threads(LocalDevice& local, int dtype, int reduction, int* threads);
  /// `private_offset`: where this call's share of the executor-owned memory starts.
  Status map_buffers(const LocalDevice& local, std::size_t local_index, const RunArgs& args,
                     uint64_t chunk_elements, std::size_t element_size, std::size_t private_offset,
                     RankCallArgs& out) const;
  /// Which share of the executor-owned memory a call uses: a batch that runs the executor
  /// several times gives each use its own (calls of one batch may overlap on the GPU).
  struct PrivateUse {
    std::size_t instances = 1;  ///< uses in the batch
    std::size_t stride = 0;     ///< bytes per use (the largest use's need)
    std::size_t offset = 0;     ///< this use's share
  };
  /// The most executor-owned bytes a local rank needs for `args`.
  std::size_t largest_private_bytes(const RunArgs& args) const;
  Status prepare(DeviceExecutor* self, const RunArgs& args, const PrivateUse& use,
                 PreparedCall* out);
  /// Eager launches: the launch on part.stream waits for this executor's previous launch on the
  /// device when that was on another stream.
  Status order_after_last_launch(PreparedPart& part);
  /// After the part's launch: integer avg's division, and the record of this launch. With
  /// `recorded` (eager fused launches), the caller launched the division and recorded that
  /// event after the whole launch: the part only refers to it.
  Status after_launch(PreparedPart& part, int dtype,
                      const std::shared_ptr<DeviceEvent>* recorded = nullptr);
  /// The one-call kernel for one device of a prepared call.
  Status launch_part(PreparedPart& part, int dtype, int reduction);
  static Status launch_fused_parts(int device, int sm_count, cudaStream_t stream, int dtype,
                                   int reduction,
                                   const std::vector<std::pair<PreparedCall*, PreparedPart*>>& parts,
                                   uint32_t max_ctas, BatchReport* report);
  std::string describe(std::size_t device_index, const ErrorRecord& e) const;
};

// ---------------------------------------------------------------------------------------------
// Construction

StatusOr<std::unique_ptr<DeviceExecutor>> DeviceExecutor::create(const ef::Program& program,
                                                                 std::vector<int> rank_devices,
                                                                 const ExecutorConfig& config,
                                                                 const PeerProcesses* peers) {
  // Creation may happen while the caller captures a graph (a call first seen in a capture);
  // also covers the cleanup of a failed creation, which runs before this guard goes.
  RelaxedCaptureMode relaxed;
  if (program.nranks <= 0 || static_cast<std::size_t>(program.nranks) != program.ranks.size())
    return Status::error("program has no ranks (nranks " + std::to_string(program.nranks) + ")");
  if (rank_devices.size() != program.ranks.size())
    return Status::error("rank_devices has " + std::to_string(rank_devices.size()) +
                         " entries; the program has " + std::to_string(program.nranks) + " ranks");
  if (config.slot_bytes > (std::size_t{1} << 30))
    return Status::error("slot_bytes must be at most 1 GiB (0: the protocol's default), got " +
                         std::to_string(config.slot_bytes));
  if (config.connection_slots < 1 || config.connection_slots > 1024)
    return Status::error("connection_slots must be in [1, 1024], got " +
                         std::to_string(config.connection_slots));
  if (config.max_threads_per_block < 64 || config.max_threads_per_block > kMaxThreadsPerBlock ||
      config.max_threads_per_block % 32 != 0)
    return Status::error("max_threads_per_block must be a multiple of 32 in [64, " +
                         std::to_string(kMaxThreadsPerBlock) + "], got " +
                         std::to_string(config.max_threads_per_block));

  ef::ValidateOptions vo;
  vo.connection_slots = config.connection_slots;
  std::string problems;
  for (const auto& d : ef::validate(program, vo)) {
    if (config.allow_blocking_programs && (d.rule == "deadlock" || d.rule == "capacity")) continue;
    problems += "\n  " + d.to_string();
  }
  if (!problems.empty()) return Status::error("program is not valid:" + problems);

  const std::size_t n = rank_devices.size();
  if (peers != nullptr) {
    if (peers->local.size() != n || peers->location.size() != n)
      return Status::error("PeerProcesses needs one local flag and one location per rank (" +
                           std::to_string(n) + ")");
    if (std::none_of(peers->local.begin(), peers->local.end(), [](bool b) { return b; }))
      return Status::error("PeerProcesses: no rank of the program runs in this process");
    if (!peers->exchange) return Status::error("PeerProcesses: no exchange function");
  }
  const auto is_local = [&](std::size_t r) { return peers == nullptr || peers->local[r]; };
  int ndevices = 0;
  EFCCL_CUDA_RETURN(cudaGetDeviceCount(&ndevices), "cudaGetDeviceCount");
  for (std::size_t r = 0; r < n; ++r)
    if (is_local(r) && (rank_devices[r] < 0 || rank_devices[r] >= ndevices))
      return Status::error("rank " + std::to_string(r) + " is mapped to device " +
                           std::to_string(rank_devices[r]) + "; " + std::to_string(ndevices) +
                           " CUDA devices are visible");

  auto impl = std::make_unique<Impl>();
  impl->program = program;
  impl->rank_devices = std::move(rank_devices);
  impl->config = config;
  impl->local_rank.assign(n, true);
  impl->location.assign(impl->rank_devices.begin(), impl->rank_devices.end());
  if (peers != nullptr) {
    impl->multiprocess = true;
    impl->local_rank = peers->local;
    impl->location = peers->location;
    impl->fingerprint = peers->fingerprint;
    impl->exchange = peers->exchange;
    for (std::size_t r = 0; r < n; ++r)
      if (!impl->local_rank[r]) impl->rank_devices[r] = -1;
    // Two local ranks share a location exactly when they share a device.
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (impl->local_rank[a] && impl->local_rank[b] &&
            (impl->location[a] == impl->location[b]) !=
                (impl->rank_devices[a] == impl->rank_devices[b]))
          return Status::error("PeerProcesses: local ranks " + std::to_string(a) + " and " +
                               std::to_string(b) +
                               " must share a location exactly when they share a GPU");
    // A location belongs to one process: local and remote ranks never share one.
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (impl->local_rank[a] && !impl->local_rank[b] && impl->location[a] == impl->location[b])
          return Status::error("PeerProcesses: rank " + std::to_string(a) + " (this process) and " +
                               "rank " + std::to_string(b) + " (another) have the same location");
  }
  if (Status s = impl->build(); !s) return s;
  return std::unique_ptr<DeviceExecutor>(new DeviceExecutor(std::move(impl)));
}

DeviceExecutor::DeviceExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceExecutor::~DeviceExecutor() {
  // An executor may be destroyed (evicted) while this or another thread captures a CUDA graph
  // on an unrelated stream: as NCCL does around its frees, wait and free in relaxed capture
  // mode, and wait for this executor's own last launch per device (every earlier eager launch
  // is ordered before it) rather than the whole device, whose capturing streams must not be
  // synchronised. Graph replays are over before the graph's pin lets an executor go. A stuck
  // launch ends by its own timeout.
  RelaxedCaptureMode relaxed;
  for (LocalDevice& local : impl_->locals) {
    if (!local.launched_before) continue;
    DeviceScope scope(local.device);
    if (auto event = local.last_launch->get(local.device); event) cudaEventSynchronize(*event);
  }
  impl_.reset();  // the frees, still in relaxed mode
}

const std::vector<int>& DeviceExecutor::devices() const { return impl_->devices; }
const ef::Program& DeviceExecutor::program() const { return impl_->program; }

/// Peer access from `from` to `to`, enabled once per process: every executor needs it, and
/// asking again only produces cudaErrorPeerAccessAlreadyEnabled (which compute-sanitizer
/// reports as an API error). Pairs enabled by someone else are still handled.
static Status enable_peer_access(int from, int to) {
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

std::size_t default_slot_bytes(ef::Protocol protocol) {
  switch (protocol) {
    case ef::Protocol::kLL:
      return std::size_t{32} << 10;
    case ef::Protocol::kLL128:
      return std::size_t{120} << 10;
    case ef::Protocol::kSimple:
      break;
  }
  return std::size_t{512} << 10;
}

/// The wire format of every connection: the program's protocol, except that an LL128
/// connection runs over LL where LL128's delivery assumption is not known to hold (see
/// ll128_obstacle). Connections to another process always run over LL: its two ends must agree
/// without another exchange, and this process cannot always see the other GPU.
Status DeviceExecutor::Impl::choose_wire_formats() {
  const ef::Protocol protocol = program.protocol;
  std::map<std::pair<int, int>, std::string> obstacles;  // (from, to) device pair -> why not
  std::size_t fallbacks = 0;
  std::string first_reason;
  for (ConnectionPlan& c : connections) {
    if (protocol == ef::Protocol::kSimple) {
      c.wire = kWireSimple;
      continue;
    }
    c.wire = kWireLL;
    if (protocol == ef::Protocol::kLL) continue;
    std::string why;
    if (!local_rank[c.sender] || !local_rank[c.receiver]) {
      why = "rank " + std::to_string(local_rank[c.sender] ? c.receiver : c.sender) +
            " runs in another process";
    } else {
      const std::pair<int, int> pair{rank_devices[c.sender], rank_devices[c.receiver]};
      auto it = obstacles.find(pair);
      if (it == obstacles.end()) {
        StatusOr<std::string> o = ll128_obstacle(pair.first, pair.second);
        if (!o) return o.status();
        it = obstacles.emplace(pair, *o).first;
      }
      why = it->second;
    }
    if (why.empty()) {
      c.wire = kWireLL128;
    } else if (fallbacks++ == 0) {
      first_reason = "connection " + std::to_string(c.sender) + "->" + std::to_string(c.receiver) +
                     " ch " + std::to_string(c.channel) + ": " + why;
    }
  }
  if (fallbacks > 0)
    protocol_note = "LL128 program '" + program.name + "': " + std::to_string(fallbacks) + " of " +
                    std::to_string(connections.size()) +
                    " connections run over LL (the first: " + first_reason + ")";
  return Status::ok();
}

Status DeviceExecutor::Impl::build() {
  const ef::Program& p = program;
  const int n = p.nranks;
  for (int r = 0; r < n; ++r)
    if (local_rank[r]) devices.push_back(rank_devices[r]);
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  locals.resize(devices.size());
  rank_local_device.assign(n, -1);  // -1: another process runs the rank
  rank_local_index.assign(n, -1);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    locals[i].device = devices[i];
    EFCCL_CUDA_RETURN(
        cudaDeviceGetAttribute(&locals[i].sm_count, cudaDevAttrMultiProcessorCount, devices[i]),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
  }
  for (int r = 0; r < n; ++r) {
    if (!local_rank[r]) continue;
    const auto d =
        std::lower_bound(devices.begin(), devices.end(), rank_devices[r]) - devices.begin();
    rank_local_device[r] = static_cast<int>(d);
    rank_local_index[r] = static_cast<int>(locals[d].ranks.size());
    locals[d].ranks.push_back(r);
  }
  for (const auto& local : locals)
    if (local.ranks.size() > static_cast<std::size_t>(kMaxLocalRanks))
      return Status::error("device " + std::to_string(local.device) + " serves " +
                           std::to_string(local.ranks.size()) +
                           " ranks; one launch serves at most " + std::to_string(kMaxLocalRanks));

  // Connections: (sender, receiver, channel) -> both threadblocks. Validation guarantees that
  // each exists exactly once on each side.
  std::map<std::tuple<int, int, int>, ConnectionPlan> by_key;
  for (int r = 0; r < n; ++r) {
    const auto& tbs = p.ranks[r].threadblocks;
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      const auto& tb = tbs[t];
      if (tb.send_peer >= 0) {
        auto& c = by_key[{r, tb.send_peer, tb.channel}];
        c.sender = r, c.receiver = tb.send_peer, c.channel = tb.channel;
        c.send_tb = static_cast<int>(t);
      }
      if (tb.recv_peer >= 0) {
        auto& c = by_key[{tb.recv_peer, r, tb.channel}];
        c.sender = tb.recv_peer, c.receiver = r, c.channel = tb.channel;
        c.recv_tb = static_cast<int>(t);
      }
    }
  }
  for (auto& [key, c] : by_key) {
    if (c.send_tb < 0 || c.recv_tb < 0)
      return Status::error("connection " + std::to_string(c.sender) + "->" +
                           std::to_string(c.receiver) + " ch " + std::to_string(c.channel) +
                           " has only one side");
    connections.push_back(c);
  }

  // Peer access both ways between connected devices: the sender writes slots and tail into
  // the receiver's memory, the receiver writes head into the sender's.
  std::set<std::pair<int, int>> pairs;
  for (const auto& c : connections) {
    if (!local_rank[c.sender] || !local_rank[c.receiver]) continue;  // IPC: share_arenas()
    const int a = rank_devices[c.sender], b = rank_devices[c.receiver];
    if (a != b) pairs.insert({std::min(a, b), std::max(a, b)});
  }
  for (const auto& [a, b] : pairs) {
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
      int can = 0;
      EFCCL_CUDA_RETURN(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
      if (can == 0)
        return Status::error("device " + std::to_string(from) + " cannot access device " +
                             std::to_string(to) +
                             " directly (peer access); host-staged connections are not "
                             "implemented");
      if (Status s = enable_peer_access(from, to); !s) return s;
    }
  }

  if (Status s = choose_wire_formats(); !s) return s;

  // FIFO layout: per connection, counters then slots in the receiver's arena; head and the
  // sender's position in the sender's arena. A slot holds at least one element of any type.
  // Every connection gets the same slot stride, so that every process of a multi-process
  // executor derives the same layout: an LL128 program's slots are large enough for LL lines
  // unless every connection is known to run LL128 (single process).
  slot_bytes = config.slot_bytes != 0 ? config.slot_bytes : default_slot_bytes(p.protocol);
  flagged = p.protocol != ef::Protocol::kSimple;
  slot_stride = slot_wire_bytes(kWireSimple, slot_bytes);
  if (flagged) {
    const bool all_ll128 =
        !multiprocess && std::all_of(connections.begin(), connections.end(),
                                     [](const ConnectionPlan& c) { return c.wire == kWireLL128; });
    slot_stride = slot_wire_bytes(all_ll128 ? kWireLL128 : kWireLL, slot_bytes);
  }
  const std::size_t fifo_bytes =
      align_up(kSlotsOffset + slot_stride * static_cast<std::size_t>(config.connection_slots),
               kCounterStride);
  // Offsets are per location, in connection order, so that every process of a
  // multi-process executor computes the same layout for every arena.
  std::map<int64_t, std::size_t> fifo_size, counter_size;
  for (int r = 0; r < n; ++r) fifo_size[location[r]] = counter_size[location[r]] = 0;
  for (auto& c : connections) {
    c.recv_offset = fifo_size[location[c.receiver]];
    fifo_size[location[c.receiver]] += fifo_bytes;
    c.send_offset = counter_size[location[c.sender]];
    counter_size[location[c.sender]] += kSendEndBytes;
  }
  for (std::size_t i = 0; i < locals.size(); ++i) {
    const int64_t loc = location[locals[i].ranks.front()];
    if (Status s = locals[i].fifo_arena.allocate(locals[i].device, fifo_size[loc]); !s) return s;
    if (Status s = locals[i].counter_arena.allocate(locals[i].device, counter_size[loc]); !s)
      return s;
    fifo_base[loc] = locals[i].fifo_arena.get();
    counter_base[loc] = locals[i].counter_arena.get();
  }
  if (Status s = write_first_positions(); !s) return s;
  if (multiprocess)
    if (Status s = share_arenas(fifo_size, counter_size); !s) return s;

  // Host-mapped stop signals and error records.
  if (Status s = host_mapped.allocate(align_up(sizeof(StopSignals), 64) +
                                      locals.size() * sizeof(ErrorRecord));
      !s)
    return s;

  // premul flags for the modes the program allows.
  std::optional<ef::PremulMap> outofplace_map, inplace_map;
  if (p.outofplace) outofplace_map = ef::analyze_premul(p, /*inplace=*/false);
  if (p.inplace) inplace_map = ef::analyze_premul(p, /*inplace=*/true);
  if (outofplace_map) premul_mixed[0] = ef::describe_mixed_operand(p, *outofplace_map, false);
  if (inplace_map) premul_mixed[1] = ef::describe_mixed_operand(p, *inplace_map, true);

  for (std::size_t i = 0; i < locals.size(); ++i) {
    if (Status s = build_device(locals[i], connections, outofplace_map ? &*outofplace_map : nullptr,
                                inplace_map ? &*inplace_map : nullptr);
        !s)
      return s;
    locals[i].private_memory.resize(locals[i].ranks.size());
  }
  return Status::ok();
}

/// ExecutorConfig::first_position into the counters this process owns: tail and the pop
/// position at receivers, head and the push position at senders.
Status DeviceExecutor::Impl::write_first_positions() {
  if (config.first_position == 0) return Status::ok();
  for (const ConnectionPlan& c : connections) {
    for (const bool receiving : {true, false}) {
      const int rank = receiving ? c.receiver : c.sender;
      if (!local_rank[rank]) continue;
      LocalDevice& local = locals[rank_local_device[rank]];
      char* at = receiving ? local.fifo_arena.get() + c.recv_offset
                           : local.counter_arena.get() + c.send_offset;
      const std::size_t offsets[2] = {receiving ? kTailOffset : kHeadOffset,
                                      receiving ? kRecvPositionOffset : kSendPositionOffset};
      DeviceScope scope(local.device);
      cudaStream_t stream = nullptr;
      EFCCL_CUDA_RETURN(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                        "cudaStreamCreate");
      cudaError_t e = cudaSuccess;
      for (std::size_t offset : offsets)
        if (e == cudaSuccess)
          e = cudaMemcpyAsync(at + offset, &config.first_position, sizeof(uint64_t),
                              cudaMemcpyHostToDevice, stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
      EFCCL_CUDA_RETURN(e, "writing the first connection positions");
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Multi-process: arenas shared through CUDA IPC

namespace {

constexpr char kArenaBlobMagic[4] = {'E', 'F', 'A', '1'};

/// One process's arenas, as exchanged.
struct SharedArena {
  int64_t location = 0;
  uint64_t fifo_bytes = 0, counter_bytes = 0;
  char bus_id[32] = {};  ///< the owning GPU's PCI bus id
  cudaIpcMemHandle_t fifo{}, counter{};
};

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

/// Reads a T at `*pos`, advancing it; false when the blob is too short.
template <typename T>
bool take(const std::string& in, std::size_t* pos, T* v) {
  if (*pos > in.size() || in.size() - *pos < sizeof(T)) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

Status parse_arenas(const std::string& blob, std::string* fingerprint,
                    std::vector<SharedArena>* arenas) {
  std::size_t pos = 0;
  char magic[4];
  uint32_t fp_size = 0, count = 0;
  if (!take(blob, &pos, &magic) || std::memcmp(magic, kArenaBlobMagic, 4) != 0)
    return Status::error("not an efccl arena description (bad magic)");
  if (!take(blob, &pos, &fp_size) || blob.size() - pos < fp_size)
    return Status::error("truncated arena description (fingerprint)");
  fingerprint->assign(blob.data() + pos, fp_size);
  pos += fp_size;
  if (!take(blob, &pos, &count) || count > 4096)
    return Status::error("arena description lists a bad number of arenas");
  for (uint32_t i = 0; i < count; ++i) {
    SharedArena a;
    if (!take(blob, &pos, &a)) return Status::error("truncated arena description");
    a.bus_id[sizeof(a.bus_id) - 1] = '\0';
    arenas->push_back(a);
  }
  if (pos != blob.size()) return Status::error("arena description has trailing bytes");
  return Status::ok();
}

}  // namespace

Status DeviceExecutor::Impl::share_arenas(const std::map<int64_t, std::size_t>& fifo_size,
                                          const std::map<int64_t, std::size_t>& counter_size) {
  std::string mine(kArenaBlobMagic, 4);
  put(mine, static_cast<uint32_t>(fingerprint.size()));
  mine += fingerprint;
  put(mine, static_cast<uint32_t>(locals.size()));
  for (LocalDevice& local : locals) {
    SharedArena a;
    a.location = location[local.ranks.front()];
    a.fifo_bytes = fifo_size.at(a.location);
    a.counter_bytes = counter_size.at(a.location);
    EFCCL_CUDA_RETURN(cudaDeviceGetPCIBusId(a.bus_id, sizeof(a.bus_id) - 1, local.device),
                      "cudaDeviceGetPCIBusId");
    DeviceScope scope(local.device);
    EFCCL_CUDA_RETURN(cudaIpcGetMemHandle(&a.fifo, local.fifo_arena.get()),
                      "cudaIpcGetMemHandle (FIFO arena, device " + std::to_string(local.device) + ")");
    EFCCL_CUDA_RETURN(cudaIpcGetMemHandle(&a.counter, local.counter_arena.get()),
                      "cudaIpcGetMemHandle (counter arena)");
    put(mine, a);
  }
  // The arenas are zero already (DeviceBuffer::allocate waits for that), before any peer can
  // write into them. No device-wide sync here: it would wait for this process's earlier,
  // possibly still spinning, kernels.

  StatusOr<std::vector<std::string>> all = exchange(mine);
  if (!all) return Status::error("exchanging connection memory with the other processes: " +
                                 all.status().message());
  const int n = program.nranks;
  if (all->size() != static_cast<std::size_t>(n))
    return Status::error("the exchange returned " + std::to_string(all->size()) +
                         " descriptions for " + std::to_string(n) + " ranks");

  // Remote locations this process talks to, and the local devices that talk to each.
  std::map<int64_t, std::set<int>> needed;
  for (int r = 0; r < n; ++r) {
    if (!local_rank[r]) continue;
    for (const auto& tb : program.ranks[r].threadblocks)
      for (int peer : {tb.send_peer, tb.recv_peer})
        if (peer >= 0 && !local_rank[peer]) needed[location[peer]].insert(rank_devices[r]);
  }
  std::map<int64_t, SharedArena> remote;
  for (int r = 0; r < n; ++r) {
    if (local_rank[r] || !needed.count(location[r]) || remote.count(location[r])) continue;
    std::string theirs;
    std::vector<SharedArena> arenas;
    if (Status s = parse_arenas((*all)[r], &theirs, &arenas); !s)
      return Status::error("rank " + std::to_string(r) + "'s process sent a bad description: " +
                           s.message());
    if (theirs != fingerprint)
      return Status::error("rank " + std::to_string(r) + " runs a different program or call (" +
                           theirs + ") than this process (" + fingerprint +
                           "): every rank must make the same collective calls in the same order, "
                           "with the same count, datatype, operator and root");
    for (const SharedArena& a : arenas) {
      if (a.location != location[r]) continue;
      if (a.fifo_bytes != fifo_size.at(a.location) || a.counter_bytes != counter_size.at(a.location))
        return Status::error("rank " + std::to_string(r) + "'s process laid out its connection " +
                             "memory differently (" + std::to_string(a.fifo_bytes) + " FIFO bytes, " +
                             "expected " + std::to_string(fifo_size.at(a.location)) + ")");
      remote[a.location] = a;
    }
    if (!remote.count(location[r]))
      return Status::error("rank " + std::to_string(r) + "'s process did not describe its arena");
  }
  for (auto& [loc, a] : remote) {
    int owner = -1;
    if (cudaDeviceGetByPCIBusId(&owner, a.bus_id) != cudaSuccess) {
      (void)cudaGetLastError();  // not visible here (e.g. CUDA_VISIBLE_DEVICES): IPC still maps it
      owner = -1;
    }
    for (int opener : needed[loc]) {
    if (owner >= 0 && owner != opener)
      if (Status s = enable_peer_access(opener, owner); !s) return s;
    DeviceScope scope(opener);
    void* fifo = nullptr;
    void* counters = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&fifo, a.fifo, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      return cuda_error("cudaIpcOpenMemHandle of the FIFO memory of GPU " + std::string(a.bus_id) +
                        " (another process) on device " + std::to_string(opener),
                        e);
    opened.emplace_back(opener, fifo);
    e = cudaIpcOpenMemHandle(&counters, a.counter, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      return cuda_error("cudaIpcOpenMemHandle of the counter memory of GPU " +
                            std::string(a.bus_id) + " on device " + std::to_string(opener),
                        e);
    opened.emplace_back(opener, counters);
    remote_fifo_base[{loc, opener}] = static_cast<char*>(fifo);
    remote_counter_base[{loc, opener}] = static_cast<char*>(counters);
    }
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::build_device(LocalDevice& local,
                                          const std::vector<ConnectionPlan>& connections,
                                          const ef::PremulMap* outofplace,
                                          const ef::PremulMap* inplace) {
  const ef::Program& p = program;
  const std::size_t local_index = &local - locals.data();

  // Connection tables, and each threadblock's entries in them.
  std::vector<SendConnection> sends;
  std::vector<RecvConnection> recvs;
  std::map<std::pair<int, int>, int> send_of, recv_of;  // (rank, tb) -> table index
  for (const auto& c : connections) {
    const int sd = rank_local_device[c.sender];
    const int rd = rank_local_device[c.receiver];
    if (sd != static_cast<int>(local_index) && rd != static_cast<int>(local_index)) continue;
    const auto base = [&](const std::map<int64_t, char*>& own,
                          const std::map<std::pair<int64_t, int>, char*>& remote, int rank) {
      return local_rank[rank] ? own.at(location[rank]) : remote.at({location[rank], local.device});
    };
    char* fifo = base(fifo_base, remote_fifo_base, c.receiver) + c.recv_offset;
    char* counters = base(counter_base, remote_counter_base, c.sender) + c.send_offset;
    if (sd == static_cast<int>(local_index)) {
      SendConnection s{};
      s.slots = fifo + kSlotsOffset;
      s.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
      s.head = reinterpret_cast<uint64_t*>(counters + kHeadOffset);
      s.position = reinterpret_cast<uint64_t*>(counters + kSendPositionOffset);
      s.slot_stride = slot_stride;
      s.nslots = static_cast<uint32_t>(config.connection_slots);
      s.peer = c.receiver;
      s.channel = c.channel;
      s.wire = c.wire;
      send_of[{c.sender, c.send_tb}] = static_cast<int>(sends.size());
      sends.push_back(s);
    }
    if (rd == static_cast<int>(local_index)) {
      RecvConnection r{};
      r.slots = fifo + kSlotsOffset;
      r.tail = reinterpret_cast<uint64_t*>(fifo + kTailOffset);
      r.head = reinterpret_cast<uint64_t*>(counters + kHeadOffset);
      r.position = reinterpret_cast<uint64_t*>(fifo + kRecvPositionOffset);
      r.slot_stride = slot_stride;
      r.nslots = static_cast<uint32_t>(config.connection_slots);
      r.peer = c.sender;
      r.channel = c.channel;
      r.wire = c.wire;
      recv_of[{c.receiver, c.recv_tb}] = static_cast<int>(recvs.size());
      recvs.push_back(r);
    }
  }

  // Threadblocks, ops, dependencies, flags.
  std::vector<ThreadblockDesc> tbs;
  std::vector<OpDesc> ops;
  std::vector<DepDesc> deps;
  uint64_t nflags = 0;
  for (std::size_t li = 0; li < local.ranks.size(); ++li) {
    const int r = local.ranks[li];
    const auto& rank = p.ranks[r];
    std::vector<uint64_t> flag_base(rank.threadblocks.size());
    std::set<std::pair<int, int>> depended_on;
    for (std::size_t t = 0; t < rank.threadblocks.size(); ++t) {
      flag_base[t] = nflags;
      nflags += rank.threadblocks[t].ops.size();
      for (const auto& op : rank.threadblocks[t].ops)
        for (const auto& d : op.deps) depended_on.insert({d.tb, d.op});
    }
    for (std::size_t t = 0; t < rank.threadblocks.size(); ++t) {
      const auto& tb = rank.threadblocks[t];
      ThreadblockDesc desc{};
      desc.local_rank = static_cast<int32_t>(li);
      desc.rank = r;
      desc.tb = static_cast<int32_t>(t);
      desc.send = tb.send_peer >= 0 ? send_of.at({r, static_cast<int>(t)}) : -1;
      desc.recv = tb.recv_peer >= 0 ? recv_of.at({r, static_cast<int>(t)}) : -1;
      desc.op_begin = static_cast<uint32_t>(ops.size());
      desc.op_count = static_cast<uint32_t>(tb.ops.size());
      desc.flag_begin = static_cast<uint32_t>(flag_base[t]);
      desc.dep_begin = static_cast<uint32_t>(deps.size());
      for (std::size_t o = 0; o < tb.ops.size(); ++o) {
        const ef::Op& op = tb.ops[o];
        OpDesc od{};
        od.code = static_cast<uint8_t>(op.code);
        od.count = op.code == ef::OpCode::kNop ? 0 : op.count;
        if (op.src) {
          od.src_buffer = static_cast<uint8_t>(op.src->buffer);
          od.src_chunk = op.src->offset;
        }
        if (op.dst) {
          od.dst_buffer = static_cast<uint8_t>(op.dst->buffer);
          od.dst_chunk = op.dst->offset;
        }
        auto bits = [&](const ef::PremulMap* map) {
          if (map == nullptr) return 0;
          const ef::PremulFlags& f = (*map)[r][t][o];
          return (f.src ? kPremulSrc : 0) | (f.dst ? kPremulDst : 0);
        };
        od.premul = static_cast<uint8_t>((bits(outofplace) << kPremulShiftOutOfPlace) |
                                         (bits(inplace) << kPremulShiftInPlace));
        od.publishes = depended_on.count({static_cast<int>(t), static_cast<int>(o)}) ? 1 : 0;
        od.dep_begin = static_cast<uint32_t>(deps.size());
        od.dep_count = static_cast<uint32_t>(op.deps.size());
        for (const auto& d : op.deps)
          deps.push_back({static_cast<uint32_t>(flag_base[d.tb] + d.op), d.tb, d.op});
        ops.push_back(od);
      }
      desc.dep_count = static_cast<uint32_t>(deps.size()) - desc.dep_begin;
      tbs.push_back(desc);
    }
  }
  if (ops.size() > std::numeric_limits<uint32_t>::max() / 2 ||
      nflags > std::numeric_limits<uint32_t>::max() / 2 ||
      deps.size() > std::numeric_limits<uint32_t>::max() / 2)
    return Status::error("program too large for one launch on device " +
                         std::to_string(local.device));
  local.nblocks = static_cast<uint32_t>(tbs.size());
  if (local.nblocks > static_cast<uint32_t>(std::numeric_limits<int>::max()))
    return Status::error("too many threadblocks for one launch");

  // Integer avg's result regions, in chunks of the API output (host executor's rule).
  std::vector<DivideSegment> segments;
  const int64_t c = p.nchunksperloop;
  for (std::size_t li = 0; li < local.ranks.size(); ++li) {
    const int r = local.ranks[li];
    const auto add = [&](int64_t first, int64_t chunks) {
      segments.push_back({static_cast<int32_t>(li), 0, first, chunks});
    };
    switch (p.collective) {
      case ef::Collective::kAllReduce:
        add(0, c);
        break;
      case ef::Collective::kReduceScatter:
        add(0, c / p.nranks);
        break;
      case ef::Collective::kReduce:
        if (r == p.root) add(0, c);
        break;
      case ef::Collective::kCustom: {
        std::set<int64_t> chunks;  // each named chunk once
        for (const ef::Postcondition& pc : p.postconditions)
          if (pc.rank == r && pc.index >= 0 && pc.index < p.ranks[r].output_chunks)
            chunks.insert(pc.index);
        for (int64_t k : chunks) add(k, 1);
        break;
      }
      default:
        break;  // collectives without a reduction ignore the operator
    }
  }
  local.ndivide_segments = static_cast<uint32_t>(segments.size());
  for (const auto& seg : segments)
    local.largest_divide_chunks = std::max(local.largest_divide_chunks, seg.chunks);

  const int d = local.device;
  if (Status s = local.divide_segments.upload(d, segments); !s) return s;
  if (Status s = local.threadblocks.upload(d, tbs); !s) return s;
  if (Status s = local.ops.upload(d, ops); !s) return s;
  if (Status s = local.deps.upload(d, deps); !s) return s;
  if (Status s = local.sends.upload(d, sends); !s) return s;
  if (Status s = local.recvs.upload(d, recvs); !s) return s;
  if (Status s = local.flags.allocate(d, nflags * sizeof(uint64_t)); !s) return s;
  if (Status s = local.state.allocate(d, sizeof(LaunchState)); !s) return s;
  if (Status s = local.epochs.allocate(d, tbs.size() * sizeof(uint64_t)); !s) return s;
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Executor-owned buffers

std::size_t DeviceExecutor::Impl::private_bytes(int r, uint64_t chunk_elements, uint64_t count,
                                                std::size_t element_size) const {
  const ef::Rank& rank = program.ranks[r];
  // Program buffers larger than what the API provides for the rank (e.g. a non-root output of
  // reduce) live here, after the scratch buffer; each part 256-byte aligned.
  const uint64_t in = static_cast<uint64_t>(rank.input_chunks) * chunk_elements;
  const uint64_t out = static_cast<uint64_t>(rank.output_chunks) * chunk_elements;
  std::size_t bytes =
      align_up(static_cast<uint64_t>(rank.scratch_chunks) * chunk_elements * element_size, 256);
  if (in > 0 && ef::api_input_elements(program, r, count) == 0)
    bytes += align_up(in * element_size, 256);
  if (out > 0 && ef::api_output_elements(program, r, count) == 0)
    bytes += align_up(out * element_size, 256);
  return bytes;
}

Status DeviceExecutor::Impl::ensure_private_memory(uint64_t chunk_elements,
                                                   std::size_t element_size,
                                                   std::size_t at_least) {
  const uint64_t count_total = chunk_elements * static_cast<uint64_t>(program.nchunksperloop);
  const uint64_t count = ef::count_is_per_block(program.collective)
                             ? count_total / static_cast<uint64_t>(program.nranks)
                             : count_total;
  for (std::size_t i = 0; i < locals.size(); ++i) {
    LocalDevice& local = locals[i];
    for (std::size_t li = 0; li < local.ranks.size(); ++li) {
      const std::size_t need = std::max(
          at_least, private_bytes(local.ranks[li], chunk_elements, count, element_size));
      if (need <= local.private_memory[li].bytes()) continue;
      // Also during a capture: the allocation is not captured, and graphs captured before keep
      // the old buffer (retired, freed with the executor).
      RelaxedCaptureMode relaxed;
      DeviceBuffer grown;
      if (Status s = grown.allocate(local.device, need); !s)
        return Status::error("growing the scratch of rank " + std::to_string(local.ranks[li]) +
                             " to " + std::to_string(need) + " bytes: " + s.message());
      local.retired.push_back(std::move(local.private_memory[li]));
      local.private_memory[li] = std::move(grown);
    }
  }
  return Status::ok();
}

Status DeviceExecutor::reserve(uint64_t count, ef::DataType dtype) {
  const auto b = ef::chunk_elements(impl_->program, count);
  if (!b)
    return Status::error("count " + std::to_string(count) + " is not a multiple of " +
                         std::to_string(ef::count_granularity(impl_->program)));
  return impl_->ensure_private_memory(*b, ef::size_of(dtype));
}

// ---------------------------------------------------------------------------------------------
// Launch

Status DeviceExecutor::Impl::choose_threads(LocalDevice& local, int dtype, int reduction,
                                            int* threads) {
  int& chosen = local.threads[dtype][reduction];
  if (chosen == 0) {
    DeviceScope scope(local.device);
    chosen = -1;
    for (int t = config.max_threads_per_block; t >= 64; t /= 2) {
      int per_sm = 0;
      EFCCL_CUDA_RETURN(interpreter_blocks_per_sm(dtype, reduction, flagged, t, &per_sm),
                        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      local.max_blocks_seen[dtype][reduction] =
          std::max(local.max_blocks_seen[dtype][reduction], per_sm * local.sm_count);
      if (static_cast<int64_t>(per_sm) * local.sm_count >= static_cast<int64_t>(local.nblocks)) {
        chosen = t;
        break;
      }
    }
  }
  if (chosen < 0)
    return Status::error(
        "device " + std::to_string(local.device) + " must run " + std::to_string(local.nblocks) +
        " threadblocks at once (the interpreter's CTAs wait on each other), but at most " +
        std::to_string(local.max_blocks_seen[dtype][reduction]) +
        " fit even with 64 threads per CTA; map fewer ranks to this GPU");
  *threads = chosen;
  return Status::ok();
}

/// Lays rank `local.ranks[local_index]`'s program buffers over the user's, exactly as the host
/// executor does: in-place ranks use the shared region (NCCL's aliasing, checked); otherwise each
/// program buffer is the API buffer, or executor-owned memory where the API has none.
Status DeviceExecutor::Impl::map_buffers(const LocalDevice& local, std::size_t local_index,
                                         const RunArgs& args, uint64_t chunk_elements,
                                         std::size_t size, std::size_t private_offset,
                                         RankCallArgs& out) const {
  const ef::Program& p = program;
  const int r = local.ranks[local_index];
  const ef::Rank& rank = p.ranks[r];
  const auto who = [r] { return "rank " + std::to_string(r) + ": "; };  // errors only
  const uint64_t api[2] = {ef::api_input_elements(p, r, args.count),
                           ef::api_output_elements(p, r, args.count)};
  const uint64_t needed[2] = {static_cast<uint64_t>(rank.input_chunks) * chunk_elements,
                              static_cast<uint64_t>(rank.output_chunks) * chunk_elements};
  char* user[2] = {static_cast<char*>(const_cast<void*>(args.inputs[r])),
                   static_cast<char*>(args.outputs[r])};
  const char* names[2] = {"input", "output"};
  for (int k = 0; k < 2; ++k)
    if (api[k] > 0 && user[k] == nullptr) return Status::error(who() + names[k] + " buffer is null");

  // Executor-owned memory: scratch first, then program buffers the API does not provide.
  char* owned = local.private_memory[local_index].get() + private_offset;
  out.buffers[kBufferScratch] = owned;
  std::size_t used =
      align_up(static_cast<uint64_t>(rank.scratch_chunks) * chunk_elements * size, 256);

  const auto alias = args.inplace ? ef::inplace_alias(p, r, args.count) : std::nullopt;
  if (alias) {
    const uint64_t offset[2] = {alias->input_inside_output ? alias->offset_elements : 0,
                                alias->input_inside_output ? 0 : alias->offset_elements};
    const uint64_t shared = alias->input_inside_output ? std::max(api[1], offset[0] + api[0])
                                                       : std::max(api[0], offset[1] + api[1]);
    char* region = alias->input_inside_output ? user[1] : user[0];
    const int inner = alias->input_inside_output ? 0 : 1;
    if (user[inner] != region + alias->offset_elements * size)
      return Status::error(who() + "in-place call, but the buffers do not alias as NCCL requires (" +
                           names[inner] + " == " + names[1 - inner] + " + " +
                           std::to_string(alias->offset_elements) + " elements)");
    for (int k = 0; k < 2; ++k) {
      if (needed[k] > shared - std::min(shared, offset[k]))
        return Status::error(who() + "the program's " + names[k] + " buffer (" +
                             std::to_string(needed[k]) +
                             " elements) does not fit in the in-place "
                             "region of " +
                             std::to_string(shared) + " elements");
      out.buffers[k] = region + offset[k] * size;
    }
    return Status::ok();
  }
  for (int k = 0; k < 2; ++k) {
    if (needed[k] <= api[k]) {
      out.buffers[k] = user[k];
    } else if (api[k] == 0) {
      out.buffers[k] = owned + used;  // e.g. the output of a non-root rank of reduce
      used += align_up(needed[k] * size, 256);
    } else {
      return Status::error(who() + "the program's " + names[k] + " buffer has " +
                           std::to_string(needed[k]) + " elements but the API's has " +
                           std::to_string(api[k]));
    }
  }
  return Status::ok();
}

namespace {
std::atomic<uint64_t> g_interpreter_launches{0};
}  // namespace

uint64_t interpreter_launch_count() {
  return g_interpreter_launches.load(std::memory_order_relaxed);
}

/// One device's launch of one prepared call.
struct PreparedPart {
  std::size_t device_index = 0;  ///< into Impl::locals
  cudaStream_t stream = nullptr;
  bool eager = true;             ///< the stream is not being captured
  unsigned long long capture_id = 0;  ///< the stream's capture when not eager
  int threads = 0;               ///< the one-call kernel's CTA size (choose_threads)
  CallParams call{};
  std::vector<RankCallArgs> ranks;  ///< per local rank of the device
  DivideParams divide{};
  bool integer_avg = false;
};

/// A call checked and turned into per-device kernel parameters, ready to launch.
struct PreparedCall {
  DeviceExecutor* executor = nullptr;
  int dtype = 0;
  int reduction = kReduceSum;
  std::vector<PreparedPart> parts;  ///< empty: nothing to run (a zero-element chunk)
};

std::size_t DeviceExecutor::Impl::largest_private_bytes(const RunArgs& args) const {
  const auto chunk = ef::chunk_elements(program, args.count);
  if (!chunk) return 0;  // check_call reports it
  std::size_t largest = 0;
  for (const LocalDevice& local : locals)
    for (int r : local.ranks)
      largest = std::max(largest, private_bytes(r, *chunk, args.count, ef::size_of(args.dtype)));
  return largest;
}

Status DeviceExecutor::Impl::prepare(DeviceExecutor* self, const RunArgs& args,
                                     const PrivateUse& use, PreparedCall* out) {
  const ef::Program& p = program;
  const int n = p.nranks;
  out->executor = self;
  out->parts.clear();
  if (Status s = ef::check_call(p, args.count, args.dtype, args.op, args.inplace,
                               args.premul_scalars.size());
      !s)
    return s;
  const int dtype = static_cast<int>(args.dtype);
  if (args.timeout.count() <= 0) return Status::error("timeout must be positive");
  if (args.inputs.size() != static_cast<std::size_t>(n) ||
      args.outputs.size() != static_cast<std::size_t>(n))
    return Status::error("inputs and outputs need one entry per rank (" + std::to_string(n) + ")");
  if (args.streams.size() != devices.size())
    return Status::error("streams needs one entry per device of devices() (" +
                         std::to_string(devices.size()) + ")");
  const auto chunk = ef::chunk_elements(p, args.count);
  const uint64_t b = *chunk;
  if (b == 0) return Status::ok();  // nothing runs (§5)
  const std::size_t size = ef::size_of(args.dtype);
  if (b > std::numeric_limits<uint64_t>::max() / size / static_cast<uint64_t>(p.nchunksperloop) / 2)
    return Status::error("count " + std::to_string(args.count) + " overflows the buffer size");
  const uint64_t tile = std::max<uint64_t>(1, slot_bytes / size);
  const uint64_t iterations = (b + tile - 1) / tile;
  if (iterations >= std::numeric_limits<uint32_t>::max())
    return Status::error("too many tiles per chunk (" + std::to_string(iterations) + ")");

  if (Status s = ensure_private_memory(b, size, use.instances * use.stride); !s)
    return s;

  // Collectives that only move data ignore the operator (as the host executor does).
  const bool reduces = ef::collective_reduces(p.collective);
  const bool integer_avg = reduces && args.op == ef::RedOp::kAvg && is_integer(args.dtype);
  const bool premul = reduces && (args.op == ef::RedOp::kPreMulSum ||
                                  (args.op == ef::RedOp::kAvg && !is_integer(args.dtype)));
  if (premul && !premul_mixed[args.inplace ? 1 : 0].empty())
    return Status::error(premul_mixed[args.inplace ? 1 : 0]);
  int reduction = kReduceSum;
  if (args.op == ef::RedOp::kProd) reduction = kReduceProd;
  if (args.op == ef::RedOp::kMin) reduction = kReduceMin;
  if (args.op == ef::RedOp::kMax) reduction = kReduceMax;
  out->dtype = dtype;
  out->reduction = reduction;

  out->parts.resize(locals.size());
  for (std::size_t di = 0; di < locals.size(); ++di) {
    LocalDevice& local = locals[di];
    PreparedPart& part = out->parts[di];
    part.device_index = di;
    part.stream = args.streams[di];
    if (Status s = choose_threads(local, dtype, reduction, &part.threads); !s) return s;
    {
      DeviceScope scope(local.device);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      EFCCL_CUDA_RETURN(cudaStreamGetCaptureInfo(part.stream, &capture, &part.capture_id),
                        "cudaStreamGetCaptureInfo");
      if (capture == cudaStreamCaptureStatusInvalidated)
        return Status::error("the launch stream's CUDA graph capture has been invalidated");
      part.eager = capture == cudaStreamCaptureStatusNone;
    }

    CallParams& params = part.call;
    params.threadblocks = local.threadblocks.get<ThreadblockDesc>();
    params.ops = local.ops.get<OpDesc>();
    params.deps = local.deps.get<DepDesc>();
    params.flags = local.flags.get<uint64_t>();
    params.sends = local.sends.get<SendConnection>();
    params.recvs = local.recvs.get<RecvConnection>();
    params.state = local.state.get<LaunchState>();
    params.epochs = local.epochs.get<uint64_t>();
    params.error = record(di);
    params.signals = signals();
    params.chunk_elements = b;
    params.tile_elements = tile;
    params.iterations = iterations;
    params.timeout_ns = static_cast<uint64_t>(args.timeout.count());
    params.premul_shift = args.inplace ? kPremulShiftInPlace : kPremulShiftOutOfPlace;
    params.premul = premul ? 1 : 0;

    DivideParams& divide = part.divide;
    divide.segments = local.divide_segments.get<DivideSegment>();
    divide.nsegments = local.ndivide_segments;
    divide.chunk_elements = b;
    divide.largest_segment_elements = static_cast<uint64_t>(local.largest_divide_chunks) * b;
    divide.divisor = static_cast<uint64_t>(n);
    part.integer_avg = integer_avg;
    part.ranks.assign(local.ranks.size(), RankCallArgs{});
    for (std::size_t li = 0; li < local.ranks.size(); ++li) {
      const int r = local.ranks[li];
      RankCallArgs& ra = part.ranks[li];
      if (Status st = map_buffers(local, li, args, b, size, use.offset, ra); !st) return st;

      double scalar = 1.0;
      if (args.op == ef::RedOp::kPreMulSum && !args.premul_scalars.empty())
        scalar = args.premul_scalars[r];
      if (args.op == ef::RedOp::kAvg) scalar = 1.0 / static_cast<double>(n);
      ra.scalar_f64 = scalar;
      ra.scalar_f32 = static_cast<float>(scalar);
      ra.scalar_i64 = integer_scalar(scalar);

      divide.outputs[li] = static_cast<char*>(args.outputs[r]);
    }
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::order_after_last_launch(PreparedPart& part) {
  LocalDevice& local = locals[part.device_index];
  // Two launches of one executor share FIFOs, flags and launch counts: a launch on another
  // stream than the previous one waits for it. Eagerly, for the previous eager launch; within
  // one capture, for the previous launch captured in it (different graphs are ordered by
  // whoever replays them).
  if (part.eager && local.launched_before && local.last_stream != part.stream) {
    auto event = local.last_launch->get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaStreamWaitEvent(part.stream, *event, 0), "cudaStreamWaitEvent");
  }
  if (!part.eager && local.captured_before && local.last_capture_id == part.capture_id &&
      local.last_captured_stream != part.stream) {
    auto event = local.last_captured_launch.get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaStreamWaitEvent(part.stream, *event, 0),
                      "cudaStreamWaitEvent (ordering two captured launches of one program)");
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::after_launch(PreparedPart& part, int dtype,
                                          const std::shared_ptr<DeviceEvent>* recorded) {
  LocalDevice& local = locals[part.device_index];
  if (part.integer_avg && recorded == nullptr)
    EFCCL_CUDA_RETURN(launch_divide(part.divide, dtype, part.stream),
                      "launching avg's division on device " + std::to_string(local.device));
  if (part.eager) {
    if (recorded != nullptr) {
      local.last_launch = *recorded;
    } else {
      auto event = LaunchEvents::acquire(local.device);
      if (!event) return event.status();
      auto e = (*event)->get(local.device);
      if (!e) return e.status();
      EFCCL_CUDA_RETURN(cudaEventRecord(*e, part.stream), "cudaEventRecord");
      local.last_launch = std::move(*event);
    }
    local.last_stream = part.stream;
    local.launched_before = true;
  } else {
    auto event = local.last_captured_launch.get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaEventRecord(*event, part.stream), "cudaEventRecord (captured)");
    local.last_captured_stream = part.stream;
    local.last_capture_id = part.capture_id;
    local.captured_before = true;
  }
  return Status::ok();
}

Status DeviceExecutor::Impl::launch_part(PreparedPart& part, int dtype, int reduction) {
  LocalDevice& local = locals[part.device_index];
  KernelParams params{};
  static_cast<CallParams&>(params) = part.call;
  std::copy(part.ranks.begin(), part.ranks.end(), params.ranks);
  DeviceScope scope(local.device);
  if (Status s = order_after_last_launch(part); !s) return s;
  EFCCL_CUDA_RETURN(launch_interpreter(params, dtype, reduction, flagged,
                                       static_cast<int>(local.nblocks), part.threads, part.stream),
                    "launching the interpreter on device " + std::to_string(local.device));
  g_interpreter_launches.fetch_add(1, std::memory_order_relaxed);
  return after_launch(part, dtype);
}

Status DeviceExecutor::run(const RunArgs& args) {
  Impl& m = *impl_;
  if (Status s = error_status(); !s)
    return Status::error("executor stopped by an earlier failure (call reset()): " + s.message());
  PreparedCall call;
  if (Status s = m.prepare(this, args, Impl::PrivateUse{}, &call); !s) return s;
  // A device whose launch fails after others started would leave those spinning until the
  // timeout: stop them at once instead.
  std::size_t launched = 0;
  for (PreparedPart& part : call.parts) {
    if (Status s = m.launch_part(part, call.dtype, call.reduction); !s) {
      if (launched > 0) abort();
      return s;
    }
    ++launched;
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Batches

namespace {

/// Occupancy of the fused kernel per (device, dtype, reduction, threads), queried once.
StatusOr<int> fused_capacity(int device, int sm_count, int dtype, int reduction, int threads) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(device, dtype, reduction, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  DeviceScope scope(device);
  EFCCL_CUDA_RETURN(fused_blocks_per_sm(dtype, reduction, threads, &per_sm),
                    "cudaOccupancyMaxActiveBlocksPerMultiprocessor (fused kernel)");
  return cache[key] = per_sm * sm_count;
}

/// Calls waiting to be launched on one (device, stream): consecutive parts of one kernel.
struct PendingLaunch {
  std::size_t first_call = 0;  ///< batch index of its first call (launches go out in call order)
  int device = 0;
  cudaStream_t stream = nullptr;
  int dtype = 0, reduction = 0;
  std::size_t ranks = 0;
  std::vector<std::pair<PreparedCall*, PreparedPart*>> parts;
};

}  // namespace

Status DeviceExecutor::Impl::launch_fused_parts(
    int device, int sm_count, cudaStream_t stream, int dtype, int reduction,
    const std::vector<std::pair<PreparedCall*, PreparedPart*>>& parts, uint32_t max_ctas,
    BatchReport* report) {
  int threads = kMaxThreadsPerBlock;
  uint32_t widest = 0;
  for (const auto& [call, part] : parts) {
    threads = std::min(threads, part->threads);
    widest = std::max(widest, call->executor->impl_->locals[part->device_index].nblocks);
  }
  int capacity = 0;
  for (; threads >= 64; threads /= 2) {
    auto c = fused_capacity(device, sm_count, dtype, reduction, threads);
    if (!c) return c.status();
    capacity = *c;
    if (static_cast<uint32_t>(capacity) >= widest) break;
  }
  if (threads < 64 || static_cast<uint32_t>(capacity) < widest) {
    // The fused kernel's grid cannot hold the widest call: launch them one by one.
    for (const auto& [call, part] : parts) {
      if (Status s = call->executor->impl_->launch_part(*part, dtype, reduction); !s) return s;
      ++report->launches;
    }
    return Status::ok();
  }

  if (max_ctas >= widest) capacity = std::min(capacity, static_cast<int>(max_ctas));
  // Placement: calls side by side while they fit, then again from CTA 0; every use of an
  // executor on the CTAs of its first (fused_kernel.cu).
  FusedParams params{};
  std::map<const Impl*, uint32_t> placed;
  uint32_t offset = 0, grid = 0;
  for (const auto& [call, part] : parts) {
    Impl& m = *call->executor->impl_;
    const uint32_t ntb = m.locals[part->device_index].nblocks;
    uint32_t begin = 0;
    if (auto it = placed.find(&m); it != placed.end()) {
      begin = it->second;
    } else {
      if (offset + ntb > static_cast<uint32_t>(capacity)) offset = 0;
      begin = offset;
      offset += ntb;
      placed.emplace(&m, begin);
    }
    FusedCall& fc = params.calls[params.ncalls];
    static_cast<CallParams&>(fc) = part->call;
    fc.cta_begin = begin;
    fc.nthreadblocks = ntb;
    fc.rank_begin = 0;
    fc.flagged = m.flagged ? 1 : 0;
    grid = std::max(grid, begin + ntb);
    ++params.ncalls;
  }
  uint32_t rank_cursor = 0;
  for (uint32_t i = 0; i < params.ncalls; ++i) {
    const PreparedPart& part = *parts[i].second;
    params.calls[i].rank_begin = rank_cursor;
    std::copy(part.ranks.begin(), part.ranks.end(), params.ranks + rank_cursor);
    rank_cursor += static_cast<uint32_t>(part.ranks.size());
  }

  DeviceScope scope(device);
  for (const auto& [call, part] : parts)
    if (Status s = call->executor->impl_->order_after_last_launch(*part); !s) return s;
  EFCCL_CUDA_RETURN(launch_fused(params, dtype, reduction, static_cast<int>(grid), threads, stream),
                    "launching the fused interpreter (" + std::to_string(parts.size()) +
                        " calls) on device " + std::to_string(device));
  g_interpreter_launches.fetch_add(1, std::memory_order_relaxed);
  ++report->launches;
  report->fused_calls += parts.size();
  // Eagerly (the parts share the stream, so all or none are captured): the divisions, then one
  // event after the whole launch for every executor in it.
  if (parts.front().second->eager) {
    for (const auto& [call, part] : parts)
      if (part->integer_avg)
        EFCCL_CUDA_RETURN(launch_divide(part->divide, call->dtype, stream),
                          "launching avg's division on device " + std::to_string(device));
    auto event = LaunchEvents::acquire(device);
    if (!event) return event.status();
    auto e = (*event)->get(device);
    if (!e) return e.status();
    EFCCL_CUDA_RETURN(cudaEventRecord(*e, stream), "cudaEventRecord");
    for (const auto& [call, part] : parts)
      if (Status s = call->executor->impl_->after_launch(*part, call->dtype, &*event); !s) return s;
    return Status::ok();
  }
  for (const auto& [call, part] : parts)
    if (Status s = call->executor->impl_->after_launch(*part, call->dtype); !s) return s;
  return Status::ok();
}

Status DeviceExecutor::run_batch(const std::vector<BatchCall>& calls, BatchReport* report,
                                 const BatchOptions& options) {
  BatchReport local_report;
  if (report == nullptr) report = &local_report;
  *report = BatchReport{};
  // Data-movement collectives only copy, so their element type is free: each runs as the
  // kernel of a neighbouring reducing call where its bytes and buffers allow (so that a group
  // mixing them fuses into one launch), else as bytes (one kernel for all of them).
  std::vector<RunArgs> byte_args(calls.size());
  std::vector<const RunArgs*> args(calls.size());
  std::vector<char> moves(calls.size(), 0);  // 1: a data-movement call, now in bytes
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const BatchCall& c = calls[i];
    if (c.executor == nullptr || c.args == nullptr)
      return Status::error("batch call " + std::to_string(i) + " has no executor or arguments");
    if (Status s = c.executor->error_status(); !s)
      return Status::error("executor of batch call " + std::to_string(i) +
                           " stopped by an earlier failure (call reset()): " + s.message());
    args[i] = c.args;
    const ef::Program& p = c.executor->impl_->program;
    if (!ef::collective_reduces(p.collective) &&
        c.args->count <= std::numeric_limits<uint64_t>::max() / ef::size_of(c.args->dtype) &&
        ef::check_call(p, c.args->count, c.args->dtype, c.args->op, c.args->inplace,
                       c.args->premul_scalars.size())) {
      byte_args[i] = *c.args;
      byte_args[i].count = c.args->count * ef::size_of(c.args->dtype);
      byte_args[i].dtype = ef::DataType::kInt8;
      byte_args[i].op = ef::RedOp::kSum;
      args[i] = &byte_args[i];
      moves[i] = 1;
    }
  }
  // The kernel a call's arguments select: (datatype, operator as the kernel reduces).
  const auto kernel_of = [](const RunArgs& a) {
    ef::RedOp op = a.op;
    if (op == ef::RedOp::kAvg || op == ef::RedOp::kPreMulSum) op = ef::RedOp::kSum;
    return std::pair<ef::DataType, ef::RedOp>{a.dtype, op};
  };
  // Re-expresses data-movement call i (in bytes) in `kernel` when the bytes divide into its
  // elements, the program's granularity holds and every buffer is aligned to an element.
  const auto adopt = [&](std::size_t i, std::pair<ef::DataType, ef::RedOp> kernel) {
    const std::size_t size = ef::size_of(kernel.first);
    const RunArgs& b = byte_args[i];
    if (size == 1 || b.count % size != 0) return false;
    // Tiles of slot_bytes / size elements carry the same bytes as in int8 only when the slot
    // divides (across processes, a peer may have kept bytes for its own pointers' sake).
    if (calls[i].executor->impl_->slot_bytes % size != 0) return false;
    const ef::Program& p = calls[i].executor->impl_->program;
    if (!ef::check_call(p, b.count / size, kernel.first, kernel.second, b.inplace, 0)) return false;
    const auto aligned = [size](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % size == 0; };
    if (!std::all_of(b.inputs.begin(), b.inputs.end(), aligned) ||
        !std::all_of(b.outputs.begin(), b.outputs.end(), aligned))
      return false;
    // The adopted kernel's CTAs must all be co-resident too (a wider type's kernel may need
    // more registers than the bytes kernel): otherwise keep bytes rather than fail the batch.
    Impl& m = *calls[i].executor->impl_;
    int reduction = kReduceSum;
    if (kernel.second == ef::RedOp::kProd) reduction = kReduceProd;
    if (kernel.second == ef::RedOp::kMin) reduction = kReduceMin;
    if (kernel.second == ef::RedOp::kMax) reduction = kReduceMax;
    for (LocalDevice& local : m.locals) {
      int threads = 0;
      if (!m.choose_threads(local, static_cast<int>(kernel.first), reduction, &threads)) return false;
    }
    byte_args[i].count = b.count / size;
    byte_args[i].dtype = kernel.first;
    byte_args[i].op = kernel.second;
    return true;
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (!moves[i]) continue;
    // The previous call's kernel (possibly adopted itself), else the next reducing call's.
    bool done = i > 0 && adopt(i, kernel_of(*args[i - 1]));
    for (std::size_t j = i + 1; !done && j < calls.size(); ++j)
      if (!moves[j]) {
        done = adopt(i, kernel_of(*args[j]));
        break;
      }
  }
  std::map<Impl*, Impl::PrivateUse> uses;  // per executor: how many uses, the largest need
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const BatchCall& c = calls[i];
    Impl::PrivateUse& use =
        uses.try_emplace(c.executor->impl_.get(), Impl::PrivateUse{0, 0, 0}).first->second;
    ++use.instances;
    use.stride = std::max(use.stride, align_up(c.executor->impl_->largest_private_bytes(*args[i]), 256));
  }

  std::vector<PreparedCall> prepared(calls.size());
  std::map<Impl*, uint32_t> next_instance;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    Impl* m = calls[i].executor->impl_.get();
    Impl::PrivateUse use = uses[m];
    use.offset = next_instance[m]++ * use.stride;
    if (Status s = m->prepare(calls[i].executor, *args[i], use, &prepared[i]); !s)
      return Status::error("batch call " + std::to_string(i) + " (program '" + m->program.name +
                           "'): " + s.message());
  }

  // Per (device, stream): consecutive parts of one kernel are fused (in call order, at most
  // kMaxFusedCalls calls and kMaxFusedRanks ranks per launch); a part of another kernel
  // launches what is pending first, so every device runs the calls in the batch's order.
  std::map<std::pair<int, cudaStream_t>, PendingLaunch> pending;
  std::map<std::pair<const Impl*, std::size_t>, std::pair<int, cudaStream_t>> waiting_in;
  std::vector<DeviceExecutor*> started;
  const auto flush = [&](PendingLaunch& l) -> Status {
    if (l.parts.empty()) return Status::ok();
    for (const auto& [call, part] : l.parts) {
      waiting_in.erase({call->executor->impl_.get(), part->device_index});
      started.push_back(call->executor);
    }
    Status s = Status::ok();
    if (l.parts.size() == 1) {
      auto [call, part] = l.parts.front();
      s = call->executor->impl_->launch_part(*part, call->dtype, call->reduction);
      if (s) ++report->launches;
    } else {
      const Impl& first = *l.parts.front().first->executor->impl_;
      const int sm_count = first.locals[l.parts.front().second->device_index].sm_count;
      s = Impl::launch_fused_parts(l.device, sm_count, l.stream, l.dtype, l.reduction, l.parts,
                                   options.max_ctas, report);
    }
    l.parts.clear();
    l.ranks = 0;
    return s;
  };
  Status failure = Status::ok();
  for (std::size_t ci = 0; ci < prepared.size(); ++ci) {
    PreparedCall& call = prepared[ci];
    for (PreparedPart& part : call.parts) {
      Impl& m = *call.executor->impl_;
      const int device = m.locals[part.device_index].device;
      const std::pair<int, cudaStream_t> key{device, part.stream};
      // The executor's previous use on this device waits on another stream: launch it first
      // (launches of one executor on different streams are ordered by events).
      if (auto it = waiting_in.find({&m, part.device_index});
          it != waiting_in.end() && it->second != key)
        if (failure = flush(pending[it->second]); !failure) break;
      PendingLaunch& l = pending[key];
      const bool fits = l.parts.size() < static_cast<std::size_t>(kMaxFusedCalls) &&
                        l.ranks + part.ranks.size() <= static_cast<std::size_t>(kMaxFusedRanks);
      if (!l.parts.empty() && (l.dtype != call.dtype || l.reduction != call.reduction || !fits))
        if (failure = flush(l); !failure) break;
      if (l.parts.empty()) l.first_call = ci;
      l.device = device;
      l.stream = part.stream;
      l.dtype = call.dtype;
      l.reduction = call.reduction;
      l.ranks += part.ranks.size();
      l.parts.emplace_back(&call, &part);
      waiting_in[{&m, part.device_index}] = key;
    }
    if (!failure) break;
  }
  if (failure) {
    // What is left, in call order: a later call's launch must not take the GPU before an
    // earlier call's (a fused grid may fill it).
    std::vector<PendingLaunch*> left;
    for (auto& [key, l] : pending)
      if (!l.parts.empty()) left.push_back(&l);
    std::sort(left.begin(), left.end(),
              [](const PendingLaunch* a, const PendingLaunch* b) { return a->first_call < b->first_call; });
    for (PendingLaunch* l : left)
      if (failure = flush(*l); !failure) break;
  }
  if (!failure) {
    // Launches already enqueued would wait for the failed one's peers until their deadline.
    for (DeviceExecutor* e : started) e->abort();
    return failure;
  }
  return Status::ok();
}

Status DeviceExecutor::wait(const RunArgs& args) {
  Impl& m = *impl_;
  if (args.streams.size() != m.devices.size())
    return Status::error("streams needs one entry per device of devices()");
  Status first = Status::ok();
  for (std::size_t i = 0; i < m.devices.size(); ++i) {
    DeviceScope scope(m.devices[i]);
    const cudaError_t e = cudaStreamSynchronize(args.streams[i]);
    if (e != cudaSuccess && first)
      first = cuda_error("cudaStreamSynchronize on device " + std::to_string(m.devices[i]), e);
  }
  if (Status s = error_status(); !s) return s;
  return first;
}

Status DeviceExecutor::run_and_wait(const RunArgs& args) {
  if (Status s = run(args); !s) {
    // A launch may already be in flight on other devices; let it finish (it times out).
    (void)wait(args);
    return s;
  }
  return wait(args);
}

// ---------------------------------------------------------------------------------------------
// Errors, abort, reset

std::string DeviceExecutor::Impl::describe(std::size_t device_index, const ErrorRecord& e) const {
  std::ostringstream o;
  std::string op_name = "?";
  if (e.rank >= 0 && e.rank < program.nranks) {
    const auto& tbs = program.ranks[e.rank].threadblocks;
    if (e.tb >= 0 && static_cast<std::size_t>(e.tb) < tbs.size() && e.op >= 0 &&
        static_cast<std::size_t>(e.op) < tbs[e.tb].ops.size())
      op_name = std::string(ef::to_string(tbs[e.tb].ops[e.op].code));
  }
  if (e.kind == kErrorSkipped) {
    o << "skipped: rank " << e.rank << " threadblock " << e.tb << " on device "
      << devices[device_index]
      << " did not run, because an earlier call of the same fused launch failed on its CTA";
    return o.str();
  }
  o << (e.kind == kErrorAborted ? "aborted" : "timed out") << ": rank " << e.rank << " threadblock "
    << e.tb << " op " << e.op << " (" << op_name << ") iteration " << e.iteration << " on device "
    << devices[device_index] << " waited " << e.waited_ns / 1000000 << " ms for ";
  switch (e.wait) {
    case kWaitData:
      o << "data on connection " << e.peer << "->" << e.rank << " ch " << e.channel;
      break;
    case kWaitSlot:
      o << "a free slot on connection " << e.rank << "->" << e.peer << " ch " << e.channel;
      break;
    case kWaitDependency:
      o << "dependency tb " << e.peer << " op " << e.channel;
      break;
    default:
      o << "nothing";
  }
  return o.str();
}

Status DeviceExecutor::error_status() const {
  const Impl& m = *impl_;
  const ErrorRecord* first = nullptr;
  std::size_t first_device = 0;
  for (std::size_t i = 0; i < m.locals.size(); ++i) {
    ErrorRecord* e = m.record(i);
    if (std::atomic_ref<uint32_t>(e->posted).load(std::memory_order_acquire) == 0) continue;
    if (first == nullptr || e->timestamp_ns < first->timestamp_ns) {
      first = e;
      first_device = i;
    }
  }
  if (first != nullptr) return Status::error(m.describe(first_device, *first));
  if (std::atomic_ref<uint32_t>(m.signals()->abort).load(std::memory_order_acquire) != 0)
    return Status::error("aborted");
  return Status::ok();
}

std::size_t DeviceExecutor::slot_bytes() const { return impl_->slot_bytes; }
std::size_t DeviceExecutor::connection_bytes() const {
  std::size_t most = 0;
  for (const LocalDevice& local : impl_->locals)
    most = std::max(most, local.fifo_arena.bytes() + local.counter_arena.bytes());
  return most;
}
const std::string& DeviceExecutor::protocol_note() const { return impl_->protocol_note; }

Status DeviceExecutor::wait_launches() {
  for (LocalDevice& local : impl_->locals) {
    if (!local.launched_before) continue;
    DeviceScope scope(local.device);
    auto event = local.last_launch->get(local.device);
    if (!event) return event.status();
    EFCCL_CUDA_RETURN(cudaEventSynchronize(*event),
                      "waiting for the launches on device " + std::to_string(local.device));
  }
  return Status::ok();
}

void DeviceExecutor::abort() {
  std::atomic_ref<uint32_t>(impl_->signals()->abort).store(1, std::memory_order_release);
}

Status DeviceExecutor::reset() {
  Impl& m = *impl_;
  if (m.multiprocess)
    return Status::error("reset() of a multi-process executor: its connection counters are "
                         "shared with other processes and cannot be cleared from one side");
  abort();  // a launch still waiting gives up now instead of at its timeout
  for (int d : m.devices) {
    DeviceScope scope(d);
    EFCCL_CUDA_RETURN(cudaDeviceSynchronize(),
                      "cudaDeviceSynchronize on device " + std::to_string(d));
  }
  for (LocalDevice& local : m.locals) {
    for (DeviceBuffer* b : {&local.flags, &local.state, &local.epochs, &local.fifo_arena,
                            &local.counter_arena})
      if (Status s = b->zero(); !s) return s;
  }
  if (Status s = m.write_first_positions(); !s) return s;
  for (LocalDevice& local : m.locals) {
    DeviceScope scope(local.device);
    EFCCL_CUDA_RETURN(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::memset(m.host_mapped.get(), 0, m.host_mapped.bytes());
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return Status::ok();
}

}  // namespace efccl::device
