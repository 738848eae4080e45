// NCCL's topology XML as a graph (efccl/topology/nccl_xml.h): the four kinds of file in
// tests/topology/data (a full dump, a VM's flattened view, an NVLink mesh, PCI hints only),
// the defaults where a file is silent, and hostile input rejected with its line.
#include "efccl/topology/nccl_xml.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "efccl/topology/presets.h"

namespace {

using namespace efccl::topo;

std::string data_path(const std::string& name) {
  return std::string(EFCCL_SOURCE_DIR) + "/tests/topology/data/" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Topology load(const std::string& name) {
  auto t = load_nccl_xml(data_path(name));
  EXPECT_TRUE(t) << t.status().message();
  if (!t) return Topology{};
  EXPECT_TRUE(t->check()) << t->check().message();
  return std::move(*t);
}

/// The PCIe switch or CPU a device hangs under (its one PCIe neighbour that is no device).
NodeIndex pcie_parent(const Topology& t, NodeIndex device) {
  for (LinkIndex l : t.out_links(device)) {
    const Link& link = t.link(l);
    const NodeKind k = t.node(link.to).kind;
    if (link.kind == LinkKind::kPcie && (k == NodeKind::kPcieSwitch || k == NodeKind::kCpu))
      return link.to;
  }
  ADD_FAILURE() << t.node(device).id << " has no PCIe parent";
  return device;
}

double pcie_up_gbps(const Topology& t, NodeIndex device) {
  for (LinkIndex l : t.out_links(device))
    if (t.link(l).to == pcie_parent(t, device)) return t.link(l).gbps;
  return 0;
}

void expect_round_trip(const Topology& t) {
  auto back = from_json(to_json(t), "round trip");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->hash(), t.hash());
}

/// Parses `text` as "bad.xml" and expects an error on `line` that mentions `what`.
void expect_rejected(const std::string& text, int line, const std::string& what) {
  auto t = from_nccl_xml(text, "bad.xml");
  ASSERT_FALSE(t) << "accepted; wanted an error on line " << line << " about " << what;
  const std::string& m = t.status().message();
  EXPECT_NE(m.find("bad.xml:" + std::to_string(line) + ":"), std::string::npos) << m;
  EXPECT_NE(m.find(what), std::string::npos) << m;
}

constexpr const char* kHead = "<system version=\"1\">\n  <cpu numaid=\"0\" arch=\"x86_64\">\n";
constexpr const char* kTail = "  </cpu>\n</system>\n";

/// One GPU at 0000:1b:00.0 (line 3 ... 7 of the result) with `gpu_children` inside <gpu>.
std::string one_gpu(const std::string& gpu_children, const std::string& more_pci = "") {
  return std::string(kHead) +
         "    <pci busid=\"0000:1b:00.0\" class=\"0x030200\" link_speed=\"32.0 GT/s PCIe\" "
         "link_width=\"16\">\n"
         "      <gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\">\n" +
         gpu_children + "      </gpu>\n    </pci>\n" + more_pci + kTail;
}

TEST(NcclXml, DgxH100DumpHasEightGpusEachWithItsOwnRailNic) {
  const Topology t = load("dgx-h100-dump.xml");
  ASSERT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 8u);
  EXPECT_EQ(t.nodes_of(NodeKind::kNvSwitch).size(), 1u);  // the collapsed fabric: one node
  EXPECT_EQ(t.nodes_of(NodeKind::kCpu).size(), 2u);
  EXPECT_EQ(t.nodes_of(NodeKind::kHostMemory).size(), 2u);
  EXPECT_EQ(t.nodes_of(NodeKind::kPcieSwitch).size(), 8u);
  const char* gpu_pci[] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                           "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  for (int i = 0; i < 8; ++i) {
    const NodeIndex g = t.gpus()[i];
    const Node& gpu = t.node(g);
    EXPECT_EQ(gpu.id, "h0.gpu" + std::to_string(i));
    EXPECT_EQ(gpu.device, i);  // socket 1 lists dev 5 before 4: ordinals follow <gpu dev>
    EXPECT_EQ(gpu.pci, gpu_pci[i]);
    EXPECT_EQ(gpu.sm, 90);
    EXPECT_EQ(gpu.numa, i < 4 ? 0 : 1);
    EXPECT_DOUBLE_EQ(t.nvlink_gbps(g), 450.0) << gpu.id;  // 18 NVLink4 x 25 GB/s
    EXPECT_NEAR(pcie_up_gbps(t, g), pcie_gbps(32, 16), 1e-9);
    auto nic = t.rail_nic(g);
    ASSERT_TRUE(nic) << gpu.id;
    EXPECT_EQ(t.node(*nic).name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(pcie_parent(t, *nic), pcie_parent(t, g)) << "under the GPU's PCIe switch";
    EXPECT_DOUBLE_EQ(t.node(*nic).gbps, 50.0);  // NDR400: 400000 Mb/s
    EXPECT_EQ(t.node(*nic).device, i);
    EXPECT_EQ(t.node(*nic).rail, i);
    EXPECT_EQ(t.node(*nic).numa, i < 4 ? 0 : 1);
  }
  EXPECT_TRUE(t.nvlink_peers(t.gpus()[0], t.gpus()[7]));
  auto p = t.route(t.gpus()[0], t.gpus()[5]);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->links.size(), 2u);  // GPU -> NVSwitch -> GPU
  EXPECT_DOUBLE_EQ(p->gbps, 450.0);
  expect_round_trip(t);
}

