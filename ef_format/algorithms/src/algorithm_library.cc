#include "efccl/algorithms/algorithm_library.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

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

/// An entry with the default shape: any rank count, up to kMaxChannels channels, flat.
Entry flat(std::string name, ef::Collective collective, std::string description,
           std::optional<uint64_t> max_bytes, Generator generate) {
  AlgorithmInfo info;
  info.name = std::move(name);
  info.collective = collective;
  info.description = std::move(description);
  info.default_max_bytes = max_bytes;
  info.max_channels = kMaxChannels;
  return {std::move(info), generate};
}

/// An entry shaped by nodes x gpus_per_node.
Entry hierarchical(std::string name, ef::Collective collective, std::string description,
                   Generator generate, int32_t min_ranks = 1, int32_t max_channels = kMaxChannels) {
  Entry e = flat(std::move(name), collective, std::move(description), std::nullopt, generate);
  e.info.hierarchical = true;
  e.info.min_ranks = min_ranks;
  e.info.max_channels = max_channels;
  return e;
}

Entry two_ranks(Entry e) {
  e.info.min_ranks = e.info.max_ranks = 2;
  return e;
}

/// An entry for ranks sharing one GPU in one process: its programs use mrc
/// (AlgorithmInfo::shared_launch), up to the operands an mrc takes. `pass` says what one pass
/// per chunk reads and writes.
Entry shared_gpu(std::string name, ef::Collective collective, const std::string& pass,
                 Generator generate) {
  Entry e = flat(std::move(name), collective,
                 "ranks sharing one GPU in one process: one pass per chunk " + pass +
                     " (mrc); runs only where all ranks share a launch",
                 std::nullopt, generate);
  e.info.max_ranks = ef::kMaxMultiOperands;
  e.info.shared_launch = true;
  return e;
}

