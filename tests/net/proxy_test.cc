// The proxy transport over loopback (efccl/net/proxy.h, net_connection.h): data moved and
// verified between two proxies of one process and between processes (the handle carried by the
// bootstrap), several sockets and threads, strangers refused without disturbing a transfer, a
// peer that dies or closes, a GPU side that breaks the protocol, and every wait's deadline.
#include "efccl/net/proxy.h"

#include <gtest/gtest.h>
#include <net/if.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "efccl/net/bootstrap.h"
#include "efccl/net/interfaces.h"
#include "net_test_util.h"
#include "slot_traffic.h"

namespace {

using efccl::Status;
using efccl::net::Bootstrap;
using efccl::net::Deadline;
using efccl::net::HostSlotMemory;
using efccl::net::NetConnection;
using efccl::net::Proxy;
using efccl::net::ProxySettings;
using efccl::net::SlotLayout;
using efccl::net::UniqueId;
using namespace net_test;

constexpr const char* kRoleVar = "EFCCL_PROXY_TEST_ROLE";
constexpr const char* kIdVar = "EFCCL_PROXY_TEST_ID";
constexpr const char* kFileVar = "EFCCL_PROXY_TEST_FILE";
constexpr uint64_t kHandleTag = 0x70726f78790001;

ProxySettings loopback(int threads = 1, int socks = 1) {
  ProxySettings s;
  for (const auto& i : efccl::net::list_interfaces(AF_INET))
    if (i.flags & IFF_LOOPBACK) s.interface = i;
  s.nthreads = threads;
  s.nsocks_per_thread = socks;
  return s;
}

std::shared_ptr<Proxy> start_proxy(const ProxySettings& s) {
  auto p = Proxy::start(s);
  EXPECT_TRUE(p) << p.status().message();
  return p ? *p : nullptr;
}

SlotLayout layout(uint32_t nslots, uint64_t slot_bytes, bool sized = true) {
  SlotLayout l;
  l.nslots = nslots;
  l.slot_bytes = slot_bytes;
  l.sized = sized;
  return l;
}

HostSlotMemory memory(const SlotLayout& l) {
  auto m = HostSlotMemory::allocate(l);
  EXPECT_TRUE(m) << m.status().message();
  return std::move(*m);
}

/// A connection between two proxies of this process.
struct Pair {
  HostSlotMemory send_memory, recv_memory;
  std::unique_ptr<NetConnection> send, recv;
};

Pair connect_pair(Proxy& receiver, Proxy& sender, const SlotLayout& l) {
  Pair p{memory(l), memory(l), nullptr, nullptr};
  std::string handle;
  auto recv = receiver.expect(p.recv_memory.region(), "recv from rank 0", &handle);
  EXPECT_TRUE(recv) << recv.status().message();
  auto send = sender.connect(p.send_memory.region(), "send to rank 1", handle, in(seconds(10)));
  EXPECT_TRUE(send) << send.status().message();
  if (!recv || !send) return p;
  p.recv = std::move(*recv);
  p.send = std::move(*send);
  const Status open = p.recv->wait_open(in(seconds(10)));
  EXPECT_TRUE(open) << open.message();
  return p;
}

/// Moves `count` slots through `p` and checks them.
void transfer(Pair& p, uint64_t count, uint64_t first = 0) {
  Status produced, consumed;
  std::thread producer([&] { produced = produce(*p.send, first, count, in(seconds(60))); });
  consumed = consume(*p.recv, first, count, in(seconds(60)));
  producer.join();
  EXPECT_TRUE(produced) << produced.message();
  EXPECT_TRUE(consumed) << consumed.message();
}

// ---- child processes: this binary again, with a role ----

/// Rank `rank` of a two-rank bootstrap; the other rank is the test process.
std::shared_ptr<Bootstrap> join(const UniqueId& id, int rank) {
  auto boot = Bootstrap::start(id, 2, rank, "", in(seconds(20)));
  if (!boot || !(*boot)->wait_ready(in(seconds(20)), nullptr)) return nullptr;
  return *boot;
}

int child_main(const std::string& role) {
  auto proxy = Proxy::start(loopback(2, 2));
  auto boot = join(from_hex(std::getenv(kIdVar)), 1);
  if (!proxy || boot == nullptr) return 2;
  const SlotLayout l = layout(4, 256 * 1024);
  HostSlotMemory m = memory(l);
  if (role == "sender" || role == "slow-sender") {
    auto handle = boot->recv(0, kHandleTag, in(seconds(20)));
    if (!handle) return 3;
    auto send = (*proxy)->connect(m.region(), "send to rank 0", *handle, in(seconds(20)));
    if (!send) {
      std::fprintf(stderr, "connect: %s\n", send.status().message().c_str());
      return 4;
    }
    // A slow sender is killed by the test while it sends.
    const Status s = produce(**send, 0, role == "sender" ? 300 : 1u << 30, in(seconds(60)), nullptr,
                             role == "sender" ? 0 : 2000);
    if (!s) std::fprintf(stderr, "produce: %s\n", s.message().c_str());
    (*send)->close();
    boot->close();
    return s ? 0 : 5;
  }
  if (role == "receiver") {  // receives until the test kills it
    std::string handle;
    auto recv = (*proxy)->expect(m.region(), "recv from rank 0", &handle);
    if (!recv || !boot->send(0, kHandleTag, handle, in(seconds(20)))) return 3;
    std::atomic<uint64_t> done{0};
    const Status s = consume(**recv, 0, 1u << 30, in(seconds(60)), nullptr, &done);
    return s ? 0 : 5;
  }
  return 9;
}

const bool kIsChild = [] {
  if (const char* role = std::getenv(kRoleVar)) {
    std::fflush(stdout);
    std::_Exit(child_main(role));
  }
  return false;
}();

UniqueId new_id() {
  UniqueId id;
  const Status s = efccl::net::create_unique_id(&id, seconds(60));
  EXPECT_TRUE(s) << s.message();
  return id;
}

pid_t spawn(const char* role, const UniqueId& id) {
  return spawn_self({std::string(kRoleVar) + "=" + role, std::string(kIdVar) + "=" + to_hex(id)});
}

// ---- tests ----

TEST(Proxy, MovesSizedSlotsBetweenTwoProxies) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(4, 64 * 1024));
  ASSERT_TRUE(p.send && p.recv);
  EXPECT_EQ(p.send->state(), NetConnection::State::kOpen);
  EXPECT_EQ(p.recv->state(), NetConnection::State::kOpen);
  transfer(p, 500);
  // The sender's count rises before its head does.
  ASSERT_TRUE(p.send->wait_for(NetConnection::Counter::kHead, 500, in(seconds(10))));
  EXPECT_EQ(p.send->bytes_moved(), p.recv->bytes_moved());
  EXPECT_GT(p.recv->bytes_moved(), 0u);
  EXPECT_TRUE(p.send->status());
  EXPECT_TRUE(p.recv->status());
}

