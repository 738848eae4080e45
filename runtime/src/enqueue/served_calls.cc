#include "enqueue/served_calls.h"

#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/device_guard.h"
#include "base/driver_entry.h"
#include "base/relaxed_capture.h"
#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"
#include "enqueue/clique.h"
#include "select/program_registry.h"

namespace efccl::runtime {
namespace {

constexpr uint64_t kSetupTag = 0x00ef'5345'5256'0001ull;    // the handles and the board's name
constexpr uint64_t kVerdictTag = 0x00ef'5345'5256'0002ull;  // whether each process could open them
constexpr int kMaxServedRanks = 32;
/// Each process's words: the eager calls' in the first page, then the graph slots' flags.
constexpr std::size_t kWordsBytes = std::size_t{1} << 20;
constexpr std::size_t kWordStride = 64;    ///< arrived word of rank q at q * stride (server)
constexpr std::size_t kDoneOffset = 2048;  ///< each process's done word
constexpr std::size_t kSlotsOffset = 4096;
/// Graph slots: the server's page holds an arrival flag per rank and slot, a client's page a
/// "done" flag per slot.
constexpr uint32_t kGraphSlots =
    static_cast<uint32_t>((kWordsBytes - kSlotsOffset) / (kMaxServedRanks * sizeof(uint32_t)));
/// What a failure writes into a graph slot's flags (the waits pass on >= 1).
constexpr uint32_t kSlotReleased = uint32_t{1} << 30;
/// Pinned words the host reads: a flag per graph slot ("a stream waits here"), then the last eager
/// call a stream reached and the last that ended (their sequence numbers' low 32 bits).
constexpr uint32_t kEagerStarted = kGraphSlots;
constexpr uint32_t kEagerDone = kGraphSlots + 1;
constexpr uint32_t kHostWords = kGraphSlots + 2;
constexpr std::size_t kNameBytes = 64;

using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using BatchMemOp = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

WriteValue32 write_value32() {
  static const auto fn = reinterpret_cast<WriteValue32>(driver_entry("cuStreamWriteValue32"));
  return fn;
}
BatchMemOp batch_mem_op() {
  static const auto fn = reinterpret_cast<BatchMemOp>(driver_entry("cuStreamBatchMemOp"));
  return fn;
}

std::string cuda_text(cudaError_t e) {
  (void)cudaGetLastError();
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

/// `*word = value` on `s` after its earlier work (`flags`: CUstreamWriteValue_flags).
ApiStatus write_word(cudaStream_t s, const void* word, uint64_t value, unsigned flags = 0) {
  WriteValue32 fn = write_value32();
  if (fn == nullptr) return ApiStatus::cuda("the CUDA driver has no cuStreamWriteValue32");
  const CUresult r =
      fn(s, reinterpret_cast<CUdeviceptr>(word), static_cast<cuuint32_t>(value), flags);
  if (r != CUDA_SUCCESS)
    return ApiStatus::cuda("cuStreamWriteValue32 failed with CUresult " + std::to_string(r));
  return ApiStatus::ok();
}

/// Stream memory operations enqueued as one batch (one node under capture): a stream's words of
/// one served call.
class MemOps {
 public:
  /// `*word = value` once the operations before it are done, after a memory barrier (the
  /// stream's earlier writes are visible first; this driver refuses writes without one,
  /// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, on an H200 with CUDA 13.0).
  void write(const void* word, uint32_t value) {
    CUstreamBatchMemOpParams op{};
    op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    op.writeValue.address = reinterpret_cast<CUdeviceptr>(word);
    op.writeValue.value = value;
    op.writeValue.flags = 0;
    ops_.push_back(op);
  }
  /// Until `*word` >= `value` (compared cyclically).
  void wait(const void* word, uint32_t value) {
    CUstreamBatchMemOpParams op{};
    op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    op.waitValue.address = reinterpret_cast<CUdeviceptr>(word);
    op.waitValue.value = value;
    op.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ops_.push_back(op);
  }
  void clear() { ops_.clear(); }
  /// Enqueues them on `s` and forgets them.
  ApiStatus issue(cudaStream_t s) {
    if (ops_.empty()) return ApiStatus::ok();
    BatchMemOp fn = batch_mem_op();
    if (fn == nullptr) return ApiStatus::cuda("the CUDA driver has no cuStreamBatchMemOp");
    const CUresult r = fn(s, static_cast<unsigned>(ops_.size()), ops_.data(), 0);
    ops_.clear();
    if (r != CUDA_SUCCESS)
      return ApiStatus::cuda("cuStreamBatchMemOp failed with CUresult " + std::to_string(r));
    return ApiStatus::ok();
  }

 private:
  std::vector<CUstreamBatchMemOpParams> ops_;
};

/// Bytes of the buffers a rank's call uses: (send, receive); 0 for a buffer it does not use.
std::pair<uint64_t, uint64_t> used_bytes(CallKind k, uint64_t bytes, int rank, int root,
                                         int nranks) {
  const uint64_t all = bytes * static_cast<uint64_t>(nranks);
  const bool at_root = rank == root;
  switch (k) {
    case CallKind::kAllReduce:
      return {bytes, bytes};
    case CallKind::kBroadcast:
      return {at_root ? bytes : 0, bytes};
    case CallKind::kReduce:
      return {bytes, at_root ? bytes : 0};
    case CallKind::kAllGather:
      return {bytes, all};
    case CallKind::kReduceScatter:
      return {all, bytes};
    case CallKind::kAllToAll:
      return {all, all};
    case CallKind::kGather:
      return {bytes, at_root ? all : 0};
    case CallKind::kScatter:
      return {at_root ? all : 0, bytes};
    default:
      return {0, 0};
  }
}

/// The board's shared memory: created by the server (its name exchanged, then unlinked once
/// every process opened it), opened by the others.
StatusOr<void*> map_board(const std::string& name, std::size_t bytes, bool create) {
  const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Status::error("shm_open(" + name + "): " + std::strerror(errno));
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    shm_unlink(name.c_str());
    return Status::error("ftruncate of " + name + ": " + why);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < bytes) {
    close(fd);
    return Status::error(name + " is smaller than the " + std::to_string(bytes) +
                         " bytes of the board");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Status::error("mmap of " + name + ": " + std::strerror(errno));
  return p;
}

using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

/// ok when a page of words mapped from another process's handle is as long as efccl's pages.
Status check_words(const void* p) {
  static const auto fn = reinterpret_cast<AddressRangeFn>(driver_entry("cuMemGetAddressRange"));
  if (fn == nullptr) return Status::error("the CUDA driver has no cuMemGetAddressRange");
  CUdeviceptr base = 0;
  std::size_t bytes = 0;
  if (fn(&base, &bytes, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    return Status::error("cuMemGetAddressRange failed on the mapping");
  if (reinterpret_cast<CUdeviceptr>(p) != base || bytes < kWordsBytes)
    return Status::error("the mapped allocation has " + std::to_string(bytes) + " bytes, not " +
                         std::to_string(kWordsBytes));
  return Status::ok();
}

}  // namespace

ServedCalls::ServedCalls(Options options) : options_(std::move(options)) {}

StatusOr<std::shared_ptr<ServedCalls>> ServedCalls::create(net::Bootstrap& boot, Options options,
                                                           net::Deadline deadline,
                                                           const std::atomic<bool>* abort) {
  DeviceGuard guard;
  const int n = options.nranks;
  const bool server = options.rank == kServerRank;
  std::shared_ptr<ServedCalls> me(new ServedCalls(options));
  std::string problem;  // why this process cannot serve (sent to the others)
  if (!options.wish) problem = "not wished";
  if (problem.empty() && n > kMaxServedRanks)
    problem = std::to_string(n) + " ranks (at most " + std::to_string(kMaxServedRanks) + ")";
  if (problem.empty() && (write_value32() == nullptr || batch_mem_op() == nullptr))
    problem = "the CUDA driver has no stream memory operations";
  cudaIpcMemHandle_t handle{};
  std::string name;
  if (problem.empty()) {
    cudaError_t e = cudaSetDevice(options.device);
    if (e == cudaSuccess) e = cudaMalloc(&me->words_, kWordsBytes);
    if (e == cudaSuccess) e = cudaMemset(me->words_, 0, kWordsBytes);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&handle, me->words_);
    if (e == cudaSuccess)
      e = cudaStreamCreateWithFlags(&me->private_stream_, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&me->last_event_, cudaEventDisableTiming);
    if (e == cudaSuccess)
      e = cudaHostAlloc(reinterpret_cast<void**>(&me->waiting_), kHostWords * sizeof(uint32_t),
                        cudaHostAllocMapped);
    if (e == cudaSuccess) std::memset(me->waiting_, 0, kHostWords * sizeof(uint32_t));
    if (e == cudaSuccess)
      e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&me->waiting_device_), me->waiting_, 0);
    if (e != cudaSuccess) problem = "its words: " + cuda_text(e);
  }
  if (problem.empty() && server) {
    std::random_device rd;
    name = "/efccl-served-" + std::to_string(getpid()) + "-" + std::to_string(rd());
    me->board_bytes_ = ServedBoard::bytes_for(n);
    auto mapped = map_board(name, me->board_bytes_, true);
    if (!mapped) {
      problem = "the board: " + mapped.status().message();
      name.clear();
    } else {
      me->board_memory_ = *mapped;
      if (Status s = ServedBoard::format(me->board_memory_, me->board_bytes_, n); !s)
        problem = s.message();
    }
  }
  // Round 1: every process's wish, its words' handle, the server's board name.
  std::string mine(1 + sizeof(handle) + kNameBytes, '\0');
  mine[0] = problem.empty() ? 1 : 0;
  std::memcpy(mine.data() + 1, &handle, sizeof(handle));
  std::memcpy(mine.data() + 1 + sizeof(handle), name.data(), std::min(name.size(), kNameBytes - 1));
  auto cleanup_name = [&] {
    if (!name.empty()) shm_unlink(name.c_str());
    name.clear();
  };
  auto got = boot.allgather(kSetupTag, mine, deadline, abort);
  if (!got) {
    cleanup_name();
    return Status::error("exchanging the served GPU's handles: " + got.status().message());
  }
  if (got->size() != static_cast<std::size_t>(n)) {
    cleanup_name();
    return Status::error("the served GPU's exchange returned " + std::to_string(got->size()) +
                         " setups for " + std::to_string(n) + " ranks");
  }
  bool everyone = true;
  for (int r = 0; r < n; ++r) {
    const std::string& blob = (*got)[static_cast<std::size_t>(r)];
    if (blob.size() != mine.size()) {
      cleanup_name();
      return Status::error("rank " + std::to_string(r) + " sent a served-GPU setup of " +
                           std::to_string(blob.size()) + " bytes, not " +
                           std::to_string(mine.size()));
    }
    everyone = everyone && blob[0] == 1;
  }
  if (!everyone) {
    cleanup_name();
    if (options.wish)
      EFCCL_INFO(kLogInit, options.device,
                 "rank " + std::to_string(options.rank) + ": the GPU is not served by one process" +
                     (problem.empty() ? std::string(" (another process does not serve)")
                                      : ": " + problem));
    return std::shared_ptr<ServedCalls>();
  }
  // Open the others' memory: the server every client's words, a client the server's words
  // and the board.
  if (server) {
    me->client_words_.assign(static_cast<std::size_t>(n), nullptr);
    for (int r = 0; r < n && problem.empty(); ++r) {
      if (r == options.rank) continue;
      cudaIpcMemHandle_t h;
      std::memcpy(&h, (*got)[static_cast<std::size_t>(r)].data() + 1, sizeof(h));
      if (cudaError_t e = cudaIpcOpenMemHandle(&me->client_words_[static_cast<std::size_t>(r)], h,
                                               cudaIpcMemLazyEnablePeerAccess);
          e != cudaSuccess)
        problem = "mapping rank " + std::to_string(r) + "'s words: " + cuda_text(e);
      else if (Status s = check_words(me->client_words_[static_cast<std::size_t>(r)]); !s)
        problem = "rank " + std::to_string(r) + "'s words: " + s.message();
    }
    if (problem.empty()) {
      std::vector<int> devices(static_cast<std::size_t>(n), options.device);
      auto shadow = Clique::create(devices, ProgramRegistry::from_environment());
      if (!shadow) {
        problem = "the clique of the GPU's ranks: " + shadow.status().message();
      } else {
        me->shadow_ = *shadow;
        if (options.graph != nullptr) me->shadow_->set_machine_graph(options.graph);
      }
    }
  } else {
    const std::string& blob = (*got)[kServerRank];
    cudaIpcMemHandle_t h;
    std::memcpy(&h, blob.data() + 1, sizeof(h));
    const std::string board_name(blob.data() + 1 + sizeof(h),
                                 strnlen(blob.data() + 1 + sizeof(h), kNameBytes));
    if (cudaError_t e = cudaIpcOpenMemHandle(&me->server_words_, h, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess)
      problem = "mapping the server's words: " + cuda_text(e);
    else if (Status s = check_words(me->server_words_); !s)
      problem = "the server's words: " + s.message();
    if (problem.empty() && (board_name.rfind("/efccl-served-", 0) != 0 ||
                            board_name.find('/', 1) != std::string::npos))
      problem = "the server named the board '" + board_name + "'";
    if (problem.empty()) {
      me->board_bytes_ = ServedBoard::bytes_for(n);
      auto mapped = map_board(board_name, me->board_bytes_, false);
      if (!mapped)
        problem = "the board: " + mapped.status().message();
      else
        me->board_memory_ = *mapped;
    }
  }
  if (problem.empty() && me->board_memory_ != nullptr) {
    auto board = ServedBoard::attach(me->board_memory_, me->board_bytes_, n);
    if (!board)
      problem = board.status().message();
    else
      me->board_.emplace(*board);
  }
  // Round 2: whether every process opened what it needs.
  auto verdicts = boot.allgather(kVerdictTag, problem.empty() ? "ok" : problem, deadline, abort);
  cleanup_name();  // everyone who will open it has (or failed)
  if (!verdicts) return Status::error("the served GPU's verdicts: " + verdicts.status().message());
  if (verdicts->size() != static_cast<std::size_t>(n))
    return Status::error("the served GPU's exchange returned " + std::to_string(verdicts->size()) +
                         " verdicts for " + std::to_string(n) + " ranks");
  for (int r = 0; r < n; ++r) {
    const std::string& v = (*verdicts)[static_cast<std::size_t>(r)];
    if (v != "ok") {
      EFCCL_WARN(options.device, "rank " + std::to_string(options.rank) +
                                     ": the GPU is not served by one process because rank " +
                                     std::to_string(r) +
                                     " could not set it up: " + v.substr(0, 200));
      return std::shared_ptr<ServedCalls>();
    }
  }
  me->watchdog_ = std::thread([raw = me.get()] { raw->watch(); });
  EFCCL_INFO(kLogInit, options.device,
             "rank " + std::to_string(options.rank) + ": the GPU's " + std::to_string(n) +
                 " ranks are served by rank " + std::to_string(kServerRank) + "'s process" +
                 (server ? " (this one)" : ""));
  return me;
}

ServedCalls::~ServedCalls() {
  DeviceGuard guard;
  (void)cudaSetDevice(options_.device);
  // The streams' last served operations touch the mapped words: let them end first (bounded;
  // past the timeout the words are written here so that they can).
  bool quiet = drained(options_.timeout);
  if (!quiet) {
    release("destroyed with a served call still waiting");
    write_release_words();
    quiet = drained(std::chrono::seconds(10));
    if (!quiet)
      EFCCL_WARN(options_.device,
                 "rank " + std::to_string(options_.rank) +
                     ": a served call still waits after destroy; its words stay mapped");
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (private_stream_ != nullptr) {
    (void)cudaStreamSynchronize(private_stream_);
    (void)cudaStreamDestroy(private_stream_);
  }
  shadow_.reset();  // waits for its launches
  if (quiet) {
    for (void* p : client_words_)
      if (p != nullptr) (void)cudaIpcCloseMemHandle(p);
    if (server_words_ != nullptr) (void)cudaIpcCloseMemHandle(server_words_);
    if (words_ != nullptr) (void)cudaFree(words_);
    if (waiting_ != nullptr) (void)cudaFreeHost(waiting_);
  }
  if (last_event_ != nullptr) (void)cudaEventDestroy(last_event_);
  if (board_memory_ != nullptr) munmap(board_memory_, board_bytes_);
  (void)cudaGetLastError();
}

bool ServedCalls::drained(std::chrono::nanoseconds budget) const {
  RelaxedCapture relaxed;
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    const cudaError_t e = last_event_ != nullptr ? cudaEventQuery(last_event_) : cudaSuccess;
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;  // a sticky error: nothing will end
    }
    bool replaying = false;  // a graph's replay waits in a slot
    for (uint32_t k = 0; k < slots_used_.load() && !replaying; ++k)
      replaying = reinterpret_cast<const volatile uint32_t*>(waiting_)[k] != 0;
    if (e == cudaSuccess && !replaying) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

uint32_t* ServedCalls::arrived_word(int rank) const {
  char* base = static_cast<char*>(is_server() ? words_ : server_words_);
  return reinterpret_cast<uint32_t*>(base + static_cast<std::size_t>(rank) * kWordStride);
}

uint32_t* ServedCalls::slot_arrived(uint32_t slot, int rank) const {
  char* base = static_cast<char*>(is_server() ? words_ : server_words_);
  return reinterpret_cast<uint32_t*>(base + kSlotsOffset) +
         static_cast<std::size_t>(slot) * kMaxServedRanks + static_cast<std::size_t>(rank);
}

uint32_t* ServedCalls::slot_done(void* base, uint32_t slot) {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(base) + kSlotsOffset) + slot;
}

bool ServedCalls::servable(const Call& c, ServedCall* record) const {
  record->kind = static_cast<uint8_t>(c.kind);
  record->dtype = static_cast<uint8_t>(c.dtype);
  record->op = static_cast<uint8_t>(c.op);
  record->root = c.root;
  record->count = c.count;
  record->premul = c.premul_scalar;
  if (c.count == 0 || is_p2p(c.kind)) return false;
  // The root's view holds the call's largest buffer (a gather's): every rank decides alike.
  const auto [root_send, root_recv] =
      used_bytes(c.kind, call_bytes(c), c.root, c.root, options_.nranks);
  if (std::max(root_send, root_recv) < options_.min_bytes) return false;
  const auto [send_bytes, recv_bytes] =
      used_bytes(c.kind, call_bytes(c), options_.rank, c.root, options_.nranks);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c.stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (capture == cudaStreamCaptureStatusInvalidated) return false;
  if (capture == cudaStreamCaptureStatusActive) {
    record->captured = 1;
    record->slot = next_slot_;
    if (next_slot_ >= kGraphSlots) return false;  // every slot given (submit says so once)
  }
  if (is_server()) {
    record->send = reinterpret_cast<uint64_t>(c.sendbuff);
    record->recv = reinterpret_cast<uint64_t>(c.recvbuff);
    return true;
  }
  auto where = [&](const void* p, uint64_t bytes, uint64_t* out) {
    if (bytes == 0) return true;  // not used by this rank
    if (p == nullptr || !options_.translate) return false;
    const std::optional<uint64_t> a = options_.translate(p, bytes);
    if (!a) return false;
    *out = *a;
    return true;
  };
  return where(c.sendbuff, send_bytes, &record->send) &&
         where(c.recvbuff, recv_bytes, &record->recv);
}

bool ServedCalls::submit(const std::vector<Call>& calls, ApiStatus* status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!board_) return false;
  if (released_.load() || board_->failed_by() != 0) {
    *status = error();
    if (*status) *status = ApiStatus::invalid_usage("the communicator has been aborted");
    return true;
  }
  const bool alone = calls.size() == 1 && !is_p2p(calls.front().kind);
  const net::Deadline deadline =
      net::Deadline::after(std::chrono::duration_cast<std::chrono::milliseconds>(options_.timeout));
  for (const Call& c : calls) {
    if (is_p2p(c.kind)) continue;
    ServedCall record;
    const bool mine = servable(c, &record) && alone;
    record.servable = mine ? 1 : 0;
    if (record.captured == 1 && record.slot >= kGraphSlots && !told_slots_out_) {
      told_slots_out_ = true;
      EFCCL_INFO(kLogInit, options_.device,
                 "rank " + std::to_string(options_.rank) + ": all " + std::to_string(kGraphSlots) +
                     " graph slots of the served GPU are given; later captured calls run the "
                     "usual way");
    }
    const uint64_t seq = ++seq_;
    if (Status s = board_->post(options_.rank, seq, record, deadline, &released_); !s) {
      fail("posting collective " + std::to_string(seq) + ": " + s.message());
      release("a failed post");
      *status = error();
      return true;
    }
    if (!mine) {
      board_->consume(options_.rank, seq);
      continue;
    }
    std::vector<ServedCall> all(static_cast<std::size_t>(options_.nranks));
    all[static_cast<std::size_t>(options_.rank)] = record;
    for (int q = 0; q < options_.nranks; ++q) {
      if (q == options_.rank) continue;
      if (Status s = board_->read(q, seq, &all[static_cast<std::size_t>(q)], deadline, &released_);
          !s) {
        fail(s.message());
        release("a failed read");
        *status = error();
        return true;
      }
    }
    board_->consume(options_.rank, seq);
    if (!served_together(all)) return false;
    *status = record.captured == 1 ? run_captured(c, all, record.slot) : run(c, all, seq);
    return true;
  }
  return false;
}

ApiStatus ServedCalls::check_addresses(const Call& c, const std::vector<ServedCall>& all,
                                       uint64_t seq) {
  const uint64_t bytes = call_bytes(c);
  for (int q = 0; q < options_.nranks; ++q) {
    if (q == options_.rank) continue;
    const ServedCall& r = all[static_cast<std::size_t>(q)];
    const auto [sb, rb] = used_bytes(c.kind, bytes, q, c.root, options_.nranks);
    if ((sb != 0 && !options_.covers(q, r.send, sb)) ||
        (rb != 0 && !options_.covers(q, r.recv, rb))) {
      board_->set_failed(options_.rank);
      return ApiStatus(ncclRemoteError,
                       "rank " + std::to_string(q) + "'s " + api_name(c.kind) + " (call " +
                           std::to_string(seq) +
                           ") names memory that its process did not register with this one");
    }
  }
  return ApiStatus::ok();
}

ApiStatus ServedCalls::launch_for_all(const Call& c, const std::vector<ServedCall>& all) {
  std::vector<Call> parts;
  for (int q = 0; q < options_.nranks; ++q) {
    const ServedCall& r = all[static_cast<std::size_t>(q)];
    Call x = c;
    x.rank = q;
    x.premul_scalar = r.premul;
    if (q != options_.rank) {
      x.sendbuff = reinterpret_cast<const void*>(r.send);
      x.recvbuff = reinterpret_cast<void*>(r.recv);
    }
    parts.push_back(x);
  }
  std::shared_ptr<CallQueue::Submission> unfinished;
  ApiStatus outcome = shadow_->submit(std::move(parts), true, &unfinished);
  if (outcome && unfinished != nullptr) outcome = shadow_->wait(unfinished);
  return outcome;
}

ApiStatus ServedCalls::run_captured(const Call& c, const std::vector<ServedCall>& all,
                                    uint32_t slot) {
  // The slot is taken whatever happens below: every process counts it alike.
  ++next_slot_;
  slots_used_.store(next_slot_);
  served_count_.fetch_add(1);
  DeviceGuard guard;
  ApiStatus outcome;
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess)
    outcome = ApiStatus::cuda("cudaSetDevice: " + cuda_text(e));
  // Each replay: the waiting side raises its host flag, waits for the others' flags (>= 1),
  // lowers them, and lowers its host flag once its part of the call is done; fixed values, so
  // the graph replays as captured.
  uint32_t* const waiting = waiting_device_ + slot;
  MemOps ops;
  if (!outcome) {
    // Nothing enqueued: the communicator fails below.
  } else if (is_server()) {
    outcome = check_addresses(c, all, seq_);
    ops.write(waiting, 1);
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank) ops.wait(slot_arrived(slot, q), 1);
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank) ops.write(slot_arrived(slot, q), 0);
    if (outcome) outcome = ops.issue(c.stream);
    ops.clear();
    if (outcome) outcome = launch_for_all(c, all);
    // The clients' replays wait for these whatever happened above; the host flag comes down
    // last, so that destroy does not unmap the clients' words under these writes.
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank)
        ops.write(slot_done(client_words_[static_cast<std::size_t>(q)], slot), 1);
    ops.write(waiting, 0);
    if (ApiStatus s = ops.issue(c.stream); !s && outcome) outcome = s;
  } else {
    ops.write(waiting, 1);
    ops.write(slot_arrived(slot, options_.rank), 1);
    ops.wait(slot_done(words_, slot), 1);
    ops.write(slot_done(words_, slot), 0);
    ops.write(waiting, 0);
    outcome = ops.issue(c.stream);
  }
  if (!outcome) {
    // The capture holds a graph that cannot serve: the communicator fails, as for an eager call.
    fail(outcome.message());
    release("a failed capture");
  }
  return outcome;
}

