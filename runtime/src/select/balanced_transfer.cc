#include "select/balanced_transfer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <map>

#include "efccl/common/hash.h"
#include "efccl/ef/json_io.h"
#include "efccl/ef/validate.h"

namespace efccl::runtime {
namespace {

/// Chunks of at least this many bytes; a transfer of fewer than two is not split.
constexpr uint64_t kMinChunkBytes = uint64_t{16} << 10;
/// Chunks per transfer below kLargeBytes; above, 64 * 2^k so that chunks stay 1-2 MiB (a
/// forwarding threadblock's scratch is two chunks) and programs repeat across sizes.
constexpr int64_t kChunksPerTransfer = 64;
constexpr uint64_t kLargeBytes = uint64_t{64} << 20;
constexpr int64_t kMaxChunksPerTransfer = int64_t{1} << 16;
/// A share's channels: its candidate's bottleneck / what one threadblock moves, at most this.
constexpr double kThreadblockGbps = 25.0;
constexpr int32_t kMaxChannelsPerShare = 16;
/// The host path's channels, at most: its connections live in pinned host memory (across
/// processes in /dev/shm), 8 slots each; two carry PCIe's rate in the timing model.
constexpr int32_t kMaxHostChannels = 2;
/// Connection slots of a balanced program: as a send/receive round's (its chunk rounded up to
/// a power of two, 32-512 KiB), halved while the program's connections would hold more.
constexpr std::size_t kMinSlotBytes = std::size_t{32} << 10;
constexpr std::size_t kMaxSlotBytes = std::size_t{512} << 10;
constexpr std::size_t kMaxConnectionBytes = std::size_t{64} << 20;
constexpr int64_t kForwardOpChunks = 2;

/// Merges shares on equal candidates and sorts them.
std::vector<balance::PathShare> merged(std::vector<balance::PathShare> shares) {
  std::map<uint32_t, uint64_t> by;
  for (const balance::PathShare& s : shares)
    if (s.bytes > 0) by[s.candidate] += s.bytes;
  std::vector<balance::PathShare> out;
  for (const auto& [c, b] : by) out.push_back({c, b});
  return out;
}

std::string node_name(const balance::Candidate& c) {
  // "relay h0.gpu2": the GPU's id is the rest of `via`.
  const std::string prefix = "relay ";
  return c.via.rfind(prefix, 0) == 0 ? c.via.substr(prefix.size()) : c.via;
}

}  // namespace

bool candidate_usable(const balance::Candidate& c, const RelayResolution& relays) {
  switch (c.kind) {
    case balance::CandidateKind::kLocal:
    case balance::CandidateKind::kDirect:
      return true;
    case balance::CandidateKind::kHost:
      return relays.host_usable;
    case balance::CandidateKind::kRelay: {
      if (c.relays.size() != 1) return false;
      const topo::NodeIndex gpu = c.relays.front();
      if (relays.forwarder && relays.forwarder(gpu) >= 0) return true;
      return relays.slot_device_usable && relays.slot_device_usable(gpu);
    }
    case balance::CandidateKind::kRail:  // two relays on two hosts: not run yet
      return false;
  }
  return false;
}

balance::PairPlan usable_shares(const balance::PairPlan& pair, const RelayResolution& relays) {
  balance::PairPlan out = pair;
  out.paths.clear();
  for (const balance::PathShare& s : pair.paths) {
    const bool ok = s.candidate < pair.candidates->size() &&
                    candidate_usable((*pair.candidates)[s.candidate], relays);
    out.paths.push_back({ok ? s.candidate : 0u, s.bytes});
  }
  out.paths = merged(std::move(out.paths));
  return out;
}

balance::PairPlan spread_over_candidates(const balance::PairPlan& pair,
                                         const RelayResolution& relays) {
  balance::PairPlan out = pair;
  std::vector<uint32_t> usable;
  for (uint32_t c = 0; c < pair.candidates->size(); ++c)
    if (candidate_usable((*pair.candidates)[c], relays)) usable.push_back(c);
  if (usable.empty()) usable.push_back(0);
  const uint64_t each = pair.bytes / usable.size();
  out.paths.clear();
  for (uint32_t c : usable) out.paths.push_back({c, each});
  out.paths.push_back({0, pair.bytes - each * usable.size()});
  out.paths = merged(std::move(out.paths));
  return out;
}

TransferChunks chunks_of(uint64_t bytes) {
  TransferChunks t;
  if (bytes < kLargeBytes) {
    t.chunks = static_cast<int64_t>(std::min<uint64_t>(kChunksPerTransfer, bytes / kMinChunkBytes));
  } else {
    t.chunks = std::min<int64_t>(
        kMaxChunksPerTransfer,
        kChunksPerTransfer * static_cast<int64_t>(std::bit_floor(bytes / kLargeBytes)));
  }
  if (t.chunks < 2) return {};
  t.chunk_bytes = bytes / static_cast<uint64_t>(t.chunks);
  t.chunk_bytes &= ~uint64_t{255};  // whole 256-byte lines (chunks are >= 16 KiB)
  return t;
}

StatusOr<std::optional<BalancedTransfer>> build_balanced_transfer(int32_t sender, int32_t receiver,
                                                                  uint64_t bytes,
                                                                  const balance::PairPlan& pair,
                                                                  const RelayResolution& relays) {
  const TransferChunks cut = chunks_of(bytes);
  if (cut.chunks == 0 || pair.bytes == 0) return std::optional<BalancedTransfer>();
  const auto k = static_cast<uint64_t>(cut.chunks);

  // Whole chunks per share, in the pair's proportions: floors, then the chunks left over to
  // the largest remainders (ties: the lower candidate).
  struct Part {
    uint32_t candidate;
    uint64_t chunks;
    unsigned __int128 remainder;
  };
  std::vector<Part> parts;
  uint64_t given = 0;
  for (const balance::PathShare& s : merged(pair.paths)) {
    const unsigned __int128 scaled = static_cast<unsigned __int128>(s.bytes) * k;
    parts.push_back({s.candidate, static_cast<uint64_t>(scaled / pair.bytes), scaled % pair.bytes});
    given += parts.back().chunks;
  }
  std::vector<std::size_t> order(parts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return parts[a].remainder > parts[b].remainder;
  });
  for (std::size_t i = 0; given < k && i < order.size(); ++i, ++given) ++parts[order[i]].chunks;
  std::erase_if(parts, [](const Part& p) { return p.chunks == 0; });
  if (parts.empty() || (parts.size() == 1 && parts.front().candidate == 0))
    return std::optional<BalancedTransfer>();

