// Detection (efccl/topology/detect.h) on fake sysfs trees built in a temporary directory, with a
// fake NVLink source standing in for NVML; NCCL_TOPO_FILE's overlay on a hand-built file graph;
// and one run on this machine's own /sys.
#include "efccl/topology/detect.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "efccl/topology/presets.h"
#include "host_detection.h"
#include "sysfs_pci.h"

namespace {

using namespace efccl::topo;
namespace fs = std::filesystem;

/// A sysfs tree of our own, removed at the end of the test.
class FakeSysfs {
 public:
  FakeSysfs() {
    std::string pattern = (fs::temp_directory_path() / "efccl-detect-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    root_ = pattern;
  }
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  const fs::path& root() const { return root_; }

  void write(const fs::path& relative, const std::string& text) const {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text << "\n";
  }
  /// A symlink at `relative` pointing at `target` (relative to the link's directory, as sysfs).
  void link(const fs::path& relative, const fs::path& target) const {
    fs::create_directories((root_ / relative).parent_path());
    fs::create_directory_symlink(target, root_ / relative);
  }
  void numa(int node, const std::string& cpulist) const {
    write("devices/system/node/node" + std::to_string(node) + "/cpulist", cpulist);
  }

  /// A PCI function at devices/<host bridge>/<chain...>/<id>, listed in bus/pci/devices.
  /// `attrs`: file name -> content ("class", "vendor", "numa_node", "max_link_speed", ...).
  fs::path pci(const std::string& host_bridge, const std::vector<std::string>& chain,
               const std::map<std::string, std::string>& attrs) const {
    fs::path dir = fs::path("devices") / host_bridge;
    for (const std::string& c : chain) dir /= c;
    fs::create_directories(root_ / dir);
    for (const auto& [name, text] : attrs) write(dir / name, text);
    std::error_code ec;
    link("bus/pci/devices/" + chain.back(), fs::path("../../..") / dir);
    return dir;
  }
  /// A PCIe bridge (root port or switch port) at the end of `chain`.
  void bridge(const std::string& host_bridge, const std::vector<std::string>& chain,
              const std::string& speed, int width) const {
    pci(host_bridge, chain,
        {{"class", "0x060400"},
         {"vendor", "0x1000"},
         {"max_link_speed", speed},
         {"max_link_width", std::to_string(width)}});
  }

 private:
  fs::path root_;
};

/// NVLinks as a test says they are.
class FakeNvlinks : public NvlinkSource {
 public:
  std::map<std::string, GpuNvlinks> gpus;
  efccl::StatusOr<GpuNvlinks> query(const std::string& pci) override {
    auto it = gpus.find(pci);
    if (it == gpus.end()) return efccl::Status::error("no such GPU " + pci);
    return it->second;
  }
};

std::string joined(const std::vector<std::string>& notes) {
  std::string s;
  for (const std::string& n : notes) s += "  " + n + "\n";
  return s;
}

bool has_note(const Detection& d, const std::string& part) {
  for (const std::string& n : d.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

const Link* link_between(const Topology& t, NodeIndex a, NodeIndex b, LinkKind kind) {
  for (LinkIndex l : t.out_links(a))
    if (t.link(l).to == b && t.link(l).kind == kind) return &t.link(l);
  return nullptr;
}

NodeIndex node(const Topology& t, const std::string& id) {
  auto n = t.find(id);
  EXPECT_TRUE(n) << "no node " << id;
  return n.value_or(0);
}

/// Machine (a): two NUMA nodes; under each CPU one PCIe switch with a GPU and a NIC.
///   cpu0: root port 00:01.0 -> switch 01:00.0 -> 02:00.0 -> GPU 03:00.0 (Gen5 x16)
///                                             -> 02:01.0 -> mlx5_0 04:00.0 (NDR400, Gen4 x16)
///   cpu1: root port 80:01.0 -> switch 81:00.0 -> 82:00.0 (x8) -> GPU 83:00.0 (Gen5 x16)
///                                             -> 82:01.0 -> eth2 84:00.0 (100 GbE)
void two_socket_machine(const FakeSysfs& s) {
  s.numa(0, "0-31");
  s.numa(1, "32-63");
  const std::string gen5 = "32.0 GT/s PCIe";
  s.bridge("pci0000:00", {"0000:00:01.0"}, gen5, 16);
  s.bridge("pci0000:00", {"0000:00:01.0", "0000:01:00.0"}, gen5, 16);
  s.bridge("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0"}, gen5, 16);
  s.bridge("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0"}, gen5, 16);
  s.pci("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"},
        {{"class", "0x030200"},
         {"vendor", "0x10de"},
         {"numa_node", "0"},
         {"max_link_speed", gen5},
         {"max_link_width", "16"}});
  const fs::path nic0 =
      s.pci("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:01.0", "0000:04:00.0"},
            {{"class", "0x020700"},
             {"vendor", "0x15b3"},
             {"numa_node", "0"},
             {"max_link_speed", "16.0 GT/s PCIe"},
             {"max_link_width", "16"}});
  s.link("class/infiniband/mlx5_0/device", fs::path("../../..") / nic0);
  s.write("class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)");
  s.write("class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE");
  s.link("class/net/ib0/device", fs::path("../../..") / nic0);  // IPoIB on mlx5_0: not twice
  s.write("class/net/ib0/speed", "400000");

