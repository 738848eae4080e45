// The multi-process bootstrap (efccl/net/bootstrap.h) without GPUs: ranks as threads of this
// process and as child processes (this binary, re-executed with a role in its environment),
// the collectives, strangers at a rank's listener, the rendezvous errors, timeouts and their
// wording, aborts, killed and departing peers, NCCL_COMM_ID, NCCL_SOCKET_IFNAME and
// NCCL_SOCKET_FAMILY. The root's defences are bootstrap_root_test.cc's.
#include "efccl/net/bootstrap.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net_test_util.h"

namespace {

using efccl::net::Bootstrap;
using efccl::net::UniqueId;
using namespace net_test;

constexpr const char* kRoleVar = "EFCCL_BOOTSTRAP_TEST_ROLE";
constexpr const char* kIdVar = "EFCCL_BOOTSTRAP_TEST_ID";
constexpr const char* kRankVar = "EFCCL_BOOTSTRAP_TEST_RANK";
constexpr const char* kNranksVar = "EFCCL_BOOTSTRAP_TEST_NRANKS";

std::string info_of(int rank) { return "info-of-rank-" + std::to_string(rank); }

UniqueId new_id() {
  UniqueId id;
  const efccl::Status s = efccl::net::create_unique_id(&id, seconds(60));
  EXPECT_TRUE(s) << s.message();
  return id;
}

/// The work every member does once ready; 0 or the number of the step that failed (stderr says
/// why). Used by threads and child processes alike.
int member_body(Bootstrap& boot) {
  const int rank = boot.rank(), n = boot.nranks();
  const auto fail = [&](int code, const std::string& why) {
    std::fprintf(stderr, "rank %d: step %d: %s\n", rank, code, why.c_str());
    return code;
  };
  const auto deadline = in(seconds(20));
  if (static_cast<int>(boot.infos().size()) != n) return fail(11, "infos() has the wrong size");
  for (int r = 0; r < n; ++r)
    if (boot.infos()[static_cast<std::size_t>(r)] != info_of(r)) return fail(12, "bad info");
  auto all = boot.allgather(1, "ag-" + std::to_string(rank), deadline, nullptr);
  if (!all) return fail(13, all.status().message());
  for (int r = 0; r < n; ++r)
    if ((*all)[static_cast<std::size_t>(r)] != "ag-" + std::to_string(r))
      return fail(14, "allgather slot " + std::to_string(r) + " holds " +
                          (*all)[static_cast<std::size_t>(r)]);
  if (efccl::Status s = boot.barrier(2, deadline, nullptr); !s) return fail(15, s.message());
  if (efccl::Status s = boot.send((rank + 1) % n, 3, "ring-" + std::to_string(rank), deadline); !s)
    return fail(16, s.message());
  auto got = boot.recv((rank + n - 1) % n, 3, deadline);
  if (!got) return fail(17, got.status().message());
  if (*got != "ring-" + std::to_string((rank + n - 1) % n)) return fail(18, "ring got " + *got);
  if (efccl::Status s = boot.barrier(4, deadline, nullptr); !s) return fail(19, s.message());
  return 0;
}

/// A child process's life (this binary re-executed with kRoleVar set), before gtest starts.
int child_main(const std::string& role) {
  const UniqueId id = from_hex(std::getenv(kIdVar));
  const int rank = std::atoi(std::getenv(kRankVar));
  const int nranks = std::atoi(std::getenv(kNranksVar));
  auto boot = Bootstrap::start(id, nranks, rank, info_of(rank), in(seconds(20)));
  if (!boot) {
    std::fprintf(stderr, "child rank %d: start: %s\n", rank, boot.status().message().c_str());
    return 2;
  }
  if (efccl::Status s = (*boot)->wait_ready(in(seconds(20)), nullptr); !s) {
    std::fprintf(stderr, "child rank %d: wait_ready: %s\n", rank, s.message().c_str());
    return 3;
  }
  if (role == "member") {
    const int rc = member_body(**boot);
    (*boot)->close();
    return rc;
  }
  if (role == "sleeper") {  // says it is alive, then waits to be killed
    if (!(*boot)->send(0, 5, "alive", in(seconds(20)))) return 4;
    std::this_thread::sleep_for(seconds(30));
    return 0;
  }
  if (role == "forker") {  // a child of its own holds copies of the sockets, then it gets killed
    if (!(*boot)->send(0, 5, "alive", in(seconds(20)))) return 4;
    const pid_t grandchild = fork();
    if (grandchild == 0) {  // outlives its parent (the test kills it, else it ends by itself)
      std::this_thread::sleep_for(seconds(10));
      _exit(0);
    }
    if (!(*boot)->send(0, 6, std::to_string(grandchild), in(seconds(20)))) return 5;
    std::this_thread::sleep_for(seconds(30));
    return 0;
  }
  if (role == "closer") {  // says goodbye in order
    if (!(*boot)->send(0, 5, "bye", in(seconds(20)))) return 4;
    (*boot)->close();
    return 0;
  }
  return 9;
}

// Runs before main(): a child process does its role and exits without running any test.
const bool kIsChild = [] {
  if (const char* role = std::getenv(kRoleVar)) {
    std::fflush(stdout);
    std::_Exit(child_main(role));
  }
  return false;
}();

/// Starts this binary as rank `rank` of `nranks` in `role`.
pid_t spawn_child(const char* role, const UniqueId& id, int nranks, int rank) {
  return spawn_self({std::string(kRoleVar) + "=" + role, std::string(kIdVar) + "=" + to_hex(id),
                     std::string(kRankVar) + "=" + std::to_string(rank),
                     std::string(kNranksVar) + "=" + std::to_string(nranks)});
}

/// Starts ranks 0..n-1 one after another from this thread, then waits for each (a group).
std::vector<std::shared_ptr<Bootstrap>> start_group(const UniqueId& id, int n) {
  std::vector<std::shared_ptr<Bootstrap>> boots;
  for (int r = 0; r < n; ++r) {
    auto b = Bootstrap::start(id, n, r, info_of(r), in(seconds(20)));
    EXPECT_TRUE(b) << b.status().message();
    if (!b) return {};
    boots.push_back(*b);
  }
  for (auto& b : boots) {
    const efccl::Status s = b->wait_ready(in(seconds(20)), nullptr);
    EXPECT_TRUE(s) << s.message();
    if (!s) return {};
  }
  return boots;
}

template <typename F>
void on_threads(int n, F f) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(f, r);
  for (auto& t : threads) t.join();
}

