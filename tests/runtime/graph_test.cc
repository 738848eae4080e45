// CUDA graphs: a call warmed up once is captured (one capture per stream, as nccl-tests does)
// and replayed; a first use during capture (in any capture mode) creates what it needs without
// breaking the capture, and memory grown during a capture leaves earlier graphs intact. A
// captured graph pins the executors it replays against cache eviction until it is destroyed;
// one thread per rank may capture its own stream; two calls of one program captured on
// forked streams are ordered in the graph.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"  // the clique behind a communicator (executor cache statistics)
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

/// Captures `enqueue` into one graph for every stream of `c` (the others fork from rank 0's
/// capture and join it again) in `mode`. With `graph_out`, the graph is kept there (the caller
/// destroys it).
cudaGraphExec_t capture_all(TestClique& c, cudaStreamCaptureMode mode, const std::function<void()>& enqueue,
                            cudaGraph_t* graph_out = nullptr) {
  const int n = c.n();
  std::vector<cudaEvent_t> fork(n), join(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    EXPECT_EQ(cudaEventCreateWithFlags(&fork[r], cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming), cudaSuccess);
  }
  cudaSetDevice(c.devices[0]);
  EXPECT_EQ(cudaStreamBeginCapture(c.streams[0], mode), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(fork[0], c.streams[0]), cudaSuccess);
  for (int r = 1; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    EXPECT_EQ(cudaStreamWaitEvent(c.streams[r], fork[0], 0), cudaSuccess);
  }
  enqueue();
  for (int r = 1; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    EXPECT_EQ(cudaEventRecord(join[r], c.streams[r]), cudaSuccess);
    cudaSetDevice(c.devices[0]);
    EXPECT_EQ(cudaStreamWaitEvent(c.streams[0], join[r], 0), cudaSuccess);
  }
  cudaSetDevice(c.devices[0]);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(c.streams[0], &graph);
  EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended) << " (capture invalidated?)";
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    if (graph_out != nullptr)
      *graph_out = graph;
    else
      cudaGraphDestroy(graph);  // the executable keeps what it needs (and the executor pins)
  }
  for (int r = 0; r < n; ++r) {
    cudaEventDestroy(fork[r]);
    cudaEventDestroy(join[r]);
  }
  return exec;
}

