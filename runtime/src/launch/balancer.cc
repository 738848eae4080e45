#include "launch/balancer.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>

#include "base/settings.h"
#include "efccl/common/log.h"
#include "select/balance_prediction.h"

namespace efccl::runtime {
namespace {

/// Cached groups and pair messages before the caches are emptied (executors stay cached in
/// the executor store; a demand seen again is planned again).
constexpr std::size_t kMaxCachedGroups = 256;
constexpr std::size_t kMaxCachedPairs = 4096;
/// Distinct balanced programs per pair across processes; beyond, new demands of the pair run
/// on the default path (their executors, shared with another process, are never evicted).
constexpr std::size_t kMaxProgramsPerPair = 32;
/// INFO lines listing a new plan's transfers, at most.
constexpr std::size_t kMaxLoggedTransfers = 32;

std::string human(double bytes) {
  char text[32];
  if (bytes >= double(1 << 30))
    std::snprintf(text, sizeof(text), "%.2f GiB", bytes / double(1 << 30));
  else if (bytes >= double(1 << 20))
    std::snprintf(text, sizeof(text), "%.2f MiB", bytes / double(1 << 20));
  else if (bytes >= 1024)
    std::snprintf(text, sizeof(text), "%.1f KiB", bytes / 1024.0);
  else
    std::snprintf(text, sizeof(text), "%.0f B", bytes);
  return text;
}

std::string us(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f us", v);
  return text;
}

}  // namespace

Balancer::Balancer(std::shared_ptr<const topo::ClusterGraph> graph, std::vector<int> rank_devices,
                   bool multiprocess, bool every_process_sees_every_gpu)
    : graph_(std::move(graph)),
      rank_devices_(std::move(rank_devices)),
      multiprocess_(multiprocess),
      every_process_sees_every_gpu_(every_process_sees_every_gpu),
      stats_file_(balance_stats_file()) {}

Balancer::~Balancer() = default;

bool Balancer::active() {
  if (tried_) return active_;
  tried_ = true;
  if (!balance_enabled()) return false;
  const int32_t n = static_cast<int32_t>(rank_devices_.size());
  const std::string spec = balance_topology();
  auto options = balance::PlannerOptions::from_environment();
  if (!options) {
    EFCCL_WARN(-1, "balancer off for this communicator: " + options.status().message());
    return false;
  }
  auto machine = make_balance_machine(graph_.get(), n, spec, every_process_sees_every_gpu_);
  if (!machine) {
    EFCCL_INFO(kLogBalance, -1,
               "balancer off for this communicator: " + machine.status().message());
    return false;
  }
  machine_ = std::move(*machine);
  planner_.emplace(machine_->table, *options);
  force_spread_ = balance_force() == "spread";
  active_ = true;
  std::string placement;
  for (int32_t r = 0; r < n && r < 16; ++r)
    placement += (r == 0 ? "" : ", ") + std::to_string(r) + ":" +
                 machine_->table->topology().node(machine_->rank_gpu(r)).id;
  if (n > 16) placement += ", ...";
  EFCCL_INFO(kLogBalance, -1,
             "balancer on: " + std::to_string(n) + " ranks planned on " + machine_->source +
                 (machine_->simulated ? " (simulated: rank r on its GPU r mod n)" : "") + " [" +
                 placement + "], min split " +
                 human(static_cast<double>(options->min_split_bytes)) +
                 (machine_->host_memory ? ", host memory a path"
                                        : ", no host-memory paths (EFCCL_BALANCE_HOST_MEMORY=0)") +
                 ", " +
                 (multiprocess_ ? "pair-local plans across processes (no forwards through third "
                                  "ranks), all-to-all planned globally"
                                : "groups planned globally") +
                 (force_spread_ ? ", EFCCL_BALANCE_FORCE=spread" : ""));
  return true;
}

bool Balancer::peer_ok(int a, int b) const {
  if (a == b) return true;
  auto [it, fresh] = peer_ok_.try_emplace({a, b}, false);
  if (fresh) {
    int can = 0;
    it->second = cudaDeviceCanAccessPeer(&can, a, b) == cudaSuccess && can != 0;
    (void)cudaGetLastError();
  }
  return it->second;
}

RelayResolution Balancer::resolution(int32_t sender, int32_t receiver,
                                     const std::vector<int32_t>* participants) const {
  RelayResolution r;
  const BalanceMachine& m = *machine_;
  if (!multiprocess_ && participants != nullptr)
    r.forwarder = [&m, participants, sender, receiver](topo::NodeIndex gpu) -> int32_t {
      for (int32_t p : *participants)
        if (p != sender && p != receiver && m.rank_gpu(p) == gpu) return p;
      return -1;
    };
  if (m.simulated) {
    r.slot_device_usable = [](topo::NodeIndex) { return true; };
  } else if (multiprocess_) {
    if (m.every_process_sees_every_gpu)
      r.slot_device_usable = [&m](topo::NodeIndex gpu) {
        return gpu < m.node_device.size() && m.node_device[gpu] >= 0;
      };
  } else {
    const int ds = rank_devices_[static_cast<std::size_t>(sender)];
    const int dr = rank_devices_[static_cast<std::size_t>(receiver)];
    r.slot_device_usable = [this, &m, ds, dr](topo::NodeIndex gpu) {
      if (gpu >= m.node_device.size() || m.node_device[gpu] < 0) return false;
      const int relay = m.node_device[gpu];
      return peer_ok(ds, relay) && peer_ok(dr, relay);
    };
  }
  return r;
}

std::vector<int> Balancer::slot_devices(const BalancedTransfer& t, bool receiver_local) const {
  std::vector<int> out;
  const BalanceMachine& m = *machine_;
  for (topo::NodeIndex gpu : t.slot_device_gpus) {
    if (m.simulated)  // the receiving rank's own GPU stands in for the relay
      out.push_back(receiver_local ? rank_devices_[static_cast<std::size_t>(t.ranks[1])] : -1);
    else
      out.push_back(gpu < m.node_device.size() ? m.node_device[gpu] : -1);
  }
  return out;
}

std::optional<balance::PairPlan> Balancer::pair_plan(const balance::Plan& plan, int32_t s,
                                                     int32_t d,
                                                     const RelayResolution& relays) const {
  // A binary search over listed pairs; a plan by class finds the pair's split directly.
  const std::optional<balance::PairPlan> it = plan.pairs.find(s, d);
  if (!it) return std::nullopt;
  if (force_spread_ && it->bytes >= planner_->options().min_split_bytes) {
    balance::PairPlan every = *it;  // the planner may have looked up candidates[0] only
    if (auto all = machine_->table->candidates(s, d);
        all && (*all)->size() > every.candidates->size())
      every.candidates = *all;
    return spread_over_candidates(every, relays);
  }
  return usable_shares(*it, relays);
}

bool Balancer::worth_it(const balance::Plan& plan) const {
  // Leaving the default paths (the tuned programs) is a change of plan like any other: it must
  // lower the busiest link's load by more than the hysteresis.
  return force_spread_ ||
         plan.max_load_us < (1.0 - planner_->options().hysteresis) * plan.direct_max_load_us;
}

void Balancer::reset_caches() {
  groups_.clear();
  pairs_.clear();
  uniform_.clear();
  // The planner keeps the plan in force per demand: start it afresh too (plans are the same:
  // there is no background load).
  planner_.emplace(machine_->table, planner_->options());
}

StatusOr<const Balancer::Prepared*> Balancer::prepare_group(
    const std::vector<TransferKey>& transfers, const std::string& kind) {
  std::vector<uint64_t> key;
  key.reserve(2 * transfers.size() + 1);
  key.push_back(kind == "alltoall" ? 1 : 0);
  for (const TransferKey& t : transfers) {
    key.push_back(uint64_t(uint32_t(t.sender)) << 32 | uint32_t(t.receiver));
    key.push_back(t.bytes);
  }
  if (auto it = groups_.find(key); it != groups_.end()) return it->second.get();
  if (groups_.size() >= kMaxCachedGroups) reset_caches();

  const int32_t n = machine_->nranks();
  balance::Demand demand;
  demand.nranks = n;
  demand.bytes.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0);
  std::vector<int32_t> participants;
  for (const TransferKey& t : transfers) {
    if (t.sender == t.receiver || t.bytes == 0) continue;
    demand.bytes[static_cast<std::size_t>(t.sender) * static_cast<std::size_t>(n) +
                 static_cast<std::size_t>(t.receiver)] += t.bytes;
    participants.push_back(t.sender);
    participants.push_back(t.receiver);
  }
  std::sort(participants.begin(), participants.end());
  participants.erase(std::unique(participants.begin(), participants.end()), participants.end());
  auto plan = planner_->plan(demand);
  if (!plan) return Status::error("planning the group: " + plan.status().message());

