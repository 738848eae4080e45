// The device executor's connection layout (interpreter/device/src/connection_layout.h): which
// connections a program has and where the program places them, the wire bytes of a slot, and
// where every connection's memory lies (the receiver's arenas, pinned host memory, slot
// devices), with sizes checked for overflow.
#include "connection_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace efccl::device {
namespace {

/// `nranks` ranks in a ring over `channels` channels: rank r sends to r+1 on every channel.
ef::Program ring_program(int nranks, int channels) {
  ef::Program p;
  p.name = "ring";
  p.collective = ef::Collective::kCustom;
  p.nranks = nranks;
  p.nchannels = channels;
  for (int r = 0; r < nranks; ++r) {
    ef::Rank rank;
    rank.input_chunks = rank.output_chunks = 1;
    for (int ch = 0; ch < channels; ++ch) {
      ef::Threadblock tb;
      tb.channel = ch;
      tb.send_peer = (r + 1) % nranks;
      tb.recv_peer = (r + nranks - 1) % nranks;
      rank.threadblocks.push_back(tb);
    }
    p.ranks.push_back(rank);
  }
  return p;
}

TEST(ConnectionLayout, PlansOneConnectionPerSenderReceiverAndChannel) {
  auto planned = plan_connections(ring_program(3, 2));
  ASSERT_TRUE(planned.is_ok()) << planned.status().message();
  ASSERT_EQ(planned->size(), 6u);
  // Ordered by (sender, receiver, channel); both threadblocks found.
  const ConnectionPlan& first = (*planned)[0];
  EXPECT_EQ(first.sender, 0);
  EXPECT_EQ(first.receiver, 1);
  EXPECT_EQ(first.channel, 0);
  EXPECT_EQ(first.send_tb, 0);
  EXPECT_EQ(first.recv_tb, 0);
  const ConnectionPlan& last = (*planned)[5];
  EXPECT_EQ(last.sender, 2);
  EXPECT_EQ(last.receiver, 0);
  EXPECT_EQ(last.channel, 1);
  EXPECT_EQ(last.send_tb, 1);
  EXPECT_EQ(last.recv_tb, 1);
}

TEST(ConnectionLayout, AOneSidedConnectionIsNamed) {
  ef::Program p = ring_program(3, 1);
  p.ranks[1].threadblocks[0].recv_peer = -1;  // 0 -> 1 has a sender but no receiver
  auto planned = plan_connections(p);
  ASSERT_FALSE(planned.is_ok());
  EXPECT_EQ(planned.status().message(), "connection 0->1 ch 0 has only one side");
}

TEST(ConnectionLayout, SlotWireBytesPerFormat) {
  // Simple: the data, rounded up to 16 bytes, at least 16.
  EXPECT_EQ(slot_wire_bytes(kWireSimple, 1), 16u);
  EXPECT_EQ(slot_wire_bytes(kWireSimple, 100), 112u);
  EXPECT_EQ(slot_wire_bytes(kWireSimple, 512 << 10), std::size_t{512} << 10);
  // LL128: one 128-byte line per 120 data bytes (a slot holds at least 8 bytes).
  EXPECT_EQ(slot_wire_bytes(kWireLL128, 1), 128u);
  EXPECT_EQ(slot_wire_bytes(kWireLL128, 120), 128u);
  EXPECT_EQ(slot_wire_bytes(kWireLL128, 121), 256u);
  EXPECT_EQ(slot_wire_bytes(kWireLL128, 120 << 10), std::size_t{128} << 10);
  // LL: 240 wire bytes per 120 data bytes, rounded up to 128.
  EXPECT_EQ(slot_wire_bytes(kWireLL, 120), 256u);
  EXPECT_EQ(slot_wire_bytes(kWireLL, 240), 512u);
  EXPECT_EQ(slot_wire_bytes(kWireLL, 32 << 10), 65792u);  // 274 groups of 240, rounded up
}

TEST(ConnectionLayout, OneSlotStrideForEveryConnection) {
  std::vector<ConnectionPlan> connections(2);
  connections[0].wire = connections[1].wire = kWireLL128;
  EXPECT_EQ(connection_slot_stride(ef::Protocol::kSimple, 1000, connections, false),
            slot_wire_bytes(kWireSimple, 1000));
  EXPECT_EQ(connection_slot_stride(ef::Protocol::kLL128, 1000, connections, false),
            slot_wire_bytes(kWireLL128, 1000));
  // Another process might run a connection over LL: its slots must hold LL lines.
  EXPECT_EQ(connection_slot_stride(ef::Protocol::kLL128, 1000, connections, true),
            slot_wire_bytes(kWireLL, 1000));
  connections[1].wire = kWireLL;
  EXPECT_EQ(connection_slot_stride(ef::Protocol::kLL128, 1000, connections, false),
            slot_wire_bytes(kWireLL, 1000));
  EXPECT_EQ(connection_slot_stride(ef::Protocol::kLL, 1000, connections, false),
            slot_wire_bytes(kWireLL, 1000));
}

TEST(ConnectionLayout, OffsetsFollowConnectionOrderPerLocation) {
  auto planned = plan_connections(ring_program(3, 2));
  ASSERT_TRUE(planned.is_ok());
  std::vector<ConnectionPlan> connections = *planned;
  // Ranks 0 and 1 share location 7, rank 2 has location 9.
  const std::vector<int64_t> location = {7, 7, 9};
  auto layout = lay_out_connections(connections, location, /*slot_stride=*/1024, /*nslots=*/4);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  const std::size_t per_connection = 2 * kCounterStride + 4 * 1024;
  EXPECT_EQ(layout->connection_fifo_bytes, per_connection);
  EXPECT_EQ(layout->slot_stride, 1024u);
  EXPECT_EQ(layout->nslots, 4u);
  // Received at location 7: 0->1 (x2 channels) and 2->0 (x2); at 9: 1->2 (x2).
  EXPECT_EQ(layout->fifo_bytes.at(7), 4 * per_connection);
  EXPECT_EQ(layout->fifo_bytes.at(9), 2 * per_connection);
  EXPECT_EQ(layout->counter_bytes.at(7), 4 * kSendEndBytes);
  EXPECT_EQ(layout->counter_bytes.at(9), 2 * kSendEndBytes);
  // Connection order: 0->1 ch0, 0->1 ch1, 1->2 ch0, 1->2 ch1, 2->0 ch0, 2->0 ch1.
  EXPECT_EQ(connections[0].recv_offset, 0u);
  EXPECT_EQ(connections[1].recv_offset, per_connection);
  EXPECT_EQ(connections[2].recv_offset, 0u);  // the first received at location 9
  EXPECT_EQ(connections[3].recv_offset, per_connection);
  EXPECT_EQ(connections[4].recv_offset, 2 * per_connection);
  EXPECT_EQ(connections[5].recv_offset, 3 * per_connection);
  EXPECT_EQ(connections[0].send_offset, 0u);
  EXPECT_EQ(connections[2].send_offset, 2 * kSendEndBytes);  // rank 1 sends from location 7
  EXPECT_EQ(connections[4].send_offset, 0u);                 // rank 2 sends from location 9
}

TEST(ConnectionLayout, EveryLocationHasAnEntry) {
  std::vector<ConnectionPlan> none;
  auto layout = lay_out_connections(none, {3, 5}, 64, 8);
  ASSERT_TRUE(layout.is_ok());
  EXPECT_EQ(layout->fifo_bytes.at(3), 0u);
  EXPECT_EQ(layout->fifo_bytes.at(5), 0u);
  EXPECT_EQ(layout->counter_bytes.at(5), 0u);
}

TEST(ConnectionLayout, OneConnectionTooLargeIsAnError) {
  std::vector<ConnectionPlan> connections(1);
  connections[0].receiver = 1;
  auto layout = lay_out_connections(connections, {0, 1}, uint64_t{1} << 62, 8);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("overflows 64-bit sizes"), std::string::npos)
      << layout.status().message();
}

