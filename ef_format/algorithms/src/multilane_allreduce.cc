// Multi-lane allreduce for nodes x gpus_per_node ranks (rank = node * gpus + g): the buffer is
// split into `channels` lanes, and each lane runs the whole hierarchical scheme on a channel of
// its own, so the lanes proceed side by side on separate threadblocks and connections:
//  1. node-local reduce-scatter, one hop: GPU g reduces shard g of the lane from every GPU of
//     its node (all GPUs of a node are assumed directly connected, e.g. by NVSwitch);
//  2. cross-node allreduce of each shard among the GPUs with the same local index (a ring
//     over the nodes: reduce-scatter of its chunks, then allgather);
//  3. node-local allgather, one hop: GPU g sends its reduced shard to every GPU of its node.
// Unlike hierarchical_allreduce (rings inside the node, one lane on automatically searched
// channels), the node-local phases take one step, and lane l is pinned to channel l.
// Chunk (lane l, shard g, node part n) is (l * gpus + g) * nodes + n.
#include <vector>

#include "library.h"
#include "ring_phases.h"

namespace efccl::algorithms::detail {

using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;
using compiler::Ref;

StatusOr<ef::Program> multilane_allreduce(const AlgorithmParams& p,
                                          const compiler::CompileOptions& o) {
  const int32_t nodes = p.nodes;
  const int32_t gpus = p.ranks / nodes;
  const int32_t lanes = p.channels;
  ProgramBuilder b("multilane_allreduce", ef::Collective::kAllReduce, p.ranks,
                   int64_t{lanes} * gpus * nodes, p.inplace, p.protocol, p.instances, o);
  if (p.ranks == 1) {
    b.chunk(0, kInput, 0, lanes).copy(0, kOutput, 0);
    return b.compile();
  }
  auto rank = [&](int32_t n, int32_t g) { return n * gpus + g; };
  auto shard = [&](int32_t l, int32_t g) { return (int64_t{l} * gpus + g) * nodes; };
  const compiler::Buffer partials = b.scratch_buffer("inter_partials");
  for (int32_t l = 0; l < lanes; ++l) {
    // 1. Node-local reduce-scatter: GPU g sums shard (l, g) of its node into its output.
    if (gpus > 1) {
      for (int32_t n = 0; n < nodes; ++n) {
        for (int32_t g = 0; g < gpus; ++g) {
          const int32_t me = rank(n, g);
          const int64_t i = shard(l, g);
          Ref acc;
          for (int32_t s = 1; s < gpus; ++s) {
            const Ref theirs = b.chunk(rank(n, (g + s) % gpus), kInput, i, nodes);
            acc = s == 1 ? b.chunk(me, kInput, i, nodes).reduce_into(theirs, kOutput, i, -1, -1, l)
                         : acc.reduce(theirs, -1, -1, l);
          }
        }
      }
    }
    // 2. Cross-node allreduce of shard (l, g) among the GPUs g.
    const ValueOf node_sum = [&](int32_t r, int64_t i, int64_t size) {
      return b.chunk(r, gpus > 1 ? kOutput : kInput, i, size);
    };
    for (int32_t g = 0; g < gpus; ++g) {
      std::vector<int32_t> peers;
      std::vector<int64_t> parts;
      for (int32_t n = 0; n < nodes; ++n) {
        peers.push_back(rank(n, g));
        parts.push_back(shard(l, g) + n);
      }
      ring_reduce_scatter(b, peers, parts, 1, node_sum, partials, l);
      ring_allgather(b, peers, parts, 1, l);
    }
    // 3. Node-local allgather.
    for (int32_t n = 0; n < nodes; ++n) {
      for (int32_t g = 0; g < gpus; ++g) {
        for (int32_t s = 1; s < gpus; ++s) {
          b.chunk(rank(n, g), kOutput, shard(l, g), nodes)
              .copy(rank(n, (g + s) % gpus), kOutput, shard(l, g), -1, -1, l);
        }
      }
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
