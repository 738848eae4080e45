#include "select/tuning.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

constexpr ef::Protocol kSimple = ef::Protocol::kSimple;
constexpr ef::Protocol kLL128 = ef::Protocol::kLL128;

/// A row applies when nranks is in [min_ranks, max_ranks] and bytes in [min_bytes, max_bytes).
/// The first matching row of a collective wins. More instances for larger messages give the
/// interpreter enough CTAs (one per threadblock) to saturate NVLink.
struct Row {
  ef::Collective collective;
  std::string_view algorithm;
  int32_t min_ranks, max_ranks;
  uint64_t min_bytes, max_bytes;
  int32_t instances;
  ef::Protocol protocol = kSimple;
};

constexpr Row kTable[] = {
    // allreduce: one-step all-pairs for latency-bound sizes on small cliques, then the ring.
    // One ring threadblock moves ~12 GB/s over H200 NVLink, so large messages need ~32
    // instances to approach the link's ceiling. Two ranks: all-pairs is one send +
    // recv-reduce-copy per lane (the same bytes as the ring in one step instead of two), lanes
    // growing with the size up to the program's 1 MiB. Simple: under CUDA graphs it matches
    // LL128 up to 2 KB and beats it from 4 KB, and LL everywhere. The measurements behind every
    // row: docs/performance.md.
    {ef::Collective::kAllReduce, "allpairs_allreduce", 2, 2, 0, 16 * KiB, 1},
    {ef::Collective::kAllReduce, "allpairs_allreduce", 2, 2, 16 * KiB, 64 * KiB, 2},
    {ef::Collective::kAllReduce, "allpairs_allreduce", 2, 2, 64 * KiB, 256 * KiB, 4},
    {ef::Collective::kAllReduce, "allpairs_allreduce", 2, 2, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kAllReduce, "allpairs_allreduce", 3, 8, 0, 256 * KiB, 1},
    {ef::Collective::kAllReduce, "ring_allreduce", 1, 4096, 0, 256 * KiB, 1},
    {ef::Collective::kAllReduce, "ring_allreduce", 1, 4096, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kAllReduce, "ring_allreduce", 1, 4096, 1 * MiB, 8 * MiB, 16},
    {ef::Collective::kAllReduce, "ring_allreduce", 1, 4096, 8 * MiB, kNoLimit, 32},
    {ef::Collective::kAllGather, "ring_allgather", 1, 4096, 0, 256 * KiB, 1},
    {ef::Collective::kAllGather, "ring_allgather", 1, 4096, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kAllGather, "ring_allgather", 1, 4096, 1 * MiB, 8 * MiB, 16},
    {ef::Collective::kAllGather, "ring_allgather", 1, 4096, 8 * MiB, kNoLimit, 32},
    {ef::Collective::kReduceScatter, "ring_reducescatter", 1, 4096, 0, 256 * KiB, 1},
    {ef::Collective::kReduceScatter, "ring_reducescatter", 1, 4096, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kReduceScatter, "ring_reducescatter", 1, 4096, 1 * MiB, 8 * MiB, 16},
    {ef::Collective::kReduceScatter, "ring_reducescatter", 1, 4096, 8 * MiB, kNoLimit, 32},
    {ef::Collective::kBroadcast, "ring_broadcast", 1, 4096, 0, 256 * KiB, 1},
    {ef::Collective::kBroadcast, "ring_broadcast", 1, 4096, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kBroadcast, "ring_broadcast", 1, 4096, 1 * MiB, 8 * MiB, 16},
    {ef::Collective::kBroadcast, "ring_broadcast", 1, 4096, 8 * MiB, kNoLimit, 32},
    {ef::Collective::kReduce, "ring_reduce", 1, 4096, 0, 256 * KiB, 1},
    {ef::Collective::kReduce, "ring_reduce", 1, 4096, 256 * KiB, 1 * MiB, 8},
    {ef::Collective::kReduce, "ring_reduce", 1, 4096, 1 * MiB, 8 * MiB, 16},
    {ef::Collective::kReduce, "ring_reduce", 1, 4096, 8 * MiB, kNoLimit, 32},
    // alltoall: every rank already has n-1 send and n-1 receive threadblocks per instance.
    {ef::Collective::kAllToAll, "direct_alltoall", 1, 4096, 0, 1 * MiB, 1},
    {ef::Collective::kAllToAll, "direct_alltoall", 1, 4096, 1 * MiB, 64 * MiB, 4},
    {ef::Collective::kAllToAll, "direct_alltoall", 1, 4096, 64 * MiB, kNoLimit, 8},
    // gather/scatter: direct from/to the root; each instance adds one channel per block.
    {ef::Collective::kGather, "direct_gather", 1, 4096, 0, 1 * MiB, 1},
    {ef::Collective::kGather, "direct_gather", 1, 4096, 1 * MiB, 64 * MiB, 4},
    {ef::Collective::kGather, "direct_gather", 1, 4096, 64 * MiB, kNoLimit, 8},
    {ef::Collective::kScatter, "direct_scatter", 1, 4096, 0, 1 * MiB, 1},
    {ef::Collective::kScatter, "direct_scatter", 1, 4096, 1 * MiB, 64 * MiB, 4},
    {ef::Collective::kScatter, "direct_scatter", 1, 4096, 64 * MiB, kNoLimit, 8},
};

