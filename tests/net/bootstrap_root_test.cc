// The rendezvous root's defences (net/src/bootstrap_root.h), probed from outside as a stranger
// would: connections without the magic, hellos that claim 2^31-1 ranks (to a live root, and
// under NCCL_COMM_ID before rank 0's own hello), strangers claiming rank 0, idle connections and
// connect floods during a legitimate rendezvous, and 500 ids nobody uses. Each probe must end in
// an error for that connection or for the rendezvous, or in a completed job; never in an abort,
// a hang, an allocation proportional to a claim, or one log line per connection.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "efccl/net/bootstrap.h"
#include "efccl/net/frame.h"
#include "net_test_util.h"

namespace {

using efccl::net::Bootstrap;
using efccl::net::UniqueId;
using namespace net_test;

UniqueId new_id(std::chrono::milliseconds lifetime = seconds(60)) {
  UniqueId id;
  const efccl::Status s = efccl::net::create_unique_id(&id, lifetime);
  EXPECT_TRUE(s) << s.message();
  return id;
}

std::vector<std::shared_ptr<Bootstrap>> start_ranks(const UniqueId& id, int n,
                                                    const std::vector<int>& ranks) {
  std::vector<std::shared_ptr<Bootstrap>> boots(static_cast<std::size_t>(n));
  for (int r : ranks) {
    auto b = Bootstrap::start(id, n, r, "info-" + std::to_string(r), in(seconds(20)));
    EXPECT_TRUE(b) << b.status().message();
    if (b) boots[static_cast<std::size_t>(r)] = *b;
  }
  return boots;
}

/// Every rank's wait_ready succeeds and the ranks exchange a message around the ring.
void expect_job_completes(std::vector<std::shared_ptr<Bootstrap>>& boots) {
  const int n = static_cast<int>(boots.size());
  for (auto& b : boots) {
    ASSERT_NE(b, nullptr);
    const efccl::Status s = b->wait_ready(in(seconds(20)), nullptr);
    ASSERT_TRUE(s) << s.message();
  }
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(boots[static_cast<std::size_t>(r)]->send((r + 1) % n, 1, std::to_string(r),
                                                         in(seconds(20))));
  for (int r = 0; r < n; ++r) {
    auto got = boots[static_cast<std::size_t>(r)]->recv((r + n - 1) % n, 1, in(seconds(20)));
    ASSERT_TRUE(got) << got.status().message();
    EXPECT_EQ(*got, std::to_string((r + n - 1) % n));
  }
  for (auto& b : boots) b->close();
}

/// The text of the first kRootError frame in `bytes` (empty if there is none).
std::string root_error_in(const std::string& bytes) {
  if (bytes.size() < 40) return "";
  uint64_t length;
  uint32_t type;
  std::memcpy(&length, bytes.data() + 24, 8);
  std::memcpy(&type, bytes.data() + 32, 4);
  if (type != efccl::net::kRootError || bytes.size() < 40 + length) return "";
  return bytes.substr(40, length);
}

/// Connects to `root`, sends `bytes` and returns the root's error text (the root must answer and
/// close within 5 s).
std::string send_and_read_error(const std::string& root, const std::string& bytes) {
  const int fd = connect_to(root);
  EXPECT_GE(fd, 0) << root;
  if (fd < 0) return "";
  EXPECT_TRUE(write_all(fd, bytes));
  bool closed = false;
  const std::string got = read_until_closed(fd, seconds(5), &closed);
  close(fd);
  EXPECT_TRUE(closed) << "the root did not close the connection";
  return root_error_in(got);
}

long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

TEST(BootstrapRoot, StrangersAreRefusedWithoutDisturbingTheRendezvous) {
  LogCapture log;
  const UniqueId id = new_id();
  const uint64_t magic = magic_of(id);
  const std::string root = efccl::net::describe_unique_id(id);
  // Before any rank: a wrong magic, garbage, a right magic with a wrong message, and one that
  // says nothing at all (it stays connected throughout).
  const int wrong_magic = connect_to(root);
  const int garbage = connect_to(root);
  const int wrong_type = connect_to(root);
  const int silent = connect_to(root);
  ASSERT_GE(wrong_magic, 0);
  ASSERT_GE(garbage, 0);
  ASSERT_GE(wrong_type, 0);
  ASSERT_GE(silent, 0);
  ASSERT_TRUE(write_all(wrong_magic, frame(magic ^ 0x5a5a, 1, std::string(100, 'x'))));
  ASSERT_TRUE(write_all(garbage, "GET / HTTP/1.0\r\nHost: bootstrap\r\n\r\n"));
  ASSERT_TRUE(write_all(wrong_type, frame(magic, 99, "hello")));
  EXPECT_TRUE(closed_by_peer(wrong_magic, seconds(3)));
  EXPECT_TRUE(closed_by_peer(garbage, seconds(3)));
  EXPECT_TRUE(closed_by_peer(wrong_type, seconds(3)));
  ASSERT_TRUE(log.await("refused a connection", 1));
  EXPECT_TRUE(log.await("refused 2 more connections", 1, seconds(3))) << "counted, not one each";

  auto boots = start_ranks(id, 2, {0, 1});
  expect_job_completes(boots);
  for (int fd : {wrong_magic, garbage, wrong_type, silent}) close(fd);
}

TEST(BootstrapRoot, HelloClaimingTwoBillionRanksToALiveRootIsRefused) {
  const UniqueId id = new_id();
  const std::string root = efccl::net::describe_unique_id(id);
  auto boots = start_ranks(id, 2, {0});  // the rendezvous is under way
  const long before = resident_kib();
  for (uint32_t claim : {0x7fffffffu, 0xffffffffu, uint32_t{Bootstrap::kMaxRanks} + 1}) {
    const std::string error = send_and_read_error(
        root, frame(magic_of(id), efccl::net::kRootHello, root_hello(claim, 0)));
    EXPECT_TRUE(contains(error, "malformed hello")) << claim << ": " << error;
    EXPECT_TRUE(contains(error, "nranks must be 1..1048576")) << error;
  }
  EXPECT_LT(resident_kib() - before, 32 * 1024) << "memory grew with the claim";
  boots[1] = start_ranks(id, 2, {1})[1];
  expect_job_completes(boots);
}

TEST(BootstrapRoot, MemoryFollowsTheRanksThatJoinedNotTheirClaim) {
  // A holder of the id claims the largest job allowed: it defines nranks (the magic is secret,
  // so it is one of the job's processes), but nothing is sized by the claim; the real ranks'
  // disagreement fails the rendezvous with a message, not the process.
  const UniqueId id = new_id();
  const std::string root = efccl::net::describe_unique_id(id);
  const long before = resident_kib();
  const int claimant = connect_to(root);
  ASSERT_GE(claimant, 0);
  ASSERT_TRUE(
      write_all(claimant, frame(magic_of(id), efccl::net::kRootHello,
                                root_hello(Bootstrap::kMaxRanks, Bootstrap::kMaxRanks - 1))));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_LT(resident_kib() - before, 32 * 1024) << "memory grew with the claimed nranks";
  auto boots = start_ranks(id, 2, {0, 1});
  for (auto& b : boots) {
    const efccl::Status s = b->wait_ready(in(seconds(10)), nullptr);
    ASSERT_FALSE(s);
    EXPECT_TRUE(contains(s.message(), "says nranks 2, rank 1048575 said 1048576")) << s.message();
  }
  close(claimant);
}

TEST(BootstrapRoot, CommIdStrangersBeforeRankZeroCannotTakeAPlace) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv comm_id("NCCL_COMM_ID", address.c_str());
  const UniqueId id = new_id();
  const uint64_t magic = magic_of(id);  // public: the same in every process
  // Strangers knock until the root is up (rank 0 starts it), so that they are there first.
  struct Probe {
    std::string bytes;
    std::string expected;
    std::string error;
  };
  std::vector<Probe> probes = {
      {frame(magic, efccl::net::kRootHello, root_hello(0x7fffffff, 0)), "malformed hello", ""},
      {frame(magic, efccl::net::kRootHello, root_hello(0x7fffffff, 5)), "malformed hello", ""},
      {frame(magic, efccl::net::kRootHello, root_hello(5, 1)), "rank 0 started it for 3 ranks", ""},
      {frame(magic, efccl::net::kRootHello, root_hello(3, 0), 12345), "without its token", ""}};
  std::atomic<bool> stop{false};
  std::thread strangers([&] {
    for (Probe& p : probes) {
      int fd = -1;
      const auto give_up = in(seconds(20));
      while (fd < 0 && !stop.load() && Clock::now() < give_up) {
        fd = connect_to(address);
        if (fd < 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (fd < 0) return;
      write_all(fd, p.bytes);
      bool closed = false;
      p.error = root_error_in(read_until_closed(fd, seconds(5), &closed));
      close(fd);
    }
  });
  auto boots = start_ranks(id, 3, {2, 1});
  std::this_thread::sleep_for(milliseconds(50));
  boots[0] = start_ranks(id, 3, {0})[0];
  if (boots[0] == nullptr) stop = true;  // no root will come up
  strangers.join();
  for (const Probe& p : probes) EXPECT_TRUE(contains(p.error, p.expected)) << p.error;
  expect_job_completes(boots);
}

TEST(BootstrapRoot, IdleConnectionsDoNotStopTheJob) {
  const UniqueId id = new_id();
  const std::string root = efccl::net::describe_unique_id(id);
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_to(root);
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  auto boots = start_ranks(id, 3, {0, 1, 2});
  expect_job_completes(boots);
  for (int fd : idle) close(fd);
}

TEST(BootstrapRoot, ConnectFloodIsReportedAtMostOncePerSecond) {
  LogCapture log;
  const UniqueId id = new_id();
  const std::string root = efccl::net::describe_unique_id(id);
  const auto t0 = Clock::now();
  int flooded = 0;
  while (seconds_since(t0) < 1.5 && flooded < 3000) {
    const int fd = connect_to(root);
    ASSERT_GE(fd, 0);
    write_all(fd, "\x1b[2J garbage from a stranger\n");
    close(fd);
    ++flooded;
  }
  auto boots = start_ranks(id, 2, {0, 1});
  expect_job_completes(boots);
  std::this_thread::sleep_for(milliseconds(1300));  // the last count is reported
  const double took = seconds_since(t0);
  const auto lines = log.matching("refused");
  EXPECT_LE(static_cast<double>(lines.size()), took + 2) << flooded << " connections";
  EXPECT_GE(lines.size(), 2u);
  EXPECT_TRUE(log.count("more connections since the last report") >= 1) << flooded;
  for (const std::string& l : log.matching("bootstrap root"))
    EXPECT_EQ(l.find('\x1b'), std::string::npos) << "a stranger's bytes reached the log";
}

TEST(BootstrapRoot, UnusedIdsShareOneThreadAndExpire) {
  rlimit files{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 2048 && files.rlim_max > files.rlim_cur) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 4096);
    setrlimit(RLIMIT_NOFILE, &files);
  }
  ASSERT_GE(files.rlim_cur, 600u) << "500 listening sockets need more descriptors";
  const int threads_before = thread_count();
  const int fds_before = count_entries("/proc/self/fd");
  std::vector<UniqueId> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(new_id(milliseconds(1500)));
  EXPECT_LE(thread_count(), threads_before + 1) << "one thread serves every pending root";
  EXPECT_GE(count_entries("/proc/self/fd"), fds_before + 500);
  // Still served: a stranger is refused by the root, not by the kernel.
  const int probe = connect_to(efccl::net::describe_unique_id(ids.back()));
  ASSERT_GE(probe, 0);
  EXPECT_TRUE(write_all(probe, "nonsense"));
  EXPECT_TRUE(closed_by_peer(probe, seconds(3)));
  close(probe);
  // After the lifetime the roots are gone, with their thread and their sockets.
  const auto deadline = in(seconds(10));
  while (Clock::now() < deadline && thread_count() > threads_before)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_LE(thread_count(), threads_before);
  EXPECT_LE(count_entries("/proc/self/fd"), fds_before + 5);
  EXPECT_LT(connect_to(efccl::net::describe_unique_id(ids.front())), 0);
}

TEST(BootstrapRoot, ExpiredRootFailsTheRanksThatJoined) {
  const UniqueId id = new_id(milliseconds(300));
  auto boots = start_ranks(id, 2, {0});
  const auto t0 = Clock::now();
  const efccl::Status s = boots[0]->wait_ready(in(seconds(10)), nullptr);
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "the rendezvous expired: only 1 of 2 ranks joined"))
      << s.message();
  EXPECT_TRUE(contains(s.message(), "EFCCL_INIT_TIMEOUT_MS")) << s.message();
  EXPECT_GE(seconds_since(t0), 2.0) << "the root outlives its lifetime by 2 s";
  EXPECT_LT(seconds_since(t0), 6.0);
}

}  // namespace