const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      flat("allpairs_allgather", ef::Collective::kAllGather,
           "one step: every rank sends its block straight to every other rank (latency-bound "
           "small messages)",
           uint64_t{1} << 20, detail::allpairs_allgather),
      flat("allpairs_allreduce", ef::Collective::kAllReduce,
           "one step: every rank sends its whole buffer to every other rank, then reduces "
           "locally (latency-bound small messages)",
           uint64_t{1} << 20, detail::allpairs_allreduce),
      hierarchical("alltonext", ef::Collective::kCustom,
                   "custom (GC3 6.4): rank r's buffer goes to rank r+1; across a node boundary "
                   "it is split over every GPU and NIC of the two nodes",
                   detail::alltonext, 2),
      flat("direct_alltoall", ef::Collective::kAllToAll,
           "every rank sends each block straight to its owner (in-place: through scratch)",
           std::nullopt, detail::direct_alltoall),
      flat("direct_gather", ef::Collective::kGather,
           "every rank sends its block straight to the root", std::nullopt, detail::direct_gather),
      flat("direct_scatter", ef::Collective::kScatter,
           "the root sends each block straight to its owner", std::nullopt, detail::direct_scatter),
      hierarchical("hierarchical_allreduce", ef::Collective::kAllReduce,
                   "GC3 6.3: intra-node ring reduce-scatter, cross-node ring allreduce per "
                   "local GPU index, intra-node ring allgather",
                   detail::hierarchical_allreduce, 1, 1),
      hierarchical("multilane_allreduce", ef::Collective::kAllReduce,
                   "lanes on separate channels, each: one-hop node-local reduce-scatter, "
                   "cross-node ring allreduce per local GPU index, one-hop node-local "
                   "allgather",
                   detail::multilane_allreduce),
      flat("ring_allgather", ef::Collective::kAllGather,
           "each block travels the ring 0 -> 1 -> ... -> n-1 -> 0, forwarded with rcs",
           std::nullopt, detail::ring_allgather),
      flat("ring_allreduce", ef::Collective::kAllReduce,
           "ring reduce-scatter (rrs) then ring allgather (rcs); bandwidth-optimal", std::nullopt,
           detail::ring_allreduce),
      flat("ring_broadcast", ef::Collective::kBroadcast,
           "each chunk travels the ring from the root, forwarded with rcs", std::nullopt,
           detail::ring_broadcast),
      flat("ring_reduce", ef::Collective::kReduce,
           "each chunk is reduced along the ring towards the root (rrs, then rrc at the root)",
           std::nullopt, detail::ring_reduce),
      flat("ring_reducescatter", ef::Collective::kReduceScatter,
           "each block is reduced along the ring and ends at its owner (rrs, then rrc)",
           std::nullopt, detail::ring_reducescatter),
      shared_gpu("shared_gpu_allgather", ef::Collective::kAllGather,
                 "reads a rank's block once and writes it into every rank's output",
                 detail::shared_gpu_allgather),
      shared_gpu("shared_gpu_allreduce", ef::Collective::kAllReduce,
                 "reads every rank's input and writes every rank's output",
                 detail::shared_gpu_allreduce),
      shared_gpu("shared_gpu_allreduce_single", ef::Collective::kAllReduce,
                 "reads every rank's input and writes every rank's output, all of the buffer in "
                 "one threadblock of rank 0 (any count: the tail of shared_gpu_allreduce)",
                 detail::shared_gpu_allreduce_single),
      shared_gpu("shared_gpu_broadcast", ef::Collective::kBroadcast,
                 "reads the root's input once and writes every rank's output",
                 detail::shared_gpu_broadcast),
      shared_gpu("shared_gpu_broadcast_single", ef::Collective::kBroadcast,
                 "reads the root's input once and writes every rank's output, all of the buffer "
                 "in one threadblock of the root (any count: the tail of shared_gpu_broadcast)",
                 detail::shared_gpu_broadcast_single),
      shared_gpu("shared_gpu_reduce", ef::Collective::kReduce,
                 "reads every rank's input and writes the root's output",
                 detail::shared_gpu_reduce),
      shared_gpu("shared_gpu_reduce_single", ef::Collective::kReduce,
                 "reads every rank's input and writes the root's output, all of the buffer in "
                 "one threadblock of the root (any count: the tail of shared_gpu_reduce)",
                 detail::shared_gpu_reduce_single),
      shared_gpu("shared_gpu_reducescatter", ef::Collective::kReduceScatter,
                 "reads block r of every input and writes rank r's output",
                 detail::shared_gpu_reducescatter),
      two_ranks(flat("send_recv", ef::Collective::kCustom,
                     "custom, 2 ranks: rank 0's input arrives in rank 1's output, chunk c on "
                     "channel c",
                     std::nullopt, detail::send_recv)),
      hierarchical("two_step_alltoall", ef::Collective::kAllToAll,
                   "GC3 2 / Fig. 10a: blocks for a remote node are gathered at the local GPU of "
                   "the destination's local index, then cross in one transfer per node pair "
                   "and local index",
                   detail::two_step_alltoall),
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
  const AlgorithmInfo& info = entry->info;
  if (params.ranks < info.min_ranks || params.ranks > std::min(info.max_ranks, kMaxRanks)) {
    return Status::error(where + "ranks must be " + std::to_string(info.min_ranks) + ".." +
                         std::to_string(std::min(info.max_ranks, kMaxRanks)) + ", got " +
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
  if (params.channels < 1 || params.channels > info.max_channels) {
    return Status::error(
        where + "channels must be 1.." + std::to_string(info.max_channels) + ", got " +
        std::to_string(params.channels) +
        (info.max_channels == 1 ? " (the algorithm has no channel parameter; use instances)" : ""));
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
  if (params.ranks == 1 && params.inplace) {
    // One rank in place: the in-place trace is empty (every copy lands on itself), yet a
    // premulsum call must still scale the buffer. The out-of-place program's local copy does
    // that (a pristine read) and is correct under the aliasing too: use it when it says so.
    AlgorithmParams outofplace = params;
    outofplace.inplace = false;
    auto program = entry->generate(outofplace, options);
    if (!program || program->inplace) return program;
  }
  return entry->generate(params, options);
}

}  // namespace efccl::algorithms
