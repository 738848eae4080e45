#include "enqueue/clique.h"
#include "base/device_guard.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <cstdio>
#include <sstream>
#include <utility>

#include "bootstrap.h"
#include "efccl/ef/json_io.h"
#include "fallback/nccl_fallback.h"
#include "efccl/common/log.h"
#include "select/p2p_plan.h"
#include "select/tuning.h"

namespace efccl::runtime {
namespace {

/// The logger's `[dev]` for lines that name no device: this thread's current CUDA device.
int current_cuda_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}
[[maybe_unused]] const bool g_log_device_query_installed =
    (set_log_device_query(&current_cuda_device), true);

/// Kernel waits without progress longer than this fail the call (EFCCL_TIMEOUT_MS). The
/// default matches PyTorch's NCCL watchdog: a peer GPU may legitimately start its part of a
/// collective late, after long compute queued before it.
constexpr uint64_t kDefaultTimeoutMs = 600000;
/// Executors kept per clique (EFCCL_EXECUTOR_CACHE); the least recently used one that no CUDA
/// graph pins goes first (executor_cache.h).
constexpr std::size_t kDefaultCachedExecutors = 256;

std::size_t executor_cache_from_environment() {
  if (const char* v = std::getenv("EFCCL_EXECUTOR_CACHE"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0' && parsed > 0 && parsed <= (1ull << 20))
      return static_cast<std::size_t>(parsed);
    EFCCL_WARN(-1, "EFCCL_EXECUTOR_CACHE=" + std::string(v) + " is not a number of executors in "
                   "1.." + std::to_string(1 << 20) + "; using " +
                       std::to_string(kDefaultCachedExecutors));
  }
  return kDefaultCachedExecutors;
}

/// The destructor of the CUDA user object that pins an executor to a captured graph: runs on a
/// CUDA-internal thread, so it only drops the pin count.
void CUDART_CB release_executor_pin(void* pin) {
  ExecutorCache<device::DeviceExecutor>::release_pin(pin);
}

std::chrono::nanoseconds timeout_from_environment() {
  uint64_t ms = kDefaultTimeoutMs;
  if (const char* v = std::getenv("EFCCL_TIMEOUT_MS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(v, &end, 10);
    if (end != nullptr && *end == '\0' && parsed > 0 && parsed < (1ull << 40))
      ms = parsed;
    else
      EFCCL_WARN(-1, "EFCCL_TIMEOUT_MS=" + std::string(v) + " is not a positive number of "
                     "milliseconds; using " + std::to_string(kDefaultTimeoutMs));
  }
  return std::chrono::milliseconds(ms);
}


/// EFCCL_GROUP_FUSION: 1 (default) enqueues the launches of one group together (fused where
/// the kernels allow); 0 launches every program run on its own, as before fusion existed.
bool group_fusion_from_environment() {
  const char* v = std::getenv("EFCCL_GROUP_FUSION");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  EFCCL_WARN(-1, "EFCCL_GROUP_FUSION=" + std::string(v) + " is neither 0 nor 1; using 1");
  return true;
}

ApiStatus cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(what + ": " + cudaGetErrorString(e));
}

/// The program buffers of rank `c.rank` for elements [offset, ...) (offset: element-wise
/// collectives only). Buffers NCCL ignores on a rank are replaced as the executor expects.
void program_buffers(const Call& c, uint64_t offset, const void** in, void** out) {
  const uint64_t off = offset * ef::size_of(c.dtype);
  const char* send = static_cast<const char*>(c.sendbuff);
  char* recv = static_cast<char*>(c.recvbuff);
  const auto shift = [off](auto* p) { return p == nullptr ? p : p + off; };
  const bool root = c.rank == c.root;
  *in = shift(send);
  *out = shift(recv);
  switch (c.kind) {
    case CallKind::kBroadcast:
      if (!root) *in = shift(recv);  // non-root sendbuff is ignored by NCCL
      break;
    case CallKind::kReduce:
    case CallKind::kGather:
      if (!root) *out = nullptr;  // executor-owned memory
      break;
    case CallKind::kScatter:
      if (!root) *in = nullptr;
      break;
    default:
      break;
  }
}

/// Pair plans (sizes -> prepared rounds) kept per clique before the table is cleared.
constexpr std::size_t kMaxCachedPairPlans = 4096;
/// Exchange tags: one namespace for collective executors, one per pair of ranks for p2p.
constexpr uint64_t kCollectiveExchangeTag = uint64_t{1} << 62;
constexpr uint64_t kPairExchangeTag = uint64_t{2} << 62;

ncclResult_t kernel_failure_code(const std::string& message) {
  return message.rfind("timed out", 0) == 0 || message.rfind("aborted", 0) == 0 ||
                 message.rfind("skipped", 0) == 0
             ? ncclSystemError
             : ncclInternalError;
}

}  // namespace

Clique::Clique(std::vector<int> rank_devices, std::unique_ptr<Registry> registry)
    : rank_devices_(std::move(rank_devices)),
      registry_(std::move(registry)),
      nlocal_(static_cast<int32_t>(rank_devices_.size())),
      timeout_(timeout_from_environment()),
      fusion_(group_fusion_from_environment()),
      executors_(executor_cache_from_environment()),
      ready_(rank_devices_.size(), nullptr),
      done_(rank_devices_.size(), nullptr) {}

StatusOr<std::shared_ptr<Clique>> Clique::create(std::vector<int> rank_devices,
                                                 std::unique_ptr<Registry> registry,
                                                 std::unique_ptr<ProcessMap> processes) {
  std::shared_ptr<Clique> c(new Clique(std::move(rank_devices), std::move(registry)));
  if (processes != nullptr) {
    const std::size_t n = c->rank_devices_.size();
    if (processes->local.size() != n || processes->location.size() != n ||
        processes->leader.size() != n || processes->where.size() != n ||
        processes->bootstraps.empty())
      return Status::error("internal: incomplete process map");
    c->nlocal_ = static_cast<int32_t>(
        std::count(processes->local.begin(), processes->local.end(), true));
    c->processes_ = std::move(processes);
    // A peer process that dies makes this clique's kernels give up at once.
    std::weak_ptr<Clique> weak = c;
    const std::shared_ptr<Bootstrap>& boot = c->processes_->bootstraps.front();
    boot->set_peer_failure_handler([weak](int peer, const std::string& why) {
      if (auto clique = weak.lock()) clique->peer_failed(peer, why);
    });
    // Deaths are noticed on open connections: connect to every other process's leader now.
    std::set<int32_t> leaders(c->processes_->leader.begin(), c->processes_->leader.end());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int32_t l : leaders)
      if (l != boot->rank())
        if (Status s = boot->connect(l, deadline); !s)
          return Status::error("connecting to rank " + std::to_string(l) + "'s process: " + s.message());
  }
  std::vector<bool> local(c->rank_devices_.size());
  for (std::size_t r = 0; r < local.size(); ++r) local[r] = c->is_local(static_cast<int32_t>(r));
  c->queue_ = std::make_unique<CallQueue>(std::move(local), c->timeout_, &c->aborted_);
  DeviceGuard guard;
  for (std::size_t r = 0; r < c->rank_devices_.size(); ++r) {
    if (!c->is_local(static_cast<int32_t>(r))) continue;
    cudaError_t e = cudaSetDevice(c->rank_devices_[r]);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->ready_[r], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->done_[r], cudaEventDisableTiming);
    if (e != cudaSuccess)
      return Status::error("creating the events of rank " + std::to_string(r) + " on device " +
                           std::to_string(c->rank_devices_[r]) + ": " + cudaGetErrorString(e));
  }
  return c;
}

