// Balanced transfers as one EF program (efccl/balance/program_builder.h).
//
// 1. Every share's (sender, receiver, route) is a lane; lanes are numbered in first use.
// 2. Each lane gets its channels: the smallest channels free on every connection of its route
//    (a connection is (sender, receiver, channel) and belongs to one lane), so every
//    threadblock serves one lane and the program cannot deadlock: each lane is a chain of
//    threadblocks, sender -> forwarding ranks -> receiver, each op matched in FIFO order.
// 3. Shares are cut over their lane's channels (contiguous runs, the first channels taking
//    one chunk more) and emitted in transfer order: a send on the sender, an rcs per piece on
//    every forwarding rank, a receive on the receiver.
#include "efccl/balance/program_builder.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "efccl/ef/validate.h"

namespace efccl::balance {
namespace {

constexpr int32_t kMaxRanks = 4096;
constexpr int32_t kMaxChannels = 1024;

/// A share's route with the transfer's ends: the stops from sender to receiver.
struct Lane {
  int32_t sender = 0, receiver = 0;
  Route route;
  int32_t channels = 1;
  std::vector<int32_t> channel_ids;  ///< the channels it was given, ascending
  std::vector<int32_t> stops() const {
    std::vector<int32_t> s = {sender};
    for (const RouteHop& h : route.hops) s.push_back(h.to < 0 ? receiver : h.to);
    return s;
  }
};

std::string transfer_name(std::size_t i, const ProgramTransfer& t) {
  return "transfer " + std::to_string(i) + " (rank " + std::to_string(t.sender) + " -> rank " +
         std::to_string(t.receiver) + ")";
}

/// Checks a transfer and its routes; normalises an empty route or share list to direct.
Status check_transfer(std::size_t i, ProgramTransfer& t, const ProgramBuildOptions& o) {
  const std::string name = transfer_name(i, t);
  const auto rank_ok = [&](int32_t r) { return r >= 0 && r < o.nranks; };
  if (!rank_ok(t.sender) || !rank_ok(t.receiver))
    return Status::error(name + ": ranks must be 0.." + std::to_string(o.nranks - 1));
  if (t.chunks < 0 || t.src_chunk < 0 || t.dst_chunk < 0 || t.chunks > ef::kMaxChunks ||
      t.src_chunk > ef::kMaxChunks - t.chunks || t.dst_chunk > ef::kMaxChunks - t.chunks)
    return Status::error(name + ": chunks " + std::to_string(t.src_chunk) + " / " +
                         std::to_string(t.dst_chunk) + " + " + std::to_string(t.chunks) +
                         " must be non-negative and end within 2^24 chunks");
  if (t.shares.empty() && t.chunks > 0) t.shares.push_back({Route::direct(), t.chunks, 0});
  int64_t total = 0;
  for (RouteShare& s : t.shares) {
    if (s.chunks < 0 || s.channels < 0 || s.channels > kMaxChannels)
      return Status::error(name + ": a share has " + std::to_string(s.chunks) + " chunks and " +
                           std::to_string(s.channels) + " channels; expected >= 0 and <= 1024");
    total += s.chunks;
    if (total > t.chunks) break;
    if (s.route.hops.empty()) s.route = Route::direct();
    if (s.route.hops.back().to != -1)
      return Status::error(name + ": a route's last hop must reach the receiver (to = -1)");
    std::set<int32_t> seen = {t.sender, t.receiver};
    for (std::size_t h = 0; h < s.route.hops.size(); ++h) {
      const RouteHop& hop = s.route.hops[h];
      if (h + 1 < s.route.hops.size() && (!rank_ok(hop.to) || !seen.insert(hop.to).second))
        return Status::error(name + ": hop " + std::to_string(h) + " forwards through rank " +
                             std::to_string(hop.to) +
                             "; expected a rank of the program other than the route's ends and "
                             "its other hops");
      if (hop.slots == ef::SlotLocation::kDevice ? hop.device < 0 || hop.device >= o.slot_devices
                                                 : hop.device != 0)
        return Status::error(name + ": hop " + std::to_string(h) + " names slot device " +
                             std::to_string(hop.device) + " with slots at the " +
                             std::string(ef::to_string(hop.slots)) + "; the program has " +
                             std::to_string(o.slot_devices) + " slot devices");
      if (hop.slots != ef::SlotLocation::kReceiver && hop.slots != ef::SlotLocation::kHost &&
          hop.slots != ef::SlotLocation::kDevice)
        return Status::error(name + ": hop " + std::to_string(h) + " has an unknown slot location");
    }
    if (t.sender == t.receiver && s.chunks > 0 && s.route != Route::direct())
      return Status::error(name + ": a copy within one rank takes the direct route only");
  }
  if (total != t.chunks)
    return Status::error(name + ": its shares carry " + std::to_string(total) +
                         " chunks; expected " + std::to_string(t.chunks));
  return Status::ok();
}

ef::Op make_op(ef::OpCode code, std::optional<ef::BufferRef> src, std::optional<ef::BufferRef> dst,
               int64_t count) {
  ef::Op op;
  op.code = code;
  op.src = src;
  op.dst = dst;
  op.count = count;
  return op;
}

/// The program under construction: threadblocks by (rank, recv peer, send peer, channel).
class Builder {
 public:
  Builder(const ProgramBuildOptions& o) : options_(o) {
    p_.name = o.name;
    p_.collective = ef::Collective::kCustom;
    p_.protocol = o.protocol;
    p_.nranks = o.nranks;
    p_.nchunksperloop = 1;
    p_.inplace = false;
    p_.outofplace = true;
    p_.slot_devices = o.slot_devices;
    p_.ranks.resize(static_cast<std::size_t>(o.nranks));
  }

