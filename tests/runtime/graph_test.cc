// CUDA graphs: a call warmed up once is captured (one capture per stream, as nccl-tests does)
// and replayed; a first use during capture fails cleanly instead of breaking the capture.
#include <numeric>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace efccl::runtime::testing