TEST(Proxy, WorksOverIpv6) {
  ProxySettings s;
  for (const auto& i : efccl::net::list_interfaces(AF_INET6))
    if (i.flags & IFF_LOOPBACK) s.interface = i;
  if (!s.interface.address.valid()) GTEST_SKIP() << "no IPv6 loopback address here";
  auto a = start_proxy(s), b = start_proxy(s);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(contains(a->listen_address(), "[::1]")) << a->listen_address();
  Pair p = connect_pair(*a, *b, layout(4, 32 * 1024));
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, 50);
}

TEST(Proxy, ManySocketsAndThreadsStripeLargeSlots) {
  // 3 threads x 2 sockets: slots of 1 MiB travel in 6 stripes, small ones on socket 0.
  auto a = start_proxy(loopback(3, 2)), b = start_proxy(loopback(3, 2));
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(6, 1 << 20));
  ASSERT_TRUE(p.send && p.recv);
  EXPECT_EQ(p.send->sockets(), 6);
  EXPECT_EQ(p.recv->sockets(), 6);
  transfer(p, 200);
}

TEST(Proxy, WholeSlotsWhenTheLayoutIsNotSized) {
  auto a = start_proxy(loopback(2, 1)), b = start_proxy(loopback(2, 1));
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(3, 200 * 1024 + 8, false));
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, 100);
  EXPECT_EQ(p.recv->bytes_moved(), 100u * (200 * 1024 + 8));
}