  s.bridge("pci0000:80", {"0000:80:01.0"}, gen5, 16);
  s.bridge("pci0000:80", {"0000:80:01.0", "0000:81:00.0"}, gen5, 16);
  s.bridge("pci0000:80", {"0000:80:01.0", "0000:81:00.0", "0000:82:00.0"}, gen5, 8);
  s.bridge("pci0000:80", {"0000:80:01.0", "0000:81:00.0", "0000:82:01.0"}, gen5, 16);
  s.pci("pci0000:80", {"0000:80:01.0", "0000:81:00.0", "0000:82:00.0", "0000:83:00.0"},
        {{"class", "0x030200"},
         {"vendor", "0x10de"},
         {"numa_node", "1"},
         {"max_link_speed", gen5},
         {"max_link_width", "16"}});
  const fs::path nic1 =
      s.pci("pci0000:80", {"0000:80:01.0", "0000:81:00.0", "0000:82:01.0", "0000:84:00.0"},
            {{"class", "0x020000"},
             {"vendor", "0x8086"},
             {"numa_node", "1"},
             {"max_link_speed", "16.0 GT/s PCIe"},
             {"max_link_width", "16"}});
  s.link("class/net/eth2/device", fs::path("../../..") / nic1);
  s.write("class/net/eth2/speed", "100000");
  s.write("class/net/eth2/operstate", "up");
  s.write("class/net/lo/speed", "0");     // loopback: skipped
  s.write("class/net/bond0/speed", "1");  // virtual (no device): skipped
}

DetectOptions options_for(const FakeSysfs& s) {
  DetectOptions o;
  o.sysfs_root = s.root().string();
  o.use_nvml = false;
  // CUDA's order differs from bus order: device 0 is the GPU of the second socket.
  o.gpus = {{"0000:83:00.0", 90, "H100"}, {"0000:03:00.0", 90, "H100"}};
  return o;
}

