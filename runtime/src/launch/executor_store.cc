#include "launch/executor_store.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "base/settings.h"
#include "efccl/common/hash.h"
#include "efccl/common/log.h"
#include "efccl/ef/json_io.h"
#include "efccl/net/bootstrap.h"
#include "launch/launch_batch.h"
#include "launch/network_links.h"
#include "launch/network_proxy.h"

namespace efccl::runtime {
namespace {

/// Exchange tags: one namespace for registry programs, one per pair of ranks for send/receive
/// rounds (the regroups of comm/regroup.cc use a third).
constexpr uint64_t kProgramExchangeTag = uint64_t{1} << 62;
constexpr uint64_t kPairExchangeTag = uint64_t{2} << 62;

/// The destructor of the CUDA user object that pins an executor to a captured graph: runs on a
/// CUDA-internal thread, so it only drops the pin count.
void CUDART_CB release_executor_pin(void* pin) {
  ExecutorCache<device::DeviceExecutor>::release_pin(pin);
}

ApiStatus cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(what + ": " + cudaGetErrorString(e));
}

/// PeerProcesses::connect_network: this process's ends of an executor's network connections
/// (program ranks; program rank i is communicator rank ranks[i]), connected through the
/// process's proxy, their handles carried leader to leader under the executor's exchange tag.
StatusOr<device::NetworkEnds> connect_network_ends(
    net::Bootstrap& boot, const std::vector<int32_t>& ranks, const std::vector<int32_t>& leader,
    const std::vector<device::NetworkEndRequest>& ends, uint64_t tag,
    std::chrono::nanoseconds timeout, const std::atomic<bool>* abort,
    const ExecutorStore::NetworkFailureHandler& on_failure) {
  auto proxy = network_proxy();
  if (!proxy) return proxy.status();
  const auto rank_of = [&](int32_t program_rank) {
    return ranks.at(static_cast<std::size_t>(program_rank));
  };
  std::vector<NetworkEndRequest> requests;
  for (const device::NetworkEndRequest& e : ends) {
    NetworkEndRequest r;
    r.sender = rank_of(e.sender);
    r.receiver = rank_of(e.receiver);
    r.channel = e.channel;
    r.send = e.send;
    r.layout.nslots = e.nslots;
    r.layout.slot_bytes = e.slot_bytes;
    r.layout.sized = true;  // the kernels write sizes[]: a short tile costs its bytes only
    requests.push_back(r);
  }
  NetworkLinks::Options options;
  options.pinned = true;
  options.tag = tag;
  const auto deadline =
      net::Deadline::after(std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  auto links =
      NetworkLinks::connect(**proxy, boot, leader, requests, options, deadline, abort, on_failure);
  if (!links) return links.status();
  device::NetworkEnds out;
  for (const NetworkEnd& e : (*links)->ends()) {
    const net::SlotLayout& l = e.request.layout;
    out.ends.push_back(
        {e.device, l.tail_offset(), l.head_offset(), l.sizes_offset(), l.slots_offset()});
  }
  out.owner = std::shared_ptr<NetworkLinks>(std::move(*links));
  return out;
}

}  // namespace

ExecutorStore::ExecutorStore(std::vector<int> rank_devices, const ProcessMap* processes,
                             std::size_t capacity, std::chrono::nanoseconds timeout,
                             const std::atomic<bool>* abort, const std::atomic<bool>* peer_gone)
    : rank_devices_(std::move(rank_devices)),
      processes_(processes),
      timeout_(timeout),
      abort_(abort),
      peer_gone_(peer_gone),
      cache_(capacity) {}

ExecutorStore::~ExecutorStore() {
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    live_.clear();
  }
  cache_.clear();  // each waits for its launches (aborted ones end within a millisecond)
}

