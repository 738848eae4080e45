// A communicator's machine graph from its ranks' reports (efccl/topology/cluster.h).
#include "efccl/topology/cluster.h"

#include <map>

#include "sysfs_pci.h"

namespace efccl::topo {

std::string normal_bus_id(std::string_view text) {
  return sysfs::normalize_bus_id(text).value_or(std::string(text));
}

StatusOr<ClusterGraph> assemble_cluster(const std::vector<RankPlacement>& ranks,
                                        const std::map<uint64_t, std::string>& host_graphs) {
  ClusterGraph out;
  std::map<uint64_t, int32_t> host_index;
  std::vector<uint64_t> host_order;
  for (const RankPlacement& r : ranks)
    if (host_index.emplace(r.host, static_cast<int32_t>(host_order.size())).second)
      host_order.push_back(r.host);
  if (host_order.size() > static_cast<std::size_t>(kMaxHosts))
    return Status::error(std::to_string(host_order.size()) + " hosts, more than " +
                         std::to_string(kMaxHosts));
  std::vector<Topology> hosts;
  for (std::size_t h = 0; h < host_order.size(); ++h) {
    std::size_t first_rank = 0;
    while (ranks[first_rank].host != host_order[h]) ++first_rank;
    const std::string where = "the machine graph of rank " + std::to_string(first_rank) + "'s host";
    auto it = host_graphs.find(host_order[h]);
    if (it == host_graphs.end())
      return Status::error("rank " + std::to_string(first_rank) + "'s host sent no machine graph");
    auto parsed = from_json(it->second, where);
    if (!parsed) return parsed.status();
    if (parsed->hosts() > 1)
      return Status::error(where + " spans " + std::to_string(parsed->hosts()) + " hosts");
    hosts.push_back(std::move(*parsed));
  }
  auto merged = merge_hosts(hosts);
  if (!merged) return merged.status();
  out.topology = std::move(*merged);
  std::map<std::pair<int32_t, std::string>, NodeIndex> gpu_by_bus;
  for (NodeIndex g : out.topology.gpus())
    if (!out.topology.node(g).pci.empty())
      gpu_by_bus.emplace(std::make_pair(out.topology.node(g).host,
                                        normal_bus_id(out.topology.node(g).pci)),
                         g);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const int32_t h = host_index.at(ranks[r].host);
    out.rank_host.push_back(h);
    auto it = gpu_by_bus.find({h, normal_bus_id(ranks[r].pci)});
    if (it == gpu_by_bus.end()) {
      out.rank_gpu.push_back(std::nullopt);
      out.notes.push_back("rank " + std::to_string(r) + ": GPU " +
                          (ranks[r].pci.empty() ? std::string("(no bus id)") : ranks[r].pci) +
                          " is not in host " + std::to_string(h) + "'s graph");
    } else {
      out.rank_gpu.push_back(it->second);
    }
  }
  out.hash = out.topology.hash();
  return out;
}

}  // namespace efccl::topo
