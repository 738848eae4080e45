// How a communicator's ranks lie on hosts, as the tuning table sees it: a communicator spanning
// hosts picks programs whose traffic between hosts is sane (hierarchical, multi-lane) where the
// ranks form the shape those programs are written for: every host holds the same number of
// ranks, in one contiguous block (rank = host x ranks_per_host + local index), as torchrun,
// efccl-mprun --hosts and MPI's by-node placement give.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace efccl::runtime {

struct HostLayout {
  int32_t hosts = 1;  ///< distinct hosts (1: every rank on one host)
  /// Ranks per host when every host holds that many in one contiguous block; 0 otherwise.
  int32_t ranks_per_host = 0;

  /// From each rank's host identity (in rank order); empty: one host.
  static HostLayout of(const std::vector<uint64_t>& rank_hosts);
  /// Several hosts in contiguous blocks of equal size (the hierarchical programs' shape).
  bool blocks() const { return hosts > 1 && ranks_per_host > 0; }
  /// "2 hosts x 2 ranks", "3 hosts (not in equal contiguous blocks)", "1 host".
  std::string describe() const;
};

}  // namespace efccl::runtime
