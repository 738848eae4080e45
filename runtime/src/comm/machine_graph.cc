#include "comm/machine_graph.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>

#include "efccl/common/log.h"
#include "efccl/net/host_hash.h"

namespace efccl::runtime {
namespace {

// Bootstrap tags of the exchange (executors, regroups and the fallback use other values).
constexpr uint64_t kHostGraphTag = 0x0efcc1709010a000ull;
constexpr uint64_t kGraphHashTag = 0x0efcc1709010a001ull;

std::string bus_id_of(int device) {
  char bus[32] = {};
  if (device < 0 || cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return topo::normal_bus_id(bus);
}

topo::Detection detect_now() {
  topo::DetectOptions options;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  for (int d = 0; d < count; ++d) {
    topo::DetectedGpu gpu;
    gpu.pci = bus_id_of(d);
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess)
      (void)cudaGetLastError();
    gpu.sm = major * 10 + minor;
    options.gpus.push_back(std::move(gpu));
  }
  // Every GPU of the host, also those this process does not see: processes of one host with
  // different CUDA_VISIBLE_DEVICES then describe it alike.
  options.whole_host = true;
  if (const char* file = std::getenv("NCCL_TOPO_FILE"); file != nullptr && *file != '\0')
    options.nccl_topo_file = file;
  try {
    return topo::detect_host(options);
  } catch (const std::exception& e) {
    // detect_host does not throw by contract; an allocation failure still must not fail init.
    topo::Detection d;
    d.notes.push_back(std::string("detection failed: ") + e.what());
    return d;
  }
}

/// Whether this process sees, as a CUDA device, every GPU of its host (the host of the ranks
/// placed with `host`) in `graph`.
bool sees_every_gpu_of_host(const topo::ClusterGraph& graph,
                            const std::vector<topo::RankPlacement>& ranks, uint64_t host) {
  int32_t index = -1;
  for (std::size_t r = 0; r < ranks.size() && index < 0; ++r)
    if (ranks[r].host == host && r < graph.rank_host.size()) index = graph.rank_host[r];
  if (index < 0) return false;
  for (topo::NodeIndex g : graph.topology.gpus_of_host(index)) {
    int device = -1;
    const std::string& pci = graph.topology.node(g).pci;
    if (pci.empty() || cudaDeviceGetByPCIBusId(&device, pci.c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  return true;
}

ApiStatus graph_status(const Status& s) {
  return ApiStatus::internal("the machine graph: " + s.message());
}

}  // namespace

const topo::Detection& this_host() {
  static const topo::Detection* detected = [] {
    auto* d = new topo::Detection(detect_now());  // lives as long as the process
    for (const std::string& note : d->notes) EFCCL_INFO(kLogGraph, -1, "topology: " + note);
    return d;
  }();
  return *detected;
}

ApiStatus local_machine_graph(const std::vector<int>& devices,
                              std::shared_ptr<const topo::ClusterGraph>* out) {
  const uint64_t host = net::host_hash();
  std::vector<topo::RankPlacement> ranks;
  for (int d : devices) ranks.push_back({host, bus_id_of(d)});
  auto graph = topo::assemble_cluster(ranks, {{host, topo::to_json(this_host().topology, -1)}});
  if (!graph) return graph_status(graph.status());
  *out = std::make_shared<const topo::ClusterGraph>(std::move(*graph));
  return ApiStatus::ok();
}

ApiStatus exchanged_machine_graph(const std::vector<topo::RankPlacement>& ranks,
                                  net::Bootstrap& boot, const std::vector<int>& leaders,
                                  net::Deadline deadline, const std::atomic<bool>* abort,
                                  std::shared_ptr<const topo::ClusterGraph>* out,
                                  bool* every_process_sees_every_gpu) {
  // Each process sends its host hash and its host's graph.
  const uint64_t host = net::host_hash();
  std::string mine(reinterpret_cast<const char*>(&host), sizeof(host));
  mine += topo::to_json(this_host().topology, -1);
  auto got = boot.allgather(leaders, kHostGraphTag, std::move(mine), deadline, abort);
  if (!got) return ApiStatus::system("exchanging the machine graph: " + got.status().message());
  std::map<uint64_t, std::string> host_graphs;
  for (std::size_t i = 0; i < got->size(); ++i) {
    const std::string& blob = (*got)[i];
    if (blob.size() < sizeof(uint64_t))
      return ApiStatus::system("rank " + std::to_string(leaders[i]) +
                               " sent a machine graph of " + std::to_string(blob.size()) +
                               " bytes");
    uint64_t h = 0;
    std::memcpy(&h, blob.data(), sizeof(h));
    host_graphs.emplace(h, blob.substr(sizeof(h)));  // the lowest rank of a host speaks for it
  }
  auto graph = topo::assemble_cluster(ranks, host_graphs);
  if (!graph) return graph_status(graph.status());
  // Every rank computed the graph from the same bytes; the hashes say whether all agree. A
  // byte after the hash says whether this process sees every GPU of its host.
  const uint64_t hash = graph->hash;
  std::string hash_blob(reinterpret_cast<const char*>(&hash), sizeof(hash));
  hash_blob += sees_every_gpu_of_host(*graph, ranks, host) ? '\1' : '\0';
  auto hashes = boot.allgather(leaders, kGraphHashTag, std::move(hash_blob), deadline, abort);
  if (!hashes)
    return ApiStatus::system("exchanging the machine graph's hash: " + hashes.status().message());
  bool all_see = true;
  for (std::size_t i = 0; i < hashes->size(); ++i) {
    uint64_t theirs = 0;
    const std::string& blob = (*hashes)[i];
    const bool sized = blob.size() == sizeof(theirs) + 1;
    if (sized) std::memcpy(&theirs, blob.data(), 8);
    all_see = all_see && sized && blob[sizeof(theirs)] == '\1';
    if (!sized || theirs != hash) {
      char text[96];
      std::snprintf(text, sizeof(text), "0x%016llx here, 0x%016llx at rank %d",
                    static_cast<unsigned long long>(hash),
                    static_cast<unsigned long long>(theirs), leaders[i]);
      return ApiStatus::internal(std::string("the ranks computed different machine graphs (") +
                                 text + "): are they running different efccl versions?");
    }
  }
  if (every_process_sees_every_gpu != nullptr) *every_process_sees_every_gpu = all_see;
  *out = std::make_shared<const topo::ClusterGraph>(std::move(*graph));
  return ApiStatus::ok();
}

void log_machine_graph(const topo::ClusterGraph& graph, const std::vector<int>& local_ranks,
                       const std::vector<int>& devices) {
  if (!log_enabled(LogLevel::kInfo, kLogGraph)) return;
  const topo::Topology& t = graph.topology;
  char hash[24];
  std::snprintf(hash, sizeof(hash), "0x%016llx", static_cast<unsigned long long>(graph.hash));
  for (std::size_t i = 0; i < local_ranks.size(); ++i) {
    const int rank = local_ranks[i];
    std::string line = "rank " + std::to_string(rank) + " -> ";
    const auto gpu = graph.rank_gpu[static_cast<std::size_t>(rank)];
    if (gpu) {
      const auto rail = t.rail_nic(*gpu);
      char nv[32];
      std::snprintf(nv, sizeof(nv), "%.0f", t.nvlink_gbps(*gpu));
      line += t.node(*gpu).id + " (" + t.node(*gpu).pci + ", NVLink " + nv + " GB/s, rail " +
              (rail ? t.node(*rail).id : std::string("none")) + ")";
    } else {
      line += "no GPU node";
    }
    line += "; graph " + std::to_string(t.hosts()) + " host(s), " +
            std::to_string(t.gpus().size()) + " GPUs, " + std::to_string(t.nics().size()) +
            " NICs, " + std::to_string(t.links().size()) + " links, hash " + hash;
    EFCCL_INFO(kLogGraph, i < devices.size() ? devices[i] : -1, line);
  }
  for (const std::string& note : graph.notes) EFCCL_INFO(kLogGraph, -1, "topology: " + note);
}

}  // namespace efccl::runtime