TEST(ConnectionLayout, TooManyLargeConnectionsAreAnError) {
  // Each connection fits (2^60 bytes), sixteen into one location do not.
  std::vector<ConnectionPlan> connections(16);
  for (ConnectionPlan& c : connections) c.receiver = 1;
  auto layout = lay_out_connections(connections, {0, 1}, uint64_t{1} << 50, 1024);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("16 connections overflows 64-bit sizes"),
            std::string::npos)
      << layout.status().message();
}

// ---- Placed connections (ef::ConnectionPlacement) ----

ef::ConnectionPlacement placement(int sender, int receiver, int channel, ef::SlotLocation where,
                                  int device = 0) {
  ef::ConnectionPlacement pl;
  pl.sender = sender;
  pl.receiver = receiver;
  pl.channel = channel;
  pl.location = where;
  pl.device = device;
  return pl;
}

/// The ring of 3 ranks over 2 channels with 0->1 ch 1 in host memory and 1->2 ch 0 and
/// 2->0 ch 1 on slot devices 0 and 1.
ef::Program placed_ring() {
  ef::Program p = ring_program(3, 2);
  p.slot_devices = 2;
  p.placements = {placement(0, 1, 1, ef::SlotLocation::kHost),
                  placement(1, 2, 0, ef::SlotLocation::kDevice, 0),
                  placement(2, 0, 1, ef::SlotLocation::kDevice, 1)};
  return p;
}

