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
  std::vector<RankPlacement> ranks = {{7, "0000:2c:00.0"}, {3, "0000:1B:00.0"},
                                      {7, "0000:1b:00.0"}, {3, "0000:99:00.0"}};
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