Clique::~Clique() {
  DeviceGuard guard;
  {
    std::lock_guard<std::mutex> lock(exec_list_mu_);
    live_executors_.clear();
  }
  executors_.clear();  // each waits for its launches (aborted ones end within a millisecond)
  for (std::size_t r = 0; r < rank_devices_.size(); ++r) {
    if (ready_[r] == nullptr && done_[r] == nullptr) continue;
    cudaSetDevice(rank_devices_[r]);
    if (ready_[r] != nullptr) cudaEventDestroy(ready_[r]);
    if (done_[r] != nullptr) cudaEventDestroy(done_[r]);
  }
}

// ---------------------------------------------------------------------------------------------
// Rendezvous

void Clique::set_driver(int32_t rank, uint64_t thread) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_->set_driver(rank, thread);
}

ApiStatus Clique::submit(std::vector<Call> calls, bool whole_clique,
                         std::shared_ptr<CallQueue::Submission>* unfinished) {
  unfinished->reset();
  DeviceGuard guard;
  std::lock_guard<std::mutex> lock(mu_);
  {
    std::lock_guard<std::mutex> failure_lock(exec_list_mu_);
    if (!peer_failure_) return peer_failure_;
  }
  if (aborted_.load()) return ApiStatus::invalid_usage("the communicator has been aborted");

  std::vector<Call> collectives, p2p;
  for (Call& c : calls) (is_p2p(c.kind) ? p2p : collectives).push_back(std::move(c));
  // The submission's launches (its collectives that are complete, then its send/receive
  // rounds) are enqueued together at the end: one fused launch per device and stream where
  // the kernels allow (DeviceExecutor::run_batch).
  batching_ = fusion_;
  batch_failure_ = ApiStatus::ok();
  batch_uses_.clear();
  ApiStatus p2p_status;
  bool finished = false;
  const auto finish = [&]() -> ApiStatus {
    finished = true;
    if (!p2p.empty()) p2p_status = processes_ != nullptr ? run_p2p_pairs(p2p) : run_p2p(p2p);
    flush_batch();
    batching_ = false;
    batch_uses_.clear();
    return batch_failure_;
  };
  ApiStatus first;
  if (!collectives.empty())
    first = queue_->submit(std::move(collectives), whole_clique,
                           [this](std::vector<Call>& set, bool* mismatch) {
                             return run_collective(set, mismatch);
                           },
                           unfinished, finish);
  if (!finished) {  // the queue refused the collectives before running anything
    const ApiStatus s = finish();
    if (!s && first) first = s;
  }
  if (!p2p_status && first) first = p2p_status;
  if (!p2p.empty() && !batch_failure_ && first) first = batch_failure_;
  return first;
}

ApiStatus Clique::wait(const std::shared_ptr<CallQueue::Submission>& unfinished) {
  std::unique_lock<std::mutex> lock(mu_);
  return queue_->wait(unfinished, lock);
}

// ---------------------------------------------------------------------------------------------
// Collectives

StatusOr<Plan> Clique::select(const CallShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_->select(shape);
}

