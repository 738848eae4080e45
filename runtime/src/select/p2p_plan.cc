#include "select/p2p_plan.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "efccl/device/device_executor.h"

namespace efccl::runtime {
namespace {

/// A rank's buffer of a round may span at most this many chunks (bounds program size).
constexpr uint64_t kMaxSpanChunks = 4096;

/// The smallest connection slot of a Simple round (P2pRound::slot_bytes).
constexpr std::size_t kMinSimpleSlotBytes = std::size_t{32} << 10;

/// One direction (send or receive) of one rank in a round: the base pointer and used chunks.
struct Side {
  uintptr_t base = 0;
  bool used = false;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  ///< [first, last] chunks (receive side)

  /// The chunk index of `ptr` if it fits this side's layout.
  std::optional<uint64_t> place(uintptr_t ptr, uint64_t chunk_bytes, int32_t chunks,
                                bool exclusive) const {
    if (!used) return 0;
    if (ptr < base || (ptr - base) % chunk_bytes != 0) return std::nullopt;
    const uint64_t first = (ptr - base) / chunk_bytes;
    if (first + static_cast<uint64_t>(chunks) > kMaxSpanChunks) return std::nullopt;
    const uint64_t last = first + static_cast<uint64_t>(chunks) - 1;
    if (exclusive)
      for (const auto& [a, b] : ranges)
        if (first <= b && a <= last) return std::nullopt;  // overlapping receives: keep apart
    return first;
  }
};

struct PlacedTransfer {
  Transfer t;
  uint64_t src_chunk = 0;
  uint64_t dst_chunk = 0;
};

struct RoundBuilder {
  uint64_t bytes = 0;
  int32_t channels = 1;
  ef::Protocol protocol = ef::Protocol::kSimple;
  std::map<int32_t, Side> send_sides, recv_sides;
  std::vector<PlacedTransfer> placed;

  bool try_add(const Transfer& t) {
    const uint64_t chunk = bytes / static_cast<uint64_t>(channels);
    Side& s = send_sides[t.sender];
    Side& r = recv_sides[t.receiver];
    const auto si = s.place(reinterpret_cast<uintptr_t>(t.src), chunk, channels, false);
    const auto ri = r.place(reinterpret_cast<uintptr_t>(t.dst), chunk, channels, true);
    if (!si || !ri) return false;
    for (auto [side, ptr] : {std::pair<Side*, uintptr_t>{&s, reinterpret_cast<uintptr_t>(t.src)},
                             {&r, reinterpret_cast<uintptr_t>(t.dst)}}) {
      if (!side->used) {
        side->used = true;
        side->base = ptr;
      }
    }
    r.ranges.emplace_back(*ri, *ri + static_cast<uint64_t>(channels) - 1);
    placed.push_back({t, *si, *ri});
    return true;
  }