TEST(NcclXml, NvlinkMeshJoinsEveryPairWithSixLinks) {
  const Topology t = load("nvlink-mesh-4gpu.xml");
  ASSERT_EQ(t.gpus().size(), 4u);
  ASSERT_EQ(t.nics().size(), 2u);
  EXPECT_TRUE(t.nodes_of(NodeKind::kNvSwitch).empty());
  for (NodeIndex a : t.gpus()) {
    EXPECT_DOUBLE_EQ(t.nvlink_gbps(a), 450.0);  // 3 peers x 6 x 25 GB/s
    for (NodeIndex b : t.gpus()) {
      if (a == b) continue;
      auto p = t.route(a, b);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->links.size(), 1u);
      EXPECT_DOUBLE_EQ(p->gbps, 150.0);
      EXPECT_EQ(t.link(p->links[0]).lanes, 6);
    }
  }
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(t.node(*t.rail_nic(t.gpus()[i])).name, i < 2 ? "mlx5_0" : "mlx5_1");
  expect_round_trip(t);
}

TEST(NcclXml, FlattenedVmViewReadsDefaultsAndListsTheSocketNicOnce) {
  const Topology t = load("vm-flat-a100.xml");
  ASSERT_EQ(t.gpus().size(), 4u);
  ASSERT_EQ(t.nics().size(), 5u);  // mlx5_0 ... 3 and eth0, listed under both CPUs
  EXPECT_TRUE(t.nodes_of(NodeKind::kPcieSwitch).empty());
  for (int i = 0; i < 4; ++i) {
    const NodeIndex g = t.gpus()[i];
    EXPECT_EQ(t.node(g).numa, i < 2 ? 0 : 1);
    EXPECT_EQ(t.node(g).device, i);
    EXPECT_EQ(t.node(pcie_parent(t, g)).kind, NodeKind::kCpu);
    EXPECT_DOUBLE_EQ(t.nvlink_gbps(g), 300.0);  // 12 NVLink3 x 25 GB/s
    // All NICs of the NUMA node are as close: the lowest index wins.
    EXPECT_EQ(t.node(*t.rail_nic(g)).name, i < 2 ? "mlx5_0" : "mlx5_2");
  }
  // "16 GT/s" (older kernels) reads as "16.0 GT/s PCIe"; link_width 0 as x16.
  EXPECT_NEAR(pcie_up_gbps(t, t.gpus()[0]), pcie_gbps(16, 16), 1e-9);
  EXPECT_NEAR(pcie_up_gbps(t, t.gpus()[1]), pcie_gbps(16, 16), 1e-9);
  // link_speed "Unknown": Gen3, as NCCL.
  EXPECT_NEAR(pcie_up_gbps(t, t.gpus()[3]), pcie_gbps(8, 16), 1e-9);
  const auto nics = t.nics();
  EXPECT_DOUBLE_EQ(t.node(nics[0]).gbps, 25.0);  // 200000 Mb/s
  // mlx5_1 gives no speed: its PCIe link bounds it.
  EXPECT_EQ(t.node(nics[1]).name, "mlx5_1");
  EXPECT_NEAR(t.node(nics[1]).gbps, pcie_gbps(16, 16), 1e-9);
  const Node& eth0 = t.node(nics[4]);
  EXPECT_EQ(eth0.name, "eth0");
  EXPECT_EQ(eth0.device, 4);
  EXPECT_EQ(eth0.numa, 0);  // the first listing wins
  EXPECT_DOUBLE_EQ(eth0.gbps, 25000 / 8000.0);
  // Two NUMA nodes: joined, each with its memory.
  const auto cpus = t.nodes_of(NodeKind::kCpu);
  ASSERT_EQ(cpus.size(), 2u);
  auto smp = t.route(cpus[0], cpus[1]);
  ASSERT_TRUE(smp);
  EXPECT_EQ(t.link(smp->links[0]).kind, LinkKind::kSmp);
  EXPECT_TRUE(t.memory_of(cpus[1]));
  expect_round_trip(t);
}

