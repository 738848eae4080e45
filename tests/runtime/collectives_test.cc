// Every collective through the NCCL API, against a host reference: cliques of one GPU, of all
// GPUs, and with four ranks per GPU; several datatype/operator pairs, in-place and
// out-of-place, counts from 0 to 2^20+3, unaligned pointers. Also argument errors that need a
// live communicator, and a mismatch across ranks. RuntimeThreads: ranks driven by one thread
// each or by one thread for several without a group (docs/runtime.md), deadlines, and
// destroy/finalize with calls still queued. RuntimeResident: the same calls on the resident
// interpreter (EFCCL_RESIDENT=1), posted instead of launched, and the grid's end at destroy.
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"  // the clique behind a communicator (executor cache statistics)
#include "efccl/device/device_executor.h"
#include "efccl/device/resident.h"
#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

enum class Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll, kGather, kScatter };
const char* name(Coll c) {
  static const char* kNames[] = {"allreduce", "broadcast", "reduce", "allgather",
                                 "reducescatter", "alltoall", "gather", "scatter"};
  return kNames[static_cast<int>(c)];
}
bool per_block(Coll c) {
  return c == Coll::kAllGather || c == Coll::kReduceScatter || c == Coll::kAllToAll ||
         c == Coll::kGather || c == Coll::kScatter;
}
bool reduces(Coll c) { return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter; }

struct TypeOp {
  ncclDataType_t dtype;
  ncclRedOp_t op;  ///< ncclNumOps: premulsum with per-rank scalars
  const char* label;
};
const TypeOp kTypeOps[] = {{ncclFloat32, ncclSum, "float sum"},      {ncclBfloat16, ncclMax, "bfloat16 max"},
                           {ncclInt32, ncclProd, "int32 prod"},      {ncclFloat16, ncclAvg, "half avg"},
                           {ncclFloat8e4m3, ncclSum, "f8e4m3 sum"}, {ncclFloat32, ncclNumOps, "float premulsum"}};

double input_value(int rank, uint64_t i) { return static_cast<double>(static_cast<int>((i * 7 + rank * 3) % 5) - 2); }
double premul_scalar(int rank) { return rank % 2 == 0 ? 2.0 : 0.5; }

/// One case: per-rank device buffers laid out as NCCL's in-place rules require.
struct Case {
  Coll coll;
  TypeOp to;
  bool inplace;
  uint64_t count;
  std::size_t misalign;  ///< bytes added to every pointer (unaligned case)
};

void run_case(TestClique& clique, const Case& c) {
  const int n = clique.n();
  const int root = n - 1;
  const auto t = static_cast<ef::DataType>(c.to.dtype);
  const std::size_t es = ef::size_of(t);
  const uint64_t in_elems = per_block(c.coll) && c.coll != Coll::kAllGather && c.coll != Coll::kGather ? c.count * n : c.count;
  const uint64_t out_elems = per_block(c.coll) && c.coll != Coll::kReduceScatter && c.coll != Coll::kScatter ? c.count * n : c.count;
  const std::size_t region = (std::max(in_elems, out_elems) + 1) * es + c.misalign + 64;

  std::vector<char*> send(n), recv(n), base_send(n), base_recv(n);
  std::vector<std::vector<double>> inputs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(clique.devices[r]);
    CUDA_OK(cudaMalloc(&base_send[r], region));
    CUDA_OK(cudaMalloc(&base_recv[r], region));
    CUDA_OK(cudaMemset(base_recv[r], 0xEE, region));
    recv[r] = base_recv[r] + c.misalign;
    send[r] = base_send[r] + c.misalign;
    if (c.inplace) {
      const uint64_t block = c.count * es;
      switch (c.coll) {
        case Coll::kAllGather: send[r] = recv[r] + r * block; break;
        case Coll::kGather: send[r] = recv[r] + root * block; break;
        case Coll::kReduceScatter: send[r] = recv[r]; recv[r] = send[r] + r * block; break;
        case Coll::kScatter: send[r] = recv[r]; recv[r] = send[r] + root * block; break;
        default: send[r] = recv[r]; break;
      }
    }
    std::vector<char> host(in_elems * es);
    inputs[r].resize(in_elems);
    for (uint64_t i = 0; i < in_elems; ++i) {
      inputs[r][i] = input_value(r, i);
      encode(t, inputs[r][i], host.data() + i * es);
    }
    if (!host.empty()) {
      CUDA_OK(cudaMemcpy(send[r], host.data(), host.size(), cudaMemcpyHostToDevice));
      cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
    }
  }

  std::vector<ncclRedOp_t> ops(n, c.to.op);
  if (c.to.op == ncclNumOps) {
    for (int r = 0; r < n; ++r) {
      char scalar[8];
      encode(t, premul_scalar(r), scalar);
      NCCL_OK(ncclRedOpCreatePreMulSum(&ops[r], scalar, c.to.dtype, ncclScalarHostImmediate, clique.comms[r]));
    }
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    ncclComm_t comm = clique.comms[r];
    cudaStream_t s = clique.streams[r];
    ncclResult_t res = ncclSuccess;
    switch (c.coll) {
      case Coll::kAllReduce: res = ncclAllReduce(send[r], recv[r], c.count, c.to.dtype, ops[r], comm, s); break;
      case Coll::kBroadcast: res = ncclBroadcast(send[r], recv[r], c.count, c.to.dtype, root, comm, s); break;
      case Coll::kReduce: res = ncclReduce(send[r], recv[r], c.count, c.to.dtype, ops[r], root, comm, s); break;
      case Coll::kAllGather: res = ncclAllGather(send[r], recv[r], c.count, c.to.dtype, comm, s); break;
      case Coll::kReduceScatter: res = ncclReduceScatter(send[r], recv[r], c.count, c.to.dtype, ops[r], comm, s); break;
      case Coll::kAllToAll: res = ncclAlltoAll(send[r], recv[r], c.count, c.to.dtype, comm, s); break;
      case Coll::kGather: res = ncclGather(send[r], recv[r], c.count, c.to.dtype, root, comm, s); break;
      case Coll::kScatter: res = ncclScatter(send[r], recv[r], c.count, c.to.dtype, root, comm, s); break;
    }
    ASSERT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
  }
  NCCL_OK(ncclGroupEnd());
  clique.sync();
  if (c.to.op == ncclNumOps) {
    for (int r = 0; r < n; ++r) NCCL_OK(ncclRedOpDestroy(ops[r], clique.comms[r]));
  }

  // Host reference, in double, of each element the API defines.
  const auto reduce_at = [&](uint64_t index) {
    std::vector<double> v(n);
    for (int q = 0; q < n; ++q) v[q] = inputs[q][index];
    if (c.to.op == ncclNumOps) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += v[q] * premul_scalar(q);
      return s;
    }
    switch (c.to.op) {
      case ncclSum: return std::accumulate(v.begin(), v.end(), 0.0);
      case ncclProd: return std::accumulate(v.begin(), v.end(), 1.0, std::multiplies<>());
      case ncclMax: return *std::max_element(v.begin(), v.end());
      case ncclMin: return *std::min_element(v.begin(), v.end());
      case ncclAvg: {
        const double s = std::accumulate(v.begin(), v.end(), 0.0);
        return ef::is_floating(t) ? s / n : std::trunc(s / n);
      }
      default: return 0.0;
    }
  };
  int reported = 0;
  for (int r = 0; r < n; ++r) {
    const bool has_output = !((c.coll == Coll::kReduce || c.coll == Coll::kGather) && r != root);
    if (!has_output || out_elems == 0) continue;
    std::vector<char> host(out_elems * es);
    cudaSetDevice(clique.devices[r]);
    CUDA_OK(cudaMemcpy(host.data(), recv[r], host.size(), cudaMemcpyDeviceToHost));
    for (uint64_t k = 0; k < out_elems; ++k) {
      double want = 0;
      const uint64_t q = c.count == 0 ? 0 : k / c.count, i = c.count == 0 ? 0 : k % c.count;
      switch (c.coll) {
        case Coll::kAllReduce: case Coll::kReduce: want = reduce_at(k); break;
        case Coll::kReduceScatter: want = reduce_at(r * c.count + k); break;
        case Coll::kBroadcast: want = inputs[root][k]; break;
        case Coll::kAllGather: case Coll::kGather: want = inputs[q][i]; break;
        case Coll::kAllToAll: want = inputs[q][r * c.count + i]; break;
        case Coll::kScatter: want = inputs[root][r * c.count + k]; break;
      }
      char rounded[8];
      encode(t, want, rounded);
      want = decode(t, rounded);
      const double got = decode(t, host.data() + k * es);
      const double tol = reduces(c.coll) ? tolerance(t) * std::max(1.0, std::fabs(want)) : 0.0;
      if (std::fabs(got - want) > tol && reported++ < 5)
        ADD_FAILURE() << "rank " << r << " output[" << k << "]: expected " << want << ", got " << got;
    }
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(clique.devices[r]);
    cudaFree(base_send[r]);
    cudaFree(base_recv[r]);
  }
}

