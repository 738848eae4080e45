// ncclGroupSimulateEnd. One source, two binaries: without EFCCL_GROUP_SIMULATION_GPU (label
// cpu) the argument checks, NCCL's group semantics and the estimates behind the API, which
// need no GPU; with it (label gpu) the API over real communicators: the group's calls are
// estimated and discarded, never run.
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>
#include <vector>

#ifndef EFCCL_GROUP_SIMULATION_GPU

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/host/timing.h"
#include "enqueue/group_simulation.h"
#include "select/program_registry.h"

namespace efccl::runtime {
namespace {

std::string last_error() { return ncclGetLastError(nullptr); }

// ---- The API: arguments and group semantics (no communicator needed) ----

TEST(GroupSimulateEnd, WithoutAGroupIsInvalidUsage) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  EXPECT_NE(last_error().find("ncclGroupSimulateEnd without a matching ncclGroupStart"),
            std::string::npos)
      << last_error();
}

TEST(GroupSimulateEnd, NullSimInfoIsInvalidArgumentAndEndsTheGroup) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error().find("simInfo is NULL"), std::string::npos) << last_error();
  // The group is over (NCCL's failure path resets it): no group is left to end.
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

TEST(GroupSimulateEnd, UninitializedSimInfoIsInvalidArgument) {
  ncclSimInfo_t bad_magic = NCCL_SIM_INFO_INITIALIZER;
  bad_magic.magic = 0x12345678;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&bad_magic), ncclInvalidArgument);
  EXPECT_NE(last_error().find("NCCL_SIM_INFO_INITIALIZER"), std::string::npos) << last_error();
  EXPECT_EQ(bad_magic.estimatedTime, NCCL_UNDEF_FLOAT);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);

  ncclSimInfo_t short_size = NCCL_SIM_INFO_INITIALIZER;
  short_size.size = sizeof(size_t);  // does not reach the magic
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&short_size), ncclInvalidArgument);
  EXPECT_NE(last_error().find("size 8"), std::string::npos) << last_error();
}

TEST(GroupSimulateEnd, OnlyTheOutermostLevelReadsSimInfo) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclSuccess);  // inner level: as ncclGroupEnd
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess);
  // An empty group leaves simInfo as it was (NCCL writes only what it estimated).
  EXPECT_EQ(sim.estimatedTime, NCCL_UNDEF_FLOAT);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

TEST(GroupSimulateEnd, TheVersionIsNotChecked) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  sim.version = 22200;  // an application built against NCCL 2.22's header
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess) << last_error();
  EXPECT_EQ(sim.version, 22200u);
  EXPECT_EQ(sim.estimatedTime, NCCL_UNDEF_FLOAT);  // an empty group leaves it as it was
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage) << "the simulated group must have been closed";
  // The same info with a wrong magic is refused: what let it through is the version not being
  // checked, not a check that passes everything.
  sim.magic ^= 1;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  EXPECT_NE(last_error().find("magic"), std::string::npos) << last_error();
}

TEST(GroupSimulateEnd, AFailedCallFailsTheGroupFirst) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 1, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  EXPECT_NE(last_error().find("the group was not run"), std::string::npos) << last_error();
  EXPECT_EQ(sim.estimatedTime, NCCL_UNDEF_FLOAT);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
}

// ---- The estimates behind it ----

ProgramRegistry builtin_registry() { return ProgramRegistry({}, ProtocolFilter{}); }

CallShape allreduce(int32_t nranks, uint64_t count) {
  CallShape s;
  s.collective = ef::Collective::kAllReduce;
  s.nranks = nranks;
  s.count = count;
  s.dtype = ef::DataType::kFloat32;
  return s;
}

double value(const StatusOr<double>& t) {
  EXPECT_TRUE(t.is_ok()) << t.status().message();
  return t.is_ok() ? *t : -1;
}

TEST(GroupSimulationEstimate, CollectiveTimeGrowsWithBytesAndMeetsTheRingBound) {
  ProgramRegistry registry = builtin_registry();
  const host::LinkCostModel model;
  double previous = 0;
  for (uint64_t count = 1; count <= (uint64_t{1} << 28); count *= 16) {
    const double t = value(estimate_collective(registry, allreduce(8, count), model));
    EXPECT_GT(t, previous) << "count " << count;
    previous = t;
  }
  // 1 GiB: the tuning table's ring over 8 ranks sends 2 * 7/8 of the buffer per port.
  const double bound = 2.0 * 7 / 8 * (uint64_t{1} << 30) / (model.nvlink.bandwidth_gbps * 1e3);
  const double large = value(estimate_collective(registry, allreduce(8, uint64_t{1} << 28), model));
  EXPECT_GE(large, bound);
  EXPECT_LE(large, 1.2 * bound);
  EXPECT_EQ(value(estimate_collective(registry, allreduce(8, 0), model)), 0);
}

TEST(GroupSimulationEstimate, UsesTheProgramTheRegistrySelects) {
  // A user program claiming every size is what the registry runs, so it is what is timed.
  algorithms::AlgorithmParams params;
  params.ranks = 4;
  params.instances = 2;
  StatusOr<ef::Program> user = algorithms::generate_algorithm("ring_allreduce", params);
  ASSERT_TRUE(user.is_ok()) << user.status().message();
  ProgramRegistry registry({{*user, "user.json"}}, ProtocolFilter{});
  const uint64_t count = ef::count_granularity(*user) * 100'000;
  host::ExecOptions o;
  o.count = count;
  o.slot_bytes = 512 << 10;  // the GPU interpreter's slots
  const host::TimingResult direct = host::predict_time(*user, o, {});
  ASSERT_TRUE(direct.status.is_ok()) << direct.status.message();
  EXPECT_DOUBLE_EQ(value(estimate_collective(registry, allreduce(4, count), {})), direct.time_us);
  // The built-in choice (32 instances at this size) is faster than the 2-instance program.
  ProgramRegistry builtins = builtin_registry();
  EXPECT_LT(value(estimate_collective(builtins, allreduce(4, count), {})), direct.time_us);
}