ApiStatus ServedCalls::run(const Call& c, const std::vector<ServedCall>& all, uint64_t seq) {
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess)
    return ApiStatus::cuda("cudaSetDevice: " + cuda_text(e));
  issued_.store(seq);  // before its waits are enqueued, so that release() covers them
  ApiStatus outcome;
  // After this process's previous served call, whatever its stream: the words only grow.
  if (last_stream_ != nullptr && last_stream_ != c.stream)
    if (cudaError_t e = cudaStreamWaitEvent(c.stream, last_event_, 0); e != cudaSuccess)
      outcome = ApiStatus::cuda("cudaStreamWaitEvent: " + cuda_text(e));
  const auto word = static_cast<uint32_t>(seq);
  MemOps ops;
  if (is_server()) {
    if (outcome) outcome = check_addresses(c, all, seq);
    ops.write(waiting_device_ + kEagerStarted, word);
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank) ops.wait(arrived_word(q), word);
    if (outcome) outcome = ops.issue(c.stream);
    ops.clear();
    if (outcome) outcome = launch_for_all(c, all);
    // The clients' streams wait for these whatever happened above.
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank)
        ops.write(
            static_cast<const char*>(client_words_[static_cast<std::size_t>(q)]) + kDoneOffset,
            word);
    ops.write(waiting_device_ + kEagerDone, word);
    if (ApiStatus s = ops.issue(c.stream); !s && outcome) outcome = s;
  } else {
    ops.write(waiting_device_ + kEagerStarted, word);
    ops.write(arrived_word(options_.rank), word);
    ops.wait(static_cast<const char*>(words_) + kDoneOffset, word);
    ops.write(waiting_device_ + kEagerDone, word);
    if (outcome) outcome = ops.issue(c.stream);
  }
  if (cudaError_t e = cudaEventRecord(last_event_, c.stream); e != cudaSuccess && outcome)
    outcome = ApiStatus::cuda("cudaEventRecord: " + cuda_text(e));
  last_stream_ = c.stream;
  served_count_.fetch_add(1);
  watch_cv_.notify_all();
  if (!outcome) {
    fail(outcome.message());
    release("a failed call");
  }
  return outcome;
}