// ---- Arguments ----

TEST(Bootstrap, RejectsBadArguments) {
  const UniqueId id = new_id();
  const auto deadline = in(seconds(20));
  EXPECT_FALSE(Bootstrap::start(id, 0, 0, "", deadline));
  auto too_many = Bootstrap::start(id, Bootstrap::kMaxRanks + 1, 0, "", deadline);
  ASSERT_FALSE(too_many);
  EXPECT_TRUE(contains(too_many.status().message(), "must be in 1..1048576"))
      << too_many.status().message();
  auto out_of_range = Bootstrap::start(id, 2, 2, "", deadline);
  ASSERT_FALSE(out_of_range);
  EXPECT_TRUE(contains(out_of_range.status().message(), "rank 2 is out of range"));
  auto too_big =
      Bootstrap::start(id, 2, 0, std::string(Bootstrap::kMaxInfoBytes + 1, 'x'), deadline);
  ASSERT_FALSE(too_big);
  EXPECT_TRUE(contains(too_big.status().message(), "limit")) << too_big.status().message();
  UniqueId zero{};
  auto foreign = Bootstrap::start(zero, 2, 0, "", deadline);
  ASSERT_FALSE(foreign);
  EXPECT_TRUE(contains(foreign.status().message(), "unique id")) << foreign.status().message();

  // Before the rendezvous completed: no sends, no subsets.
  auto lonely = Bootstrap::start(id, 2, 0, "", deadline);
  ASSERT_TRUE(lonely) << lonely.status().message();
  const efccl::Status early = (*lonely)->send(1, 1, "x", in(milliseconds(500)));
  EXPECT_FALSE(early);
  EXPECT_TRUE(contains(early.message(), "before the rendezvous completed")) << early.message();
  EXPECT_EQ((*lonely)->subset({0}, 1), nullptr);
  EXPECT_FALSE((*lonely)->send(2, 1, "x", deadline));
  EXPECT_TRUE((*lonely)->infos().empty());
  (*lonely)->close();
  (*lonely)->close();  // idempotent
  EXPECT_FALSE((*lonely)->send(0, 1, "x", deadline));
}

// ---- Rendezvous and messages among threads ----