TEST(Proxy, OneProxyCarriesSeveralConnectionsBothWays) {
  auto a = start_proxy(loopback(2, 1)), b = start_proxy(loopback(2, 1));
  ASSERT_TRUE(a && b);
  Pair ab = connect_pair(*b, *a, layout(4, 32 * 1024));
  Pair ba = connect_pair(*a, *b, layout(2, 128 * 1024));
  Pair ab2 = connect_pair(*b, *a, layout(8, 4096));
  ASSERT_TRUE(ab.send && ba.send && ab2.send);
  std::thread t1([&] { transfer(ab, 300); });
  std::thread t2([&] { transfer(ba, 300); });
  transfer(ab2, 300);
  t1.join();
  t2.join();
}

TEST(Proxy, CountersPersistAcrossBursts) {
  // Like kernels of successive calls: the counters go on growing.
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(4, 16 * 1024));
  ASSERT_TRUE(p.send && p.recv);
  for (uint64_t burst = 0; burst < 5; ++burst) {
    transfer(p, 37, burst * 37);
    std::this_thread::sleep_for(milliseconds(20));  // the proxy threads go idle between bursts
  }
}

TEST(Proxy, StrangersAreRefusedWithoutDisturbingATransfer) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  LogCapture log;
  Pair p = connect_pair(*a, *b, layout(4, 64 * 1024));
  ASSERT_TRUE(p.send && p.recv);
  const std::string address = a->listen_address();
  Status produced, consumed;
  std::thread producer([&] { produced = produce(*p.send, 0, 400, in(seconds(60)), nullptr, 200); });
  std::thread consumer([&] { consumed = consume(*p.recv, 0, 400, in(seconds(60))); });

  // Garbage: closed at once.
  const int garbage = connect_to(address);
  ASSERT_GE(garbage, 0);
  EXPECT_TRUE(write_all(garbage, "GET / HTTP/1.0\r\n\r\n"));
  EXPECT_TRUE(closed_by_peer(garbage, seconds(5)));
  close(garbage);
  // A hello with the right magic and a made-up connection: a reply saying why, then closed.
  const int guess = connect_to(address);
  ASSERT_GE(guess, 0);
  std::string hello(40, '\0');
  const uint32_t magic = 0x544e4645, version = 1;
  const uint64_t id = 1;  // the connection's id is 1 at a fresh proxy: only the token is wrong
  std::memcpy(hello.data(), &magic, 4);
  std::memcpy(hello.data() + 4, &version, 4);
  std::memcpy(hello.data() + 8, &id, 8);
  const uint32_t nsocks = 1;
  std::memcpy(hello.data() + 36, &nsocks, 4);
  EXPECT_TRUE(write_all(guess, hello));
  bool closed = false;
  const std::string reply = read_until_closed(guess, seconds(5), &closed);
  EXPECT_TRUE(closed);
  ASSERT_EQ(reply.size(), 8u);
  uint32_t code = 0;
  std::memcpy(&code, reply.data() + 4, 4);
  EXPECT_EQ(code, 3u);  // kBadToken
  close(guess);
  // A silent connection is kept pending; it takes nothing from anyone.
  const int silent = connect_to(address);
  ASSERT_GE(silent, 0);

  producer.join();
  consumer.join();
  close(silent);
  EXPECT_TRUE(produced) << produced.message();
  EXPECT_TRUE(consumed) << consumed.message();
  EXPECT_GE(a->refused(), 2u);
  EXPECT_TRUE(p.send->status());
  EXPECT_TRUE(p.recv->status());
  EXPECT_TRUE(log.await("network proxy at " + address, 1));
  for (const std::string& line : log.matching("network proxy at"))
    EXPECT_EQ(line.find("\r"), std::string::npos) << "peer bytes must be escaped: " << line;
}