ApiStatus Clique::run_collective(std::vector<Call>& set, bool* mismatch) {
  const Call& ref = set[0];
  for (const Call& c : set) {
    const bool same = c.kind == ref.kind && c.count == ref.count && c.dtype == ref.dtype &&
                      (!is_rooted(c.kind) || c.root == ref.root) &&
                      (!ef::collective_reduces(collective_of(c.kind)) || c.op == ref.op);
    if (!same) {
      *mismatch = true;
      return ApiStatus::invalid_usage(
          "collective calls do not match across the ranks of the communicator: rank " +
          std::to_string(ref.rank) + "'s call #" + std::to_string(ref.sequence) + " is " +
          describe(ref) + " but rank " + std::to_string(c.rank) + "'s call #" +
          std::to_string(c.sequence) + " is " + describe(c));
    }
  }
  const uint64_t op_count = launches_++;
  if (ref.count == 0) {
    EFCCL_INFO(kLogColl, device(0), std::string(api_name(ref.kind)) + ": opCount " +
                                        std::to_string(op_count) + " count 0: nothing to do");
    return ApiStatus::ok();
  }

  // One mode for the whole call: the root's for rooted collectives, else every rank's.
  // (Multi-process: the local root's, else the local ranks' own; other processes decide theirs.)
  const Call* mode_ref = &set[0];
  for (const Call& c : set)
    if (is_rooted(ref.kind) && c.rank == ref.root) mode_ref = &c;
  bool inplace = is_inplace(*mode_ref);
  if (!is_rooted(ref.kind)) {
    for (const Call& c : set) {
      if (is_inplace(c) != inplace)
        return ApiStatus::invalid_usage(
            std::string(api_name(ref.kind)) + ": rank 0 calls " +
            (inplace ? "in place" : "out of place") + " but rank " + std::to_string(c.rank) +
            " does not; efccl runs a call in one mode on every rank");
    }
  }

  CallShape shape;
  shape.collective = collective_of(ref.kind);
  shape.nranks = nranks();
  shape.root = is_rooted(ref.kind) ? ref.root : 0;
  shape.count = ref.count;
  shape.dtype = ref.dtype;
  shape.inplace = inplace;
  StatusOr<Plan> plan = registry_->select(shape);
  if (!plan && fallback_ != nullptr) {
    flush_batch();  // the calls before this one are enqueued before it
    return fallback_->run(set, plan.status().message(), timeout_);
  }
  if (!plan) return ApiStatus::internal(std::string(api_name(ref.kind)) + ": " + plan.status().message());

  std::vector<cudaStream_t> streams;
  for (const Call& c : set) streams.push_back(c.stream);
  StatusOr<bool> capturing = any_capturing(streams);
  if (!capturing) return ApiStatus::cuda(capturing.status().message());

  if (log_enabled(LogLevel::kInfo, kLogColl)) {
    std::string programs;
    for (const PlanPiece& p : plan->pieces)
      programs += (programs.empty() ? "" : " + ") + ("'" + p.program->name + "'") + " [" +
                  std::to_string(p.offset) + ", " + std::to_string(p.offset + p.count) + ")";
    log_line(LogLevel::kInfo, kLogColl, device(0),
             std::string(api_name(ref.kind)) + ": opCount " + std::to_string(op_count) +
                 " count " + std::to_string(ref.count) + " datatype " +
                 std::string(ef::to_string(ref.dtype)) + " op " + std::string(ef::to_string(ref.op)) +
                 " root " + std::to_string(shape.root) + " inplace " + (inplace ? "1" : "0") +
                 " nranks " + std::to_string(nranks()) + (*capturing ? " (captured)" : "") +
                 " -> " + programs + ": " + plan->reason);
  }

  std::vector<int32_t> all_ranks(static_cast<std::size_t>(nranks()));
  for (int32_t r = 0; r < nranks(); ++r) all_ranks[static_cast<std::size_t>(r)] = r;
  for (const PlanPiece& piece : plan->pieces) {
    device::DeviceExecutor* executor = nullptr;
    char key[64];  // not an ostringstream: this runs on every call
    std::snprintf(key, sizeof(key), "coll:%p", static_cast<const void*>(piece.program));
    if (const int instance = batch_instance(*piece.program, key); instance > 0)
      std::snprintf(key, sizeof(key), "coll:%p#%d", static_cast<const void*>(piece.program),
                    instance);
    // The exchange tag names the program (and how often it was prepared), so that processes
    // that ever disagreed on one program do not disagree on every later one.
    const ef::Program* program = piece.program;
    if (ApiStatus s = executor_for(*piece.program, key, all_ranks, *capturing, piece.count,
                                   ref.dtype,
                                   [this, program] {
                                     const std::string& f = fingerprint(*program);
                                     const uint64_t h = std::hash<std::string>{}(f) & 0xffffffffffull;
                                     return kCollectiveExchangeTag | (h << 16) |
                                            (collective_exchanges_[f]++ & 0xffff);
                                   },
                                   &executor);
        !s)
      return s;
    Launch l;
    l.executor = executor;
    l.args.count = piece.count;
    l.args.dtype = ref.dtype;
    l.args.op = ref.op;
    l.args.inplace = inplace;
    l.args.timeout = timeout_;
    l.capturing = *capturing;
    // Per program rank (= clique rank); other processes' ranks stay null.
    const auto n = static_cast<std::size_t>(nranks());
    if (ref.op == ef::RedOp::kPreMulSum) l.args.premul_scalars.assign(n, 1.0);
    l.args.inputs.assign(n, nullptr);
    l.args.outputs.assign(n, nullptr);
    for (const Call& c : set) {
      const void* in = nullptr;
      void* out = nullptr;
      program_buffers(c, piece.offset, &in, &out);
      const auto r = static_cast<std::size_t>(c.rank);
      l.args.inputs[r] = in;
      l.args.outputs[r] = out;
      if (ref.op == ef::RedOp::kPreMulSum) l.args.premul_scalars[r] = c.premul_scalar;
      l.ranks.push_back(c.rank);
      l.rank_streams.push_back(c.stream);
    }
    if (ApiStatus s = launch(l); !s)
      return ApiStatus(s.code(), std::string(api_name(ref.kind)) + " (program '" +
                                     piece.program->name + "'): " + s.message());
  }
  return ApiStatus::ok();
}

// ---------------------------------------------------------------------------------------------
// Send/receive

