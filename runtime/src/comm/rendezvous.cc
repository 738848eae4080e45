#include "comm/rendezvous.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "base/pointer_text.h"
#include "base/settings.h"
#include "comm/communicator.h"
#include "comm/machine_graph.h"
#include "comm/shared_gpu_check.h"
#include "comm/shared_registrations.h"
#include "efccl/common/log.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/host_hash.h"
#include "enqueue/clique.h"
#include "enqueue/served_calls.h"
#include "fallback/nccl_fallback.h"
#include "select/program_registry.h"

namespace efccl::runtime {

/// The ranks that joined with one unique id, until their clique forms or fails.
/// Lock order: the pending-rendezvous mutex, then `mu`, then the live-communicator lock.
class Rendezvous {
 public:
  using Key = std::array<char, NCCL_UNIQUE_ID_BYTES>;
  enum class State { kCollecting, kBuilding, kFormed, kFailed };
  struct Member {
    int device = -1;
    std::string device_error;
    ncclComm* comm = nullptr;              ///< null once destroyed/aborted while building
    std::shared_ptr<net::Bootstrap> boot;  ///< this rank's connection to the others
    uint64_t thread = 0;  ///< this_thread_token() of the joining thread: the rank's first driver
  };

  Rendezvous(const Key& k, int n) : key(k), nranks(n) {}

  const Key key;
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  State state = State::kCollecting;  // below: under mu
  std::map<int, Member> members;     ///< by rank
  ApiStatus failure;                 ///< kFailed: why
  ApiStatus cancellation;            ///< set while kBuilding: fail instead of attaching
  /// The bootstrap's table of every rank (PeerInfo), once a member's bootstrap received it;
  /// `expected`: the ranks of this process, which must all join here.
  bool table_known = false;
  bool table_waiting = false;  ///< a thread is receiving the table (others wait on cv)
  std::vector<std::string> table;
  std::vector<int> expected;
  std::atomic<bool> abort{false};  ///< makes a bootstrap wait give up (destroy/abort/cancel)

