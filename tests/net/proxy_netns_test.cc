// The bootstrap and the proxy transport between two "hosts": two network namespaces joined by a
// veth pair that the test creates (addresses of its own, no other hosts), one process in each.
// Data moved and verified with strangers knocking from the other namespace; a peer killed in
// the middle of a transfer; a link that goes down. Needs root and iproute2 (`ip`); skips with
// the reason otherwise.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <thread>

#include "efccl/net/bootstrap.h"
#include "efccl/net/proxy.h"
#include "net_test_util.h"
#include "network_namespaces.h"
#include "slot_traffic.h"

namespace {

using efccl::Status;
using efccl::net::Bootstrap;
using efccl::net::HostSlotMemory;
using efccl::net::NetConnection;
using efccl::net::Proxy;
using efccl::net::ProxySettings;
using efccl::net::SlotLayout;
using namespace net_test;

constexpr const char* kRoleVar = "EFCCL_NETNS_TEST_ROLE";
constexpr const char* kCountVar = "EFCCL_NETNS_TEST_COUNT";
constexpr const char* kDelayVar = "EFCCL_NETNS_TEST_DELAY_US";
constexpr const char* kProgressVar = "EFCCL_NETNS_TEST_PROGRESS";
constexpr const char* kTimeoutVar = "EFCCL_NETNS_TEST_PEER_TIMEOUT_MS";
constexpr uint64_t kHandleTag = 0x6e65746e730001;

// ---- the children: one "host" each ----

SlotLayout test_layout() {
  SlotLayout l;
  l.nslots = 6;
  l.slot_bytes = 256 * 1024;
  return l;
}

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

void report_progress(uint64_t n) {
  const char* path = std::getenv(kProgressVar);
  if (path == nullptr) return;
  const std::string tmp = std::string(path) + ".tmp";
  std::ofstream(tmp) << n;
  std::rename(tmp.c_str(), path);
}

/// A stranger in this namespace knocks at the receiver's proxy: garbage, then a hello with the
/// right connection id and a wrong token. Returns what went wrong ("" if both were refused).
std::string knock(const std::string& handle) {
  efccl::net::SocketAddress at;
  std::memcpy(static_cast<void*>(&at), handle.data() + 8, sizeof(at));
  const int garbage = connect_to(at.to_string());
  if (garbage < 0) return "cannot connect to " + at.to_string();
  write_all(garbage, std::string(100, '\x7f'));
  const bool closed = closed_by_peer(garbage, seconds(5));
  close(garbage);
  if (!closed) return "garbage was not refused";
  const int guess = connect_to(at.to_string());
  if (guess < 0) return "cannot connect again";
  std::string hello = handle.substr(0, 4) + handle.substr(4, 4) + handle.substr(36, 8) +
                      std::string(16, 'x') + std::string(4, '\0') + std::string(4, '\0');
  const uint32_t magic = 0x544e4645, one = 1;
  std::memcpy(hello.data(), &magic, 4);
  std::memcpy(hello.data() + 36, &one, 4);  // nsocks: any
  write_all(guess, hello);
  bool hung_up = false;
  const std::string reply = read_until_closed(guess, seconds(5), &hung_up);
  close(guess);
  if (!hung_up || reply.size() != 8) return "a wrong token was not refused";
  return "";
}

int child_main(const std::string& role) {
  const bool receiver = role.rfind("recv", 0) == 0;
  const auto fail = [&](int code, const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", role.c_str(), why.c_str());
    return code;
  };
  auto settings = ProxySettings::from_environment();
  if (!settings) return fail(2, settings.status().message());
  settings->peer_timeout = std::chrono::milliseconds(env_u64(kTimeoutVar, 60000));
  auto proxy = Proxy::start(*settings);
  if (!proxy) return fail(2, proxy.status().message());
  efccl::net::UniqueId id;
  if (Status s = efccl::net::create_unique_id(&id, seconds(30)); !s) return fail(3, s.message());
  auto boot = Bootstrap::start(id, 2, receiver ? 0 : 1, "", in(seconds(30)));
  if (!boot) return fail(3, boot.status().message());
  if (Status s = (*boot)->wait_ready(in(seconds(30)), nullptr); !s) return fail(3, s.message());
  auto memory = HostSlotMemory::allocate(test_layout());
  if (!memory) return fail(4, memory.status().message());
  const uint64_t count = env_u64(kCountVar, 1u << 30);
  const int delay = static_cast<int>(env_u64(kDelayVar, 0));
  std::unique_ptr<NetConnection> c;
  std::string handle;
  if (receiver) {
    auto recv = (*proxy)->expect(memory->region(), "recv from rank 1", &handle);
    if (!recv) return fail(5, recv.status().message());
    c = std::move(*recv);
    if (Status s = (*boot)->send(1, kHandleTag, handle, in(seconds(30))); !s)
      return fail(5, s.message());
    if (Status s = c->wait_open(in(seconds(30))); !s) return fail(5, s.message());
  } else {
    auto got = (*boot)->recv(0, kHandleTag, in(seconds(30)));
    if (!got) return fail(5, got.status().message());
    handle = *got;
    auto send = (*proxy)->connect(memory->region(), "send to rank 0", handle, in(seconds(30)));
    if (!send) return fail(5, send.status().message());
    c = std::move(*send);
  }
  // Strangers knock while the data moves.
  std::string knocked;
  std::thread stranger;
  if (role == "send-knocking") stranger = std::thread([&] { knocked = knock(handle); });
  std::atomic<uint64_t> done{0};
  Status moved;
  std::thread watcher;
  std::atomic<bool> stop_watching{false};
  if (receiver) {
    watcher = std::thread([&] {
      while (!stop_watching.load()) {
        report_progress(done.load());
        std::this_thread::sleep_for(milliseconds(5));
      }
    });
    moved = consume(*c, 0, count, in(seconds(60)), nullptr, &done);
    stop_watching.store(true);
    watcher.join();
    report_progress(done.load());
  } else {
    moved = produce(*c, 0, count, in(seconds(60)), nullptr, delay);
    report_progress(c->region().load_head());
  }
  if (stranger.joinable()) stranger.join();
  if (!knocked.empty()) return fail(6, knocked);
  if (role == "recv" || role == "send" || role == "send-knocking") {
    if (!moved) return fail(7, moved.message());
    c->close();
    (*boot)->close();
    return 0;
  }
  // Survivors: the transfer must end in the peer's failure, named as such.
  if (moved) return fail(8, "the transfer completed although the peer was killed");
  if (c->failure() != NetConnection::Failure::kRemote)
    return fail(9, "not a remote failure: " + moved.message());
  std::fprintf(stderr, "%s saw: %s\n", role.c_str(), moved.message().c_str());
  return 0;
}

const bool kIsChild = [] {
  if (const char* role = std::getenv(kRoleVar)) {
    std::fflush(stdout);
    std::_Exit(child_main(role));
  }
  return false;
}();

// ---- the test process: namespaces, veth, children ----

/// Starts this binary in host `i`'s namespace with `role`; rank 0 runs on host 0 (the receiver,
/// and the bootstrap's root at NCCL_COMM_ID).
pid_t spawn(const efccl_test::NetworkNamespaces& hosts, int i, const std::string& role,
            std::vector<std::string> vars) {
  vars.push_back(std::string(kRoleVar) + "=" + role);
  vars.push_back("NCCL_SOCKET_IFNAME==" + hosts.interface(i));
  vars.push_back("NCCL_COMM_ID=" + hosts.address(0) + ":" +
                 std::to_string(20000 + getpid() % 20000));
  return hosts.spawn(i, {"netns_child"}, vars);
}

/// What a child reported (0 until it did).
uint64_t progress(const std::string& path) {
  std::ifstream f(path);
  uint64_t n = 0;
  f >> n;
  return n;
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    hosts_ = efccl_test::NetworkNamespaces::create(&why);
    if (hosts_ == nullptr) GTEST_SKIP() << why;
    progress_ = "/tmp/efccl_netns_test_" + std::to_string(getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::remove(progress_.c_str());
  }
  void TearDown() override { std::remove(progress_.c_str()); }

  /// Waits until the child reporting to progress_ reached `n` (false after 20 s).
  bool await_progress(uint64_t n) {
    const auto until = in(seconds(20));
    while (progress(progress_) < n && Clock::now() < until)
      std::this_thread::sleep_for(milliseconds(5));
    return progress(progress_) >= n;
  }

  pid_t spawn(int i, const std::string& role, std::vector<std::string> vars) {
    return ::spawn(*hosts_, i, role, std::move(vars));
  }

  std::unique_ptr<efccl_test::NetworkNamespaces> hosts_;
  std::string progress_;
};

TEST_F(NetnsTest, MovesDataBetweenTwoHostsWhileStrangersAreRefused) {
  const std::vector<std::string> vars{std::string(kCountVar) + "=400", "NCCL_SOCKET_NTHREADS=2",
                                      "NCCL_NSOCKS_PERTHREAD=2"};
  std::vector<pid_t> children{spawn(0, "recv", vars), spawn(1, "send-knocking", vars)};
  ChildGuard guard(&children);
  EXPECT_EQ(wait_child(children[0], seconds(60)), 0);
  EXPECT_EQ(wait_child(children[1], seconds(60)), 0);
}

TEST_F(NetnsTest, ASenderKilledMidTransferFailsTheReceiverWithinItsTimeout) {
  std::vector<pid_t> children{
      spawn(0, "recv-survivor", {std::string(kProgressVar) + "=" + progress_}),
      spawn(1, "send-victim", {std::string(kDelayVar) + "=2000"})};
  ChildGuard guard(&children);
  ASSERT_TRUE(await_progress(50)) << "the transfer did not start";
  kill(children[1], SIGKILL);
  // The survivor sees the end of stream at once; well within its 60 s deadline.
  EXPECT_EQ(wait_child(children[0], seconds(10)), 0);
}

TEST_F(NetnsTest, AReceiverKilledMidTransferFailsTheSenderWithinItsTimeout) {
  std::vector<pid_t> children{
      spawn(0, "recv-victim", {std::string(kProgressVar) + "=" + progress_}),
      spawn(1, "send-survivor", {std::string(kDelayVar) + "=2000"})};
  ChildGuard guard(&children);
  ASSERT_TRUE(await_progress(50)) << "the transfer did not start";
  kill(children[0], SIGKILL);
  EXPECT_EQ(wait_child(children[1], seconds(10)), 0);
}

TEST_F(NetnsTest, ALinkThatGoesDownFailsBothEndsWithinThePeerTimeout) {
  // Nothing closes any socket: the sender's unacknowledged bytes (TCP_USER_TIMEOUT) and the
  // receiver's keepalive probes find the peer gone within about the peer timeout (2 s).
  const std::string timeout = std::string(kTimeoutVar) + "=2000";
  std::vector<pid_t> children{
      spawn(0, "recv-survivor", {std::string(kProgressVar) + "=" + progress_, timeout}),
      spawn(1, "send-survivor", {std::string(kDelayVar) + "=2000", timeout})};
  ChildGuard guard(&children);
  ASSERT_TRUE(await_progress(50)) << "the transfer did not start";
  ASSERT_TRUE(hosts_->link_down(0));
  EXPECT_EQ(wait_child(children[1], seconds(20)), 0);
  EXPECT_EQ(wait_child(children[0], seconds(20)), 0);
}

}  // namespace