ApiStatus Clique::run_p2p(const std::vector<Call>& calls) {
  // Pair the k-th send from s to d with the k-th receive on d from s.
  std::map<std::pair<int32_t, int32_t>, std::vector<const Call*>> sends, recvs;
  std::map<int32_t, cudaStream_t> stream_of;
  for (const Call& c : calls) {
    auto [it, fresh] = stream_of.emplace(c.rank, c.stream);
    if (!fresh && it->second != c.stream)
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(c.rank) + " uses different streams for its sends/receives "
          "of one group; efccl needs one stream per rank and group for point-to-point calls");
    if (c.kind == CallKind::kSend)
      sends[{c.rank, c.root}].push_back(&c);
    else
      recvs[{c.root, c.rank}].push_back(&c);
  }
  std::set<std::pair<int32_t, int32_t>> pairs;
  for (const auto& [k, v] : sends) pairs.insert(k);
  for (const auto& [k, v] : recvs) pairs.insert(k);

  std::vector<Transfer> transfers;
  std::vector<Transfer> local;  // sender == receiver
  for (const auto& pair : pairs) {
    const auto& s = sends[pair];
    const auto& r = recvs[pair];
    if (s.size() != r.size())
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(pair.first) + " posts " + std::to_string(s.size()) +
          " ncclSend to rank " + std::to_string(pair.second) + " but rank " +
          std::to_string(pair.second) + " posts " + std::to_string(r.size()) +
          " ncclRecv from rank " + std::to_string(pair.first) +
          " in this group (single-process efccl matches sends and receives within one group)");
    for (std::size_t k = 0; k < s.size(); ++k) {
      const uint64_t sb = s[k]->count * ef::size_of(s[k]->dtype);
      const uint64_t rb = r[k]->count * ef::size_of(r[k]->dtype);
      if (sb != rb)
        return ApiStatus::invalid_usage(
            "send #" + std::to_string(k) + " from rank " + std::to_string(pair.first) + " to rank " +
            std::to_string(pair.second) + " has " + std::to_string(sb) + " bytes (" + describe(*s[k]) +
            ") but the matching receive has " + std::to_string(rb) + " (" + describe(*r[k]) + ")");
      if (sb == 0) continue;
      Transfer t{pair.first, pair.second, s[k]->sendbuff, r[k]->recvbuff, sb};
      (pair.first == pair.second ? local : transfers).push_back(t);
    }
  }

  std::vector<cudaStream_t> streams;
  for (const auto& [rank, stream] : stream_of) streams.push_back(stream);
  StatusOr<bool> capturing = any_capturing(streams);
  if (!capturing) return ApiStatus::cuda(capturing.status().message());

  for (const Transfer& t : local) {
    cudaSetDevice(device(t.sender));
    if (ApiStatus s = cuda_status(cudaMemcpyAsync(t.dst, t.src, t.bytes, cudaMemcpyDeviceToDevice,
                                                  stream_of[t.sender]),
                                  "ncclSend/ncclRecv to self on rank " + std::to_string(t.sender));
        !s)
      return s;
  }
  if (transfers.empty()) return ApiStatus::ok();

  const auto protocol_for = [this](uint64_t bytes) { return registry_->p2p_protocol(bytes); };
  // Programs are built only for signatures without a prepared executor: a group repeated
  // with the same layout (every training step) skips building them.
  std::vector<P2pRound> rounds =
      plan_p2p_rounds(transfers, &p2p_channels, protocol_for, /*build_programs=*/false);
  const uint64_t op_count = launches_++;
  EFCCL_INFO(kLogP2p, -1,
             "send/recv group: opCount " + std::to_string(op_count) + " " +
                 std::to_string(transfers.size()) + " transfer(s) between ranks, " +
                 std::to_string(local.size()) + " to self, in " + std::to_string(rounds.size()) +
                 " round(s) (one launch each; channels per transfer: " +
                 std::to_string(rounds.front().channels) + ")" +
                 (*capturing ? " (captured)" : ""));
  notify_selection({"p2p", "p2p", "runtime",
                    std::to_string(transfers.size()) + " transfer(s) in " +
                        std::to_string(rounds.size()) + " round(s)",
                    false, transfers.size(), nranks()});
  for (P2pRound& round : rounds) {
    device::DeviceExecutor* executor = executors_.find(executor_key(round.signature, round.ranks));
    if (executor == nullptr) {
      build_p2p_program(round);
      device::ExecutorConfig config;
      config.slot_bytes = round.slot_bytes;
      if (ApiStatus s = executor_for(round.program, round.signature, round.ranks, *capturing,
                                     round.chunk_bytes, ef::DataType::kInt8,
                                     [] { return uint64_t{0}; }, &executor, config);
          !s)
        return s;
    }
    Launch l;
    l.executor = executor;
    l.args.count = round.chunk_bytes;  // nchunksperloop 1: one chunk of chunk_bytes int8
    l.args.dtype = ef::DataType::kInt8;
    l.args.op = ef::RedOp::kSum;
    l.args.inplace = false;
    l.args.timeout = timeout_;
    l.capturing = *capturing;
    l.args.inputs = round.inputs;
    l.args.outputs = round.outputs;
    l.ranks = round.ranks;
    for (int32_t r : round.ranks) l.rank_streams.push_back(stream_of[r]);
    if (ApiStatus s = launch(l); !s) return s;
  }
  return ApiStatus::ok();
}