TEST(RuntimeGraph, FirstUseDuringCaptureWorksInEveryCaptureMode) {
  // Nothing runs eagerly first: the allreduce program, its copy for the group's second
  // allreduce, and the send/receive program of six transfers per peer (nccl-tests -m 6 -G) are
  // all created inside the capture. Two ranks (sharing the GPU when only one is visible).
  EFCCL_REQUIRE_GPUS(1);
  const std::pair<cudaStreamCaptureMode, const char*> modes[] = {
      {cudaStreamCaptureModeGlobal, "global"},
      {cudaStreamCaptureModeThreadLocal, "thread-local"},
      {cudaStreamCaptureModeRelaxed, "relaxed"}};
  for (const auto& [mode, name] : modes) {
    SCOPED_TRACE(std::string(name) + " capture mode");
    TestClique c(spread_ranks(2));  // fresh communicators: nothing cached
    constexpr std::size_t kCount = 40961;
    constexpr int kTransfers = 6;
    constexpr std::size_t kP2p = 3001;
    std::vector<float*> a(2), b(2);
    std::vector<int32_t*> send(2), recv(2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE(a[r] = filled_buffer(c.devices[r], kCount, 1.0f), nullptr);
      ASSERT_NE(b[r] = filled_buffer(c.devices[r], kCount, 2.0f), nullptr);
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaMalloc(&send[r], kTransfers * kP2p * sizeof(int32_t)));
      CUDA_OK(cudaMalloc(&recv[r], kTransfers * kP2p * sizeof(int32_t)));
      std::vector<int32_t> v(kTransfers * kP2p);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 7 + r * 1000003);
      CUDA_OK(cudaMemcpy(send[r], v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(recv[r], 0xff, v.size() * sizeof(int32_t)));
    }
    CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
    cudaGraphExec_t exec = capture_all(c, mode, [&] {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < 2; ++r) {
        NCCL_OK(ncclAllReduce(a[r], a[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
        NCCL_OK(ncclAllReduce(b[r], b[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
      }
      NCCL_OK(ncclGroupEnd());
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < 2; ++r)
        for (int k = 0; k < kTransfers; ++k) {
          NCCL_OK(ncclSend(send[r] + k * kP2p, kP2p, ncclInt32, 1 - r, c.comms[r], c.streams[r]));
          NCCL_OK(ncclRecv(recv[r] + k * kP2p, kP2p, ncclInt32, 1 - r, c.comms[r], c.streams[r]));
        }
      NCCL_OK(ncclGroupEnd());
    });
    ASSERT_NE(exec, nullptr);
    for (int replay = 0; replay < 3; ++replay) {
      cudaSetDevice(c.devices[0]);
      CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
    }
    c.sync();
    // In-place sums over two ranks, three times: 1 -> 8, 2 -> 16.
    for (int r = 0; r < 2; ++r) {
      std::vector<float> ha(kCount), hb(kCount);
      std::vector<int32_t> got(kTransfers * kP2p);
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaMemcpy(ha.data(), a[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(hb.data(), b[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(got.data(), recv[r], got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(ha[i], 8.0f) << "rank " << r << " first allreduce element " << i;
        ASSERT_EQ(hb[i], 16.0f) << "rank " << r << " second allreduce element " << i;
      }
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], static_cast<int32_t>(i * 7 + (1 - r) * 1000003)) << "rank " << r << " recv element " << i;
      cudaFree(a[r]);
      cudaFree(b[r]);
      cudaFree(send[r]);
      cudaFree(recv[r]);
    }
    cudaGraphExecDestroy(exec);
  }
}

/// How many kernel nodes of `graph` there are, and how many of them have another kernel node
/// among their ancestors.
std::pair<int, int> kernels_and_ordered_kernels(cudaGraph_t graph) {
  std::size_t nnodes = 0, nedges = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nnodes), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(nnodes);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &nnodes), cudaSuccess);
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &nedges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(nedges), to(nedges);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), nullptr, &nedges), cudaSuccess);
  const auto is_kernel = [](cudaGraphNode_t n) {
    cudaGraphNodeType type{};
    return cudaGraphNodeGetType(n, &type) == cudaSuccess && type == cudaGraphNodeTypeKernel;
  };
  int kernels = 0, ordered = 0;
  for (cudaGraphNode_t n : nodes) {
    if (!is_kernel(n)) continue;
    ++kernels;
    // Walk the ancestors (edges backwards) looking for a kernel.
    std::vector<cudaGraphNode_t> todo{n}, seen{n};
    bool found = false;
    while (!todo.empty() && !found) {
      cudaGraphNode_t cur = todo.back();
      todo.pop_back();
      for (std::size_t e = 0; e < nedges && !found; ++e) {
        if (to[e] != cur || std::find(seen.begin(), seen.end(), from[e]) != seen.end()) continue;
        if (is_kernel(from[e])) found = true;
        seen.push_back(from[e]);
        todo.push_back(from[e]);
      }
    }
    if (found) ++ordered;
  }
  return {kernels, ordered};
}

