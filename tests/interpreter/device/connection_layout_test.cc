// The device executor's connection layout (interpreter/device/src/connection_layout.h): which
// connections a program has, the wire bytes of a slot, and where every connection's memory
// lies, with sizes checked for overflow.
#include "connection_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
}  // namespace efccl::device
