// What the library's programs look like, beyond computing the right result (algorithms_test.cc
// checks that): where each algorithm sends its data, in how many transfers of what size, on
// which channels. These are the properties the algorithms exist for (one step, aggregated
// cross-node transfers, traffic between GPUs of one local index, lanes on their own channels,
// AllToNext spread over every NIC).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"

namespace efccl::algorithms {
namespace {

/// One pushing op: to `peer` on `channel`, `count` chunks; `from_input`: a send of the rank's
/// own input (not forwarding, not a relay).
struct Push {
  int peer = 0;
  int channel = 0;
  int64_t count = 0;
  ef::OpCode code = ef::OpCode::kSend;
  bool from_input = false;
};

std::vector<Push> pushes(const ef::Program& p, int rank) {
  std::vector<Push> out;
  for (const auto& tb : p.ranks[static_cast<std::size_t>(rank)].threadblocks) {
    for (const auto& op : tb.ops) {
      if (!ef::op_sends(op.code)) continue;
      const bool from_input =
          op.code == ef::OpCode::kSend && op.src && op.src->buffer == ef::BufferKind::kInput;
      out.push_back({tb.send_peer, tb.channel, op.count, op.code, from_input});
    }
  }
  return out;
}

ef::Program generate(const std::string& name, int ranks, int nodes = 1, int channels = 1,
                     int root = 0) {
  AlgorithmParams p;
  p.ranks = ranks;
  p.nodes = nodes;
  p.channels = channels;
  p.root = root;
  auto prog = generate_algorithm(name, p);
  EXPECT_TRUE(prog) << name << ": " << prog.status().message();
  return prog ? *prog : ef::Program{};
}

TEST(AllpairsAllgather, OneStepOneConnectionPerPeerAndLane) {
  const int n = 5, ch = 3;
  const auto p = generate("allpairs_allgather", n, 1, ch);
  for (int r = 0; r < n; ++r) {
    std::map<std::pair<int, int>, int> per_connection;
    for (const Push& s : pushes(p, r)) {
      EXPECT_EQ(s.code, ef::OpCode::kSend) << "no forwarding: every block moves once";
      ++per_connection[{s.peer, s.channel}];
    }
    EXPECT_EQ(per_connection.size(), static_cast<std::size_t>((n - 1) * ch)) << "rank " << r;
    for (const auto& [key, ops] : per_connection) EXPECT_EQ(ops, 1);
  }
}

TEST(TwoStepAllToAll, OneAggregatedTransferPerNodePairAndLocalIndex) {
  for (auto [nodes, gpus, ch] :
       std::vector<std::tuple<int, int, int>>{{2, 4, 1}, {4, 2, 2}, {3, 3, 1}}) {
    const auto p = generate("two_step_alltoall", nodes * gpus, nodes, ch);
    for (int r = 0; r < nodes * gpus; ++r) {
      int cross = 0;
      for (const Push& s : pushes(p, r)) {
        if (s.peer / gpus == r / gpus) {
          EXPECT_EQ(s.count, 1) << "a block inside the node, one chunk per channel";
          continue;
        }
        ++cross;
        EXPECT_EQ(s.peer % gpus, r % gpus) << "cross-node traffic keeps the local index";
        EXPECT_EQ(s.count, gpus) << "the blocks of the whole node, aggregated";
      }
      EXPECT_EQ(cross, (nodes - 1) * ch) << "rank " << r;  // ch pieces per remote node
    }
  }
  // The direct alltoall sends gpus times more, gpus times smaller, cross-node messages.
  const auto direct = generate("direct_alltoall", 8);
  int cross = 0;
  for (const Push& s : pushes(direct, 0)) cross += s.peer / 4 != 0;
  EXPECT_EQ(cross, 4);
}

TEST(TwoStepAllToAll, OneNodeIsTheDirectAllToAll) {
  const auto two_step = generate("two_step_alltoall", 4, 1, 2);
  const auto direct = generate("direct_alltoall", 4, 1, 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(pushes(two_step, r).size(), pushes(direct, r).size());
    EXPECT_EQ(two_step.ranks[static_cast<std::size_t>(r)].scratch_chunks, 0);
  }
}

TEST(HierarchicalAllReduce, CrossNodeTrafficIsOneShardPerLocalIndex) {
  for (auto [nodes, gpus] : std::vector<std::pair<int, int>>{{2, 4}, {4, 2}, {3, 3}}) {
    const auto p = generate("hierarchical_allreduce", nodes * gpus, nodes);
    EXPECT_EQ(p.nchunksperloop, nodes * gpus);
    for (int r = 0; r < nodes * gpus; ++r) {
      int64_t cross_chunks = 0;
      std::set<int> intra_peers;
      for (const Push& s : pushes(p, r)) {
        if (s.peer / gpus == r / gpus) {
          intra_peers.insert(s.peer);
          continue;
        }
        EXPECT_EQ(s.peer % gpus, r % gpus) << "cross-node rings join GPUs of one local index";
        cross_chunks += s.count;
      }
      // A ring reduce-scatter and a ring allgather over the nodes, of one shard (nodes
      // chunks): 2 (nodes - 1) chunks of the gpus x nodes leave the node.
      EXPECT_EQ(cross_chunks, 2 * (nodes - 1)) << "rank " << r;
      EXPECT_EQ(intra_peers, (std::set<int>{(r / gpus) * gpus + (r % gpus + 1) % gpus}))
          << "inside the node: a ring";
    }
  }
}

TEST(MultilaneAllReduce, EachLaneOnItsOwnChannel) {
  const int nodes = 2, gpus = 4, lanes = 3;
  const auto p = generate("multilane_allreduce", nodes * gpus, nodes, lanes);
  EXPECT_EQ(p.nchannels, lanes);
  EXPECT_EQ(p.nchunksperloop, lanes * gpus * nodes);
  const int64_t lane_chunks = int64_t{gpus} * nodes;
  for (int r = 0; r < nodes * gpus; ++r) {
    std::set<int> intra_peers;
    for (const auto& tb : p.ranks[static_cast<std::size_t>(r)].threadblocks) {
      if (tb.send_peer >= 0 && tb.send_peer / gpus == r / gpus) intra_peers.insert(tb.send_peer);
      if (tb.send_peer >= 0 && tb.send_peer / gpus != r / gpus) {
        EXPECT_EQ(tb.send_peer % gpus, r % gpus);
      }
      for (const auto& op : tb.ops) {
        for (const auto& ref : {op.src, op.dst}) {
          if (ref && ref->buffer != ef::BufferKind::kScratch) {
            EXPECT_EQ(ref->offset / lane_chunks, tb.channel) << "rank " << r << ": lane != channel";
          }
        }
      }
    }
    EXPECT_EQ(intra_peers.size(), static_cast<std::size_t>(gpus - 1))
        << "node-local phases are one hop to every GPU of the node";
  }
}

TEST(AllToNext, CrossesNodeBoundariesOnEveryGpuPair) {
  const int nodes = 3, gpus = 4;
  const auto p = generate("alltonext", nodes * gpus, nodes);
  EXPECT_EQ(p.collective, ef::Collective::kCustom);
  EXPECT_EQ(p.postconditions.size(), static_cast<std::size_t>((nodes * gpus - 1) * gpus));
  for (const Push& s : pushes(p, nodes * gpus - 1)) {
    EXPECT_FALSE(s.from_input) << "the last rank sends nothing of its own (it only relays)";
  }
  for (int n = 0; n + 1 < nodes; ++n) {
    // Every GPU of node n sends one part (one chunk of gpus) to its peer on node n+1.
    for (int g = 0; g < gpus; ++g) {
      int64_t chunks = 0;
      for (const Push& s : pushes(p, n * gpus + g)) {
        if (s.peer / gpus == n + 1) {
          EXPECT_EQ(s.peer % gpus, g);
          chunks += s.count;
        }
      }
      EXPECT_EQ(chunks, 1) << "node " << n << " gpu " << g;
    }
  }
  // Inside a node the buffer goes directly, in one op.
  int own = 0;
  for (const Push& s : pushes(p, 0)) {
    if (!s.from_input) continue;
    ++own;
    EXPECT_EQ(s.peer, 1);
    EXPECT_EQ(s.count, gpus);
  }
  EXPECT_EQ(own, 1);
}

TEST(DirectGatherScatter, RootTalksToEveryRankOnEveryChannel) {
  const int n = 5, ch = 2, root = 3;
  const auto gather = generate("direct_gather", n, 1, ch, root);
  const auto scatter = generate("direct_scatter", n, 1, ch, root);
  EXPECT_EQ(gather.root, root);
  EXPECT_EQ(scatter.root, root);
  EXPECT_TRUE(pushes(gather, root).empty());
  for (int r = 0; r < n; ++r) {
    if (r == root) continue;
    std::set<int> channels;
    for (const Push& s : pushes(gather, r)) {
      EXPECT_EQ(s.peer, root);
      channels.insert(s.channel);
    }
    EXPECT_EQ(channels, (std::set<int>{0, 1}));
    EXPECT_TRUE(pushes(scatter, r).empty());
  }
  EXPECT_EQ(pushes(scatter, root).size(), static_cast<std::size_t>((n - 1) * ch));
}

TEST(SendRecv, RankZeroToRankOneOnEveryChannel) {
  const auto p = generate("send_recv", 2, 1, 4);
  EXPECT_EQ(p.collective, ef::Collective::kCustom);
  EXPECT_EQ(p.nchannels, 4);
  std::set<int> channels;
  for (const Push& s : pushes(p, 0)) {
    EXPECT_EQ(s.peer, 1);
    channels.insert(s.channel);
  }
  EXPECT_EQ(channels, (std::set<int>{0, 1, 2, 3}));
  EXPECT_TRUE(pushes(p, 1).empty());
  ASSERT_EQ(p.postconditions.size(), 4u);
  for (const auto& pc : p.postconditions) {
    EXPECT_EQ(pc.rank, 1);
    ASSERT_EQ(pc.sources.size(), 1u);
    EXPECT_EQ(pc.sources[0].rank, 0);
    EXPECT_EQ(pc.sources[0].index, pc.index);
  }
}

}  // namespace
}  // namespace efccl::algorithms