  /// Gives `lane` its channels: the smallest ones free on every connection of its route.
  Status allocate(Lane& lane) {
    const std::vector<int32_t> stops = lane.stops();
    for (int32_t c = 0; static_cast<int32_t>(lane.channel_ids.size()) < lane.channels; ++c) {
      if (c >= kMaxChannels)
        return Status::error("rank " + std::to_string(lane.sender) + " -> rank " +
                             std::to_string(lane.receiver) + " needs more than 1024 channels");
      bool free = true;
      for (std::size_t k = 0; k + 1 < stops.size() && free; ++k)
        free = !used_.contains({stops[k], stops[k + 1], c});
      if (!free) continue;
      for (std::size_t k = 0; k + 1 < stops.size(); ++k) {
        used_.insert({stops[k], stops[k + 1], c});
        const RouteHop& hop = lane.route.hops[k];
        if (hop.slots != ef::SlotLocation::kReceiver)
          p_.placements.push_back({stops[k], stops[k + 1], c, hop.slots, hop.device});
      }
      lane.channel_ids.push_back(c);
      p_.nchannels = std::max(p_.nchannels, c + 1);
    }
    return Status::ok();
  }

  /// Chunks [src, src + n) of the sender to [dst, dst + n) of the receiver on one channel.
  void emit(const Lane& lane, int32_t channel, int64_t src, int64_t dst, int64_t n) {
    const std::vector<int32_t> stops = lane.stops();
    if (stops.size() == 2) {  // one connection: one op each side
      tb(stops[0], -1, stops[1], channel)
          .ops.push_back(make_op(ef::OpCode::kSend, ef::BufferRef{ef::BufferKind::kInput, src},
                                 std::nullopt, n));
      tb(stops[1], stops[0], -1, channel)
          .ops.push_back(make_op(ef::OpCode::kRecv, std::nullopt,
                                 ef::BufferRef{ef::BufferKind::kOutput, dst}, n));
      return;
    }
    for (int64_t off = 0; off < n; off += options_.forward_op_chunks) {
      const int64_t q = std::min(options_.forward_op_chunks, n - off);
      tb(stops[0], -1, stops[1], channel)
          .ops.push_back(make_op(ef::OpCode::kSend,
                                 ef::BufferRef{ef::BufferKind::kInput, src + off}, std::nullopt,
                                 q));
      for (std::size_t k = 1; k + 1 < stops.size(); ++k) {
        const int64_t scratch = forward_scratch(stops[k], stops[k - 1], stops[k + 1], channel);
        tb(stops[k], stops[k - 1], stops[k + 1], channel)
            .ops.push_back(make_op(ef::OpCode::kRecvCopySend, std::nullopt,
                                   ef::BufferRef{ef::BufferKind::kScratch, scratch}, q));
      }
      tb(stops.back(), stops[stops.size() - 2], -1, channel)
          .ops.push_back(make_op(ef::OpCode::kRecv, std::nullopt,
                                 ef::BufferRef{ef::BufferKind::kOutput, dst + off}, q));
    }
  }

