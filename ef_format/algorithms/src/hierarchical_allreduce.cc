// Hierarchical allreduce (GC3 §6.3) for nodes x gpus_per_node ranks (rank = node * gpus + g).
// The buffer is cut into gpus shards of `nodes` chunks; shard g is "owned" by the GPUs with
// local index g, and its chunk n by node n.
//  1. Inside each node, a ring reduce-scatter: GPU g ends with the node's sum of shard g.
//  2. Across nodes, for each local index g, a ring allreduce of shard g among the GPUs g of all
//     nodes (reduce-scatter of its chunks, then allgather): one ring per NIC, and only
//     1/gpus of the data crosses the network per GPU.
//  3. Inside each node, a ring allgather of the shards.
// Channels are left to the compiler's automatic search: the rings of one rank use different
// peers, so they never compete for a connection. One node is a ring allreduce; one GPU per
// node is a ring allreduce across the nodes.
#include <vector>

#include "library.h"
#include "ring_phases.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> hierarchical_allreduce(const AlgorithmParams& p,
                                             const compiler::CompileOptions& o) {
  const int32_t nodes = p.nodes;
  const int32_t gpus = p.ranks / nodes;
  ProgramBuilder b("hierarchical_allreduce", ef::Collective::kAllReduce, p.ranks,
                   int64_t{gpus} * nodes, p.inplace, p.protocol, p.instances, o);
  if (p.ranks == 1) {
    b.chunk(0, kInput, 0).copy(0, kOutput, 0);
    return b.compile();
  }
  auto rank = [&](int32_t n, int32_t g) { return n * gpus + g; };
  const compiler::Buffer intra_partials = b.scratch_buffer("intra_partials");
  const compiler::Buffer inter_partials = b.scratch_buffer("inter_partials");

  // 1. Intra-node reduce-scatter of the shards (nodes chunks each).
  std::vector<int64_t> shards;
  for (int32_t g = 0; g < gpus; ++g) shards.push_back(int64_t{g} * nodes);
  const ValueOf input = [&](int32_t r, int64_t i, int64_t size) {
    return b.chunk(r, kInput, i, size);
  };
  for (int32_t n = 0; n < nodes; ++n) {
    std::vector<int32_t> local;
    for (int32_t g = 0; g < gpus; ++g) local.push_back(rank(n, g));
    ring_reduce_scatter(b, local, shards, nodes, input, intra_partials, -1);
  }
  // 2. Cross-node allreduce of shard g among the GPUs g; their node sums are in the output
  // (in the input when a node has one GPU and step 1 did nothing).
  const ValueOf node_sum = [&](int32_t r, int64_t i, int64_t size) {
    return b.chunk(r, gpus > 1 ? kOutput : kInput, i, size);
  };
  for (int32_t g = 0; g < gpus; ++g) {
    std::vector<int32_t> peers;
    std::vector<int64_t> parts;
    for (int32_t n = 0; n < nodes; ++n) {
      peers.push_back(rank(n, g));
      parts.push_back(int64_t{g} * nodes + n);
    }
    ring_reduce_scatter(b, peers, parts, 1, node_sum, inter_partials, -1);
    ring_allgather(b, peers, parts, 1, -1);
  }
  // 3. Intra-node allgather of the shards.
  for (int32_t n = 0; n < nodes; ++n) {
    std::vector<int32_t> local;
    for (int32_t g = 0; g < gpus; ++g) local.push_back(rank(n, g));
    ring_allgather(b, local, shards, nodes, -1);
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
