// The balancer's planner (docs/balancer.md): a demand matrix in, for every pair a split of its
// bytes over candidate paths out, keeping the most loaded link as light as it can. CUDA-free,
// deterministic: equal inputs give equal plans, bit for bit, on every rank and machine.
//
//   auto table = balance::PathTable::build(topology, rank_gpus);   // once per communicator
//   balance::Planner planner(*table, balance::PlannerOptions{});
//   balance::Plan plan = planner.plan(demand);                     // per call (cached by demand)
//   for (const balance::PairPlan& p : plan.pairs)                  // p.paths: candidate, bytes
//   std::optional<balance::PairPlan> one = plan.pairs.find(src, dst);
//
// Candidates of a pair (candidates[0] is the path used without balancing):
//   same GPU       the GPU's memory (no link)
//   same host      the default route, then through each other GPU of the host (one relay, as
//                  NIMBLE), then through pinned host memory (Topology::gpu_walks)
//   other hosts    src's rail NIC to the same rail's NIC on dst's host, then to dst (default);
//                  then for every rail r: src -> (NVLink) the GPU owning rail r -> its NIC ->
//                  rail r -> the NIC of rail r on dst's host -> the GPU owning it -> (NVLink) dst
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/topology/topology.h"

namespace efccl::balance {
namespace detail {
struct PairSplit;     // src/balance/planner_internal.h
struct ClassListing;  // src/balance/planner_internal.h: a plan by class, listed lazily
}  // namespace detail

using topo::LinkIndex;
using topo::NodeIndex;

/// Bytes from every rank to every rank, row-major: bytes[src * nranks + dst].
struct Demand {
  int32_t nranks = 0;
  std::vector<uint64_t> bytes;
  uint64_t at(int32_t src, int32_t dst) const {
    return bytes[static_cast<std::size_t>(src) * static_cast<std::size_t>(nranks) +
                 static_cast<std::size_t>(dst)];
  }
  /// A hash of the matrix (the plan cache's key).
  uint64_t hash() const;
};
/// {"ranks": N, "bytes": [[...], ...]} (N rows of N non-negative integers); errors name `where`.
StatusOr<Demand> demand_from_json(std::string_view text, std::string_view where);

/// What a candidate is, for turning it into a program (program_builder.h).
enum class CandidateKind : uint8_t {
  kLocal,   ///< both ranks on one GPU: its memory
  kDirect,  ///< the default route (between hosts: the source's own rail)
  kRelay,   ///< through one other GPU of the host (`relays`: that GPU)
  kHost,    ///< through pinned host memory of the source's CPU
  kRail,    ///< between hosts on rail `rail`, through the GPUs owning it on each side
};

/// One way from a rank's GPU to another's.
struct Candidate {
  std::vector<LinkIndex> links;
  double gbps = 0;           ///< its bottleneck (0: no link, the same GPU)
  std::string via;           ///< "direct", "relay h0.gpu2", "host memory", "rail 3", "local"
  CandidateKind kind = CandidateKind::kDirect;
  /// The GPUs the bytes pass through between the ends, in order: kRelay its relay; kRail the
  /// GPUs owning the rail on the source's and the destination's host, where they are not the
  /// ends themselves. Empty for the other kinds.
  std::vector<NodeIndex> relays;
  int32_t rail = -1;  ///< between hosts (kDirect, kRail): the rail; -1 otherwise
};

/// What PathTable::build offers as candidates.
struct PathTableOptions {
  /// Whether a walk through pinned host memory is a candidate beside NVLink walks. False: it
  /// is one only where it is the pair's default path (GPUs with no peer access). The runtime
  /// turns it off on real machines by default (EFCCL_BALANCE_HOST_MEMORY; docs/balancer.md).
  bool host_memory = true;
};

/// Every pair's candidates over one topology and placement of ranks. Built once; candidates
/// are computed on first use (thread-safe: lookups take no lock) from per-host subgraphs and
/// cached per GPU pair in dense per-source rows.
class PathTable {
 public:
  /// `rank_gpu[r]`: rank r's GPU node in `topology` (several ranks may share one).
  static StatusOr<std::shared_ptr<const PathTable>> build(const topo::Topology& topology,
                                                          std::vector<NodeIndex> rank_gpu,
                                                          PathTableOptions options = {});
  ~PathTable();
  int32_t nranks() const { return static_cast<int32_t>(rank_gpu_.size()); }
  const topo::Topology& topology() const { return topology_; }
  NodeIndex rank_gpu(int32_t rank) const { return rank_gpu_[static_cast<std::size_t>(rank)]; }
  /// The candidates of (src, dst); never empty on a connected graph (an error names the pair
  /// otherwise). `only_default`: candidates[0] alone (all of them when already known).
  StatusOr<std::shared_ptr<const std::vector<Candidate>>> candidates(
      int32_t src, int32_t dst, bool only_default = false) const;