struct CliqueShape {
  const char* label;
  int gpus_needed;
  std::function<std::vector<int>(int)> devices;
};
const CliqueShape kShapes[] = {
    {"one_gpu", 1, [](int) { return std::vector<int>{0}; }},
    {"all_gpus", 1, [](int g) { std::vector<int> d(g); std::iota(d.begin(), d.end(), 0); return d; }},
    {"four_ranks_per_gpu", 2, [](int) { return std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}; }},
    // Ranks sharing one GPU in one process: the one-pass (mrc) programs where a collective
    // has one, tails and the other collectives through the usual table.
    {"two_ranks_on_gpu0", 1, [](int) { return std::vector<int>{0, 0}; }},
    {"three_ranks_on_gpu0", 1, [](int) { return std::vector<int>{0, 0, 0}; }},
};

class RuntimeCollectives : public ::testing::TestWithParam<std::tuple<int, Coll>> {};

TEST_P(RuntimeCollectives, MatchHostReference) {
  const CliqueShape& shape = kShapes[std::get<0>(GetParam())];
  EFCCL_REQUIRE_GPUS(shape.gpus_needed);
  TestClique clique(shape.devices(visible_gpus()));
  ASSERT_FALSE(HasFailure());
  const Coll coll = std::get<1>(GetParam());
  for (const TypeOp& to : kTypeOps) {
    if (!reduces(coll) && to.op != ncclSum) continue;  // data movement ignores the operator
    for (bool inplace : {false, true}) {
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{1000}, uint64_t{(1 << 20) + 3}}) {
        SCOPED_TRACE(std::string(name(coll)) + " " + to.label + (inplace ? " in-place" : " out-of-place") +
                     " count " + std::to_string(count) + " on " + shape.label);
        const std::size_t misalign = count == 1000 ? ef::size_of(static_cast<ef::DataType>(to.dtype)) : 0;
        run_case(clique, {coll, to, inplace, count, misalign});
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllShapes, RuntimeCollectives,
    ::testing::Combine(::testing::Values(0, 1, 2, 3, 4),
                       ::testing::Values(Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather,
                                         Coll::kReduceScatter, Coll::kAllToAll, Coll::kGather, Coll::kScatter)),
    [](const auto& info) {
      return std::string(kShapes[std::get<0>(info.param)].label) + "_" + name(std::get<1>(info.param));
    });

TEST(RuntimeLarge, OneGibibyteCallsWithOddCountsAreExact) {
  // The largest size nccl-tests sweeps, with counts that are not multiples of anything: a
  // float allreduce of 1 GiB + 20 bytes (out of place), an int32 allgather whose output is
  // 1 GiB + 24 bytes (in place), an int32 reduce-scatter of 1 GiB + 16 bytes of input. Two
  // ranks (sharing the GPU when only one is visible); integer-valued data, compared exactly.
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  const auto put = [&](int r, void* dst, const void* src, std::size_t bytes) {
    cudaSetDevice(c.devices[r]);
    ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);  // a pageable copy's DMA
  };
  const auto get = [&](int r, void* dst, const void* src, std::size_t bytes) {
    cudaSetDevice(c.devices[r]);
    ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  const auto device_alloc = [&](int r, std::size_t bytes) {
    cudaSetDevice(c.devices[r]);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess) << bytes << " bytes on device " << c.devices[r];
    return p;
  };
  {
    SCOPED_TRACE("allreduce float, 2^28 + 5 elements");
    const std::size_t n = (std::size_t{1} << 28) + 5;
    std::vector<void*> in(2), out(2);
    std::vector<float> h(n);
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE(in[r] = device_alloc(r, n * 4), nullptr);
      ASSERT_NE(out[r] = device_alloc(r, n * 4), nullptr);
      for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(i % 251 + 3 * r);
      put(r, in[r], h.data(), n * 4);
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r)
      NCCL_OK(ncclAllReduce(in[r], out[r], n, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
    c.sync();
    for (int r = 0; r < 2; ++r) {
      get(r, h.data(), out[r], n * 4);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(h[i], static_cast<float>(2 * (i % 251) + 3)) << "rank " << r << " element " << i;
      cudaFree(in[r]);
      cudaFree(out[r]);
    }
  }
  {
    SCOPED_TRACE("allgather int32 in place, 2^27 + 3 elements per rank");
    const std::size_t n = (std::size_t{1} << 27) + 3;
    std::vector<void*> buf(2);
    std::vector<int32_t> h(2 * n);
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE(buf[r] = device_alloc(r, 2 * n * 4), nullptr);
      for (std::size_t i = 0; i < 2 * n; ++i) h[i] = -1;
      for (std::size_t i = 0; i < n; ++i) h[r * n + i] = static_cast<int32_t>(i * 7 + r);
      put(r, buf[r], h.data(), 2 * n * 4);
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r)
      NCCL_OK(ncclAllGather(static_cast<int32_t*>(buf[r]) + r * n, buf[r], n, ncclInt32, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
    c.sync();
    for (int r = 0; r < 2; ++r) {
      get(r, h.data(), buf[r], 2 * n * 4);
      for (std::size_t i = 0; i < 2 * n; ++i)
        ASSERT_EQ(h[i], static_cast<int32_t>((i % n) * 7 + i / n)) << "rank " << r << " element " << i;
      cudaFree(buf[r]);
    }
  }
  {
    SCOPED_TRACE("reduce-scatter int32, 2^27 + 2 elements per rank");
    const std::size_t n = (std::size_t{1} << 27) + 2;
    std::vector<void*> in(2), out(2);
    std::vector<int32_t> h(2 * n);
    for (int r = 0; r < 2; ++r) {
      ASSERT_NE(in[r] = device_alloc(r, 2 * n * 4), nullptr);
      ASSERT_NE(out[r] = device_alloc(r, n * 4), nullptr);
      for (std::size_t i = 0; i < 2 * n; ++i) h[i] = static_cast<int32_t>(i % 1009) * (r + 1);
      put(r, in[r], h.data(), 2 * n * 4);
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; ++r)
      NCCL_OK(ncclReduceScatter(in[r], out[r], n, ncclInt32, ncclSum, c.comms[r], c.streams[r]));
    NCCL_OK(ncclGroupEnd());
    c.sync();
    for (int r = 0; r < 2; ++r) {
      get(r, h.data(), out[r], n * 4);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(h[i], static_cast<int32_t>((r * n + i) % 1009) * 3) << "rank " << r << " element " << i;
      cudaFree(in[r]);
      cudaFree(out[r]);
    }
  }
}

TEST(RuntimeApiErrors, ArgumentsOfALiveCommunicator) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique clique({0, 0});
  ncclComm_t comm = clique.comms[0];
  void* buf = nullptr;
  cudaSetDevice(0);
  CUDA_OK(cudaMalloc(&buf, 1024));
  const auto last = [] { return std::string(ncclGetLastError(nullptr)); };
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last().find("invalid datatype"), std::string::npos) << last();
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat, static_cast<ncclRedOp_t>(42), comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last().find("invalid reduction operator 42"), std::string::npos) << last();
  EXPECT_EQ(ncclBroadcast(buf, buf, 4, ncclFloat, 2, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last().find("root 2 is out of range"), std::string::npos) << last();
  EXPECT_EQ(ncclSend(buf, 4, ncclFloat, -1, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, buf, 4, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last().find("sendbuff is NULL"), std::string::npos) << last();
  EXPECT_EQ(ncclAllGather(buf, buf, SIZE_MAX / 4, ncclFloat, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(last().find("overflows"), std::string::npos) << last();
  int rank = -1, count = 0, dev = -1;
  NCCL_OK(ncclCommUserRank(clique.comms[1], &rank));
  NCCL_OK(ncclCommCount(comm, &count));
  NCCL_OK(ncclCommCuDevice(clique.comms[1], &dev));
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(dev, 0);
  // Count 0 allows null pointers and launches nothing.
  NCCL_OK(ncclGroupStart());
  for (ncclComm_t c : clique.comms) NCCL_OK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c, nullptr));
  NCCL_OK(ncclGroupEnd());
  // A premulsum op is bound to its datatype and communicator.
  float scalar = 2.0f;
  ncclRedOp_t op;
  NCCL_OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm));
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclHalf, op, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpDestroy(op, clique.comms[1]), ncclInvalidArgument);
  NCCL_OK(ncclRedOpDestroy(op, comm));
  EXPECT_EQ(ncclRedOpDestroy(op, comm), ncclInvalidArgument);
  cudaFree(buf);
}

