// Balanced transfers as one EF program (docs/balancer.md, "Plans as programs"). CUDA-free.
//
// Transfers between program ranks, each a run of whole chunks from the sender's input to the
// receiver's output, each split over routes, become one custom-collective ef::Program of int8
// data with nchunksperloop 1 (a call's count is the chunk size in bytes), like the runtime's
// send/receive rounds:
//
//   balance::ProgramTransfer t{.sender = 0, .receiver = 1, .src_chunk = 0, .dst_chunk = 0,
//                              .chunks = 16};
//   t.shares = {{balance::Route::direct(), 8, 4},          // 8 chunks over 4 channels
//               {balance::Route::forward(2), 4, 0},        // 4 through rank 2 (rcs, scratch)
//               {balance::Route::slot_device(0), 2, 0},    // 2 through slots on slot device 0
//               {balance::Route::host(), 2, 0}};           // 2 through pinned host memory
//   ef::Program p = *balance::build_program({&t, 1}, {.nranks = 3, .slot_devices = 1});
//
// Routes: a share travels over connections, from the sender through ranks that forward (an
// rcs per piece into a small scratch of the forwarding threadblock) to the receiver; each
// connection has its slots at its receiver (the default), in pinned host memory
// (ef::SlotLocation::kHost) or on an external slot device (kDevice, a GPU that runs no kernel
// for it, bound by the engine). Every share of one (sender, receiver, route) runs on channels
// of its own: each of its connections is one (sender, receiver, channel) with one sending and
// one receiving threadblock, so a placement names exactly the connections of one route.
//
// Postconditions as the runtime's rounds: output chunk dst_chunk + i of the receiver equals
// input chunk src_chunk + i of the sender. Equal inputs give equal programs, byte for byte.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/ef/program.h"

namespace efccl::balance {

/// One connection of a route: from the previous stop (the sender first) to `to`.
struct RouteHop {
  int32_t to = -1;  ///< the program rank reached, which forwards; -1: the transfer's receiver
  ef::SlotLocation slots = ef::SlotLocation::kReceiver;  ///< where this connection's slots live
  int32_t device = 0;  ///< slots == kDevice: the slot device, 0 .. slot_devices-1; else 0
  auto operator<=>(const RouteHop&) const = default;
};

/// How a share travels: its hops in order, the last one to the receiver (to == -1).
struct Route {
  std::vector<RouteHop> hops;  ///< empty: the same as direct()
  /// One connection, slots at the receiver.
  static Route direct() { return {{RouteHop{}}}; }
  /// Through program rank `relay`, which receives and forwards (rcs); slots at the receivers.
  static Route forward(int32_t relay) { return {{RouteHop{relay}, RouteHop{}}}; }
  /// One connection whose slots live on external slot device `device`.
  static Route slot_device(int32_t device) {
    return {{RouteHop{-1, ef::SlotLocation::kDevice, device}}};
  }
  /// One connection whose slots live in pinned host memory.
  static Route host() { return {{RouteHop{-1, ef::SlotLocation::kHost, 0}}}; }
  auto operator<=>(const Route&) const = default;
};

/// Some chunks of a transfer on one route.
struct RouteShare {
  Route route;
  int64_t chunks = 0;
  /// Channels (sending/receiving threadblock pairs on every connection of the route) that
  /// carry the share in parallel, at most its chunks; 0: ProgramBuildOptions::channels_per_share.
  /// Shares of one (sender, receiver, route) share the largest count any of them asks for.
  int32_t channels = 0;
};

/// Whole chunks from the sender's input buffer to the receiver's output buffer.
struct ProgramTransfer {
  int32_t sender = 0;
  int32_t receiver = 0;   ///< == sender: a local copy (direct only)
  int64_t src_chunk = 0;  ///< first chunk in the sender's input
  int64_t dst_chunk = 0;  ///< first chunk in the receiver's output
  int64_t chunks = 0;     ///< 0: nothing to move
  /// The split, in order: the first share carries the first chunks. Chunks add up to
  /// `chunks`. Empty: all direct.
  std::vector<RouteShare> shares;
};

struct ProgramBuildOptions {
  /// Program ranks: more than every rank a transfer or route names; ranks beyond the
  /// transfers' only forward (their buffers are scratch).
  int32_t nranks = 0;
  int32_t slot_devices = 0;  ///< Program::slot_devices: 0 .. ef::kMaxSlotDevices
  ef::Protocol protocol = ef::Protocol::kSimple;
  int32_t channels_per_share = 1;  ///< channels of a share that asks for 0
  /// A forwarding threadblock's rcs ops carry at most this many chunks each, written to a
  /// scratch region of that many chunks that every op reuses (nothing reads it), so a relay
  /// needs this many chunks of scratch per forwarding threadblock, not the whole share.
  int64_t forward_op_chunks = 4;
  std::string name = "balanced";
};

/// The program of `transfers`. Errors name the transfer (its index) and what is wrong:
/// ranks out of range, shares that do not add up, overlapping destinations on one receiver,
/// a route through its own ends or naming a slot device beyond options.slot_devices, more
/// than 1024 channels.
StatusOr<ef::Program> build_program(std::span<const ProgramTransfer> transfers,
                                    const ProgramBuildOptions& options);

}  // namespace efccl::balance