TEST(ConnectionLayout, PlanCarriesEachConnectionsPlacement) {
  auto planned = plan_connections(placed_ring());
  ASSERT_TRUE(planned.is_ok()) << planned.status().message();
  ASSERT_EQ(planned->size(), 6u);
  // Order: 0->1 ch0, 0->1 ch1, 1->2 ch0, 1->2 ch1, 2->0 ch0, 2->0 ch1.
  const std::vector<ef::SlotLocation> want = {
      ef::SlotLocation::kReceiver, ef::SlotLocation::kHost,     ef::SlotLocation::kDevice,
      ef::SlotLocation::kReceiver, ef::SlotLocation::kReceiver, ef::SlotLocation::kDevice};
  const std::vector<int> want_device = {-1, -1, 0, -1, -1, 1};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*planned)[i].placement, want[i]) << "connection " << i;
    EXPECT_EQ((*planned)[i].slot_device, want_device[i]) << "connection " << i;
    EXPECT_EQ((*planned)[i].placed(), want[i] != ef::SlotLocation::kReceiver);
  }
}

TEST(ConnectionLayout, AListedReceiverPlacementIsTheDefault) {
  ef::Program p = ring_program(2, 1);
  p.placements = {placement(0, 1, 0, ef::SlotLocation::kReceiver)};
  auto planned = plan_connections(p);
  ASSERT_TRUE(planned.is_ok()) << planned.status().message();
  EXPECT_FALSE((*planned)[0].placed());
}

TEST(ConnectionLayout, BadPlacementsAreNamed) {
  struct Bad {
    ef::ConnectionPlacement placement;
    const char* message;
  };
  const Bad cases[] = {
      {placement(0, 2, 0, ef::SlotLocation::kHost),
       "the placement of connection 0->2 ch 0: the program has no such connection"},
      {placement(0, 1, 5, ef::SlotLocation::kHost),
       "the placement of connection 0->1 ch 5: the program has no such connection"},
      {placement(1, 2, 1, ef::SlotLocation::kDevice, 2),
       "the placement of connection 1->2 ch 1 names slot device 2; the program has 2"},
      {placement(1, 2, 1, ef::SlotLocation::kDevice, -1),
       "the placement of connection 1->2 ch 1 names slot device -1; the program has 2"},
      {placement(1, 2, 1, static_cast<ef::SlotLocation>(7)),
       "the placement of connection 1->2 ch 1 has an unknown slot location"},
  };
  for (const Bad& bad : cases) {
    ef::Program p = placed_ring();
    p.placements.push_back(bad.placement);
    auto planned = plan_connections(p);
    ASSERT_FALSE(planned.is_ok()) << bad.message;
    EXPECT_EQ(planned.status().message(), bad.message);
  }
  ef::Program twice = placed_ring();
  twice.placements.push_back(placement(0, 1, 1, ef::SlotLocation::kDevice, 0));
  auto planned = plan_connections(twice);
  ASSERT_FALSE(planned.is_ok());
  EXPECT_EQ(planned.status().message(), "the placement of connection 0->1 ch 1 is listed twice");
}