TEST(RuntimeOneRank, CollectivesAreOneCopyOrNothingUnlessTheyScale) {
  // A communicator of one rank runs a built-in collective as a device-to-device copy (out of
  // place) or not at all (in place); a premulsum with a scalar other than 1 still runs its
  // program. Seen in what a capture records.
  EFCCL_REQUIRE_GPUS(1);
  TestClique clique({0});
  constexpr size_t kCount = 4096;
  float* send = nullptr;
  float* recv = nullptr;
  CUDA_OK(cudaMalloc(&send, kCount * sizeof(float)));
  CUDA_OK(cudaMalloc(&recv, kCount * sizeof(float)));
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 97);
  CUDA_OK(cudaMemcpy(send, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s = clique.streams[0];
  // The kinds of the nodes a captured call leaves in its graph.
  const auto captured = [&](const std::function<ncclResult_t()>& call, std::vector<cudaGraphNodeType>* kinds) {
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const ncclResult_t r = call();
    ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    ASSERT_EQ(r, ncclSuccess) << ncclGetLastError(nullptr);
    size_t n = 0;
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
    std::vector<cudaGraphNode_t> nodes(n);
    if (n > 0) {
      ASSERT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
    }
    kinds->clear();
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType t{};
      ASSERT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
      kinds->push_back(t);
    }
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  };
  std::vector<cudaGraphNodeType> kinds;
  const auto expect_recv = [&](float factor, const char* what) {
    std::vector<float> got(kCount);
    ASSERT_EQ(cudaMemcpy(got.data(), recv, kCount * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], factor * host[i]) << what << " element " << i;
  };
  captured([&] { return ncclAllReduce(send, recv, kCount, ncclFloat, ncclSum, clique.comms[0], s); }, &kinds);
  EXPECT_EQ(kinds, std::vector<cudaGraphNodeType>{cudaGraphNodeTypeMemcpy});
  expect_recv(1.0f, "allreduce");
  CUDA_OK(cudaMemset(recv, 0, kCount * sizeof(float)));
  captured([&] { return ncclAllGather(send, recv, kCount, ncclFloat, clique.comms[0], s); }, &kinds);
  EXPECT_EQ(kinds, std::vector<cudaGraphNodeType>{cudaGraphNodeTypeMemcpy});
  expect_recv(1.0f, "allgather");
  captured([&] { return ncclAllReduce(recv, recv, kCount, ncclFloat, ncclAvg, clique.comms[0], s); }, &kinds);
  EXPECT_TRUE(kinds.empty()) << kinds.size() << " node(s) for an in-place call of one rank";
  expect_recv(1.0f, "in-place avg");
  // Premulsum by 2: the program runs (a kernel) and scales.
  ncclRedOp_t twice;
  float two = 2.0f;
  NCCL_OK(ncclRedOpCreatePreMulSum(&twice, &two, ncclFloat, ncclScalarHostImmediate, clique.comms[0]));
  captured([&] { return ncclAllReduce(send, recv, kCount, ncclFloat, twice, clique.comms[0], s); }, &kinds);
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), cudaGraphNodeTypeKernel), kinds.end());
  expect_recv(2.0f, "premulsum by 2");
  // Calls of one group stay in the group's launch (kernels, no copies): a premulsum and a sum.
  float* copy = nullptr;
  CUDA_OK(cudaMalloc(&copy, kCount * sizeof(float)));
  CUDA_OK(cudaMemset(recv, 0, kCount * sizeof(float)));
  CUDA_OK(cudaMemset(copy, 0, kCount * sizeof(float)));
  captured(
      [&] {
        ncclGroupStart();
        ncclAllReduce(send, recv, kCount, ncclFloat, twice, clique.comms[0], s);
        ncclAllReduce(send, copy, kCount, ncclFloat, ncclSum, clique.comms[0], s);
        return ncclGroupEnd();
      },
      &kinds);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cudaGraphNodeTypeMemcpy), 0);
  EXPECT_NE(std::find(kinds.begin(), kinds.end(), cudaGraphNodeTypeKernel), kinds.end());
  expect_recv(2.0f, "premulsum in a group");
  std::vector<float> got(kCount);
  CUDA_OK(cudaMemcpy(got.data(), copy, kCount * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], host[i]) << "sum in a group, element " << i;
  NCCL_OK(ncclRedOpDestroy(twice, clique.comms[0]));
  cudaFree(copy);
  cudaFree(send);
  cudaFree(recv);
}