  auto prepared = std::make_unique<Prepared>();
  prepared->transfers.resize(transfers.size());
  bool any = false;
  for (std::size_t i = 0; i < transfers.size() && worth_it(*plan); ++i) {
    const TransferKey& t = transfers[i];
    if (t.sender == t.receiver || t.bytes == 0) continue;
    const RelayResolution relays = resolution(t.sender, t.receiver, &participants);
    const std::optional<balance::PairPlan> pair = pair_plan(*plan, t.sender, t.receiver, relays);
    if (!pair) continue;
    auto built = build_balanced_transfer(t.sender, t.receiver, t.bytes, *pair, relays);
    if (!built) return built.status();
    if (!*built) continue;
    prepared->transfers[i] = std::make_shared<const BalancedTransfer>(std::move(**built));
    any = true;
  }
  if (any)
    prepared->plan = record(kind, "global", transfers, *prepared, *plan);
  else
    ++unbalanced_groups_;
  return groups_.emplace(std::move(key), std::move(prepared)).first->second.get();
}

StatusOr<std::shared_ptr<const balance::Plan>> Balancer::uniform_plan(uint64_t bytes) {
  if (auto it = uniform_.find(bytes); it != uniform_.end()) return it->second;
  if (uniform_.size() >= kMaxCachedGroups) uniform_.clear();
  const int32_t n = machine_->nranks();
  balance::Demand demand;
  demand.nranks = n;
  demand.bytes.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), bytes);
  for (int32_t r = 0; r < n; ++r)
    demand.bytes[static_cast<std::size_t>(r) * static_cast<std::size_t>(n + 1)] = 0;
  auto plan = planner_->plan(demand);
  if (!plan) return Status::error("planning the all-to-all: " + plan.status().message());
  auto shared = std::make_shared<const balance::Plan>(std::move(*plan));
  uniform_.emplace(bytes, shared);
  return shared;
}