TEST(DetectSysfs, TwoSocketsTwoSwitchesTwoNics) {
  FakeSysfs s;
  two_socket_machine(s);
  const Detection d = detect_host(options_for(s));
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message();
  EXPECT_TRUE(d.notes.empty()) << joined(d.notes);
  EXPECT_EQ(t.nodes_of(NodeKind::kCpu).size(), 2u);
  EXPECT_EQ(t.nodes_of(NodeKind::kHostMemory).size(), 2u);
  EXPECT_EQ(t.nodes_of(NodeKind::kPcieSwitch).size(), 2u);
  EXPECT_TRUE(t.nodes_of(NodeKind::kNvSwitch).empty());

  ASSERT_EQ(t.gpus().size(), 2u);
  const Node& g0 = t.node(t.gpus()[0]);
  const Node& g1 = t.node(t.gpus()[1]);
  EXPECT_EQ(g0.id, "h0.gpu0");
  EXPECT_EQ(g0.pci, "0000:83:00.0");
  EXPECT_EQ(g0.device, 0);
  EXPECT_EQ(g0.numa, 1);
  EXPECT_EQ(g0.sm, 90);
  EXPECT_EQ(g0.name, "H100");
  EXPECT_EQ(g1.pci, "0000:03:00.0");
  EXPECT_EQ(g1.numa, 0);

  ASSERT_EQ(t.nics().size(), 2u);
  const Node& n0 = t.node(t.nics()[0]);
  const Node& n1 = t.node(t.nics()[1]);
  EXPECT_EQ(n0.name, "mlx5_0");  // InfiniBand first, then Ethernet
  EXPECT_DOUBLE_EQ(n0.gbps, 50.0);
  EXPECT_EQ(n0.pci, "0000:04:00.0");
  EXPECT_EQ(n1.name, "eth2");
  EXPECT_DOUBLE_EQ(n1.gbps, 12.5);  // 100000 Mb/s
  EXPECT_EQ(n1.rail, 1);
  EXPECT_EQ(*t.rail_nic(t.gpus()[0]), t.nics()[1]) << "the NIC under the GPU's switch";
  EXPECT_EQ(*t.rail_nic(t.gpus()[1]), t.nics()[0]);

  // The GPU's hop is the lower of its own link (x16) and its downstream port's (x8).
  const NodeIndex sw1 = node(t, "h0.pcisw0");  // the first switch met: GPU 0's, on cpu1
  EXPECT_EQ(t.node(sw1).pci, "0000:81:00.0");
  const Link* gpu_link = link_between(t, t.gpus()[0], sw1, LinkKind::kPcie);
  ASSERT_NE(gpu_link, nullptr);
  EXPECT_DOUBLE_EQ(gpu_link->gbps, pcie_gbps(32, 8));
  EXPECT_EQ(gpu_link->lanes, 8);
  const Link* up = link_between(t, sw1, node(t, "h0.cpu1"), LinkKind::kPcie);
  ASSERT_NE(up, nullptr);
  EXPECT_DOUBLE_EQ(up->gbps, pcie_gbps(32, 16));
  const Link* nic_link = link_between(t, t.nics()[0], node(t, "h0.pcisw1"), LinkKind::kPcie);
  ASSERT_NE(nic_link, nullptr);
  EXPECT_DOUBLE_EQ(nic_link->gbps, pcie_gbps(16, 16));

  // GPU to GPU crosses the sockets; without NVML there is no NVLink.
  EXPECT_FALSE(t.nvlink_peers(t.gpus()[0], t.gpus()[1]));
  auto p = t.route(t.gpus()[0], t.gpus()[1]);
  ASSERT_TRUE(p);
  bool crosses = false;
  for (LinkIndex l : p->links) crosses |= t.link(l).kind == LinkKind::kSmp;
  EXPECT_TRUE(crosses);
}

TEST(DetectSysfs, WholeHostListsEveryGpuInBusOrderWhateverThisProcessSees) {
  FakeSysfs s;
  two_socket_machine(s);
  DetectOptions o = options_for(s);
  o.gpus = {{"0000:83:00.0", 90, "H100"}};  // CUDA_VISIBLE_DEVICES shows one GPU
  o.whole_host = true;
  const Detection d = detect_host(o);
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message();
  ASSERT_EQ(t.gpus().size(), 2u) << joined(d.notes);
  EXPECT_EQ(t.node(t.gpus()[0]).pci, "0000:03:00.0");  // bus order
  EXPECT_EQ(t.node(t.gpus()[0]).sm, 0) << "not visible here: unknown";
  EXPECT_EQ(t.node(t.gpus()[1]).pci, "0000:83:00.0");
  EXPECT_EQ(t.node(t.gpus()[1]).sm, 90);
  EXPECT_EQ(t.node(t.gpus()[1]).name, "H100");
  // Another process seeing the other GPU describes the host alike, but for what it knows.
  o.gpus = {{"0000:03:00.0", 90, "H100"}};
  const Detection other = detect_host(o);
  ASSERT_EQ(other.topology.gpus().size(), 2u);
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_EQ(other.topology.node(other.topology.gpus()[i]).id, t.node(t.gpus()[i]).id);
}

