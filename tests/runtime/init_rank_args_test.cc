// ncclCommInitRank* without a GPU: argument and config checks, duplicate ranks, mismatched
// nranks, the rendezvous timeout and the abort path. None of these builds a clique, so they
// behave the same with or without CUDA devices.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_config.h"
#include "comm/in_process_meeting.h"
#include "comm/rendezvous.h"  // joined_ranks (test hook)

namespace {

using Clock = std::chrono::steady_clock;

std::string last_error() { return ncclGetLastError(nullptr); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

ncclUniqueId new_id() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  return id;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(InitRankArgs, UniqueIdsAreRandom) {
  ncclUniqueId a = new_id(), b = new_id();
  EXPECT_NE(std::memcmp(a.internal, b.internal, sizeof(a.internal)), 0);
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
}

TEST(InitRankArgs, RejectsBadArguments) {
  const ncclUniqueId id = new_id();
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_EQ(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "comm is NULL")) << last_error();
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "nranks 0 must be >= 1")) << last_error();
  EXPECT_EQ(comm, nullptr);  // cleared on failure, as NCCL
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "rank -1 is out of range")) << last_error();
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, id, 5, nullptr), ncclInvalidArgument);
  ncclUniqueId ids[2] = {id, id};
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 0, 1, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "commIds is NULL")) << last_error();
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 0, 0, ids, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 0, 3, ids, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankScalable(&comm, 2, 2, 2, ids, nullptr), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 0);  // nothing joined
}

// Hostile counts are refused before anything is sized by them (issue 16's probe: 10^8 and
// 2^31-1 ranks aborted the process with std::bad_alloc); the limit is named.
TEST(InitRankArgs, HugeRankCountsAreRefusedBeforeAnyAllocation) {
  const ncclUniqueId id = new_id();
  for (int nranks : {100000000, std::numeric_limits<int>::max()}) {
    ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
    EXPECT_EQ(ncclCommInitRank(&comm, nranks, id, 0), ncclInvalidArgument);
    EXPECT_TRUE(contains(last_error(), "exceeds efccl's 1048576 ranks per communicator"))
        << last_error();
    EXPECT_EQ(comm, nullptr);
    EXPECT_EQ(ncclCommInitRank(&comm, nranks, id, nranks - 1), ncclInvalidArgument);
  }
  std::vector<ncclComm_t> comms(1);
  EXPECT_EQ(ncclCommInitAll(comms.data(), std::numeric_limits<int>::max(), nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 0);
}

TEST(InitRankArgs, ConfigMagicVersionAndValuesAreChecked) {
  const ncclUniqueId id = new_id();
  ncclComm_t comm = nullptr;
  const auto expect_invalid = [&](ncclConfig_t config, const char* part) {
    EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInvalidArgument) << part;
    EXPECT_TRUE(contains(last_error(), part)) << last_error();
    EXPECT_EQ(comm, nullptr);
  };
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0x12345678;
  expect_invalid(c, "NCCL_CONFIG_INITIALIZER");
  c = NCCL_CONFIG_INITIALIZER;
  c.version = 0;
  expect_invalid(c, "older than 2.14.0");
  c = NCCL_CONFIG_INITIALIZER;
  c.size = 4;  // the magic lies beyond the size the struct claims
  expect_invalid(c, "NCCL_CONFIG_INITIALIZER");
  c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 2;
  expect_invalid(c, "blocking 2");
  c = NCCL_CONFIG_INITIALIZER;
  c.minCTAs = 0;
  expect_invalid(c, "minCTAs 0");
  c = NCCL_CONFIG_INITIALIZER;
  c.minCTAs = 8;
  c.maxCTAs = 4;
  expect_invalid(c, "minCTAs 8 > maxCTAs 4");
  c = NCCL_CONFIG_INITIALIZER;
  c.cgaClusterSize = -3;
  expect_invalid(c, "cgaClusterSize -3");
  c = NCCL_CONFIG_INITIALIZER;
  c.CTAPolicy = 4;
  expect_invalid(c, "CTAPolicy 4");
  c = NCCL_CONFIG_INITIALIZER;
  c.splitShare = 7;
  expect_invalid(c, "splitShare 7");
  c = NCCL_CONFIG_INITIALIZER;
  c.nChannelsPerNetPeer = 65;
  expect_invalid(c, "nChannelsPerNetPeer 65");
  c = NCCL_CONFIG_INITIALIZER;
  c.nvlinkCentricSched = -1;
  expect_invalid(c, "nvlinkCentricSched -1");
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 0);
}

