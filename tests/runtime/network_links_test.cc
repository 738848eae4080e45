// The runtime's network connections (runtime/src/launch/network_links.h): the ends of an
// executor's cross-host connections created in two "processes" (two bootstrap ranks and two
// proxies in this process), data moved through them, a peer's close reported with the code the
// API returns. In plain host memory (no GPU needed) and, with a GPU, in pinned host memory the
// GPU reads through its mapping.
#include "launch/network_links.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <net/if.h>

#include <thread>
#include <vector>

#include "efccl/net/interfaces.h"
#include "efccl/net/unique_id.h"
#include "slot_traffic.h"

namespace efccl::runtime {
namespace {

using net::Deadline;
using net::NetConnection;
using std::chrono::seconds;

Deadline soon() { return Deadline::after(std::chrono::seconds(30)); }

std::shared_ptr<net::Proxy> loopback_proxy() {
  net::ProxySettings s;
  for (const auto& i : net::list_interfaces(AF_INET))
    if (i.flags & IFF_LOOPBACK) s.interface = i;
  auto p = net::Proxy::start(s);
  EXPECT_TRUE(p) << p.status().message();
  return p ? *p : nullptr;
}

/// Two "processes" of one communicator (ranks 0 and 1), each with its bootstrap and proxy.
struct TwoProcesses {
  std::shared_ptr<net::Bootstrap> boot[2];
  std::shared_ptr<net::Proxy> proxy[2];
  TwoProcesses() {
    net::UniqueId id;
    EXPECT_TRUE(net::create_unique_id(&id, std::chrono::seconds(30)));
    for (int r = 0; r < 2; ++r) {
      auto b = net::Bootstrap::start(id, 2, r, "", soon());
      EXPECT_TRUE(b) << b.status().message();
      boot[r] = *b;
      proxy[r] = loopback_proxy();
    }
    for (auto& b : boot) EXPECT_TRUE(b->wait_ready(soon(), nullptr));
  }
};

/// Rank 0 sends to rank 1 on channel 0, rank 1 to rank 0 on channel 1: the ends process `me`
/// runs.
std::vector<NetworkEndRequest> ends_of(int me) {
  net::SlotLayout layout;
  layout.nslots = 4;
  layout.slot_bytes = 64 * 1024;
  return {{0, 1, 0, me == 0, layout}, {1, 0, 1, me == 1, layout}};
}

struct Connected {
  std::unique_ptr<NetworkLinks> links[2];
  std::atomic<int> failures[2] = {0, 0};
  std::atomic<ncclResult_t> code[2] = {ncclSuccess, ncclSuccess};
};

void connect_both(TwoProcesses& p, Connected& c, bool pinned) {
  Status failed[2];
  std::thread made[2];
  for (int r = 0; r < 2; ++r)
    made[r] = std::thread([&, r] {
      NetworkLinks::Options o;
      o.pinned = pinned;
      o.tag = 0x5157;
      auto links = NetworkLinks::connect(*p.proxy[r], *p.boot[r], {0, 1}, ends_of(r), o, soon(),
                                         nullptr, [&c, r](ncclResult_t code, const std::string&) {
                                           c.code[r] = code;
                                           c.failures[r].fetch_add(1);
                                         });
      if (links)
        c.links[r] = std::move(*links);
      else
        failed[r] = links.status();
    });
  for (int r = 0; r < 2; ++r) {
    made[r].join();
    ASSERT_TRUE(failed[r]) << failed[r].message();
    ASSERT_EQ(c.links[r]->ends().size(), 2u);
  }
}

/// Moves `count` slots each way and checks them.
void move_both_ways(Connected& c, uint64_t count) {
  // Rank 0's end 0 sends to rank 1's end 0; rank 1's end 1 sends to rank 0's end 1.
  Status s[4];
  std::thread t[4] = {
      std::thread(
          [&] { s[0] = net_test::produce(*c.links[0]->ends()[0].connection, 0, count, soon()); }),
      std::thread(
          [&] { s[1] = net_test::consume(*c.links[1]->ends()[0].connection, 0, count, soon()); }),
      std::thread(
          [&] { s[2] = net_test::produce(*c.links[1]->ends()[1].connection, 0, count, soon()); }),
      std::thread(
          [&] { s[3] = net_test::consume(*c.links[0]->ends()[1].connection, 0, count, soon()); })};
  for (auto& th : t) th.join();
  for (const Status& one : s) EXPECT_TRUE(one) << one.message();
}

#if !defined(EFCCL_NETWORK_LINKS_GPU)

TEST(NetworkLinks, ConnectsTheCrossHostEndsOfTwoProcessesAndMovesData) {
  TwoProcesses p;
  Connected c;
  connect_both(p, c, /*pinned=*/false);
  ASSERT_TRUE(c.links[0] && c.links[1]);
  for (int r = 0; r < 2; ++r)
    for (const NetworkEnd& e : c.links[r]->ends()) {
      ASSERT_NE(e.connection, nullptr);
      EXPECT_EQ(e.connection->state(), NetConnection::State::kOpen);
      EXPECT_EQ(e.connection->role() == NetConnection::Role::kSend, e.request.send);
      EXPECT_EQ(reinterpret_cast<char*>(e.host.tail), e.device);  // plain memory: one view
    }
  move_both_ways(c, 200);
  // A peer that goes in order (its links closed: goodbyes, as when its communicator is
  // destroyed) closes this side's ends without a failure: the communicator stays usable.
  c.links[1].reset();
  const auto closed = [&] {
    for (const NetworkEnd& e : c.links[0]->ends())
      if (e.connection->state() != NetConnection::State::kClosed) return false;
    return true;
  };
  const auto until = std::chrono::steady_clock::now() + seconds(10);
  while (!closed() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(closed());
  for (const NetworkEnd& e : c.links[0]->ends())
    EXPECT_EQ(e.connection->failure(), NetConnection::Failure::kPeerClosed);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a late handler would count
  EXPECT_EQ(c.failures[0].load(), 0);
}

TEST(NetworkLinks, FailureCodes) {
  EXPECT_EQ(network_failure_code(NetConnection::Failure::kRemote), ncclRemoteError);
  EXPECT_EQ(network_failure_code(NetConnection::Failure::kPeerClosed), ncclRemoteError);
  EXPECT_EQ(network_failure_code(NetConnection::Failure::kSystem), ncclSystemError);
}

#else  // the gpu binary

TEST(NetworkLinksGpu, PinnedEndsAreMappedForTheGpu) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    (void)cudaGetLastError();
    GTEST_SKIP() << "no CUDA GPU: pinned, mapped slot memory needs one";
  }
  TwoProcesses p;
  Connected c;
  connect_both(p, c, /*pinned=*/true);
  ASSERT_TRUE(c.links[0] && c.links[1]);
  move_both_ways(c, 50);
  // What arrived at rank 1's receiving end is what its GPU reads through the mapping.
  const NetworkEnd& end = c.links[1]->ends()[0];
  const net::SlotLayout& l = end.request.layout;
  ASSERT_NE(end.device, nullptr);
  std::vector<char> seen(l.slot_bytes);
  const uint64_t last = 49;
  ASSERT_EQ(
      cudaMemcpy(seen.data(), end.device + l.slots_offset() + (last % l.nslots) * l.slot_bytes,
                 l.slot_bytes, cudaMemcpyDeviceToHost),
      cudaSuccess);
  uint64_t tail = 0;
  ASSERT_EQ(cudaMemcpy(&tail, end.device + l.tail_offset(), 8, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(tail, 50u);
  const uint64_t size = net_test::slot_size(last, l.slot_bytes, l.sized);
  std::vector<char> expected(l.slot_bytes);
  net_test::fill_pattern(expected.data(), last, size);
  EXPECT_EQ(std::memcmp(seen.data(), expected.data(), size), 0);
}

#endif

}  // namespace
}  // namespace efccl::runtime