TEST(Bootstrap, GroupOfRanksStartedFromOneThread) {
  const UniqueId id = new_id();
  auto boots = start_group(id, 4);
  ASSERT_EQ(boots.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(boots[static_cast<std::size_t>(r)]->rank(), r);
    EXPECT_EQ(boots[static_cast<std::size_t>(r)]->nranks(), 4);
    // wait_ready again: at once.
    EXPECT_TRUE(boots[static_cast<std::size_t>(r)]->wait_ready(Clock::now(), nullptr));
  }
  EXPECT_TRUE(boots[0]->connect(3, in(seconds(20))));
  EXPECT_TRUE(boots[0]->connect(0, in(seconds(20))));  // itself: nothing to open
  EXPECT_FALSE(boots[0]->connect(4, in(seconds(20))));
  std::atomic<int> failures{0};
  on_threads(4, [&](int r) {
    if (const int rc = member_body(*boots[static_cast<std::size_t>(r)]); rc != 0) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  for (auto& b : boots) b->close();
}

TEST(Bootstrap, SingleRank) {
  const UniqueId id = new_id();
  auto boots = start_group(id, 1);
  ASSERT_EQ(boots.size(), 1u);
  auto all = boots[0]->allgather(1, "only", in(seconds(5)));
  ASSERT_TRUE(all) << all.status().message();
  EXPECT_EQ(*all, std::vector<std::string>{"only"});
  EXPECT_TRUE(boots[0]->barrier(2, in(seconds(5))));
  EXPECT_TRUE(boots[0]->send(0, 3, "to myself", in(seconds(5))));
  auto got = boots[0]->recv(0, 3, in(seconds(5)));
  ASSERT_TRUE(got) << got.status().message();
  EXPECT_EQ(*got, "to myself");
}

TEST(Bootstrap, TagsAreIndependentAndOrderedPerTag) {
  const UniqueId id = new_id();
  auto boots = start_group(id, 2);
  ASSERT_EQ(boots.size(), 2u);
  Bootstrap& a = *boots[0];
  Bootstrap& b = *boots[1];
  const auto deadline = in(seconds(20));
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(a.send(1, 7, "a" + std::to_string(i), deadline));
    ASSERT_TRUE(a.send(1, 8, "b" + std::to_string(i), deadline));
  }
  std::string big(8 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  ASSERT_TRUE(a.send(1, 9, big, deadline));
  ASSERT_TRUE(a.send(1, 10, "", deadline));
  // Tag 8 first: tag 7's messages, which arrived earlier, wait in their own mailbox.
  for (int i = 0; i < 100; ++i) {
    auto m = b.recv(0, 8, deadline);
    ASSERT_TRUE(m) << m.status().message();
    EXPECT_EQ(*m, "b" + std::to_string(i));
  }
  auto empty = b.recv(0, 10, deadline);
  ASSERT_TRUE(empty) << empty.status().message();
  EXPECT_EQ(*empty, "");
  for (int i = 0; i < 100; ++i) {
    auto m = b.recv(0, 7, deadline);
    ASSERT_TRUE(m) << m.status().message();
    EXPECT_EQ(*m, "a" + std::to_string(i));
  }
  auto m = b.recv(0, 9, deadline);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_TRUE(*m == big);
  // The other direction, and a message to oneself.
  ASSERT_TRUE(b.send(0, 7, "back", deadline));
  ASSERT_TRUE(b.send(1, 7, "self", deadline));
  auto back = a.recv(1, 7, deadline);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(*back, "back");
  auto self = b.recv(1, 7, deadline);
  ASSERT_TRUE(self) << self.status().message();
  EXPECT_EQ(*self, "self");
  // Nothing more is coming: the wait ends at its deadline, naming the peer and tag.
  const auto t0 = Clock::now();
  auto none = b.recv(0, 7, in(milliseconds(200)));
  ASSERT_FALSE(none);
  EXPECT_TRUE(contains(none.status().message(), "timed out")) << none.status().message();
  EXPECT_TRUE(contains(none.status().message(), "rank 0 (tag 0x7)")) << none.status().message();
  EXPECT_LT(seconds_since(t0), 2.0);
  // Too big a message (an untouched mapping: nothing is allocated or read).
  const std::size_t huge = Bootstrap::kMaxMessageBytes + 1;
  void* region = mmap(nullptr, huge, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  const efccl::Status too_big =
      a.send(1, 1, std::string_view(static_cast<char*>(region), huge), deadline);
  munmap(region, huge);
  EXPECT_FALSE(too_big);
  EXPECT_TRUE(contains(too_big.message(), "exceeds")) << too_big.message();
}

TEST(Bootstrap, RecvAnyTakesEachPeersMessagesInOrderAndNamesTheSender) {
  const UniqueId id = new_id();
  auto boots = start_group(id, 3);
  ASSERT_EQ(boots.size(), 3u);
  const auto deadline = in(seconds(20));
  // Ranks 1 and 2 each send three messages to rank 0 under tag 11; rank 1 also under tag 12.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(boots[1]->send(0, 11, "from1-" + std::to_string(i), deadline));
    ASSERT_TRUE(boots[2]->send(0, 11, "from2-" + std::to_string(i), deadline));
  }
  ASSERT_TRUE(boots[1]->send(0, 12, "other tag", deadline));
  std::vector<std::string> got[2];
  for (int k = 0; k < 6; ++k) {
    auto m = boots[0]->recv_any({1, 2}, 11, deadline);
    ASSERT_TRUE(m) << m.status().message();
    ASSERT_LT(m->first, 2u);
    got[m->first].push_back(m->second);
  }
  for (int p = 0; p < 2; ++p) {
    ASSERT_EQ(got[p].size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(got[p][static_cast<std::size_t>(i)],
                "from" + std::to_string(p + 1) + "-" + std::to_string(i));
  }
  // Only the peers named are looked at; the other tag stays in its mailbox.
  ASSERT_TRUE(boots[2]->send(0, 11, "late", deadline));
  auto none = boots[0]->recv_any({1}, 11, in(milliseconds(200)));
  ASSERT_FALSE(none);
  EXPECT_TRUE(contains(none.status().message(), "timed out")) << none.status().message();
  auto late = boots[0]->recv_any({2, 1}, 11, deadline);
  ASSERT_TRUE(late) << late.status().message();
  EXPECT_EQ(late->first, 0u);
  EXPECT_EQ(late->second, "late");
  auto other = boots[0]->recv(1, 12, deadline);
  ASSERT_TRUE(other) << other.status().message();
  EXPECT_EQ(*other, "other tag");
  // An abort ends the wait within a poll slice; a peer out of range is refused.
  std::atomic<bool> abort{true};
  const auto t0 = Clock::now();
  auto aborted = boots[0]->recv_any({1, 2}, 11, in(seconds(20)), &abort);
  ASSERT_FALSE(aborted);
  EXPECT_TRUE(contains(aborted.status().message(), "aborted")) << aborted.status().message();
  EXPECT_LT(seconds_since(t0), 2.0);
  auto bad = boots[0]->recv_any({1, 3}, 11, deadline);
  ASSERT_FALSE(bad);
  EXPECT_TRUE(contains(bad.status().message(), "out of range")) << bad.status().message();
}

TEST(Bootstrap, AllgatherBarrierAndSubsets) {
  const UniqueId id = new_id();
  constexpr int kRanks = 5;
  auto boots = start_group(id, kRanks);
  ASSERT_EQ(boots.size(), static_cast<std::size_t>(kRanks));
  const std::vector<int> members = {4, 1, 3};  // subset rank i is parent rank members[i]
  on_threads(kRanks, [&](int r) {
    Bootstrap& boot = *boots[static_cast<std::size_t>(r)];
    const auto deadline = in(seconds(20));
    for (int round = 0; round < 2; ++round) {
      auto all =
          boot.allgather(10, "p" + std::to_string(round) + "-" + std::to_string(r), deadline);
      ASSERT_TRUE(all) << all.status().message();
      for (int i = 0; i < kRanks; ++i)
        EXPECT_EQ((*all)[static_cast<std::size_t>(i)],
                  "p" + std::to_string(round) + "-" + std::to_string(i));
      ASSERT_TRUE(boot.barrier(11, deadline));
    }
    // Among the even ranks only.
    if (r % 2 == 0) {
      auto even = boot.allgather({0, 2, 4}, 12, "e" + std::to_string(r), deadline);
      ASSERT_TRUE(even) << even.status().message();
      EXPECT_EQ(*even, (std::vector<std::string>{"e0", "e2", "e4"}));
    }
    EXPECT_FALSE(boot.allgather({2, 1}, 12, "", deadline));  // not sorted
    const auto it = std::find(members.begin(), members.end(), r);
    if (it != members.end()) {
      const int me = static_cast<int>(it - members.begin());
      auto sub = boot.subset(members, 77);
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->rank(), me);
      EXPECT_EQ(sub->nranks(), 3);
      ASSERT_EQ(sub->infos().size(), 3u);
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(sub->infos()[static_cast<std::size_t>(i)],
                  info_of(members[static_cast<std::size_t>(i)]));
      // The parent's tag 10 again: the subset's namespace keeps the two apart.
      auto all = sub->allgather(10, "s" + std::to_string(me), deadline);
      ASSERT_TRUE(all) << all.status().message();
      EXPECT_EQ(*all, (std::vector<std::string>{"s0", "s1", "s2"}));
      ASSERT_TRUE(sub->barrier(11, deadline));
      if (me != 1) {
        auto pair = sub->allgather({0, 2}, 13, "x" + std::to_string(me), deadline);
        ASSERT_TRUE(pair) << pair.status().message();
        EXPECT_EQ(*pair, (std::vector<std::string>{"x0", "x2"}));
      }
      // A subset of the subset, with the same space value: a namespace of its own again.
      if (me != 2) {
        auto nested = sub->subset({1, 0}, 77);
        ASSERT_NE(nested, nullptr);
        auto both = nested->allgather(10, "n" + std::to_string(nested->rank()), deadline);
        ASSERT_TRUE(both) << both.status().message();
        EXPECT_EQ(*both, (std::vector<std::string>{"n0", "n1"}));
        nested->close();
      }
      EXPECT_EQ(boot.subset({r, r}, 5), nullptr);              // repeated
      EXPECT_EQ(boot.subset({(r + 1) % kRanks}, 5), nullptr);  // without this rank
      sub->close();
    }
    // The parent still works after its subsets closed, with the same tag.
    auto again = boot.allgather(10, "q" + std::to_string(r), deadline);
    ASSERT_TRUE(again) << again.status().message();
    for (int i = 0; i < kRanks; ++i)
      EXPECT_EQ((*again)[static_cast<std::size_t>(i)], "q" + std::to_string(i));
  });
  for (auto& b : boots) b->close();
}

// ---- Rendezvous errors ----

TEST(Bootstrap, DuplicateRankFailsTheRendezvousForEveryone) {
  const UniqueId id = new_id();
  std::vector<std::shared_ptr<Bootstrap>> boots;
  for (int r : {0, 1, 1}) {
    auto b = Bootstrap::start(id, 3, r, info_of(r), in(seconds(20)));
    ASSERT_TRUE(b) << b.status().message();
    boots.push_back(*b);
  }
  const auto t0 = Clock::now();
  for (auto& b : boots) {
    const efccl::Status s = b->wait_ready(in(seconds(10)), nullptr);
    ASSERT_FALSE(s);
    EXPECT_TRUE(contains(s.message(), "rank 1 joined twice")) << s.message();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Bootstrap, InconsistentNranksFailsTheRendezvous) {
  const UniqueId id = new_id();
  auto first = Bootstrap::start(id, 2, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(first) << first.status().message();
  // Let rank 0 be counted first, so that the message names it as the reference.
  std::string progress;
  for (int i = 0; i < 100 && !contains(progress, "only 1 of 2"); ++i)
    progress = (*first)->wait_ready(in(milliseconds(50)), nullptr).message();
  ASSERT_TRUE(contains(progress, "only 1 of 2")) << progress;
  auto second = Bootstrap::start(id, 3, 1, info_of(1), in(seconds(20)));
  ASSERT_TRUE(second) << second.status().message();
  for (auto* b : {&*first, &*second}) {
    const efccl::Status s = (*b)->wait_ready(in(seconds(10)), nullptr);
    ASSERT_FALSE(s);
    EXPECT_TRUE(contains(s.message(), "rank 1 says nranks 3, rank 0 said 2")) << s.message();
  }
}

TEST(Bootstrap, MissingRankTimesOutNamingTheCount) {
  const UniqueId id = new_id();
  auto boot = Bootstrap::start(id, 2, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(boot) << boot.status().message();
  // The root's report may take a moment on a loaded machine: until then the error says so.
  efccl::Status s;
  double took = 0;
  for (int i = 0; i < 10 && !contains(s.message(), "only"); ++i) {
    const auto t0 = Clock::now();
    s = (*boot)->wait_ready(in(milliseconds(500)), nullptr);
    took = seconds_since(t0);
    ASSERT_FALSE(s);
  }
  EXPECT_TRUE(contains(s.message(), "only 1 of 2 ranks joined the rendezvous at " +
                                        efccl::net::describe_unique_id(id) + " within"))
      << s.message();
  EXPECT_TRUE(contains(s.message(), " ms")) << s.message();
  EXPECT_GE(took, 0.45);
  EXPECT_LT(took, 2.0);
}

TEST(Bootstrap, TheInitDeadlineIsReportedWithItsBudget) {
  // The deadline made at the API call covers the whole init: however late the wait starts, the
  // message names the limit that was set (not the time between start and the deadline).
  const UniqueId id = new_id();
  const efccl::net::Deadline deadline = efccl::net::Deadline::after(milliseconds(1200));
  std::this_thread::sleep_for(milliseconds(700));  // the application's own work before joining
  auto boot = Bootstrap::start(id, 2, 0, info_of(0), deadline);
  ASSERT_TRUE(boot) << boot.status().message();
  const auto t0 = Clock::now();
  const efccl::Status s = (*boot)->wait_ready(deadline.when(), nullptr);
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), " within 1200 ms")) << s.message();
  EXPECT_LT(seconds_since(t0), 1.0) << "the wait ends at the deadline made before start()";
  // Under NCCL_COMM_ID the root is out of reach: the same budget in that message.
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  UniqueId comm_id_id;
  {
    ScopedEnv comm_id("NCCL_COMM_ID", address.c_str());
    ASSERT_TRUE(efccl::net::create_unique_id(&comm_id_id, seconds(60)));
  }
  const efccl::net::Deadline short_one = efccl::net::Deadline::after(milliseconds(300));
  auto lone = Bootstrap::start(comm_id_id, 2, 1, info_of(1), short_one);
  ASSERT_TRUE(lone) << lone.status().message();
  const efccl::Status unreachable = (*lone)->wait_ready(in(seconds(5)), nullptr);
  ASSERT_FALSE(unreachable);
  EXPECT_TRUE(contains(unreachable.message(), "within 300 ms")) << unreachable.message();
}

TEST(Bootstrap, UnreachableRootTimesOut) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  UniqueId id{};
  {
    ScopedEnv comm_id("NCCL_COMM_ID", address.c_str());
    ASSERT_TRUE(efccl::net::create_unique_id(&id, seconds(60)));
  }
  // Rank 1 only: nobody starts the root (rank 0 would).
  const auto t0 = Clock::now();
  auto boot = Bootstrap::start(id, 2, 1, info_of(1), in(milliseconds(300)));
  ASSERT_TRUE(boot) << boot.status().message();
  EXPECT_LT(seconds_since(t0), 0.2);  // start() never waits for the root
  const efccl::Status s = (*boot)->wait_ready(in(seconds(5)), nullptr);
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "could not reach the rendezvous root at " + address))
      << s.message();
  EXPECT_TRUE(contains(s.message(), "refused")) << s.message();
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(Bootstrap, AbortFlagEndsWaits) {
  const UniqueId id = new_id();
  auto boot = Bootstrap::start(id, 2, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(boot) << boot.status().message();
  std::atomic<bool> abort{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    abort = true;
  });
  auto t0 = Clock::now();
  const efccl::Status s = (*boot)->wait_ready(in(seconds(20)), &abort);
  aborter.join();
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "aborted")) << s.message();
  EXPECT_LT(seconds_since(t0), 2.0);

  // A receive that nothing will satisfy.
  auto solo = start_group(new_id(), 1);
  ASSERT_EQ(solo.size(), 1u);
  abort = false;
  std::thread aborter2([&] {
    std::this_thread::sleep_for(milliseconds(100));
    abort = true;
  });
  t0 = Clock::now();
  auto got = solo[0]->recv(0, 42, in(seconds(20)), &abort);
  aborter2.join();
  ASSERT_FALSE(got);
  EXPECT_TRUE(contains(got.status().message(), "aborted")) << got.status().message();
  EXPECT_LT(seconds_since(t0), 2.0);
  auto all = solo[0]->allgather(43, "x", in(seconds(20)), &abort);  // one rank: nothing to wait for
  EXPECT_TRUE(all);
}