 private:
  friend class Planner;
  struct State;  // the lazily filled rows and caches (src/balance/path_table_state.h)
  PathTable();

  topo::Topology topology_;
  std::vector<NodeIndex> rank_gpu_;
  std::unique_ptr<State> state_;
};

struct PlannerOptions {
  /// Pairs with fewer bytes stay on candidates[0] (EFCCL_BALANCE_MIN_BYTES).
  uint64_t min_split_bytes = 1u << 20;
  /// A repeating demand keeps its plan unless a new one lowers the maximum link load by more
  /// than this fraction (EFCCL_BALANCE_HYSTERESIS).
  double hysteresis = 0.05;
  /// Splits are whole multiples of this, down to 1/64 of it where the last refinement needs
  /// finer steps (a pair's share on its largest candidate takes the remainder), so that they
  /// map onto chunks.
  uint64_t piece_bytes = 256u << 10;
  /// At most this many pieces per pair (larger pairs use larger pieces, still multiples).
  uint32_t max_pieces = 64;
  /// Microseconds charged per link a path has beyond candidates[0]'s: small transfers stay
  /// on short paths, large ones take extra hops when the load says so.
  double hop_penalty_us = 1.0;
  /// Sweeps over the pairs of the fractional optimisation, at most (docs/balancer.md; it stops
  /// once the plan is provably within 1% of the optimum, usually long before).
  int iterations = 64;
  /// Whether Plan::pairs lists every pair with bytes (true) or only the pairs with bytes off
  /// their candidates[0] (false; every other pair sends all its bytes on candidates[0]). A
  /// communicator of a thousand ranks has a million pairs: listing them costs more than
  /// planning them.
  bool list_direct_pairs = true;
  /// Whether a symmetric machine and demand (identical hosts, ranks host by host, a pair's
  /// bytes depending only on its ranks' places on their hosts and on whether the hosts are the
  /// same, no background) are planned by class: equivalent pairs share one split. Kept only
  /// when provably within 1% of the optimum; otherwise the general planner runs.
  bool by_class = true;
  /// EFCCL_BALANCE_MIN_BYTES and EFCCL_BALANCE_HYSTERESIS over the defaults; a bad value is
  /// an error naming the variable.
  static StatusOr<PlannerOptions> from_environment();
};

struct PathShare {
  uint32_t candidate = 0;  ///< index into the pair's candidates
  uint64_t bytes = 0;
};

struct PairPlan {
  int32_t src = 0;
  int32_t dst = 0;
  uint64_t bytes = 0;
  std::shared_ptr<const std::vector<Candidate>> candidates;
  std::vector<PathShare> paths;  ///< bytes add up to `bytes`; candidate ascending
};

/// The pairs of a plan, src-major then dst. A general plan lists them one by one; a plan by
/// class lists them lazily: every pair's split follows from its class, so a pair becomes a
/// PairPlan (its candidates looked up in the table) only when it is read. A thousand ranks'
/// uniform all-to-all moves 419K pairs that a rank mostly never reads: listing them all took
/// longer than planning. Reading is the same either way, and so are the pairs read, but for
/// one thing: a plan by class lists a pair under the threshold with candidates[0] alone
/// whenever it is read (a general plan lists every candidate where the table knew them when it
/// planned), so that a plan read later, after other plans taught the table more, reads the same.
class PairList {
 public:
  class const_iterator;
  PairList() = default;
  PairList(std::vector<PairPlan> pairs) : listed_(std::move(pairs)) {}  // NOLINT: implicit
  PairList(std::initializer_list<PairPlan> pairs) : listed_(pairs) {}
  explicit PairList(std::shared_ptr<const detail::ClassListing> classes);
  std::size_t size() const;
  bool empty() const { return size() == 0; }
  /// The i-th pair, by value (by class: found in O(nranks)).
  PairPlan operator[](std::size_t i) const;
  /// The pair (src, dst) where listed (by class: O(1); else a binary search).
  std::optional<PairPlan> find(int32_t src, int32_t dst) const;
  const_iterator begin() const;
  const_iterator end() const;
  /// Whether the pairs are listed lazily, by class.
  bool lazy() const { return classes_ != nullptr; }