StatusOr<bool> Balancer::alltoall_balances(uint64_t bytes) {
  if (auto it = alltoall_decisions_.find(bytes); it != alltoall_decisions_.end()) return it->second;
  StatusOr<bool> decided = decide_alltoall(bytes);
  if (!decided) return decided;
  if (alltoall_decisions_.size() >= kMaxCachedGroups) alltoall_decisions_.clear();
  alltoall_decisions_.emplace(bytes, *decided);
  return decided;
}

StatusOr<bool> Balancer::decide_alltoall(uint64_t bytes) {
  const TransferChunks cut = chunks_of(bytes);
  if (cut.chunks == 0) return false;
  auto plan = uniform_plan(bytes);
  if (!plan) return plan.status();
  std::vector<int32_t> everyone(static_cast<std::size_t>(machine_->nranks()));
  for (int32_t r = 0; r < machine_->nranks(); ++r) everyone[static_cast<std::size_t>(r)] = r;
  if (!worth_it(**plan)) return false;
  for (const balance::PairPlan& p : (*plan)->pairs) {
    const RelayResolution relays = resolution(p.src, p.dst, multiprocess_ ? nullptr : &everyone);
    const std::optional<balance::PairPlan> usable = pair_plan(**plan, p.src, p.dst, relays);
    if (!usable) continue;
    for (const balance::PathShare& s : usable->paths)
      if (s.candidate != 0 && s.bytes >= cut.chunk_bytes) return true;
  }
  return false;
}

