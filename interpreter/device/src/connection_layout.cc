// Connection layout: which connections a program has, and where their memory lies.
#include "connection_layout.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "checked_size.h"

namespace efccl::device {

StatusOr<std::vector<ConnectionPlan>> plan_connections(const ef::Program& program) {
  // (sender, receiver, channel) -> both threadblocks.
  std::map<std::tuple<int, int, int>, ConnectionPlan> by_key;
  for (int r = 0; r < program.nranks; ++r) {
    const auto& tbs = program.ranks[r].threadblocks;
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      const auto& tb = tbs[t];
      if (tb.send_peer >= 0) {
        auto& c = by_key[{r, tb.send_peer, tb.channel}];
        c.sender = r, c.receiver = tb.send_peer, c.channel = tb.channel;
        c.send_tb = static_cast<int>(t);
      }
      if (tb.recv_peer >= 0) {
        auto& c = by_key[{tb.recv_peer, r, tb.channel}];
        c.sender = tb.recv_peer, c.receiver = r, c.channel = tb.channel;
        c.recv_tb = static_cast<int>(t);
      }
    }
  }
  const auto name = [](int sender, int receiver, int channel) {
    return "connection " + std::to_string(sender) + "->" + std::to_string(receiver) + " ch " +
           std::to_string(channel);
  };
  std::vector<ConnectionPlan> connections;
  for (auto& [key, c] : by_key) {
    if (c.send_tb < 0 || c.recv_tb < 0)
      return Status::error(name(c.sender, c.receiver, c.channel) + " has only one side");
    connections.push_back(c);
  }
  std::set<std::tuple<int, int, int>> placed;
  for (const ef::ConnectionPlacement& pl : program.placements) {
    const std::string what = "the placement of " + name(pl.sender, pl.receiver, pl.channel);
    auto it = by_key.find({pl.sender, pl.receiver, pl.channel});
    if (it == by_key.end()) return Status::error(what + ": the program has no such connection");
    if (!placed.insert(it->first).second) return Status::error(what + " is listed twice");
    if (pl.location != ef::SlotLocation::kReceiver && pl.location != ef::SlotLocation::kHost &&
        pl.location != ef::SlotLocation::kDevice)
      return Status::error(what + " has an unknown slot location");
    if (pl.location == ef::SlotLocation::kDevice &&
        (pl.device < 0 || pl.device >= program.slot_devices))
      return Status::error(what + " names slot device " + std::to_string(pl.device) +
                           "; the program has " + std::to_string(program.slot_devices));
    // `connections` is in by_key's order.
    auto at = std::lower_bound(connections.begin(), connections.end(), it->first,
                               [](const ConnectionPlan& c, const std::tuple<int, int, int>& k) {
                                 return std::tuple{c.sender, c.receiver, c.channel} < k;
                               });
    at->placement = pl.location;
    at->slot_device = pl.location == ef::SlotLocation::kDevice ? pl.device : -1;
  }
  return connections;
}

Status mark_network_connections(std::vector<ConnectionPlan>& connections,
                                const std::vector<uint64_t>& hosts,
                                const std::vector<bool>& local) {
  if (hosts.empty()) return Status::ok();
  for (ConnectionPlan& c : connections) {
    const auto s = static_cast<std::size_t>(c.sender), r = static_cast<std::size_t>(c.receiver);
    if (s >= hosts.size() || r >= hosts.size() || s >= local.size() || r >= local.size())
      return Status::error("the hosts of the ranks (" + std::to_string(hosts.size()) +
                           " entries) do not cover connection " + std::to_string(c.sender) + "->" +
                           std::to_string(c.receiver));
    c.network = hosts[s] != hosts[r];
    if (!c.network) continue;
    if (local[s] && local[r])
      return Status::error("ranks " + std::to_string(c.sender) + " and " +
                           std::to_string(c.receiver) +
                           " run in this process but on different hosts (PeerProcesses::hosts)");
    c.placement = ef::SlotLocation::kReceiver;
    c.slot_device = -1;
  }
  return Status::ok();
}

std::size_t slot_wire_bytes(WireFormat wire, std::size_t slot_bytes) {
  const auto align_up = [](std::size_t v, std::size_t a) { return (v + a - 1) / a * a; };
  const std::size_t groups =
      (std::max<std::size_t>(slot_bytes, 8) + kGroupDataBytes - 1) / kGroupDataBytes;
  switch (wire) {
    case kWireLL:
      return align_up(groups * kLLGroupWireBytes, kLL128LineBytes);
    case kWireLL128:
      return groups * kLL128LineBytes;
    case kWireSimple:
      break;
  }
  return align_up(std::max<std::size_t>(slot_bytes, 16), 16);
}

std::size_t connection_slot_stride(ef::Protocol protocol, std::size_t slot_bytes,
                                   const std::vector<ConnectionPlan>& connections,
                                   bool multiprocess) {
  if (protocol == ef::Protocol::kSimple) return slot_wire_bytes(kWireSimple, slot_bytes);
  const bool all_ll128 =
      !multiprocess && std::all_of(connections.begin(), connections.end(),
                                   [](const ConnectionPlan& c) { return c.wire == kWireLL128; });
  return slot_wire_bytes(all_ll128 ? kWireLL128 : kWireLL, slot_bytes);
}

StatusOr<ConnectionLayout> lay_out_connections(std::vector<ConnectionPlan>& connections,
                                               const std::vector<int64_t>& location,
                                               std::size_t slot_stride, int nslots) {
  ConnectionLayout layout;
  layout.slot_stride = slot_stride;
  layout.nslots = static_cast<uint32_t>(nslots);
  const auto slots = checked_mul(slot_stride, static_cast<uint64_t>(nslots));
  const auto fifo = slots ? checked_add(kSlotsOffset, *slots) : std::nullopt;
  const auto aligned = fifo ? checked_align_up(*fifo, kCounterStride) : std::nullopt;
  if (!aligned)
    return Status::error("connection memory of " + std::to_string(nslots) + " slots of " +
                         std::to_string(slot_stride) + " bytes overflows 64-bit sizes");
  layout.connection_fifo_bytes = *aligned;
  for (int64_t loc : location) layout.fifo_bytes[loc] = layout.counter_bytes[loc] = 0;
  // Places `bytes` at the end of an arena: its offset, or nullopt on overflow.
  const auto take = [](std::size_t& end, std::size_t bytes) -> std::optional<std::size_t> {
    const auto next = checked_add(end, bytes);
    if (!next) return std::nullopt;
    const std::size_t offset = end;
    end = *next;
    return offset;
  };
  // Offsets per arena, in connection order.
  for (ConnectionPlan& c : connections) {
    std::optional<std::size_t> fifo = 0;  // network connections have no FIFO entry
    if (!c.network) {
      std::size_t& fifo_end = c.placed() ? layout.placed_bytes[c.placed_arena(location)]
                                         : layout.fifo_bytes.at(location.at(c.receiver));
      fifo = take(fifo_end, layout.connection_fifo_bytes);
    }
    const auto send = take(layout.counter_bytes.at(location.at(c.sender)), kSendEndBytes);
    const auto recv_end =
        c.has_recv_end() ? take(layout.counter_bytes.at(location.at(c.receiver)), kRecvEndBytes)
                         : std::optional<std::size_t>(0);
    if (!fifo || !send || !recv_end)
      return Status::error("the connection memory of " + std::to_string(connections.size()) +
                           " connections overflows 64-bit sizes");
    c.recv_offset = *fifo;
    c.send_offset = *send;
    c.recv_end_offset = *recv_end;
  }
  return layout;
}

}  // namespace efccl::device