TEST(NcclXml, PciHintsGiveGpusInBusOrderAndNicsAtTheirPcieSpeed) {
  const Topology t = load("azure-hints.xml");
  ASSERT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 8u);
  EXPECT_EQ(t.nodes_of(NodeKind::kPcieSwitch).size(), 4u);
  for (int i = 0; i < 8; ++i) {
    const NodeIndex g = t.gpus()[i];
    EXPECT_EQ(t.node(g).pci, "000" + std::to_string(i + 1) + ":00:00.0");
    EXPECT_EQ(t.node(g).device, i);
    EXPECT_EQ(t.node(g).sm, 0);  // unknown: a hint says no more than the class
    EXPECT_EQ(t.node(g).numa, i < 4 ? 0 : 1);
    EXPECT_DOUBLE_EQ(t.nvlink_gbps(g), 0.0);
    const NodeIndex nic = t.nics()[i];
    EXPECT_EQ(t.node(nic).pci, "010" + std::to_string(i + 1) + ":00:00.0");
    EXPECT_NEAR(t.node(nic).gbps, pcie_gbps(16, 16), 1e-9);
    auto rail = t.rail_nic(g);
    ASSERT_TRUE(rail);
    EXPECT_EQ(pcie_parent(t, *rail), pcie_parent(t, g)) << t.node(g).id;
  }
  EXPECT_EQ(t.node(pcie_parent(t, t.gpus()[0])).pci, "ffffffff:ff:02.0");
  expect_round_trip(t);
}

TEST(NcclXml, ListedNvswitchesAndUnlistedOnesAreTheOneFabric) {
  const std::string more =
      "    <pci busid=\"0000:07:00.0\" class=\"0x068000\" link_speed=\"8.0 GT/s PCIe\" "
      "link_width=\"1\"/>\n";
  auto t = from_nccl_xml(
      one_gpu("        <nvlink target=\"0000:07:00.0\" count=\"2\" tclass=\"0x068000\"/>\n"
              "        <nvlink target=\"0000:08:00.0\" count=\"2\" tclass=\"0x068000\"/>\n"
              "        <nvlink target=\"0000:07:00.0\" count=\"2\" tclass=\"0x068000\"/>\n",
              more),
      "nvs.xml");
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->nodes_of(NodeKind::kNvSwitch).size(), 1u);
  EXPECT_DOUBLE_EQ(t->nvlink_gbps(t->gpus()[0]), 150.0);  // 6 NVLink4 links
  EXPECT_TRUE(t->check());
}