  bool complete() const { return table_known && members.size() == expected.size(); }
};

namespace {

/// The rendezvous still collecting ranks in this process, by unique id.
std::mutex& pending_mutex() {
  static std::mutex m;
  return m;
}
std::map<Rendezvous::Key, std::shared_ptr<Rendezvous>>& pending() {
  static auto* m = new std::map<Rendezvous::Key, std::shared_ptr<Rendezvous>>();  // never destroyed
  return *m;
}

void stop_pending(const std::shared_ptr<Rendezvous>& r) {
  std::lock_guard<std::mutex> lock(pending_mutex());
  auto it = pending().find(r->key);
  if (it != pending().end() && it->second == r) pending().erase(it);
}

/// Fails the rendezvous and its communicators; `r->mu` held.
void fail_locked(Rendezvous& r, const ApiStatus& why) {
  r.abort.store(true);
  r.state = Rendezvous::State::kFailed;
  r.failure = why;
  for (auto& [rank, m] : r.members)
    if (m.comm != nullptr) fail_init(m.comm, why);
  r.cv.notify_all();
}

std::string missing_ranks(const Rendezvous& r) {
  std::ostringstream m;
  int shown = 0, missing = 0;
  for (int rank = 0; rank < r.nranks; ++rank) {
    if (r.members.count(rank) != 0) continue;
    if (r.table_known && std::find(r.expected.begin(), r.expected.end(), rank) == r.expected.end())
      continue;  // runs in another process
    ++missing;
    if (shown < 8) m << (shown++ == 0 ? "" : ", ") << rank;
  }
  if (missing > shown) m << ", ... (" << missing << " in all)";
  return m.str();
}

/// What each rank tells the others when it joins (Bootstrap info blob).
struct PeerInfo {
  uint64_t host_hash = 0;
  /// Random per process: pids repeat across PID namespaces (containers sharing a host).
  uint64_t process_nonce = 0;
  int32_t pid = 0;
  int32_t device = -1;
  char bus_id[32] = {};
  char host[64] = {};
};

uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return nonce;
}

std::string encode_info(int device) {
  PeerInfo info;
  info.host_hash = net::host_hash();
  info.process_nonce = process_nonce();
  info.pid = static_cast<int32_t>(getpid());
  info.device = device;
  if (device >= 0 &&
      cudaDeviceGetPCIBusId(info.bus_id, sizeof(info.bus_id) - 1, device) != cudaSuccess)
    (void)cudaGetLastError();
  gethostname(info.host, sizeof(info.host) - 1);
  return std::string(reinterpret_cast<const char*>(&info), sizeof(info));
}

bool decode_info(const std::string& blob, PeerInfo* info) {
  if (blob.size() != sizeof(PeerInfo)) return false;
  std::memcpy(info, blob.data(), sizeof(PeerInfo));
  info->bus_id[sizeof(info->bus_id) - 1] = '\0';
  info->host[sizeof(info->host) - 1] = '\0';
  return true;
}

/// Reads the table: which ranks run in this process (same host and pid). `r.mu` held.
ApiStatus learn_table_locked(Rendezvous& r, std::vector<std::string> table) {
  const int64_t me = getpid();
  const uint64_t host = net::host_hash();
  r.expected.clear();
  for (std::size_t rank = 0; rank < table.size(); ++rank) {
    PeerInfo info;
    if (!decode_info(table[rank], &info))
      return ApiStatus::system("rank " + std::to_string(rank) +
                               " sent a malformed description of itself during the rendezvous (" +
                               std::to_string(table[rank].size()) + " bytes, expected " +
                               std::to_string(sizeof(PeerInfo)) +
                               "): is it running another efccl?");
    // Ranks on other hosts meet this process's through network connections (docs/net.md);
    // a process is on one host, so only ranks of this host can be this process's.
    if (info.host_hash == host && info.pid == me && info.process_nonce == process_nonce())
      r.expected.push_back(static_cast<int>(rank));
  }
  r.table = std::move(table);
  r.table_known = true;
  for (const auto& [rank, m] : r.members)
    if (std::find(r.expected.begin(), r.expected.end(), rank) == r.expected.end())
      return ApiStatus::internal("rank " + std::to_string(rank) +
                                 " joined in this process but the bootstrap places it elsewhere");
  return ApiStatus::ok();
}

/// What create_fallback needs of a complete rendezvous (`r.mu` held, so the members'
/// communicators are alive). `processes`: null when every rank is in this process.
FallbackPlan fallback_plan_locked(const Rendezvous& r, const std::vector<int>& all_devices,
                                  const ProcessMap* processes,
                                  const std::vector<std::shared_ptr<net::Bootstrap>>& boots) {
  FallbackPlan plan;
  if (processes == nullptr) {
    plan = single_process_fallback_plan(all_devices);
  } else {
    // Several ranks on one GPU, in any processes of the host: NCCL refuses the communicator.
    // Decided from the table, so that every process decides alike.
    plan.nranks = r.nranks;
    std::map<std::string, int> first_rank_on;
    for (int rank = 0; rank < r.nranks; ++rank) {
      PeerInfo info;
      decode_info(r.table[static_cast<std::size_t>(rank)], &info);  // checked by learn_table_locked
      const std::string gpu = info.bus_id[0] != '\0' ? std::string(info.bus_id)
                                                     : "device " + std::to_string(info.device) +
                                                           " of pid " + std::to_string(info.pid);
      auto [it, fresh] = first_rank_on.emplace(std::to_string(info.host_hash) + " " + gpu, rank);
      if (!fresh && plan.shared_gpu.empty())
        plan.shared_gpu = "ranks " + std::to_string(it->second) + " and " + std::to_string(rank) +
                          " share GPU " + gpu + " on " + info.host;
      if (r.members.count(rank) != 0) {
        plan.ranks.push_back(rank);
        plan.devices.push_back(r.members.at(rank).device);
      }
    }
    plan.leader = boots.front();
    const std::set<int32_t> leaders(processes->leader.begin(), processes->leader.end());
    plan.leaders.assign(leaders.begin(), leaders.end());
  }
  for (int32_t rank : plan.ranks) {
    const ncclComm* comm = r.members.at(rank).comm;
    plan.configs.push_back(comm != nullptr ? comm->real_config : RealConfig());
  }
  plan.abort = &r.abort;
  return plan;
}

/// Builds the clique of a complete rendezvous (`lock` holds `r.mu`; released while CUDA works).
/// The shared registrations of each member whose GPU ranks of other processes share (called
/// while building, without `r.mu`: the members' bootstraps and devices do not change then).
std::map<int, std::shared_ptr<SharedRegistrations>> start_sharing(
    const Rendezvous& r, const std::vector<RankLocation>& table,
    const std::vector<std::string>& where) {
  std::map<int, std::shared_ptr<SharedRegistrations>> out;
  // Only direct transfers between processes use the mappings (EFCCL_DIRECT_PROCESSES=1).
  if (!direct_between_processes_enabled()) return out;
  for (const auto& [rank, m] : r.members) {
    std::vector<int> partner_ranks, clients;
    ranks_sharing_gpu(table, rank, &partner_ranks, &clients);
    if (clients.empty()) continue;
    std::vector<GpuPartner> partners;
    for (int p : partner_ranks)
      partners.push_back({p, static_cast<std::size_t>(p) < where.size()
                                 ? where[static_cast<std::size_t>(p)]
                                 : std::string()});
    std::vector<std::size_t> client_partner;  // the partner in each client's process
    for (int c : clients)
      for (std::size_t i = 0; i < partner_ranks.size(); ++i)
        if (table[static_cast<std::size_t>(partner_ranks[i])].process ==
            table[static_cast<std::size_t>(c)].process)
          client_partner.push_back(i);
    auto started =
        SharedRegistrations::start(m.boot, rank, m.device, std::move(partners), std::move(clients),
                                   init_timeout(), std::move(client_partner));
    if (!started) {
      EFCCL_WARN(m.device, "rank " + std::to_string(rank) +
                               ": buffers registered on this communicator will not be shared "
                               "with the other processes on its GPU: " +
                               started.status().message());
      continue;
    }
    out[rank] = std::shared_ptr<SharedRegistrations>(std::move(*started));
  }
  return out;
}

/// A GPU served by one process (enqueue/served_calls.h): when every rank of the communicator
/// is on one GPU, one rank per process (known alike in every process from the table), every
/// process takes part in the setup's exchange; it serves when every process wishes it (direct
/// transfers between processes on, so registrations are shared, and EFCCL_SERVE_PROCESSES not
/// 0; under MPS, auto serves from four processes), calls of at least EFCCL_SERVE_MIN_BYTES (by
/// default every call without MPS, calls of 64 KiB and more under MPS). `sharing`: the member's
/// shared registrations.
ApiStatus serve_gpu(const ProcessMap& pm, int rank, int device, net::Bootstrap& boot,
                    const std::shared_ptr<SharedRegistrations>& sharing, Clique& clique,
                    net::Deadline deadline, const std::atomic<bool>* abort) {
  const std::size_t n = pm.gpu.size();
  if (n < 2 || pm.host_count() != 1) return ApiStatus::ok();
  for (std::size_t r = 0; r < n; ++r)
    if (pm.gpu[r].empty() || pm.gpu[r] != pm.gpu[0] || pm.leader[r] != static_cast<int32_t>(r))
      return ApiStatus::ok();
  ServedCalls::Options o;
  o.rank = rank;
  o.nranks = static_cast<int>(n);
  o.device = device;
  o.timeout = call_timeout();
  const int setting = serve_processes_setting();
  // Under MPS, auto serves four or more processes' calls from 64 KiB (faster than their own
  // launches), and not two or three processes (their calls the usual way got slower on a
  // served GPU, and large ones gained little).
  const bool mps = setting < 0 && mps_serves(device);
  o.wish = sharing != nullptr && setting != 0 && (!mps || n >= 4);
  o.min_bytes = serve_min_bytes(mps);
  if (sharing != nullptr) {
    o.translate = [sharing](const void* p, std::size_t bytes) {
      return sharing->reader_address(p, bytes, ServedCalls::kServerRank);
    };
    o.covers = [sharing](int client, uint64_t address, std::size_t bytes) {
      return sharing->maps(client, address, bytes);
    };
  }
  if (rank == ServedCalls::kServerRank) {
    if (ApiStatus s = local_machine_graph(std::vector<int>(n, device), &o.graph); !s) {
      EFCCL_INFO(kLogInit, device, "the served GPU's machine graph: " + s.message());
      o.wish = false;
    }
  }
  auto served = ServedCalls::create(boot, std::move(o), deadline, abort);
  if (!served) return ApiStatus::system(served.status().message());
  clique.set_served(std::move(*served));
  return ApiStatus::ok();
}

void build_locked(Rendezvous& r, std::unique_lock<std::mutex>& lock) {
  r.state = Rendezvous::State::kBuilding;
  std::vector<int> devices, member_ranks;  // this process's ranks, ascending, and their GPUs
  ApiStatus status;
  for (const auto& [rank, m] : r.members) {
    devices.push_back(m.device);
    member_ranks.push_back(rank);
    if (m.device < 0 && status)
      status = ApiStatus::cuda("rank " + std::to_string(rank) +
                               " had no current CUDA device when it called ncclCommInitRank (" +
                               m.device_error + ")");
  }
  // Every rank: its GPU (in its own process) and where it runs; ranks of one process and GPU
  // share a location.
  std::unique_ptr<ProcessMap> processes;
  std::vector<int> all_devices(static_cast<std::size_t>(r.nranks), -1);
  std::vector<std::shared_ptr<net::Bootstrap>> boots;
  for (const auto& [rank, m] : r.members)
    if (m.boot != nullptr) boots.push_back(m.boot);
  if (status && static_cast<int>(r.members.size()) < r.nranks) {
    processes = std::make_unique<ProcessMap>();
    std::map<std::pair<uint64_t, uint64_t>, int64_t> process_index;
    std::map<int64_t, int32_t> leader_of;
    const auto n = static_cast<std::size_t>(r.nranks);
    processes->local.assign(n, false);
    processes->location.assign(n, 0);
    processes->leader.assign(n, 0);
    processes->where.assign(n, "");
    processes->host.assign(n, 0);
    processes->gpu.assign(n, "");
    for (std::size_t rank = 0; rank < n; ++rank) {
      PeerInfo info;
      decode_info(r.table[rank], &info);  // checked by learn_table_locked
      const auto key = std::make_pair(info.host_hash, info.process_nonce);
      const int64_t proc =
          process_index.emplace(key, static_cast<int64_t>(process_index.size())).first->second;
      leader_of.emplace(proc, static_cast<int32_t>(rank));  // ranks ascend: the first is the lowest
      processes->local[rank] = r.members.count(static_cast<int>(rank)) != 0;
      processes->location[rank] = proc * 4096 + info.device;
      processes->leader[rank] = leader_of[proc];
      processes->host[rank] = info.host_hash;
      processes->where[rank] = std::string(info.host) + " pid " + std::to_string(info.pid) +
                               " GPU " + std::to_string(info.device) + " " + info.bus_id;
      all_devices[rank] =
          processes->local[rank] ? r.members.at(static_cast<int>(rank)).device : info.device;
    }
    processes->bootstraps = boots;
    for (const auto& [rank, m] : r.members)
      if (m.comm != nullptr) m.comm->bootstrap = m.boot;  // pending: nobody else reads it yet
  } else {
    all_devices = devices;
  }
  std::shared_ptr<Clique> clique;
  std::map<int, std::shared_ptr<SharedRegistrations>> sharing;  // by member rank
  std::vector<RankLocation> locations;  // several processes: where every rank is
  if (status) {
    const FallbackPlan fallback_plan = fallback_plan_locked(r, all_devices, processes.get(), boots);
    lock.unlock();
    // The members' bootstraps have received the table (one did; the root sent it to all).
    // One budget for the waits of the build (the bootstrap, the machine graph's exchange).
    const auto build_deadline = std::chrono::steady_clock::now() + init_timeout();
    for (const auto& b : boots) {
      if (!status) break;
      if (Status s = b->wait_ready(build_deadline, &r.abort); !s)
        status = ApiStatus::system("bootstrap: " + s.message());
    }
    const bool single_process = processes == nullptr;
    // The machine graph: detected here, exchanged between processes (comm/machine_graph.h).
    std::shared_ptr<const topo::ClusterGraph> graph;
    bool every_process_sees_every_gpu = true;
    if (status) {
      try {
        if (single_process) {
          status = local_machine_graph(all_devices, &graph);
        } else {
          std::vector<topo::RankPlacement> placements;
          for (const std::string& entry : r.table) {
            PeerInfo info;
            decode_info(entry, &info);  // checked by learn_table_locked
            placements.push_back({info.host_hash, info.bus_id});
            locations.push_back(
                {info.host_hash, info.process_nonce, info.pid, topo::normal_bus_id(info.bus_id)});
          }
          sharing = start_sharing(r, locations, processes->where);
          for (std::size_t k = 0; k < locations.size(); ++k)
            processes->gpu[k] = gpu_key(locations[k]);
          // Where another process reaches a local rank's registered buffer (direct transfers
          // between processes on one GPU).
          processes->translate = [sharing](int rank, const void* p, std::size_t bytes,
                                           int reader) -> std::optional<uint64_t> {
            auto it = sharing.find(rank);
            if (it == sharing.end()) return std::nullopt;
            return it->second->reader_address(p, bytes, reader);
          };
          const std::set<int> leaders(processes->leader.begin(), processes->leader.end());
          status = exchanged_machine_graph(
              placements, *boots.front(), std::vector<int>(leaders.begin(), leaders.end()),
              net::Deadline(build_deadline), &r.abort, &graph, &every_process_sees_every_gpu);
        }
      } catch (const std::exception& e) {
        status = ApiStatus::internal(std::string("the machine graph: ") + e.what());
      }
    }
    StatusOr<std::shared_ptr<Clique>> created = Status::error("not created");
    if (status) {
      std::unique_ptr<ProgramRegistry> registry = ProgramRegistry::from_environment();
      if (processes != nullptr) {
        registry->set_host_layout(HostLayout::of(processes->host));
        if (processes->host_count() > 1)
          EFCCL_INFO(kLogInit | kLogNet | kLogTuning, devices.front(),
                     "the communicator spans " + registry->host_layout().describe() +
                         ": ranks on other hosts are joined by network connections");
      }
      created = Clique::create(all_devices, std::move(registry), std::move(processes));
    }
    if (status && created) {
      (*created)->set_machine_graph(graph, every_process_sees_every_gpu);
      log_machine_graph(*graph, member_ranks, devices);
    }
    if (status && created && !single_process && member_ranks.size() == 1) {
      auto it = sharing.find(member_ranks.front());
      status = serve_gpu(*(*created)->processes(), member_ranks.front(), devices.front(),
                         *boots.front(), it != sharing.end() ? it->second : nullptr, **created,
                         net::Deadline(build_deadline), &r.abort);
    }
    // Ranks of other processes on this process's GPUs: a warning unless MPS serves the GPU or
    // this process's calls are served (after serve_gpu, which knows).
    if (status && created && !single_process && !(*created)->served())
      check_shared_gpus(locations, member_ranks, devices);
    if (status && created) {
      std::shared_ptr<NcclFallback> fallback;
      status = create_fallback(fallback_plan, &fallback);
      (*created)->set_fallback(std::move(fallback));
    }
    if (single_process)
      for (const auto& b : boots) b->close();  // everything is in this process: no more messages
    lock.lock();
    if (status) {
      if (created)
        clique = *created;
      else
        status = ApiStatus::cuda(created.status().message());
    }
    if (clique != nullptr)
      for (const auto& [rank, m] : r.members) clique->set_driver(rank, m.thread);
  }
  if (!r.cancellation) status = r.cancellation;
  if (!status) {
    fail_locked(r, status);
  } else {
    r.state = Rendezvous::State::kFormed;
    std::set<uint64_t> hosts;  // NCCL's nNodes
    for (const std::string& entry : r.table) {
      PeerInfo info;
      if (decode_info(entry, &info)) hosts.insert(info.host_hash);
    }
    const std::size_t nodes = std::max<std::size_t>(1, hosts.size());
    for (const auto& [rank, m] : r.members) {
      if (m.comm == nullptr) continue;
      if (auto it = sharing.find(rank); it != sharing.end())
        m.comm->shared_registrations = std::move(it->second);
      attach_clique(m.comm, clique);
      EFCCL_INFO(kLogInit, m.device,
                 "comm " + pointer_text(m.comm) + " rank " + std::to_string(rank) + " nRanks " +
                     std::to_string(r.nranks) + " localRanks " + std::to_string(r.members.size()) +
                     " nNodes " + std::to_string(nodes) + " cudaDev " + std::to_string(m.device) +
                     " - Init COMPLETE");
    }
    r.cv.notify_all();
  }
  lock.unlock();
  clique.reset();  // a clique nobody took is destroyed outside the lock
  lock.lock();
}

}  // namespace