/// Communicators spanning hosts (HostLayout::blocks(), at least 2 ranks per host): the rows
/// that apply before kTable's. A row applies when ranks per host >= min_per_host, nranks <=
/// max_ranks and bytes in [min_bytes, max_bytes). Why (the timing model over two DGX H100
/// joined by their 8 rails, 2 x 2, 2 x 4 and 2 x 8 ranks:
/// tests/runtime/multihost_selection_test.cc, docs/net.md "Selection across hosts"):
///  * a ring crosses the host boundary with the whole vector on one connection (2 (n-1)/n of
///    it each way through one NIC); the hierarchical programs reduce within the host first and
///    cross once per lane (local index), so each GPU's rail NIC carries 1/G of it: from 4 MiB
///    hierarchical_allreduce with 16 instances is 2.5-7x faster than the 32-instance ring;
///  * between 16 KiB and 4 MiB multilane_allreduce (one-hop phases inside the host, lanes on
///    channels of their own) beats both the ring and the hierarchical rings' latency;
///  * below 16 KiB, all-pairs: one network step instead of 2 (hosts - 1) + 2 (G - 1), up to 16
///    ranks (beyond, n - 1 messages per rank cost more than the steps);
///  * alltoall with 8 or more ranks per host: the two-step program (G times fewer, G times
///    larger messages between hosts) from 1 MiB; with 2 or 4 per host the direct one is as
///    fast or faster (2 x 4 ranks at 1 MiB: direct with 4 instances 28 us, two-step 32 us
///    in the model, which prices each link a transfer crosses, the relay's NVLink hop
///    included).
/// The other collectives keep kTable's rings, which cross each host boundary once when the
/// ranks of a host are contiguous.
struct MultiHostRow {
  ef::Collective collective;
  std::string_view algorithm;
  int32_t min_per_host, max_ranks;
  uint64_t min_bytes, max_bytes;
  int32_t instances, channels;
};

constexpr MultiHostRow kMultiHostTable[] = {
    {ef::Collective::kAllReduce, "allpairs_allreduce", 2, 16, 0, 16 * KiB, 1, 1},
    {ef::Collective::kAllReduce, "multilane_allreduce", 2, 4096, 0, 256 * KiB, 1, 4},
    {ef::Collective::kAllReduce, "multilane_allreduce", 2, 4096, 256 * KiB, 4 * MiB, 1, 16},
    {ef::Collective::kAllReduce, "hierarchical_allreduce", 2, 4096, 4 * MiB, kNoLimit, 16, 1},
    {ef::Collective::kAllToAll, "two_step_alltoall", 8, 4096, 1 * MiB, kNoLimit, 4, 1},
};

/// Point-to-point: channels and protocol per transfer by size (the first row whose min_bytes
/// the transfer reaches).
struct P2pRow {
  uint64_t min_bytes;
  int32_t channels;
  ef::Protocol protocol = kSimple;
};
// Send/recv: LL128 below 4 KiB (0.5-0.7 us faster than Simple per round under CUDA graphs on
// 2x H200, slower from 8 KiB). Channels: the fewest within ~5% of the fastest GPU time
// (sendrecv_perf -G 20, 4 KiB .. 128 MiB, 1-32 channels, 2x H200; docs/performance.md): one
// channel moves ~35 GB/s, 32 reach NCCL's 345 GB/s; from 128 KiB a transfer takes 32 (64 CTAs
// per GPU while it runs; NCCL_MAX_P2P_NCHANNELS bounds it), 16 between 16 and 64 MiB (within 5%
// of 32, half the connection memory). Slots shrink with the chunk (P2pRound::slot_bytes), so
// small transfers on many channels do not each hold full-size slots.
constexpr P2pRow kP2pTable[] = {{64 * MiB, 32}, {16 * MiB, 16}, {128 * KiB, 32}, {16 * KiB, 8},
                                {8 * KiB, 2},   {4 * KiB, 1},   {0, 1, kLL128}};

