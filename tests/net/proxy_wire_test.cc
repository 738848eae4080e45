// The proxy transport's wire format and slot memory (net/src/proxy_wire.h, slot_region.h).
#include "proxy_wire.h"

#include <gtest/gtest.h>

#include <set>

#include "efccl/net/slot_region.h"

namespace {

using efccl::net::ConnectionHandle;
using efccl::net::Hello;
using efccl::net::HostSlotMemory;
using efccl::net::SlotLayout;
using efccl::net::SlotRegion;
using efccl::net::StripePlan;

TEST(StripePlan, SmallSlotsUseOneSocketAndLargeOnesAll) {
  EXPECT_EQ(StripePlan::of(0, 8).count, 1u);
  EXPECT_EQ(StripePlan::of(1, 8).count, 1u);
  EXPECT_EQ(StripePlan::of(64 * 1024, 8).count, 1u);
  EXPECT_EQ(StripePlan::of(64 * 1024 + 1, 8).count, 2u);
  const StripePlan big = StripePlan::of(8u << 20, 8);
  EXPECT_EQ(big.count, 8u);
  EXPECT_EQ(big.stripe, 1u << 20);
  EXPECT_EQ(StripePlan::of(8u << 20, 1).count, 1u);
}

TEST(StripePlan, StripesCoverTheSlotExactlyOnce) {
  for (uint32_t nsocks : {1u, 2u, 3u, 7u, 64u})
    for (uint64_t total :
         {0ull, 1ull, 4095ull, 65536ull, 65537ull, 300001ull, 1ull << 22, (1ull << 22) + 12345}) {
      const StripePlan p = StripePlan::of(total, nsocks);
      ASSERT_LE(p.count, nsocks) << total << " over " << nsocks;
      uint64_t covered = 0;
      for (uint32_t i = 0; i < p.count; ++i) {
        EXPECT_EQ(p.offset(i), covered);
        covered += p.length(i, total);
        if (total > 0) {
          EXPECT_GT(p.length(i, total), 0u) << "stripe " << i << " of " << total;
        }
      }
      EXPECT_EQ(covered, total);
      EXPECT_EQ(p.length(p.count, total), 0u);
    }
}

TEST(ConnectionHandle, RoundTripsAndRejectsWhatIsNotOne) {
  ConnectionHandle h;
  auto address = efccl::net::SocketAddress::parse("10.1.2.3:4567");
  ASSERT_TRUE(address);
  h.address = *address;
  h.id = 42;
  h.token = efccl::net::random_token();
  h.nsocks = 6;
  h.layout.nslots = 5;
  h.layout.slot_bytes = 12345;
  h.layout.sized = false;
  const std::string bytes = h.encode();
  ASSERT_EQ(bytes.size(), ConnectionHandle::kBytes);
  auto back = ConnectionHandle::decode(bytes);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->address, h.address);
  EXPECT_EQ(back->id, 42u);
  EXPECT_TRUE(efccl::net::same_token(back->token, h.token));
  EXPECT_EQ(back->nsocks, 6u);
  EXPECT_EQ(back->layout, h.layout);

  EXPECT_FALSE(ConnectionHandle::decode(""));
  EXPECT_FALSE(ConnectionHandle::decode(bytes.substr(1)));
  EXPECT_FALSE(ConnectionHandle::decode(std::string(ConnectionHandle::kBytes, 'x')));
  std::string many = bytes;
  const uint32_t socks = 65;
  std::memcpy(many.data() + 8 + 28 + 8 + 16, &socks, 4);
  auto refused = ConnectionHandle::decode(many);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("65 sockets"), std::string::npos);
  std::string no_slots = bytes;
  const uint32_t zero = 0;
  std::memcpy(no_slots.data() + 8 + 28 + 8 + 16 + 4, &zero, 4);
  EXPECT_FALSE(ConnectionHandle::decode(no_slots));
  std::string other_version = bytes;
  const uint32_t two = 2;
  std::memcpy(other_version.data() + 4, &two, 4);
  EXPECT_FALSE(ConnectionHandle::decode(other_version));
}

TEST(Hello, RoundTrips) {
  Hello h;
  h.id = 7;
  h.token = efccl::net::random_token();
  h.index = 3;
  h.nsocks = 4;
  char bytes[Hello::kBytes];
  h.encode(bytes);
  uint32_t magic;
  std::memcpy(&magic, bytes, 4);
  EXPECT_EQ(magic, efccl::net::kHelloMagic);
  const Hello back = Hello::decode(bytes);
  EXPECT_EQ(back.id, 7u);
  EXPECT_EQ(back.index, 3u);
  EXPECT_EQ(back.nsocks, 4u);
  EXPECT_TRUE(efccl::net::same_token(back.token, h.token));
}

TEST(Token, IsRandom) {
  std::set<std::array<uint8_t, 16>> seen;
  for (int i = 0; i < 100; ++i) seen.insert(efccl::net::random_token());
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SlotLayout, LaysOutCountersSizesAndSlots) {
  SlotLayout l;
  l.nslots = 8;
  l.slot_bytes = 1000;
  ASSERT_TRUE(l.check());
  EXPECT_EQ(l.slots_offset() % 4096, 0u);
  EXPECT_GE(l.slots_offset(), l.sizes_offset() + 8 * 4);
  EXPECT_EQ(l.region_bytes() % 4096, 0u);
  EXPECT_GE(l.region_bytes(), l.slots_offset() + 8000);
  auto m = HostSlotMemory::allocate(l);
  ASSERT_TRUE(m);
  const SlotRegion& r = m->region();
  EXPECT_EQ(r.load_tail(), 0u);
  EXPECT_EQ(r.load_head(), 0u);
  EXPECT_EQ(r.slot(9), r.slots + 1000);
  SlotRegion::raise(r.tail, 5);
  SlotRegion::raise(r.tail, 3);
  EXPECT_EQ(r.load_tail(), 5u);

  l.nslots = 0;
  EXPECT_FALSE(l.check());
  l.nslots = SlotLayout::kMaxSlots + 1;
  EXPECT_FALSE(l.check());
  l.nslots = 1;
  l.slot_bytes = SlotLayout::kMaxSlotBytes + 1;
  EXPECT_FALSE(l.check());
  EXPECT_FALSE(HostSlotMemory::allocate(l));
}

}  // namespace