ApiStatus join_rendezvous(const ncclUniqueId& id, int nranks, int rank, int device,
                          const std::string& device_error, ncclComm* comm,
                          std::shared_ptr<Rendezvous>* out, net::Deadline deadline, bool local_only,
                          uint64_t driver) {
  Rendezvous::Key key;
  std::memcpy(key.data(), id.internal, key.size());
  std::lock_guard<std::mutex> pending_lock(pending_mutex());
  std::shared_ptr<Rendezvous> r;
  if (auto it = pending().find(key); it != pending().end()) {
    std::lock_guard<std::mutex> lock(it->second->mu);
    if (it->second->state == Rendezvous::State::kCollecting && !it->second->complete())
      r = it->second;  // otherwise stale (failed): a new communicator with a reused id
  }
  if (r == nullptr) {
    r = std::make_shared<Rendezvous>(key, nranks);
    if (local_only) {
      r->table_known = true;  // every rank is here
      for (int k = 0; k < nranks; ++k) r->expected.push_back(k);
    }
    pending()[key] = r;
  }
  std::lock_guard<std::mutex> lock(r->mu);
  if (r->nranks != nranks)
    return ApiStatus::invalid_argument("nranks " + std::to_string(nranks) +
                                       " differs from the nranks " + std::to_string(r->nranks) +
                                       " of the ranks that already joined with this unique id");
  if (r->members.count(rank) != 0)
    return ApiStatus::invalid_argument("rank " + std::to_string(rank) +
                                       " already joined with this unique id (each rank of a "
                                       "communicator is initialized exactly once)");
  Rendezvous::Member m;
  m.device = device;
  m.device_error = device_error;
  m.comm = comm;
  m.thread = driver != 0 ? driver : this_thread_token();
  // Announce this rank to the root (does not wait for the others: a group may start several
  // ranks from one thread before waiting).
  if (!local_only) {
    static_assert(sizeof(net::UniqueId) == sizeof(ncclUniqueId));
    net::UniqueId net_id;
    std::memcpy(net_id.internal, id.internal, sizeof(net_id.internal));
    auto boot = net::Bootstrap::start(net_id, nranks, rank, encode_info(device), deadline);
    if (!boot) return ApiStatus::system("ncclCommInitRank bootstrap: " + boot.status().message());
    m.boot = *boot;
  }
  r->members.emplace(rank, std::move(m));
  if (r->complete()) {
    pending().erase(key);  // nobody else may join it
    r->cv.notify_all();    // a waiting rank builds the clique
  }
  *out = r;
  return ApiStatus::ok();
}