TEST(InitRankArgs, ValidConfigsAreAccepted) {
  // Fields newer than the config's version, or beyond its size, are ignored (NCCL 2.28).
  ncclConfig_t hints = NCCL_CONFIG_INITIALIZER;
  hints.blocking = 0;
  hints.minCTAs = 2;
  hints.maxCTAs = 16;
  hints.cgaClusterSize = 2;
  hints.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  hints.netName = "IB";
  hints.commName = "test";
  ncclConfig_t old_version = NCCL_CONFIG_INITIALIZER;
  old_version.version = NCCL_VERSION(2, 20, 0);
  old_version.nChannelsPerNetPeer = 1000;  // 2.28 field: ignored at 2.20
  ncclConfig_t short_size = NCCL_CONFIG_INITIALIZER;
  short_size.size = offsetof(ncclConfig_t, blocking);
  short_size.blocking = 99;  // beyond the size: ignored
  ncclConfig_t* configs[] = {&hints, &old_version, &short_size, nullptr};
  // Joined inside a group, then the group fails: nothing waits, nothing builds a clique.
  const ncclUniqueId id = new_id();
  ncclComm_t comms[4] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(ncclCommInitRankConfig(&comms[r], 5, id, r, configs[r]), ncclSuccess) << r << ": " << last_error();
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 4);
  // A pending communicator: rank and device are known, the rest waits for the clique.
  int value = -1;
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comms[1], &async), ncclSuccess);
  EXPECT_EQ(async, ncclInProgress);
  EXPECT_EQ(ncclCommUserRank(comms[1], &value), ncclSuccess);
  EXPECT_EQ(value, 1);
  EXPECT_EQ(ncclCommCount(comms[1], &value), ncclInvalidUsage);
  EXPECT_TRUE(contains(last_error(), "not initialized yet")) << last_error();
  EXPECT_EQ(ncclAllReduce(&value, &value, 1, ncclInt32, ncclSum, comms[0], nullptr), ncclInvalidUsage);
  const auto start = Clock::now();
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // the failed ncclAllReduce failed the group
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_TRUE(contains(last_error(), "call in it failed")) << last_error();
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 0);
  for (ncclComm_t c : comms) {
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_EQ(async, ncclInvalidUsage);
    EXPECT_EQ(ncclCommCount(c, &value), ncclInvalidUsage);
    EXPECT_TRUE(contains(last_error(), "initialization failed")) << last_error();
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(InitRankArgs, DuplicateRankIsInvalidArgument) {
  const ncclUniqueId id = new_id();
  ncclComm_t first = nullptr, second = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&first, 2, id, 0), ncclSuccess) << last_error();
  EXPECT_EQ(ncclCommInitRank(&second, 2, id, 0), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "rank 0 already joined")) << last_error();
  EXPECT_EQ(second, nullptr);
  const auto start = Clock::now();
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);  // the group failed: no wait for rank 1
  EXPECT_LT(seconds_since(start), 1.0);
  int n = 0;
  EXPECT_EQ(ncclCommCount(first, &n), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(first), ncclSuccess);
}

TEST(InitRankArgs, MismatchedNranksIsInvalidArgument) {
  const ncclUniqueId id = new_id();
  ncclComm_t a = nullptr, b = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommInitRank(&a, 2, id, 0), ncclSuccess) << last_error();
  EXPECT_EQ(ncclCommInitRank(&b, 3, id, 1), ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "nranks 3 differs from the nranks 2")) << last_error();
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(a), ncclSuccess);
}