TEST(RuntimeApiErrors, UseAfterDestroyIsDetected) {
  EFCCL_REQUIRE_GPUS(1);
  ncclComm_t comm = nullptr;
  const int dev = 0;
  NCCL_OK(ncclCommInitAll(&comm, 1, &dev));
  NCCL_OK(ncclCommDestroy(comm));
  int n = 0;
  EXPECT_EQ(ncclCommCount(comm, &n), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("not a live communicator"), std::string::npos);
}

TEST(RuntimeApiErrors, MismatchAcrossRanksIsReported) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique clique({0, 0, 0});
  cudaSetDevice(0);
  // Each rank its own buffer: ranks sharing a GPU that share a buffer are refused (below).
  std::vector<void*> bufs(3, nullptr);
  for (void*& b : bufs) CUDA_OK(cudaMalloc(&b, 1 << 16));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(bufs[0], bufs[0], 16, ncclFloat, ncclSum, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclAllReduce(bufs[1], bufs[1], 32, ncclFloat, ncclSum, clique.comms[1], clique.streams[1]));
  NCCL_OK(ncclAllReduce(bufs[2], bufs[2], 16, ncclFloat, ncclSum, clique.comms[2], clique.streams[2]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  const std::string m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("rank 0's call #0 is ncclAllReduce(count 16"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1's call #0 is ncclAllReduce(count 32"), std::string::npos) << m;
  // A rank that makes fewer calls than the others in a group covering the whole clique.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r) NCCL_OK(ncclAllReduce(bufs[r], bufs[r], 16, ncclFloat, ncclSum, clique.comms[r], clique.streams[r]));
  NCCL_OK(ncclAllReduce(bufs[0], bufs[0], 16, ncclFloat, ncclSum, clique.comms[0], clique.streams[0]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0 has 1 unmatched call(s)"), std::string::npos)
      << ncclGetLastError(nullptr);
  // One buffer for every rank: the one-pass allreduce of ranks sharing a GPU would race.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r) NCCL_OK(ncclAllReduce(bufs[0], bufs[0], 16, ncclFloat, ncclSum, clique.comms[r], clique.streams[r]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0's sendbuff overlaps rank 1's recvbuff"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  // The communicators stay usable.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r) NCCL_OK(ncclAllReduce(bufs[r], bufs[r], 16, ncclFloat, ncclSum, clique.comms[r], clique.streams[r]));
  NCCL_OK(ncclGroupEnd());
  clique.sync();
  for (void* b : bufs) cudaFree(b);
}

TEST(RuntimeApiErrors, RanksSharingAGpuNeedTheirOwnBuffersAtTheCollectivesSizes) {
  // Allgather's output holds n blocks, reduce-scatter's input n blocks: buffers that overlap
  // only at those sizes are refused; a non-root's ignored buffer (broadcast's send, reduce's
  // receive) may be anything, and stays untouched.
  EFCCL_REQUIRE_GPUS(1);
  TestClique clique({0, 0});
  constexpr size_t kCount = 1024;
  constexpr size_t kBytes = kCount * sizeof(float);
  cudaSetDevice(0);
  char* base = nullptr;
  CUDA_OK(cudaMalloc(&base, 8 * kBytes));
  // Blocks of kCount floats: 0 holds 1s, 1 holds 2s, 2 holds 3s, 3 holds 4s, 4..7 zeros.
  std::vector<float> host(8 * kCount, 0.0f);
  for (size_t b = 0; b < 4; ++b)
    std::fill(host.begin() + b * kCount, host.begin() + (b + 1) * kCount, 1.0f + b);
  CUDA_OK(cudaMemcpy(base, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  const auto block = [&](size_t b) { return base + b * kBytes; };
  const auto expect_blocks = [&](size_t first, std::vector<float> want, const char* what) {
    std::vector<float> got(want.size() * kCount);
    ASSERT_EQ(cudaMemcpy(got.data(), block(first), got.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want[i / kCount]) << what << ": block " << first + i / kCount << " element " << i % kCount;
  };
  // Rank 1's output starts inside rank 0's two-block output.
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllGather(block(0), block(4), kCount, ncclFloat, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclAllGather(block(1), block(5), kCount, ncclFloat, clique.comms[1], clique.streams[1]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0's recvbuff overlaps rank 1's recvbuff"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  // Rank 1's output right after rank 0's: accepted, and each rank's block in its place.
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllGather(block(0), block(4), kCount, ncclFloat, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclAllGather(block(1), block(6), kCount, ncclFloat, clique.comms[1], clique.streams[1]));
  NCCL_OK(ncclGroupEnd());
  clique.sync();
  expect_blocks(4, {1, 2, 1, 2}, "allgather");
  // Reduce-scatter: rank 0's two-block input meets rank 1's output.
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclReduceScatter(block(0), block(4), kCount, ncclFloat, ncclSum, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclReduceScatter(block(2), block(1), kCount, ncclFloat, ncclSum, clique.comms[1], clique.streams[1]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0's sendbuff overlaps rank 1's recvbuff"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  // Broadcast from rank 0: rank 1's (ignored) send buffer is rank 0's output. Reduce to rank 0:
  // rank 1's (ignored) receive buffer is rank 0's input. Both run, and are correct.
  CUDA_OK(cudaMemset(block(4), 0, 4 * kBytes));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclBroadcast(block(0), block(4), kCount, ncclFloat, 0, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclBroadcast(block(4), block(5), kCount, ncclFloat, 0, clique.comms[1], clique.streams[1]));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclReduce(block(1), block(6), kCount, ncclFloat, ncclSum, 0, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclReduce(block(2), block(0), kCount, ncclFloat, ncclSum, 0, clique.comms[1], clique.streams[1]));
  NCCL_OK(ncclGroupEnd());
  clique.sync();
  expect_blocks(4, {1, 1, 5, 0}, "broadcast, then reduce of 2s and 3s");
  expect_blocks(0, {1, 2, 3, 4}, "the inputs and the ignored buffers");
  cudaFree(base);
}

// ---- Threads and ranks ----

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

float first_element(int device, const float* p) {
  cudaSetDevice(device);
  float v = -1;
  cudaMemcpy(&v, p, sizeof(float), cudaMemcpyDeviceToHost);
  return v;
}

/// One group of many collectives and send/receive pairs on every rank of `c`: float
/// allreduces and a reduce-scatter (one kernel), then bfloat16 allgathers and a ring of sends
/// (data movement: bytes, a second kernel). Returns the interpreter launches it took; every
/// result is checked exactly.
enum class GroupRun {
  kEager,              ///< round 0 prepares the programs, round 1 is measured
  kCapturedAfterWarmUp,  ///< round 0 eager, then captured (relaxed mode) and replayed 3 times
  kCapturedCold,       ///< captured in global mode without ever running eagerly, replayed
};

void run_mixed_group(TestClique& c, std::size_t* launches, GroupRun how = GroupRun::kEager) {
  const bool capture = how != GroupRun::kEager;
  const int n = c.n();
  constexpr int kAllReduces = 9;
  constexpr int kAllGathers = 3;
  struct Buffers {
    std::vector<float*> allreduce;
    float* rs_in = nullptr;
    float* rs_out = nullptr;
    std::vector<uint16_t*> ag_in, ag_out;
    int32_t* send = nullptr;
    int32_t* recv = nullptr;
  };
  const auto ar_count = [](int k) { return static_cast<std::size_t>(1000 + 3571 * k); };
  constexpr std::size_t kRsCount = 4099, kAgCount = 777, kP2pCount = 12345;
  std::vector<Buffers> b(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    for (int k = 0; k < kAllReduces; ++k) {
      float* p = nullptr;
      CUDA_OK(cudaMalloc(&p, ar_count(k) * sizeof(float)));
      b[r].allreduce.push_back(p);
    }
    CUDA_OK(cudaMalloc(&b[r].rs_in, kRsCount * n * sizeof(float)));
    CUDA_OK(cudaMalloc(&b[r].rs_out, kRsCount * sizeof(float)));
    for (int k = 0; k < kAllGathers; ++k) {
      uint16_t *in = nullptr, *out = nullptr;
      CUDA_OK(cudaMalloc(&in, kAgCount * sizeof(uint16_t)));
      CUDA_OK(cudaMalloc(&out, kAgCount * n * sizeof(uint16_t)));
      b[r].ag_in.push_back(in);
      b[r].ag_out.push_back(out);
    }
    CUDA_OK(cudaMalloc(&b[r].send, kP2pCount * sizeof(int32_t)));
    CUDA_OK(cudaMalloc(&b[r].recv, kP2pCount * sizeof(int32_t)));
  }
  // Inputs: small integers, exact in float and as bfloat16 bit patterns.
  const auto fill = [&](int round) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      for (int k = 0; k < kAllReduces; ++k) {
        std::vector<float> v(ar_count(k));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i + r + k + round) % 7);
        CUDA_OK(cudaMemcpy(b[r].allreduce[k], v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
      }
      std::vector<float> rs(kRsCount * n);
      for (std::size_t i = 0; i < rs.size(); ++i) rs[i] = static_cast<float>((i * 3 + r + round) % 5);
      CUDA_OK(cudaMemcpy(b[r].rs_in, rs.data(), rs.size() * sizeof(float), cudaMemcpyHostToDevice));
      for (int k = 0; k < kAllGathers; ++k) {
        std::vector<uint16_t> v(kAgCount);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(i * 31 + r * 7 + k + round);
        CUDA_OK(cudaMemcpy(b[r].ag_in[k], v.data(), v.size() * 2, cudaMemcpyHostToDevice));
      }
      std::vector<int32_t> v(kP2pCount);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 13 + r * 100003 + round);
      CUDA_OK(cudaMemcpy(b[r].send, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    }
    CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));  // pageable copies' DMA
  };
  const auto enqueue = [&]() {
    NCCL_OK(ncclGroupStart());
    for (int k = 0; k < kAllReduces; ++k)
      for (int r = 0; r < n; ++r)
        NCCL_OK(ncclAllReduce(b[r].allreduce[k], b[r].allreduce[k], ar_count(k), ncclFloat, ncclSum,
                              c.comms[r], c.streams[r]));
    for (int r = 0; r < n; ++r)
      NCCL_OK(ncclReduceScatter(b[r].rs_in, b[r].rs_out, kRsCount, ncclFloat, ncclSum, c.comms[r],
                                c.streams[r]));
    for (int k = 0; k < kAllGathers; ++k)
      for (int r = 0; r < n; ++r)
        NCCL_OK(ncclAllGather(b[r].ag_in[k], b[r].ag_out[k], kAgCount, ncclBfloat16, c.comms[r],
                              c.streams[r]));
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclSend(b[r].send, kP2pCount, ncclInt32, (r + 1) % n, c.comms[r], c.streams[r]));
      NCCL_OK(ncclRecv(b[r].recv, kP2pCount, ncclInt32, (r + n - 1) % n, c.comms[r], c.streams[r]));
    }
    NCCL_OK(ncclGroupEnd());
  };
  const auto check = [&](int round) {
    c.sync();
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      for (int k = 0; k < kAllReduces; ++k) {
        std::vector<float> got(ar_count(k));
        CUDA_OK(cudaMemcpy(got.data(), b[r].allreduce[k], got.size() * 4, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < got.size(); ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += static_cast<float>((i + q + k + round) % 7);
          ASSERT_EQ(got[i], want) << "round " << round << " rank " << r << " allreduce " << k
                                  << " element " << i;
        }
      }
      std::vector<float> rs(kRsCount);
      CUDA_OK(cudaMemcpy(rs.data(), b[r].rs_out, rs.size() * 4, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < rs.size(); ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>(((r * kRsCount + i) * 3 + q + round) % 5);
        ASSERT_EQ(rs[i], want) << "round " << round << " rank " << r << " reducescatter element " << i;
      }
      for (int k = 0; k < kAllGathers; ++k) {
        std::vector<uint16_t> got(kAgCount * n);
        CUDA_OK(cudaMemcpy(got.data(), b[r].ag_out[k], got.size() * 2, cudaMemcpyDeviceToHost));
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < kAgCount; ++i)
            ASSERT_EQ(got[q * kAgCount + i], static_cast<uint16_t>(i * 31 + q * 7 + k + round))
                << "round " << round << " rank " << r << " allgather " << k << " block " << q;
      }
      std::vector<int32_t> got(kP2pCount);
      CUDA_OK(cudaMemcpy(got.data(), b[r].recv, got.size() * 4, cudaMemcpyDeviceToHost));
      const int from = (r + n - 1) % n;
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], static_cast<int32_t>(i * 13 + from * 100003 + round))
            << "round " << round << " rank " << r << " recv element " << i;
    }
  };

  // Round 0 prepares every program, except for a cold capture: then the executors (and the
  // copies of the repeated allreduce programs) are created during the capture.
  if (how != GroupRun::kCapturedCold) {
    fill(0);
    enqueue();
    check(0);
  }
  if (!capture) {
    const uint64_t before = device::interpreter_launch_count();
    fill(1);
    enqueue();
    *launches = device::interpreter_launch_count() - before;
    check(1);
  } else {
    // One graph for every rank's stream: the others fork from rank 0's capture and join it
    // again (ranks sharing a GPU are joined by events, which a capture follows).
    std::vector<cudaEvent_t> fork(n), join(n);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaEventCreateWithFlags(&fork[r], cudaEventDisableTiming));
      CUDA_OK(cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming));
    }
    cudaSetDevice(c.devices[0]);
    // Global mode (PyTorch's default) is the strictest: any unsafe call from any thread during
    // the capture would invalidate it.
    CUDA_OK(cudaStreamBeginCapture(c.streams[0], how == GroupRun::kCapturedCold
                                                     ? cudaStreamCaptureModeGlobal
                                                     : cudaStreamCaptureModeRelaxed));
    CUDA_OK(cudaEventRecord(fork[0], c.streams[0]));
    for (int r = 1; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaStreamWaitEvent(c.streams[r], fork[0], 0));
    }
    const uint64_t before = device::interpreter_launch_count();
    enqueue();
    *launches = device::interpreter_launch_count() - before;
    for (int r = 1; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      CUDA_OK(cudaEventRecord(join[r], c.streams[r]));
      cudaSetDevice(c.devices[0]);
      CUDA_OK(cudaStreamWaitEvent(c.streams[0], join[r], 0));
    }
    cudaSetDevice(c.devices[0]);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamEndCapture(c.streams[0], &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int round = 2; round < 5; ++round) {
      fill(round);
      cudaSetDevice(c.devices[0]);
      CUDA_OK(cudaGraphLaunch(exec, c.streams[0]));
      check(round);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    for (int r = 0; r < n; ++r) {
      cudaEventDestroy(fork[r]);
      cudaEventDestroy(join[r]);
    }
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    for (float* p : b[r].allreduce) cudaFree(p);
    for (uint16_t* p : b[r].ag_in) cudaFree(p);
    for (uint16_t* p : b[r].ag_out) cudaFree(p);
    cudaFree(b[r].rs_in);
    cudaFree(b[r].rs_out);
    cudaFree(b[r].send);
    cudaFree(b[r].recv);
  }
}

TEST(RuntimeGroups, ManyCollectivesOfAGroupRunInTwoLaunchesPerDevice) {
  // 10 reducing float calls fuse into one launch per GPU; 3 allgathers and the send/receive
  // ring (bytes) into a second. One rank per GPU, then two ranks per GPU.
  EFCCL_REQUIRE_GPUS(1);
  for (int per_gpu : {1, 2}) {
    SCOPED_TRACE(std::to_string(per_gpu) + " rank(s) per GPU");
    std::vector<int> devices;
    for (int g = 0; g < std::min(visible_gpus(), 2); ++g)
      for (int k = 0; k < per_gpu; ++k) devices.push_back(g);
    if (devices.size() < 2) devices.push_back(0);
    TestClique c(devices);
    std::size_t launches = 0;
    run_mixed_group(c, &launches);
    std::vector<int> gpus = devices;
    gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
    EXPECT_EQ(launches, 2 * gpus.size());
  }
}

TEST(RuntimeGroups, AFusedGroupReplaysFromAGraph) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  std::size_t launches = 0;
  run_mixed_group(c, &launches, GroupRun::kCapturedAfterWarmUp);
  std::vector<int> gpus = c.devices;
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  EXPECT_EQ(launches, 2 * gpus.size());
}

