// The machine the balancer plans over for one clique (docs/balancer.md, "In the runtime"): the
// communicator's machine graph with every rank on its own GPU node, or, with
// EFCCL_BALANCE_TOPOLOGY, a preset or topology file with rank r on that topology's GPU r mod n,
// so that ranks sharing one real GPU plan as if on another machine (tests). It also says which
// relay GPUs can hold a connection's slots (a slot device) and on which CUDA device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "efccl/balance/planner.h"
#include "efccl/common/status.h"
#include "efccl/topology/cluster.h"

namespace efccl::runtime {

struct BalanceMachine {
  std::shared_ptr<const balance::PathTable> table;  ///< per clique rank: its GPU node
  /// "machine graph", or EFCCL_BALANCE_TOPOLOGY's value.
  std::string source;
  /// Planned on a topology that is not the ranks' own (EFCCL_BALANCE_TOPOLOGY): slot devices
  /// bind to the receiving rank's real GPU.
  bool simulated = false;
  /// Whether pinned host memory is a candidate beside NVLink (EFCCL_BALANCE_HOST_MEMORY).
  bool host_memory = true;
  /// Per node of the topology: its CUDA device in this process, or -1 (not a GPU, not
  /// visible, or simulated).
  std::vector<int> node_device;
  /// Multi-process: every process of the communicator sees every GPU of its host, so a relay
  /// GPU can hold slots whichever process owns them (agreed at init; always true in one
  /// process, where node_device says).
  bool every_process_sees_every_gpu = true;

  int32_t nranks() const { return table->nranks(); }
  topo::NodeIndex rank_gpu(int32_t rank) const { return table->rank_gpu(rank); }
};

/// The machine of a clique of `nranks` ranks. `spec`: EFCCL_BALANCE_TOPOLOGY ("" for `graph`,
/// "preset:NAME[:HOSTS]", or a file: NCCL topology XML by its ".xml" suffix, else efccl's
/// topology JSON). `graph` may be null when `spec` names a topology. An error says why the
/// clique cannot balance (a rank without a GPU node, an unreadable file, ...).
StatusOr<BalanceMachine> make_balance_machine(const topo::ClusterGraph* graph, int32_t nranks,
                                              const std::string& spec,
                                              bool every_process_sees_every_gpu);

}  // namespace efccl::runtime