  void copy(int32_t rank, int64_t src, int64_t dst, int64_t n) {
    tb(rank, -1, -1, 0)
        .ops.push_back(make_op(ef::OpCode::kCopy, ef::BufferRef{ef::BufferKind::kInput, src},
                               ef::BufferRef{ef::BufferKind::kOutput, dst}, n));
  }

  void transfer(const ProgramTransfer& t) {
    ef::Rank& s = p_.ranks[static_cast<std::size_t>(t.sender)];
    ef::Rank& r = p_.ranks[static_cast<std::size_t>(t.receiver)];
    s.input_chunks = std::max(s.input_chunks, t.src_chunk + t.chunks);
    r.output_chunks = std::max(r.output_chunks, t.dst_chunk + t.chunks);
    for (int64_t i = 0; i < t.chunks; ++i)
      p_.postconditions.push_back({t.receiver, t.dst_chunk + i, {{t.sender, t.src_chunk + i}}});
  }

  ef::Program finish() {
    std::sort(p_.placements.begin(), p_.placements.end(),
              [](const ef::ConnectionPlacement& a, const ef::ConnectionPlacement& b) {
                return std::tie(a.sender, a.receiver, a.channel) <
                       std::tie(b.sender, b.receiver, b.channel);
              });
    return std::move(p_);
  }

 private:
  ef::Threadblock& tb(int32_t rank, int32_t recv_peer, int32_t send_peer, int32_t channel) {
    auto& tbs = p_.ranks[static_cast<std::size_t>(rank)].threadblocks;
    auto [it, fresh] =
        tb_of_.emplace(std::make_tuple(rank, recv_peer, send_peer, channel), tbs.size());
    if (fresh) {
      ef::Threadblock t;
      t.recv_peer = recv_peer;
      t.send_peer = send_peer;
      t.channel = channel;
      tbs.push_back(std::move(t));
    }
    return tbs[it->second];
  }

  /// The scratch region of a forwarding threadblock (allocated on first use).
  int64_t forward_scratch(int32_t rank, int32_t from, int32_t to, int32_t channel) {
    auto [it, fresh] = scratch_of_.emplace(std::make_tuple(rank, from, to, channel), 0);
    if (fresh) {
      ef::Rank& r = p_.ranks[static_cast<std::size_t>(rank)];
      it->second = r.scratch_chunks;
      r.scratch_chunks += options_.forward_op_chunks;
    }
    return it->second;
  }