TEST(ConnectionLayout, PlacedConnectionsLieInPlacedArenas) {
  auto planned = plan_connections(placed_ring());
  ASSERT_TRUE(planned.is_ok());
  std::vector<ConnectionPlan> c = *planned;
  // Ranks 0 and 1 share location 7, rank 2 has location 9.
  const std::vector<int64_t> location = {7, 7, 9};
  auto layout = lay_out_connections(c, location, /*slot_stride=*/1024, /*nslots=*/4);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  const std::size_t entry = 2 * kCounterStride + 4 * 1024;
  ASSERT_EQ(layout->connection_fifo_bytes, entry);

  // FIFO arenas hold only the connections placed at their receivers: at 7, 0->1 ch0 and
  // 2->0 ch0; at 9, 1->2 ch1.
  EXPECT_EQ(layout->fifo_bytes.at(7), 2 * entry);
  EXPECT_EQ(layout->fifo_bytes.at(9), entry);
  EXPECT_EQ(c[0].recv_offset, 0u);     // 0->1 ch0
  EXPECT_EQ(c[4].recv_offset, entry);  // 2->0 ch0
  EXPECT_EQ(c[3].recv_offset, 0u);     // 1->2 ch1
  // One placed arena per (receiver location, sender location, slot memory), one entry each.
  const std::map<PlacedArenaKey, std::size_t> want = {
      {PlacedArenaKey{7, 7, -1}, entry},  // 0->1 ch1: host memory
      {PlacedArenaKey{9, 7, 0}, entry},   // 1->2 ch0: slot device 0
      {PlacedArenaKey{7, 9, 1}, entry},   // 2->0 ch1: slot device 1
  };
  EXPECT_EQ(layout->placed_bytes, want);
  EXPECT_EQ(c[1].placed_arena(location), (PlacedArenaKey{7, 7, -1}));
  EXPECT_EQ(c[2].placed_arena(location), (PlacedArenaKey{9, 7, 0}));
  EXPECT_EQ(c[5].placed_arena(location), (PlacedArenaKey{7, 9, 1}));
  EXPECT_EQ(c[1].recv_offset, 0u);
  EXPECT_EQ(c[2].recv_offset, 0u);
  EXPECT_EQ(c[5].recv_offset, 0u);

  // Counter arenas: every sender's end (head, position), then, for placed connections, the
  // receiver's end (its position) at the receiver's location, in connection order.
  // Location 7: sends 0->1 ch0, 0->1 ch1, 1->2 ch0, 1->2 ch1 (4 ends); receives 0->1 ch1 and
  // 2->0 ch1 placed (2 receiver ends). Location 9: sends 2->0 ch0, ch1; receives 1->2 ch0.
  EXPECT_EQ(layout->counter_bytes.at(7), 4 * kSendEndBytes + 2 * kRecvEndBytes);
  EXPECT_EQ(layout->counter_bytes.at(9), 2 * kSendEndBytes + kRecvEndBytes);
  EXPECT_EQ(c[0].send_offset, 0u);
  EXPECT_EQ(c[1].send_offset, kSendEndBytes);
  EXPECT_EQ(c[1].recv_end_offset, 2 * kSendEndBytes);  // after 0->1's two sender ends
  EXPECT_EQ(c[2].send_offset, 2 * kSendEndBytes + kRecvEndBytes);
  EXPECT_EQ(c[2].recv_end_offset, 0u);  // the first thing at location 9
  EXPECT_EQ(c[3].send_offset, 3 * kSendEndBytes + kRecvEndBytes);
  EXPECT_EQ(c[4].send_offset, kRecvEndBytes);
  EXPECT_EQ(c[5].send_offset, kRecvEndBytes + kSendEndBytes);
  EXPECT_EQ(c[5].recv_end_offset, 4 * kSendEndBytes + kRecvEndBytes);
}

TEST(ConnectionLayout, EveryProcessDerivesTheSameLayout) {
  // Two processes laying out the same program over the same locations get the same offsets,
  // whatever else they know (the layout takes nothing else).
  std::vector<ConnectionPlan> a = *plan_connections(placed_ring());
  std::vector<ConnectionPlan> b = *plan_connections(placed_ring());
  auto la = lay_out_connections(a, {3, 4, 5}, 4096, 8);
  auto lb = lay_out_connections(b, {3, 4, 5}, 4096, 8);
  ASSERT_TRUE(la.is_ok() && lb.is_ok());
  EXPECT_EQ(la->placed_bytes, lb->placed_bytes);
  EXPECT_EQ(la->fifo_bytes, lb->fifo_bytes);
  EXPECT_EQ(la->counter_bytes, lb->counter_bytes);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].recv_offset, b[i].recv_offset);
    EXPECT_EQ(a[i].send_offset, b[i].send_offset);
    EXPECT_EQ(a[i].recv_end_offset, b[i].recv_end_offset);
  }
}

TEST(ConnectionLayout, TooManyLargePlacedConnectionsAreAnError) {
  // Sixteen connections of 2^60 bytes each into one host arena do not fit 64-bit sizes.
  std::vector<ConnectionPlan> connections(16);
  for (ConnectionPlan& c : connections) {
    c.receiver = 1;
    c.placement = ef::SlotLocation::kHost;
  }
  auto layout = lay_out_connections(connections, {0, 1}, uint64_t{1} << 50, 1024);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("16 connections overflows 64-bit sizes"),
            std::string::npos)
      << layout.status().message();
}