  BalancedTransfer t;
  t.ranks = {sender, receiver};
  t.chunk_bytes = cut.chunk_bytes;
  t.chunks = cut.chunks;
  t.main_bytes = cut.chunk_bytes * k;
  t.candidates = pair.candidates;
  balance::ProgramTransfer transfer{.sender = 0,
                                    .receiver = 1,
                                    .src_chunk = 0,
                                    .dst_chunk = 0,
                                    .chunks = cut.chunks,
                                    .shares = {}};
  for (const Part& p : parts) {
    if (p.candidate >= pair.candidates->size())
      return Status::error("the plan of ranks " + std::to_string(sender) + " -> " +
                           std::to_string(receiver) + " names candidate " +
                           std::to_string(p.candidate) + " of " +
                           std::to_string(pair.candidates->size()));
    const balance::Candidate& c = (*pair.candidates)[p.candidate];
    if (!candidate_usable(c, relays))
      return Status::error("ranks " + std::to_string(sender) + " -> " + std::to_string(receiver) +
                           ": candidate '" + c.via + "' cannot be run here");
    BalancedTransfer::Share share;
    share.candidate = p.candidate;
    share.chunks = static_cast<int64_t>(p.chunks);
    switch (c.kind) {
      case balance::CandidateKind::kHost:
        share.route = balance::Route::host();
        share.text = "host memory";
        break;
      case balance::CandidateKind::kRelay: {
        const topo::NodeIndex gpu = c.relays.front();
        const int32_t forwarder = relays.forwarder ? relays.forwarder(gpu) : -1;
        if (forwarder >= 0) {
          auto at = std::find(t.ranks.begin(), t.ranks.end(), forwarder);
          if (at == t.ranks.end()) at = t.ranks.insert(t.ranks.end(), forwarder);
          share.route = balance::Route::forward(static_cast<int32_t>(at - t.ranks.begin()));
          share.text =
              "relay " + node_name(c) + " (forwarded by rank " + std::to_string(forwarder) + ")";
        } else {
          auto at = std::find(t.slot_device_gpus.begin(), t.slot_device_gpus.end(), gpu);
          if (at == t.slot_device_gpus.end())
            at = t.slot_device_gpus.insert(t.slot_device_gpus.end(), gpu);
          share.route =
              balance::Route::slot_device(static_cast<int32_t>(at - t.slot_device_gpus.begin()));
          share.text = "relay " + node_name(c) + " (slots on it, no kernel there)";
        }
        break;
      }
      default:
        share.route = balance::Route::direct();
        share.text = c.via;
        break;
    }
    const double wanted = c.gbps / kThreadblockGbps;
    int32_t channels =
        wanted > 1 ? static_cast<int32_t>(std::min<double>(kMaxChannelsPerShare, std::ceil(wanted)))
                   : 1;
    if (c.kind == balance::CandidateKind::kHost) channels = std::min(channels, kMaxHostChannels);
    channels = static_cast<int32_t>(std::min<int64_t>(channels, share.chunks));
    share.channels = channels;
    transfer.shares.push_back({share.route, share.chunks, channels});
    t.shares.push_back(std::move(share));
  }
  balance::ProgramBuildOptions options;
  options.nranks = static_cast<int32_t>(t.ranks.size());
  options.slot_devices = static_cast<int32_t>(t.slot_device_gpus.size());
  options.protocol = ef::Protocol::kSimple;
  options.forward_op_chunks = kForwardOpChunks;
  options.name = "balanced p2p";
  StatusOr<ef::Program> program = balance::build_program({&transfer, 1}, options);
  if (!program)
    return Status::error("ranks " + std::to_string(sender) + " -> " + std::to_string(receiver) +
                         ": " + program.status().message());
  t.program = std::move(*program);

  std::size_t connections = 0;
  for (const ef::Rank& r : t.program.ranks)
    for (const ef::Threadblock& tb : r.threadblocks)
      if (tb.send_peer >= 0) ++connections;
  t.slot_bytes = std::clamp<std::size_t>(std::bit_ceil(static_cast<std::size_t>(cut.chunk_bytes)),
                                         kMinSlotBytes, kMaxSlotBytes);
  while (t.slot_bytes > kMinSlotBytes &&
         connections * ef::kDefaultConnectionSlots * t.slot_bytes > kMaxConnectionBytes)
    t.slot_bytes /= 2;

  const std::string json = ef::save_json(t.program);
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash64(json)));
  t.signature = "bal:" + std::string(hex) + ":" + std::to_string(json.size()) + ":slot" +
                std::to_string(t.slot_bytes);
  return std::optional<BalancedTransfer>(std::move(t));
}

}  // namespace efccl::runtime