ApiStatus Clique::run_p2p_pairs(const std::vector<Call>& calls) {
  // Messages of each direction between two ranks, in call order; a direction is known to this
  // process from its sends when the sender is local, from its receives when the receiver is.
  struct Direction {
    std::vector<const Call*> sends, recvs;
  };
  std::map<std::pair<int32_t, int32_t>, Direction> directions;  // (sender, receiver)
  std::map<int32_t, cudaStream_t> stream_of;
  for (const Call& c : calls) {
    auto [it, fresh] = stream_of.emplace(c.rank, c.stream);
    if (!fresh && it->second != c.stream)
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(c.rank) + " uses different streams for its sends/receives "
          "of one group; efccl needs one stream per rank and group for point-to-point calls");
    if (c.kind == CallKind::kSend)
      directions[{c.rank, c.root}].sends.push_back(&c);
    else
      directions[{c.root, c.rank}].recvs.push_back(&c);
  }
  // Byte counts per direction; both sides local: they must agree.
  std::map<std::pair<int32_t, int32_t>, std::vector<uint64_t>> bytes;
  for (auto& [dir, d] : directions) {
    const bool both = is_local(dir.first) && is_local(dir.second);
    if (both && d.sends.size() != d.recvs.size())
      return ApiStatus::invalid_usage(
          "rank " + std::to_string(dir.first) + " posts " + std::to_string(d.sends.size()) +
          " ncclSend to rank " + std::to_string(dir.second) + " but rank " +
          std::to_string(dir.second) + " posts " + std::to_string(d.recvs.size()) +
          " ncclRecv from rank " + std::to_string(dir.first) + " in this group");
    const auto& known = is_local(dir.first) ? d.sends : d.recvs;
    for (std::size_t k = 0; k < known.size(); ++k) {
      const uint64_t b = known[k]->count * ef::size_of(known[k]->dtype);
      if (both) {
        const uint64_t rb = d.recvs[k]->count * ef::size_of(d.recvs[k]->dtype);
        if (rb != b)
          return ApiStatus::invalid_usage(
              "send #" + std::to_string(k) + " from rank " + std::to_string(dir.first) +
              " to rank " + std::to_string(dir.second) + " has " + std::to_string(b) +
              " bytes but the matching receive has " + std::to_string(rb));
      }
      bytes[dir].push_back(b);
    }
  }

  std::vector<cudaStream_t> streams;
  for (const auto& [rank, stream] : stream_of) streams.push_back(stream);
  StatusOr<bool> capturing = any_capturing(streams);
  if (!capturing) return ApiStatus::cuda(capturing.status().message());

  // Pairs in one global order (a < b), messages in order; each launch involves both ranks of
  // its pair, so every rank runs its launches in the same global order: no cycle can form.
  std::set<std::pair<int32_t, int32_t>> pairs;
  for (const auto& [dir, d] : directions)
    pairs.insert({std::min(dir.first, dir.second), std::max(dir.first, dir.second)});
  const uint64_t op_count = launches_++;
  std::size_t nlaunches = 0;
  for (const auto& [a, b] : pairs) {
    if (a == b) {  // to self: a copy on the rank's stream
      const Direction& d = directions[{a, a}];
      if (d.sends.size() != d.recvs.size())
        return ApiStatus::invalid_usage("rank " + std::to_string(a) + " posts " +
                                        std::to_string(d.sends.size()) + " ncclSend to itself but " +
                                        std::to_string(d.recvs.size()) + " ncclRecv from itself");
      for (std::size_t k = 0; k < d.sends.size(); ++k) {
        const uint64_t sb = d.sends[k]->count * ef::size_of(d.sends[k]->dtype);
        if (sb == 0) continue;
        cudaSetDevice(device(a));
        if (ApiStatus s = cuda_status(cudaMemcpyAsync(d.recvs[k]->recvbuff, d.sends[k]->sendbuff, sb,
                                                      cudaMemcpyDeviceToDevice, stream_of[a]),
                                      "ncclSend/ncclRecv to self on rank " + std::to_string(a));
            !s)
          return s;
      }
      continue;
    }
    const std::vector<uint64_t>& ab = bytes[{a, b}];
    const std::vector<uint64_t>& ba = bytes[{b, a}];
    const Direction& dab = directions[{a, b}];
    const Direction& dba = directions[{b, a}];
    for (std::size_t k = 0; k < std::max(ab.size(), ba.size()); ++k) {
      const uint64_t bytes_ab = k < ab.size() ? ab[k] : 0, bytes_ba = k < ba.size() ? ba[k] : 0;
      if (bytes_ab == 0 && bytes_ba == 0) continue;
      // The pair's four buffers (a's send, b's receive, b's send, a's receive); those of the
      // other process's ranks stay null.
      void* const buffer[4] = {
          bytes_ab > 0 && is_local(a) ? const_cast<void*>(dab.sends[k]->sendbuff) : nullptr,
          bytes_ab > 0 && is_local(b) ? dab.recvs[k]->recvbuff : nullptr,
          bytes_ba > 0 && is_local(b) ? const_cast<void*>(dba.sends[k]->sendbuff) : nullptr,
          bytes_ba > 0 && is_local(a) ? dba.recvs[k]->recvbuff : nullptr};
      // The pair's rounds for these sizes: planned and prepared once, then reused (programs
      // and executors depend only on the pair and the sizes).
      const PairKey pkey{a, b, bytes_ab, bytes_ba};
      auto cached = pair_rounds_.find(pkey);
      if (cached == pair_rounds_.end()) {
        // Planned with stand-in addresses in a fixed order, so that every process derives the
        // same programs (each side has one buffer, at chunk 0).
        static char stand_in[4];
        std::vector<Transfer> transfers;
        if (bytes_ab > 0) transfers.push_back({a, b, &stand_in[0], &stand_in[1], bytes_ab});
        if (bytes_ba > 0) transfers.push_back({b, a, &stand_in[2], &stand_in[3], bytes_ba});
        const auto slot = [&](const void* p) {
          for (int i = 0; i < 4; ++i)
            if (p == &stand_in[i]) return i;
          return -1;
        };
        std::vector<PairRound> prepared;
        const auto protocol_for = [this](uint64_t size) { return registry_->p2p_protocol(size); };
        for (P2pRound& round : plan_p2p_rounds(transfers, &p2p_channels, protocol_for)) {
          const std::pair<int32_t, int32_t> pair{a, b};
          PairRound pr;
          device::ExecutorConfig config;
          config.slot_bytes = round.slot_bytes;
          if (ApiStatus s = executor_for(
                  round.program, round.signature, round.ranks, *capturing, round.chunk_bytes,
                  ef::DataType::kInt8,
                  [this, pair] {
                    return kPairExchangeTag | (static_cast<uint64_t>(pair.first) << 40) |
                           (static_cast<uint64_t>(pair.second) << 20) | pair_exchanges_[pair]++;
                  },
                  &pr.executor, config);
              !s)
            return s;
          pr.chunk_bytes = round.chunk_bytes;
          pr.ranks = round.ranks;
          for (const void* in : round.inputs) pr.input_slot.push_back(slot(in));
          for (const void* out : round.outputs) pr.output_slot.push_back(slot(out));
          prepared.push_back(std::move(pr));
        }
        if (pair_rounds_.size() >= kMaxCachedPairPlans) pair_rounds_.clear();  // executors stay
        cached = pair_rounds_.emplace(pkey, std::move(prepared)).first;
      }
      for (const PairRound& round : cached->second) {
        Launch l;
        l.executor = round.executor;
        l.args.count = round.chunk_bytes;
        l.args.dtype = ef::DataType::kInt8;
        l.args.op = ef::RedOp::kSum;
        l.args.inplace = false;
        l.args.timeout = timeout_;
        l.capturing = *capturing;
        for (int i : round.input_slot) l.args.inputs.push_back(i < 0 ? nullptr : buffer[i]);
        for (int i : round.output_slot) l.args.outputs.push_back(i < 0 ? nullptr : buffer[i]);
        for (int32_t r : round.ranks) {
          if (!is_local(r)) continue;
          l.ranks.push_back(r);
          l.rank_streams.push_back(stream_of[r]);
        }
        if (ApiStatus s = launch(l); !s) return s;
        ++nlaunches;
      }
    }
  }
  EFCCL_INFO(kLogP2p, -1,
             "send/recv group: opCount " + std::to_string(op_count) + " over " +
                 std::to_string(pairs.size()) + " pair(s) of ranks in " +
                 std::to_string(nlaunches) + " launch(es), one pair per launch (multi-process)" +
                 (*capturing ? " (captured)" : ""));
  notify_selection({"p2p", "p2p", "runtime",
                    std::to_string(nlaunches) + " pair launch(es)", false, calls.size(), nranks()});
  return ApiStatus::ok();
}

// ---------------------------------------------------------------------------------------------
// Executors and launches

