#include "select/balance_machine.h"

#include <cuda_runtime_api.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/settings.h"
#include "efccl/topology/nccl_xml.h"
#include "efccl/topology/presets.h"

namespace efccl::runtime {
namespace {

/// A topology file larger than this is refused before reading (real ones are kilobytes).
constexpr std::uintmax_t kMaxTopologyFileBytes = std::uintmax_t{16} << 20;

StatusOr<topo::Topology> load_spec(const std::string& spec) {
  const std::string where = "EFCCL_BALANCE_TOPOLOGY='" + spec + "'";
  if (spec.rfind("preset:", 0) == 0) {
    std::string name = spec.substr(7);
    int hosts = 1;
    if (const auto colon = name.find(':'); colon != std::string::npos) {
      const std::string count = name.substr(colon + 1);
      name.resize(colon);
      char* end = nullptr;
      const long n = std::strtol(count.c_str(), &end, 10);
      if (count.empty() || *end != '\0' || n < 1 || n > 128)
        return Status::error(where + ": '" + count + "' is not a host count from 1 to 128");
      hosts = static_cast<int>(n);
    }
    auto t = topo::preset(name, hosts);
    if (!t) return Status::error(where + ": " + t.status().message());
    return t;
  }
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(spec, ec);
  if (ec)
    return Status::error(where + ": neither preset:NAME[:HOSTS] nor a readable file (" +
                         ec.message() + ")");
  if (size > kMaxTopologyFileBytes)
    return Status::error(where + ": the file has " + std::to_string(size) +
                         " bytes; at most 16 MiB are read");
  if (spec.size() > 4 && spec.compare(spec.size() - 4, 4, ".xml") == 0) {
    auto t = topo::load_nccl_xml(spec);
    if (!t) return Status::error(where + ": " + t.status().message());
    return t;
  }
  std::ifstream in(spec, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) return Status::error(where + ": cannot read the file");
  auto t = topo::from_json(text.str(), spec);
  if (!t) return Status::error(where + ": " + t.status().message());
  return t;
}

}  // namespace

StatusOr<BalanceMachine> make_balance_machine(const topo::ClusterGraph* graph, int32_t nranks,
                                              const std::string& spec,
                                              bool every_process_sees_every_gpu) {
  BalanceMachine m;
  m.every_process_sees_every_gpu = every_process_sees_every_gpu;
  std::vector<topo::NodeIndex> rank_gpus;
  topo::Topology topology;
  if (!spec.empty()) {
    auto t = load_spec(spec);
    if (!t) return t.status();
    topology = std::move(*t);
    const std::vector<topo::NodeIndex> gpus = topology.gpus();
    if (gpus.empty()) return Status::error("EFCCL_BALANCE_TOPOLOGY='" + spec + "' has no GPU");
    for (int32_t r = 0; r < nranks; ++r)
      rank_gpus.push_back(gpus[static_cast<std::size_t>(r) % gpus.size()]);
    m.source = spec;
    m.simulated = true;
    m.node_device.assign(topology.nodes().size(), -1);
  } else {
    if (graph == nullptr) return Status::error("the communicator has no machine graph");
    if (graph->rank_gpu.size() != static_cast<std::size_t>(nranks))
      return Status::error("the machine graph places " + std::to_string(graph->rank_gpu.size()) +
                           " ranks, the communicator has " + std::to_string(nranks));
    for (int32_t r = 0; r < nranks; ++r) {
      const auto& gpu = graph->rank_gpu[static_cast<std::size_t>(r)];
      if (!gpu)
        return Status::error("rank " + std::to_string(r) +
                             "'s GPU is not in the machine graph (its bus id was not found)");
      rank_gpus.push_back(*gpu);
    }
    topology = graph->topology;
    m.source = "machine graph";
    // Which CUDA device each GPU of the graph is here, by bus id: relays that no rank of this
    // process runs on are used as slot devices only where this process sees them. Ranks of
    // one process live on one host (ranks on other hosts are refused at init for now).
    m.node_device.assign(topology.nodes().size(), -1);
    for (topo::NodeIndex g : topology.gpus()) {
      const std::string& pci = topology.node(g).pci;
      int device = -1;
      if (!pci.empty() && cudaDeviceGetByPCIBusId(&device, pci.c_str()) == cudaSuccess)
        m.node_device[g] = device;
      else
        (void)cudaGetLastError();
    }
  }
  // Host memory beside NVLink: off on real machines unless asked for (4x H200: the lone
  // pair and a skewed all-to-all-v ran 0.76-0.86x as fast with it, docs/performance.md).
  balance::PathTableOptions options;
  const int host_memory = balance_host_memory();
  options.host_memory = host_memory < 0 ? m.simulated : host_memory == 1;
  m.host_memory = options.host_memory;
  auto table = balance::PathTable::build(topology, std::move(rank_gpus), options);
  if (!table) return table.status();
  m.table = std::move(*table);
  return m;
}

}  // namespace efccl::runtime
