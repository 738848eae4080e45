// A communicator's machine graph from its ranks' reports (efccl/topology/cluster.h).
#include "efccl/topology/cluster.h"

#include <gtest/gtest.h>

#include "efccl/topology/presets.h"

namespace {

using namespace efccl::topo;

std::string host_json(const char* preset_name) {
  auto t = preset(preset_name);
  EXPECT_TRUE(t) << t.status().message();
  return to_json(*t);
}

TEST(Cluster, BusIdsInNormalForm) {
  EXPECT_EQ(normal_bus_id("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normal_bus_id("00000000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normal_bus_id("1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(normal_bus_id("not a bus id"), "not a bus id");
}

/// Two hosts of a 2-GPU graph with bus ids; ranks placed on them out of host order.
TEST(Cluster, HostsInTheOrderOfTheirFirstRankAndRanksOnTheirGpus) {
  Topology h;
  Node cpu;
  cpu.kind = NodeKind::kCpu;
  cpu.id = "h0.cpu0";
  const NodeIndex c = *h.add_node(cpu);
  for (int i = 0; i < 2; ++i) {
    Node g;
    g.id = "h0.gpu" + std::to_string(i);
    g.index = i;
    g.pci = i == 0 ? "0000:1b:00.0" : "0000:2C:00.0";
    const NodeIndex gi = *h.add_node(g);
    ASSERT_TRUE(h.add_duplex(c, gi, LinkKind::kPcie, 30, 1));
  }
  const std::string json = to_json(h);
  std::vector<RankPlacement> ranks = {
      {7, "0000:2c:00.0"}, {3, "0000:1B:00.0"}, {7, "0000:1b:00.0"}, {3, "0000:99:00.0"}};
  auto c1 = assemble_cluster(ranks, {{3, json}, {7, json}});
  ASSERT_TRUE(c1) << c1.status().message();
  EXPECT_EQ(c1->topology.hosts(), 2);
  EXPECT_EQ(c1->rank_host, (std::vector<int32_t>{0, 1, 0, 1}));
  ASSERT_TRUE(c1->rank_gpu[0] && c1->rank_gpu[1] && c1->rank_gpu[2]);
  EXPECT_EQ(c1->topology.node(*c1->rank_gpu[0]).id, "h0.gpu1");
  EXPECT_EQ(c1->topology.node(*c1->rank_gpu[1]).id, "h1.gpu0");
  EXPECT_EQ(c1->topology.node(*c1->rank_gpu[2]).id, "h0.gpu0");
  EXPECT_FALSE(c1->rank_gpu[3]);
  ASSERT_EQ(c1->notes.size(), 1u);
  EXPECT_EQ(c1->notes[0], "rank 3: GPU 0000:99:00.0 is not in host 1's graph");
  // The same reports give the same graph, bit for bit.
  auto c2 = assemble_cluster(ranks, {{7, json}, {3, json}});
  ASSERT_TRUE(c2);
  EXPECT_EQ(c2->hash, c1->hash);
  EXPECT_EQ(to_json(c2->topology), to_json(c1->topology));
}

/// What init does for ranks on two hosts (two processes' host graphs, as NCCL_HOSTID makes them
/// on one machine): one graph of both hosts, each rank on its host's GPU, rail switches joining
/// the hosts' NICs of one index, every rank with a rail NIC and a route to the other host's GPUs
/// through its rail.
TEST(Cluster, TwoHostsOfOneGraphAreJoinedByRails) {
  auto one = preset("dgx-h100", 1);
  ASSERT_TRUE(one) << one.status().message();
  const std::vector<NodeIndex> gpus = one->gpus();
  ASSERT_GE(gpus.size(), 2u);
  for (std::size_t g = 0; g < gpus.size(); ++g)  // detection gives GPUs their bus ids
    one->mutable_node(gpus[g]).pci = "0000:" + std::to_string(10 + g) + ":00.0";
  const std::string json = to_json(*one);
  std::vector<RankPlacement> ranks;
  for (uint64_t host : {11u, 22u})
    for (std::size_t g = 0; g < 2; ++g) ranks.push_back({host, one->node(gpus[g]).pci});
  auto c = assemble_cluster(ranks, {{11, json}, {22, json}});
  ASSERT_TRUE(c) << c.status().message();
  const Topology& t = c->topology;
  EXPECT_EQ(t.hosts(), 2);
  EXPECT_EQ(c->rank_host, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(t.nodes_of(NodeKind::kRailSwitch).size(), one->nics().size());
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_TRUE(c->rank_gpu[r]) << "rank " << r;
    const auto rail = t.rail_nic(*c->rank_gpu[r]);
    ASSERT_TRUE(rail) << "rank " << r << " has no rail NIC";
    EXPECT_EQ(t.node(*rail).host, c->rank_host[r]);
  }
  const auto across = t.route(*c->rank_gpu[0], *c->rank_gpu[2]);
  ASSERT_TRUE(across);
  bool through_rail = false;
  for (LinkIndex l : across->links)
    through_rail |= t.node(t.link(l).to).kind == NodeKind::kRailSwitch;
  EXPECT_TRUE(through_rail);
}

TEST(Cluster, MissingOrBadHostGraphsNameTheRank) {
  const std::vector<RankPlacement> ranks = {{1, ""}, {2, ""}};
  auto missing = assemble_cluster(ranks, {{1, host_json("h200-nv18-x2")}});
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.status().message(), "rank 1's host sent no machine graph");
  auto bad = assemble_cluster(ranks, {{1, "{"}, {2, "{}"}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.status().message(), "the machine graph of rank 0's host: not valid JSON");
  auto two_hosts = preset("h200-nv18-x2", 2);
  ASSERT_TRUE(two_hosts);
  auto spans = assemble_cluster({{1, ""}}, {{1, to_json(*two_hosts)}});
  ASSERT_FALSE(spans);
  EXPECT_NE(spans.status().message().find("spans 2 hosts"), std::string::npos);
}

}  // namespace
