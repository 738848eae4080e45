// ncclCommInitRank* on GPUs: cliques formed by one thread per rank (PyTorch's pattern), by one
// thread in a group (nccl-tests' pattern), by ncclCommInitRankScalable, and the no-op buffer
// registrations; ncclCommSplit / ncclCommShrink from one thread per rank and from one thread in
// a group. Several ranks share a GPU where fewer are visible.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <cstring>
#include <vector>

#include "runtime_test_util.h"

namespace {

using efccl::runtime::testing::visible_gpus;

std::string last_error() { return ncclGetLastError(nullptr); }

/// Sums 1..n of rank-valued floats over the communicators (one stream per rank, one group).
void expect_allreduce_works(const std::vector<ncclComm_t>& comms, const std::vector<int>& devices) {
  const int n = static_cast<int>(comms.size());
  constexpr int kCount = 1024;
  std::vector<float*> buffers(n, nullptr);
  std::vector<cudaStream_t> streams(n, nullptr);
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(devices[r]));
    CUDA_OK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&buffers[r], kCount * sizeof(float)));
    std::vector<float> host(kCount, static_cast<float>(r + 1));
    CUDA_OK(cudaMemcpy(buffers[r], host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
    cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r)
    NCCL_OK(ncclAllReduce(buffers[r], buffers[r], kCount, ncclFloat, ncclSum, comms[r], streams[r]));
  NCCL_OK(ncclGroupEnd());
  const float expected = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(devices[r]));
    CUDA_OK(cudaStreamSynchronize(streams[r]));
    std::vector<float> host(kCount, 0.0f);
    CUDA_OK(cudaMemcpy(host.data(), buffers[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(host[0], expected) << "rank " << r;
    EXPECT_EQ(host[kCount - 1], expected) << "rank " << r;
    ncclResult_t async = ncclInProgress;
    EXPECT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
}

std::vector<int> rank_devices(int nranks) {
  const int gpus = visible_gpus();
  std::vector<int> devices;
  for (int r = 0; r < nranks; ++r) devices.push_back(r % gpus);
  return devices;
}

TEST(InitRank, OneThreadPerRankWithoutAGroup) {
  EFCCL_REQUIRE_GPUS(1);
  const int n = std::max(2, visible_gpus());
  const std::vector<int> devices = rank_devices(n);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(devices[r]);
      results[r] = ncclCommInitRank(&comms[r], n, id, r);
      if (results[r] != ncclSuccess) ADD_FAILURE() << "rank " << r << ": " << last_error();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(results[r], ncclSuccess);
    int count = 0, rank = -1, device = -1;
    NCCL_OK(ncclCommCount(comms[r], &count));
    NCCL_OK(ncclCommUserRank(comms[r], &rank));
    NCCL_OK(ncclCommCuDevice(comms[r], &device));
    EXPECT_EQ(count, n);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(device, devices[r]);
  }
  expect_allreduce_works(comms, devices);
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(InitRank, ThreadsThatInitialisedTheirRanksGetTheirWorkOnTheirStreams) {
  // Each thread initialises its rank, then calls collectives without a group: a call returns
  // once the set is on the streams (call_queue.h), whichever rank comes last.
  EFCCL_REQUIRE_GPUS(1);
  const int n = 2;
  const std::vector<int> devices = rank_devices(n);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::vector<ncclComm_t> comms(n, nullptr);
  efccl::runtime::testing::expect_thread_per_rank_stream_order(comms, devices, {0, 1, 0}, [&](int r) {
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) ADD_FAILURE() << last_error();
    return comm;
  });
  for (ncclComm_t c : comms) {
    if (c != nullptr) {
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
  }
}

TEST(InitRank, GroupedInitFromOneThreadLikeNcclTests) {
  EFCCL_REQUIRE_GPUS(1);
  const int n = std::max(2, visible_gpus());
  const std::vector<int> devices = rank_devices(n);
  for (int blocking : {1, 0}) {
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking;
    config.minCTAs = 1;
    config.maxCTAs = 32;
    config.CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
    std::vector<ncclComm_t> comms(n, nullptr);
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r) {
      CUDA_OK(cudaSetDevice(devices[r]));
      NCCL_OK(ncclCommInitRankConfig(&comms[r], n, id, r, &config));
      ASSERT_NE(comms[r], nullptr);
    }
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < n; ++r) {
      ncclResult_t async = ncclInProgress;
      NCCL_OK(ncclCommGetAsyncError(comms[r], &async));
      EXPECT_EQ(async, ncclSuccess) << "blocking " << blocking;
      int device = -1;
      NCCL_OK(ncclCommCuDevice(comms[r], &device));
      EXPECT_EQ(device, devices[r]);
    }
    expect_allreduce_works(comms, devices);
    for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(InitRank, SingleRankCompletesAtOnce) {
  EFCCL_REQUIRE_GPUS(1);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  CUDA_OK(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  NCCL_OK(ncclCommInitRank(&comm, 1, id, 0));
  int count = 0;
  NCCL_OK(ncclCommCount(comm, &count));
  EXPECT_EQ(count, 1);
  expect_allreduce_works({comm}, {0});
  // A second communicator needs a new id (as with NCCL, an id's root serves one rendezvous).
  ncclComm_t again = nullptr;
  NCCL_OK(ncclGetUniqueId(&id));
  NCCL_OK(ncclCommInitRank(&again, 1, id, 0));
  EXPECT_NE(again, comm);
  NCCL_OK(ncclCommDestroy(again));
  NCCL_OK(ncclCommDestroy(comm));
}

TEST(InitRank, ScalableUsesTheFirstId) {
  EFCCL_REQUIRE_GPUS(1);
  const int n = 2;
  const std::vector<int> devices = rank_devices(n);
  // Each rank's second id differs (rank 0's is not even an id): ranks that used it would not
  // meet (failing within the init timeout), or would be refused at once.
  efccl::runtime::testing::ScopedEnv timeout("EFCCL_INIT_TIMEOUT_MS", "20000");
  ncclUniqueId ids[2][2];
  NCCL_OK(ncclGetUniqueId(&ids[0][0]));
  ids[1][0] = ids[0][0];
  std::memset(ids[0][1].internal, 0xab, sizeof(ids[0][1].internal));
  NCCL_OK(ncclGetUniqueId(&ids[1][1]));
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(devices[r]));
    NCCL_OK(ncclCommInitRankScalable(&comms[r], n, r, 2, ids[r], nullptr));
  }
  NCCL_OK(ncclGroupEnd());
  expect_allreduce_works(comms, devices);
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(InitRank, RegistrationsAreNoOps) {
  EFCCL_REQUIRE_GPUS(1);
  efccl::runtime::testing::TestClique clique({0, 0});
  float* buffer = nullptr;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaMalloc(&buffer, 1 << 20));
  void* handle = nullptr;
  NCCL_OK(ncclCommRegister(clique.comms[0], buffer, 1 << 20, &handle));
  EXPECT_NE(handle, nullptr);
  EXPECT_EQ(ncclCommDeregister(clique.comms[1], handle), ncclInvalidArgument);  // other comm
  NCCL_OK(ncclCommDeregister(clique.comms[0], handle));
  EXPECT_EQ(ncclCommDeregister(clique.comms[0], handle), ncclInvalidArgument);  // twice
  EXPECT_EQ(ncclCommDeregister(clique.comms[0], nullptr), ncclInvalidArgument);

  ncclWindow_t win = nullptr;
  NCCL_OK(ncclCommWindowRegister(clique.comms[1], buffer, 1 << 20, &win, NCCL_WIN_COLL_SYMMETRIC));
  EXPECT_NE(win, nullptr);
  EXPECT_EQ(ncclCommDeregister(clique.comms[1], win), ncclInvalidArgument);  // a window, not a handle
  NCCL_OK(ncclCommWindowDeregister(clique.comms[1], win));
  EXPECT_EQ(ncclCommWindowDeregister(clique.comms[1], win), ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowRegister(clique.comms[1], buffer, 1 << 20, &win, 0x10), ncclInvalidArgument);

  // Handles still registered when the communicator goes are released with it.
  NCCL_OK(ncclCommRegister(clique.comms[0], buffer, 1 << 20, &handle));
  NCCL_OK(ncclCommWindowRegister(clique.comms[0], buffer, 1 << 20, &win, NCCL_WIN_DEFAULT));
  cudaFree(buffer);
}

}  // namespace