std::string ExecutorStore::cache_key(const std::string& key, const std::vector<int32_t>& ranks) {
  std::string full = key + "@";
  bool every_rank = ranks.size() == rank_devices_.size();
  for (std::size_t i = 0; every_rank && i < ranks.size(); ++i)
    every_rank = ranks[i] == static_cast<int32_t>(i);
  if (every_rank) {
    if (all_ranks_suffix_.empty())  // built once: collectives ask on every call
      for (std::size_t r = 0; r < rank_devices_.size(); ++r)
        all_ranks_suffix_ += std::to_string(r) + ":" + std::to_string(rank_devices_[r]) + ",";
    return full + all_ranks_suffix_;
  }
  for (int32_t r : ranks)
    full +=
        std::to_string(r) + ":" + std::to_string(rank_devices_[static_cast<std::size_t>(r)]) + ",";
  return full;
}

device::DeviceExecutor* ExecutorStore::find(const std::string& cache_key) {
  return cache_.find(cache_key);
}

const std::string& ExecutorStore::fingerprint(const ef::Program& program) {
  auto it = fingerprints_.find(&program);
  if (it == fingerprints_.end()) {
    const std::string json = ef::save_json(program);
    char hex[24];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash64(json)));
    it = fingerprints_
             .emplace(&program, program.name + "/" + std::to_string(program.nranks) + "/" + hex +
                                    "/" + std::to_string(json.size()))
             .first;
  }
  return it->second;
}

uint64_t ExecutorStore::exchange_tag(const ExchangeName& name) {
  if (name.a >= 0) {
    // A pair of ranks: 20 bits each, then how many executors the pair created before.
    uint64_t& n = pair_exchanges_[{name.a, name.b}];
    return kPairExchangeTag | (static_cast<uint64_t>(name.a) << 40) |
           (static_cast<uint64_t>(name.b) << 20) | (n++ & 0xfffff);
  }
  // The program (so that processes that ever disagreed on one program do not disagree on
  // every later one), then how often it was prepared.
  const std::string& f = fingerprint(*name.program);
  const uint64_t h = hash64(f) & 0xffffffffffull;
  return kProgramExchangeTag | (h << 16) | (program_exchanges_[f]++ & 0xffff);
}

