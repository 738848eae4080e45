// CUDA graphs: a call warmed up once is captured (one capture per stream, as nccl-tests does)
// and replayed; a first use during capture fails cleanly instead of breaking the capture. A
// captured graph pins the executors it replays against cache eviction until it is destroyed;
// one thread per rank may capture its own stream.
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "communicator.h"  // the clique behind a communicator (executor cache statistics)
#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

std::vector<int> one_rank_per_gpu() {
  std::vector<int> d(visible_gpus());
  std::iota(d.begin(), d.end(), 0);
  return d;
}

TEST(RuntimeGraph, CapturedAllReduceReplaysThreeTimes) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(one_rank_per_gpu());
  const int n = c.n();
  const std::size_t count = (1 << 20) + 3;
  std::vector<float*> buf(n);
  const auto fill_ones = [&] {
    std::vector<float> ones(count, 1.0f);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      ASSERT_EQ(cudaMemcpy(buf[r], ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
    }
  };
  const auto all_reduce = [&] {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r) NCCL_OK(ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
  };
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMalloc(&buf[r], count * sizeof(float)));
  }
  fill_ones();
  all_reduce();  // warm-up: programs uploaded, scratch sized
  c.sync();
  fill_ones();

  std::vector<cudaGraph_t> graphs(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamBeginCapture(c.streams[r], cudaStreamCaptureModeThreadLocal));
  }
  all_reduce();
  // End every capture before instantiating: instantiation is refused while any stream of the
  // thread is still capturing.
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamEndCapture(c.streams[r], &graphs[r]));
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
  }
  for (int replay = 0; replay < 3; ++replay)
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaGraphLaunch(execs[r], c.streams[r]));
    }
  c.sync();
  const float want = static_cast<float>(n) * n * n;  // in-place sum, three times
  for (int r = 0; r < n; ++r) {
    std::vector<float> h(count);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMemcpy(h.data(), buf[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < count; i += 4099) ASSERT_EQ(h[i], want) << "rank " << r << " element " << i;
    ASSERT_EQ(h[count - 1], want);
    cudaGraphExecDestroy(execs[r]);
    cudaGraphDestroy(graphs[r]);
    cudaFree(buf[r]);
  }
}

TEST(RuntimeGraph, FirstUseDuringCaptureIsInvalidUsage) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c({0});
  cudaSetDevice(0);
  float* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, 4096));
  CUDA_OK(cudaStreamBeginCapture(c.streams[0], cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, c.comms[0], c.streams[0]), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("before capturing"), std::string::npos)
      << ncclGetLastError(nullptr);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(c.streams[0], &graph), cudaSuccess);  // capture not broken
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaFree(buf);
}