std::string describe_range(uint64_t lo, uint64_t hi) {
  const auto human = [](uint64_t b) {
    if (b >= MiB && b % MiB == 0) return std::to_string(b / MiB) + " MiB";
    if (b >= KiB && b % KiB == 0) return std::to_string(b / KiB) + " KiB";
    return std::to_string(b) + " B";
  };
  if (hi == kNoLimit) return "bytes >= " + human(lo);
  return human(lo) + " <= bytes < " + human(hi);
}

}  // namespace

BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes) {
  for (const Row& row : kTable) {
    if (row.collective != collective || nranks < row.min_ranks || nranks > row.max_ranks ||
        bytes < row.min_bytes || bytes >= row.max_bytes)
      continue;
    return {row.algorithm, row.instances, row.protocol,
            "tuning table: " + describe_range(row.min_bytes, row.max_bytes) + ", nranks " +
                std::to_string(row.min_ranks) + ".." + std::to_string(row.max_ranks) + " -> " +
                std::to_string(row.instances) + " instance(s), " +
                std::string(ef::to_string(row.protocol))};
  }
  return {};
}

BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts) {
  if (hosts.blocks() && hosts.hosts * hosts.ranks_per_host == nranks) {
    for (const MultiHostRow& row : kMultiHostTable) {
      if (row.collective != collective || hosts.ranks_per_host < row.min_per_host ||
          nranks > row.max_ranks || bytes < row.min_bytes || bytes >= row.max_bytes)
        continue;
      BuiltinChoice c;
      c.algorithm = row.algorithm;
      c.instances = row.instances;
      c.channels = row.channels;
      c.nodes = hosts.hosts;
      c.why = "tuning table across hosts (" + hosts.describe() +
              "): " + describe_range(row.min_bytes, row.max_bytes) + " -> " +
              std::to_string(row.instances) + " instance(s), " + std::to_string(row.channels) +
              " lane(s), Simple";
      return c;
    }
  }
  BuiltinChoice c = choose_builtin(collective, nranks, bytes);
  if (hosts.hosts > 1) c.why += " (" + hosts.describe() + ")";
  return c;
}

BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts, bool shared_launch) {
  // Ranks sharing one launch: allreduce, allgather, reduce-scatter, broadcast and reduce in one
  // pass per chunk over every rank's buffers (the memory bound; two-operand ops need up to 3n-4
  // reads and 2n-2 writes per chunk). One mrc op moves a few GB/s per CTA, so the CTAs (ranks x
  // lanes) grow with the size (the call's bytes as the tuning table counts them: allgather's
  // output, reduce-scatter's input): 128 from 4 MiB, 64 from 256 KiB, 16 from 16 KiB, one lane
  // per rank below (measured for allreduce, H100, 2 and 4 ranks: docs/performance.md, "Ranks
  // sharing one GPU"; checked for the other four on an H200 from 4 KiB to 16 MiB: within 1.12x
  // of the best count, docs/performance.md, "Units under 32 KiB"). Lanes beyond 32 instances
  // go to channels.
  constexpr int32_t kMaxSharedRanks = 16;  // ef::kMaxMultiOperands
  const char* shared = nullptr;
  switch (collective) {
    case ef::Collective::kAllReduce: shared = "shared_gpu_allreduce"; break;
    case ef::Collective::kAllGather: shared = "shared_gpu_allgather"; break;
    case ef::Collective::kReduceScatter: shared = "shared_gpu_reducescatter"; break;
    case ef::Collective::kBroadcast: shared = "shared_gpu_broadcast"; break;
    case ef::Collective::kReduce: shared = "shared_gpu_reduce"; break;
    default: break;
  }
  if (shared_launch && shared != nullptr && nranks >= 2 && nranks <= kMaxSharedRanks &&
      hosts.hosts <= 1) {
    const int32_t ctas = bytes >= 4 * MiB     ? 128
                         : bytes >= 256 * KiB ? 64
                         : bytes >= 16 * KiB  ? 16
                                              : nranks;
    const int32_t lanes = std::max(1, ctas / nranks);
    BuiltinChoice c;
    c.algorithm = shared;
    c.shared_launch = true;
    c.channels = (lanes + 31) / 32;
    c.instances = lanes / c.channels;
    c.why = "ranks sharing one launch (one process, one GPU): " + std::to_string(nranks) +
            " ranks, " + std::to_string(bytes) + " bytes -> " + std::to_string(c.instances) +
            " instance(s) x " + std::to_string(c.channels) + " lane(s) per rank, Simple";
    return c;
  }
  return choose_builtin(collective, nranks, bytes, hosts);
}