TEST(ConnectionLayout, ConnectionsBetweenHostsAreNetworkConnections) {
  // A ring of four ranks, two per host: 1->2 and 3->0 cross hosts, on both channels. A
  // placement of a crossing connection does not apply (its memory is each host's own).
  ef::Program p = ring_program(4, 2);
  p.slot_devices = 1;
  p.placements.push_back(placement(1, 2, 0, ef::SlotLocation::kHost, -1));
  p.placements.push_back(placement(0, 1, 1, ef::SlotLocation::kDevice, 0));
  auto planned = plan_connections(p);
  ASSERT_TRUE(planned.is_ok()) << planned.status().message();
  std::vector<ConnectionPlan> c = *planned;
  const std::vector<uint64_t> hosts = {0xa, 0xa, 0xb, 0xb};
  ASSERT_TRUE(mark_network_connections(c, hosts, {true, true, false, false}));
  for (const ConnectionPlan& k : c) {
    const bool crosses = (k.sender == 1 && k.receiver == 2) || (k.sender == 3 && k.receiver == 0);
    EXPECT_EQ(k.network, crosses) << k.sender << "->" << k.receiver << " ch " << k.channel;
    if (crosses) {
      EXPECT_FALSE(k.placed()) << k.sender << "->" << k.receiver << " ch " << k.channel;
    }
  }
  // 0->1 ch1 stays placed on its slot device (it does not cross).
  EXPECT_EQ(c[1].sender, 0);
  EXPECT_EQ(c[1].channel, 1);
  EXPECT_EQ(c[1].placement, ef::SlotLocation::kDevice);
  // One host (or no hosts given): nothing is a network connection.
  std::vector<ConnectionPlan> same = *planned;
  ASSERT_TRUE(mark_network_connections(same, {5, 5, 5, 5}, {true, true, true, true}));
  ASSERT_TRUE(mark_network_connections(same, {}, {}));
  for (const ConnectionPlan& k : same) EXPECT_FALSE(k.network);
}

TEST(ConnectionLayout, NetworkConnectionsMustJoinTwoProcessesAndNameEveryRank) {
  std::vector<ConnectionPlan> c = *plan_connections(ring_program(2, 1));
  const Status both_here = mark_network_connections(c, {1, 2}, {true, true});
  ASSERT_FALSE(both_here.is_ok());
  EXPECT_EQ(both_here.message(),
            "ranks 0 and 1 run in this process but on different hosts (PeerProcesses::hosts)");
  const Status short_hosts = mark_network_connections(c, {1}, {true, false});
  ASSERT_FALSE(short_hosts.is_ok());
  EXPECT_NE(short_hosts.message().find("do not cover connection"), std::string::npos)
      << short_hosts.message();
}

TEST(ConnectionLayout, NetworkConnectionsHaveOnlyTheirEndsPositions) {
  // Ranks 0, 1 on one host (locations 7, 8), ranks 2, 3 on another (9, 10); a ring, one
  // channel. 1->2 and 3->0 are network connections: no FIFO entry anywhere, the sender's end
  // in its counter arena, the receiver's position in its own.
  std::vector<ConnectionPlan> c = *plan_connections(ring_program(4, 1));
  ASSERT_TRUE(mark_network_connections(c, {1, 1, 2, 2}, {true, true, false, false}));
  auto layout = lay_out_connections(c, {7, 8, 9, 10}, /*slot_stride=*/1024, /*nslots=*/4);
  ASSERT_TRUE(layout.is_ok()) << layout.status().message();
  const std::size_t entry = layout->connection_fifo_bytes;
  // Connection order: 0->1, 1->2, 2->3, 3->0.
  EXPECT_EQ(layout->fifo_bytes.at(8), entry);   // 0->1
  EXPECT_EQ(layout->fifo_bytes.at(9), 0u);      // 1->2: network
  EXPECT_EQ(layout->fifo_bytes.at(10), entry);  // 2->3
  EXPECT_EQ(layout->fifo_bytes.at(7), 0u);      // 3->0: network
  EXPECT_TRUE(layout->placed_bytes.empty());
  EXPECT_EQ(layout->counter_bytes.at(7), kSendEndBytes + kRecvEndBytes);  // sends 0->1, 3->0's end
  EXPECT_EQ(layout->counter_bytes.at(8), kSendEndBytes);                  // sends 1->2
  EXPECT_EQ(layout->counter_bytes.at(9), kRecvEndBytes + kSendEndBytes);  // 1->2's end, sends 2->3
  EXPECT_EQ(layout->counter_bytes.at(10), kSendEndBytes);                 // sends 3->0
  EXPECT_TRUE(c[1].has_recv_end());
  EXPECT_EQ(c[1].recv_end_offset, 0u);
  EXPECT_EQ(c[2].send_offset, kRecvEndBytes);
  EXPECT_EQ(c[3].send_offset, 0u);
  EXPECT_EQ(c[3].recv_end_offset, kSendEndBytes);
}

}  // namespace
}  // namespace efccl::device