TEST(RuntimeGroups, AGroupCapturedBeforeItEverRanReplays) {
  // Every executor, and the copies the repeated allreduce programs get, is created inside a
  // global-mode capture; the group still fuses into two launches per GPU. One rank per GPU,
  // then two ranks per GPU (fresh communicators, so nothing is cached).
  EFCCL_REQUIRE_GPUS(1);
  for (int per_gpu : {1, 2}) {
    SCOPED_TRACE(std::to_string(per_gpu) + " rank(s) per GPU");
    std::vector<int> devices;
    for (int g = 0; g < std::min(visible_gpus(), 2); ++g)
      for (int k = 0; k < per_gpu; ++k) devices.push_back(g);
    if (devices.size() < 2) devices.push_back(0);
    std::size_t eager_executors = 0;
    {
      TestClique eager(devices);  // the same group run eagerly: the executors (copies included) it makes
      std::size_t eager_launches = 0;
      run_mixed_group(eager, &eager_launches, GroupRun::kEager);
      eager_executors = eager.comms[0]->clique->executor_cache_stats().size;
    }
    TestClique c(devices);
    std::size_t launches = 0;
    run_mixed_group(c, &launches, GroupRun::kCapturedCold);
    std::vector<int> gpus = devices;
    gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
    EXPECT_EQ(launches, 2 * gpus.size());
    // The capture made the same executors, the allreduces' copies included (without them the
    // group would still be two launches, its repeated programs serialised).
    EXPECT_GT(eager_executors, 4u);
    EXPECT_EQ(c.comms[0]->clique->executor_cache_stats().size, eager_executors);
  }
}

