// What planner.cc and planner_class.cc share (efccl/balance/planner.h): the compact form of a
// plan (Planner::Solution) and the lazy listing of a plan by class. Private to src/balance/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "efccl/balance/planner.h"
#include "path_table_state.h"

namespace efccl::balance {

namespace detail {

/// Every pair stays on its default path when that is provably within this fraction of the
/// optimum (the solver's own margin, split_solver.cc); a plan by class is kept only within it.
constexpr double kCertified = 0.01;

/// Microseconds to carry `bytes` at `gbps`.
inline double us(double bytes, double gbps) { return bytes / (gbps * 1e3); }

/// A pair at or above the threshold, and where its shares are once planned.
struct PairSplit {
  std::size_t position = 0;  ///< src * nranks + dst
  uint64_t bytes = 0;
  int32_t src_slot = 0, dst_slot = 0;
  uint32_t ncandidates = 0;  ///< its candidates, when it has bytes off candidates[0]
  uint32_t begin = 0;        ///< its bytes per candidate: share_bytes[begin .. + ncandidates)
  bool off_default = false;  ///< some bytes off candidates[0]
};

/// A plan by class (planner_class.cc), every pair's split kept once per class and stretch:
/// ranks lie host by host, `per_host` a host, one a GPU; a pair's class is its key
/// (same host ? 1 : 0, i, j) with i, j its ranks' places on their hosts, and a pair between
/// hosts hs -> hd has the stretch t = (hd - hs - 1) mod hosts (0 on one host). The pairs
/// (key, t) of every source host share one split. PairList reads it.
struct ClassListing {
  static constexpr uint32_t kNone = ~uint32_t{0};
  std::shared_ptr<const PathTable> table;  ///< the candidates of a pair when it is read
  std::size_t nranks = 0, per_host = 0, hosts = 0;
  uint64_t min_split_bytes = 0;
  bool lists_direct_pairs = true;
  std::vector<uint64_t> key_bytes;    ///< per key: the bytes of each of its pairs
  std::vector<uint32_t> ncandidates;  ///< per key: its pairs' candidates (where split)
  /// Per key and stretch (key * (hosts - 1) + t): where the pair's bytes per candidate start
  /// in `shares`, or kNone for all on candidates[0].
  std::vector<uint32_t> split_at;
  std::vector<uint64_t> shares;
  /// Listed pairs of the rows of one host before local source i ([per_host]: a host's).
  std::vector<std::size_t> before_local;
  std::size_t listed = 0;

  std::size_t key(std::size_t s, std::size_t d) const {
    const bool same = s / per_host == d / per_host;
    return ((same ? per_host : 0) + s % per_host) * per_host + d % per_host;
  }
  uint32_t split_of(std::size_t s, std::size_t d) const {
    const std::size_t hs = s / per_host, hd = d / per_host;
    const std::size_t t = hs == hd ? 0 : (hd > hs ? hd - hs : hd + hosts - hs) - 1;
    return split_at[key(s, d) * (hosts - 1) + t];
  }
  bool is_listed(std::size_t s, std::size_t d) const {
    return key_bytes[key(s, d)] > 0 && (lists_direct_pairs || split_of(s, d) != kNone);
  }
  /// The pair as a general plan lists it (a listed pair).
  PairPlan pair(std::size_t s, std::size_t d) const;
  /// src * nranks + dst of the index-th listed pair.
  std::size_t position_of(std::size_t index) const;
  /// The first listed position from `position` on (nranks^2 where none).
  std::size_t next_listed(std::size_t position) const;
};

}  // namespace detail

/// A plan without its listing: the shares of the pairs off their default path, and the loads.
struct Planner::Solution {
  using Split = detail::PairSplit;
  /// The pairs at or above the threshold (only those off their default path unless every
  /// pair is listed), src-major.
  std::vector<Split> split;
  std::vector<uint64_t> share_bytes;
  /// Instead of `split` and `share_bytes`: the pairs by class, listed lazily.
  std::shared_ptr<const detail::ClassListing> classes;
  std::vector<double> pair_bytes;  ///< per link: every pair's bytes under the plan (no background)
  std::size_t pairs_with_bytes = 0;
  double max_load_us = 0;  ///< under the background it was planned or last judged with
  double direct_max_load_us = 0;
  bool by_class = false;  ///< Plan::by_class
};

}  // namespace efccl::balance