/// A hello for socket 0 of the connection `handle` describes (the token holder's).
std::string hello_for(const std::string& handle) {
  std::string hello(40, '\0');
  const uint32_t magic = 0x544e4645, version = 1, index = 0, nsocks = 1;
  std::memcpy(hello.data(), &magic, 4);
  std::memcpy(hello.data() + 4, &version, 4);
  std::memcpy(hello.data() + 8, handle.data() + 36, 8 + 16);  // id and token
  std::memcpy(hello.data() + 32, &index, 4);
  std::memcpy(hello.data() + 36, &nsocks, 4);
  return hello;
}

/// A stripe header as the wire has it.
std::string stripe(uint32_t type, uint32_t length, uint64_t seq, uint32_t total, uint32_t offset) {
  std::string h(24, '\0');
  std::memcpy(h.data(), &type, 4);
  std::memcpy(h.data() + 4, &length, 4);
  std::memcpy(h.data() + 8, &seq, 8);
  std::memcpy(h.data() + 16, &total, 4);
  std::memcpy(h.data() + 20, &offset, 4);
  return h;
}

TEST(Proxy, AnAuthenticatedPeerThatBreaksTheProtocolFailsOnlyItsConnection) {
  auto a = start_proxy(loopback());
  ASSERT_TRUE(a);
  const SlotLayout l = layout(2, 4096);
  struct Case {
    std::string bytes, why;
  };
  const std::vector<Case> cases = {
      {stripe(1, 5000, 0, 5000, 0) + std::string(16, 'x'), "a slot of 5000 bytes"},
      {stripe(1, 100, 0, 200, 100), "not this socket's"},
      {stripe(7, 0, 0, 0, 0), "unknown type 7"},
      {stripe(1, 10, 1, 10, 0) + std::string(10, 'x') + stripe(1, 10, 0, 10, 0),
       "slot 0 after slot 1"},
  };
  auto b = start_proxy(loopback());
  ASSERT_TRUE(b);
  Pair bystander = connect_pair(*a, *b, l);  // another connection of the same proxy
  ASSERT_TRUE(bystander.send && bystander.recv);
  for (const Case& c : cases) {
    HostSlotMemory m = memory(l);
    std::string handle;
    auto recv = a->expect(m.region(), "recv from a bad peer", &handle);
    ASSERT_TRUE(recv);
    const int fd = connect_to(a->listen_address());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(write_all(fd, hello_for(handle)));
    ASSERT_TRUE((*recv)->wait_open(in(seconds(10))));
    ASSERT_TRUE(write_all(fd, c.bytes));
    const Status s = (*recv)->wait_for(NetConnection::Counter::kTail, 3, in(seconds(10)));
    close(fd);
    EXPECT_FALSE(s);
    EXPECT_TRUE(contains(s.message(), c.why)) << s.message();
    EXPECT_EQ((*recv)->failure(), NetConnection::Failure::kRemote) << s.message();
  }
  transfer(bystander, 50);
  EXPECT_TRUE(bystander.recv->status());
}

TEST(Proxy, KeepsAtMost128SilentConnections) {
  auto a = start_proxy(loopback());
  ASSERT_TRUE(a);
  std::vector<int> fds;
  for (int i = 0; i < 130; ++i) {
    fds.push_back(connect_to(a->listen_address()));
    ASSERT_GE(fds.back(), 0);
  }
  // The oldest two go; the newest stays (until its 10 s pass).
  EXPECT_TRUE(closed_by_peer(fds[0], seconds(5)));
  EXPECT_TRUE(closed_by_peer(fds[1], seconds(5)));
  EXPECT_FALSE(closed_by_peer(fds[129], milliseconds(200)));
  for (int fd : fds) close(fd);
  // The proxy still serves.
  auto b = start_proxy(loopback());
  Pair p = connect_pair(*a, *b, layout(2, 4096));
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, 10);
}