TEST(InitRankArgs, RanksOnAnotherHostAreNotRefused) {
  // Two processes, the child claiming another host (NCCL_HOSTID, as efccl-mprun --hosts sets
  // it): the communicator spans two hosts, joined by network connections. Without a GPU the
  // init fails for lack of a device, never for the host; with one it completes.
  const ncclUniqueId id = new_id();
  const pid_t child = fork();
  if (child == 0) {
    setenv("NCCL_HOSTID", "another-host", 1);
    ncclComm_t comm = nullptr;
    const ncclResult_t r = ncclCommInitRank(&comm, 2, id, 1);
    const bool host_named = contains(last_error(), "another host");
    if (comm != nullptr) ncclCommDestroy(comm);
    _exit(!host_named && (r == ncclSuccess || contains(last_error(), "CUDA")) ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  ncclComm_t comm = nullptr;
  const auto start = Clock::now();
  const ncclResult_t r = ncclCommInitRank(&comm, 2, id, 0);
  EXPECT_LT(seconds_since(start), 30.0);
  const std::string e = r == ncclSuccess ? std::string() : last_error();
  EXPECT_FALSE(contains(e, "another host")) << e;
  if (r != ncclSuccess) EXPECT_TRUE(contains(e, "CUDA")) << e;
  if (comm != nullptr) {
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child's init was refused for its host";
}

TEST(InitRankArgs, MissingRankTimesOut) {
  ASSERT_EQ(setenv("EFCCL_INIT_TIMEOUT_MS", "200", 1), 0);
  const ncclUniqueId id = new_id();
  ncclComm_t comm = nullptr;
  const auto start = Clock::now();
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclInvalidUsage);
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 1.0);
  const std::string e = last_error();
  // The bootstrap's root saw only this rank (the others could be in any process).
  EXPECT_TRUE(contains(e, "only 1 of 2 ranks joined the rendezvous at ")) << e;
  EXPECT_TRUE(contains(e, "within 200 ms")) << e;  // the init timeout, counted from the call
  // The communicator exists, failed: only destroy/abort/async error work on it.
  ASSERT_NE(comm, nullptr);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(async, ncclInvalidUsage);
  int n = 0;
  EXPECT_EQ(ncclCommCount(comm, &n), ncclInvalidUsage);
  EXPECT_EQ(ncclAllReduce(&n, &n, 1, ncclInt32, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  EXPECT_EQ(efccl::runtime::joined_ranks(id), 0);
  unsetenv("EFCCL_INIT_TIMEOUT_MS");
}

TEST(InitRankArgs, GroupEndTimesOutWithMissingRanks) {
  ASSERT_EQ(setenv("EFCCL_INIT_TIMEOUT_MS", "200", 1), 0);
  const ncclUniqueId id = new_id();
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 3, id, 1), ncclSuccess) << last_error();
  const auto start = Clock::now();
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_TRUE(contains(last_error(), "only 1 of 3 ranks joined the rendezvous")) << last_error();
  int n = 0;
  EXPECT_EQ(ncclCommCount(comm, &n), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  unsetenv("EFCCL_INIT_TIMEOUT_MS");
}

TEST(InitRankArgs, AbortingAPendingRankWakesTheWaiters) {
  ASSERT_EQ(setenv("EFCCL_INIT_TIMEOUT_MS", "60000", 1), 0);
  const ncclUniqueId id = new_id();
  ncclComm_t mine = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&mine, 3, id, 0), ncclSuccess) << last_error();
  ncclResult_t waiter_result = ncclSuccess;
  std::string waiter_error;
  double waiter_seconds = 0;
  std::thread waiter([&] {
    ncclComm_t theirs = nullptr;
    const auto start = Clock::now();
    waiter_result = ncclCommInitRank(&theirs, 3, id, 2);  // blocks: rank 1 never comes
    waiter_seconds = seconds_since(start);
    waiter_error = last_error();
    if (theirs != nullptr) {
      EXPECT_EQ(ncclCommDestroy(theirs), ncclSuccess);
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (efccl::runtime::joined_ranks(id) < 2 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(efccl::runtime::joined_ranks(id), 2);
  EXPECT_EQ(ncclCommAbort(mine), ncclSuccess);
  waiter.join();
  EXPECT_EQ(waiter_result, ncclInvalidUsage);
  EXPECT_LT(waiter_seconds, 10.0);
  EXPECT_TRUE(contains(waiter_error, "rank 0's communicator was aborted before its clique formed"))
      << waiter_error;
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // the group's rendezvous failed
  unsetenv("EFCCL_INIT_TIMEOUT_MS");
}

TEST(InitRankArgs, ThreadsMeetAndShareTheOutcome) {
  // Two threads without a group: they meet, one builds the clique. Without a GPU both get
  // the same CUDA error at once; with one (several ranks per GPU are fine) both succeed.
  ASSERT_EQ(setenv("EFCCL_INIT_TIMEOUT_MS", "30000", 1), 0);
  const ncclUniqueId id = new_id();
  ncclComm_t comms[2] = {};
  ncclResult_t results[2] = {ncclInternalError, ncclInternalError};
  std::string errors[2];
  const auto start = Clock::now();
  std::thread t0([&] { results[0] = ncclCommInitRank(&comms[0], 2, id, 0); errors[0] = last_error(); });
  std::thread t1([&] { results[1] = ncclCommInitRank(&comms[1], 2, id, 1); errors[1] = last_error(); });
  t0.join();
  t1.join();
  EXPECT_LT(seconds_since(start), 20.0);
  EXPECT_EQ(results[0], results[1]) << errors[0] << " / " << errors[1];
  if (results[0] != ncclSuccess) {
    EXPECT_EQ(results[0], ncclUnhandledCudaError) << errors[0];
    EXPECT_TRUE(contains(errors[0], "no current CUDA device") || contains(errors[0], "creating the events"))
        << errors[0];
  } else {
    int n = 0;
    EXPECT_EQ(ncclCommCount(comms[1], &n), ncclSuccess);
    EXPECT_EQ(n, 2);
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  unsetenv("EFCCL_INIT_TIMEOUT_MS");
}

TEST(InitRankArgs, RegistrationNeedsALiveCommunicator) {
  void* handle = reinterpret_cast<void*>(0x1);
  char buffer[64];
  EXPECT_EQ(ncclCommRegister(nullptr, buffer, sizeof(buffer), &handle), ncclInvalidArgument);
  EXPECT_EQ(handle, nullptr);
  EXPECT_EQ(ncclCommDeregister(nullptr, handle), ncclInvalidArgument);
  alignas(64) char fake[256] = {};
  EXPECT_EQ(ncclCommRegister(reinterpret_cast<ncclComm_t>(fake), buffer, sizeof(buffer), &handle),
            ncclInvalidArgument);
  EXPECT_TRUE(contains(last_error(), "not a live communicator")) << last_error();
  ncclWindow_t win = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(nullptr, buffer, sizeof(buffer), &win, NCCL_WIN_DEFAULT),
            ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowRegister(nullptr, buffer, sizeof(buffer), nullptr, NCCL_WIN_DEFAULT),
            ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowDeregister(nullptr, win), ncclInvalidArgument);
}

}  // namespace

namespace {

TEST(InitRankArgs, NonBlockingInitReturnsInProgressThenSettles) {
  // Two ranks from one thread, without a group: blocking would wait forever for rank 1 here.
  const ncclUniqueId id = new_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[2] = {nullptr, nullptr};
  const auto start = Clock::now();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclCommInitRankConfig(&comms[r], 2, id, r, &config), ncclInProgress) << last_error();
    ASSERT_NE(comms[r], nullptr);
  }
  EXPECT_LT(seconds_since(start), 1.0);
  // Settles: formed with GPUs, failed without (no CUDA device) — never stays in progress.
  for (ncclComm_t c : comms) {
    ncclResult_t async = ncclInProgress;
    while (async == ncclInProgress && seconds_since(start) < 30.0) {
      ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_NE(async, ncclInProgress);
    int gpus = 0;
    const bool have_gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
    (void)cudaGetLastError();
    EXPECT_EQ(async == ncclSuccess, have_gpu) << "async " << async;
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(InitRankArgs, OneThreadOffersForSeveralRanksThenCollects) {
  // A grouped ncclCommSplit from one thread: every rank's offer comes before any collect.
  static const int parent = 0;  // any address names the meeting
  const std::vector<int> participants = {0, 2, 5};
  for (int rank : participants)
    efccl::runtime::offer_in_process(&parent, 7, participants, rank, "color of " + std::to_string(rank));
  for (std::size_t i = 0; i < participants.size(); ++i) {
    auto got = efccl::runtime::collect_in_process(&parent, 7, participants,
                                                  Clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(*got, (std::vector<std::string>{"color of 0", "color of 2", "color of 5"}));
  }
}

TEST(InitRankArgs, CollectGivesUpAtTheDeadlineNamingHowManyCame) {
  static const int parent = 0;
  const std::vector<int> participants = {0, 1, 2};
  efccl::runtime::offer_in_process(&parent, 8, participants, 0, "a");
  efccl::runtime::offer_in_process(&parent, 8, participants, 1, "b");
  const auto start = Clock::now();
  auto got = efccl::runtime::collect_in_process(&parent, 8, participants,
                                                Clock::now() + std::chrono::milliseconds(200));
  ASSERT_FALSE(got.is_ok());
  EXPECT_TRUE(contains(got.status().message(), "only 2 of 3 ranks called it in time"))
      << got.status().message();
  EXPECT_GE(seconds_since(start), 0.15);
  // The meeting is gone: the other offer's collect fails at once instead of waiting.
  auto again = efccl::runtime::collect_in_process(&parent, 8, participants,
                                                  Clock::now() + std::chrono::seconds(5));
  EXPECT_FALSE(again.is_ok());
  EXPECT_LT(seconds_since(start), 2.0);
}

}  // namespace
