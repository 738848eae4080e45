// Presets: machines we do not have (docs/topology.md, "Presets", gives the source of every
// number below).
#include "efccl/topology/presets.h"

#include <string>

#include "graph_builder.h"
#include "link_estimates.h"

namespace efccl::topo {
namespace {

Node make(NodeKind kind, std::string id, int index, int numa) {
  Node n;
  n.kind = kind;
  n.id = std::move(id);
  n.index = index;
  n.numa = numa;
  return n;
}

/// Builds one host (host 0) node by node; the first error sticks and finish() returns it.
class HostBuilder : public GraphBuilder {
 public:
  NodeIndex cpu(int numa) {
    const NodeIndex c = add(make(NodeKind::kCpu, "h0.cpu" + std::to_string(numa), numa, numa));
    const NodeIndex mem =
        add(make(NodeKind::kHostMemory, "h0.mem" + std::to_string(numa), numa, numa));
    duplex(c, mem, LinkKind::kHost, memory_gbps_, kHostLatencyUs, 1);
    return c;
  }
  NodeIndex pcie_switch(NodeIndex parent, double gbps, int width) {
    Node n = make(NodeKind::kPcieSwitch, "h0.pcisw" + std::to_string(switches_), switches_,
                  t_.node(parent).numa);
    ++switches_;
    const NodeIndex s = add(std::move(n));
    duplex(parent, s, LinkKind::kPcie, gbps, kPcieLatencyUs, width);
    return s;
  }
  NodeIndex gpu(NodeIndex parent, double pcie_gbps, int width, int sm, const std::string& name) {
    Node n = make(NodeKind::kGpu, "h0.gpu" + std::to_string(gpus_), gpus_, t_.node(parent).numa);
    n.name = name;
    n.sm = sm;
    n.device = gpus_;
    ++gpus_;
    const NodeIndex g = add(std::move(n));
    duplex(parent, g, LinkKind::kPcie, pcie_gbps, kPcieLatencyUs, width);
    return g;
  }
  NodeIndex nic(NodeIndex parent, double pcie_gbps, int width, double gbps,
                const std::string& name) {
    Node n = make(NodeKind::kNic, "h0.nic" + std::to_string(nics_), nics_, t_.node(parent).numa);
    n.name = name;
    n.device = nics_;
    n.rail = nics_;
    n.gbps = gbps;
    ++nics_;
    const NodeIndex x = add(std::move(n));
    duplex(parent, x, LinkKind::kPcie, pcie_gbps, kPcieLatencyUs, width);
    return x;
  }
  NodeIndex nvswitch() {
    return add(make(NodeKind::kNvSwitch, "h0.nvs0", 0, -1));
  }
  void set_memory_gbps(double gbps) { memory_gbps_ = gbps; }

 private:
  double memory_gbps_ = kSprMemoryGbps;
  int switches_ = 0, gpus_ = 0, nics_ = 0;
};

/// Two sockets; under each, `per_socket` PCIe Gen5 x16 switches, each with one GPU and one
/// NDR400 NIC. NVLink is added by the caller.
void two_socket_gen5(HostBuilder& b, int per_socket, const std::string& gpu_name,
                     std::vector<NodeIndex>& gpus) {
  const double gen5 = pcie_gbps(32, 16);
  const NodeIndex cpu0 = b.cpu(0);
  const NodeIndex cpu1 = b.cpu(1);
  b.duplex(cpu0, cpu1, LinkKind::kSmp, kSprUpiGbps, kSmpLatencyUs, 1);
  for (NodeIndex cpu : {cpu0, cpu1}) {
    for (int i = 0; i < per_socket; ++i) {
      const NodeIndex sw = b.pcie_switch(cpu, gen5, 16);
      gpus.push_back(b.gpu(sw, gen5, 16, 90, gpu_name));
      b.nic(sw, gen5, 16, kNdr400Gbps, "mlx5_" + std::to_string(gpus.size() - 1));
    }
  }
}

StatusOr<Topology> nimble_h100() {
  // The NIMBLE paper's node: 4 H100 SXM, every pair joined by NVLink (18 NVLink4 links per GPU
  // spread over 3 peers: 6 per pair, 150 GB/s per direction), one NDR400 NIC per GPU.
  HostBuilder b;
  std::vector<NodeIndex> gpus;
  two_socket_gen5(b, 2, "H100 SXM5", gpus);
  for (std::size_t i = 0; i < gpus.size(); ++i)
    for (std::size_t j = i + 1; j < gpus.size(); ++j)
      b.duplex(gpus[i], gpus[j], LinkKind::kNvlink, 6 * nvlink_lane_gbps(90), kNvlinkLatencyUs,
               6);
  return b.finish();
}

StatusOr<Topology> nvswitch_8gpu(const std::string& gpu_name) {
  // DGX H100 / HGX H200: 8 GPUs, each with 18 NVLink4 links into the NVSwitch fabric
  // (450 GB/s per direction), one NDR400 NIC per GPU under the GPU's PCIe Gen5 switch.
  HostBuilder b;
  std::vector<NodeIndex> gpus;
  two_socket_gen5(b, 4, gpu_name, gpus);
  const NodeIndex nvs = b.nvswitch();
  for (NodeIndex g : gpus)
    b.duplex(g, nvs, LinkKind::kNvlink, 18 * nvlink_lane_gbps(90), kNvlinkLatencyUs, 18);
  return b.finish();
}

StatusOr<Topology> h200_nv18_x2() {
  // The two-H200 machine of docs/performance.md: measured, not nominal: 395 GB/s one way over
  // the 18 NVLinks (copy engine), 55 GB/s each way between a GPU and pinned host memory.
  HostBuilder b;
  const NodeIndex cpu = b.cpu(0);
  const NodeIndex g0 = b.gpu(cpu, 55.0, 16, 90, "H200");
  const NodeIndex g1 = b.gpu(cpu, 55.0, 16, 90, "H200");
  b.duplex(g0, g1, LinkKind::kNvlink, 395.0, kNvlinkLatencyUs, 18);
  return b.finish();
}

}  // namespace

double nvlink_lane_gbps(int sm) {
  if (sm >= 100 && sm < 110) return 50.0;  // NVLink 5 (Blackwell)
  if (sm >= 70 && sm < 100) return 25.0;   // NVLink 2 (Volta), 3 (Ampere), 4 (Hopper)
  if (sm >= 60 && sm < 70) return 20.0;    // NVLink 1 (Pascal)
  return 0.0;
}

double pcie_gbps(double gts, int width) {
  const double encoding = gts < 8.0 ? 8.0 / 10.0 : 128.0 / 130.0;
  return gts * width * encoding / 8.0;
}

std::vector<std::string_view> preset_names() {
  return {"nimble-h100", "dgx-h100", "hgx-h200", "h200-nv18-x2"};
}

StatusOr<Topology> preset(std::string_view name, int nodes) {
  StatusOr<Topology> host = Status::error("");
  if (name == "nimble-h100")
    host = nimble_h100();
  else if (name == "dgx-h100")
    host = nvswitch_8gpu("H100 SXM5");
  else if (name == "hgx-h200")
    host = nvswitch_8gpu("H200 SXM");
  else if (name == "h200-nv18-x2")
    host = h200_nv18_x2();
  else {
    std::string known;
    for (std::string_view n : preset_names()) known += (known.empty() ? "" : ", ") + std::string(n);
    return Status::error("unknown preset '" + std::string(name) + "' (known: " + known + ")");
  }
  if (!host) return host.status();
  return repeat_host(*host, nodes, "preset '" + std::string(name) + "'");
}

}  // namespace efccl::topo
