// The inside of balance::PathTable (efccl/balance/planner.h): per GPU pair, the default path and
// the candidate set, in dense rows filled on first use, and the flat view the planner reads.
// Private to src/balance/.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "efccl/balance/planner.h"

namespace efccl::balance::detail {

/// A walk and its name, before it becomes a Candidate.
struct Walk {
  std::vector<LinkIndex> links;
  std::string via;
  CandidateKind kind = CandidateKind::kDirect;  ///< Candidate::kind
  std::vector<NodeIndex> relays;                ///< Candidate::relays
  int32_t rail = -1;                            ///< Candidate::rail
};

/// The planner's view of one GPU pair's candidates, packed in one block of the table's arena
/// (a plan reads thousands of them; one block is a few adjacent cache lines):
///   [n, shortest_useful, union_size, flags[n], link_begin[n + 1], union links, links]
/// with flags[c] = extra_links << 1 | useful and link_begin relative to the block.
struct CandidateView {
  const uint32_t* v = nullptr;

  uint32_t size() const { return v[0]; }
  /// The useful candidate with the fewest extra links (the lowest index of those).
  uint32_t shortest_useful() const { return v[1]; }
  /// false where another candidate's links are a subset of this one's: such a candidate never
  /// lowers a load that the other would not (on NVSwitch, a relay is the direct path plus a
  /// detour), so the planner leaves it out. The optimum over the rest is the same.
  bool useful(uint32_t c) const { return (v[3 + c] & 1) != 0; }
  /// Links beyond candidates[0]'s (the hop penalty counts these).
  uint32_t extra_links(uint32_t c) const { return v[3 + c] >> 1; }
  std::span<const LinkIndex> links_of(uint32_t c) const {
    const uint32_t* begin = v + 3 + size();
    return {v + begin[c], v + begin[c + 1]};
  }
  /// Every link of a useful candidate, once, ascending.
  std::span<const LinkIndex> union_links() const {
    return {v + 3 + 2 * size() + 1, v + 3 + 2 * size() + 1 + v[2]};
  }
  /// The number of links over all candidates.
  uint32_t total_links() const {
    const uint32_t* begin = v + 3 + size();
    return begin[size()] - begin[0];
  }
};

/// One GPU pair's candidates: the public list and the planner's view of it.
struct CandidateSet : std::enable_shared_from_this<CandidateSet> {
  std::vector<Candidate> candidates;
  CandidateView view;
};

/// Everything a planner needs about one source GPU: the default path (candidates[0]) to every
/// GPU, flat, and the candidate sets computed so far. Immutable once published, apart from
/// the atomic slots and the view chunks (both filled under the table's mutex).
struct Row {
  /// The default path to slot d is links[begin[d] .. begin[d + 1]); reachable[d] == 0 when
  /// there is none (an error for a pair with bytes).
  std::vector<uint32_t> begin;
  std::vector<LinkIndex> links;
  std::vector<uint8_t> reachable;
  std::unique_ptr<std::atomic<const CandidateSet*>[]> full;          ///< every candidate
  std::unique_ptr<std::atomic<const uint32_t*>[]> full_view;         ///< their CandidateView
  std::unique_ptr<std::atomic<const CandidateSet*>[]> only_default;  ///< candidates[0] alone
  /// Storage of this row's CandidateViews, in chunks that never move (written under the
  /// table's mutex): the views of one source lie together, as the planner reads them.
  mutable std::vector<std::unique_ptr<uint32_t[]>> view_chunks;
  mutable std::size_t view_left = 0;

  std::span<const LinkIndex> default_links(int32_t d) const {
    return {links.data() + begin[static_cast<std::size_t>(d)],
            links.data() + begin[static_cast<std::size_t>(d) + 1]};
  }
};

/// The public list of `set`, sharing its ownership.
inline std::shared_ptr<const std::vector<Candidate>> candidates_of(const CandidateSet* set) {
  return {set->shared_from_this(), &set->candidates};
}

/// The table folded by host, for the plan by class (planner.cc): where every host is the same
/// graph joined to the same outside nodes and ranks lie host by host, one a GPU, in the same
/// order on every host, a link of one host stands for the same link of every host. Built once
/// per table, on the first plan that asks.
struct Folding {
  static constexpr uint32_t kNone = ~uint32_t{0};
  bool symmetric = false;  ///< false: no plan by class on this table (the rest is empty)
  std::size_t hosts = 0;
  std::size_t per_host = 0;  ///< ranks (GPUs) per host
  std::vector<uint32_t> folded;    ///< per link of the topology: its folded link
  std::vector<double> us_per_byte;  ///< per folded link, as the folded problem counts it
  std::vector<uint8_t> per_host_link;  ///< per folded link: 1 when it is one link of each host
  /// Per class (same host ? 1 : 0, i, j): the CandidateView over folded links of its
  /// representative, rank i -> rank j (same host) or -> rank per_host + j, at arena[view_at];
  /// kNone where the pair has no path.
  std::vector<uint32_t> view_at;
  std::vector<uint32_t> arena;
};

}  // namespace efccl::balance::detail