TEST(DetectSysfs, DirectNvlinksFromADriverThatCannotNameTheRemote) {
  FakeSysfs s;
  two_socket_machine(s);
  // A GPU CUDA does not see, NVLinked to GPU 1: its links are not used.
  s.pci("pci0000:00", {"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:05:00.0"},
        {{"class", "0x030200"}, {"vendor", "0x10de"}});
  FakeNvlinks nv;
  nv.gpus["0000:83:00.0"] = {"NVIDIA H100", {{"0000:03:00.0", NvlinkRemoteKind::kUnknown, 4}}};
  nv.gpus["0000:03:00.0"] = {"NVIDIA H100",
                             {{"0000:83:00.0", NvlinkRemoteKind::kUnknown, 4},
                              {"0000:05:00.0", NvlinkRemoteKind::kUnknown, 2}}};
  const Detection d = detect_host_with(options_for(s), &nv);
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message();
  const auto g = t.gpus();
  const Link* l = link_between(t, g[0], g[1], LinkKind::kNvlink);
  ASSERT_NE(l, nullptr);
  EXPECT_DOUBLE_EQ(l->gbps, 4 * nvlink_lane_gbps(90));
  EXPECT_EQ(l->lanes, 4);
  ASSERT_NE(link_between(t, g[1], g[0], LinkKind::kNvlink), nullptr);
  EXPECT_TRUE(t.nodes_of(NodeKind::kNvSwitch).empty());
  EXPECT_DOUBLE_EQ(t.nvlink_gbps(g[1]), 100.0);
  EXPECT_TRUE(has_note(d, "0000:05:00.0, a GPU CUDA does not see")) << joined(d.notes);
}

TEST(DetectSysfs, NvswitchLinksJoinOneSwitchNodeAndSysfsListsTheGpus) {
  FakeSysfs s;
  two_socket_machine(s);
  FakeNvlinks nv;
  // Remote bus ids of switch chips; one GPU reports its type, the other an old driver's unknown.
  nv.gpus["0000:03:00.0"] = {"NVIDIA H100",
                             {{"0000:c1:00.0", NvlinkRemoteKind::kSwitch, 10},
                              {"0000:c2:00.0", NvlinkRemoteKind::kSwitch, 8}}};
  nv.gpus["0000:83:00.0"] = {"NVIDIA H100", {{"0000:c1:00.0", NvlinkRemoteKind::kUnknown, 18}}};
  DetectOptions o = options_for(s);
  o.gpus.clear();  // every NVIDIA GPU sysfs lists, in bus order; sm unknown
  const Detection d = detect_host_with(o, &nv);
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message();
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_EQ(t.node(t.gpus()[0]).pci, "0000:03:00.0");
  EXPECT_EQ(t.node(t.gpus()[0]).name, "NVIDIA H100");  // from the NVLink source
  ASSERT_EQ(t.nodes_of(NodeKind::kNvSwitch).size(), 1u);
  EXPECT_EQ(t.node(t.nodes_of(NodeKind::kNvSwitch)[0]).id, "h0.nvs0");
  EXPECT_TRUE(t.nvlink_peers(t.gpus()[0], t.gpus()[1]));
  EXPECT_DOUBLE_EQ(t.nvlink_gbps(t.gpus()[0]), 18 * kAssumedNvlinkLaneGbps);
  EXPECT_TRUE(has_note(d, "NVLink generation unknown")) << joined(d.notes);
}