  /// The round's layout and signature; the program itself comes from build_p2p_program.
  P2pRound plan() const {
    P2pRound round;
    round.chunk_bytes = bytes / static_cast<uint64_t>(channels);
    round.channels = channels;
    round.protocol = protocol;
    std::vector<int32_t> ranks;
    for (const auto& pt : placed) {
      ranks.push_back(pt.t.sender);
      ranks.push_back(pt.t.receiver);
    }
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    const auto index_of = [&](int32_t r) {
      return static_cast<int32_t>(std::lower_bound(ranks.begin(), ranks.end(), r) - ranks.begin());
    };
    const auto n = static_cast<int32_t>(ranks.size());
    round.ranks = ranks;
    round.inputs.assign(static_cast<std::size_t>(n), nullptr);
    round.outputs.assign(static_cast<std::size_t>(n), nullptr);

    if (protocol == ef::Protocol::kSimple)
      round.slot_bytes =
          std::clamp<std::size_t>(std::bit_ceil(round.chunk_bytes), kMinSimpleSlotBytes,
                                  device::default_slot_bytes(protocol));
    std::string& sig = round.signature;
    sig = "p2p:" + std::to_string(n) + ":" + std::to_string(channels) + ":" +
          std::string(ef::to_string(protocol));
    if (round.slot_bytes != 0) sig += ":slot" + std::to_string(round.slot_bytes);
    for (int32_t r : ranks) sig += ":" + std::to_string(r);
    round.placements.reserve(placed.size());
    for (const auto& pt : placed) {
      const int32_t s = index_of(pt.t.sender);
      const int32_t d = index_of(pt.t.receiver);
      sig += "|" + std::to_string(s) + ">" + std::to_string(d) + "@" +
             std::to_string(pt.src_chunk) + ">" + std::to_string(pt.dst_chunk);
      round.placements.push_back({s, d, pt.src_chunk, pt.dst_chunk});
    }
    for (const auto& [rank, side] : send_sides)
      if (side.used)
        round.inputs[static_cast<std::size_t>(index_of(rank))] =
            reinterpret_cast<const void*>(side.base);
    for (const auto& [rank, side] : recv_sides)
      if (side.used)
        round.outputs[static_cast<std::size_t>(index_of(rank))] =
            reinterpret_cast<void*>(side.base);
    return round;
  }
};

}  // namespace

void build_p2p_program(P2pRound& round) {
  const int32_t channels = round.channels;
  const auto n = static_cast<int32_t>(round.ranks.size());
  ef::Program& p = round.program;
  p = ef::Program{};
  p.name = "p2p";
  p.collective = ef::Collective::kCustom;
  p.nranks = n;
  p.nchunksperloop = 1;
  p.nchannels = channels;
  p.protocol = round.protocol;
  p.inplace = false;
  p.outofplace = true;
  p.ranks.resize(static_cast<std::size_t>(n));

  // Threadblock of (rank, peer, channel, direction), created on first use; ops in transfer
  // order on both sides, so the k-th send matches the k-th receive.
  std::map<std::tuple<int32_t, int32_t, int32_t, bool>, std::size_t> tb_of;
  const auto tb = [&](int32_t rank, int32_t peer, int32_t channel, bool send) -> ef::Threadblock& {
    auto& tbs = p.ranks[static_cast<std::size_t>(rank)].threadblocks;
    auto [it, fresh] = tb_of.emplace(std::make_tuple(rank, peer, channel, send), tbs.size());
    if (fresh) {
      ef::Threadblock t;
      (send ? t.send_peer : t.recv_peer) = peer;
      t.channel = channel;
      tbs.push_back(std::move(t));
    }
    return tbs[it->second];
  };
  for (const P2pPlacement& pt : round.placements) {
    const int32_t s = pt.sender, d = pt.receiver;
    ef::Rank& sr = p.ranks[static_cast<std::size_t>(s)];
    ef::Rank& dr = p.ranks[static_cast<std::size_t>(d)];
    sr.input_chunks =
        std::max<int64_t>(sr.input_chunks, static_cast<int64_t>(pt.src_chunk) + channels);
    dr.output_chunks =
        std::max<int64_t>(dr.output_chunks, static_cast<int64_t>(pt.dst_chunk) + channels);
    for (int32_t c = 0; c < channels; ++c) {
      ef::Op send;
      send.code = ef::OpCode::kSend;
      send.src = ef::BufferRef{ef::BufferKind::kInput, static_cast<int64_t>(pt.src_chunk) + c};
      tb(s, d, c, true).ops.push_back(send);
      ef::Op recv;
      recv.code = ef::OpCode::kRecv;
      recv.dst = ef::BufferRef{ef::BufferKind::kOutput, static_cast<int64_t>(pt.dst_chunk) + c};
      tb(d, s, c, false).ops.push_back(recv);
      ef::Postcondition post;
      post.rank = d;
      post.index = static_cast<int64_t>(pt.dst_chunk) + c;
      post.sources.push_back({s, static_cast<int64_t>(pt.src_chunk) + c});
      p.postconditions.push_back(std::move(post));
    }
  }
}

std::vector<P2pRound> plan_p2p_rounds(
    std::vector<Transfer> transfers, int32_t (*channels_for)(uint64_t bytes),
    const std::function<ef::Protocol(uint64_t bytes)>& protocol_for, bool build_programs) {
  // Lowest pointers first, so that each round's base is its lowest buffer.
  std::stable_sort(transfers.begin(), transfers.end(), [](const Transfer& a, const Transfer& b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.src != b.src) return std::less<const void*>()(a.src, b.src);
    return std::less<const void*>()(a.dst, b.dst);
  });
  std::vector<RoundBuilder> builders;
  for (const Transfer& t : transfers) {
    if (t.bytes == 0) continue;
    bool added = false;
    for (RoundBuilder& b : builders) {
      if (b.bytes == t.bytes && b.try_add(t)) {
        added = true;
        break;
      }
    }
    if (added) continue;
    RoundBuilder b;
    b.bytes = t.bytes;
    b.channels = std::max<int32_t>(1, channels_for(t.bytes));
    if (protocol_for) b.protocol = protocol_for(t.bytes);
    while (b.channels > 1 && t.bytes % static_cast<uint64_t>(b.channels) != 0) --b.channels;
    b.try_add(t);  // always fits an empty round
    builders.push_back(std::move(b));
  }
  std::vector<P2pRound> rounds;
  rounds.reserve(builders.size());
  for (const RoundBuilder& b : builders) {
    rounds.push_back(b.plan());
    if (build_programs) build_p2p_program(rounds.back());
  }
  return rounds;
}

PairRounds plan_pair_rounds(int32_t a, int32_t b, uint64_t bytes_ab, uint64_t bytes_ba,
                            int32_t (*channels_for)(uint64_t bytes),
                            const std::function<ef::Protocol(uint64_t bytes)>& protocol_for) {
  // Stand-in addresses in a fixed order: every process plans the same rounds (each side has
  // one buffer, at chunk 0).
  static char stand_in[4];
  std::vector<Transfer> transfers;
  if (bytes_ab > 0) transfers.push_back({a, b, &stand_in[0], &stand_in[1], bytes_ab});
  if (bytes_ba > 0) transfers.push_back({b, a, &stand_in[2], &stand_in[3], bytes_ba});
  const auto slot = [](const void* p) {
    for (int i = 0; i < 4; ++i)
      if (p == &stand_in[i]) return i;
    return -1;
  };
  PairRounds out;
  out.rounds = plan_p2p_rounds(std::move(transfers), channels_for, protocol_for);
  for (const P2pRound& round : out.rounds) {
    out.input_slot.emplace_back();
    out.output_slot.emplace_back();
    for (const void* in : round.inputs) out.input_slot.back().push_back(slot(in));
    for (const void* o : round.outputs) out.output_slot.back().push_back(slot(o));
  }
  return out;
}

}  // namespace efccl::runtime