TEST(RuntimeThreads, ThreadPerRankCallsReturnWithTheirWorkOnTheStream) {
  // ncclCommInitAll here, then one thread per rank (nccl-tests -t 2 -g 1 initialises in a group
  // from its main thread likewise), each rank late in turn.
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  expect_thread_per_rank_stream_order(c.comms, c.devices, {1, 0, 1});
}

TEST(RuntimeThreads, OneThreadDrivesSeveralRanksWithoutAGroup) {
  // Legal in NCCL for ranks on different GPUs: the calls of all but the last rank stay queued
  // and return at once; the last one launches the set. Four ranks: two per GPU with two GPUs.
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(4));
  constexpr std::size_t kCount = 4099;
  std::vector<float*> buf(4);
  for (int r = 0; r < 4; ++r) ASSERT_NE(buf[r] = filled_buffer(c.devices[r], kCount, 1.0f), nullptr);
  const auto start = Clock::now();
  for (int round = 0; round < 3; ++round)
    for (int r = 0; r < 4; ++r)
      NCCL_OK(ncclAllReduce(buf[r], buf[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
  EXPECT_LT(seconds_since(start), 30.0);
  c.sync();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(first_element(c.devices[r], buf[r]), 64.0f) << "rank " << r;  // 1 * 4^3
    cudaFree(buf[r]);
  }
}

TEST(RuntimeThreads, ARankWhoseThreadNeverCallsTimesOutNamingIt) {
  EFCCL_REQUIRE_GPUS(1);
  std::unique_ptr<TestClique> c;
  {
    ScopedEnv timeout("EFCCL_TIMEOUT_MS", "1000");
    c = std::make_unique<TestClique>(spread_ranks(2));
  }
  float* buf = filled_buffer(c->devices[0], 1024, 1.0f);
  ASSERT_NE(buf, nullptr);
  ncclResult_t result = ncclSuccess;
  std::string message;
  double took = 0;
  std::thread rank0([&] {
    cudaSetDevice(c->devices[0]);
    const auto start = Clock::now();
    result = ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, c->comms[0], c->streams[0]);
    took = seconds_since(start);
    message = ncclGetLastError(nullptr);
  });
  rank0.join();  // rank 1 is driven by this thread, which never calls
  EXPECT_EQ(result, ncclInvalidUsage);
  EXPECT_NE(message.find("rank(s) 1 never made it"), std::string::npos) << message;
  EXPECT_NE(message.find("EFCCL_TIMEOUT_MS"), std::string::npos) << message;
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 10.0);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(c->comms[1], &async));
  EXPECT_EQ(async, ncclInvalidUsage) << "the late rank learns why its call will not meet rank 0's";
  NCCL_OK(ncclCommGetAsyncError(c->comms[0], &async));
  EXPECT_EQ(async, ncclSuccess) << "rank 0 saw the error as its return code";
  cudaSetDevice(c->devices[0]);
  CUDA_OK(cudaStreamSynchronize(c->streams[0]));
  EXPECT_EQ(first_element(c->devices[0], buf), 1.0f);  // nothing ran
  cudaFree(buf);
}