TEST(Proxy, ASocketIndexTakenTwiceIsRefused) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  const SlotLayout l = layout(2, 4096);
  HostSlotMemory rm = memory(l), sm = memory(l), sm2 = memory(l);
  std::string handle;
  auto recv = a->expect(rm.region(), "recv", &handle);
  ASSERT_TRUE(recv);
  auto send = b->connect(sm.region(), "send", handle, in(seconds(10)));
  ASSERT_TRUE(send) << send.status().message();
  // Whoever holds the handle can connect once; a second sender is refused.
  auto again = b->connect(sm2.region(), "send again", handle, in(seconds(10)));
  ASSERT_FALSE(again);
  EXPECT_TRUE(contains(again.status().message(), "refused by the receiver"))
      << again.status().message();
}

TEST(Proxy, AClosedConnectionRefusesItsSenderAndAWrongLayoutFailsAtOnce) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  HostSlotMemory rm = memory(layout(2, 4096)), sm = memory(layout(4, 4096));
  std::string handle;
  auto recv = a->expect(rm.region(), "recv", &handle);
  ASSERT_TRUE(recv);
  auto wrong = b->connect(sm.region(), "send", handle, in(seconds(10)));
  ASSERT_FALSE(wrong);
  EXPECT_TRUE(contains(wrong.status().message(), "disagree on the slots"))
      << wrong.status().message();
  (*recv)->close();
  HostSlotMemory sm2 = memory(layout(2, 4096));
  auto late = b->connect(sm2.region(), "send", handle, in(seconds(10)));
  ASSERT_FALSE(late);
  EXPECT_TRUE(contains(late.status().message(), "not expected") ||
              contains(late.status().message(), "no such connection"))
      << late.status().message();
  EXPECT_FALSE(b->connect(sm2.region(), "send", "garbage", in(seconds(1))));
}

TEST(Proxy, WaitsEndAtTheirDeadlineOrAbort) {
  auto a = start_proxy(loopback());
  ASSERT_TRUE(a);
  HostSlotMemory rm = memory(layout(2, 4096));
  std::string handle;
  auto recv = a->expect(rm.region(), "recv from nobody", &handle);
  ASSERT_TRUE(recv);
  auto t0 = Clock::now();
  Status s = (*recv)->wait_open(Deadline::after(milliseconds(300)));
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "0 of 1 sockets")) << s.message();
  EXPECT_TRUE(contains(s.message(), "within 300 ms")) << s.message();
  EXPECT_LT(seconds_since(t0), 3.0);
  std::atomic<bool> abort{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    abort.store(true);
  });
  t0 = Clock::now();
  s = (*recv)->wait_for(NetConnection::Counter::kTail, 1, in(seconds(30)), &abort);
  aborter.join();
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "aborted")) << s.message();
  EXPECT_LT(seconds_since(t0), 3.0);
  // Connecting to a port nobody serves ends at the deadline.
  HostSlotMemory sm = memory(layout(2, 4096));
  std::string dead = handle;
  uint16_t port = static_cast<uint16_t>(free_port());
  port = htons(port);
  std::memcpy(dead.data() + 8 + 2, &port, 2);  // the address's port (sockaddr_in.sin_port)
  t0 = Clock::now();
  auto send = a->connect(sm.region(), "send to nobody", dead, Deadline::after(milliseconds(500)));
  EXPECT_FALSE(send);
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(Proxy, ThePeerClosingIsReportedAndEndsWaits) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(4, 8192));
  ASSERT_TRUE(p.send && p.recv);
  transfer(p, 20);
  std::atomic<int> calls{0};
  NetConnection::Failure seen = NetConnection::Failure::kNone;
  p.recv->set_failure_handler([&](NetConnection::Failure f, const std::string&) {
    seen = f;
    calls.fetch_add(1);
  });
  // Posted slots still arrive before the goodbye.
  ASSERT_TRUE(produce(*p.send, 20, 3, in(seconds(10))));
  p.send->close();
  EXPECT_TRUE(consume(*p.recv, 20, 3, in(seconds(10))));
  const Status s = p.recv->wait_for(NetConnection::Counter::kTail, 24, in(seconds(10)));
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "closed")) << s.message();
  EXPECT_EQ(p.recv->state(), NetConnection::State::kClosed);
  EXPECT_EQ(p.recv->failure(), NetConnection::Failure::kPeerClosed);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen, NetConnection::Failure::kPeerClosed);
  EXPECT_EQ(p.send->state(), NetConnection::State::kClosed);
  EXPECT_EQ(p.send->failure(), NetConnection::Failure::kNone);
}

