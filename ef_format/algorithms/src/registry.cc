#include "efccl/algorithms/registry.h"

#include <algorithm>
#include <string>

#include "library.h"

namespace efccl::algorithms {
namespace {

constexpr int32_t kMaxRanks = 4096;
constexpr int32_t kMaxChannels = 32;
constexpr int32_t kMaxInstances = 32;

using Generator = StatusOr<ef::Program> (*)(const AlgorithmParams&,
                                            const compiler::CompileOptions&);

struct Entry {
  AlgorithmInfo info;
  Generator generate;
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {{"allpairs_allreduce", ef::Collective::kAllReduce,
        "one step: every rank sends its whole buffer to every other rank, then reduces "
        "locally (latency-bound small messages)",
        0, uint64_t{1} << 20},
       detail::allpairs_allreduce},
      {{"direct_alltoall", ef::Collective::kAllToAll,
        "every rank sends each block straight to its owner (in-place: through scratch)", 0,
        std::nullopt},
       detail::direct_alltoall},
      {{"ring_allgather", ef::Collective::kAllGather,
        "each block travels the ring 0 -> 1 -> ... -> n-1 -> 0, forwarded with rcs", 0,
        std::nullopt},
       detail::ring_allgather},
      {{"ring_allreduce", ef::Collective::kAllReduce,
        "ring reduce-scatter (rrs) then ring allgather (rcs); bandwidth-optimal", 0, std::nullopt},
       detail::ring_allreduce},
      {{"ring_broadcast", ef::Collective::kBroadcast,
        "each chunk travels the ring from the root, forwarded with rcs", 0, std::nullopt},
       detail::ring_broadcast},
      {{"ring_reduce", ef::Collective::kReduce,
        "each chunk is reduced along the ring towards the root (rrs, then rrc at the root)", 0,
        std::nullopt},
       detail::ring_reduce},
      {{"ring_reducescatter", ef::Collective::kReduceScatter,
        "each block is reduced along the ring and ends at its owner (rrs, then rrc)", 0,
        std::nullopt},
       detail::ring_reducescatter},
  };
  return kEntries;
}

}  // namespace

std::vector<AlgorithmInfo> list_algorithms() {
  std::vector<AlgorithmInfo> out;
  for (const auto& e : entries()) out.push_back(e.info);
  std::sort(out.begin(), out.end(),
            [](const AlgorithmInfo& a, const AlgorithmInfo& b) { return a.name < b.name; });
  return out;
}

StatusOr<ef::Program> generate_algorithm(std::string_view name, const AlgorithmParams& params) {
  const Entry* entry = nullptr;
  for (const auto& e : entries()) {
    if (e.info.name == name) entry = &e;
  }
  if (entry == nullptr) {
    std::string known;
    for (const auto& info : list_algorithms()) known += (known.empty() ? "" : ", ") + info.name;
    return Status::error("unknown algorithm '" + std::string(name) + "' (known: " + known + ")");
  }
  const std::string where = std::string(name) + ": ";
  if (params.ranks < 1 || params.ranks > kMaxRanks) {
    return Status::error(where + "ranks must be 1.." + std::to_string(kMaxRanks) + ", got " +
                         std::to_string(params.ranks));
  }
  if (params.nodes < 1 || params.ranks % params.nodes != 0) {
    return Status::error(where + "nodes must be >= 1 and divide ranks (" +
                         std::to_string(params.ranks) + "), got " + std::to_string(params.nodes));
  }
  if (params.gpus_per_node != 0 && params.gpus_per_node * params.nodes != params.ranks) {
    return Status::error(where + "nodes x gpus_per_node (" + std::to_string(params.nodes) + " x " +
                         std::to_string(params.gpus_per_node) + ") must equal ranks (" +
                         std::to_string(params.ranks) + ")");
  }
  if (params.instances < 1 || params.instances > kMaxInstances) {
    return Status::error(where + "instances must be 1.." + std::to_string(kMaxInstances) +
                         ", got " + std::to_string(params.instances));
  }
  if (params.channels < 1 || params.channels > kMaxChannels) {
    return Status::error(where + "channels must be 1.." + std::to_string(kMaxChannels) + ", got " +
                         std::to_string(params.channels));
  }
  if (params.root < 0 || params.root >= params.ranks) {
    return Status::error(where + "root " + std::to_string(params.root) + " is not a rank of " +
                         std::to_string(params.ranks));
  }
  compiler::CompileOptions options = params.options;
  options.root = params.root;
  options.min_bytes = params.min_bytes.value_or(entry->info.default_min_bytes);
  options.max_bytes = params.max_bytes ? params.max_bytes : entry->info.default_max_bytes;
  if (options.max_bytes && *options.max_bytes < options.min_bytes) {
    return Status::error(where + "max_bytes " + std::to_string(*options.max_bytes) +
                         " is below min_bytes " + std::to_string(options.min_bytes));
  }
  return entry->generate(params, options);
}

}  // namespace efccl::algorithms