TEST(RuntimeGraph, TwoCallsOnForkedStreamsOfOneCaptureAreOrdered) {
  // Two allreduces of one program (one executor: separate groups, so no copies) captured on
  // two streams per rank that fork from the capture before either call. NCCL serializes a
  // communicator's work within a graph; efccl must too, because both launches use the same
  // FIFOs and flags: on every device the second kernel must depend on the first.
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  const int n = c.n();
  int ndevices = 1;
  for (int r = 1; r < n; ++r) ndevices += c.devices[r] != c.devices[0] ? 1 : 0;
  constexpr std::size_t kCount = 100003;
  std::vector<float*> a(n), b(n);
  std::vector<cudaStream_t> second(n);
  std::vector<cudaEvent_t> fork(n), join(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_NE(a[r] = filled_buffer(c.devices[r], kCount, 1.0f), nullptr);
    ASSERT_NE(b[r] = filled_buffer(c.devices[r], kCount, 2.0f), nullptr);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamCreateWithFlags(&second[r], cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&fork[r], cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
  }
  CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = capture_all(
      c, cudaStreamCaptureModeGlobal,
      [&] {
        for (int r = 0; r < n; ++r) {  // fork the second streams before either call
          cudaSetDevice(c.devices[r]);
          CUDA_OK(cudaEventRecord(fork[r], c.streams[r]));
          CUDA_OK(cudaStreamWaitEvent(second[r], fork[r], 0));
        }
        NCCL_OK(ncclGroupStart());
        for (int r = 0; r < n; ++r)
          NCCL_OK(ncclAllReduce(a[r], a[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
        NCCL_OK(ncclGroupEnd());
        NCCL_OK(ncclGroupStart());
        for (int r = 0; r < n; ++r)
          NCCL_OK(ncclAllReduce(b[r], b[r], kCount, ncclFloat, ncclSum, c.comms[r], second[r]));
        NCCL_OK(ncclGroupEnd());
        for (int r = 0; r < n; ++r) {  // and join them again
          cudaSetDevice(c.devices[r]);
          CUDA_OK(cudaEventRecord(join[r], second[r]));
          CUDA_OK(cudaStreamWaitEvent(c.streams[r], join[r], 0));
        }
      },
      &graph);
  ASSERT_NE(exec, nullptr);
  ASSERT_NE(graph, nullptr);
  const auto [kernels, ordered] = kernels_and_ordered_kernels(graph);
  EXPECT_EQ(kernels, 2 * ndevices) << "one interpreter launch per call and device";
  EXPECT_EQ(ordered, ndevices) << "each device's second launch must depend on its first";
  cudaGraphDestroy(graph);
  for (int replay = 0; replay < 3; ++replay) {
    cudaSetDevice(c.devices[0]);
    CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
  }
  c.sync();
  for (int r = 0; r < n; ++r) {  // in-place sums over two ranks, three times: 1 -> 8, 2 -> 16
    std::vector<float> ha(kCount), hb(kCount);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMemcpy(ha.data(), a[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hb.data(), b[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(ha[i], 8.0f) << "rank " << r << " first allreduce element " << i;
      ASSERT_EQ(hb[i], 16.0f) << "rank " << r << " second allreduce element " << i;
    }
    cudaFree(a[r]);
    cudaFree(b[r]);
    cudaStreamDestroy(second[r]);
    cudaEventDestroy(fork[r]);
    cudaEventDestroy(join[r]);
  }
  cudaGraphExecDestroy(exec);
}

TEST(RuntimeGraph, RanksSharingAGpuCaptureAChainOfLaunches) {
  // Two ranks on one GPU, each on its own stream: one launch per call serves both, and the
  // second rank's stream is joined to it before and after. Captured, those joins must leave
  // each launch depending on the previous one only; joined by event waits alone, the second
  // stream's dependency set kept every earlier launch and the k-th launch depended on all k-1
  // before it (k(k-1)/2 edges; a replay of 1000 two-rank calls took 13-15 us per call on an
  // H100, 5.4 as a chain).
  EFCCL_REQUIRE_GPUS(1);
  TestClique c({0, 0});
  constexpr int kCalls = 40;
  constexpr std::size_t kCount = 4099;
  std::vector<float*> buf(2);
  for (int r = 0; r < 2; ++r) ASSERT_NE(buf[r] = filled_buffer(0, kCount, 1.0f), nullptr);
  const auto all_reduce = [&] {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r)
      NCCL_OK(ncclAllReduce(buf[r], buf[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
  };
  all_reduce();  // warm-up (1 -> 2): the program is prepared before the capture
  c.sync();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = capture_all(
      c, cudaStreamCaptureModeGlobal,
      [&] {
        for (int k = 0; k < kCalls; ++k) all_reduce();
      },
      &graph);
  ASSERT_NE(exec, nullptr);
  ASSERT_NE(graph, nullptr);
  std::size_t nnodes = 0, nedges = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nnodes));
  CUDA_OK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &nedges));
  const auto [kernels, ordered] = kernels_and_ordered_kernels(graph);
  EXPECT_EQ(kernels, kCalls) << "one launch per call for both ranks";
  EXPECT_EQ(ordered, kCalls - 1) << "every launch but the first after another";
  EXPECT_LE(nedges, nnodes) << nnodes << " nodes: the launches must form a chain, not "
                            << "depend on every earlier one";
  cudaGraphDestroy(graph);
  CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
  c.sync();
  for (int r = 0; r < 2; ++r) {
    std::vector<float> h(kCount);
    CUDA_OK(cudaMemcpy(h.data(), buf[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
    // Each in-place sum of two equal buffers doubles them: 2 * 2^kCalls, exact in float.
    for (std::size_t i = 0; i < kCount; ++i)
      ASSERT_EQ(h[i], std::ldexp(2.0f, kCalls)) << "rank " << r << " element " << i;
    cudaFree(buf[r]);
  }
  cudaGraphExecDestroy(exec);
}

/// The nodes of `graph` from which `node` is reachable.
std::vector<cudaGraphNode_t> ancestors_of(cudaGraph_t graph, cudaGraphNode_t node) {
  std::size_t nedges = 0;
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &nedges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(nedges), to(nedges);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), nullptr, &nedges), cudaSuccess);
  std::vector<cudaGraphNode_t> seen, todo{node};
  while (!todo.empty()) {
    cudaGraphNode_t cur = todo.back();
    todo.pop_back();
    for (std::size_t e = 0; e < nedges; ++e)
      if (to[e] == cur && std::find(seen.begin(), seen.end(), from[e]) == seen.end()) {
        seen.push_back(from[e]);
        todo.push_back(from[e]);
      }
  }
  return seen;
}

TEST(RuntimeGraph, ACapturedGroupWithTwoLaunchStreamsOnOneGpuKeepsBothLaunches) {
  // Three ranks on GPU 0, one group: a large send 0 -> 1 and a small send 1 -> 2 run as two
  // launches of one batch, on rank 0's and on rank 1's stream. Rank 1 takes part in both, so
  // its later work must follow both. The streams are joined after the batch is enqueued, so a
  // join that replaced a stream's capture dependencies with the launch stream's alone would drop
  // the other launch (rank 1's stream had gained it meanwhile).
  EFCCL_REQUIRE_GPUS(1);
  TestClique c({0, 0, 0});
  constexpr std::size_t kLarge = std::size_t{1} << 18, kSmall = 1024;  // floats: 1 MiB, 4 KiB
  float* a0 = filled_buffer(0, kLarge, 3.0f);
  float* b1 = filled_buffer(0, kSmall, 5.0f);
  float* r1 = filled_buffer(0, kLarge, 0.0f);
  float* r2 = filled_buffer(0, kSmall, 0.0f);
  ASSERT_TRUE(a0 != nullptr && b1 != nullptr && r1 != nullptr && r2 != nullptr);
  int* marker = nullptr;
  CUDA_OK(cudaMalloc(&marker, sizeof(int)));
  const auto group = [&] {
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(a0, kLarge, ncclFloat, 1, c.comms[0], c.streams[0]));
    NCCL_OK(ncclRecv(r1, kLarge, ncclFloat, 0, c.comms[1], c.streams[1]));
    NCCL_OK(ncclSend(b1, kSmall, ncclFloat, 2, c.comms[1], c.streams[1]));
    NCCL_OK(ncclRecv(r2, kSmall, ncclFloat, 1, c.comms[2], c.streams[2]));
    NCCL_OK(ncclGroupEnd());
  };
  group();  // warm-up: programs prepared before the capture
  c.sync();
  CUDA_OK(cudaMemset(r1, 0, kLarge * sizeof(float)));
  CUDA_OK(cudaMemset(r2, 0, kSmall * sizeof(float)));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = capture_all(
      c, cudaStreamCaptureModeGlobal,
      [&] {
        group();
        CUDA_OK(cudaMemsetAsync(marker, 0, sizeof(int), c.streams[1]));  // rank 1's later work
      },
      &graph);
  ASSERT_NE(exec, nullptr);
  ASSERT_NE(graph, nullptr);
  std::size_t nnodes = 0;
  CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nnodes));
  std::vector<cudaGraphNode_t> nodes(nnodes);
  CUDA_OK(cudaGraphGetNodes(graph, nodes.data(), &nnodes));
  std::vector<cudaGraphNode_t> kernels, memsets;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType type{};
    CUDA_OK(cudaGraphNodeGetType(n, &type));
    if (type == cudaGraphNodeTypeKernel) kernels.push_back(n);
    if (type == cudaGraphNodeTypeMemset) memsets.push_back(n);
  }
  ASSERT_GE(kernels.size(), 2u) << "the group must make two launches for this test to mean anything";
  ASSERT_EQ(memsets.size(), 1u);
  const std::vector<cudaGraphNode_t> before = ancestors_of(graph, memsets[0]);
  for (std::size_t k = 0; k < kernels.size(); ++k)
    EXPECT_NE(std::find(before.begin(), before.end(), kernels[k]), before.end())
        << "rank 1's later work does not follow launch " << k << " of " << kernels.size();
  cudaGraphDestroy(graph);
  CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
  c.sync();
  std::vector<float> h1(kLarge), h2(kSmall);
  CUDA_OK(cudaMemcpy(h1.data(), r1, kLarge * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h2.data(), r2, kSmall * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(h1.begin(), h1.end(), 3.0f), static_cast<std::ptrdiff_t>(kLarge));
  EXPECT_EQ(std::count(h2.begin(), h2.end(), 5.0f), static_cast<std::ptrdiff_t>(kSmall));
  cudaGraphExecDestroy(exec);
  for (void* p : {static_cast<void*>(a0), static_cast<void*>(b1), static_cast<void*>(r1),
                  static_cast<void*>(r2), static_cast<void*>(marker)})
    cudaFree(p);
}

TEST(RuntimeGraph, ScratchGrowsDuringCaptureAndEarlierGraphsKeepTheirs) {
  // An in-place alltoall passes its blocks through executor-owned scratch sized by the count.
  // A graph captured at a small count, then one at a larger count of the same program (the
  // scratch grows during that capture), then both replayed in either order.
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  Clique& clique = *c.comms[0]->clique;
  constexpr std::size_t kSmall = 1024, kLarge = 32768;  // per peer; one program for both
  std::vector<float*> buf(2);
  for (int r = 0; r < 2; ++r) ASSERT_NE(buf[r] = filled_buffer(c.devices[r], 2 * kLarge, 0.0f), nullptr);
  // Rank r's block q, element j: r * 100 + q * 10 + j % 7 (-1 past the call's blocks).
  const auto value = [](int r, std::size_t i, std::size_t count) {
    if (i >= 2 * count) return -1.0f;
    return static_cast<float>(r * 100 + static_cast<int>(i / count) * 10 + static_cast<int>(i % count % 7));
  };
  const auto fill = [&](std::size_t count) {
    for (int r = 0; r < 2; ++r) {
      std::vector<float> h(2 * kLarge);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(r, i, count);
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaMemcpy(buf[r], h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
  };
  const auto check = [&](std::size_t count, const char* what) {
    for (int r = 0; r < 2; ++r) {
      std::vector<float> h(2 * kLarge);
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaMemcpy(h.data(), buf[r], h.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < h.size(); ++i) {
        // After the exchange rank r's block q holds rank q's block r.
        const int q = i < 2 * count ? static_cast<int>(i / count) : 0;
        const float want = i < 2 * count ? value(q, r * count + i % count, count) : -1.0f;
        ASSERT_EQ(h[i], want) << what << ", rank " << r << " element " << i;
      }
    }
  };
  const auto alltoall = [&](std::size_t count) {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r)
      NCCL_OK(ncclAlltoAll(buf[r], buf[r], count, ncclFloat, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
  };
  fill(kSmall);
  alltoall(kSmall);  // eager: the executor, with scratch for kSmall
  c.sync();
  check(kSmall, "eager");
  const std::size_t executors = clique.executor_cache_stats().size;
  cudaGraphExec_t small = capture_all(c, cudaStreamCaptureModeGlobal, [&] { alltoall(kSmall); });
  cudaGraphExec_t large = capture_all(c, cudaStreamCaptureModeGlobal, [&] { alltoall(kLarge); });
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(clique.executor_cache_stats().size, executors) << "the larger count should reuse the program";
  for (int order = 0; order < 2; ++order)
    for (const bool is_small : {order == 0, order != 0}) {
      const std::size_t count = is_small ? kSmall : kLarge;
      fill(count);
      cudaSetDevice(c.devices[0]);
      CUDA_OK(cudaGraphLaunch(is_small ? small : large, c.streams[0]));
      c.sync();
      check(count, is_small ? "small graph" : "large graph");
    }
  cudaGraphExecDestroy(small);
  cudaGraphExecDestroy(large);
  for (int r = 0; r < 2; ++r) cudaFree(buf[r]);
}

TEST(RuntimeGraph, AnEvictionDuringAnUnrelatedGlobalCaptureKeepsTheCaptureValid) {
  // PyTorch captures in global mode; an eager collective on another stream of the same thread
  // may evict (and so destroy) an executor meanwhile. Destroying one must not make a call that
  // global mode forbids (a device-wide synchronisation), which would invalidate the capture.
  EFCCL_REQUIRE_GPUS(1);
  std::unique_ptr<TestClique> owner;
  {
    ScopedEnv cache("EFCCL_EXECUTOR_CACHE", "1");  // every new program evicts another
    owner = std::make_unique<TestClique>(spread_ranks(2));
  }
  TestClique& c = *owner;
  Clique& clique = *c.comms[0]->clique;
  const int n = c.n();
  const std::size_t count = (std::size_t{1} << 16) * n;  // one program per call (no tail)
  std::vector<float*> buf(n), gathered(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_NE(buf[r] = filled_buffer(c.devices[r], count, static_cast<float>(r + 1)), nullptr);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMalloc(&gathered[r], count * n * sizeof(float)));
  }
  const auto grouped = [&](const std::function<ncclResult_t(int)>& call) {
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r) NCCL_OK(call(r));
    NCCL_OK(ncclGroupEnd());
  };
  grouped([&](int r) { return ncclBroadcast(buf[r], gathered[r], count, ncclFloat, 0, c.comms[r], c.streams[r]); });
  c.sync();  // the broadcast's executor has launched: destroying it waits for that launch
  ASSERT_EQ(clique.executor_cache_stats().size, 1u);

  cudaSetDevice(c.devices[0]);
  cudaStream_t side = nullptr;
  void* scratch = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&scratch, 256));
  CUDA_OK(cudaStreamBeginCapture(side, cudaStreamCaptureModeGlobal));
  CUDA_OK(cudaMemsetAsync(scratch, 0, 256, side));
  // Eager, on streams that are not captured: the allgather's program evicts the broadcast's.
  grouped([&](int r) { return ncclAllGather(buf[r], gathered[r], count, ncclFloat, c.comms[r], c.streams[r]); });
  EXPECT_EQ(clique.executor_cache_stats().size, 1u) << "the broadcast's executor was not evicted";
  cudaSetDevice(c.devices[0]);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(side, &graph);
  EXPECT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended) << ": the eviction invalidated the capture";
  if (graph != nullptr) cudaGraphDestroy(graph);
  c.sync();
  for (int r = 0; r < n; ++r) {
    std::vector<float> h(count * n);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMemcpy(h.data(), gathered[r], h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; i += 1021)
        ASSERT_EQ(h[q * count + i], static_cast<float>(q + 1)) << "rank " << r << " block " << q << " element " << i;
    cudaFree(buf[r]);
    cudaFree(gathered[r]);
  }
  cudaSetDevice(c.devices[0]);
  cudaFree(scratch);
  cudaStreamDestroy(side);
}