ApiStatus complete_rendezvous(const std::shared_ptr<Rendezvous>& r,
                              std::chrono::steady_clock::time_point deadline,
                              std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(r->mu);
  for (;;) {
    switch (r->state) {
      case Rendezvous::State::kFormed:
        return ApiStatus::ok();
      case Rendezvous::State::kFailed:
        return r->failure;
      case Rendezvous::State::kBuilding:
        // The builder's waits (bootstrap, machine graph exchange, NCCL fallback init) have
        // deadlines and give up on abort, and a failed build fails the rendezvous: this ends.
        r->cv.wait(lock);
        continue;
      case Rendezvous::State::kCollecting:
        break;
    }
    if (!r->table_known && !r->table_waiting && !r->members.empty()) {
      // Learn from the root where every rank runs (this thread waits; others wait on cv).
      r->table_waiting = true;
      std::shared_ptr<net::Bootstrap> boot = r->members.begin()->second.boot;
      lock.unlock();
      Status got = boot->wait_ready(deadline, &r->abort);
      lock.lock();
      r->table_waiting = false;
      r->cv.notify_all();
      if (r->state != Rendezvous::State::kCollecting) continue;  // failed meanwhile
      ApiStatus learned = got ? learn_table_locked(*r, boot->infos())
                              : ApiStatus::invalid_usage("bootstrap: " + got.message());
      if (!learned) {
        fail_locked(*r, learned);
        const ApiStatus failure = r->failure;
        lock.unlock();
        stop_pending(r);
        return failure;
      }
      continue;
    }
    if (r->complete()) {
      try {
        build_locked(*r, lock);
      } catch (const std::exception& e) {
        // The other ranks wait for the build without a deadline: it must end, also so.
        if (!lock.owns_lock()) lock.lock();
        fail_locked(*r, ApiStatus::internal(std::string("building the clique: ") + e.what()));
      }
      lock.unlock();
      stop_pending(r);  // formed or failed: the id may be reused
      lock.lock();
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fail_locked(
          *r, ApiStatus::invalid_usage(
                  "only " + std::to_string(r->members.size()) + " of the " +
                  std::to_string(r->table_known ? r->expected.size() : r->nranks) +
                  " ranks of this unique id that run in this process joined within " +
                  std::to_string(timeout.count()) + " ms (EFCCL_INIT_TIMEOUT_MS; missing rank(s) " +
                  missing_ranks(*r) + ")"));
      const ApiStatus failure = r->failure;
      lock.unlock();
      stop_pending(r);
      return failure;
    }
    r->cv.wait_until(lock, deadline);
  }
}