TEST(DetectSysfs, MissingAndGarbageEntriesAreNotedAndAssumed) {
  FakeSysfs s;
  s.numa(0, "0-7");
  s.numa(1, "");  // memory only: no CPU
  s.write("devices/system/node/nodeX/cpulist", "0");
  s.write("devices/system/node/possible", "0-1");
  // GPU 0: its bus/pci/devices entry dangles.
  s.link("bus/pci/devices/0000:1b:00.0", "../../../devices/pci0000:00/0000:1b:00.0");
  // GPU 1: garbage link attributes and numa, a root port without link files, a huge class.
  s.pci("pci0000:00", {"0000:00:02.0"}, {{"class", "0x060400"}});
  s.pci("pci0000:00", {"0000:00:02.0", "0000:2b:00.0"},
        {{"class", std::string(100000, '7')},
         {"vendor", "0x10de"},
         {"numa_node", "banana"},
         {"max_link_speed", "Unknown"},
         {"max_link_width", "x16?"}});
  // GPU 2: a symlink loop.
  s.link("bus/pci/devices/0000:3b:00.0", "0000:3b:00.0");
  // InfiniBand: one with a rate nobody can parse, one whose only port is down.
  const fs::path nic = s.pci("pci0000:00", {"0000:00:03.0"}, {{"class", "0x020700"}});
  s.link("class/infiniband/mlx5_9/device", fs::path("../../..") / nic);
  s.write("class/infiniband/mlx5_9/ports/1/rate", "fast");
  s.write("class/infiniband/mlx5_1/ports/1/state", "1: DOWN");
  // Ethernet: speed -1, one interface down, one whose device link dangles, one whose speed is
  // a FIFO (a read must not block).
  const fs::path eth = s.pci("pci0000:00", {"0000:00:04.0"}, {{"class", "0x020000"}});
  s.link("class/net/eth0/device", fs::path("../../..") / eth);
  s.write("class/net/eth0/speed", "-1");
  s.link("class/net/eth1/device", "../../../devices/pci0000:00/0000:00:09.0");
  s.write("class/net/eth1/operstate", "down");
  s.link("class/net/eth3/device", "../../../devices/pci0000:00/0000:00:0a.0");
  const fs::path eth4 = s.pci("pci0000:00", {"0000:00:05.0"}, {{"class", "0x020000"}});
  s.link("class/net/eth4/device", fs::path("../../..") / eth4);
  ASSERT_EQ(::mkfifo((s.root() / "class/net/eth4/speed").c_str(), 0600), 0);

  DetectOptions o;
  o.sysfs_root = s.root().string();
  o.use_nvml = false;
  o.gpus = {{"0000:1B:00.0", 90, ""},
            {"0000:2b:00.0", 90, ""},
            {"0000:3b:00.0", 90, ""},
            {"not-a-bus-id", 80, ""},
            {"0000:4b:00.0", 90, ""}};
  const Detection d = detect_host(o);
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message() << "\n" << joined(d.notes);
  EXPECT_EQ(t.nodes_of(NodeKind::kCpu).size(), 1u) << "node1 has no CPU";
  ASSERT_EQ(t.gpus().size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    const Node& g = t.node(t.gpus()[i]);
    EXPECT_EQ(g.device, static_cast<int>(i));
    const auto out = t.out_links(t.gpus()[i]);
    ASSERT_EQ(out.size(), 1u) << g.id;
    EXPECT_DOUBLE_EQ(t.link(out[0]).gbps, pcie_gbps(16, 16)) << g.id << ": Gen4 x16 assumed";
    EXPECT_EQ(t.node(t.link(out[0]).to).kind, NodeKind::kCpu) << g.id;
  }
  EXPECT_EQ(t.node(t.gpus()[0]).pci, "0000:1b:00.0") << "bus ids are normalised";
  EXPECT_TRUE(has_note(d, "GPU 0 (0000:1b:00.0): ")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "cannot be resolved")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "GPU 1 (0000:2b:00.0): PCIe link speed/width unreadable"))
      << joined(d.notes);
  EXPECT_TRUE(has_note(d, "GPU 2 (0000:3b:00.0)")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "GPU 3 (not-a-bus-id): not a PCI bus id")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "GPU 4 (0000:4b:00.0): ")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "is missing")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "mlx5_9: port rate unreadable")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "mlx5_1 has no active port")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "eth0: speed unknown")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "eth1 is down")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "eth3: ")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "eth4: speed unknown")) << joined(d.notes);
  // mlx5_9, eth0, eth3 (under the first CPU), eth4: every NIC has a speed.
  ASSERT_EQ(t.nics().size(), 4u);
  EXPECT_EQ(t.node(t.nics()[0]).name, "mlx5_9");
  EXPECT_DOUBLE_EQ(t.node(t.nics()[0]).gbps, 10.0 / 8);
  EXPECT_EQ(t.node(t.nics()[2]).name, "eth3");
}