namespace efccl::balance {

struct PathTable::State {
  /// The row of source slot `slot`, computed on first use.
  const detail::Row* row(int32_t slot);
  /// Every candidate of (src, dst) slots / candidates[0] alone (every candidate when known).
  StatusOr<const detail::CandidateSet*> full_set(int32_t src, int32_t dst);
  /// full_set's view, without touching the set.
  StatusOr<detail::CandidateView> full_view(int32_t src, int32_t dst);
  StatusOr<const detail::CandidateSet*> default_set(int32_t src, int32_t dst);
  /// Every candidate's walk of (src, dst) slots, candidates[0] first, computed and not kept:
  /// the table's sets stay as they were (a listing shows a small pair's whole set only where
  /// it is known already), for checks that look at pairs no plan asked about.
  std::vector<detail::Walk> unkept_walks(int32_t src, int32_t dst);

  const topo::Topology* topology = nullptr;  ///< the table's
  bool host_memory = true;                   ///< PathTableOptions::host_memory
  /// Per host: its subgraph, the maps between its indices and the whole graph's, and what
  /// the candidates ask of it again and again.
  struct HostGraph {
    topo::Topology graph;
    std::vector<LinkIndex> to_whole;       ///< local link -> whole link
    std::vector<NodeIndex> to_whole_node;  ///< local node -> whole node
    std::vector<NodeIndex> gpus;           ///< local GPU nodes, by index
    std::vector<NodeIndex> nics;           ///< local NIC nodes, by index
    std::vector<NodeIndex> rail_nic;       ///< local node -> its GPU's rail NIC (local; kAbsent)
    std::vector<NodeIndex> nic_owner;      ///< local node -> the GPU owning that NIC (whole)
  };
  std::vector<HostGraph> hosts;
  std::vector<NodeIndex> local_of;  ///< whole node -> its index in its host's subgraph

  /// GPU slots: the distinct GPUs of the ranks, in order of first rank.
  std::vector<int32_t> rank_slot;  ///< rank -> slot
  std::vector<NodeIndex> slot_gpu;  ///< slot -> GPU node
  std::vector<int32_t> slot_host;   ///< slot -> host
  /// Microseconds per byte of each link of the topology: 1 / (GB/s * 1e3).
  std::vector<double> us_per_byte;
  /// Cut capacities (GB/s) for the planner's lower bound: out of / into each slot's GPU, and
  /// out of / into each host (links between a node of the host and one outside it).
  std::vector<double> slot_out_gbps, slot_in_gbps, host_out_gbps, host_in_gbps;
  std::vector<LinkIndex> slot_out_links, slot_in_links, host_out_links, host_in_links;
  std::vector<uint32_t> slot_out_begin, slot_in_begin, host_out_begin, host_in_begin;
  /// (from, to) -> the first link from `from` to `to` of a rail switch (net hops).
  std::unordered_map<uint64_t, LinkIndex> switch_link;

  /// Rows by slot, published with release once complete.
  std::unique_ptr<std::atomic<const detail::Row*>[]> rows;
  std::mutex mu;  ///< guards everything below and the filling of rows and slots
  std::vector<std::unique_ptr<detail::Row>> row_storage;
  std::vector<std::shared_ptr<detail::CandidateSet>> sets;
  /// The folding for the plan by class, published with release once complete.
  std::atomic<const detail::Folding*> folding{nullptr};
  std::unique_ptr<detail::Folding> folding_storage;
  /// Routes inside one host (whole links), by (from, to) nodes.
  std::unordered_map<uint64_t, std::optional<std::vector<LinkIndex>>> routes;

 private:
  // All of these run under `mu`.
  const std::optional<std::vector<LinkIndex>>& host_route(NodeIndex a, NodeIndex b);
  /// a -> src_gpu -> src_nic -> (rail switch) -> dst_nic -> dst_gpu -> b.
  std::optional<std::vector<LinkIndex>> via_rail(NodeIndex a, NodeIndex src_gpu,
                                                 NodeIndex src_nic, NodeIndex dst_nic,
                                                 NodeIndex dst_gpu, NodeIndex b);
  std::optional<NodeIndex> nic_of_rail(int32_t host, int32_t rail) const;
  int32_t rail_of(NodeIndex nic) const;
  /// candidates[0] of (a, b) when it has the usual shape (the route inside a host; the own
  /// rail NIC across hosts); nullopt otherwise (then walks() decides).
  std::optional<detail::Walk> default_walk(NodeIndex a, NodeIndex b);
  /// Every candidate of (a, b), candidates[0] first.
  std::vector<detail::Walk> walks(NodeIndex a, NodeIndex b);
  /// A set of `walks`, its view stored in `row`'s chunks.
  std::shared_ptr<detail::CandidateSet> make_set(const detail::Row& row,
                                                 std::vector<detail::Walk> walks);
  /// Publishes a complete set in slot `dst` of `row`.
  const detail::CandidateSet* publish(const detail::Row& row, int32_t dst,
                                      std::shared_ptr<detail::CandidateSet> set);
  Status no_path(NodeIndex a, NodeIndex b) const;
};

}  // namespace efccl::balance
