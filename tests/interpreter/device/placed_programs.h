// Programs whose connections are placed off the receiver (ef::ConnectionPlacement): in pinned
// host memory or on slot devices, as the balancer's host path and relays without a forwarding
// kernel place them. Built in C++ (the JSON form is ef_format's), shared by the single- and
// multi-process GPU tests. Header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "efccl/ef/program.h"

namespace efccl::test_support {

inline ef::ConnectionPlacement placed(int sender, int receiver, int channel, ef::SlotLocation where,
                                      int device = 0) {
  ef::ConnectionPlacement pl;
  pl.sender = sender;
  pl.receiver = receiver;
  pl.channel = channel;
  pl.location = where;
  pl.device = where == ef::SlotLocation::kDevice ? device : 0;
  return pl;
}

/// Sorts placements by (sender, receiver, channel), as Program::placements must be.
inline void sort_placements(ef::Program& p) {
  std::sort(p.placements.begin(), p.placements.end(), [](const auto& a, const auto& b) {
    return std::tie(a.sender, a.receiver, a.channel) < std::tie(b.sender, b.receiver, b.channel);
  });
}

inline ef::Op transfer_op(ef::OpCode code, std::optional<ef::BufferRef> src,
                          std::optional<ef::BufferRef> dst, int64_t count) {
  ef::Op op;
  op.code = code;
  op.src = src;
  op.dst = dst;
  op.count = count;
  return op;
}

inline ef::BufferRef input_chunk(int64_t i) { return {ef::BufferKind::kInput, i}; }
inline ef::BufferRef output_chunk(int64_t i) { return {ef::BufferKind::kOutput, i}; }
inline ef::BufferRef scratch_chunk(int64_t i) { return {ef::BufferKind::kScratch, i}; }

inline ef::Threadblock threadblock(int send_peer, int recv_peer, int channel) {
  ef::Threadblock tb;
  tb.send_peer = send_peer;
  tb.recv_peer = recv_peer;
  tb.channel = channel;
  return tb;
}

/// A lone send/receive pair split over three paths, as the balancer splits a large transfer:
/// rank 0's input (6 chunks) becomes rank 1's output, one send of two chunks per channel:
/// channel 0 at the receiver (the direct path), channel 1 in pinned host memory, channel 2 on
/// slot device 0 (a relay GPU that runs no kernel). With `both_ways`, rank 1 sends its input
/// to rank 0 the same way at once.
inline ef::Program lone_pair(ef::Protocol protocol, bool both_ways = false) {
  ef::Program p;
  p.name = both_ways ? "placed_pair_both_ways" : "placed_pair";
  p.collective = ef::Collective::kCustom;
  p.protocol = protocol;
  p.nranks = 2;
  p.nchannels = 3;
  p.nchunksperloop = 6;
  p.inplace = false;
  p.outofplace = true;
  p.slot_devices = 1;
  p.ranks.resize(2);
  for (int from : both_ways ? std::vector<int>{0, 1} : std::vector<int>{0}) {
    const int to = 1 - from;
    p.ranks[from].input_chunks = 6;
    p.ranks[to].output_chunks = 6;
    for (int ch = 0; ch < 3; ++ch) {
      ef::Threadblock send = threadblock(to, -1, ch);
      send.ops.push_back(transfer_op(ef::OpCode::kSend, input_chunk(2 * ch), {}, 2));
      p.ranks[from].threadblocks.push_back(send);
      ef::Threadblock recv = threadblock(-1, from, ch);
      recv.ops.push_back(transfer_op(ef::OpCode::kRecv, {}, output_chunk(2 * ch), 2));
      p.ranks[to].threadblocks.push_back(recv);
      for (int k = 0; k < 2; ++k) {
        ef::Postcondition post;
        post.rank = to;
        post.index = 2 * ch + k;
        post.sources.push_back({from, 2 * ch + k});
        p.postconditions.push_back(post);
      }
    }
    p.placements.push_back(placed(from, to, 1, ef::SlotLocation::kHost));
    p.placements.push_back(placed(from, to, 2, ef::SlotLocation::kDevice, 0));
  }
  sort_placements(p);
  return p;
}

/// Rank 0's input (3 chunks) becomes rank 2's output over three paths: chunk 0 directly
/// (channel 0, at the receiver); chunk 1 forwarded by rank 1 (channel 1: 0->1 in pinned host
/// memory, rank 1 receives, keeps a copy in scratch and sends on, 1->2 on slot device 0);
/// chunk 2 through slot device 1 with no kernel on the way (channel 2).
inline ef::Program forward_through_third_rank(ef::Protocol protocol) {
  ef::Program p;
  p.name = "placed_forward";
  p.collective = ef::Collective::kCustom;
  p.protocol = protocol;
  p.nranks = 3;
  p.nchannels = 3;
  p.nchunksperloop = 3;
  p.inplace = false;
  p.outofplace = true;
  p.slot_devices = 2;
  p.ranks.resize(3);
  p.ranks[0].input_chunks = 3;
  p.ranks[1].scratch_chunks = 1;
  p.ranks[2].output_chunks = 3;
  for (int ch : {0, 2}) {
    ef::Threadblock send = threadblock(2, -1, ch);
    send.ops.push_back(transfer_op(ef::OpCode::kSend, input_chunk(ch), {}, 1));
    p.ranks[0].threadblocks.push_back(send);
    ef::Threadblock recv = threadblock(-1, 0, ch);
    recv.ops.push_back(transfer_op(ef::OpCode::kRecv, {}, output_chunk(ch), 1));
    p.ranks[2].threadblocks.push_back(recv);
  }
  ef::Threadblock send = threadblock(1, -1, 1);
  send.ops.push_back(transfer_op(ef::OpCode::kSend, input_chunk(1), {}, 1));
  p.ranks[0].threadblocks.push_back(send);
  ef::Threadblock forward = threadblock(2, 0, 1);
  forward.ops.push_back(transfer_op(ef::OpCode::kRecvCopySend, {}, scratch_chunk(0), 1));
  p.ranks[1].threadblocks.push_back(forward);
  ef::Threadblock recv = threadblock(-1, 1, 1);
  recv.ops.push_back(transfer_op(ef::OpCode::kRecv, {}, output_chunk(1), 1));
  p.ranks[2].threadblocks.push_back(recv);
  for (int i = 0; i < 3; ++i) {
    ef::Postcondition post;
    post.rank = 2;
    post.index = i;
    post.sources.push_back({0, i});
    p.postconditions.push_back(post);
  }
  p.placements = {placed(0, 1, 1, ef::SlotLocation::kHost),
                  placed(0, 2, 2, ef::SlotLocation::kDevice, 1),
                  placed(1, 2, 1, ef::SlotLocation::kDevice, 0)};
  sort_placements(p);
  return p;
}

/// `p` with its connections placed in turn at the receiver, in host memory and on each of
/// `slot_devices` slot devices (in (sender, receiver, channel) order).
inline ef::Program placed_round_robin(ef::Program p, int slot_devices) {
  std::set<std::tuple<int, int, int>> connections;
  for (int r = 0; r < p.nranks; ++r)
    for (const ef::Threadblock& tb : p.ranks[r].threadblocks)
      if (tb.send_peer >= 0) connections.insert({r, tb.send_peer, tb.channel});
  p.slot_devices = slot_devices;
  p.placements.clear();
  int i = 0;
  for (const auto& [s, r, ch] : connections) {
    const int turn = (i++ + 1) % (2 + slot_devices);  // the first one placed: one-connection programs too
    if (turn == 0) continue;  // at the receiver
    p.placements.push_back(turn == 1 ? placed(s, r, ch, ef::SlotLocation::kHost)
                                     : placed(s, r, ch, ef::SlotLocation::kDevice, turn - 2));
  }
  return p;
}

/// A CUDA device for each of `count` slot devices: GPUs that run none of the ranks where there
/// are such (`ngpus` visible), else the ranks' own, in turn (one GPU: all 0).
inline std::vector<int> slot_devices_for(const std::vector<int>& rank_devices, int count,
                                         int ngpus) {
  std::vector<int> spare;
  for (int d = 0; d < ngpus; ++d)
    if (std::find(rank_devices.begin(), rank_devices.end(), d) == rank_devices.end())
      spare.push_back(d);
  if (spare.empty()) {
    spare = rank_devices;
    std::sort(spare.begin(), spare.end());
    spare.erase(std::unique(spare.begin(), spare.end()), spare.end());
  }
  std::vector<int> slots;
  for (int k = 0; k < count; ++k)
    slots.push_back(spare[static_cast<std::size_t>(k) % spare.size()]);
  return slots;
}

}  // namespace efccl::test_support