TEST(Proxy, AGpuSideThatBreaksTheProtocolFailsItsOwnEnd) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(2, 4096));
  ASSERT_TRUE(p.send && p.recv);
  p.send->region().sizes[0] = 5000;  // more than a slot holds
  p.send->region().store_tail(1);
  Status s = p.send->wait_for(NetConnection::Counter::kHead, 1, in(seconds(10)));
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "5000 bytes")) << s.message();
  EXPECT_EQ(p.send->failure(), NetConnection::Failure::kSystem);
  // Its peer learns that the connection is gone, as if its process had died.
  s = p.recv->wait_for(NetConnection::Counter::kTail, 1, in(seconds(10)));
  EXPECT_FALSE(s);
  EXPECT_EQ(p.recv->failure(), NetConnection::Failure::kRemote) << s.message();
}

TEST(Proxy, AReceivingGpuFreeingUnarrivedSlotsFailsItsOwnEnd) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  Pair p = connect_pair(*a, *b, layout(2, 4096));
  ASSERT_TRUE(p.send && p.recv);
  p.recv->region().store_head(3);
  ASSERT_TRUE(produce(*p.send, 0, 1, in(seconds(10))));  // found when the next slot arrives
  const Status s = p.recv->wait_for(NetConnection::Counter::kTail, 1, in(seconds(10)));
  EXPECT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "head beyond tail")) << s.message();
  EXPECT_EQ(p.recv->failure(), NetConnection::Failure::kSystem);
}

TEST(ProxyProcesses, MovesDataBetweenProcessesWithTheHandleFromTheBootstrap) {
  const UniqueId id = new_id();
  std::vector<pid_t> children{spawn("sender", id)};
  ChildGuard guard(&children);
  auto boot = join(id, 0);
  ASSERT_NE(boot, nullptr);
  auto proxy = start_proxy(loopback(2, 2));
  ASSERT_TRUE(proxy);
  const SlotLayout l = layout(4, 256 * 1024);
  HostSlotMemory m = memory(l);
  std::string handle;
  auto recv = proxy->expect(m.region(), "recv from rank 1", &handle);
  ASSERT_TRUE(recv);
  ASSERT_TRUE(boot->send(1, kHandleTag, handle, in(seconds(20))));
  ASSERT_TRUE((*recv)->wait_open(in(seconds(20))));
  const Status s = consume(**recv, 0, 300, in(seconds(60)));
  EXPECT_TRUE(s) << s.message();
  EXPECT_EQ(wait_child(children[0], seconds(30)), 0);
}

