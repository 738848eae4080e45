// The graph (efccl/topology/topology.h) and the presets (presets.h): counts, capacities, rail
// NICs, routes and walks, the JSON form and its hash.
#include "efccl/topology/topology.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "efccl/topology/presets.h"

namespace {

using namespace efccl::topo;

Topology must(efccl::StatusOr<Topology> t) {
  EXPECT_TRUE(t) << t.status().message();
  return t ? std::move(*t) : Topology{};
}

std::string ids(const Topology& t, const Path& p) {
  std::string s = t.node(t.link(p.links.front()).from).id;
  for (LinkIndex l : p.links) s += " > " + t.node(t.link(l).to).id;
  return s;
}

TEST(Presets, DgxH100HasEightGpusEachWithItsOwnRailNic) {
  const Topology t = must(preset("dgx-h100"));
  ASSERT_TRUE(t.check()) << t.check().message();
  EXPECT_EQ(t.hosts(), 1);
  ASSERT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 8u);
  std::set<NodeIndex> rails;
  for (NodeIndex g : t.gpus()) {
    EXPECT_DOUBLE_EQ(t.nvlink_gbps(g), 450.0) << t.node(g).id;  // 18 NVLink4 x 25 GB/s
    auto nic = t.rail_nic(g);
    ASSERT_TRUE(nic) << t.node(g).id;
    EXPECT_EQ(t.node(*nic).index, t.node(g).index) << "the NIC under the GPU's PCIe switch";
    EXPECT_DOUBLE_EQ(t.node(*nic).gbps, 50.0);  // NDR400
    rails.insert(*nic);
  }
  EXPECT_EQ(rails.size(), 8u);
  EXPECT_TRUE(t.nvlink_peers(t.gpus()[0], t.gpus()[7]));
  EXPECT_EQ(t.node(t.gpus()[5]).numa, 1);
}

TEST(Presets, NimbleH100IsAFullNvlinkMeshOfFour) {
  const Topology t = must(preset("nimble-h100"));
  ASSERT_EQ(t.gpus().size(), 4u);
  ASSERT_EQ(t.nics().size(), 4u);
  const auto g = t.gpus();
  for (NodeIndex a : g)
    for (NodeIndex b : g) {
      if (a == b) continue;
      EXPECT_TRUE(t.nvlink_peers(a, b));
      auto p = t.route(a, b);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->links.size(), 1u) << ids(t, *p);
      EXPECT_DOUBLE_EQ(p->gbps, 150.0);  // 6 NVLink4 links per pair
    }
  // NIMBLE's paths for 0 -> 1: direct, through gpu2, through gpu3, through host memory.
  const auto walks = t.gpu_walks(g[0], g[1]);
  ASSERT_EQ(walks.size(), 4u);
  EXPECT_FALSE(walks[0].relay);
  EXPECT_EQ(walks[1].relay, g[2]);
  EXPECT_EQ(walks[2].relay, g[3]);
  EXPECT_TRUE(walks[3].host_staged);
  EXPECT_EQ(ids(t, walks[1]), "h0.gpu0 > h0.gpu2 > h0.gpu1");
  EXPECT_EQ(ids(t, walks[3]), "h0.gpu0 > h0.pcisw0 > h0.cpu0 > h0.mem0 > h0.cpu0 > h0.pcisw1 > h0.gpu1");
  EXPECT_NEAR(walks[3].gbps, pcie_gbps(32, 16), 1e-9);
}

TEST(Presets, H200Nv18X2CarriesTheMeasuredNumbers) {
  const Topology t = must(preset("h200-nv18-x2"));
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_TRUE(t.nics().empty());
  const auto g = t.gpus();
  auto p = t.route(g[0], g[1]);
  ASSERT_TRUE(p);
  EXPECT_DOUBLE_EQ(p->gbps, 395.0);
  auto h = t.host_route(g[0], g[1]);
  ASSERT_TRUE(h);
  EXPECT_DOUBLE_EQ(h->gbps, 55.0);
  EXPECT_EQ(ids(t, *h), "h0.gpu0 > h0.cpu0 > h0.mem0 > h0.cpu0 > h0.gpu1");
}

TEST(Presets, NodesMakeAClusterJoinedByRails) {
  const Topology t = must(preset("dgx-h100", 2));
  ASSERT_TRUE(t.check()) << t.check().message();
  EXPECT_EQ(t.hosts(), 2);
  ASSERT_EQ(t.gpus().size(), 16u);
  EXPECT_EQ(t.nodes_of(NodeKind::kRailSwitch).size(), 8u);
  EXPECT_EQ(t.node(t.gpus()[9]).id, "h1.gpu1");
  EXPECT_FALSE(t.nvlink_peers(t.gpus()[0], t.gpus()[8]));
  // GPU 0 of host 0 to GPU 0 of host 1: over rail 0.
  auto p = t.route(t.gpus()[0], t.gpus()[8]);
  ASSERT_TRUE(p);
  EXPECT_EQ(ids(t, *p), "h0.gpu0 > h0.pcisw0 > h0.nic0 > rail0 > h1.nic0 > h1.pcisw0 > h1.gpu0");
  EXPECT_DOUBLE_EQ(p->gbps, 50.0);
  EXPECT_TRUE(t.gpu_walks(t.gpus()[0], t.gpus()[8]).empty()) << "walks stay within a host";
}

