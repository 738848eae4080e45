// Connections placed off the receiver (ef::ConnectionPlacement) on the GPU interpreter: slots
// in pinned host memory (the balancer's host path) or on a slot device (a relay GPU that runs
// no kernel for the connection). Results must be exactly the host executor's, whatever the
// placement: a lone pair split over direct + host + slot device, a forward through a third
// rank, every library algorithm with its connections placed in turn, every protocol, several
// datatypes, CUDA-graph replays, counters past LL's flag wrap, timeouts naming a placed
// connection. Ranks share GPU 0 (every slot device is GPU 0 then) and, where there are several
// GPUs, spread over them with slot devices on GPUs that run none of the connection's ranks
// where there are such.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_test_support.h"
#include "efccl/algorithms/algorithm_library.h"
#include "efccl/device/device_executor.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "placed_programs.h"

namespace efccl {
namespace {

using ef::DataType;
using ef::RedOp;
using namespace test_support;  // NOLINT(google-build-using-namespace): the suite's helpers

/// Small slots so that a few KB span many tiles (and many slot reuses).
constexpr std::size_t kSmallSlotBytes = 256;

/// Where a test puts the ranks and the slot devices.
struct Mapping {
  std::vector<int> rank_devices;
  std::vector<int> slot_devices;
};

/// All on GPU 0, or the ranks spread over the visible GPUs with slot devices on spare ones.
Mapping mapping_for(const ef::Program& p, bool spread) {
  Mapping m;
  m.rank_devices = map_ranks(p.nranks, spread);
  m.slot_devices =
      slot_devices_for(m.rank_devices, p.slot_devices, spread ? visible_gpus(nullptr) : 1);
  return m;
}

StatusOr<std::unique_ptr<device::DeviceExecutor>> placed_executor(
    const ef::Program& p, const Mapping& m, std::size_t slot_bytes = kSmallSlotBytes,
    uint64_t first_position = 0) {
  device::ExecutorConfig config;
  config.slot_bytes = slot_bytes;
  config.slot_devices = m.slot_devices;
  config.first_position = first_position;
  return device::DeviceExecutor::create(p, m.rank_devices, config);
}

/// Datatypes of several widths (send/receive programs move them; reductions are below).
constexpr DataType kMovedTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kInt8,
                                    DataType::kFloat64, DataType::kFp8E4M3, DataType::kUint64};

/// Runs `p` over every protocol and moved datatype, at counts of one tile to many, on small
/// and default slots; returns the first failure.
std::string check_moves(const ef::Program& base, bool spread) {
  uint64_t seed = 40;
  for (ef::Protocol protocol : kProtocols) {
    ef::Program p = base;
    p.protocol = protocol;
    const Mapping m = mapping_for(p, spread);
    for (std::size_t slot_bytes : {kSmallSlotBytes, std::size_t{0}}) {
      auto executor = placed_executor(p, m, slot_bytes);
      if (!executor) return protocol_name(protocol) + ": " + executor.status().message();
      Streams streams((*executor)->devices());
      const uint64_t g = ef::count_granularity(p);
      const std::vector<uint64_t> counts = slot_bytes == 0
                                               ? std::vector<uint64_t>{g * 300001}
                                               : std::vector<uint64_t>{g, 7 * g, 257 * g};
      for (DataType dtype : kMovedTypes) {
        for (uint64_t count : counts) {
          const std::string failure =
              run_and_compare(**executor, p, m.rank_devices, streams, count, dtype, RedOp::kSum,
                              false, false, ++seed, slot_bytes);
          if (!failure.empty())
            return p.name + " over " + protocol_name(protocol) + " slot_bytes " +
                   std::to_string(slot_bytes) + " " + describe(dtype, RedOp::kSum, false, count) +
                   ": " + failure;
        }
      }
    }
  }
  return {};
}

TEST(PlacedConnections, ProgramsAreValid) {
  for (const ef::Program& p :
       {lone_pair(ef::Protocol::kSimple), lone_pair(ef::Protocol::kSimple, true),
        forward_through_third_rank(ef::Protocol::kSimple)}) {
    for (const auto& d : ef::validate(p)) ADD_FAILURE() << p.name << ": " << d.to_string();
  }
}

TEST(PlacedConnections, LonePairSplitOverDirectHostAndSlotDeviceOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (bool both_ways : {false, true}) {
    const std::string failure = check_moves(lone_pair(ef::Protocol::kSimple, both_ways), false);
    ASSERT_TRUE(failure.empty()) << failure;
  }
}

TEST(PlacedConnections, LonePairSplitOverDirectHostAndSlotDeviceOverSeveralGpus) {
  SKIP_WITHOUT_GPU();
  if (visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  for (bool both_ways : {false, true}) {
    const std::string failure = check_moves(lone_pair(ef::Protocol::kSimple, both_ways), true);
    ASSERT_TRUE(failure.empty()) << failure;
  }
}

TEST(PlacedConnections, ForwardThroughAThirdRankOnOneGpu) {
  SKIP_WITHOUT_GPU();
  const std::string failure = check_moves(forward_through_third_rank(ef::Protocol::kSimple), false);
  ASSERT_TRUE(failure.empty()) << failure;
}

TEST(PlacedConnections, ForwardThroughAThirdRankOverSeveralGpus) {
  SKIP_WITHOUT_GPU();
  if (visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  const std::string failure = check_moves(forward_through_third_rank(ef::Protocol::kSimple), true);
  ASSERT_TRUE(failure.empty()) << failure;
}

// ---- Every library algorithm, connections placed in turn ----

/// Ranks for a library algorithm: 4 where it allows (2 nodes of 2 for hierarchical ones).
algorithms::AlgorithmParams library_params(const algorithms::AlgorithmInfo& info,
                                           ef::Protocol protocol) {
  algorithms::AlgorithmParams params;
  params.ranks = std::clamp(4, info.min_ranks, info.max_ranks);
  params.nodes = info.hierarchical && params.ranks % 2 == 0 ? 2 : 1;
  params.protocol = protocol;
  return params;
}

std::string check_library(bool spread) {
  constexpr MatrixEntry kEntries[] = {
      {DataType::kFloat32, RedOp::kSum}, {DataType::kBFloat16, RedOp::kMax},
      {DataType::kInt32, RedOp::kProd},  {DataType::kFp8E4M3, RedOp::kSum},
      {DataType::kFloat64, RedOp::kMin}, {DataType::kInt8, RedOp::kAvg},
  };
  uint64_t seed = 900;
  for (const auto& info : algorithms::list_algorithms()) {
    if (info.shared_launch) continue;  // no connections to place (mrc ops only)
    for (ef::Protocol protocol : kProtocols) {
      auto generated = algorithms::generate_algorithm(info.name, library_params(info, protocol));
      if (!generated) return info.name + ": " + generated.status().message();
      const ef::Program p = placed_round_robin(*generated, 2);
      if (p.placements.empty()) return info.name + ": no connection was placed";
      const Mapping m = mapping_for(p, spread);
      auto executor = placed_executor(p, m);
      if (!executor) return info.name + ": " + executor.status().message();
      Streams streams((*executor)->devices());
      const uint64_t g = ef::count_granularity(p);
      for (bool inplace : modes(p)) {
        for (const auto& e : kEntries) {
          for (uint64_t count : {g, 67 * g}) {
            const std::string failure =
                run_and_compare(**executor, p, m.rank_devices, streams, count, e.dtype, e.op,
                                inplace, false, ++seed, kSmallSlotBytes);
            if (!failure.empty())
              return info.name + " over " + protocol_name(protocol) + " " +
                     describe(e.dtype, e.op, inplace, count) + ": " + failure;
          }
        }
      }
    }
  }
  return {};
}

TEST(PlacedConnections, EveryLibraryAlgorithmWithConnectionsPlacedInTurnOnOneGpu) {
  SKIP_WITHOUT_GPU();
  const std::string failure = check_library(false);
  ASSERT_TRUE(failure.empty()) << failure;
}

TEST(PlacedConnections, EveryLibraryAlgorithmWithConnectionsPlacedInTurnOverSeveralGpus) {
  SKIP_WITHOUT_GPU();
  if (visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  const std::string failure = check_library(true);
  ASSERT_TRUE(failure.empty()) << failure;
}

// ---- Graphs and counters ----

TEST(PlacedConnections, CudaGraphReplaysComputeFreshResults) {
  SKIP_WITHOUT_GPU();
  for (bool spread : {false, true}) {
    if (spread && visible_gpus(nullptr) < 2) continue;
    for (ef::Protocol protocol : kProtocols) {
      for (const ef::Program& p :
           {lone_pair(protocol, true), forward_through_third_rank(protocol)}) {
        SCOPED_TRACE(p.name + " over " + protocol_name(protocol) + (spread ? " spread" : ""));
        const Mapping m = mapping_for(p, spread);
        auto executor = placed_executor(p, m);
        ASSERT_TRUE(executor.is_ok()) << executor.status().message();
        device::DeviceExecutor& ex = **executor;
        Streams streams(ex.devices());
        const uint64_t count = ef::count_granularity(p) * 1000;
        const DataType dtype = DataType::kFloat32;
        ASSERT_TRUE(ex.reserve(count, dtype).is_ok());
        CallBuffers bufs;
        make_buffers(p, m.rank_devices, count, dtype, false, false, 5, bufs);
        const auto args = run_args(p, bufs, count, dtype, RedOp::kSum, false, streams.get());
        ASSERT_TRUE(ex.run_and_wait(args).is_ok());  // warm-up: picks the CTA size

        std::vector<cudaGraph_t> graphs(ex.devices().size());
        std::vector<cudaGraphExec_t> execs(ex.devices().size());
        for (std::size_t i = 0; i < ex.devices().size(); ++i) {
          cudaSetDevice(ex.devices()[i]);
          ASSERT_CUDA(cudaStreamBeginCapture(streams.get()[i], cudaStreamCaptureModeThreadLocal));
        }
        const Status captured = ex.run(args);
        for (std::size_t i = 0; i < ex.devices().size(); ++i) {
          cudaSetDevice(ex.devices()[i]);
          ASSERT_CUDA(cudaStreamEndCapture(streams.get()[i], &graphs[i]));
        }
        for (std::size_t i = 0; i < ex.devices().size(); ++i) {
          cudaSetDevice(ex.devices()[i]);
          ASSERT_CUDA(cudaGraphInstantiate(&execs[i], graphs[i], 0));
        }
        ASSERT_TRUE(captured.is_ok()) << captured.message();
        // More replays than slots: a reused slot's flags must differ from its last use.
        for (int replay = 0; replay < 12; ++replay) {
          refill_inputs(p, dtype, 1000 + replay, bufs);
          for (std::size_t i = 0; i < ex.devices().size(); ++i) {
            cudaSetDevice(ex.devices()[i]);
            ASSERT_CUDA(cudaGraphLaunch(execs[i], streams.get()[i]));
          }
          const Status s = ex.wait(args);
          ASSERT_TRUE(s.is_ok()) << s.message();
          auto result = host::execute(p, host_options(args, kSmallSlotBytes), bufs.host);
          ASSERT_TRUE(result.status.is_ok()) << result.status.message();
          const std::string failure = compare(p, dtype, bufs);
          ASSERT_TRUE(failure.empty()) << "replay " << replay << ": " << failure;
        }
        for (std::size_t i = 0; i < ex.devices().size(); ++i) {
          cudaGraphExecDestroy(execs[i]);
          cudaGraphDestroy(graphs[i]);
        }
      }
    }
  }
}

TEST(PlacedConnections, CountersPastWhereLLClearsSlotsAndWrapsFlags) {
  // Counters of placed connections (tail and head with the slots, positions at the ends)
  // start just below 2^30 (LL zeroes slots), 2^31 (LL flags wrap) and 2^32.
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    for (uint64_t first :
         {(uint64_t{1} << 30) - 5, (uint64_t{1} << 31) - 5, (uint64_t{1} << 32) - 5}) {
      for (const ef::Program& p :
           {lone_pair(protocol, true), forward_through_third_rank(protocol)}) {
        SCOPED_TRACE(p.name + " over " + protocol_name(protocol) + " from " +
                     std::to_string(first));
        const Mapping m = mapping_for(p, false);
        auto executor = placed_executor(p, m, kSmallSlotBytes, first);
        ASSERT_TRUE(executor.is_ok()) << executor.status().message();
        Streams streams((*executor)->devices());
        const uint64_t g = ef::count_granularity(p);
        for (int call = 0; call < 6; ++call) {
          const std::string failure = run_and_compare(
              **executor, p, m.rank_devices, streams, g * (3 + 11 * call), DataType::kInt32,
              RedOp::kSum, false, false, 70 + call, kSmallSlotBytes);
          ASSERT_TRUE(failure.empty()) << "call " << call << ": " << failure;
        }
      }
    }
  }
}

// ---- Protocols, configuration, failures ----

TEST(PlacedConnections, LL128ConnectionsPlacedOffTheReceiverRunLL) {
  SKIP_WITHOUT_GPU();
  const ef::Program p = lone_pair(ef::Protocol::kLL128);
  auto executor = placed_executor(p, mapping_for(p, false));
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  const std::string& note = (*executor)->protocol_note();
  int major = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) {
    EXPECT_NE(note.find("3 of 3 connections run over LL"), std::string::npos) << note;
    return;
  }
  // On one Hopper GPU the direct connection runs LL128; host memory and the slot device LL.
  EXPECT_EQ(note,
            "LL128 program 'placed_pair': 2 of 3 connections run over LL (the first: connection "
            "0->1 ch 1: its slots are in pinned host memory (PCIe does not deliver a 128-byte "
            "store whole))");
}

TEST(PlacedConnections, SlotDevicesMustMatchTheProgram) {
  SKIP_WITHOUT_GPU();
  const ef::Program p = lone_pair(ef::Protocol::kSimple);
  device::ExecutorConfig config;
  auto none = device::DeviceExecutor::create(p, {0, 0}, config);
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().message(),
            "the program names 1 slot devices; ExecutorConfig::slot_devices gives 0 CUDA devices");
  config.slot_devices = {0, 0};
  auto two = device::DeviceExecutor::create(p, {0, 0}, config);
  ASSERT_FALSE(two.is_ok());
  EXPECT_EQ(two.status().message(),
            "the program names 1 slot devices; ExecutorConfig::slot_devices gives 2 CUDA devices");
  const int ngpus = visible_gpus(nullptr);
  config.slot_devices = {ngpus};
  auto unseen = device::DeviceExecutor::create(p, {0, 0}, config);
  ASSERT_FALSE(unseen.is_ok());
  EXPECT_EQ(unseen.status().message(),
            "slot device 0 is CUDA device " + std::to_string(ngpus) +
                ", which this process does not see (" + std::to_string(ngpus) +
                " visible); it holds the slots of connection 0->1 ch 2, which the receiver's "
                "process allocates (ExecutorConfig::slot_devices)");
}

TEST(PlacedConnections, SlotDeviceMemoryCountsAsConnectionMemory) {
  // On one GPU the slot device's arena lies on GPU 0 beside the ranks' arenas; host memory
  // is not device memory. Default Simple slots: an entry is tail and a counter (256 bytes) and
  // 8 slots of 512 KiB; a sender's end 256 bytes, a placed connection's receiver end 128.
  SKIP_WITHOUT_GPU();
  const std::size_t entry = 256 + 8 * (std::size_t{512} << 10);
  ef::Program direct = lone_pair(ef::Protocol::kSimple);
  direct.placements.clear();
  direct.slot_devices = 0;
  auto plain = device::DeviceExecutor::create(direct, {0, 0}, {});
  ASSERT_TRUE(plain.is_ok()) << plain.status().message();
  EXPECT_EQ((*plain)->connection_bytes(), 3 * entry + 3 * 256);
  const ef::Program p = lone_pair(ef::Protocol::kSimple);
  auto placed_ex = placed_executor(p, mapping_for(p, false), 0);
  ASSERT_TRUE(placed_ex.is_ok()) << placed_ex.status().message();
  // The direct connection's and the slot device's entries; the host entry is not counted.
  EXPECT_EQ((*placed_ex)->connection_bytes(), 2 * entry + 3 * 256 + 2 * 128);
}

/// Each rank receives before it sends, so neither ever receives: both connections placed off
/// the receivers (0->1 in host memory, 1->0 on slot device 0).
ef::Program blocked_placed_program() {
  ef::Program p;
  p.name = "placed_receive_first";
  p.collective = ef::Collective::kCustom;
  p.nranks = 2;
  p.nchunksperloop = 1;
  p.inplace = false;
  p.outofplace = true;
  p.slot_devices = 1;
  for (int r = 0; r < 2; ++r) {
    ef::Rank rank;
    rank.input_chunks = rank.output_chunks = 1;
    ef::Threadblock tb = threadblock(1 - r, 1 - r, 0);
    tb.ops = {transfer_op(ef::OpCode::kRecv, {}, output_chunk(0), 1),
              transfer_op(ef::OpCode::kSend, input_chunk(0), {}, 1)};
    rank.threadblocks.push_back(tb);
    p.ranks.push_back(rank);
    p.postconditions.push_back({r, 0, {ef::ChunkSource{1 - r, 0}}});
  }
  p.placements = {placed(0, 1, 0, ef::SlotLocation::kHost),
                  placed(1, 0, 0, ef::SlotLocation::kDevice, 0)};
  return p;
}

TEST(PlacedConnections, ATimeoutNamesThePlacedConnectionAndResetClearsIt) {
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    ef::Program p = blocked_placed_program();
    p.protocol = protocol;
    device::ExecutorConfig config;
    config.allow_blocking_programs = true;
    config.slot_devices = {0};
    auto executor = device::DeviceExecutor::create(p, {0, 0}, config);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    Streams streams((*executor)->devices());
    CallBuffers bufs;
    make_buffers(p, {0, 0}, 4096, DataType::kFloat32, false, false, 3, bufs);
    auto args = run_args(p, bufs, 4096, DataType::kFloat32, RedOp::kSum, false, streams.get());
    args.timeout = std::chrono::milliseconds(200);
    const auto start = std::chrono::steady_clock::now();
    const Status s = (*executor)->run_and_wait(args);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
    EXPECT_TRUE(s.message().find("data on connection 1->0 ch 0") != std::string::npos ||
                s.message().find("data on connection 0->1 ch 0") != std::string::npos)
        << s.message();
    EXPECT_LT(elapsed, std::chrono::seconds(2)) << s.message();
    ASSERT_TRUE((*executor)->reset().is_ok());
    EXPECT_TRUE((*executor)->error_status().is_ok());
    const Status again = (*executor)->run_and_wait(args);
    EXPECT_NE(again.message().find("timed out"), std::string::npos) << again.message();
  }
}

}  // namespace
}  // namespace efccl