TEST(GroupSimulationEstimate, TransfersTakeRoundsOverTheirLinks) {
  const host::LinkCostModel model;
  const uint64_t bytes = uint64_t{1} << 30;
  std::vector<char> a(16), b(16);  // addresses only: nothing is read
  const Transfer one{0, 1, a.data(), b.data(), bytes};
  const double t1 = value(estimate_transfers({one}, model));
  EXPECT_GE(t1, bytes / (model.nvlink.bandwidth_gbps * 1e3));
  EXPECT_LE(t1, 1.2 * bytes / (model.nvlink.bandwidth_gbps * 1e3));
  // Both directions at once use both directions of the link: slower than one by at most the
  // share each direction carries for the other (docs/timing-model.md: NVLink 395 GB/s one way,
  // about 360 GB/s each way with both busy, measured on two H200s).
  const Transfer back{1, 0, b.data(), a.data(), bytes};
  const double both = value(estimate_transfers({one, back}, model));
  EXPECT_GE(both, t1);
  EXPECT_LE(both, (1 + model.nvlink.reverse_fraction) * t1 * 1.01);
  // Ranks on one GPU copy through its memory, faster than NVLink.
  host::LinkCostModel shared = model;
  shared.rank_devices = {0, 0};
  EXPECT_LT(value(estimate_transfers({one}, shared)), t1);
  // A copy to self launches nothing but still moves the bytes; empty transfers cost nothing.
  const double self = value(estimate_transfers({Transfer{0, 0, a.data(), b.data(), bytes}}, model));
  EXPECT_GT(self, 0);
  EXPECT_LT(self, t1);
  EXPECT_EQ(value(estimate_transfers({Transfer{0, 1, a.data(), b.data(), 0}}, model)), 0);
}

}  // namespace
}  // namespace efccl::runtime

#else  // EFCCL_GROUP_SIMULATION_GPU

#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

/// Two ranks: on two GPUs when there are, else both on GPU 0.
std::vector<int> two_ranks() {
  return visible_gpus() >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
}

float* make_buffer(int dev, std::size_t n, float fill) {
  cudaSetDevice(dev);
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  std::vector<float> h(n, fill);
  EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  return p;
}

std::vector<float> read_buffer(int dev, const float* p, std::size_t n) {
  std::vector<float> h(n);
  cudaSetDevice(dev);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(GroupSimulateEndGpu, EstimatesCollectivesWithoutRunningThem) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(two_ranks());
  const std::size_t count = std::size_t{1} << 22;
  std::vector<float*> send(2), recv(2);
  for (int r = 0; r < 2; ++r) {
    send[r] = make_buffer(c.devices[r], count, static_cast<float>(r + 1));
    recv[r] = make_buffer(c.devices[r], count, -1.0f);
  }
  const auto simulate = [&](std::size_t n) {
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(ncclAllReduce(send[r], recv[r], n, ncclFloat, ncclSum, c.comms[r], c.streams[r]),
                ncclSuccess);
    EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess) << ncclGetLastError(nullptr);
    return sim.estimatedTime;
  };
  const float small = simulate(1024);
  const float large = simulate(count);
  EXPECT_GT(small, 0);
  EXPECT_GT(large, small);
  c.sync();
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(read_buffer(c.devices[r], recv[r], count), std::vector<float>(count, -1.0f))
        << "rank " << r << ": a simulated group must not run";

  // Nothing stayed queued: the next group runs exactly its own call.
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(send[r], recv[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
  NCCL_OK(ncclGroupEnd());
  c.sync();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read_buffer(c.devices[r], recv[r], count), std::vector<float>(count, 3.0f));
    cudaSetDevice(c.devices[r]);
    cudaFree(send[r]);
    cudaFree(recv[r]);
  }
}

TEST(GroupSimulateEndGpu, EstimatesSendRecvWithoutRunningThem) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(two_ranks());
  const std::size_t count = std::size_t{1} << 20;
  std::vector<float*> send(2), recv(2);
  for (int r = 0; r < 2; ++r) {
    send[r] = make_buffer(c.devices[r], count, static_cast<float>(r + 1));
    recv[r] = make_buffer(c.devices[r], count, -1.0f);
  }
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) {
    NCCL_OK(ncclSend(send[r], count, ncclFloat, 1 - r, c.comms[r], c.streams[r]));
    NCCL_OK(ncclRecv(recv[r], count, ncclFloat, 1 - r, c.comms[r], c.streams[r]));
  }
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  EXPECT_GT(sim.estimatedTime, 0);
  c.sync();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read_buffer(c.devices[r], recv[r], count), std::vector<float>(count, -1.0f));
    cudaSetDevice(c.devices[r]);
    cudaFree(send[r]);
    cudaFree(recv[r]);
  }
}

}  // namespace
}  // namespace efccl::runtime::testing

#endif  // EFCCL_GROUP_SIMULATION_GPU
