// ncclCommRevoke and ncclCommShrink(NCCL_SHRINK_ABORT) stop the communicator's own kernels and
// wait for them, and only for them: other work on the same device (another stream, another
// library) does not hold them up.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Blocks a stream from the host until `release` is set (bounded: 20 s).
void CUDART_CB hold_stream(void* release) {
  const auto until = Clock::now() + 20s;
  while (!static_cast<std::atomic<bool>*>(release)->load() && Clock::now() < until)
    std::this_thread::sleep_for(1ms);
}

/// An allreduce ran on the clique, and another stream of device 0 is held from the host: a
/// whole-device synchronisation would wait for it.
struct BusyDevice {
  TestClique clique{{0, 0, 0}};
  std::atomic<bool> release{false};
  cudaStream_t other = nullptr;
  float* buffer = nullptr;

  BusyDevice() { start(); }
  void start() {
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc(&buffer, 3 * 1024 * sizeof(float)));
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 3; ++r)
      NCCL_OK(ncclAllReduce(buffer + r * 1024, buffer + r * 1024, 1024, ncclFloat, ncclSum,
                            clique.comms[r], clique.streams[r]));
    NCCL_OK(ncclGroupEnd());
    clique.sync();
    CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    CUDA_OK(cudaLaunchHostFunc(other, hold_stream, &release));
  }
  ~BusyDevice() {
    release.store(true);
    cudaStreamSynchronize(other);
    cudaStreamDestroy(other);
    cudaFree(buffer);
  }
};

TEST(Revoke, WaitsForItsOwnKernelsOnly) {
  EFCCL_REQUIRE_GPUS(1);
  BusyDevice busy;
  const auto start = Clock::now();
  EXPECT_EQ(ncclCommRevoke(busy.clique.comms[0], NCCL_REVOKE_DEFAULT), ncclSuccess)
      << ncclGetLastError(nullptr);
  EXPECT_LT(Clock::now() - start, 5s) << "ncclCommRevoke waited for another stream's work";
  ncclResult_t async = ncclInProgress;
  EXPECT_EQ(ncclCommGetAsyncError(busy.clique.comms[0], &async), ncclSuccess);
  EXPECT_EQ(async, ncclSuccess);  // quiescent once it returned
  float x = 0;
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, busy.clique.comms[0], nullptr),
            ncclInvalidUsage);  // revoked: later operations are refused
}

TEST(Revoke, ShrinkWithAbortWaitsForItsOwnKernelsOnly) {
  EFCCL_REQUIRE_GPUS(1);
  BusyDevice busy;
  // Ranks 0 and 1 shrink rank 2 away, from their own threads.
  ncclComm_t children[2] = {nullptr, nullptr};
  ncclResult_t results[2] = {ncclInternalError, ncclInternalError};
  const auto start = Clock::now();
  std::thread threads[2];
  for (int r = 0; r < 2; ++r)
    threads[r] = std::thread([&, r] {
      cudaSetDevice(0);
      int exclude = 2;
      results[r] = ncclCommShrink(busy.clique.comms[r], &exclude, 1, &children[r], nullptr,
                                  NCCL_SHRINK_ABORT);
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(Clock::now() - start, 5s) << "ncclCommShrink waited for another stream's work";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], ncclSuccess) << ncclGetLastError(nullptr);
    int count = 0;
    ASSERT_NE(children[r], nullptr);
    EXPECT_EQ(ncclCommCount(children[r], &count), ncclSuccess);
    EXPECT_EQ(count, 2);
    EXPECT_EQ(ncclCommDestroy(children[r]), ncclSuccess);
  }
}

}  // namespace
}  // namespace efccl::runtime::testing