TEST(ProxyProcesses, ASenderKilledMidTransferFailsTheReceiverPromptly) {
  const UniqueId id = new_id();
  std::vector<pid_t> children{spawn("slow-sender", id)};
  ChildGuard guard(&children);
  auto boot = join(id, 0);
  ASSERT_NE(boot, nullptr);
  auto proxy = start_proxy(loopback(2, 2));
  ASSERT_TRUE(proxy);
  HostSlotMemory m = memory(layout(4, 256 * 1024));
  std::string handle;
  auto recv = proxy->expect(m.region(), "recv from rank 1", &handle);
  ASSERT_TRUE(recv);
  ASSERT_TRUE(boot->send(1, kHandleTag, handle, in(seconds(20))));
  std::atomic<uint64_t> done{0};
  Status s;
  Clock::time_point failed_at;
  std::thread consumer([&] {
    s = consume(**recv, 0, 1u << 30, in(seconds(60)), nullptr, &done);
    failed_at = Clock::now();
  });
  const auto until = in(seconds(20));
  while (done.load() < 50 && Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
  const uint64_t received = done.load();
  const auto killed_at = Clock::now();
  kill(children[0], SIGKILL);
  consumer.join();
  ASSERT_GE(received, 50u) << s.message();
  EXPECT_FALSE(s);
  EXPECT_EQ((*recv)->failure(), NetConnection::Failure::kRemote) << s.message();
  EXPECT_TRUE(contains(s.message(), "without a goodbye")) << s.message();
  EXPECT_LT(std::chrono::duration<double>(failed_at - killed_at).count(), 5.0);
}

TEST(ProxyProcesses, AReceiverKilledMidTransferFailsTheSenderPromptly) {
  const UniqueId id = new_id();
  std::vector<pid_t> children{spawn("receiver", id)};
  ChildGuard guard(&children);
  auto boot = join(id, 0);
  ASSERT_NE(boot, nullptr);
  auto proxy = start_proxy(loopback(2, 2));
  ASSERT_TRUE(proxy);
  HostSlotMemory m = memory(layout(4, 256 * 1024));
  auto handle = boot->recv(1, kHandleTag, in(seconds(20)));
  ASSERT_TRUE(handle);
  auto send = proxy->connect(m.region(), "send to rank 1", *handle, in(seconds(20)));
  ASSERT_TRUE(send) << send.status().message();
  Status s;
  Clock::time_point failed_at;
  std::thread producer([&] {
    s = produce(**send, 0, 1u << 30, in(seconds(60)), nullptr, 2000);
    failed_at = Clock::now();
  });
  const auto until = in(seconds(20));
  while ((*send)->region().load_head() < 50 && Clock::now() < until)
    std::this_thread::sleep_for(milliseconds(5));
  const uint64_t sent = (*send)->region().load_head();
  const auto killed_at = Clock::now();
  kill(children[0], SIGKILL);
  producer.join();
  ASSERT_GE(sent, 50u) << s.message();
  EXPECT_FALSE(s);
  EXPECT_EQ((*send)->failure(), NetConnection::Failure::kRemote) << s.message();
  EXPECT_LT(std::chrono::duration<double>(failed_at - killed_at).count(), 5.0);
}

TEST(Proxy, AForkedChildDestroysItsInheritedCopiesHarmlessly) {
  auto a = start_proxy(loopback()), b = start_proxy(loopback());
  ASSERT_TRUE(a && b);
  auto p = std::make_unique<Pair>(connect_pair(*a, *b, layout(4, 16 * 1024)));
  ASSERT_TRUE(p->send && p->recv);
  transfer(*p, 20);
  const pid_t child = fork();
  if (child == 0) {  // as a DataLoader worker forked from a rank would
    p.reset();
    a.reset();
    b.reset();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(wait_child(child, seconds(10)), 0);
  // The parent's connection goes on: the child held /dev/null, not the sockets.
  transfer(*p, 20, 20);
  EXPECT_TRUE(p->send->status());
  EXPECT_TRUE(p->recv->status());
}

TEST(Proxy, StopsWithoutLeakingThreadsOrDescriptors) {
  const int threads = thread_count(), fds = count_entries("/proc/self/fd");
  {
    auto a = start_proxy(loopback(3, 1)), b = start_proxy(loopback(3, 1));
    ASSERT_TRUE(a && b);
    Pair p = connect_pair(*a, *b, layout(4, 4096));
    ASSERT_TRUE(p.send && p.recv);
    transfer(p, 10);
  }
  EXPECT_EQ(thread_count(), threads);
  EXPECT_EQ(count_entries("/proc/self/fd"), fds);
}

}  // namespace