TEST(DetectSysfs, NoSysfsAtAllGivesCudasGpusUnderOneCpu) {
  DetectOptions o;
  o.sysfs_root = "/nonexistent/efccl-detect-test";
  o.use_nvml = false;
  o.gpus = {{"0000:1b:00.0", 90, "H200"}, {"0000:2b:00.0", 90, "H200"}};
  const Detection d = detect_host(o);
  const Topology& t = d.topology;
  ASSERT_TRUE(t.check()) << t.check().message();
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_EQ(t.node(t.gpus()[1]).pci, "0000:2b:00.0");
  EXPECT_EQ(t.node(t.gpus()[1]).name, "H200");
  ASSERT_EQ(t.nodes_of(NodeKind::kCpu).size(), 1u);
  const NodeIndex cpu = t.nodes_of(NodeKind::kCpu)[0];
  ASSERT_TRUE(t.memory_of(cpu));
  for (NodeIndex g : t.gpus()) {
    EXPECT_EQ(*t.local_cpu(g), cpu);
    const Link* l = link_between(t, g, cpu, LinkKind::kPcie);
    ASSERT_NE(l, nullptr);
    EXPECT_DOUBLE_EQ(l->gbps, pcie_gbps(16, 16));
  }
  EXPECT_TRUE(t.nics().empty());
  EXPECT_TRUE(has_note(d, "no PCI devices under")) << joined(d.notes);
  EXPECT_TRUE(has_note(d, "one CPU (NUMA node 0) assumed")) << joined(d.notes);
}

TEST(DetectTopoFile, AMissingFileIsNotedAndDetectionKept) {
  FakeSysfs s;
  two_socket_machine(s);
  DetectOptions o = options_for(s);
  o.nccl_topo_file = (s.root() / "no-such-topo.xml").string();
  const Detection d = detect_host(o);
  ASSERT_TRUE(d.topology.check());
  EXPECT_EQ(d.topology.gpus().size(), 2u);
  EXPECT_EQ(d.topology.nics().size(), 2u);
  EXPECT_TRUE(has_note(d, "NCCL_TOPO_FILE '" + o.nccl_topo_file + "' cannot be opened"))
      << joined(d.notes);
}

TEST(DetectTopoFile, FileGpusAreMatchedByBusIdAndCompletedByDetection) {
  FakeSysfs s;
  two_socket_machine(s);
  const Detection detected = detect_host(options_for(s));
  // The file: one CPU, GPU 03:00.0 (visible, CUDA device 1) and GPU aa:00.0 (not visible),
  // NVLinked; no NIC.
  Topology file;
  auto add = [&](NodeKind kind, const std::string& id, const std::string& pci) {
    Node n;
    n.kind = kind;
    n.id = id;
    n.pci = pci;
    n.numa = 0;
    return *file.add_node(n);
  };
  const NodeIndex cpu = add(NodeKind::kCpu, "h0.cpu0", "");
  const NodeIndex g0 = add(NodeKind::kGpu, "h0.gpu0", "0000:03:00.0");
  const NodeIndex g1 = add(NodeKind::kGpu, "h0.gpu1", "0000:AA:00.0");
  ASSERT_TRUE(file.add_duplex(cpu, g0, LinkKind::kPcie, 20, 1));
  ASSERT_TRUE(file.add_duplex(cpu, g1, LinkKind::kPcie, 20, 1));
  ASSERT_TRUE(file.add_duplex(g0, g1, LinkKind::kNvlink, 300, 1));

  std::vector<std::string> notes;
  auto merged = overlay_topo_file(file, detected.topology, notes);
  ASSERT_TRUE(merged) << merged.status().message();
  const Topology& t = *merged;
  ASSERT_EQ(t.gpus().size(), 2u);
  const Node& a = t.node(t.gpus()[0]);
  const Node& b = t.node(t.gpus()[1]);
  EXPECT_EQ(a.id, "h0.gpu0");  // added: CUDA device 0 is not in the file
  EXPECT_EQ(a.pci, "0000:83:00.0");
  EXPECT_EQ(b.id, "h0.gpu1");  // the file's gpu0, renamed to its CUDA ordinal
  EXPECT_EQ(b.pci, "0000:03:00.0");
  EXPECT_EQ(b.device, 1);
  EXPECT_EQ(b.sm, 90);
  EXPECT_DOUBLE_EQ(t.link(t.out_links(t.gpus()[1])[0]).gbps, 20.0) << "the file's link";
  EXPECT_DOUBLE_EQ(t.nvlink_gbps(t.gpus()[1]), 0.0) << "its NVLink peer was dropped";
  EXPECT_EQ(t.nics().size(), 2u) << "the file has no NIC: detected ones added";
  std::string all;
  for (const std::string& n : notes) all += n + "\n";
  EXPECT_NE(all.find("dropped: h0.gpu1 0000:AA:00.0"), std::string::npos) << all;
  EXPECT_NE(all.find("has no GPU 0000:83:00.0 (CUDA device 0)"), std::string::npos) << all;
  EXPECT_NE(all.find("has no NIC"), std::string::npos) << all;
}