// ---- Strangers ----

TEST(Bootstrap, StrangersAtARankAreRefusedWithoutDisturbingIt) {
  LogCapture log;
  const UniqueId id = new_id();
  const uint64_t magic = magic_of(id);
  auto boots = start_group(id, 2);
  ASSERT_EQ(boots.size(), 2u);
  std::atomic<int> failures{0};
  boots[0]->set_peer_failure_handler([&](int, const std::string&) { ++failures; });

  // A wrong magic, garbage, a right magic whose hello names ranks that do not exist, and one
  // that says nothing at all (it stays connected throughout).
  const std::string rank0 = boots[0]->listen_address();
  const int r_wrong_magic = connect_to(rank0);
  const int r_garbage = connect_to(rank0);
  const int r_bad_hello = connect_to(rank0);
  const int r_silent = connect_to(rank0);
  ASSERT_GE(r_wrong_magic, 0);
  ASSERT_GE(r_garbage, 0);
  ASSERT_GE(r_bad_hello, 0);
  ASSERT_GE(r_silent, 0);
  ASSERT_TRUE(write_all(r_wrong_magic, frame(~magic, 5, std::string(12, '\0'))));
  ASSERT_TRUE(write_all(r_garbage, std::string(1000, '\xff')));
  std::string hello(12, '\0');
  const uint32_t nranks = 2, from = 7, to = 0;
  std::memcpy(hello.data(), &nranks, 4);
  std::memcpy(hello.data() + 4, &from, 4);
  std::memcpy(hello.data() + 8, &to, 4);
  ASSERT_TRUE(write_all(r_bad_hello, frame(magic, 5, hello)));
  EXPECT_TRUE(closed_by_peer(r_wrong_magic, seconds(3)));
  EXPECT_TRUE(closed_by_peer(r_garbage, seconds(3)));
  EXPECT_TRUE(closed_by_peer(r_bad_hello, seconds(3)));
  // Reported at most once a second: the first refusal at once, the others counted.
  ASSERT_TRUE(log.await("bootstrap rank 0: refused", 1));
  EXPECT_TRUE(log.await("bootstrap rank 0: refused 2 more connections", 1, seconds(3)))
      << "the count of the refusals after the first";
  EXPECT_EQ(log.count("bootstrap rank 0: refused"), 2);

  // The ranks still talk, both ways.
  const auto deadline = in(seconds(20));
  ASSERT_TRUE(boots[1]->send(0, 1, "from 1", deadline));
  ASSERT_TRUE(boots[0]->send(1, 1, "from 0", deadline));
  auto at0 = boots[0]->recv(1, 1, deadline);
  auto at1 = boots[1]->recv(0, 1, deadline);
  ASSERT_TRUE(at0) << at0.status().message();
  ASSERT_TRUE(at1) << at1.status().message();
  EXPECT_EQ(*at0, "from 1");
  EXPECT_EQ(*at1, "from 0");
  EXPECT_EQ(failures.load(), 0);
  for (int fd : {r_wrong_magic, r_garbage, r_bad_hello, r_silent}) close(fd);
  for (auto& b : boots) b->close();
  EXPECT_EQ(failures.load(), 0);
}