StatusOr<std::shared_ptr<const Balancer::Prepared>> Balancer::prepare_pair(
    int32_t a, int32_t b, uint64_t ab, uint64_t ba, uint64_t alltoall_bytes) {
  const auto key = std::make_tuple(a, b, ab, ba, alltoall_bytes);
  if (auto it = pairs_.find(key); it != pairs_.end()) return it->second;
  if (pairs_.size() >= kMaxCachedPairs) reset_caches();

  std::shared_ptr<const balance::Plan> plan;
  if (alltoall_bytes > 0) {
    auto uniform = uniform_plan(alltoall_bytes);
    if (!uniform) return uniform.status();
    plan = *uniform;
  } else {
    const int32_t n = machine_->nranks();
    balance::Demand demand;
    demand.nranks = n;
    demand.bytes.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), 0);
    demand.bytes[static_cast<std::size_t>(a) * static_cast<std::size_t>(n) +
                 static_cast<std::size_t>(b)] = ab;
    demand.bytes[static_cast<std::size_t>(b) * static_cast<std::size_t>(n) +
                 static_cast<std::size_t>(a)] = ba;
    auto planned = planner_->plan(demand);
    if (!planned) return Status::error("planning a pair: " + planned.status().message());
    plan = std::make_shared<const balance::Plan>(std::move(*planned));
  }
  auto prepared = std::make_shared<Prepared>();
  prepared->transfers.resize(2);
  const TransferKey directions[2] = {{a, b, ab}, {b, a, ba}};
  std::set<std::string>& programs = pair_programs_[{a, b}];
  bool any = false;
  for (int i = 0; i < 2 && worth_it(*plan); ++i) {
    const TransferKey& t = directions[i];
    if (t.bytes == 0) continue;
    const RelayResolution relays = resolution(t.sender, t.receiver, nullptr);
    const std::optional<balance::PairPlan> pair = pair_plan(*plan, t.sender, t.receiver, relays);
    if (!pair) continue;
    auto built = build_balanced_transfer(t.sender, t.receiver, t.bytes, *pair, relays);
    if (!built) return built.status();
    if (!*built) continue;
    // Both processes of the pair see its messages in the same order: they stop at the same one.
    if (!programs.contains((*built)->signature) && programs.size() >= kMaxProgramsPerPair) {
      EFCCL_INFO(kLogBalance, -1,
                 "ranks " + std::to_string(a) + " and " + std::to_string(b) + " ran " +
                     std::to_string(kMaxProgramsPerPair) +
                     " distinct balanced programs; new demands of the pair stay on the default "
                     "path");
      continue;
    }
    programs.insert((*built)->signature);
    prepared->transfers[static_cast<std::size_t>(i)] =
        std::make_shared<const BalancedTransfer>(std::move(**built));
    any = true;
  }
  if (any)
    prepared->plan =
        record(alltoall_bytes > 0 ? "alltoall" : "p2p", alltoall_bytes > 0 ? "global" : "pair",
               {directions[0], directions[1]}, *prepared, *plan);
  pairs_.emplace(key, prepared);
  return std::shared_ptr<const Prepared>(prepared);
}