StatusOr<bool> Clique::any_capturing(const std::vector<cudaStream_t>& streams) const {
  bool capturing = false;
  for (cudaStream_t s : streams) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(s, &status);
    if (e != cudaSuccess)
      return Status::error(std::string("cudaStreamIsCapturing: ") + cudaGetErrorString(e));
    if (status == cudaStreamCaptureStatusInvalidated)
      return Status::error("a stream's CUDA graph capture has been invalidated");
    capturing = capturing || status == cudaStreamCaptureStatusActive;
  }
  return capturing;
}

const std::string& Clique::fingerprint(const ef::Program& program) {
  auto it = fingerprints_.find(&program);
  if (it == fingerprints_.end()) {
    const std::string json = ef::save_json(program);
    std::ostringstream f;
    f << program.name << "/" << program.nranks << "/" << std::hex << std::hash<std::string>{}(json)
      << "/" << std::dec << json.size();
    it = fingerprints_.emplace(&program, f.str()).first;
  }
  return it->second;
}

std::unique_ptr<device::PeerProcesses> Clique::peers_for(const std::vector<int32_t>& ranks,
                                                         const std::string& key, uint64_t tag) {
  if (processes_ == nullptr) return nullptr;
  const ProcessMap& pm = *processes_;
  std::set<int32_t> leaders;
  bool remote = false;
  for (int32_t r : ranks) {
    leaders.insert(pm.leader[static_cast<std::size_t>(r)]);
    remote = remote || !pm.local[static_cast<std::size_t>(r)];
  }
  if (!remote) return nullptr;
  auto peers = std::make_unique<device::PeerProcesses>();
  for (int32_t r : ranks) {
    peers->local.push_back(pm.local[static_cast<std::size_t>(r)]);
    peers->location.push_back(pm.location[static_cast<std::size_t>(r)]);
  }
  peers->fingerprint = key;
  std::shared_ptr<Bootstrap> boot = pm.bootstraps.front();
  const std::vector<int32_t> leader_list(leaders.begin(), leaders.end());
  const std::chrono::nanoseconds timeout = timeout_;
  const std::atomic<bool>* abort = &aborted_;
  std::vector<int32_t> rank_leader;
  for (int32_t r : ranks) rank_leader.push_back(pm.leader[static_cast<std::size_t>(r)]);
  peers->exchange = [boot, leader_list, rank_leader, tag, timeout,
                     abort](const std::string& mine) -> StatusOr<std::vector<std::string>> {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<int> subset(leader_list.begin(), leader_list.end());
    StatusOr<std::vector<std::string>> got = boot->allgather(subset, tag, mine, deadline, abort);
    if (!got) return got.status();
    std::vector<std::string> per_rank;
    for (int32_t leader : rank_leader) {
      const auto i = std::lower_bound(subset.begin(), subset.end(), leader) - subset.begin();
      per_rank.push_back((*got)[static_cast<std::size_t>(i)]);
    }
    return per_rank;
  };
  return peers;
}

std::string Clique::executor_key(const std::string& key, const std::vector<int32_t>& ranks) {
  std::string full_key = key + "@";
  bool every_rank = ranks.size() == static_cast<std::size_t>(nranks());
  for (std::size_t i = 0; every_rank && i < ranks.size(); ++i) every_rank = ranks[i] == static_cast<int32_t>(i);
  if (every_rank) {
    full_key += all_ranks_suffix();
  } else {
    for (int32_t r : ranks) full_key += std::to_string(r) + ":" + std::to_string(device(r)) + ",";
  }
  return full_key;
}

ApiStatus Clique::executor_for(const ef::Program& program, const std::string& key,
                               const std::vector<int32_t>& ranks, bool capturing, uint64_t count,
                               ef::DataType dtype, const std::function<uint64_t()>& tag,
                               device::DeviceExecutor** out, const device::ExecutorConfig& config) {
  const std::string full_key = executor_key(key, ranks);
  if (device::DeviceExecutor* cached = executors_.find(full_key); cached != nullptr) {
    *out = cached;
    return ApiStatus::ok();
  }
  // Creating an executor may evict one that a launch of the batch uses, and across processes
  // it waits for the others: enqueue what is pending first. A single-process capture evicts
  // nothing (below), so its batch keeps growing.
  if (processes_ != nullptr || !capturing) flush_batch();
  std::vector<int> devices;
  for (int32_t r : ranks) devices.push_back(is_local(r) ? device(r) : -1);

  // Multi-process executors are never evicted: every process must create each one at the
  // same call, which holds only while their caches agree. Nor is anything evicted during a
  // capture: destroying an executor synchronises its devices, which a capture forbids; the
  // cache stays one over its capacity until a later eager call evicts.
  const bool shared = processes_ != nullptr;
  while (!shared && !capturing) {
    std::unique_ptr<device::DeviceExecutor> victim = executors_.evict_one();
    if (victim == nullptr) break;
    std::lock_guard<std::mutex> lock(exec_list_mu_);
    live_executors_.erase(std::remove(live_executors_.begin(), live_executors_.end(), victim.get()),
                          live_executors_.end());
  }  // each victim waits for its launches as it goes
  if (!shared && executors_.size() >= executors_.capacity())
    EFCCL_INFO(kLogAlloc, device(ranks.front()),
               "executor cache: " +
                   std::string(capturing ? "no eviction during a CUDA graph capture"
                                         : "all " + std::to_string(executors_.size()) +
                                               " cached executors are pinned by captured CUDA graphs") +
                   "; keeping one more (EFCCL_EXECUTOR_CACHE " +
                   std::to_string(executors_.capacity()) + ")");

  std::unique_ptr<device::PeerProcesses> peers;
  if (shared) {
    // Registry programs live as long as the clique (cached by address); generated ones (p2p)
    // are temporaries, whose key already spells out their structure.
    std::string k = (key.rfind("coll:", 0) == 0 ? fingerprint(program) : key) + " ranks";
    for (int32_t r : ranks) k += " " + std::to_string(r);
    peers = peers_for(ranks, k, tag());
  }
  auto created = device::DeviceExecutor::create(program, devices, config, peers.get());
  if (!created) {
    bool remote_failure = false;
    if (peers != nullptr) {
      std::lock_guard<std::mutex> lock(exec_list_mu_);
      remote_failure = !peer_failure_;
    }
    return ApiStatus(remote_failure ? ncclRemoteError : ncclInternalError,
                     "preparing program '" + program.name + "' on the GPUs: " +
                         created.status().message());
  }
  EFCCL_INFO(kLogInit | kLogAlloc, (*created)->devices().front(),
             "prepared program '" + program.name + "' (" + std::to_string(program.nranks) +
                 " ranks) on " + std::to_string((*created)->devices().size()) + " device(s)" +
                 (peers != nullptr ? " of this process, connected to other processes through CUDA IPC" : ""));
  if (!(*created)->protocol_note().empty())
    EFCCL_INFO(kLogInit, (*created)->devices().front(), (*created)->protocol_note());
  // Cached before anything else can fail: the other processes cached theirs (whose kernels
  // point into this one's arenas), so this one must keep it too.
  device::DeviceExecutor* executor = executors_.insert(full_key, std::move(created.value()));
  {
    std::lock_guard<std::mutex> lock(exec_list_mu_);
    live_executors_.push_back(executor);
  }
  // Size scratch for this call now, so that a later capture of the same call needs no growth.
  if (Status s = executor->reserve(count, dtype); !s)
    return ApiStatus::system("allocating scratch for program '" + program.name + "': " + s.message());
  *out = executor;
  return ApiStatus::ok();
}

