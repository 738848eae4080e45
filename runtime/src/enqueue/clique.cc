#include "enqueue/clique.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "base/device_guard.h"
#include "base/settings.h"
#include "efccl/common/log.h"
#include "efccl/device/resident.h"
#include "efccl/net/bootstrap.h"
#include "launch/collective_runner.h"
#include "launch/launch_batch.h"
#include "launch/p2p_runner.h"
#include "enqueue/served_calls.h"

namespace efccl::runtime {
namespace {

/// The most ranks on one GPU when every rank's GPU also holds ranks of other processes (known
/// alike in every process, so their tuning picks the same programs), else 0.
int32_t ranks_per_shared_gpu(const ProcessMap& pm) {
  if (pm.gpu.size() != pm.location.size() || pm.gpu.empty()) return 0;
  std::map<std::string, std::pair<int32_t, std::set<int64_t>>> gpus;  // ranks, locations
  for (std::size_t r = 0; r < pm.gpu.size(); ++r) {
    if (pm.gpu[r].empty()) return 0;
    auto& g = gpus[pm.gpu[r]];
    ++g.first;
    g.second.insert(pm.location[r]);
  }
  int32_t most = 0;
  for (const auto& [gpu, g] : gpus) {
    if (g.second.size() < 2) return 0;
    most = std::max(most, g.first);
  }
  return most;
}

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

ApiStatus cuda_status(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(what + ": " + cudaGetErrorString(e));
}

}  // namespace

Clique::Clique(std::vector<int> rank_devices, std::unique_ptr<ProgramRegistry> registry,
               std::unique_ptr<ProcessMap> processes)
    : registry_(std::move(registry)),
      processes_(std::move(processes)),
      nlocal_(static_cast<int32_t>(rank_devices.size())),
      fusion_(group_fusion_enabled()) {
  launch_.rank_devices = std::move(rank_devices);
  launch_.processes = processes_.get();
  launch_.registry = registry_.get();
  launch_.timeout = call_timeout();
  launch_.direct = direct_enabled();
  if (processes_ != nullptr)
    nlocal_ =
        static_cast<int32_t>(std::count(processes_->local.begin(), processes_->local.end(), true));
  executors_ = std::make_unique<ExecutorStore>(launch_.rank_devices, processes_.get(),
                                               executor_cache_capacity(), launch_.timeout,
                                               &aborted_, &peer_gone_);
  launch_.executors = executors_.get();
}

StatusOr<std::shared_ptr<Clique>> Clique::create(std::vector<int> rank_devices,
                                                 std::unique_ptr<ProgramRegistry> registry,
                                                 std::unique_ptr<ProcessMap> processes) {
  const std::size_t n = rank_devices.size();
  if (processes != nullptr && (processes->local.size() != n || processes->location.size() != n ||
                               processes->leader.size() != n || processes->where.size() != n ||
                               processes->bootstraps.empty()))
    return Status::error("internal: incomplete process map");
  // Ranks of one process on one GPU run every call in one launch, which programs of mrc ops
  // need (they read and write the other ranks' buffers); EFCCL_DIRECT=0 keeps them off too.
  const bool shared_launch =
      processes == nullptr && n > 1 && direct_enabled() &&
      std::all_of(rank_devices.begin(), rank_devices.end(),
                  [&](int d) { return d == rank_devices.front(); });
  if (registry != nullptr) registry->set_shared_launch(shared_launch);
  if (registry != nullptr && processes != nullptr)
    registry->set_ranks_per_shared_gpu(ranks_per_shared_gpu(*processes));
  std::shared_ptr<Clique> c(
      new Clique(std::move(rank_devices), std::move(registry), std::move(processes)));
  if (c->processes_ != nullptr) {
    // A peer process that dies makes this clique's kernels give up at once.
    std::weak_ptr<Clique> weak = c;
    const std::shared_ptr<net::Bootstrap>& boot = c->processes_->bootstraps.front();
    boot->set_peer_failure_handler([weak](int peer, const std::string& why) {
      if (auto clique = weak.lock()) clique->peer_failed(peer, why);
    });
    // So does a network connection to another host that fails (on a proxy thread).
    c->executors_->set_network_failure_handler([weak](ncclResult_t code, const std::string& why) {
      if (auto clique = weak.lock()) clique->network_failed(code, why);
    });
    // Deaths are noticed on open connections: connect to every other process's leader now.
    std::set<int32_t> leaders(c->processes_->leader.begin(), c->processes_->leader.end());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (int32_t l : leaders)
      if (l != boot->rank())
        if (Status s = boot->connect(l, deadline); !s)
          return Status::error("connecting to rank " + std::to_string(l) +
                               "'s process: " + s.message());
  }
  std::vector<bool> local(n);
  for (std::size_t r = 0; r < n; ++r) local[r] = c->is_local(static_cast<int32_t>(r));
  auto streams = RankStreams::create(c->launch_.rank_devices, local);
  if (!streams) return streams.status();
  c->streams_ = std::move(*streams);
  c->queue_ = std::make_unique<CallQueue>(std::move(local), c->launch_.timeout, &c->aborted_);
  c->batch_ = std::make_unique<LaunchBatch>(*c->executors_, *c->streams_, c->fusion_);
  if (resident_enabled()) {
    device::ResidentConfig config = device::resident_config();
    config.enabled = true;
    config.ctas = resident_ctas();
    device::set_resident_config(config);
    std::set<int> devices;
    for (std::size_t r = 0; r < n; ++r)
      if (c->is_local(static_cast<int32_t>(r))) devices.insert(c->launch_.rank_devices[r]);
    for (int d : devices) {
      device::retain_resident(d);
      c->resident_devices_.push_back(d);
    }
  }
  return c;
}

Clique::~Clique() {
  DeviceGuard guard;
  if (balancer_ != nullptr) {
    std::vector<int32_t> local;
    for (int32_t r = 0; r < nranks(); ++r)
      if (is_local(r)) local.push_back(r);
    balancer_->write_stats(local);
  }
  served_.reset();  // before the executors: its clique's launches end first
  batch_.reset();
  executors_.reset();  // each waits for its launches (aborted ones end within a millisecond)
  // The last communicator of a GPU stops its resident grid (within a second; docs/runtime.md).
  for (int d : resident_devices_)
    if (Status s = device::release_resident(d); !s) EFCCL_WARN(d, s.message());
}

void Clique::set_machine_graph(std::shared_ptr<const topo::ClusterGraph> graph,
                               bool every_process_sees_every_gpu) {
  machine_graph_ = std::move(graph);
  if (balance_enabled()) {
    balancer_ = std::make_unique<Balancer>(machine_graph_, launch_.rank_devices,
                                           processes_ != nullptr, every_process_sees_every_gpu);
    launch_.balancer = balancer_.get();
  }
}

void Clique::set_fallback(std::shared_ptr<CollectiveFallback> fallback) {
  fallback_ = std::move(fallback);
  launch_.fallback = fallback_.get();
}

void Clique::set_served(std::shared_ptr<ServedCalls> served) { served_ = std::move(served); }

uint64_t Clique::served_calls() const { return served_ != nullptr ? served_->served() : 0; }

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
    std::lock_guard<std::mutex> error_lock(error_mu_);
    if (!peer_failure_) return peer_failure_;
  }
  if (aborted_.load()) return ApiStatus::invalid_usage("the communicator has been aborted");
  if (served_ != nullptr) {
    ApiStatus served;
    if (served_->submit(calls, &served)) return served;
  }

  std::vector<Call> collectives, p2p;
  for (Call& c : calls) (is_p2p(c.kind) ? p2p : collectives).push_back(std::move(c));
  // The submission's launches (its collectives that became complete, then its send/receive
  // rounds) are enqueued together at the end.
  LaunchBatch& batch = *batch_;
  batch.start();
  std::optional<CallQueue::Admission> admission;
  std::vector<ApiStatus> ran;
  if (!collectives.empty()) {
    admission.emplace(queue_->admit(std::move(collectives), whole_clique));
    const bool alone = admission->ready().size() == 1 && p2p.empty();
    for (const std::vector<Call>& set : admission->ready())
      ran.push_back(run_collective(launch_, set, batch, alone));
  }
  const ApiStatus p2p_status = p2p.empty() ? ApiStatus::ok() : run_send_recv(launch_, p2p, batch);
  const ApiStatus flushed = batch.flush();
  if (launch_.balancer != nullptr) launch_.balancer->stats().after_flush();
  for (ApiStatus& s : ran)
    if (s) s = flushed;  // a set whose launches were all added fails with the batch
  ApiStatus first = admission ? queue_->settle(*admission, ran, unfinished) : ApiStatus::ok();
  if (!p2p_status && first) first = p2p_status;
  if (!p2p.empty() && !flushed && first) first = flushed;
  return first;
}