TEST(RuntimeThreads, DestroyingARankDropsThePeersQueuedCalls) {
  EFCCL_REQUIRE_GPUS(1);
  const std::vector<int> devices = spread_ranks(2);
  ncclComm_t comms[2] = {nullptr, nullptr};
  NCCL_OK(ncclCommInitAll(comms, 2, devices.data()));
  cudaSetDevice(devices[0]);
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* buf = filled_buffer(devices[0], 1024, 1.0f);
  ASSERT_NE(buf, nullptr);
  // Queued (this thread drives rank 1 too), then rank 1 goes away instead of calling.
  NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comms[0], stream));
  NCCL_OK(ncclCommDestroy(comms[1]));
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(comms[0], &async));
  EXPECT_EQ(async, ncclInvalidUsage);
  std::string m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("rank 1's communicator was destroyed (ncclCommDestroy)"), std::string::npos) << m;
  EXPECT_EQ(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comms[0], stream), ncclInvalidUsage);
  m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("rank 1's communicator was destroyed"), std::string::npos) << m;
  CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(first_element(devices[0], buf), 1.0f);  // the dropped call never ran
  NCCL_OK(ncclCommDestroy(comms[0]));
  cudaFree(buf);
  cudaStreamDestroy(stream);
}

TEST(RuntimeThreads, FinalizeWaitsForQueuedCallsOrSaysWhyItCannot) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  std::vector<float*> buf(2);
  for (int r = 0; r < 2; ++r) ASSERT_NE(buf[r] = filled_buffer(c.devices[r], 1024, 1.0f), nullptr);
  NCCL_OK(ncclAllReduce(buf[0], buf[0], 1024, ncclFloat, ncclSum, c.comms[0], c.streams[0]));
  // Rank 0's call waits for rank 1, which only this thread can make.
  EXPECT_EQ(ncclCommFinalize(c.comms[0]), ncclInvalidUsage);
  const std::string m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("which this thread drives"), std::string::npos) << m;
  // From another thread it waits until this one makes rank 1's call.
  ncclResult_t finalized = ncclInternalError;
  double took = 0;
  std::thread finalizer([&] {
    const auto start = Clock::now();
    finalized = ncclCommFinalize(c.comms[0]);
    took = seconds_since(start);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  NCCL_OK(ncclAllReduce(buf[1], buf[1], 1024, ncclFloat, ncclSum, c.comms[1], c.streams[1]));
  finalizer.join();
  EXPECT_EQ(finalized, ncclSuccess);
  EXPECT_GE(took, 0.2);
  NCCL_OK(ncclCommFinalize(c.comms[1]));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first_element(c.devices[r], buf[r]), 2.0f) << "rank " << r;
    cudaFree(buf[r]);
  }
}