 private:
  std::vector<PairPlan> listed_;
  std::shared_ptr<const detail::ClassListing> classes_;
};

/// Reads a PairList in order. An input iterator: by class, `*it` is the pair materialised in
/// the iterator, valid until it moves (a range-for over the list is what it is for).
class PairList::const_iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = PairPlan;
  using difference_type = std::ptrdiff_t;
  using pointer = const PairPlan*;
  using reference = const PairPlan&;
  const_iterator() = default;
  reference operator*() const { return list_->lazy() ? current_ : list_->listed_[index_]; }
  pointer operator->() const { return &**this; }
  const_iterator& operator++();
  const_iterator operator++(int) {
    const_iterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const const_iterator& o) const { return index_ == o.index_; }

 private:
  friend class PairList;
  const PairList* list_ = nullptr;
  std::size_t index_ = 0;     ///< the pair's place in the list
  std::size_t position_ = 0;  ///< by class: src * nranks + dst
  PairPlan current_;          ///< by class: the pair, materialised
};

struct Plan {
  /// Every pair with bytes, src-major then dst; only those with bytes off candidates[0] when
  /// `lists_direct_pairs` is false. Listed lazily when the plan is by class (PairList).
  PairList pairs;
  std::vector<double> link_bytes;  ///< per link of the topology, background included
  double max_load_us = 0;          ///< max over links of bytes / capacity
  double direct_max_load_us = 0;   ///< the same with every pair on candidates[0]
  uint64_t min_split_bytes = 0;    ///< the threshold in force
  bool lists_direct_pairs = true;  ///< PlannerOptions::list_direct_pairs in force
  bool by_class = false;           ///< planned by class (PlannerOptions::by_class)
};

class Planner {
 public:
  Planner(std::shared_ptr<const PathTable> table, PlannerOptions options);
  /// A plan for `demand` (nranks must match the table's). `background_bytes`: recent load per
  /// link of the topology (empty: none). Repeating demands return their cached plan unless a
  /// new one beats it by more than the hysteresis; a repeat under the same background returns
  /// the plan in force without planning again.
  StatusOr<Plan> plan(const Demand& demand, std::span<const double> background_bytes = {});
  const PlannerOptions& options() const { return options_; }

 private:
  struct Solution;  // a plan without its listing (src/balance/planner_internal.h)
  struct Kept;      // the plan in force for one demand
  StatusOr<Solution> compute(const Demand& demand, std::span<const double> background) const;
  /// The plan by class (planner_class.cc): true when `sol` is its answer (a plan by class,
  /// or every pair on its default path where that is provably good enough); false where the
  /// general planner must run (no symmetry, not provably within 1% of the optimum).
  bool plan_by_class(const Demand& demand, Solution& sol) const;
  StatusOr<Plan> materialize(const Solution& solution, const Demand& demand,
                             std::span<const double> background) const;
  std::shared_ptr<const PathTable> table_;
  PlannerOptions options_;
  std::map<uint64_t, std::shared_ptr<const Kept>> last_;  ///< by demand hash: the plan in force
};

/// Max over links of bytes / capacity, in microseconds.
double max_load_us(const topo::Topology& t, std::span<const double> link_bytes);

}  // namespace efccl::balance