  const ProgramBuildOptions& options_;
  ef::Program p_;
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, std::size_t> tb_of_;
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, int64_t> scratch_of_;
  std::set<std::tuple<int32_t, int32_t, int32_t>> used_;  ///< connections given to a lane
};

}  // namespace

StatusOr<ef::Program> build_program(std::span<const ProgramTransfer> given,
                                    const ProgramBuildOptions& options) {
  if (options.nranks < 1 || options.nranks > kMaxRanks)
    return Status::error("nranks is " + std::to_string(options.nranks) + "; expected 1..4096");
  if (options.slot_devices < 0 || options.slot_devices > ef::kMaxSlotDevices)
    return Status::error("slot_devices is " + std::to_string(options.slot_devices) +
                         "; expected 0..64");
  if (options.channels_per_share < 1 || options.channels_per_share > kMaxChannels ||
      options.forward_op_chunks < 1 || options.forward_op_chunks > ef::kMaxChunks)
    return Status::error(
        "channels_per_share (1..1024) and forward_op_chunks (1..2^24) must be "
        "positive");
  std::vector<ProgramTransfer> transfers(given.begin(), given.end());
  for (std::size_t i = 0; i < transfers.size(); ++i)
    if (Status s = check_transfer(i, transfers[i], options); !s) return s;
  // Destinations of one receiver must not overlap: each output chunk has one source.
  std::map<int32_t, std::vector<std::pair<int64_t, std::size_t>>> by_receiver;
  for (std::size_t i = 0; i < transfers.size(); ++i)
    if (transfers[i].chunks > 0)
      by_receiver[transfers[i].receiver].emplace_back(transfers[i].dst_chunk, i);
  for (auto& [receiver, starts] : by_receiver) {
    std::sort(starts.begin(), starts.end());
    for (std::size_t k = 1; k < starts.size(); ++k) {
      const ProgramTransfer& prev = transfers[starts[k - 1].second];
      if (prev.dst_chunk + prev.chunks > starts[k].first)
        return Status::error(transfer_name(starts[k].second, transfers[starts[k].second]) +
                             " writes output chunks of rank " + std::to_string(receiver) +
                             " that " + transfer_name(starts[k - 1].second, prev) + " writes too");
    }
  }

  // Lanes in first use, each as wide as its widest share.
  std::map<std::tuple<int32_t, int32_t, Route>, std::size_t> lane_of;
  std::vector<Lane> lanes;
  for (const ProgramTransfer& t : transfers) {
    if (t.sender == t.receiver) continue;
    for (const RouteShare& s : t.shares) {
      if (s.chunks == 0) continue;
      auto [it, fresh] =
          lane_of.emplace(std::make_tuple(t.sender, t.receiver, s.route), lanes.size());
      if (fresh) lanes.push_back({t.sender, t.receiver, s.route, 1, {}});
      const int32_t want = s.channels > 0 ? s.channels : options.channels_per_share;
      Lane& lane = lanes[it->second];
      lane.channels =
          std::max<int32_t>(lane.channels, static_cast<int32_t>(std::min<int64_t>(want, s.chunks)));
    }
  }
  Builder b(options);
  for (Lane& lane : lanes)
    if (Status s = b.allocate(lane); !s) return s;
  for (const ProgramTransfer& t : transfers) {
    if (t.chunks == 0) continue;
    b.transfer(t);
    if (t.sender == t.receiver) {
      b.copy(t.sender, t.src_chunk, t.dst_chunk, t.chunks);
      continue;
    }
    int64_t first = 0;  // the share's first chunk within the transfer
    for (const RouteShare& s : t.shares) {
      if (s.chunks == 0) continue;
      const Lane& lane = lanes[lane_of.at(std::make_tuple(t.sender, t.receiver, s.route))];
      const int32_t want = s.channels > 0 ? s.channels : options.channels_per_share;
      const auto k =
          static_cast<int64_t>(std::min<int64_t>(std::min<int64_t>(want, s.chunks), lane.channels));
      const int64_t base = s.chunks / k, extra = s.chunks % k;
      int64_t off = first;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t n = base + (j < extra ? 1 : 0);
        b.emit(lane, lane.channel_ids[static_cast<std::size_t>(j)], t.src_chunk + off,
               t.dst_chunk + off, n);
        off += n;
      }
      first += s.chunks;
    }
  }
  return b.finish();
}

}  // namespace efccl::balance