void ServedCalls::watch() {
  // Its event queries must not invalidate a capture that another thread has under way.
  RelaxedCapture relaxed;
  using Clock = std::chrono::steady_clock;
  constexpr Clock::time_point kNever = Clock::time_point::max();
  std::unique_lock<std::mutex> lock(watch_mu_);
  auto pending_since = kNever;
  uint32_t last_ended = 0;  // the eager call last seen ending (its low 32 bits)
  std::vector<Clock::time_point> slot_waiting_since;  // per graph slot: its stream waits since
  const auto timed_out = [&](const std::string& what) {
    lock.unlock();
    fail(what + " did not complete within " +
         std::to_string(
             std::chrono::duration_cast<std::chrono::milliseconds>(options_.timeout).count()) +
         " ms (EFCCL_TIMEOUT_MS); another process on the GPU stopped issuing or running calls");
    release("the timeout");
    lock.lock();
  };
  while (!stopping_) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(10));
    if (stopping_) break;
    if (!released_.load() && board_ && board_->failed_by() != 0) {
      // Another process failed: this process's graph replays may wait for it (eager calls
      // learn it at their next submit, replays never call in).
      lock.unlock();
      release("rank " + std::to_string(board_->failed_by() - 1) + "'s served calls failed");
      lock.lock();
    }
    if (released_.load()) {
      // A graph replayed after the failure waits in its slots again (it lowers the flags it
      // waited for): let it through too.
      lock.unlock();
      release_waiting_slots();
      lock.lock();
      continue;
    }
    // A launch of the shadow that failed in the server: every process learns it from the board.
    if (shadow_ != nullptr)
      if (ApiStatus s = shadow_->async_error(kServerRank); !s) {
        lock.unlock();
        fail("the served launch failed: " + s.message());
        release("a failed launch");
        lock.lock();
        continue;
      }
    const auto now = Clock::now();
    // Graph replays: a slot whose stream has waited for longer than the timeout.
    const uint32_t used = slots_used_.load();
    slot_waiting_since.resize(used, kNever);
    std::optional<uint32_t> stuck;
    for (uint32_t k = 0; k < used; ++k) {
      // A replay raises the flag to 1; the watchdog marks what it saw with 2 (a replay that
      // ends writes 0, the next one 1 again), so that only one replay waiting all along counts.
      std::atomic_ref<uint32_t> flag(waiting_[k]);
      uint32_t seen = 1;
      if (flag.compare_exchange_strong(seen, 2)) {
        slot_waiting_since[k] = now;  // a replay that started since the last look
      } else if (seen == 0) {
        slot_waiting_since[k] = kNever;
      } else if (slot_waiting_since[k] == kNever) {
        slot_waiting_since[k] = now;
      }
      if (slot_waiting_since[k] != kNever && now - slot_waiting_since[k] > options_.timeout &&
          !stuck)
        stuck = k;
    }
    if (stuck) {
      timed_out("the replay of captured served collective (graph slot " + std::to_string(*stuck) +
                ")");
      continue;
    }
    // Eager calls: timed from when a stream reaches one until it ends, restarting whenever one
    // ends (work queued before a call, a backlog of calls that all end do not count; a call
    // held back here is timed by the others, whose failure this process reads on the board).
    const auto* host = reinterpret_cast<const volatile uint32_t*>(waiting_);
    const uint32_t started = host[kEagerStarted];
    const uint32_t ended = host[kEagerDone];
    if (started == ended)
      pending_since = kNever;
    else if (pending_since == kNever || ended != last_ended)
      pending_since = now;
    last_ended = ended;
    if (pending_since != kNever && now - pending_since > options_.timeout)
      timed_out("served collective " + std::to_string(started));
  }
}