TEST(RuntimeGraph, ACapturedExecutorSurvivesEvictionUntilItsGraphIsDestroyed) {
  EFCCL_REQUIRE_GPUS(1);
  std::unique_ptr<TestClique> owner;
  {
    ScopedEnv cache("EFCCL_EXECUTOR_CACHE", "1");  // every new program evicts another
    // At least two ranks (two on GPU 0 with one GPU): a communicator of one rank runs its
    // collectives as copies, without executors.
    std::vector<int> devices = one_rank_per_gpu();
    if (devices.size() == 1) devices = {0, 0};
    owner = std::make_unique<TestClique>(devices);
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
  // One capture forked from rank 0's stream to the others (ranks sharing a GPU have their
  // streams joined around each launch, which separate captures could not hold).
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec =
      capture_all(c, cudaStreamCaptureModeThreadLocal, [&] { grouped(all_reduce); }, &graph);
  ASSERT_NE(exec, nullptr);
  const std::size_t pinned = clique.executor_cache_stats().pinned;
  EXPECT_GE(pinned, 1u);

  // Eviction pressure: two more programs through a cache of one.
  grouped([&](int r) { return ncclAllGather(buf[r], gathered[r], count, ncclFloat, c.comms[r], c.streams[r]); });
  grouped([&](int r) { return ncclBroadcast(buf[r], gathered[r], count, ncclFloat, 0, c.comms[r], c.streams[r]); });
  c.sync();
  EXPECT_EQ(clique.executor_cache_stats().pinned, pinned) << "a pinned executor was evicted";
  EXPECT_EQ(clique.executor_cache_stats().size, pinned + 1) << "over capacity by the pinned ones";

  cudaSetDevice(c.devices[0]);
  for (int replay = 0; replay < 2; ++replay) CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
  c.sync();
  const float want = static_cast<float>(n) * n;  // in-place sum of ones, twice
  for (int r = 0; r < n; ++r) {
    std::vector<float> h(count);
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaMemcpy(h.data(), buf[r], count * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h[0], want) << "rank " << r;
    EXPECT_EQ(h[count - 1], want) << "rank " << r;
  }

  // Destroying the graph (and its executable) releases the pins, on a CUDA thread.
  cudaSetDevice(c.devices[0]);
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
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