TEST(NcclXml, C2cJoinsTheGpuToItsCpu) {
  auto t = from_nccl_xml(one_gpu("        <c2c bw=\"45000\" count=\"10\"/>\n"), "gh200.xml");
  ASSERT_TRUE(t) << t.status().message();
  const NodeIndex g = t->gpus()[0];
  bool found = false;
  for (LinkIndex l : t->out_links(g))
    if (t->link(l).kind == LinkKind::kC2c) {
      found = true;
      EXPECT_DOUBLE_EQ(t->link(l).gbps, 450.0);  // 10 links x 45000 MB/s
      EXPECT_EQ(t->node(t->link(l).to).kind, NodeKind::kCpu);
    }
  EXPECT_TRUE(found);
}

TEST(NcclXml, RejectsHostileInputNamingTheLine) {
  const std::string dump = read_text(data_path("dgx-h100-dump.xml"));
  ASSERT_FALSE(dump.empty());
  {  // truncated in the middle of an element
    const std::string cut = dump.substr(0, dump.size() / 2);
    const int lines = 1 + static_cast<int>(std::count(cut.begin(), cut.end(), '\n'));
    auto t = from_nccl_xml(cut, "bad.xml");
    ASSERT_FALSE(t);
    EXPECT_TRUE(std::regex_search(t.status().message(), std::regex("^bad\\.xml:[0-9]+: ")))
        << t.status().message();
    EXPECT_NE(t.status().message().find(":" + std::to_string(lines) + ":"), std::string::npos)
        << t.status().message();
  }
  expect_rejected(
      "<?xml version=\"1.0\"?>\n<!DOCTYPE system [<!ENTITY a \"aaaaaaaa\">]>\n"
      "<system version=\"1\"/>\n",
      2, "DOCTYPE");
  expect_rejected(std::string(kHead) + "    <pci busid=\"&a;\" class=\"0x030200\"/>\n" + kTail, 3,
                  "&a;");
  expect_rejected(std::string(kHead) + "    <pci class=\"0x030200\" link_width=\"16\"/>\n" + kTail,
                  3, "no attribute 'busid'");
  expect_rejected(
      std::string(kHead) + "    <pci busid=\"0000:zz:00.0\" class=\"0x030200\"/>\n" + kTail, 3,
      "not a PCI bus id");
  expect_rejected(std::string(kHead) + "    <pci busid=\"0000:1b:00.0\" class=\"GPU\"/>\n" + kTail,
                  3, "not a PCI class");
  expect_rejected(one_gpu("        <nvlink target=\"fffffff:ff:ff.0\" count=\"eighteen\" "
                          "tclass=\"0x068000\"/>\n"),
                  5, "count=\"eighteen\" is not a decimal integer");
  expect_rejected(one_gpu("        <nvlink target=\"fffffff:ff:ff.0\" count=\"0\" "
                          "tclass=\"0x068000\"/>\n"),
                  5, "count=0 is outside");
  expect_rejected(one_gpu("        <nvlink target=\"0000:99:00.0\" count=\"6\" "
                          "tclass=\"0x030200\"/>\n"),
                  5, "\"0000:99:00.0\" is no GPU of this file");
  expect_rejected(one_gpu("        <nvlink target=\"0000:1b:00.0\" count=\"6\" "
                          "tclass=\"0x030200\"/>\n"),
                  5, "to itself");
  expect_rejected(one_gpu("        <nvlink target=\"0000:07:00.0\" count=\"6\" "
                          "tclass=\"0x012345\"/>\n"),
                  5, "tclass");
  expect_rejected(std::string(kHead) +
                      "    <pci busid=\"0000:18:00.0\" class=\"0x020700\">\n      <nic>\n"
                      "        <net name=\"mlx5_0\" dev=\"0\" speed=\"400G\"/>\n"
                      "      </nic>\n    </pci>\n" +
                      kTail,
                  5, "speed=\"400G\"");
  expect_rejected(std::string(kHead) +
                      "    <pci busid=\"0000:18:00.0\" class=\"0x020700\">\n      <nic>\n"
                      "        <net name=\"mlx5\xb5\" dev=\"0\" speed=\"400000\"/>\n"
                      "      </nic>\n    </pci>\n" +
                      kTail,
                  5, "is not a device name");
  expect_rejected(std::string(kHead) + "    <pci busid=\"0000:1b:00.0\" class=\"0x030200\"/>\n" +
                      "    <pci busid=\"0000:1B:00.0\" class=\"0x030200\"/>\n" + kTail,
                  4, "first on line 3");
  expect_rejected("<system version=\"1\">\n  <cpu arch=\"x86_64\"/>\n</system>\n", 2,
                  "no attribute 'numaid'");
  expect_rejected("<topology/>\n", 1, "<system>");
  {  // nesting deeper than the reader allows
    std::string deep = kHead;
    for (int i = 0; i < 40; ++i)
      deep += "<pci busid=\"0000:" + std::to_string(10 + i) + ":00.0\" class=\"0x060400\">\n";
    for (int i = 0; i < 40; ++i) deep += "</pci>\n";
    deep += kTail;
    auto t = from_nccl_xml(deep, "bad.xml");
    ASSERT_FALSE(t);
    EXPECT_TRUE(std::regex_search(t.status().message(), std::regex("^bad\\.xml:3[0-9]: .*deeper")))
        << t.status().message();
  }
  {  // one attribute value beyond the reader's limit
    const std::string affinity(100000, 'f');
    expect_rejected(
        "<system version=\"1\">\n  <cpu numaid=\"0\" affinity=\"" + affinity + "\"/>\n</system>\n",
        2, "affinity");
  }
}