void ServedCalls::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) return;
  error_ = ApiStatus(ncclRemoteError, "rank " + std::to_string(options_.rank) +
                                          ", GPU served by one process: " + why);
  EFCCL_WARN(options_.device, error_.message());
  if (board_) board_->set_failed(options_.rank);
}

void ServedCalls::release(const std::string& why) {
  if (released_.exchange(true)) return;
  RelaxedCapture relaxed;
  if (board_) board_->set_failed(options_.rank);  // the other processes stop serving too
  if (shadow_ != nullptr) shadow_->abort(kServerRank);
  write_release_words();
  EFCCL_INFO(kLogInit, options_.device,
             "rank " + std::to_string(options_.rank) + ": served calls released (" + why + ")");
}

void ServedCalls::write_release_words() {
  DeviceGuard guard;
  if (cudaSetDevice(options_.device) != cudaSuccess) (void)cudaGetLastError();
  // Far enough ahead to satisfy every wait already enqueued (they compare cyclically).
  const uint64_t last = issued_.load() + (uint64_t{1} << 30);
  // What this process's streams wait for: the server the clients' arrivals, a client its done.
  if (is_server()) {
    for (int q = 0; q < options_.nranks; ++q)
      if (q != options_.rank) (void)write_word(private_stream_, arrived_word(q), last);
  } else if (words_ != nullptr) {
    (void)write_word(private_stream_, static_cast<char*>(words_) + kDoneOffset, last);
  }
  release_waiting_slots();
}

void ServedCalls::release_waiting_slots() {
  if (waiting_ == nullptr || words_ == nullptr) return;
  DeviceGuard guard;
  if (cudaSetDevice(options_.device) != cudaSuccess) (void)cudaGetLastError();
  const uint32_t used = slots_used_.load();
  for (uint32_t k = 0; k < used; ++k) {
    if (reinterpret_cast<const volatile uint32_t*>(waiting_)[k] == 0) continue;
    if (is_server()) {
      for (int q = 0; q < options_.nranks; ++q)
        if (q != options_.rank)
          (void)write_word(private_stream_, slot_arrived(k, q), kSlotReleased);
    } else {
      (void)write_word(private_stream_, slot_done(words_, k), kSlotReleased);
    }
  }
}

ApiStatus ServedCalls::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!error_) return error_;
  if (board_ && board_->failed_by() != 0)
    return ApiStatus(ncclRemoteError,
                     "rank " + std::to_string(board_->failed_by() - 1) +
                         "'s served calls failed or were aborted (its log says why); the "
                         "communicator's served calls cannot go on");
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
