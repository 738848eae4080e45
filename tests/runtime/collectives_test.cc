// Every collective through the NCCL API, against a host reference: cliques of one GPU, of all
// GPUs, and with four ranks per GPU; several datatype/operator pairs, in-place and
// out-of-place, counts from 0 to 2^20+3, unaligned pointers. Also argument errors that need a
// live communicator, and a mismatch across ranks.
#include <algorithm>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

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
    ::testing::Combine(::testing::Values(0, 1, 2),
                       ::testing::Values(Coll::kAllReduce, Coll::kBroadcast, Coll::kReduce, Coll::kAllGather,
                                         Coll::kReduceScatter, Coll::kAllToAll, Coll::kGather, Coll::kScatter)),
    [](const auto& info) {
      return std::string(kShapes[std::get<0>(info.param)].label) + "_" + name(std::get<1>(info.param));
    });

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
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, 1 << 16));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, clique.comms[0], clique.streams[0]));
  NCCL_OK(ncclAllReduce(buf, buf, 32, ncclFloat, ncclSum, clique.comms[1], clique.streams[1]));
  NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, clique.comms[2], clique.streams[2]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  const std::string m = ncclGetLastError(nullptr);
  EXPECT_NE(m.find("rank 0's call #0 is ncclAllReduce(count 16"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 1's call #0 is ncclAllReduce(count 32"), std::string::npos) << m;
  // A rank that makes fewer calls than the others in a group covering the whole clique.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r) NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, clique.comms[r], clique.streams[r]));
  NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, clique.comms[0], clique.streams[0]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 0 has 1 unmatched call(s)"), std::string::npos)
      << ncclGetLastError(nullptr);
  // The communicators stay usable.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 3; ++r) NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat, ncclSum, clique.comms[r], clique.streams[r]));
  NCCL_OK(ncclGroupEnd());
  clique.sync();
  cudaFree(buf);
}

}  // namespace
}  // namespace efccl::runtime::testing