ApiStatus Clique::pin_to_captures(const device::DeviceExecutor* executor,
                                  const std::vector<cudaStream_t>& streams) {
  std::vector<cudaGraph_t> graphs;  // distinct: the streams may join one capture
  for (cudaStream_t stream : streams) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t graph = nullptr;
    if (ApiStatus s = cuda_status(cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph),
                                  "cudaStreamGetCaptureInfo");
        !s)
      return s;
    if (status == cudaStreamCaptureStatusActive && graph != nullptr &&
        std::find(graphs.begin(), graphs.end(), graph) == graphs.end())
      graphs.push_back(graph);
  }
  for (cudaGraph_t graph : graphs) {
    void* pin = executors_.pin(executor);
    if (pin == nullptr) return ApiStatus::internal("pinning an executor that is not cached");
    cudaUserObject_t object = nullptr;
    cudaError_t e = cudaUserObjectCreate(&object, pin, release_executor_pin, 1,
                                         cudaUserObjectNoDestructorSync);
    if (e != cudaSuccess) {
      ExecutorCache<device::DeviceExecutor>::release_pin(pin);
      return cuda_status(e, "cudaUserObjectCreate (pinning program '" +
                                executor->program().name + "' to the captured graph)");
    }
    // The graph takes our reference; destroying the graph and its executables releases it.
    e = cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove);
    if (e != cudaSuccess) {
      (void)cudaUserObjectRelease(object, 1);  // runs release_executor_pin
      return cuda_status(e, "cudaGraphRetainUserObject (pinning program '" +
                                executor->program().name + "' to the captured graph)");
    }
  }
  return ApiStatus::ok();
}

ApiStatus Clique::prepare_launch(Launch& l) {
  if (Status s = l.executor->error_status(); !s)
    return ApiStatus(kernel_failure_code(s.message()),
                     "an earlier launch of this program failed: " + s.message());
  // A captured graph replays this executor's memory until the graph is destroyed: it must
  // not be evicted before (executor_cache.h).
  if (l.capturing)
    if (ApiStatus s = pin_to_captures(l.executor, l.rank_streams); !s) return s;
  const std::vector<int>& devices = l.executor->devices();
  // Per device: the launch stream is the stream of its lowest clique rank, the same for every
  // program run on the device (runs on one stream can share a fused launch).
  l.launch_rank.assign(devices.size(), SIZE_MAX);
  l.device_index.assign(l.ranks.size(), 0);
  l.args.streams.assign(devices.size(), nullptr);
  for (std::size_t i = 0; i < l.ranks.size(); ++i) {
    const int d = device(l.ranks[i]);
    const auto di = static_cast<std::size_t>(std::lower_bound(devices.begin(), devices.end(), d) -
                                             devices.begin());
    l.device_index[i] = di;
    if (l.launch_rank[di] == SIZE_MAX || l.ranks[i] < l.ranks[l.launch_rank[di]]) {
      l.launch_rank[di] = i;
      l.args.streams[di] = l.rank_streams[i];
    }
  }
  // Other ranks' streams on the same device: the launch waits for them, and they for it.
  for (std::size_t i = 0; i < l.ranks.size(); ++i) {
    cudaStream_t launch_stream = l.args.streams[l.device_index[i]];
    if (l.rank_streams[i] == launch_stream) continue;
    const auto r = static_cast<std::size_t>(l.ranks[i]);
    cudaSetDevice(device(l.ranks[i]));
    if (ApiStatus s = cuda_status(cudaEventRecord(ready_[r], l.rank_streams[i]), "cudaEventRecord");
        !s)
      return s;
    if (ApiStatus s = cuda_status(cudaStreamWaitEvent(launch_stream, ready_[r], 0), "cudaStreamWaitEvent");
        !s)
      return s;
  }
  return ApiStatus::ok();
}

ApiStatus Clique::join_after_launch(const Launch& l) {
  const std::vector<int>& devices = l.executor->devices();
  for (std::size_t di = 0; di < devices.size(); ++di) {
    const std::size_t i0 = l.launch_rank[di];
    bool joined = false;
    for (std::size_t i = 0; i < l.ranks.size(); ++i) {
      if (l.device_index[i] != di || l.rank_streams[i] == l.args.streams[di]) continue;
      const auto r0 = static_cast<std::size_t>(l.ranks[i0]);
      cudaSetDevice(devices[di]);
      if (!joined) {
        if (ApiStatus s = cuda_status(cudaEventRecord(done_[r0], l.args.streams[di]), "cudaEventRecord");
            !s)
          return s;
        joined = true;
      }
      if (ApiStatus s = cuda_status(cudaStreamWaitEvent(l.rank_streams[i], done_[r0], 0),
                                    "cudaStreamWaitEvent");
          !s)
        return s;
    }
  }
  return ApiStatus::ok();
}

namespace {
ApiStatus run_failure(const Status& s) {
  const bool capture = s.message().find("capture") != std::string::npos;
  return ApiStatus(capture ? ncclInvalidUsage : ncclInternalError, s.message());
}
}  // namespace

