// The balancer's statistics for one clique (docs/balancer.md, "Statistics"): per plan, the
// paths and bytes it runs, the bytes it puts on each link of the topology, the timing model's
// prediction and the time measured with CUDA events around its launches; written as one JSON
// object when the communicator ends (EFCCL_BALANCE_STATS).
//
// Measuring adds no synchronisation: a run records an event on each of its devices' streams
// before its launches and one after the submission's flush; the pairs are read with
// cudaEventQuery at later runs (at most kMaxPending outstanding; beyond that a run is counted
// but not timed), and waited for only when the communicator ends. Captured runs are counted,
// not timed (a graph's replays are not seen by the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/topology/topology.h"

namespace efccl::runtime {

/// A plan as it runs: what the logs print and the statistics keep.
struct BalancePlanRecord {
  std::string kind;   ///< "p2p" (a send/receive group), "alltoall"
  std::string scope;  ///< "global" (the whole group's demand), "pair" (one pair's bytes)
  struct Path {
    std::string via;
    uint64_t bytes = 0;
    int32_t channels = 0;  ///< 0: a plain send/receive round
  };
  struct Pair {
    int32_t src = 0, dst = 0;
    uint64_t bytes = 0;
    std::vector<Path> paths;  ///< as run: whole chunks per path, the tail on the default path
  };
  std::vector<Pair> pairs;  ///< the transfers that were split, in group order
  std::size_t transfers = 0;
  /// Per run, the bytes each link carries (nonzero links, link index ascending).
  std::vector<std::pair<topo::LinkIndex, double>> link_bytes;
  double max_load_us = 0, direct_max_load_us = 0;  ///< the planner's, over the whole demand
  std::optional<double> predicted_us, direct_predicted_us;  ///< the timing model's
};

class BalanceStats {
 public:
  BalanceStats() = default;
  ~BalanceStats();
  BalanceStats(const BalanceStats&) = delete;
  BalanceStats& operator=(const BalanceStats&) = delete;

  /// A new plan; returns its id (past kMaxPlans plans, the id of one entry they all share).
  int32_t add_plan(BalancePlanRecord record);
  const BalancePlanRecord& plan(int32_t id) const {
    return plans_[static_cast<std::size_t>(id)].record;
  }
  /// A run of plan `id` on `streams` (device, stream of a rank of this process taking part, one
  /// per device). Not captured: records start events now; their ends at after_flush().
  void begin_run(int32_t id, const std::vector<std::pair<int, cudaStream_t>>& streams,
                 bool capturing);
  /// After the submission's launches were enqueued: the end events of its runs.
  void after_flush();
  /// Waits (with `wait`, at most 2 s) for outstanding measurements, then the JSON object
  /// (docs/balancer.md, "Statistics"). `topology` names the links.
  std::string to_json(const topo::Topology& topology, const std::string& source,
                      const std::vector<int32_t>& local_ranks, int32_t nranks, bool wait);
  /// Appends to_json's object and a newline to `path` ("%h" host name, "%p" process id).
  Status append_to(const std::string& path, const std::string& json);

 private:
  struct Measurement {
    int32_t plan = -1;
    std::vector<int> devices;
    std::vector<cudaStream_t> streams;
    std::vector<cudaEvent_t> start, end;  ///< per device; end empty until after_flush
    bool failed = false;                  ///< an end could not be recorded: not timed
  };
  struct Plan {
    BalancePlanRecord record;
    uint64_t runs = 0, captured_runs = 0, measured_runs = 0;
    double measured_sum_us = 0, measured_min_us = 0, measured_max_us = 0;
  };
  cudaEvent_t take_event(int device);
  void give_back(Measurement& m);
  /// Reads finished measurements (all of them with `wait`); keeps the others.
  void poll(bool wait);
  void finish_poll(std::size_t done);

  static constexpr std::size_t kMaxPending = 64;
  static constexpr std::size_t kMaxPlans = 4096;  ///< kept one by one; later ones share one
  std::vector<Plan> plans_;
  std::vector<Measurement> pending_;  ///< oldest first
  std::size_t open_ = 0;              ///< pending_'s last `open_` entries await after_flush
  std::vector<std::pair<int, cudaEvent_t>> free_events_;
};

}  // namespace efccl::runtime