TEST(Presets, UnknownNamesAndBadNodeCountsAreErrors) {
  auto bad = preset("dgx-a100");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("known: nimble-h100"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(preset("dgx-h100", 0));
  EXPECT_FALSE(preset("dgx-h100", kMaxHosts + 1));
}

TEST(Rates, NvlinkAndPcie) {
  EXPECT_DOUBLE_EQ(nvlink_lane_gbps(90), 25.0);
  EXPECT_DOUBLE_EQ(nvlink_lane_gbps(100), 50.0);
  EXPECT_DOUBLE_EQ(nvlink_lane_gbps(60), 20.0);
  EXPECT_DOUBLE_EQ(nvlink_lane_gbps(50), 0.0);
  EXPECT_NEAR(pcie_gbps(32, 16), 63.015, 1e-3);  // Gen5 x16
  EXPECT_NEAR(pcie_gbps(16, 16), 31.508, 1e-3);  // Gen4 x16
  EXPECT_NEAR(pcie_gbps(2.5, 16), 4.0, 1e-9);    // Gen1 x16, 8b/10b
}

TEST(Json, RoundTripKeepsTheGraphAndItsHash) {
  for (std::string_view name : preset_names()) {
    const Topology t = must(preset(name, 2));
    const std::string text = to_json(t);
    auto back = from_json(text, "round trip");
    ASSERT_TRUE(back) << name << ": " << back.status().message();
    EXPECT_EQ(to_json(*back), text) << name;
    EXPECT_EQ(back->hash(), t.hash()) << name;
  }
  EXPECT_NE(must(preset("dgx-h100")).hash(), must(preset("hgx-h200")).hash());
}

TEST(Json, TheDocumentedShape) {
  const Topology t = must(preset("dgx-h100"));
  const std::string text = to_json(t);
  for (const char* key : {"\"hosts\": 1", "\"id\": \"h0.gpu0\"", "\"rail\": \"h0.nic0\"",
                          "\"name\": \"mlx5_0\"", "\"gbps\": 50.0", "\"kind\": \"nvlink\"",
                          "\"gbps\": 450.0"})
    EXPECT_NE(text.find(key), std::string::npos) << key;
}

TEST(Json, BadInputIsNamed) {
  const auto error = [](std::string_view text) {
    auto t = from_json(text, "peer 3");
    EXPECT_FALSE(t) << text;
    return t ? std::string() : t.status().message();
  };
  EXPECT_EQ(error("{"), "peer 3: not valid JSON");
  EXPECT_EQ(error("[]"), "peer 3: not a JSON object");
  EXPECT_EQ(error(R"({"gpus": 1})"), "peer 3: \"gpus\" is not an array");
  const std::string base = R"({"gpus": [{"id": "g", "host": 0}], "nics": [], "nodes": [)";
  EXPECT_NE(error(base + R"({"id": "s", "host": 0, "kind": "toaster"}], "links": []})")
                .find("nodes[0]: unknown kind 'toaster'"),
            std::string::npos);
  EXPECT_NE(error(base + R"(], "links": [{"from": "g", "to": "x", "kind": "pcie", "gbps": 1}]})")
                .find("links[0]: no node 'x'"),
            std::string::npos);
  EXPECT_NE(error(base + R"({"id": "s", "host": 0, "kind": "cpu"}], "links": [{"from": "g",)"
                         R"( "to": "s", "kind": "pcie", "gbps": -1}]})")
                .find("\"gbps\" is not 0 or a number from 1e-6 to 1e7"),
            std::string::npos);
  EXPECT_NE(error(base + R"(], "links": []})").find("GPU 'g' has no link"), std::string::npos);
  EXPECT_NE(error(R"({"gpus": [{"id": "g", "host": 99999999}], "nics": [], "nodes": [], "links": []})")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(error(std::string(17u << 20, ' ')).find("more than"), std::string::npos);
  EXPECT_NE(error(R"({"gpus": [{"id": "g\u0001", "host": 0}], "nics": [], "nodes": [], "links": []})")
                .find("has a byte that is not printable ASCII"),
            std::string::npos);
  EXPECT_NE(error(R"({"gpus": [{"id": "g", "host": 18446744073709551615}], "nics": [], "nodes": [], "links": []})")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(error(base + R"({"id": "s", "host": 0, "kind": "cpu"}], "links": [{"from": "g",)"
                         R"( "to": "s", "kind": "pcie", "gbps": 1e300}]})")
                .find("is not 0 or a number from 1e-6 to 1e7"),
            std::string::npos);
}

TEST(Json, NamesThatAreNotUtf8NeverMakeItThrow) {
  Topology t = must(preset("h200-nv18-x2"));
  t.mutable_node(t.gpus()[0]).name = "H\xff\xfe";
  const std::string text = to_json(t);  // replaced, not thrown
  EXPECT_NE(text.find("\"name\": \"H"), std::string::npos);
  EXPECT_NE(t.hash(), 0u);
}

TEST(Merge, DuplicateIdsAndHostsAreRefused) {
  Topology t;
  Node a;
  a.id = "a";
  ASSERT_TRUE(t.add_node(a));
  auto again = t.add_node(a);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.status().message(), "node id 'a' is used twice");
  const Topology two = must(preset("dgx-h100", 2));
  std::vector<Topology> hosts{two};
  EXPECT_FALSE(merge_hosts(hosts)) << "a graph of two hosts is not one host";
}

}  // namespace