namespace {

TEST(InitRank, SplitOfASingleProcessCommunicatorFromOneThreadPerRank) {
  EFCCL_REQUIRE_GPUS(1);
  const int n = 4;
  const std::vector<int> devices = rank_devices(n);
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_OK(ncclCommInitAll(comms.data(), n, devices.data()));
  // Even and odd ranks, ordered by descending key; rank 3 opts out.
  std::vector<ncclComm_t> halves(n, nullptr);
  std::vector<ncclResult_t> results(n, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(devices[r]);
      results[r] = ncclCommSplit(comms[r], r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &halves[r], nullptr);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(results[r], ncclSuccess) << "rank " << r;
  EXPECT_EQ(halves[3], nullptr);
  int count = 0, rank = -1;
  NCCL_OK(ncclCommCount(halves[0], &count));
  NCCL_OK(ncclCommUserRank(halves[0], &rank));
  EXPECT_EQ(count, 2);
  EXPECT_EQ(rank, 1);  // key 0 sorts after rank 2's key -2
  NCCL_OK(ncclCommCount(halves[1], &count));
  EXPECT_EQ(count, 1);
  expect_allreduce_works({halves[2], halves[0]}, {devices[2], devices[0]});
  for (ncclComm_t c : halves) {
    if (c != nullptr) {
      NCCL_OK(ncclCommDestroy(c));
    }
  }
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
}

TEST(InitRank, SplitOfEveryRankFromOneThreadInAGroup) {
  EFCCL_REQUIRE_GPUS(1);
  const int n = 4;
  const std::vector<int> devices = rank_devices(n);
  std::vector<ncclComm_t> comms(n, nullptr);
  NCCL_OK(ncclCommInitAll(comms.data(), n, devices.data()));
  // As with NCCL: even and odd ranks ordered by descending key, rank 3 opts out; the children
  // exist once ncclGroupEnd returns. The thread's current device is not the ranks' device.
  CUDA_OK(cudaSetDevice(devices[1]));
  std::vector<ncclComm_t> halves(n, reinterpret_cast<ncclComm_t>(0x1));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    NCCL_OK(ncclCommSplit(comms[r], r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &halves[r], nullptr));
    EXPECT_EQ(halves[r], nullptr) << "a grouped split's communicator exists at ncclGroupEnd";
  }
  NCCL_OK(ncclGroupEnd());
  EXPECT_EQ(halves[3], nullptr);
  int count = 0, rank = -1, device = -1;
  NCCL_OK(ncclCommCount(halves[0], &count));
  NCCL_OK(ncclCommUserRank(halves[0], &rank));
  EXPECT_EQ(count, 2);
  EXPECT_EQ(rank, 1);  // key 0 sorts after rank 2's key -2
  for (int r = 0; r < 3; ++r) {
    NCCL_OK(ncclCommCuDevice(halves[r], &device));
    EXPECT_EQ(device, devices[r]) << "a child lives on its parent's GPU";
  }
  NCCL_OK(ncclCommCount(halves[1], &count));
  EXPECT_EQ(count, 1);
  expect_allreduce_works({halves[2], halves[0]}, {devices[2], devices[0]});
  expect_allreduce_works({halves[1]}, {devices[1]});
  for (ncclComm_t c : halves) {
    if (c != nullptr) {
      NCCL_OK(ncclCommDestroy(c));
    }
  }

  // Shrink, grouped likewise: rank 1 is excluded and does not call.
  std::vector<ncclComm_t> shrunk(n, nullptr);
  int excluded[1] = {1};
  NCCL_OK(ncclGroupStart());
  for (int r : {0, 2, 3})
    NCCL_OK(ncclCommShrink(comms[r], excluded, 1, &shrunk[r], nullptr, NCCL_SHRINK_DEFAULT));
  NCCL_OK(ncclGroupEnd());
  for (int r : {0, 2, 3}) {
    ASSERT_NE(shrunk[r], nullptr) << "rank " << r;
    NCCL_OK(ncclCommCount(shrunk[r], &count));
    EXPECT_EQ(count, 3);
  }
  NCCL_OK(ncclCommUserRank(shrunk[3], &rank));
  EXPECT_EQ(rank, 2);
  expect_allreduce_works({shrunk[0], shrunk[2], shrunk[3]}, {devices[0], devices[2], devices[3]});
  for (int r : {0, 2, 3}) NCCL_OK(ncclCommDestroy(shrunk[r]));
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
}

TEST(InitRank, AGroupedSplitWhoseRanksNeverAllCallFailsAtTheDeadline) {
  EFCCL_REQUIRE_GPUS(1);
  const std::vector<int> devices = rank_devices(2);
  std::vector<ncclComm_t> comms(2, nullptr);
  NCCL_OK(ncclCommInitAll(comms.data(), 2, devices.data()));
  efccl::runtime::testing::ScopedEnv timeout("EFCCL_INIT_TIMEOUT_MS", "500");
  ncclComm_t child = reinterpret_cast<ncclComm_t>(0x1);
  const auto start = std::chrono::steady_clock::now();
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclCommSplit(comms[0], 0, 0, &child, nullptr));  // rank 1 never splits
  EXPECT_EQ(ncclGroupEnd(), ncclSystemError);
  const std::string m = last_error();
  EXPECT_NE(m.find("only 1 of 2 ranks called it in time"), std::string::npos) << m;
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.4);
  EXPECT_LT(took, 10.0);
  EXPECT_EQ(child, nullptr);
  for (ncclComm_t c : comms) NCCL_OK(ncclCommDestroy(c));
}

}  // namespace