ApiStatus Clique::wait(const std::shared_ptr<CallQueue::Submission>& unfinished) {
  std::unique_lock<std::mutex> lock(mu_);
  return queue_->wait(unfinished, lock);
}

StatusOr<Plan> Clique::select(const CallShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return registry_->select(shape);
}

ApiStatus Clique::async_error(int32_t rank) {
  {
    // A set of single-driver calls queued past its deadline becomes an error here too (unless
    // another thread is submitting, which checks that itself).
    std::unique_lock<std::mutex> queue_lock(mu_, std::try_to_lock);
    if (queue_lock.owns_lock()) queue_->expire();
  }
  std::lock_guard<std::mutex> lock(error_mu_);
  if (!async_error_.is_ok()) return async_error_;
  // A dead peer aborts every executor (peer_failed), so from then on this reports
  // ncclRemoteError naming it, as do later calls.
  if (const ExecutorStore::KernelFailure f = executors_->first_kernel_failure(); !f.status) {
    const std::string& m = f.status.message();
    async_error_ =
        !peer_failure_
            ? ApiStatus(peer_failure_.code(), peer_failure_.message() + "; a kernel of program '" +
                                                  f.program + "' gave up: " + m)
            : ApiStatus(ExecutorStore::kernel_failure_code(m),
                        "a kernel of program '" + f.program + "' failed: " + m);
    EFCCL_WARN(-1, async_error_.message());
    return async_error_;
  }
  if (!peer_failure_) return peer_failure_;
  if (aborted_.load()) return ApiStatus::invalid_usage("the communicator has been aborted");
  if (served_ != nullptr)
    if (ApiStatus s = served_->error(); !s) return s;
  return queue_->error_of(rank);
}