TEST(RuntimeGraph, ACapturedExecutorSurvivesEvictionUntilItsGraphIsDestroyed) {
  EFCCL_REQUIRE_GPUS(1);
  std::unique_ptr<TestClique> owner;
  {
    ScopedEnv cache("EFCCL_EXECUTOR_CACHE", "1");  // every new program evicts another
    owner = std::make_unique<TestClique>(one_rank_per_gpu());
  }
  TestClique& c = *owner;
  Clique& clique = *c.comms[0]->clique;
  ASSERT_EQ(clique.executor_cache_stats().capacity, 1u);
  const int n = c.n();
  // A multiple of every program's granularity: one program per call (an odd count would add a
  // tail program, and a cache of one could not hold both).
  const std::size_t count = (std::size_t{1} << 18) * n;
  std::vector<float*> buf(n), gathered(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMalloc(&buf[r], count * sizeof(float)));
    CUDA_OK(cudaMalloc(&gathered[r], count * n * sizeof(float)));
  }
  const auto fill_ones = [&] {
    std::vector<float> ones(count, 1.0f);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      ASSERT_EQ(cudaMemcpy(buf[r], ones.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
    }
  };
  const auto grouped = [&](const std::function<ncclResult_t(int)>& call) {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r) NCCL_OK(call(r));
    NCCL_OK(ncclGroupEnd());
  };
  const auto all_reduce = [&](int r) {
    return ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]);
  };
  fill_ones();
  grouped(all_reduce);  // warm-up: the allreduce's executor
  c.sync();
  fill_ones();
  std::vector<cudaGraph_t> graphs(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamBeginCapture(c.streams[r], cudaStreamCaptureModeThreadLocal));
  }
  grouped(all_reduce);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamEndCapture(c.streams[r], &graphs[r]));
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
  }
  const std::size_t pinned = clique.executor_cache_stats().pinned;
  EXPECT_GE(pinned, 1u);

  // Eviction pressure: two more programs through a cache of one.
  grouped([&](int r) { return ncclAllGather(buf[r], gathered[r], count, ncclFloat, c.comms[r], c.streams[r]); });
  grouped([&](int r) { return ncclBroadcast(buf[r], gathered[r], count, ncclFloat, 0, c.comms[r], c.streams[r]); });
  c.sync();
  EXPECT_EQ(clique.executor_cache_stats().pinned, pinned) << "a pinned executor was evicted";
  EXPECT_EQ(clique.executor_cache_stats().size, pinned + 1) << "over capacity by the pinned ones";

  for (int replay = 0; replay < 2; ++replay)
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaGraphLaunch(execs[r], c.streams[r]));
    }
  c.sync();
  const float want = static_cast<float>(n) * n;  // in-place sum of ones, twice
  for (int r = 0; r < n; ++r) {
    std::vector<float> h(count);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMemcpy(h.data(), buf[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h[0], want) << "rank " << r;
    EXPECT_EQ(h[count - 1], want) << "rank " << r;
  }

  // Destroying the graphs (and their executables) releases the pins, on a CUDA thread.
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaGraphExecDestroy(execs[r]));
    CUDA_OK(cudaGraphDestroy(graphs[r]));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (clique.executor_cache_stats().pinned > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      cudaDeviceSynchronize();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(clique.executor_cache_stats().pinned, 0u);
  // Now evictable: one more program leaves the cache at its capacity (it stays over it while
  // the allreduce's executor is pinned).
  grouped([&](int r) { return ncclReduce(buf[r], buf[r], count, ncclFloat, ncclSum, 0, c.comms[r], c.streams[r]); });
  c.sync();
  EXPECT_EQ(clique.executor_cache_stats().size, 1u);
  for (int r = 0; r < n; ++r) {
    cudaFree(buf[r]);
    cudaFree(gathered[r]);
  }
}

TEST(RuntimeGraph, OneThreadPerRankCapturesItsOwnStream) {
  // Without a group: each thread's call returns once the set is in its stream's capture.
  EFCCL_REQUIRE_GPUS(2);
  TestClique c({0, 1});
  const std::size_t count = 4097;
  std::vector<float*> buf(2);
  std::vector<float> ones(count, 1.0f);
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    CUDA_OK(cudaMalloc(&buf[r], count * sizeof(float)));
  }
  NCCL_OK(ncclGroupStart());  // warm-up: programs uploaded before capture
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
  NCCL_OK(ncclGroupEnd());
  c.sync();
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(r);
    CUDA_OK(cudaMemcpy(buf[r], ones.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  }
  std::vector<ncclResult_t> results(2, ncclInternalError);
  std::vector<cudaError_t> captured(2, cudaErrorUnknown);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(c.streams[r], cudaStreamCaptureModeThreadLocal) != cudaSuccess) return;
      results[r] = ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]);
      captured[r] = cudaStreamEndCapture(c.streams[r], &graph);
      if (captured[r] == cudaSuccess) captured[r] = cudaGraphInstantiate(&exec, graph, 0);
      for (int replay = 0; replay < 2 && captured[r] == cudaSuccess; ++replay)
        captured[r] = cudaGraphLaunch(exec, c.streams[r]);
      if (captured[r] == cudaSuccess) captured[r] = cudaStreamSynchronize(c.streams[r]);
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], ncclSuccess) << "rank " << r;
    EXPECT_EQ(captured[r], cudaSuccess) << "rank " << r << ": " << cudaGetErrorString(captured[r]);
  }
  c.sync();
  for (int r = 0; r < 2; ++r) {
    float v = 0;
    cudaSetDevice(r);
    CUDA_OK(cudaMemcpy(&v, buf[r] + count - 1, sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(v, 4.0f) << "rank " << r;  // two replays of an in-place sum over two ranks
    cudaFree(buf[r]);
  }
}

}  // namespace
}  // namespace efccl::runtime::testing