TEST(Bootstrap, IdleConnectionsAtARankDoNotStopTheJob) {
  const UniqueId id = new_id();
  auto boots = start_group(id, 3);
  ASSERT_EQ(boots.size(), 3u);
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_to(boots[1]->listen_address());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  std::atomic<int> failures{0};
  on_threads(3, [&](int r) {
    if (member_body(*boots[static_cast<std::size_t>(r)]) != 0) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  for (int fd : idle) close(fd);
  for (auto& b : boots) b->close();
}

// ---- Processes ----

TEST(Bootstrap, RanksInSeparateProcesses) {
  const UniqueId id = new_id();  // the root runs in this process
  constexpr int kRanks = 4;
  std::vector<pid_t> children;
  ChildGuard guard(&children);
  for (int r = 1; r < kRanks; ++r) children.push_back(spawn_child("member", id, kRanks, r));
  auto boot = Bootstrap::start(id, kRanks, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(boot) << boot.status().message();
  const efccl::Status ready = (*boot)->wait_ready(in(seconds(20)), nullptr);
  ASSERT_TRUE(ready) << ready.message();
  EXPECT_EQ(member_body(**boot), 0);
  (*boot)->close();
  for (std::size_t i = 0; i < children.size(); ++i)
    EXPECT_EQ(wait_child(children[i], seconds(20)), 0) << "rank " << i + 1;
}

TEST(Bootstrap, KilledPeerIsReportedAndPendingReceivesFail) {
  const UniqueId id = new_id();
  std::vector<pid_t> children = {spawn_child("sleeper", id, 3, 1),
                                 spawn_child("sleeper", id, 3, 2)};
  ChildGuard guard(&children);
  const pid_t child = children[1];  // rank 2 dies; rank 1 lives on
  auto started = Bootstrap::start(id, 3, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(started) << started.status().message();
  Bootstrap& boot = **started;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, std::string>> reports, sub_reports;
  boot.set_peer_failure_handler([&](int peer, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    reports.emplace_back(peer, why);
    cv.notify_all();
  });
  const efccl::Status ready = boot.wait_ready(in(seconds(20)), nullptr);
  ASSERT_TRUE(ready) << ready.message();
  auto sub = boot.subset({2, 0}, 3);  // the dying child is rank 0 there
  ASSERT_NE(sub, nullptr);
  sub->set_peer_failure_handler([&](int peer, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    sub_reports.emplace_back(peer, why);
    cv.notify_all();
  });
  for (int peer : {1, 2}) {
    auto alive = boot.recv(peer, 5, in(seconds(20)));
    ASSERT_TRUE(alive) << alive.status().message();
    EXPECT_EQ(*alive, "alive");
  }

  std::optional<efccl::StatusOr<std::string>> pending;
  Clock::time_point pending_done;
  std::thread waiter([&] {
    pending.emplace(boot.recv(2, 6, in(seconds(20))));
    pending_done = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(child, SIGKILL), 0);
  waiter.join();
  EXPECT_EQ(wait_child(child, seconds(5)), -1);
  ASSERT_TRUE(pending.has_value());
  ASSERT_FALSE(*pending);
  EXPECT_TRUE(contains(pending->status().message(), "rank 2 failed"))
      << pending->status().message();
  EXPECT_LT(std::chrono::duration<double>(pending_done - killed_at).count(), 2.0);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, seconds(3), [&] { return !reports.empty() && !sub_reports.empty(); }));
  }
  std::this_thread::sleep_for(milliseconds(100));  // no second report
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].first, 2);
    EXPECT_TRUE(contains(reports[0].second, "rank 2 failed")) << reports[0].second;
    ASSERT_EQ(sub_reports.size(), 1u);
    EXPECT_EQ(sub_reports[0].first, 0);
  }
  EXPECT_FALSE(boot.send(2, 7, "anyone?", in(seconds(5))));
  EXPECT_FALSE(boot.connect(2, in(seconds(5))));
  // The survivor is unaffected.
  EXPECT_TRUE(boot.connect(1, in(seconds(5))));
  EXPECT_TRUE(boot.send(1, 7, "still there?", in(seconds(5))));
  // A handler set now hears about it at once.
  int late = -1;
  boot.set_peer_failure_handler([&](int peer, const std::string&) { late = peer; });
  EXPECT_EQ(late, 2);
  sub->close();
  boot.close();
}