void Clique::peer_failed(int32_t peer, const std::string& why) {
  std::string where = "rank " + std::to_string(peer);
  if (processes_ != nullptr && peer >= 0 && peer < nranks())
    where += " (" + processes_->where[static_cast<std::size_t>(peer)] + ")";
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!peer_failure_) return;
    peer_failure_ = ApiStatus(ncclRemoteError, where + " is gone: " + why);
    peer_gone_.store(true);
    executors_->abort_all();
    aborted_.store(true);  // an exchange waiting on the bootstrap gives up too
  }
  if (served_ != nullptr) served_->release("rank " + std::to_string(peer) + " is gone");
  EFCCL_WARN(-1, "communicator peer " + where +
                     " disconnected without destroying its "
                     "communicator (" +
                     why +
                     "); this rank's running kernels give up and later "
                     "calls fail with ncclRemoteError");
}

void Clique::network_failed(ncclResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!peer_failure_) return;
    peer_failure_ = ApiStatus(code, "a network connection to another host failed: " + why);
    if (code == ncclRemoteError) peer_gone_.store(true);
    executors_->abort_all();
    aborted_.store(true);  // an exchange waiting on the bootstrap gives up too
  }
  if (served_ != nullptr) served_->release("a network connection failed");
  EFCCL_WARN(-1, "network connection failed (" + why +
                     "); this rank's running kernels give up and later calls fail with " +
                     (code == ncclRemoteError ? "ncclRemoteError" : "ncclSystemError"));
}

void Clique::abort(int32_t rank) {
  aborted_.store(true);
  executors_->abort_all();
  if (served_ != nullptr) served_->release("ncclCommAbort");
  EFCCL_INFO(kLogInit, device(rank),
             "rank " + std::to_string(rank) +
                 " aborted its communicator; every kernel of its clique "
                 "gives up");
}

ApiStatus Clique::wait_for_kernels() {
  DeviceGuard guard;
  std::lock_guard<std::mutex> lock(mu_);
  if (Status s = executors_->wait_launches(); !s) return ApiStatus::cuda(s.message());
  return ApiStatus::ok();
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

ExecutorStore::Stats Clique::executor_cache_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return executors_->stats();
}

}  // namespace efccl::runtime