TEST(DetectParsing, BusIdsSpeedsAndNames) {
  using namespace efccl::topo::sysfs;
  EXPECT_EQ(normalize_bus_id("00000000:1B:00.0").value_or(""), "0000:1b:00.0");
  EXPECT_EQ(normalize_bus_id("1b:00.1").value_or(""), "0000:1b:00.1");
  EXPECT_EQ(normalize_bus_id("10000:e0:1f.7").value_or(""), "10000:e0:1f.7");  // VMD domain
  EXPECT_FALSE(normalize_bus_id("pci0000:00"));
  EXPECT_FALSE(normalize_bus_id("0000:1b:20.0"));  // device > 31
  EXPECT_FALSE(normalize_bus_id("0000:1b:00.8"));
  EXPECT_FALSE(normalize_bus_id(""));
  EXPECT_DOUBLE_EQ(parse_link_speed("16.0 GT/s PCIe").value_or(0), 16.0);
  EXPECT_DOUBLE_EQ(parse_link_speed("8 GT/s").value_or(0), 8.0);
  EXPECT_DOUBLE_EQ(parse_link_speed("2.5 GT/s").value_or(0), 2.5);
  EXPECT_FALSE(parse_link_speed("Unknown"));
  EXPECT_FALSE(parse_link_speed("16.0"));
  EXPECT_DOUBLE_EQ(parse_ib_rate("400 Gb/sec (4X NDR)").value_or(0), 400.0);
  EXPECT_FALSE(parse_ib_rate("fast"));
  EXPECT_EQ(parse_hex("0x030200").value_or(0), 0x030200u);
  EXPECT_FALSE(parse_hex("0x0302zz"));
  EXPECT_FALSE(parse_integer("banana"));
  EXPECT_TRUE(natural_less("mlx5_2", "mlx5_10"));
  EXPECT_FALSE(natural_less("mlx5_10", "mlx5_2"));
}

TEST(DetectHost, ThisMachineGivesAValidGraph) {
  // Whatever this machine has (CI: no GPU, no NVML, a virtual NIC): never throws, always valid.
  const Detection d = detect_host(DetectOptions{});
  ASSERT_TRUE(d.topology.check()) << d.topology.check().message() << "\n" << joined(d.notes);
  EXPECT_GE(d.topology.nodes_of(NodeKind::kCpu).size(), 1u);
  for (NodeIndex c : d.topology.nodes_of(NodeKind::kCpu))
    EXPECT_TRUE(d.topology.memory_of(c)) << d.topology.node(c).id;
  for (NodeIndex g : d.topology.gpus()) EXPECT_TRUE(d.topology.local_cpu(g));
  EXPECT_EQ(d.topology.hosts(), 1);
}

}  // namespace