BuiltinChoice choose_builtin(ef::Collective collective, int32_t nranks, uint64_t bytes,
                             const HostLayout& hosts, bool shared_launch,
                             int32_t ranks_per_shared_gpu) {
  BuiltinChoice c = choose_builtin(collective, nranks, bytes, hosts, shared_launch);
  // Ranks of several processes on one GPU (two processes on an H200 under MPS, 4-256 MiB,
  // docs/performance.md): 64 CTAs per rank instead of 32 took a 64 MiB all_reduce from 99.3 to
  // 89.6 us with direct transfers between registered buffers and from 176.9 to 150.0 us
  // through the slots, all_gather and reduce_scatter 6-12% faster at 64 MiB; 96 and 128 CTAs
  // per rank gained nothing. Only two ranks per GPU were measured, so only they get it.
  const bool ring = c.algorithm == "ring_allreduce" || c.algorithm == "ring_allgather" ||
                    c.algorithm == "ring_reducescatter";
  if (!ring || c.shared_launch || ranks_per_shared_gpu != 2 || bytes < 4 * MiB ||
      hosts.hosts > 1 || c.instances * c.channels >= 64)
    return c;
  c.instances = 32;  // the library's bound per program
  c.channels = 2;
  c.why += "; ranks of several processes share each GPU, two on each: 32 instance(s) x 2 lane(s), "
           "128 CTAs per GPU";
  return c;
}

namespace {

constexpr int32_t kMaxP2pChannels = 64;  // NCCL's MAXCHANNELS

/// NCCL_MIN_P2P_NCHANNELS / NCCL_MAX_P2P_NCHANNELS (1..64 each): bounds on the table's channels
/// per transfer. A value that is not such a number is refused with a warning naming it.
int32_t p2p_channel_bound(const char* name, int32_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n < 1 || n > kMaxP2pChannels) {
    EFCCL_WARN(-1, std::string(name) + "='" + v + "' is not a number from 1 to " +
                       std::to_string(kMaxP2pChannels) + "; ignored (the tuning table decides)");
    return fallback;
  }
  return static_cast<int32_t>(n);
}

}  // namespace

std::pair<int32_t, int32_t> p2p_channel_bounds() {
  const int32_t lo = p2p_channel_bound("NCCL_MIN_P2P_NCHANNELS", 1);
  const int32_t hi = p2p_channel_bound("NCCL_MAX_P2P_NCHANNELS", kMaxP2pChannels);
  if (lo > hi) {
    EFCCL_WARN(-1, "NCCL_MIN_P2P_NCHANNELS=" + std::to_string(lo) +
                       " exceeds NCCL_MAX_P2P_NCHANNELS=" + std::to_string(hi) + "; using " +
                       std::to_string(hi) + " for both");
    return {hi, hi};
  }
  return {lo, hi};
}

int32_t p2p_channels(uint64_t bytes) {
  static const std::pair<int32_t, int32_t> bounds = p2p_channel_bounds();
  return p2p_channels(bytes, bounds);
}

int32_t p2p_channels(uint64_t bytes, std::pair<int32_t, int32_t> bounds) {
  int32_t channels = 1;
  for (const P2pRow& row : kP2pTable)
    if (bytes >= row.min_bytes) {
      channels = row.channels;
      break;
    }
  return std::clamp(channels, bounds.first, bounds.second);
}

ef::Protocol p2p_protocol(uint64_t bytes) {
  for (const P2pRow& row : kP2pTable)
    if (bytes >= row.min_bytes) return row.protocol;
  return kSimple;
}

}  // namespace efccl::runtime