ApiStatus Clique::launch(Launch& l) {
  if (ApiStatus s = prepare_launch(l); !s) return s;
  if (batching_) {
    batch_.push_back(std::move(l));
    return ApiStatus::ok();
  }
  // The ranks' streams are joined to the launch stream even when a launch failed: a device
  // whose launch went out runs (and is aborted) on it, and the ranks' later work must follow.
  const Status s = l.executor->run(l.args);
  const ApiStatus joined = join_after_launch(l);
  if (!s) return run_failure(s);
  return joined;
}

const std::string& Clique::all_ranks_suffix() {
  // Every rank in order (collectives): the same suffix on every call, built once.
  if (all_ranks_suffix_.empty())
    for (int32_t r = 0; r < nranks(); ++r)
      all_ranks_suffix_ += std::to_string(r) + ":" + std::to_string(device(r)) + ",";
  return all_ranks_suffix_;
}

int Clique::batch_instance(const ef::Program& program, const char* key) {
  if (!batching_ || processes_ != nullptr) return 0;
  int& uses = batch_uses_[&program];
  const int k = uses++;
  if (k == 0) return 0;
  // The first use's executor is cached (it is in this batch): its connection memory says how
  // many copies the budget allows.
  const device::DeviceExecutor* first = executors_.find(std::string(key) + "@" + all_ranks_suffix());
  if (first == nullptr) return 0;
  const std::size_t bytes = std::max<std::size_t>(first->connection_bytes(), 1);
  const auto copies = static_cast<int>(
      std::min<std::size_t>(kMaxBatchInstances, std::max<std::size_t>(1, kBatchInstanceBytes / bytes)));
  return k % copies;
}

void Clique::flush_batch() {
  if (batch_.empty()) return;
  std::deque<Launch> launches;
  launches.swap(batch_);
  std::vector<device::BatchCall> calls;
  calls.reserve(launches.size());
  for (Launch& l : launches) calls.push_back({l.executor, &l.args});
  device::BatchReport report;
  ApiStatus status;
  const Status s = calls.size() == 1 ? launches.front().executor->run(launches.front().args)
                                     : device::DeviceExecutor::run_batch(calls, &report);
  if (!s) status = run_failure(s);
  // Joined after a failure too: the launches that went out before it run on their launch
  // streams (aborted), and every rank's later work must follow them.
  for (const Launch& l : launches)
    if (ApiStatus j = join_after_launch(l); !j && status) status = j;
  if (calls.size() > 1)
    EFCCL_INFO(kLogColl, device(launches.front().ranks.front()),
               "group: " + std::to_string(calls.size()) + " program runs enqueued in " +
                   std::to_string(report.launches) + " launch(es) (" +
                   std::to_string(report.fused_calls) + " device part(s) fused)");
  if (!status && batch_failure_) batch_failure_ = status;
}

// ---------------------------------------------------------------------------------------------
// Errors, abort, finalize

ApiStatus Clique::async_error(int32_t rank) {
  {
    // A set of single-driver calls queued past its deadline becomes an error here too (unless
    // another thread is submitting, which checks that itself).
    std::unique_lock<std::mutex> queue_lock(mu_, std::try_to_lock);
    if (queue_lock.owns_lock()) queue_->expire();
  }
  std::lock_guard<std::mutex> lock(exec_list_mu_);
  if (!async_error_.is_ok()) return async_error_;
  // A dead peer aborts every executor (peer_failed), so from then on this reports
  // ncclRemoteError naming it, as do later calls.
  for (device::DeviceExecutor* e : live_executors_) {
    if (Status s = e->error_status(); !s) {
      async_error_ =
          !peer_failure_
              ? ApiStatus(ncclRemoteError, peer_failure_.message() + "; a kernel of program '" +
                                               e->program().name + "' gave up: " + s.message())
              : ApiStatus(kernel_failure_code(s.message()),
                          "a kernel of program '" + e->program().name + "' failed: " + s.message());
      EFCCL_WARN(-1, async_error_.message());
      return async_error_;
    }
  }
  if (!peer_failure_) return peer_failure_;
  if (aborted_.load()) return ApiStatus::invalid_usage("the communicator has been aborted");
  return queue_->error_of(rank);
}

void Clique::peer_failed(int32_t peer, const std::string& why) {
  std::string where = "rank " + std::to_string(peer);
  if (processes_ != nullptr && peer >= 0 && peer < nranks())
    where += " (" + processes_->where[static_cast<std::size_t>(peer)] + ")";
  {
    std::lock_guard<std::mutex> lock(exec_list_mu_);
    if (!peer_failure_) return;
    peer_failure_ = ApiStatus(ncclRemoteError, where + " is gone: " + why);
    for (device::DeviceExecutor* e : live_executors_) e->abort();
    aborted_.store(true);  // an exchange waiting on the bootstrap gives up too
  }
  EFCCL_WARN(-1, "communicator peer " + where + " disconnected without destroying its "
                 "communicator (" + why + "); this rank's running kernels give up and later "
                 "calls fail with ncclRemoteError");
}

void Clique::abort(int32_t rank) {
  aborted_.store(true);
  std::lock_guard<std::mutex> lock(exec_list_mu_);
  for (device::DeviceExecutor* e : live_executors_) e->abort();
  EFCCL_INFO(kLogInit, device(rank), "rank " + std::to_string(rank) +
                                         " aborted its communicator; every kernel of its clique "
                                         "gives up");
}

void Clique::release(int32_t rank, bool abort) {
  if (abort) this->abort(rank);
  std::lock_guard<std::mutex> lock(mu_);
  queue_->remove_rank(rank, abort ? "aborted (ncclCommAbort)" : "destroyed (ncclCommDestroy)");
}

ApiStatus Clique::finalize(int32_t rank) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (ApiStatus s = queue_->flush(rank, lock); !s) return s;
  }
  DeviceGuard guard;
  if (ApiStatus s = cuda_status(cudaSetDevice(device(rank)), "cudaSetDevice"); !s) return s;
  if (ApiStatus s = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); !s) return s;
  return async_error(rank);
}

Clique::CacheStats Clique::executor_cache_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return {executors_.size(), executors_.pinned(), executors_.capacity()};
}

}  // namespace efccl::runtime