TEST(NcclXml, AMillionElementsFailFastAndCleanly) {
  std::string text = "<system version=\"1\">\n";
  text.reserve(6u << 20);
  for (int i = 0; i < 1000000; ++i) text += "<x/>\n";
  text += "</system>\n";
  const auto start = std::chrono::steady_clock::now();
  auto t = from_nccl_xml(text, "bad.xml");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(t);
  EXPECT_TRUE(std::regex_search(t.status().message(), std::regex("^bad\\.xml:[0-9]+: ")))
      << t.status().message();
  EXPECT_LT(seconds, 10.0);
}

TEST(NcclXml, MoreDevicesThanTheGraphHoldsAreRejectedAtTheirLine) {
  std::string text = kHead;
  for (int i = 0; i < 70000; ++i) {
    char bus[32];
    std::snprintf(bus, sizeof bus, "%04x:%02x:00.0", i >> 8, i & 0xff);
    text += std::string("<pci busid=\"") + bus + "\" class=\"0x030200\"/>\n";
  }
  text += kTail;
  const auto start = std::chrono::steady_clock::now();
  auto t = from_nccl_xml(text, "bad.xml");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(t);
  // Two nodes for the CPU and its memory, one reserved for an NVSwitch: GPU 65533 is too many.
  EXPECT_NE(t.status().message().find("bad.xml:" + std::to_string(3 + 65533) + ":"),
            std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("more than 65536 nodes"), std::string::npos);
  EXPECT_LT(seconds, 10.0);
}

TEST(NcclXml, LoadNamesTheFileAndRefusesMoreThan16MiB) {
  auto missing = load_nccl_xml("/nonexistent/topo.xml");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("/nonexistent/topo.xml"), std::string::npos);
  const std::string big = ::testing::TempDir() + "/efccl-nccl-xml-big.xml";
  {
    std::ofstream out(big, std::ios::binary);
    const std::string mib(1u << 20, ' ');
    out << "<system version=\"1\">";
    for (int i = 0; i < 16; ++i) out << mib;
    out << "</system>";
  }
  auto t = load_nccl_xml(big);
  std::remove(big.c_str());
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find(big), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("16 MiB"), std::string::npos) << t.status().message();
  // The same text given directly: the reader's byte limit, with the line.
  std::string text = "<system version=\"1\">";
  text.append(16u << 20, ' ');
  text += "</system>";
  auto direct = from_nccl_xml(text, "bad.xml");
  ASSERT_FALSE(direct);
  EXPECT_TRUE(std::regex_search(direct.status().message(), std::regex("^bad\\.xml:1: ")))
      << direct.status().message();
}

}  // namespace
