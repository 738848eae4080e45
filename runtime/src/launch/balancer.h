// The balancer of one clique (docs/balancer.md, "In the runtime"): plans send/receive groups,
// all-to-alls and lone pairs over several paths and keeps, per demand, the programs that run
// them, so that a repeated demand does no planning and builds no program.
//
// One process (every rank local): the group's whole demand matrix is known at ncclGroupEnd, so
// the group is planned globally; a relay is a forward through a rank taking part in the group
// that runs on the relay GPU, or else a slot device on that GPU.
//
// Several processes: a process knows only its own ranks' sends and receives, so a pair's split
// is decided from that pair's bytes alone (both directions), which both of its processes know
// (pair-local plans), over routes that involve only the pair's two ranks: the default path,
// pinned host memory and slot devices (no forwards through third ranks). An all-to-all's demand
// is known everywhere (every pair moves the same bytes): it is planned globally, over the same
// pair-local routes. Agreement thus needs no exchange at all; both processes derive the same
// programs from the same plan (and the executor exchange compares their fingerprints).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/common/status.h"
#include "efccl/topology/cluster.h"
#include "launch/balance_stats.h"
#include "select/balance_machine.h"
#include "select/balanced_transfer.h"

namespace efccl::runtime {

class Balancer {
 public:
  /// `graph`: the clique's machine graph (may be null with EFCCL_BALANCE_TOPOLOGY);
  /// `rank_devices[r]`: rank r's CUDA device (in its own process); `multiprocess`: ranks of
  /// other processes take part; `every_process_sees_every_gpu`: agreed at init.
  Balancer(std::shared_ptr<const topo::ClusterGraph> graph, std::vector<int> rank_devices,
           bool multiprocess, bool every_process_sees_every_gpu);
  ~Balancer();
  Balancer(const Balancer&) = delete;
  Balancer& operator=(const Balancer&) = delete;

  /// Whether EFCCL_BALANCE is on and the machine could be set up (done at the first call; a
  /// failure is logged once at INFO and turns the balancer off for the clique).
  bool active();
  const BalanceMachine& machine() const { return *machine_; }

  /// A transfer of a group: clique ranks and bytes.
  struct TransferKey {
    int32_t sender = 0, receiver = 0;
    uint64_t bytes = 0;
  };
  /// The balanced transfers of a group, or of one pair's message.
  struct Prepared {
    int32_t plan = -1;  ///< the plan's statistics id; -1: nothing balanced
    /// Per transfer, in the order given: its program, or null (default path).
    std::vector<std::shared_ptr<const BalancedTransfer>> transfers;
  };

  /// One process: the group's transfers (in group order), planned globally. Cached by the
  /// list of (sender, receiver, bytes); `kind` names it in logs ("p2p", "alltoall").
  StatusOr<const Prepared*> prepare_group(const std::vector<TransferKey>& transfers,
                                          const std::string& kind);
  /// Across processes: one message of pair a < b (`ab` bytes a -> b, `ba` b -> a), from the
  /// pair's bytes alone, or from the all-to-all demand of `alltoall_bytes` per pair (0: not an
  /// all-to-all). transfers[0] is a -> b, transfers[1] b -> a. Cached by its arguments.
  StatusOr<std::shared_ptr<const Prepared>> prepare_pair(int32_t a, int32_t b, uint64_t ab,
                                                         uint64_t ba, uint64_t alltoall_bytes);
  /// Whether an all-to-all of `bytes` per pair would run any bytes off the default paths.
  StatusOr<bool> alltoall_balances(uint64_t bytes);

  /// The CUDA device of each slot device of `t` in this process (ExecutorConfig::slot_devices;
  /// -1 where this process allocates nothing).
  std::vector<int> slot_devices(const BalancedTransfer& t, bool receiver_local) const;

  BalanceStats& stats() { return stats_; }
  /// EFCCL_BALANCE_STATS: appends the statistics (waiting a moment for measurements).
  void write_stats(const std::vector<int32_t>& local_ranks);

 private:
  StatusOr<std::shared_ptr<const balance::Plan>> uniform_plan(uint64_t bytes);
  StatusOr<bool> decide_alltoall(uint64_t bytes);
  /// How transfers sender -> receiver may go; `participants`: ranks taking part (one
  /// process: they may forward), sorted.
  RelayResolution resolution(int32_t sender, int32_t receiver,
                             const std::vector<int32_t>* participants) const;
  bool peer_ok(int a, int b) const;
  /// The pair plan of (s, d) in `plan`, usable under `relays` (and spread when forced).
  std::optional<balance::PairPlan> pair_plan(const balance::Plan& plan, int32_t s, int32_t d,
                                             const RelayResolution& relays) const;
  /// Statistics and the INFO lines of a new plan with balanced transfers.
  int32_t record(const std::string& kind, const std::string& scope,
                 const std::vector<TransferKey>& transfers, const Prepared& prepared,
                 const balance::Plan& plan);
  /// Whether `plan` lowers the busiest link's load enough to leave the default paths.
  bool worth_it(const balance::Plan& plan) const;
  void reset_caches();

  std::shared_ptr<const topo::ClusterGraph> graph_;
  std::vector<int> rank_devices_;
  const bool multiprocess_;
  const bool every_process_sees_every_gpu_;
  bool tried_ = false;
  bool active_ = false;
  bool force_spread_ = false;
  std::string stats_file_;
  std::optional<BalanceMachine> machine_;
  std::optional<balance::Planner> planner_;
  BalanceStats stats_;
  mutable std::map<std::pair<int, int>, bool> peer_ok_;
  std::map<std::vector<uint64_t>, std::unique_ptr<Prepared>> groups_;
  std::map<std::tuple<int32_t, int32_t, uint64_t, uint64_t, uint64_t>,
           std::shared_ptr<const Prepared>>
      pairs_;
  std::map<uint64_t, std::shared_ptr<const balance::Plan>> uniform_;
  std::map<uint64_t, bool> alltoall_decisions_;  ///< alltoall_balances by bytes per pair
  /// Across processes: the distinct programs each pair has run (bounded: executors shared
  /// between processes are never evicted).
  std::map<std::pair<int32_t, int32_t>, std::set<std::string>> pair_programs_;
  std::size_t unbalanced_groups_ = 0;
};

}  // namespace efccl::runtime