TEST(Bootstrap, KilledPeerIsReportedWhileItsForkedChildLives) {
  // The child's own child inherited its sockets; they must not keep the connection alive.
  const UniqueId id = new_id();
  std::vector<pid_t> children = {spawn_child("forker", id, 2, 1)};
  ChildGuard guard(&children);
  auto started = Bootstrap::start(id, 2, 0, info_of(0), in(seconds(20)));
  ASSERT_TRUE(started) << started.status().message();
  Bootstrap& boot = **started;
  std::mutex mu;
  std::condition_variable cv;
  int reported = -1;
  boot.set_peer_failure_handler([&](int peer, const std::string&) {
    std::lock_guard<std::mutex> lock(mu);
    reported = peer;
    cv.notify_all();
  });
  ASSERT_TRUE(boot.wait_ready(in(seconds(20)), nullptr));
  auto alive = boot.recv(1, 5, in(seconds(20)));
  ASSERT_TRUE(alive) << alive.status().message();
  EXPECT_EQ(*alive, "alive");
  auto forked = boot.recv(1, 6, in(seconds(20)));  // the grandchild's pid
  ASSERT_TRUE(forked) << forked.status().message();
  const pid_t grandchild = static_cast<pid_t>(std::stol(*forked));
  ASSERT_GT(grandchild, 0);
  ASSERT_EQ(kill(children[0], SIGKILL), 0);
  bool seen;
  {
    std::unique_lock<std::mutex> lock(mu);
    seen = cv.wait_for(lock, seconds(3), [&] { return reported == 1; });
  }
  EXPECT_EQ(kill(grandchild, 0), 0);  // it was alive all along, holding its copies
  kill(grandchild, SIGKILL);          // not ours to reap: init does
  EXPECT_TRUE(seen) << "the death of rank 1 went unnoticed while its forked child lived";
}