void cancel_rendezvous(const std::shared_ptr<Rendezvous>& r, const ApiStatus& why) {
  std::unique_lock<std::mutex> lock(r->mu);
  if (r->state == Rendezvous::State::kCollecting) {
    fail_locked(*r, why);
    lock.unlock();
    stop_pending(r);
  } else if (r->state == Rendezvous::State::kBuilding && r->cancellation) {
    r->cancellation = why;
    r->abort.store(true);  // the builder's waits (bootstrap, NCCL fallback init) give up
  }
}

void leave_rendezvous(ncclComm* comm, bool abort) {
  const std::shared_ptr<Rendezvous> r = comm->rendezvous;
  if (r == nullptr) return;
  std::unique_lock<std::mutex> lock(r->mu);
  auto it = r->members.find(comm->rank);
  if (it == r->members.end() || it->second.comm != comm) return;
  it->second.comm = nullptr;
  if (r->state != Rendezvous::State::kCollecting && r->state != Rendezvous::State::kBuilding)
    return;
  const ApiStatus why =
      ApiStatus::invalid_usage("rank " + std::to_string(comm->rank) + "'s communicator was " +
                               (abort ? "aborted" : "destroyed") + " before its clique formed");
  if (r->state == Rendezvous::State::kBuilding) {
    if (r->cancellation) r->cancellation = why;
    r->abort.store(true);  // the builder's waits (bootstrap, NCCL fallback init) give up
    return;
  }
  fail_locked(*r, why);
  lock.unlock();
  stop_pending(r);
}

int joined_ranks(const ncclUniqueId& id) {
  Rendezvous::Key key;
  std::memcpy(key.data(), id.internal, key.size());
  std::lock_guard<std::mutex> pending_lock(pending_mutex());
  auto it = pending().find(key);
  if (it == pending().end()) return 0;
  std::lock_guard<std::mutex> lock(it->second->mu);
  return it->second->state == Rendezvous::State::kCollecting
             ? static_cast<int>(it->second->members.size())
             : 0;
}

}  // namespace efccl::runtime
