// The planner's numeric core (docs/balancer.md, "The method"): given the pairs it may split,
// their candidates and the load that stays put, bytes per candidate that keep the busiest link
// as light as it can. Private to src/balance/; planner.cc gathers the input and lists the plan.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "path_table_state.h"

namespace efccl::balance::detail {

struct SplitPair {
  uint64_t bytes = 0;
  std::span<const LinkIndex> path;  ///< candidates[0]'s links
};

struct SplitInput {
  std::span<const double> us_per_byte;  ///< per link of the topology
  std::span<const double> base;         ///< per link: bytes that stay (background, small pairs)
  std::span<const double> direct;       ///< per link: `base` + every pair on candidates[0]
  double lower_bound_us = 0;            ///< proven: no plan's maximum is below this
  std::span<const SplitPair> pairs;
  /// The candidates of pair p (at least one; candidates[0] is `path`), asked for only when
  /// the pair may have to leave its default path.
  std::function<StatusOr<CandidateView>(uint32_t p)> candidates;
  uint64_t piece_bytes = 1;
  uint32_t max_pieces = 1;
  double hop_penalty_us = 0;
  int max_sweeps = 0;
};

/// The pairs with bytes off candidates[0], ascending; every other pair stays there.
struct SplitOutput {
  std::vector<uint32_t> pairs;
  std::vector<CandidateView> views;
  /// Pair pairs[i]'s bytes on its candidate c: bytes[begin[i] + c] (whole pieces but one).
  std::vector<uint32_t> begin;
  std::vector<uint64_t> bytes;
};

/// Fills `out` (its buffers reused).
Status split(const SplitInput& in, SplitOutput& out);


}  // namespace efccl::balance::detail