int32_t Balancer::record(const std::string& kind, const std::string& scope,
                         const std::vector<TransferKey>& transfers, const Prepared& prepared,
                         const balance::Plan& plan) {
  const topo::Topology& topology = machine_->table->topology();
  BalancePlanRecord r;
  r.kind = kind;
  r.scope = scope;
  r.transfers = transfers.size();
  r.max_load_us = plan.max_load_us;
  r.direct_max_load_us = plan.direct_max_load_us;
  std::vector<double> link_bytes(topology.links().size(), 0.0);
  std::vector<PredictedTransfer> predicted;
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const TransferKey& t = transfers[i];
    if (t.sender == t.receiver || t.bytes == 0) continue;
    const BalancedTransfer* bt = prepared.transfers[i].get();
    predicted.push_back({t.sender, t.receiver, t.bytes, bt});
    std::shared_ptr<const std::vector<balance::Candidate>> candidates;
    if (bt != nullptr) {
      candidates = bt->candidates;
    } else if (auto found = machine_->table->candidates(t.sender, t.receiver, true)) {
      candidates = *found;
    } else {
      continue;
    }
    const auto add = [&](uint32_t c, uint64_t bytes) {
      for (topo::LinkIndex l : (*candidates)[c].links) link_bytes[l] += static_cast<double>(bytes);
    };
    if (bt == nullptr) {
      add(0, t.bytes);
      continue;
    }
    BalancePlanRecord::Pair pair{t.sender, t.receiver, t.bytes, {}};
    for (const BalancedTransfer::Share& s : bt->shares) {
      const uint64_t bytes = static_cast<uint64_t>(s.chunks) * bt->chunk_bytes;
      add(s.candidate, bytes);
      pair.paths.push_back({s.text, bytes, s.channels});
    }
    if (t.bytes > bt->main_bytes) {
      add(0, t.bytes - bt->main_bytes);
      pair.paths.push_back({"tail on the default path", t.bytes - bt->main_bytes, 0});
    }
    r.pairs.push_back(std::move(pair));
  }
  for (topo::LinkIndex l = 0; l < link_bytes.size(); ++l)
    if (link_bytes[l] > 0) r.link_bytes.push_back({l, link_bytes[l]});
  const bool logged = log_enabled(LogLevel::kInfo, kLogBalance);
  if (logged || !stats_file_.empty()) {
    if (auto p = predict_group(*machine_, predicted)) {
      r.predicted_us = p->balanced_us;
      r.direct_predicted_us = p->direct_us;
    } else {
      EFCCL_INFO(kLogBalance, -1, "no prediction for the plan: " + p.status().message());
    }
  }
  const std::size_t balanced = r.pairs.size();
  if (!logged) return stats_.add_plan(std::move(r));
  const BalancePlanRecord rec = r;  // past the statistics' bound the id is a shared entry's
  const int32_t id = stats_.add_plan(std::move(r));
  std::string head = "balance plan #" + std::to_string(id) + " (" + kind + ", " + scope +
                     ", new): " + std::to_string(balanced) + " of " +
                     std::to_string(transfers.size()) +
                     " transfer(s) on several paths; max link load " + us(rec.max_load_us) +
                     " (default paths " + us(rec.direct_max_load_us) + ")";
  if (rec.predicted_us)
    head += ", predicted " + us(*rec.predicted_us) + " (default paths " +
            us(*rec.direct_predicted_us) + ")";
  log_line(LogLevel::kInfo, kLogBalance, -1, head);
  for (std::size_t i = 0; i < rec.pairs.size() && i < kMaxLoggedTransfers; ++i) {
    const BalancePlanRecord::Pair& p = rec.pairs[i];
    const auto paths =
        std::count_if(p.paths.begin(), p.paths.end(),
                      [](const BalancePlanRecord::Path& x) { return x.channels > 0; });
    std::string line = "balance plan #" + std::to_string(id) + ": rank " + std::to_string(p.src) +
                       " -> rank " + std::to_string(p.dst) + " " +
                       human(static_cast<double>(p.bytes)) + " over " + std::to_string(paths) +
                       " paths:";
    for (const BalancePlanRecord::Path& path : p.paths)
      line += " [" + path.via + " " + human(static_cast<double>(path.bytes)) +
              (path.channels > 0 ? ", " + std::to_string(path.channels) + " ch" : "") + "]";
    log_line(LogLevel::kInfo, kLogBalance, -1, line);
  }
  if (rec.pairs.size() > kMaxLoggedTransfers)
    log_line(LogLevel::kInfo, kLogBalance, -1,
             "balance plan #" + std::to_string(id) + ": ... and " +
                 std::to_string(rec.pairs.size() - kMaxLoggedTransfers) + " more");
  return id;
}

void Balancer::write_stats(const std::vector<int32_t>& local_ranks) {
  if (stats_file_.empty()) return;
  static const topo::Topology kNone;
  const topo::Topology& t = machine_ ? machine_->table->topology() : kNone;
  const std::string json = stats_.to_json(t, machine_ ? machine_->source : "", local_ranks,
                                          static_cast<int32_t>(rank_devices_.size()), true);
  if (Status s = stats_.append_to(stats_file_, json); !s) EFCCL_WARN(-1, s.message());
}

}  // namespace efccl::runtime