TEST(Bootstrap, OrderlyCloseIsNotAFailure) {
  // A peer process that closes its bootstrap and exits.
  {
    const UniqueId id = new_id();
    std::vector<pid_t> children = {spawn_child("closer", id, 2, 1)};
    ChildGuard guard(&children);
    const pid_t child = children[0];
    auto started = Bootstrap::start(id, 2, 0, info_of(0), in(seconds(20)));
    ASSERT_TRUE(started) << started.status().message();
    Bootstrap& boot = **started;
    std::atomic<int> failures{0};
    boot.set_peer_failure_handler([&](int, const std::string&) { ++failures; });
    const efccl::Status ready = boot.wait_ready(in(seconds(20)), nullptr);
    ASSERT_TRUE(ready) << ready.message();
    auto bye = boot.recv(1, 5, in(seconds(20)));
    ASSERT_TRUE(bye) << bye.status().message();
    EXPECT_EQ(*bye, "bye");
    const auto t0 = Clock::now();
    auto more = boot.recv(1, 6, in(seconds(20)));
    ASSERT_FALSE(more);
    EXPECT_TRUE(contains(more.status().message(), "closed its bootstrap"))
        << more.status().message();
    EXPECT_LT(seconds_since(t0), 5.0);
    EXPECT_EQ(wait_child(child, seconds(10)), 0);
    std::this_thread::sleep_for(milliseconds(200));
    EXPECT_EQ(failures.load(), 0);
    boot.close();
  }
  // Threads: the one that closes first, and a message it sent before, still delivered.
  {
    const UniqueId id = new_id();
    auto boots = start_group(id, 2);
    ASSERT_EQ(boots.size(), 2u);
    std::atomic<int> failures{0};
    for (auto& b : boots) b->set_peer_failure_handler([&](int, const std::string&) { ++failures; });
    ASSERT_TRUE(boots[1]->send(0, 1, "last words", in(seconds(20))));
    auto first = boots[0]->recv(1, 1, in(seconds(20)));  // the connection exists now
    ASSERT_TRUE(first) << first.status().message();
    ASSERT_TRUE(boots[1]->send(0, 1, "and more", in(seconds(20))));
    const auto t0 = Clock::now();
    boots[1]->close();
    EXPECT_LT(seconds_since(t0), 1.5);
    auto late = boots[0]->recv(1, 1, in(seconds(20)));
    ASSERT_TRUE(late) << late.status().message();
    EXPECT_EQ(*late, "and more");
    auto none = boots[0]->recv(1, 1, in(seconds(20)));
    ASSERT_FALSE(none);
    EXPECT_TRUE(contains(none.status().message(), "closed its bootstrap"))
        << none.status().message();
    EXPECT_FALSE(boots[0]->send(1, 1, "gone", in(seconds(5))));
    boots[0]->close();
    EXPECT_EQ(failures.load(), 0);
  }
}