TEST(RuntimeThreads, AnInPlaceDisagreementFailsEveryRankOfTheSet) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(spread_ranks(2));
  constexpr std::size_t kCount = 1024;
  std::vector<float*> send(2), recv(2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_NE(send[r] = filled_buffer(c.devices[r], kCount, 1.0f), nullptr);
    ASSERT_NE(recv[r] = filled_buffer(c.devices[r], kCount, 0.0f), nullptr);
  }
  // One thread per rank: rank 0 in place, rank 1 out of place. Both calls are in flight when
  // the set is dropped, so both return the error.
  std::vector<ncclResult_t> results(2, ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(c.devices[r]);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      results[r] = ncclAllReduce(send[r], r == 0 ? send[r] : recv[r], kCount, ncclFloat, ncclSum,
                                 c.comms[r], c.streams[r]);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], ncclInvalidUsage) << "the rank that queued first must see it too";
  EXPECT_EQ(results[1], ncclInvalidUsage);
  // One thread for both ranks: rank 0's call had returned, so it learns through its async error.
  NCCL_OK(ncclAllReduce(send[0], send[0], kCount, ncclFloat, ncclSum, c.comms[0], c.streams[0]));
  EXPECT_EQ(ncclAllReduce(send[1], recv[1], kCount, ncclFloat, ncclSum, c.comms[1], c.streams[1]),
            ncclInvalidUsage);
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(c.comms[0], &async));
  EXPECT_EQ(async, ncclInvalidUsage);
  const std::string m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("in place"), std::string::npos) << m;
  // The dropped sets are consumed: the next agreeing calls run.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(send[r], send[r], kCount, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < 2; ++r) {
    cudaSetDevice(c.devices[r]);
    CUDA_OK(cudaStreamSynchronize(c.streams[r]));
    EXPECT_EQ(first_element(c.devices[r], send[r]), 2.0f) << "rank " << r;
    cudaFree(send[r]);
    cudaFree(recv[r]);
  }
}

// ---- EFCCL_RESIDENT=1: calls posted to the resident grid (docs/runtime.md) ----

TEST(RuntimeResident, CallsArePostedAndTheLastDestroyStopsTheGrid) {
  // Two and four ranks on GPU 0: every collective matches the host reference and is posted to
  // the grid instead of launched; a call repeated on the same buffers reuses its descriptor (a
  // persistent operation); destroying the communicators stops the grid within a second.
  EFCCL_REQUIRE_GPUS(1);
  if (!device::resident_loading_allows())
    GTEST_SKIP() << "the resident grid needs CUDA_MODULE_LOADING=EAGER (kernels load lazily in "
                    "this process); ctest's resident/ registration sets it";
  ScopedEnv resident("EFCCL_RESIDENT", "1");
  ScopedEnv ctas("EFCCL_RESIDENT_CTAS", "64");
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks on GPU 0");
    auto clique = std::make_unique<TestClique>(std::vector<int>(ranks, 0));
    ASSERT_FALSE(HasFailure());
    const uint64_t posts = device::resident_stats().posts;
    for (Coll coll : {Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather,
                      Coll::kReduceScatter, Coll::kAllToAll, Coll::kGather, Coll::kScatter})
      for (bool inplace : {false, true}) {
        SCOPED_TRACE(std::string(name(coll)) + (inplace ? " in-place" : " out-of-place"));
        run_case(*clique, {coll, kTypeOps[0], inplace, 1000, 0});
        if (HasFailure()) return;
      }
    // Every program here fits 64 CTAs; one that did not would be launched (and still correct).
    EXPECT_GE(device::resident_stats().posts - posts, 16u)
        << "of 16 calls, only these were posted to the resident grid";

    constexpr std::size_t kCount = 1000;
    std::vector<float*> buffers(ranks);
    for (int r = 0; r < ranks; ++r) {
      buffers[r] = filled_buffer(0, kCount, 1.0f);
      ASSERT_NE(buffers[r], nullptr);
    }
    const device::ResidentStats before = device::resident_stats();
    constexpr int kRepeats = 20;
    for (int i = 0; i < kRepeats; ++i) {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < ranks; ++r)
        NCCL_OK(ncclAllReduce(buffers[r], buffers[r], kCount, ncclFloat, ncclSum, clique->comms[r],
                              clique->streams[r]));
      NCCL_OK(ncclGroupEnd());
    }
    clique->sync();
    const device::ResidentStats after = device::resident_stats();
    EXPECT_EQ(after.posts - before.posts, static_cast<uint64_t>(kRepeats));
    EXPECT_LE(after.new_contents - before.new_contents, 1u);
    // In place, 20 times: each element is ranks^20.
    const float want = static_cast<float>(std::pow(static_cast<double>(ranks), kRepeats));
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> got(kCount);
      CUDA_OK(cudaMemcpy(got.data(), buffers[r], kCount * sizeof(float), cudaMemcpyDeviceToHost));
      for (std::size_t i : {std::size_t{0}, kCount / 2, kCount - 1})
        ASSERT_EQ(got[i], want) << "rank " << r << " element " << i;
      cudaFree(buffers[r]);
    }

    const auto start = std::chrono::steady_clock::now();
    clique.reset();  // every communicator destroyed: the grid stops
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
    EXPECT_FALSE(device::resident_running(0));
  }
  device::set_resident_config({});  // later tests of this process launch again
}

}  // namespace
}  // namespace efccl::runtime::testing
