// A communicator's machine graph from what its ranks report (docs/topology.md, "At
// communicator init"): every rank says on which host it runs (a host hash) and its GPU's PCI
// bus id; every host contributes the graph it detected (to_json). Hosts are numbered in the
// order of their first rank, merged with merge_hosts, and each rank mapped to the GPU of its
// host with its bus id. Every rank computes it from the same bytes, so every rank gets the same
// graph; the runtime compares the hashes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "efccl/topology/topology.h"

namespace efccl::topo {

struct RankPlacement {
  uint64_t host = 0;  ///< the host's hash (equal for ranks of one host)
  std::string pci;    ///< the rank's GPU's bus id ("" unknown)
};

struct ClusterGraph {
  Topology topology;
  /// Per rank: its GPU in `topology` (nullopt: its bus id is not in its host's graph).
  std::vector<std::optional<NodeIndex>> rank_gpu;
  /// Per rank: its host's index in `topology`.
  std::vector<int32_t> rank_host;
  std::vector<std::string> notes;  ///< ranks whose GPU was not found, and why
  uint64_t hash = 0;               ///< topology.hash()
};

/// Assembles the graph of `ranks` from `host_graphs` (host hash -> that host's graph as
/// to_json wrote it). A host without a graph, or one whose graph does not parse, is an error
/// naming the first rank on it.
StatusOr<ClusterGraph> assemble_cluster(const std::vector<RankPlacement>& ranks,
                                        const std::map<uint64_t, std::string>& host_graphs);

/// A bus id in NCCL's normal form: lower case, with the 4-digit domain ("0000:1b:00.0"), as
/// detection writes it; `text` as it was when it is not a bus id.
std::string normal_bus_id(std::string_view text);

}  // namespace efccl::topo