std::unique_ptr<device::PeerProcesses> ExecutorStore::peers_for(const std::vector<int32_t>& ranks,
                                                                const std::string& key,
                                                                uint64_t tag) {
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
  // Direct transfers between processes on one GPU: every process must decide alike, so the
  // setting is part of what their fingerprints compare.
  peers->direct = direct_between_processes_enabled();
  if (pm.gpu.size() == pm.local.size())
    for (int32_t r : ranks) peers->gpus.push_back(pm.gpu[static_cast<std::size_t>(r)]);
  if (pm.translate)  // program ranks -> communicator ranks
    peers->translate = [t = pm.translate, ranks](int rank, const void* p, std::size_t bytes,
                                                 int reader) -> std::optional<uint64_t> {
      const auto n = static_cast<int>(ranks.size());
      if (rank < 0 || rank >= n || reader < 0 || reader >= n) return std::nullopt;
      return t(ranks[static_cast<std::size_t>(rank)], p, bytes,
               ranks[static_cast<std::size_t>(reader)]);
    };
  peers->fingerprint = key + (peers->direct ? " direct-between-processes" : "");
  std::shared_ptr<net::Bootstrap> boot = pm.bootstraps.front();
  const std::vector<int> subset(leaders.begin(), leaders.end());
  std::vector<int32_t> rank_leader;
  for (int32_t r : ranks) rank_leader.push_back(pm.leader[static_cast<std::size_t>(r)]);
  const std::chrono::nanoseconds timeout = timeout_;
  const std::atomic<bool>* abort = abort_;
  std::set<uint64_t> hosts;
  for (int32_t r : ranks) hosts.insert(pm.host[static_cast<std::size_t>(r)]);
  if (hosts.size() > 1) {
    for (int32_t r : ranks) peers->hosts.push_back(pm.host[static_cast<std::size_t>(r)]);
    peers->connect_network =
        [boot, ranks, leader = pm.leader, tag, timeout, abort,
         on_failure = network_failure_](const std::vector<device::NetworkEndRequest>& ends) {
          return connect_network_ends(*boot, ranks, leader, ends, tag, timeout, abort, on_failure);
        };
  }
  // Called once, inside DeviceExecutor::create, at the same point in every process.
  peers->exchange = [boot, subset, rank_leader, tag, timeout,
                     abort](const std::string& mine) -> StatusOr<std::vector<std::string>> {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
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

ApiStatus ExecutorStore::get(const ef::Program& program, const std::string& key,
                             const std::vector<int32_t>& ranks, bool capturing, uint64_t count,
                             ef::DataType dtype, const ExchangeName& exchange, LaunchBatch& batch,
                             device::DeviceExecutor** out, const device::ExecutorConfig& config) {
  const std::string full_key = cache_key(key, ranks);
  if (device::DeviceExecutor* cached = cache_.find(full_key); cached != nullptr) {
    *out = cached;
    return ApiStatus::ok();
  }
  const bool shared = processes_ != nullptr;
  // Creating an executor may evict one that a pending launch uses, and across processes it
  // waits for the others: enqueue what is pending first. A single-process capture evicts
  // nothing (below), so its batch keeps growing.
  if (shared || !capturing) (void)batch.flush();  // a failure stays the batch's to report
  std::vector<int> devices;
  for (int32_t r : ranks) {
    const bool local = processes_ == nullptr || processes_->local[static_cast<std::size_t>(r)];
    devices.push_back(local ? rank_devices_[static_cast<std::size_t>(r)] : -1);
  }

  // Multi-process executors are never evicted: every process must create each one at the
  // same call, which holds only while their caches agree. Nor is anything evicted during a
  // capture: destroying an executor synchronises its devices, which a capture forbids; the
  // cache stays one over its capacity until a later eager call evicts.
  while (!shared && !capturing) {
    std::unique_ptr<device::DeviceExecutor> victim = cache_.evict_one();
    if (victim == nullptr) break;
    std::lock_guard<std::mutex> lock(live_mu_);
    live_.erase(std::remove(live_.begin(), live_.end(), victim.get()), live_.end());
  }  // each victim waits for its launches as it goes
  if (!shared && cache_.size() >= cache_.capacity())
    EFCCL_INFO(
        kLogAlloc, devices.front(),
        "executor cache: " +
            std::string(capturing ? "no eviction during a CUDA graph capture"
                                  : "all " + std::to_string(cache_.size()) +
                                        " cached executors are pinned by captured CUDA graphs") +
            "; keeping one more (EFCCL_EXECUTOR_CACHE " + std::to_string(cache_.capacity()) + ")");

  std::unique_ptr<device::PeerProcesses> peers;
  if (shared) {
    // Registry programs live as long as the clique (identified by fingerprint); generated ones
    // (send/receive rounds) are temporaries, whose key already spells out their structure.
    std::string k = (exchange.a < 0 ? fingerprint(program) : key) + " ranks";
    for (int32_t r : ranks) k += " " + std::to_string(r);
    peers = peers_for(ranks, k, exchange_tag(exchange));
  }
  auto created = device::DeviceExecutor::create(program, devices, config, peers.get());
  if (!created) {
    const bool remote_failure = peers != nullptr && peer_gone_ != nullptr && peer_gone_->load();
    return ApiStatus(
        remote_failure ? ncclRemoteError : ncclInternalError,
        "preparing program '" + program.name + "' on the GPUs: " + created.status().message());
  }
  const std::size_t network_ends = (*created)->network_ends();
  const std::size_t direct_ops[2] = {(*created)->direct_ops(false), (*created)->direct_ops(true)};
  EFCCL_INFO(
      kLogInit | kLogAlloc, (*created)->devices().front(),
      "prepared program '" + program.name + "' (" + std::to_string(program.nranks) + " ranks) on " +
          std::to_string((*created)->devices().size()) + " device(s)" +
          (peers != nullptr ? " of this process, connected to other processes through CUDA IPC"
                            : "") +
          (network_ends > 0 ? " and to other hosts through " + std::to_string(network_ends) +
                                  " network connection end(s)"
                            : "") +
          (direct_ops[0] + direct_ops[1] > 0
               ? "; ops moving data directly between ranks sharing a GPU: " +
                     std::to_string(direct_ops[0]) + " out of place, " +
                     std::to_string(direct_ops[1]) + " in place (unless EFCCL_DIRECT=0)"
               : ""));
  if (!(*created)->protocol_note().empty())
    EFCCL_INFO(kLogInit, (*created)->devices().front(), (*created)->protocol_note());
  // Cached before anything else can fail: the other processes cached theirs (whose kernels
  // point into this one's arenas), so this one must keep it too.
  device::DeviceExecutor* executor = cache_.insert(full_key, std::move(created.value()));
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    live_.push_back(executor);
  }
  // Scratch for this call now, so that a later capture of the same call needs no growth.
  if (Status s = executor->reserve(count, dtype); !s)
    return ApiStatus::system("allocating scratch for program '" + program.name +
                             "': " + s.message());
  *out = executor;
  return ApiStatus::ok();
}

ApiStatus ExecutorStore::ready_to_launch(const device::DeviceExecutor& executor,
                                         const std::vector<cudaStream_t>& streams, bool capturing) {
  if (Status s = executor.error_status(); !s)
    return ApiStatus(kernel_failure_code(s.message()),
                     "an earlier launch of this program failed: " + s.message());
  // A captured graph replays this executor's memory until the graph is destroyed: it must not
  // be evicted before (executor_cache.h).
  if (capturing) return pin_to_captures(&executor, streams);
  return ApiStatus::ok();
}

ApiStatus ExecutorStore::pin_to_captures(const device::DeviceExecutor* executor,
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
    void* pin = cache_.pin(executor);
    if (pin == nullptr) return ApiStatus::internal("pinning an executor that is not cached");
    cudaUserObject_t object = nullptr;
    cudaError_t e =
        cudaUserObjectCreate(&object, pin, release_executor_pin, 1, cudaUserObjectNoDestructorSync);
    if (e != cudaSuccess) {
      ExecutorCache<device::DeviceExecutor>::release_pin(pin);
      return cuda_status(e, "cudaUserObjectCreate (pinning program '" + executor->program().name +
                                "' to the captured graph)");
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

void ExecutorStore::abort_all() {
  std::lock_guard<std::mutex> lock(live_mu_);
  for (device::DeviceExecutor* e : live_) e->abort();
}

Status ExecutorStore::wait_launches() {
  std::vector<device::DeviceExecutor*> live;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    live = live_;
  }
  for (device::DeviceExecutor* e : live)  // the caller's lock keeps them from eviction
    if (Status s = e->wait_launches(); !s) return s;
  return Status::ok();
}

ncclResult_t ExecutorStore::kernel_failure_code(const std::string& message) {
  return message.rfind("timed out", 0) == 0 || message.rfind("aborted", 0) == 0 ||
                 message.rfind("skipped", 0) == 0
             ? ncclSystemError
             : ncclInternalError;
}

ExecutorStore::KernelFailure ExecutorStore::first_kernel_failure() {
  std::lock_guard<std::mutex> lock(live_mu_);
  for (device::DeviceExecutor* e : live_)
    if (Status s = e->error_status(); !s) return {e->program().name, s};
  return {};
}

ExecutorStore::Stats ExecutorStore::stats() const {
  return {cache_.size(), cache_.pinned(), cache_.capacity()};
}

}  // namespace efccl::runtime