// ---- Environment ----

TEST(Bootstrap, CommIdModeRootStartedByRankZero) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv comm_id("NCCL_COMM_ID", address.c_str());
  UniqueId a{}, b{};
  ASSERT_TRUE(efccl::net::create_unique_id(&a, seconds(60)));
  ASSERT_TRUE(efccl::net::create_unique_id(&b, seconds(60)));
  EXPECT_EQ(std::memcmp(a.internal, b.internal, sizeof(a.internal)), 0);  // no random part
  EXPECT_EQ(efccl::net::describe_unique_id(a), address);
  // Nothing listens yet: the root starts with rank 0, which here starts last.
  EXPECT_LT(connect_to(address), 0);
  std::vector<std::shared_ptr<Bootstrap>> boots(3);
  for (int r : {2, 1, 0}) {
    auto s = Bootstrap::start(a, 3, r, info_of(r), in(seconds(20)));
    ASSERT_TRUE(s) << s.status().message();
    boots[static_cast<std::size_t>(r)] = *s;
  }
  for (auto& boot : boots) {
    const efccl::Status s = boot->wait_ready(in(seconds(20)), nullptr);
    ASSERT_TRUE(s) << s.message();
  }
  std::atomic<int> failures{0};
  on_threads(3, [&](int r) {
    if (member_body(*boots[static_cast<std::size_t>(r)]) != 0) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  for (auto& boot : boots) boot->close();

  // The root is gone once its rendezvous completed: the address can serve the next one.
  auto again = start_group(a, 2);
  EXPECT_EQ(again.size(), 2u);
  for (auto& boot : again) boot->close();

  ScopedEnv bad("NCCL_COMM_ID", "not-an-address");
  UniqueId c{};
  const efccl::Status s = efccl::net::create_unique_id(&c, seconds(60));
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "NCCL_COMM_ID=not-an-address")) << s.message();
}

TEST(Bootstrap, SocketIfnameSelectsTheInterface) {
  for (const char* spec : {"lo", "=lo"}) {
    ScopedEnv ifname("NCCL_SOCKET_IFNAME", spec);
    ScopedEnv family("NCCL_SOCKET_FAMILY", "AF_INET");
    const UniqueId id = new_id();
    EXPECT_EQ(efccl::net::describe_unique_id(id).rfind("127.0.0.1:", 0), 0u)
        << spec << ": " << efccl::net::describe_unique_id(id);
    auto boots = start_group(id, 2);
    ASSERT_EQ(boots.size(), 2u);
    for (auto& b : boots)
      EXPECT_EQ(b->listen_address().rfind("127.0.0.1:", 0), 0u) << b->listen_address();
    ASSERT_TRUE(boots[0]->send(1, 1, "over lo", in(seconds(20))));
    auto got = boots[1]->recv(0, 1, in(seconds(20)));
    ASSERT_TRUE(got) << got.status().message();
    EXPECT_EQ(*got, "over lo");
    for (auto& b : boots) b->close();
  }
  {
    ScopedEnv ifname("NCCL_SOCKET_IFNAME", "^lo");
    UniqueId id{};
    const efccl::Status s = efccl::net::create_unique_id(&id, seconds(60));
    if (s) {  // a host with another interface: never loopback
      EXPECT_NE(efccl::net::describe_unique_id(id).rfind("127.", 0), 0u);
    }
  }
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", "no_such_if");
  UniqueId id{};
  const efccl::Status s = efccl::net::create_unique_id(&id, seconds(60));
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "NCCL_SOCKET_IFNAME=no_such_if selects no network interface"))
      << s.message();
}

TEST(Bootstrap, Ipv6Loopback) {
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", "lo");
  ScopedEnv family("NCCL_SOCKET_FAMILY", "AF_INET6");
  UniqueId id{};
  const efccl::Status s = efccl::net::create_unique_id(&id, seconds(60));
  if (!s) GTEST_SKIP() << "no IPv6 address on lo: " << s.message();
  EXPECT_EQ(efccl::net::describe_unique_id(id).rfind("[::1]:", 0), 0u)
      << efccl::net::describe_unique_id(id);
  auto boots = start_group(id, 3);
  ASSERT_EQ(boots.size(), 3u);
  std::atomic<int> failures{0};
  on_threads(3, [&](int r) {
    if (member_body(*boots[static_cast<std::size_t>(r)]) != 0) ++failures;
  });
  EXPECT_EQ(failures.load(), 0);
  for (auto& b : boots) b->close();
}

}  // namespace
