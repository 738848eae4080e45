// Two-step alltoall (GC3 §2 and Fig. 10a) for nodes x gpus_per_node ranks (rank = node * gpus
// + g). Sending every block across the network on its own costs one small message per pair of
// GPUs on different nodes; instead:
//  1. inside node n1, for every other node n2, GPU g1 hands the block bound for GPU g2 of n2
//     to its local peer g2 (the GPU that "owns" local index g2), which collects the blocks of
//     all g1 contiguously, in source order, in a scratch buffer per destination node;
//  2. GPU g of n1 sends that buffer to GPU g of n2 in one transfer per (node pair, local
//     index): gpus times fewer, gpus times larger cross-node messages, one NIC each. The
//     buffer lands directly in the output, where the blocks of n1's GPUs are contiguous.
// Blocks bound for the own node go directly. With `channels` = C, blocks have C chunks, chunk c
// of a block moves on channel c inside the node, and each aggregated transfer is cut into C
// pieces on channels 0 .. C-1. With one node this is the direct alltoall. In-place (the output is
// the input), blocks that would overwrite data still to be sent are received into scratch first and
// copied out at the end.
#include <string>

#include "library.h"

namespace efccl::algorithms::detail {

using compiler::Buffer;
using compiler::kInput;
using compiler::kOutput;
using compiler::ProgramBuilder;

StatusOr<ef::Program> two_step_alltoall(const AlgorithmParams& p,
                                        const compiler::CompileOptions& o) {
  const int32_t nodes = p.nodes;
  const int32_t gpus = p.ranks / nodes;
  const int32_t ch = p.channels;
  ProgramBuilder b("two_step_alltoall", ef::Collective::kAllToAll, p.ranks, ch, p.inplace,
                   p.protocol, p.instances, o);
  auto rank = [&](int32_t n, int32_t g) { return n * gpus + g; };
  auto block = [&](int32_t r) { return int64_t{r} * ch; };
  std::vector<Buffer> to_node;  // on every rank: the blocks gathered for node n2
  for (int32_t n2 = 0; n2 < nodes; ++n2) {
    to_node.push_back(b.scratch_buffer("to_node_" + std::to_string(n2)));
  }
  // In-place, received blocks wait in scratch until every block was sent.
  const Buffer landing = b.scratch_buffer("landing");
  const Buffer dst_buffer = p.inplace ? landing : kOutput;

  // 1. Gather, on GPU g2 of node n1, the blocks its node sends to GPU g2 of node n2 (with one
  // GPU per node the input block itself is the aggregate).
  for (int32_t n1 = 0; n1 < nodes && gpus > 1; ++n1) {
    for (int32_t hop = 1; hop < nodes; ++hop) {
      const int32_t n2 = (n1 + hop) % nodes;
      for (int32_t g1 = 0; g1 < gpus; ++g1) {
        for (int32_t g2 = 0; g2 < gpus; ++g2) {
          for (int32_t c = 0; c < ch; ++c) {
            b.chunk(rank(n1, g1), kInput, block(rank(n2, g2)) + c)
                .copy(rank(n1, g2), to_node[static_cast<std::size_t>(n2)], int64_t{g1} * ch + c, -1,
                      -1, c);
          }
        }
      }
    }
  }
  // Blocks for the own node go directly.
  for (int32_t r = 0; r < p.ranks; ++r) {
    const int32_t n = r / gpus;
    for (int32_t g = 0; g < gpus; ++g) {
      const int32_t q = rank(n, g);
      for (int32_t c = 0; c < ch; ++c) {
        b.chunk(r, kInput, block(q) + c)
            .copy(q, q == r ? kOutput : dst_buffer, block(r) + c, -1, -1, c);
      }
    }
  }
  // 2. One transfer per (node pair, local index), in `ch` pieces of gpus chunks.
  for (int32_t n1 = 0; n1 < nodes; ++n1) {
    for (int32_t hop = 1; hop < nodes; ++hop) {
      const int32_t n2 = (n1 + hop) % nodes;
      for (int32_t g = 0; g < gpus; ++g) {
        for (int32_t c = 0; c < ch; ++c) {
          const int64_t piece = int64_t{c} * gpus;
          const auto from =
              gpus > 1 ? b.chunk(rank(n1, g), to_node[static_cast<std::size_t>(n2)], piece, gpus)
                       : b.chunk(rank(n1, g), kInput, block(rank(n2, g)) + c);
          from.copy(rank(n2, g), dst_buffer, block(rank(n1, 0)) + piece, -1, -1, c);
        }
      }
    }
  }
  if (p.inplace) {
    for (int32_t r = 0; r < p.ranks; ++r) {
      for (int32_t q = 0; q < p.ranks; ++q) {
        if (q != r) b.chunk(r, landing, block(q), ch).copy(r, kOutput, block(q));
      }
    }
  }
  return b.compile();
}

}  // namespace efccl::algorithms::detail
