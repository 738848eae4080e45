// The GPU interpreter against the host reference executor: every example program, every MSCCL
// corpus file and every library algorithm, under each protocol (Simple, LL, LL128), ranks on
// one GPU and spread over all visible GPUs, a datatype/operator matrix, both call modes,
// counts from 0 to many tiles: outputs must be bitwise identical.
// Plus: unaligned user buffers, one-element tiles, repeated and back-to-back calls (also past
// LL's flag wrap), CUDA-graph replays (also two streams of one capture), timeout and abort,
// batches (fusion, a failed launch), sizes that overflow, the resident grid (posts instead of
// launches, slots reused, fallbacks to launches, abort, leaving when idle).
// The binary is registered twice (CMakeLists.txt): as is, and as `resident/...` with
// EFCCL_RESIDENT=1, where every eager call of every test runs on the resident grid when it fits.
#include "efccl/device/device_executor.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/device/resident.h"
#include "efccl/ef/load.h"
#include "efccl/ef/validate.h"
#include "device_test_support.h"
#include "efccl/host/executor.h"
#include "efccl/host/numeric.h"

namespace efccl {
namespace {

namespace fs = std::filesystem;
using ef::DataType;
using ef::RedOp;
using namespace test_support;  // NOLINT(google-build-using-namespace): the suite's helpers

// ---- EFCCL_RESIDENT=1: every test on the resident grid ----

/// Under EFCCL_RESIDENT=1 (the `resident/` registration) the whole binary runs with resident
/// execution on every visible GPU (EFCCL_RESIDENT_CTAS CTAs, default 16); the grids must leave
/// the GPUs at the end.
class ResidentFromEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* on = std::getenv("EFCCL_RESIDENT");
    if (on == nullptr || std::string(on) != "1" || visible_gpus(nullptr) == 0) return;
    device::ResidentConfig config;
    config.enabled = true;
    if (const char* ctas = std::getenv("EFCCL_RESIDENT_CTAS"); ctas != nullptr && *ctas != 0)
      config.ctas = static_cast<uint32_t>(std::strtoul(ctas, nullptr, 10));
    device::set_resident_config(config);
    for (int d = 0; d < visible_gpus(nullptr); ++d) {
      device::retain_resident(d);
      devices_.push_back(d);
    }
  }
  void TearDown() override {
    if (devices_.empty()) return;
    const device::ResidentStats stats = device::resident_stats();
    std::printf("[ resident ] %llu posts, %llu new contents, %llu refused for want of a slot, "
                "%llu grid launches\n",
                static_cast<unsigned long long>(stats.posts),
                static_cast<unsigned long long>(stats.new_contents),
                static_cast<unsigned long long>(stats.no_slot),
                static_cast<unsigned long long>(stats.grid_launches));
    for (int d : devices_) {
      const Status s = device::release_resident(d);
      EXPECT_TRUE(s.is_ok()) << s.message();
      EXPECT_FALSE(device::resident_running(d));
    }
  }

 private:
  std::vector<int> devices_;
};
[[maybe_unused]] ::testing::Environment* const kResidentEnvironment =
    ::testing::AddGlobalTestEnvironment(new ResidentFromEnvironment);

// ---- Programs ----

/// Compiled-in paths, overridable at run time (the suite may run from a copy of the tree).
std::string source_dir() {
  const char* env = std::getenv("EFCCL_SOURCE_DIR");
  return env != nullptr && *env != 0 ? env : EFCCL_SOURCE_DIR;
}
std::string corpus_dir() {
  const char* env = std::getenv("EFCCL_MSCCL_XML_DIR");
  return env != nullptr && *env != 0 ? env : EFCCL_MSCCL_XML_DIR;
}

std::vector<std::string> program_files() {
  std::vector<std::string> files;
  std::error_code ec;
  for (const std::string& dir : {source_dir() + "/examples/ef", corpus_dir()}) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const auto ext = entry.path().extension();
      if (ext == ".json" || ext == ".xml") files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// Loads and validates once per process (corpus files are large).
const ef::Program& program_at(const std::string& path) {
  static std::map<std::string, std::unique_ptr<ef::Program>> cache;
  auto& slot = cache[path];
  if (!slot) {
    auto loaded = ef::load_program_file(path);
    for (const auto& d : loaded.diagnostics) ADD_FAILURE() << d.to_string();
    slot = std::make_unique<ef::Program>(loaded.program ? *loaded.program : ef::Program{});
    for (const auto& d : ef::validate(*slot)) ADD_FAILURE() << d.to_string();
  }
  return *slot;
}

/// The program at `path` carried over `protocol` (results never depend on it, §5).
const ef::Program& program_as(const std::string& path, ef::Protocol protocol) {
  static std::map<std::pair<std::string, ef::Protocol>, std::unique_ptr<ef::Program>> cache;
  auto& slot = cache[{path, protocol}];
  if (!slot) {
    slot = std::make_unique<ef::Program>(program_at(path));
    slot->protocol = protocol;
  }
  return *slot;
}

constexpr MatrixEntry kMatrix[] = {
    {DataType::kFloat32, RedOp::kSum},   {DataType::kBFloat16, RedOp::kMax},
    {DataType::kInt32, RedOp::kProd},    {DataType::kFloat16, RedOp::kAvg},
    {DataType::kFp8E4M3, RedOp::kSum},   {DataType::kFloat64, RedOp::kMin},
    {DataType::kInt8, RedOp::kSum},      {DataType::kUint64, RedOp::kMax},
    {DataType::kFp8E5M2, RedOp::kProd},  {DataType::kFloat32, RedOp::kPreMulSum},
    {DataType::kInt32, RedOp::kAvg},
};

/// Small slots so that counts of a few hundred elements per chunk take several tiles.
constexpr std::size_t kSmallSlotBytes = 256;

/// An executor for `p` on `devices` with small slots, so that a few KB span many tiles.
StatusOr<std::unique_ptr<device::DeviceExecutor>> small_slot_executor(
    const ef::Program& p, const std::vector<int>& devices, std::size_t slot_bytes = kSmallSlotBytes) {
  device::ExecutorConfig config;
  config.slot_bytes = slot_bytes;
  return device::DeviceExecutor::create(p, devices, config);
}

// ---- The matrix, per program and rank mapping ----

struct Case {
  std::string path;
  bool spread;  ///< ranks over all GPUs (else all on GPU 0)
  ef::Protocol protocol;  ///< replaces the file's own
};

/// Readable parameter in test output (gtest would print the struct's bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << fs::path(c.path).filename().string() << (c.spread ? " over all GPUs" : " on GPU 0")
      << " over " << protocol_name(c.protocol);
}

class ProgramOnGpus : public ::testing::TestWithParam<Case> {};

TEST_P(ProgramOnGpus, MatchesHostExecutorBitwise) {
  SKIP_WITHOUT_GPU();
  if (GetParam().spread && visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  const ef::Program& p = program_as(GetParam().path, GetParam().protocol);
  ASSERT_GT(p.nranks, 0);
  const auto devices = map_ranks(p.nranks, GetParam().spread);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  Streams streams((*executor)->devices());

  const uint64_t g = ef::count_granularity(p);
  uint64_t seed = 1;
  for (bool inplace : modes(p)) {
    for (const auto& m : kMatrix) {
      for (uint64_t count : {uint64_t{0}, g, 3 * g, 257 * g}) {
        const std::string failure = run_and_compare(**executor, p, devices, streams, count,
                                                    m.dtype, m.op, inplace, false, ++seed,
                                                    kSmallSlotBytes);
        ASSERT_TRUE(failure.empty()) << describe(m.dtype, m.op, inplace, count) << ": " << failure;
      }
    }
  }
}

TEST_P(ProgramOnGpus, UnalignedUserBuffers) {
  SKIP_WITHOUT_GPU();
  if (GetParam().spread && visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs 2 or more GPUs";
  const ef::Program& p = program_as(GetParam().path, GetParam().protocol);
  const auto devices = map_ranks(p.nranks, GetParam().spread);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  Streams streams((*executor)->devices());
  const uint64_t count = 257 * ef::count_granularity(p);
  for (bool inplace : modes(p)) {
    for (const auto& m : {MatrixEntry{DataType::kFloat32, RedOp::kSum},
                          MatrixEntry{DataType::kFloat16, RedOp::kMin},
                          MatrixEntry{DataType::kInt8, RedOp::kProd}}) {
      const std::string failure = run_and_compare(**executor, p, devices, streams, count,
                                                  m.dtype, m.op, inplace, true, 7,
                                                  kSmallSlotBytes);
      ASSERT_TRUE(failure.empty()) << "misaligned " << describe(m.dtype, m.op, inplace, count)
                                   << ": " << failure;
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& f : program_files())
    for (bool spread : {false, true})
      for (ef::Protocol protocol : kProtocols) cases.push_back({f, spread, protocol});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Programs, ProgramOnGpus, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) {
                           std::string name = fs::path(info.param.path).stem().string() +
                                              (info.param.spread ? "_spread_" : "_gpu0_") +
                                              protocol_name(info.param.protocol);
                           for (char& c : name)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// ---- Every library algorithm, every datatype and operator, tiny tiles ----

std::string example(const char* name) { return source_dir() + "/examples/ef/" + name; }

/// Ranks for a library algorithm: 4 where it allows (2 nodes of 2 for hierarchical ones).
algorithms::AlgorithmParams library_params(const algorithms::AlgorithmInfo& info,
                                           ef::Protocol protocol) {
  algorithms::AlgorithmParams params;
  params.ranks = std::clamp(4, info.min_ranks, info.max_ranks);
  params.nodes = info.hierarchical && params.ranks % 2 == 0 ? 2 : 1;
  params.protocol = protocol;
  return params;
}

TEST(DeviceExecutor, EveryLibraryAlgorithmUnderEveryProtocol) {
  SKIP_WITHOUT_GPU();
  // Ops whose scaling every program supports (premulsum and float avg are covered by the
  // example programs above).
  constexpr MatrixEntry kEntries[] = {
      {DataType::kFloat32, RedOp::kSum}, {DataType::kBFloat16, RedOp::kMax},
      {DataType::kInt32, RedOp::kProd},  {DataType::kFp8E4M3, RedOp::kSum},
      {DataType::kFloat64, RedOp::kMin}, {DataType::kInt8, RedOp::kAvg},
  };
  const auto infos = algorithms::list_algorithms();
  ASSERT_FALSE(infos.empty());
  for (const auto& info : infos) {
    for (ef::Protocol protocol : kProtocols) {
      auto generated = algorithms::generate_algorithm(info.name, library_params(info, protocol));
      ASSERT_TRUE(generated.is_ok()) << info.name << ": " << generated.status().message();
      const ef::Program& p = *generated;
      // Programs of mrc ops run only on ranks that share one launch: all on GPU 0.
      const auto devices = map_ranks(p.nranks, !info.shared_launch);
      auto executor = small_slot_executor(p, devices);
      ASSERT_TRUE(executor.is_ok()) << info.name << ": " << executor.status().message();
      Streams streams((*executor)->devices());
      const uint64_t g = ef::count_granularity(p);
      uint64_t seed = 500;
      for (bool inplace : modes(p)) {
        for (const auto& m : kEntries) {
          for (uint64_t count : {g, 67 * g}) {
            const std::string failure =
                run_and_compare(**executor, p, devices, streams, count, m.dtype, m.op, inplace,
                                false, ++seed, kSmallSlotBytes);
            ASSERT_TRUE(failure.empty())
                << info.name << " over " << protocol_name(protocol) << " "
                << describe(m.dtype, m.op, inplace, count) << ": " << failure;
          }
        }
      }
    }
  }
}

TEST(DeviceExecutor, TwoRankAllPairsAllReduce) {
  // allpairs_allreduce has its own 2-rank form (one send + recv-reduce-copy per lane, valid in
  // place), which the 4-rank library sweep above does not reach: every protocol, one lane and
  // four (2 channels x 2 instances), both ranks on one GPU and spread, every scaled op too.
  SKIP_WITHOUT_GPU();
  constexpr MatrixEntry kEntries[] = {
      {DataType::kFloat32, RedOp::kSum},   {DataType::kBFloat16, RedOp::kMax},
      {DataType::kInt32, RedOp::kProd},    {DataType::kFp8E4M3, RedOp::kSum},
      {DataType::kFloat64, RedOp::kMin},   {DataType::kInt8, RedOp::kAvg},
      {DataType::kFloat32, RedOp::kAvg},   {DataType::kFloat16, RedOp::kPreMulSum},
  };
  uint64_t seed = 1700;
  for (ef::Protocol protocol : kProtocols) {
    for (int lanes : {1, 2}) {
      algorithms::AlgorithmParams params;
      params.ranks = 2;
      params.channels = lanes;
      params.instances = lanes;
      params.protocol = protocol;
      auto generated = algorithms::generate_algorithm("allpairs_allreduce", params);
      ASSERT_TRUE(generated.is_ok()) << generated.status().message();
      const ef::Program& p = *generated;
      ASSERT_TRUE(p.inplace && p.outofplace);
      for (bool spread : {false, true}) {
        const auto devices = map_ranks(p.nranks, spread);
        auto executor = small_slot_executor(p, devices);
        ASSERT_TRUE(executor.is_ok()) << executor.status().message();
        Streams streams((*executor)->devices());
        const uint64_t g = ef::count_granularity(p);
        for (bool inplace : {false, true}) {
          for (const auto& m : kEntries) {
            for (uint64_t count : {g, 67 * g}) {
              const std::string failure =
                  run_and_compare(**executor, p, devices, streams, count, m.dtype, m.op, inplace,
                                  false, ++seed, kSmallSlotBytes);
              ASSERT_TRUE(failure.empty())
                  << protocol_name(protocol) << " lanes " << lanes * lanes
                  << (spread ? " spread " : " one GPU ") << describe(m.dtype, m.op, inplace, count)
                  << ": " << failure;
            }
          }
        }
      }
    }
  }
}

TEST(DeviceExecutor, RanksSharingAGpuMoveDataDirectlyWithTheSameResults) {
  // Ranks on one GPU share a launch, so their connections may skip the slots (docs/
  // device-executor.md, "Direct transfers"): the 2- and 4-rank Simple rings use them (ring
  // allreduce in place too), and every call gives the host executor's result with them
  // (RunArgs::direct) and without. Spread over the visible GPUs, ranks that still share one
  // (4 ranks on 2 GPUs) are direct among themselves and use slots across GPUs; with a GPU per
  // rank nothing is direct.
  SKIP_WITHOUT_GPU();
  const int gpus = visible_gpus(nullptr);
  uint64_t seed = 2900;
  for (const char* algorithm : {"ring_allreduce", "ring_allgather", "ring_reducescatter"}) {
    for (int nranks : {2, 4}) {
      algorithms::AlgorithmParams params;
      params.ranks = nranks;
      params.channels = 2;
      params.protocol = ef::Protocol::kSimple;
      auto generated = algorithms::generate_algorithm(algorithm, params);
      ASSERT_TRUE(generated.is_ok()) << algorithm << ": " << generated.status().message();
      const ef::Program& p = *generated;
      for (bool spread : {false, true}) {
        if (spread && gpus < 2) continue;
        const auto devices = map_ranks(p.nranks, spread);
        auto executor = small_slot_executor(p, devices);
        ASSERT_TRUE(executor.is_ok()) << executor.status().message();
        const std::string placement =
            std::string(algorithm) + " " + std::to_string(nranks) + " ranks" +
            (spread ? " over " + std::to_string(gpus) + " GPUs" : " on one GPU");
        if (!spread) {
          EXPECT_GT((*executor)->direct_ops(false), 0u) << placement;
          if (std::string(algorithm) == "ring_allreduce") {  // in place too (ordered alias)
            EXPECT_GT((*executor)->direct_ops(true), 0u) << placement;
          }
        } else if (nranks <= gpus) {
          EXPECT_EQ((*executor)->direct_ops(false), 0u) << placement << ": a GPU per rank";
        }
        Streams streams((*executor)->devices());
        const uint64_t g = ef::count_granularity(p);
        for (bool inplace : {false, true}) {
          if (inplace ? !p.inplace : !p.outofplace) continue;
          for (bool direct : {true, false}) {
            for (uint64_t count : {g, 67 * g, 1031 * g}) {
              CallBuffers bufs;
              make_buffers(p, devices, count, DataType::kFloat32, inplace, false, ++seed, bufs);
              auto args = run_args(p, bufs, count, DataType::kFloat32, RedOp::kSum, inplace,
                                   streams.get());
              args.direct = direct;
              const std::string where =
                  placement + " " + describe(DataType::kFloat32, RedOp::kSum, inplace, count) +
                  (direct ? " direct" : " slots");
              const Status run = (*executor)->run_and_wait(args);
              ASSERT_TRUE(run.is_ok()) << where << ": " << run.message();
              auto host = host::execute(p, host_options(args, kSmallSlotBytes), bufs.host);
              ASSERT_TRUE(host.status.is_ok()) << where << ": " << host.status.message();
              const std::string failure = compare(p, DataType::kFloat32, bufs);
              ASSERT_TRUE(failure.empty()) << where << ": " << failure;
            }
          }
        }
      }
    }
  }
}

TEST(DeviceExecutor, EveryDatatypeAndOperatorOverFlaggedProtocols) {
  // The matrix above pairs datatypes and operators; here every pair runs over LL and LL128,
  // with odd counts (tiles that end inside a 120-byte group) and unaligned buffers.
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kFlaggedProtocols) {
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, true);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    Streams streams((*executor)->devices());
    const uint64_t g = ef::count_granularity(p);
    uint64_t seed = 900;
    for (int t = 0; t < ef::kNumDataTypes; ++t) {
      const auto dtype = static_cast<DataType>(t);
      for (RedOp op :
           {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax, RedOp::kAvg, RedOp::kPreMulSum}) {
        for (bool inplace : {false, true}) {
          for (bool misalign : {false, true}) {
            const uint64_t count = (misalign ? 29 : 101) * g;
            const std::string failure =
                run_and_compare(**executor, p, devices, streams, count, dtype, op, inplace,
                                misalign, ++seed, kSmallSlotBytes);
            ASSERT_TRUE(failure.empty())
                << protocol_name(protocol) << (misalign ? " misaligned " : " ")
                << describe(dtype, op, inplace, count) << ": " << failure;
          }
        }
      }
    }
  }
}

TEST(DeviceExecutor, OneElementTiles) {
  // slot_bytes 1: every tile is one element, far less than a line of either flagged format.
  SKIP_WITHOUT_GPU();
  for (const std::string& path :
       {example("ring_allreduce_4r_2ch.json"), example("allpairs_allreduce_3r.json")}) {
    for (ef::Protocol protocol : kProtocols) {
      const ef::Program& p = program_as(path, protocol);
      const auto devices = map_ranks(p.nranks, true);
      auto executor = small_slot_executor(p, devices, 1);
      ASSERT_TRUE(executor.is_ok()) << executor.status().message();
      Streams streams((*executor)->devices());
      for (const auto& m : {MatrixEntry{DataType::kFloat64, RedOp::kSum},
                            MatrixEntry{DataType::kFp8E5M2, RedOp::kMax},
                            MatrixEntry{DataType::kFloat16, RedOp::kPreMulSum}}) {
        const uint64_t count = 5 * ef::count_granularity(p);
        const std::string failure = run_and_compare(**executor, p, devices, streams, count, m.dtype,
                                                    m.op, false, true, 31, 1);
        ASSERT_TRUE(failure.empty()) << path << " over " << protocol_name(protocol) << " "
                                     << describe(m.dtype, m.op, false, count) << ": " << failure;
      }
    }
  }
}

TEST(DeviceExecutor, LL128ConnectionsBetweenHopperNVLinkPeers) {
  // LL128 programs run LL128 lines where both ends are compute capability 9.0+ and the same
  // GPU or NVLink peers; elsewhere the executor says which connections fall back to LL.
  SKIP_WITHOUT_GPU();
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL128);
  for (bool spread : {false, true}) {
    const auto devices = map_ranks(p.nranks, spread);
    auto executor = device::DeviceExecutor::create(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    EXPECT_EQ((*executor)->slot_bytes(), device::default_slot_bytes(ef::Protocol::kLL128));
    bool expect_ll128 = true;
    for (int d : (*executor)->devices()) {
      int major = 0;
      ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
      expect_ll128 = expect_ll128 && major >= 9;
    }
    const auto& used = (*executor)->devices();
    for (std::size_t a = 0; a + 1 < used.size(); ++a) {
      int atomics = 0;
      ASSERT_CUDA(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, used[a],
                                            used[a + 1]));
      expect_ll128 = expect_ll128 && atomics != 0;
    }
    const std::string& note = (*executor)->protocol_note();
    std::printf("[          ] LL128 %s: %s\n", spread ? "over all GPUs" : "on GPU 0",
                note.empty() ? "every connection runs LL128" : note.c_str());
    EXPECT_EQ(note.empty(), expect_ll128) << note;
  }
  auto ll = device::DeviceExecutor::create(
      program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL), map_ranks(4, true));
  ASSERT_TRUE(ll.is_ok()) << ll.status().message();
  EXPECT_TRUE((*ll)->protocol_note().empty()) << (*ll)->protocol_note();
  EXPECT_EQ((*ll)->slot_bytes(), device::default_slot_bytes(ef::Protocol::kLL));
}

// ---- One executor, many calls ----

TEST(DeviceExecutor, LargeTilesWithDefaultSlots) {
  // Chunks of ~1.2 MB (float) through each protocol's default slots: full tiles (16-byte
  // vectors for Simple, whole groups for LL and LL128) and a partial last one.
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, true);
    auto executor = device::DeviceExecutor::create(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    Streams streams((*executor)->devices());
    const uint64_t count = ef::count_granularity(p) * 307229;
    for (const auto& m : {MatrixEntry{DataType::kFloat32, RedOp::kSum},
                          MatrixEntry{DataType::kBFloat16, RedOp::kPreMulSum},
                          MatrixEntry{DataType::kUint8, RedOp::kMax}}) {
      for (bool inplace : {false, true}) {
        const std::string failure =
            run_and_compare(**executor, p, devices, streams, count, m.dtype, m.op, inplace, false,
                            11, (*executor)->slot_bytes());
        ASSERT_TRUE(failure.empty()) << protocol_name(protocol) << " "
                                     << describe(m.dtype, m.op, inplace, count) << ": " << failure;
      }
    }
  }
}

TEST(DeviceExecutor, UnitsOfEveryLengthUpToTwoUnrolledPasses) {
  // A Simple unit moves 16-byte packs, kUnroll per thread at a time (reduce_copy.cuh), then the
  // packs left for each thread (fewer than kUnroll) in one predicated batch, then single
  // elements. Default slots, so a chunk is one unit: chunk lengths from one pack per thread to
  // just past two unrolled passes (256 threads x 8 packs), with and without an element tail,
  // for ring ops (copy, reduce, send/recv through slots and direct) and for mrc ops (4 ranks on
  // GPU 0); every datatype width, and premulsum for the scaling path.
  SKIP_WITHOUT_GPU();
  std::vector<std::unique_ptr<ef::Program>> programs;
  for (const char* name : {"ring_allreduce", "shared_gpu_allreduce", "shared_gpu_reducescatter"}) {
    algorithms::AlgorithmParams params;
    params.ranks = 4;
    params.protocol = ef::Protocol::kSimple;
    auto generated = algorithms::generate_algorithm(name, params);
    ASSERT_TRUE(generated.is_ok()) << name << ": " << generated.status().message();
    programs.push_back(std::make_unique<ef::Program>(std::move(*generated)));
  }
  uint64_t seed = 7100;
  for (const auto& program : programs) {
    const ef::Program& p = *program;
    const auto devices = map_ranks(p.nranks, false);
    auto executor = device::DeviceExecutor::create(p, devices);
    ASSERT_TRUE(executor.is_ok()) << p.name << ": " << executor.status().message();
    Streams streams((*executor)->devices());
    const uint64_t g = ef::count_granularity(p);
    for (const auto& m : {MatrixEntry{DataType::kFloat32, RedOp::kSum},
                          MatrixEntry{DataType::kFloat64, RedOp::kMax},
                          MatrixEntry{DataType::kBFloat16, RedOp::kPreMulSum},
                          MatrixEntry{DataType::kInt8, RedOp::kSum}}) {
      const uint64_t pack = 16 / ef::size_of(m.dtype);
      for (uint64_t packs : {uint64_t{1}, uint64_t{255}, uint64_t{257}, uint64_t{1000},
                             uint64_t{1792}, uint64_t{1793}, uint64_t{2047}, uint64_t{2049},
                             uint64_t{3900}, uint64_t{4095}}) {
        for (uint64_t extra : {uint64_t{0}, pack - 1}) {
          const uint64_t count = g * (packs * pack + extra);
          for (bool inplace : modes(p)) {
            const std::string failure =
                run_and_compare(**executor, p, devices, streams, count, m.dtype, m.op, inplace,
                                false, ++seed, (*executor)->slot_bytes());
            ASSERT_TRUE(failure.empty()) << p.name << " " << describe(m.dtype, m.op, inplace, count)
                                         << ": " << failure;
          }
        }
      }
    }
  }
}

TEST(DeviceExecutor, RepeatedCallsReuseEpochsAndFifoPositions) {
  SKIP_WITHOUT_GPU();
  // The MSCCL file runs where the corpus is configured (docs: README, "The MSCCL corpus").
  std::vector<std::string> paths = {example("ring_allreduce_4r_2ch.json"),
                                    example("allpairs_allreduce_3r.json")};
  const std::string corpus_file = corpus_dir() + "/all-reduce-ring-simple.xml";
  const bool have_corpus = fs::exists(corpus_file);
  if (have_corpus) paths.push_back(corpus_file);
  for (const std::string& path : paths) {
    for (ef::Protocol protocol : kProtocols) {
      const ef::Program& p = program_as(path, protocol);
      const auto devices = map_ranks(p.nranks, true);
      auto executor = small_slot_executor(p, devices);
      ASSERT_TRUE(executor.is_ok()) << executor.status().message();
      Streams streams((*executor)->devices());
      const uint64_t g = ef::count_granularity(p);
      for (int call = 0; call < 10; ++call) {
        // Varying counts change the tile count, so FIFO positions end at different places.
        const uint64_t count = g * (1 + 37 * static_cast<uint64_t>(call));
        const std::string failure =
            run_and_compare(**executor, p, devices, streams, count, DataType::kFloat32, RedOp::kSum,
                            call % 2 == 1, false, 100 + call, kSmallSlotBytes);
        ASSERT_TRUE(failure.empty())
            << path << " over " << protocol_name(protocol) << " call " << call << ": " << failure;
      }
    }
  }
  if (!have_corpus)
    GTEST_SKIP() << "the example programs passed; " << corpus_file
                 << " was not run: no MSCCL corpus (EFCCL_MSCCL_XML_DIR or "
                    "-DEFCCL_MSCCL_XML_DIR=DIR)";
}

TEST(DeviceExecutor, BackToBackCallsReuseSlotsAndFlags) {
  // Many in-place calls queued without waiting: every call's data differs from the previous
  // one's, so a line left in a slot by an earlier use would show. Counters also start just
  // below where LL slots are zeroed (2^30) and where LL flags wrap (2^31), and past 2^32.
  SKIP_WITHOUT_GPU();
  const DataType dtype = DataType::kInt32;
  for (const std::string& path :
       {example("ring_allreduce_4r_2ch.json"), example("allpairs_allreduce_3r.json")}) {
    for (ef::Protocol protocol : kProtocols) {
      for (uint64_t first : {uint64_t{0}, (uint64_t{1} << 30) - 37, (uint64_t{1} << 31) - 37,
                             (uint64_t{1} << 32) - 37}) {
        const ef::Program& p = program_as(path, protocol);
        const auto devices = map_ranks(p.nranks, true);
        device::ExecutorConfig config;
        config.slot_bytes = kSmallSlotBytes;
        config.first_position = first;
        auto executor = device::DeviceExecutor::create(p, devices, config);
        ASSERT_TRUE(executor.is_ok()) << executor.status().message();
        device::DeviceExecutor& ex = **executor;
        Streams streams(ex.devices());
        const uint64_t g = ef::count_granularity(p);
        const uint64_t largest = g * 300;
        CallBuffers bufs;
        make_buffers(p, devices, largest, dtype, /*inplace=*/true, false, first + 3, bufs);
        for (int call = 0; call < 40; ++call) {
          const uint64_t count = g * (1 + (37 * static_cast<uint64_t>(call)) % 300);
          // An in-place call of `count` works on the front of the largest call's region.
          const Status s =
              ex.run(run_args(p, bufs, count, dtype, RedOp::kSum, true, streams.get()));
          ASSERT_TRUE(s.is_ok()) << s.message();
        }
        const Status waited =
            ex.wait(run_args(p, bufs, largest, dtype, RedOp::kSum, true, streams.get()));
        ASSERT_TRUE(waited.is_ok()) << waited.message();
        for (int call = 0; call < 40; ++call) {
          const uint64_t count = g * (1 + (37 * static_cast<uint64_t>(call)) % 300);
          const auto args = run_args(p, bufs, count, dtype, RedOp::kSum, true, streams.get());
          // The host executor takes exactly the call's region: allreduce's first `count`.
          const std::size_t bytes = count * ef::size_of(dtype);
          std::vector<host::RankBuffers> front(p.nranks);
          for (int r = 0; r < p.nranks; ++r)
            front[r].output.assign(bufs.host[r].output.begin(),
                                   bufs.host[r].output.begin() + bytes);
          auto result = host::execute(p, host_options(args, kSmallSlotBytes), front);
          ASSERT_TRUE(result.status.is_ok()) << result.status.message();
          for (int r = 0; r < p.nranks; ++r)
            std::copy(front[r].output.begin(), front[r].output.end(), bufs.host[r].output.begin());
        }
        const std::string failure = compare(p, dtype, bufs);
        ASSERT_TRUE(failure.empty()) << path << " over " << protocol_name(protocol)
                                     << ", counters from " << first << ": " << failure;
      }
    }
  }
}

TEST(DeviceExecutor, CudaGraphReplaysComputeFreshResults) {
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, true);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    Streams streams(ex.devices());
    const uint64_t count = ef::count_granularity(p) * 1000;
    const DataType dtype = DataType::kFloat32;
    ASSERT_TRUE(ex.reserve(count, dtype).is_ok());

    CallBuffers bufs;
    make_buffers(p, devices, count, dtype, /*inplace=*/false, false, 5, bufs);
    const auto args = run_args(p, bufs, count, dtype, RedOp::kSum, false, streams.get());
    ASSERT_TRUE(ex.run_and_wait(args).is_ok());  // warm-up: picks the CTA size outside capture

    // One graph per device stream (each device's launch is independent).
    std::vector<cudaGraph_t> graphs(ex.devices().size());
    std::vector<cudaGraphExec_t> execs(ex.devices().size());
    for (std::size_t i = 0; i < ex.devices().size(); ++i) {
      cudaSetDevice(ex.devices()[i]);
      ASSERT_CUDA(cudaStreamBeginCapture(streams.get()[i], cudaStreamCaptureModeThreadLocal));
    }
    const Status captured = ex.run(args);
    // End every capture before instantiating: instantiation is refused while any stream of
    // the thread is still capturing.
    for (std::size_t i = 0; i < ex.devices().size(); ++i) {
      cudaSetDevice(ex.devices()[i]);
      ASSERT_CUDA(cudaStreamEndCapture(streams.get()[i], &graphs[i]));
    }
    for (std::size_t i = 0; i < ex.devices().size(); ++i) {
      cudaSetDevice(ex.devices()[i]);
      ASSERT_CUDA(cudaGraphInstantiate(&execs[i], graphs[i], 0));
    }
    ASSERT_TRUE(captured.is_ok()) << captured.message();

    // More replays than slots, so that flags of reused slots must differ from their last use.
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
      ASSERT_TRUE(failure.empty())
          << protocol_name(protocol) << " replay " << replay << ": " << failure;
    }
    for (std::size_t i = 0; i < ex.devices().size(); ++i) {
      cudaGraphExecDestroy(execs[i]);
      cudaGraphDestroy(graphs[i]);
    }
  }
}

TEST(DeviceExecutor, CallsOnDifferentStreamsAreSerialised) {
  // Two launches of one executor share FIFOs, flags and the epoch: alternating streams must
  // not let them overlap (the executor orders them with an event).
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, true);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    Streams first(ex.devices()), second(ex.devices());
    const uint64_t count = ef::count_granularity(p) * 5000;
    const DataType dtype = DataType::kFloat32;
    CallBuffers bufs;
    make_buffers(p, devices, count, dtype, /*inplace=*/false, false, 11, bufs);
    const auto a = run_args(p, bufs, count, dtype, RedOp::kSum, false, first.get());
    const auto b = run_args(p, bufs, count, dtype, RedOp::kSum, false, second.get());
    for (int call = 0; call < 20; ++call) {
      const Status s = ex.run(call % 2 == 0 ? a : b);
      ASSERT_TRUE(s.is_ok()) << s.message();
    }
    ASSERT_TRUE(ex.wait(a).is_ok());
    const Status s = ex.wait(b);
    ASSERT_TRUE(s.is_ok()) << s.message();
    auto result = host::execute(p, host_options(a, kSmallSlotBytes), bufs.host);
    ASSERT_TRUE(result.status.is_ok()) << result.status.message();
    const std::string failure = compare(p, dtype, bufs);
    EXPECT_TRUE(failure.empty()) << protocol_name(protocol) << ": " << failure;
  }
}

/// True when graph node `node` depends, directly or through other nodes, on `target`.
bool depends_on(cudaGraphNode_t node, cudaGraphNode_t target) {
  std::vector<cudaGraphNode_t> todo{node};
  std::set<cudaGraphNode_t> seen;
  while (!todo.empty()) {
    const cudaGraphNode_t n = todo.back();
    todo.pop_back();
    std::size_t count = 0;
    if (cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count) != cudaSuccess) return false;
    std::vector<cudaGraphNode_t> deps(count);
    if (count > 0 && cudaGraphNodeGetDependencies(n, deps.data(), nullptr, &count) != cudaSuccess)
      return false;
    for (cudaGraphNode_t d : deps) {
      if (d == target) return true;
      if (seen.insert(d).second) todo.push_back(d);
    }
  }
  return false;
}

TEST(DeviceExecutor, CapturedCallsOnTwoStreamsOfOneCaptureAreOrdered) {
  // A user overlapping two calls of one communicator in one graph: the second call is captured
  // on a stream forked from the first. Both launches share the executor's FIFOs, flags and
  // launch counts, so the graph must order them (an event the executor records after the
  // first and waits for before the second): one kernel node depends on the other. Replays
  // compute both calls' results.
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, false);  // one GPU: one kernel node per call
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    ASSERT_EQ(ex.devices().size(), 1u);
    Streams first(ex.devices()), second(ex.devices());
    const uint64_t count = ef::count_granularity(p) * 700;
    const DataType dtype = DataType::kFloat32;
    CallBuffers bufs_a, bufs_b;
    make_buffers(p, devices, count, dtype, false, false, 21, bufs_a);
    make_buffers(p, devices, count, dtype, false, false, 22, bufs_b);
    const auto a = run_args(p, bufs_a, count, dtype, RedOp::kSum, false, first.get());
    const auto b = run_args(p, bufs_b, count, dtype, RedOp::kSum, false, second.get());
    ASSERT_TRUE(ex.run_and_wait(a).is_ok());  // warm-up: picks the CTA size outside capture

    cudaSetDevice(ex.devices()[0]);
    cudaStream_t s1 = first.get()[0], s2 = second.get()[0];
    cudaEvent_t fork = nullptr, join = nullptr;
    ASSERT_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    ASSERT_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    cudaGraph_t graph = nullptr;
    ASSERT_CUDA(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
    ASSERT_CUDA(cudaEventRecord(fork, s1));
    ASSERT_CUDA(cudaStreamWaitEvent(s2, fork, 0));
    const Status ran_a = ex.run(a);
    const Status ran_b = ex.run(b);
    ASSERT_CUDA(cudaEventRecord(join, s2));
    ASSERT_CUDA(cudaStreamWaitEvent(s1, join, 0));
    ASSERT_CUDA(cudaStreamEndCapture(s1, &graph));
    ASSERT_TRUE(ran_a.is_ok()) << ran_a.message();
    ASSERT_TRUE(ran_b.is_ok()) << ran_b.message();

    std::size_t nnodes = 0;
    ASSERT_CUDA(cudaGraphGetNodes(graph, nullptr, &nnodes));
    std::vector<cudaGraphNode_t> nodes(nnodes);
    ASSERT_CUDA(cudaGraphGetNodes(graph, nodes.data(), &nnodes));
    std::vector<cudaGraphNode_t> kernels;
    for (cudaGraphNode_t n : nodes) {
      cudaGraphNodeType type;
      ASSERT_CUDA(cudaGraphNodeGetType(n, &type));
      if (type == cudaGraphNodeTypeKernel) kernels.push_back(n);
    }
    ASSERT_EQ(kernels.size(), 2u);
    EXPECT_TRUE(depends_on(kernels[0], kernels[1]) || depends_on(kernels[1], kernels[0]))
        << "the two captured launches of one executor are not ordered in the graph";

    cudaGraphExec_t exec = nullptr;
    ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 6; ++replay) {
      refill_inputs(p, dtype, 300 + replay, bufs_a);
      refill_inputs(p, dtype, 400 + replay, bufs_b);
      ASSERT_CUDA(cudaGraphLaunch(exec, s1));
      const Status s = ex.wait(a);
      ASSERT_TRUE(s.is_ok()) << s.message();
      for (CallBuffers* bufs : {&bufs_a, &bufs_b}) {
        auto result = host::execute(p, host_options(a, kSmallSlotBytes), bufs->host);
        ASSERT_TRUE(result.status.is_ok()) << result.status.message();
        const std::string failure = compare(p, dtype, *bufs);
        ASSERT_TRUE(failure.empty()) << "replay " << replay << ": " << failure;
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
  }
}

// ---- Failures: a program that blocks forever ----

/// Two ranks that each receive before sending: validation's `deadlock` rule, run anyway. Under
/// LL and LL128 the receivers poll slot lines that no sender ever writes.
ef::Program receive_first_program(ef::Protocol protocol = ef::Protocol::kSimple) {
  ef::Program p;
  p.name = "receive_first";
  p.collective = ef::Collective::kCustom;
  p.protocol = protocol;
  p.nranks = 2;
  p.nchunksperloop = 1;
  p.inplace = false;
  p.outofplace = true;
  for (int r = 0; r < 2; ++r) {
    ef::Rank rank;
    rank.input_chunks = 1;
    rank.output_chunks = 1;
    ef::Threadblock tb;
    tb.send_peer = 1 - r;
    tb.recv_peer = 1 - r;
    ef::Op recv;
    recv.code = ef::OpCode::kRecv;
    recv.dst = ef::BufferRef{ef::BufferKind::kOutput, 0};
    ef::Op send;
    send.code = ef::OpCode::kSend;
    send.src = ef::BufferRef{ef::BufferKind::kInput, 0};
    tb.ops = {recv, send};
    rank.threadblocks.push_back(tb);
    p.ranks.push_back(rank);
    // What it would compute if it could run: each rank's output is the other's input.
    p.postconditions.push_back({r, 0, {ef::ChunkSource{1 - r, 0}}});
  }
  return p;
}

TEST(DeviceExecutor, RefusesBlockingProgramsUnlessAllowed) {
  SKIP_WITHOUT_GPU();
  auto refused = device::DeviceExecutor::create(receive_first_program(), {0, 0});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("deadlock"), std::string::npos)
      << refused.status().message();
}

struct BlockedCall {
  std::unique_ptr<device::DeviceExecutor> executor;
  std::unique_ptr<Streams> streams;
  CallBuffers bufs;
  device::RunArgs args;
};

void start_blocked_call(std::chrono::nanoseconds timeout, ef::Protocol protocol,
                        BlockedCall& call) {
  const ef::Program p = receive_first_program(protocol);
  const std::vector<int> devices = map_ranks(2, true);
  device::ExecutorConfig config;
  config.allow_blocking_programs = true;
  auto executor = device::DeviceExecutor::create(p, devices, config);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  call.executor = std::move(executor.value());
  call.streams = std::make_unique<Streams>(call.executor->devices());
  // Several 120-byte groups, so that several warps poll.
  make_buffers(p, devices, 4096, DataType::kFloat32, false, false, 3, call.bufs);
  call.args =
      run_args(p, call.bufs, 4096, DataType::kFloat32, RedOp::kSum, false, call.streams->get());
  call.args.timeout = timeout;
}

TEST(DeviceExecutor, TimeoutNamesTheBlockedThreadblock) {
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    BlockedCall call;
    start_blocked_call(std::chrono::milliseconds(200), protocol, call);
    ASSERT_TRUE(call.executor);
    const auto start = std::chrono::steady_clock::now();
    const Status s = call.executor->run_and_wait(call.args);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("threadblock 0 op 0 (recv) iteration 0"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("data on connection"), std::string::npos) << s.message();
    EXPECT_LT(elapsed, std::chrono::seconds(2)) << s.message();

    // Refused until reset; after reset it runs (and blocks) again.
    EXPECT_FALSE(call.executor->run(call.args).is_ok());
    ASSERT_TRUE(call.executor->reset().is_ok());
    EXPECT_TRUE(call.executor->error_status().is_ok());
    const Status again = call.executor->run_and_wait(call.args);
    EXPECT_NE(again.message().find("timed out"), std::string::npos) << again.message();
  }
}

TEST(DeviceExecutor, AbortStopsABlockedCallPromptly) {
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    BlockedCall call;
    start_blocked_call(std::chrono::seconds(60), protocol, call);
    ASSERT_TRUE(call.executor);
    ASSERT_TRUE(call.executor->run(call.args).is_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto start = std::chrono::steady_clock::now();
    std::thread aborter([&] { call.executor->abort(); });
    const Status s = call.executor->wait(call.args);
    aborter.join();
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.message();
    EXPECT_LT(elapsed, std::chrono::seconds(1)) << s.message();
    ASSERT_TRUE(call.executor->reset().is_ok());

    // The GPUs are healthy afterwards: a good program still matches the host.
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const auto devices = map_ranks(p.nranks, true);
    auto executor = device::DeviceExecutor::create(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    Streams streams((*executor)->devices());
    const std::string failure = run_and_compare(
        **executor, p, devices, streams, ef::count_granularity(p) * 5, DataType::kFloat32,
        RedOp::kSum, false, false, 9, (*executor)->slot_bytes());
    EXPECT_TRUE(failure.empty()) << failure;
  }
}

// ---- Batches: several calls in one fused launch per device ----

/// One call of a batch test: its program, executor, buffers and arguments.
struct BatchEntry {
  const ef::Program* program = nullptr;
  device::DeviceExecutor* executor = nullptr;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  bool inplace = false;
  uint64_t count = 0;
  CallBuffers bufs;
  device::RunArgs args;
  std::vector<int> devices;  ///< rank -> GPU of the buffers (empty: spread over every GPU)
};

/// Fresh buffers and inputs for every entry (not during a capture: it copies synchronously).
void make_batch_buffers(std::vector<BatchEntry>& entries, const Streams& streams, uint64_t seed) {
  for (BatchEntry& e : entries) {
    make_buffers(*e.program, e.devices.empty() ? map_ranks(e.program->nranks, true) : e.devices,
                 e.count, e.dtype, e.inplace, false, ++seed, e.bufs);
    e.args = run_args(*e.program, e.bufs, e.count, e.dtype, e.op, e.inplace, streams.get());
  }
}

Status run_batch_only(std::vector<BatchEntry>& entries, device::BatchReport* report,
                      const device::BatchOptions& options = {}) {
  std::vector<device::BatchCall> calls;
  for (BatchEntry& e : entries) calls.push_back({e.executor, &e.args});
  return device::DeviceExecutor::run_batch(calls, report, options);
}

/// Fresh inputs for every entry, then one run_batch.
Status run_batch_of(std::vector<BatchEntry>& entries, const Streams& streams, uint64_t seed,
                    device::BatchReport* report, const device::BatchOptions& options = {}) {
  make_batch_buffers(entries, streams, seed);
  return run_batch_only(entries, report, options);
}

/// Empty when every entry's GPU result equals the host executor's.
std::string compare_batch(std::vector<BatchEntry>& entries) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    BatchEntry& e = entries[i];
    auto result =
        host::execute(*e.program, host_options(e.args, e.executor->slot_bytes()), e.bufs.host);
    if (!result.status) return "call " + std::to_string(i) + ": host: " + result.status.message();
    if (std::string d = compare(*e.program, e.dtype, e.bufs); !d.empty())
      return "call " + std::to_string(i) + " ('" + e.program->name + "', " +
             describe(e.dtype, e.op, e.inplace, e.count) + "): " + d;
  }
  return {};
}

TEST(DeviceExecutor, BatchRunsInOneFusedLaunchPerDevice) {
  // Simple, LL and LL128 programs, a program with scratch used twice (each use gets its own),
  // in place and out of place, then a float allgather (data movement: it joins the float sum
  // kernel before it): one launch per device; then an int8 allgather of 91 bytes (not whole
  // floats: it runs as bytes): a second launch. Results bitwise the host executor's, batch
  // after batch and under graph replay.
  SKIP_WITHOUT_GPU();
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const ef::Program& ring128 =
      program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL128);
  const ef::Program& allpairs =
      program_as(example("allpairs_allreduce_3r.json"), ef::Protocol::kSimple);
  const ef::Program& allgather = program_as(example("ring_allgather_4r.json"), ef::Protocol::kSimple);
  const ef::Program& reduce = program_as(example("chain_reduce_4r.json"), ef::Protocol::kLL);
  // Every executor on the same devices (the batch shares streams): ranks spread over at most
  // three GPUs, the smallest program's rank count.
  const int ngpus = std::min(visible_gpus(nullptr), 3);
  const auto spread_over = [ngpus](int nranks) {
    std::vector<int> d(static_cast<std::size_t>(nranks));
    for (int r = 0; r < nranks; ++r) d[static_cast<std::size_t>(r)] = r * ngpus / nranks;
    return d;
  };
  std::vector<std::unique_ptr<device::DeviceExecutor>> executors;
  for (const ef::Program* p : {&ring, &ring128, &allpairs, &allgather, &reduce}) {
    auto e = small_slot_executor(*p, spread_over(p->nranks));
    ASSERT_TRUE(e.is_ok()) << p->name << ": " << e.status().message();
    executors.push_back(std::move(e.value()));
  }
  ASSERT_GT(allpairs.ranks[0].scratch_chunks, 0) << "the test needs a program with scratch";
  const std::vector<int> devices = executors[0]->devices();
  for (const auto& e : executors) ASSERT_EQ(e->devices(), devices);
  Streams streams(devices);

  std::vector<BatchEntry> entries(8);
  const auto set = [&](std::size_t i, std::size_t executor, const ef::Program& p, bool inplace,
                       uint64_t granules) {
    entries[i].program = &p;
    entries[i].executor = executors[executor].get();
    entries[i].inplace = inplace;
    entries[i].count = ef::count_granularity(p) * granules;
  };
  set(0, 0, ring, false, 300);
  set(1, 2, allpairs, false, 211);
  set(2, 1, ring128, false, 97);
  set(3, 2, allpairs, false, 500);  // the same executor again, a larger call
  set(4, 4, reduce, false, 123);
  set(5, 0, ring, true, 64);  // ring's executor again, in place
  set(6, 3, allgather, false, 333);
  set(7, 3, allgather, true, 91);
  entries[7].dtype = DataType::kInt8;

  for (int round = 0; round < 3; ++round) {
    const uint64_t before = device::interpreter_launch_count();
    device::BatchReport report;
    const Status s = run_batch_of(entries, streams, 100 * round, &report);
    ASSERT_TRUE(s.is_ok()) << s.message();
    for (BatchEntry& e : entries) {
      const Status w = e.executor->wait(e.args);
      ASSERT_TRUE(w.is_ok()) << w.message();
    }
    EXPECT_EQ(report.launches, 2 * devices.size());
    EXPECT_EQ(report.fused_calls, (entries.size() - 1) * devices.size());  // the last runs alone
    EXPECT_EQ(device::interpreter_launch_count() - before, 2 * devices.size());
    const std::string failure = compare_batch(entries);
    ASSERT_TRUE(failure.empty()) << "round " << round << ": " << failure;
  }

  // The same batch captured once (one stream per device, as NCCL users capture) and replayed.
  std::vector<cudaGraph_t> graphs(devices.size());
  std::vector<cudaGraphExec_t> execs(devices.size());
  make_batch_buffers(entries, streams, 7000);
  device::BatchReport report;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    cudaSetDevice(devices[i]);
    ASSERT_CUDA(cudaStreamBeginCapture(streams.get()[i], cudaStreamCaptureModeThreadLocal));
  }
  const Status captured = run_batch_only(entries, &report);
  // Every capture ends before any graph is instantiated (refused while one is capturing).
  for (std::size_t i = 0; i < devices.size(); ++i) {
    cudaSetDevice(devices[i]);
    ASSERT_CUDA(cudaStreamEndCapture(streams.get()[i], &graphs[i]));
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    cudaSetDevice(devices[i]);
    ASSERT_CUDA(cudaGraphInstantiate(&execs[i], graphs[i], 0));
  }
  ASSERT_TRUE(captured.is_ok()) << captured.message();
  for (int replay = 0; replay < 5; ++replay) {
    for (BatchEntry& e : entries) refill_inputs(*e.program, e.dtype, 9000 + replay, e.bufs);
    for (std::size_t i = 0; i < devices.size(); ++i) {
      cudaSetDevice(devices[i]);
      ASSERT_CUDA(cudaGraphLaunch(execs[i], streams.get()[i]));
    }
    for (BatchEntry& e : entries) {
      const Status w = e.executor->wait(e.args);
      ASSERT_TRUE(w.is_ok()) << w.message();
    }
    const std::string failure = compare_batch(entries);
    ASSERT_TRUE(failure.empty()) << "replay " << replay << ": " << failure;
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    cudaGraphExecDestroy(execs[i]);
    cudaGraphDestroy(graphs[i]);
  }
}

TEST(DeviceExecutor, MultiRankCallsOfABatchFuseUnlessTheirBuffersMeet) {
  // shared_gpu_allreduce (mrc ops) with 2 ranks on GPU 0. Two calls on separate buffers: one
  // fused launch. The same call twice on the same buffers in place (the second reduces what the
  // first wrote): an mrc writes other ranks' buffers with no slots to fall back on, so the batch
  // goes out one launch per call, and the result is the allreduce applied twice.
  SKIP_WITHOUT_GPU();
  algorithms::AlgorithmParams params;
  params.ranks = 2;
  params.instances = 2;
  auto generated = algorithms::generate_algorithm("shared_gpu_allreduce", params);
  ASSERT_TRUE(generated) << generated.status().message();
  const ef::Program& p = *generated;
  const std::vector<int> devices = {0, 0};
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor) << executor.status().message();
  Streams streams((*executor)->devices());
  std::vector<BatchEntry> entries(2);
  for (BatchEntry& e : entries) {
    e.program = &p;
    e.executor = executor->get();
    e.inplace = true;
    e.count = ef::count_granularity(p) * 1000;
    e.devices = devices;
  }
  device::BatchReport report;
  uint64_t before = device::interpreter_launch_count();
  ASSERT_TRUE(run_batch_of(entries, streams, 31, &report).is_ok());
  for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
  EXPECT_EQ(report.launches, 1u);
  EXPECT_EQ(device::interpreter_launch_count() - before, 1u);
  ASSERT_EQ(compare_batch(entries), "");

  make_batch_buffers(entries, streams, 77);
  entries[1].args = entries[0].args;  // the same buffers and streams
  report = {};
  before = device::interpreter_launch_count();
  ASSERT_TRUE(run_batch_only(entries, &report).is_ok());
  for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
  EXPECT_EQ(report.launches, 2u);
  EXPECT_EQ(device::interpreter_launch_count() - before, 2u);
  const host::ExecOptions o = host_options(entries[0].args, (*executor)->slot_bytes());
  for (int pass = 0; pass < 2; ++pass)
    ASSERT_TRUE(host::execute(p, o, entries[0].bufs.host).status);
  EXPECT_EQ(compare(p, DataType::kFloat32, entries[0].bufs), "");

  // Two ranks given the same buffer: an mrc would race inside one op, so the call is refused.
  device::RunArgs shared = entries[0].args;
  shared.inputs[1] = shared.inputs[0];
  shared.outputs[1] = shared.outputs[0];
  const Status refused = (*executor)->run(shared);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("overlaps rank 1's output buffer"), std::string::npos)
      << refused.message();
}

TEST(DeviceExecutor, BatchLaunchesPerKernelInCallOrder) {
  // float sum, then int32 max on the same executor, then float sum again: three kernels in
  // a row on every device (consecutive calls of one kernel fuse, others keep their order).
  // Sharing a few CTAs (max_ctas) puts the calls one after the other on them.
  SKIP_WITHOUT_GPU();
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const ef::Program& ll = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL);
  auto a = small_slot_executor(ring, map_ranks(4, true));
  auto b = small_slot_executor(ll, map_ranks(4, true));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  const std::vector<int> devices = (*a)->devices();
  Streams streams(devices);
  std::vector<BatchEntry> entries(4);
  const DataType types[] = {DataType::kFloat32, DataType::kInt32, DataType::kFloat32,
                            DataType::kFloat32};
  const RedOp ops[] = {RedOp::kSum, RedOp::kMax, RedOp::kSum, RedOp::kSum};
  for (std::size_t i = 0; i < entries.size(); ++i) {
    entries[i].program = i == 3 ? &ll : &ring;
    entries[i].executor = i == 3 ? b->get() : a->get();
    entries[i].dtype = types[i];
    entries[i].op = ops[i];
    entries[i].count = ef::count_granularity(ring) * (50 + 40 * i);
  }
  // One device: at most 8 threadblocks per launch (4 ranks x 2); two: 4.
  const uint32_t widest = static_cast<uint32_t>(8 / devices.size());
  for (uint32_t max_ctas : {0u, widest}) {
    device::BatchReport report;
    const Status s = run_batch_of(entries, streams, max_ctas, &report, {max_ctas});
    ASSERT_TRUE(s.is_ok()) << s.message();
    for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
    EXPECT_EQ(report.launches, 3 * devices.size());  // [float, int32 max, float + float]
    EXPECT_EQ(report.fused_calls, 2 * devices.size());
    const std::string failure = compare_batch(entries);
    ASSERT_TRUE(failure.empty()) << "max_ctas " << max_ctas << ": " << failure;
  }
}

TEST(DeviceExecutor, BatchDataMovementJoinsTheNeighbouringKernel) {
  // Allgathers only copy: one whose bytes are whole floats and whose buffers are float-aligned
  // runs in the float sum kernel of the call before it (or, first in the batch, of the next
  // reducing call), so that [allgather, allreduce, allgather bf16, allreduce, allgather LL128]
  // is one launch per device. A bfloat16 allgather of an odd count, or one whose buffers are
  // not float-aligned, keeps the bytes kernel and splits the launch there.
  SKIP_WITHOUT_GPU();
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const ef::Program& allgather = program_as(example("ring_allgather_4r.json"), ef::Protocol::kSimple);
  const ef::Program& allgather128 =
      program_as(example("ring_allgather_4r.json"), ef::Protocol::kLL128);
  std::vector<std::unique_ptr<device::DeviceExecutor>> executors;
  for (const ef::Program* p : {&ring, &allgather, &allgather128}) {
    auto e = small_slot_executor(*p, map_ranks(p->nranks, true));
    ASSERT_TRUE(e.is_ok()) << p->name << ": " << e.status().message();
    executors.push_back(std::move(e.value()));
  }
  const std::vector<int> devices = executors[0]->devices();
  Streams streams(devices);
  const uint64_t ring_granule = ef::count_granularity(ring);
  struct Shape {
    std::size_t executor;
    DataType dtype;
    uint64_t count;
    bool inplace;
  };
  const auto run = [&](const std::vector<Shape>& shapes, std::size_t launches,
                       std::size_t fused, const char* what) {
    SCOPED_TRACE(what);
    std::vector<BatchEntry> entries(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Shape& sh = shapes[i];
      entries[i].program = sh.executor == 0 ? &ring : sh.executor == 1 ? &allgather : &allgather128;
      entries[i].executor = executors[sh.executor].get();
      entries[i].dtype = sh.dtype;
      entries[i].count = sh.count;
      entries[i].inplace = sh.inplace;
    }
    for (int round = 0; round < 2; ++round) {
      device::BatchReport report;
      const Status s = run_batch_of(entries, streams, 500 + 10 * round, &report);
      ASSERT_TRUE(s.is_ok()) << s.message();
      for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
      EXPECT_EQ(report.launches, launches * devices.size());
      EXPECT_EQ(report.fused_calls, fused * devices.size());
      const std::string failure = compare_batch(entries);
      ASSERT_TRUE(failure.empty()) << "round " << round << ": " << failure;
    }
  };
  run({{1, DataType::kFloat32, 301, false},
       {0, DataType::kFloat32, ring_granule * 100, false},
       {1, DataType::kBFloat16, 2 * 151, false},
       {0, DataType::kFloat32, ring_granule * 37, true},
       {2, DataType::kInt8, 4 * 77, true}},
      1, 5, "every allgather joins the float kernel");
  run({{0, DataType::kFloat32, ring_granule * 100, false},
       {1, DataType::kBFloat16, 151, false},  // 302 bytes: not whole floats
       {0, DataType::kFloat32, ring_granule * 37, false},
       {1, DataType::kFloat32, 64, false}},
      3, 2, "an odd bfloat16 allgather keeps the bytes kernel");

  // Whole floats, but the allgather's buffers are only 2-byte aligned (bfloat16 buffers one
  // element past an allocation): bytes again, so 3 launches, and still the host's results.
  std::vector<BatchEntry> entries(3);
  for (std::size_t i = 0; i < 3; ++i) {
    entries[i].program = i == 1 ? &allgather : &ring;
    entries[i].executor = executors[i == 1 ? 1 : 0].get();
    entries[i].dtype = i == 1 ? DataType::kBFloat16 : DataType::kFloat32;
    entries[i].count = i == 1 ? 2 * 99 : ring_granule * 50;
  }
  make_batch_buffers(entries, streams, 900);
  BatchEntry& shifted = entries[1];
  make_buffers(allgather, map_ranks(4, true), shifted.count, DataType::kBFloat16, false,
               /*misalign=*/true, 901, shifted.bufs);
  shifted.args = run_args(allgather, shifted.bufs, shifted.count, DataType::kBFloat16,
                          RedOp::kSum, false, streams.get());
  ASSERT_NE(reinterpret_cast<std::uintptr_t>(shifted.args.outputs[0]) % 4, 0u);
  device::BatchReport report;
  ASSERT_TRUE(run_batch_only(entries, &report).is_ok());
  for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
  EXPECT_EQ(report.launches, 3 * devices.size());
  const std::string failure = compare_batch(entries);
  ASSERT_TRUE(failure.empty()) << failure;
}

/// Two ranks that send first, then receive: a healthy exchange of one chunk, one threadblock
/// per rank.
ef::Program send_first_program() {
  ef::Program p = receive_first_program();
  p.name = "send_first";
  for (ef::Rank& rank : p.ranks) std::swap(rank.threadblocks[0].ops[0], rank.threadblocks[0].ops[1]);
  return p;
}

TEST(DeviceExecutor, BatchSkipsCallsAfterAFailedOneOnTheSameCta) {
  // A blocked call and a healthy one on the same CTA (max_ctas 1): the blocked one times out,
  // the healthy one is skipped and says why, at once rather than at its own deadline.
  SKIP_WITHOUT_GPU();
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    BlockedCall blocked;
    start_blocked_call(std::chrono::milliseconds(300), protocol, blocked);
    ASSERT_TRUE(blocked.executor);
    ef::Program healthy_program = send_first_program();
    healthy_program.protocol = protocol;
    const std::vector<int> devices = map_ranks(2, true);
    auto healthy = device::DeviceExecutor::create(healthy_program, devices);
    ASSERT_TRUE(healthy.is_ok()) << healthy.status().message();
    CallBuffers bufs;
    make_buffers(healthy_program, devices, 4096, DataType::kFloat32, false, false, 8, bufs);
    device::RunArgs args = run_args(healthy_program, bufs, 4096, DataType::kFloat32, RedOp::kSum,
                                    false, blocked.streams->get());
    args.timeout = std::chrono::seconds(20);

    const auto start = std::chrono::steady_clock::now();
    // Both programs have one threadblock per rank: as many CTAs as ranks per device.
    const auto ctas = static_cast<uint32_t>(2 / (*healthy)->devices().size());
    const Status s = device::DeviceExecutor::run_batch(
        {{blocked.executor.get(), &blocked.args}, {healthy->get(), &args}}, nullptr, {ctas});
    ASSERT_TRUE(s.is_ok()) << s.message();
    const Status first = blocked.executor->wait(blocked.args);
    const Status second = (*healthy)->wait(args);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_NE(first.message().find("timed out"), std::string::npos) << first.message();
    EXPECT_EQ(second.message().rfind("skipped: rank ", 0), 0u) << second.message();
    EXPECT_NE(second.message().find("earlier call of the same fused launch failed"),
              std::string::npos)
        << second.message();
    EXPECT_LT(elapsed, std::chrono::seconds(5));

    // After reset the healthy executor runs alone and computes the exchange.
    ASSERT_TRUE((*healthy)->reset().is_ok());
    make_buffers(healthy_program, devices, 4096, DataType::kFloat32, false, false, 9, bufs);
    args = run_args(healthy_program, bufs, 4096, DataType::kFloat32, RedOp::kSum, false,
                    blocked.streams->get());
    const Status again = (*healthy)->run_and_wait(args);
    ASSERT_TRUE(again.is_ok()) << again.message();
    auto result = host::execute(healthy_program, host_options(args, (*healthy)->slot_bytes()),
                                bufs.host);
    ASSERT_TRUE(result.status.is_ok()) << result.status.message();
    EXPECT_EQ(compare(healthy_program, DataType::kFloat32, bufs), "");
  }
}

TEST(DeviceExecutor, BatchWithBadArgumentsLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  auto a = small_slot_executor(ring, map_ranks(4, true));
  ASSERT_TRUE(a.is_ok());
  Streams streams((*a)->devices());
  std::vector<BatchEntry> entries(2);
  for (BatchEntry& e : entries) {
    e.program = &ring;
    e.executor = a->get();
    e.count = ef::count_granularity(ring) * 10;
  }
  entries[1].count += 1;  // not a multiple of the program's granularity
  const uint64_t before = device::interpreter_launch_count();
  const Status s = run_batch_of(entries, streams, 1, nullptr);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("batch call 1"), std::string::npos) << s.message();
  EXPECT_EQ(device::interpreter_launch_count(), before);
  EXPECT_FALSE(device::DeviceExecutor::run_batch({{nullptr, nullptr}}).is_ok());
}

/// Two executors of the ring program (Simple, LL) running a float sum and an int32 max: two
/// kernels, so per device one launch each, in call order.
struct TwoKernelBatch {
  std::vector<std::unique_ptr<device::DeviceExecutor>> executors;
  std::vector<BatchEntry> entries;
  std::unique_ptr<Streams> streams;
};

/// `spread`: the ranks over every visible GPU, else all on GPU 0.
void make_two_kernel_batch(TwoKernelBatch& batch, bool spread) {
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const ef::Program& ll = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL);
  for (const ef::Program* p : {&ring, &ll}) {
    auto e = small_slot_executor(*p, map_ranks(p->nranks, spread));
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    batch.executors.push_back(std::move(e.value()));
  }
  batch.streams = std::make_unique<Streams>(batch.executors[0]->devices());
  batch.entries.resize(2);
  batch.entries[0].program = &ring;
  batch.entries[0].executor = batch.executors[0].get();
  batch.entries[1].program = &ll;
  batch.entries[1].executor = batch.executors[1].get();
  batch.entries[1].dtype = DataType::kInt32;
  batch.entries[1].op = RedOp::kMax;
  for (BatchEntry& e : batch.entries) e.count = ef::count_granularity(ring) * 77;
}

TEST(DeviceExecutor, BatchWithAFailedLaunchLeavesWholeCallsAlone) {
  // The second call's launch fails (injected): the first call ran whole, so its executor is
  // not aborted and its result is the host's; the second did not run at all, is reported, and
  // its executor stays usable without reset().
  SKIP_WITHOUT_GPU();
  TwoKernelBatch batch;
  make_two_kernel_batch(batch, /*spread=*/false);  // one GPU: one launch per call
  ASSERT_EQ(batch.executors.size(), 2u);
  device::BatchReport report;
  device::BatchOptions options;
  options.fail_launch = 1;
  const uint64_t before = device::interpreter_launch_count();
  for (BatchEntry& e : batch.entries) e.devices = map_ranks(4, false);
  const Status s = run_batch_of(batch.entries, *batch.streams, 40, &report, options);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("failed on purpose"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("batch calls not run: 1"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("aborted"), std::string::npos) << s.message();
  EXPECT_EQ(report.not_run, std::vector<std::size_t>{1});
  EXPECT_EQ(device::interpreter_launch_count() - before, 1u);

  BatchEntry& ran = batch.entries[0];
  const Status w = ran.executor->wait(ran.args);
  ASSERT_TRUE(w.is_ok()) << w.message();
  auto result = host::execute(*ran.program, host_options(ran.args, ran.executor->slot_bytes()),
                              ran.bufs.host);
  ASSERT_TRUE(result.status.is_ok()) << result.status.message();
  EXPECT_EQ(compare(*ran.program, ran.dtype, ran.bufs), "");

  BatchEntry& skipped = batch.entries[1];
  EXPECT_TRUE(skipped.executor->error_status().is_ok());
  make_buffers(*skipped.program, map_ranks(4, false), skipped.count, skipped.dtype, false, false,
               41, skipped.bufs);
  skipped.args = run_args(*skipped.program, skipped.bufs, skipped.count, skipped.dtype,
                          skipped.op, false, batch.streams->get());
  const Status again = skipped.executor->run_and_wait(skipped.args);
  ASSERT_TRUE(again.is_ok()) << again.message();
  auto expected = host::execute(*skipped.program,
                                host_options(skipped.args, skipped.executor->slot_bytes()),
                                skipped.bufs.host);
  ASSERT_TRUE(expected.status.is_ok()) << expected.status.message();
  EXPECT_EQ(compare(*skipped.program, skipped.dtype, skipped.bufs), "");
}

TEST(DeviceExecutor, BatchWithAFailedLaunchAbortsPartlyLaunchedCalls) {
  // Two GPUs: launches go out as [call 0 on GPU 0, call 0 on GPU 1, call 1 on GPU 0, call 1 on
  // GPU 1]. The second fails: call 0 runs on GPU 0 only, so its executor is aborted (its CTAs
  // there would wait for GPU 1's until the deadline); call 1 never ran and is left alone.
  SKIP_WITHOUT_GPU();
  if (visible_gpus(nullptr) < 2) GTEST_SKIP() << "needs two GPUs (a call launched on one only)";
  TwoKernelBatch batch;
  make_two_kernel_batch(batch, /*spread=*/true);
  ASSERT_EQ(batch.executors.size(), 2u);
  device::BatchReport report;
  device::BatchOptions options;
  options.fail_launch = 1;
  const auto start = std::chrono::steady_clock::now();
  make_batch_buffers(batch.entries, *batch.streams, 50);
  for (BatchEntry& e : batch.entries) e.args.timeout = std::chrono::seconds(30);
  const Status s = run_batch_only(batch.entries, &report, options);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("batch calls not run: 0, 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1 executor(s) aborted"), std::string::npos) << s.message();
  EXPECT_EQ(report.not_run, (std::vector<std::size_t>{0, 1}));

  const Status first = batch.entries[0].executor->wait(batch.entries[0].args);
  EXPECT_NE(first.message().find("aborted"), std::string::npos) << first.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(batch.entries[1].executor->error_status().is_ok());

  // After reset, the aborted executor runs again.
  ASSERT_TRUE(batch.entries[0].executor->reset().is_ok());
  BatchEntry& e = batch.entries[0];
  make_buffers(*e.program, map_ranks(4, true), e.count, e.dtype, false, false, 51, e.bufs);
  e.args = run_args(*e.program, e.bufs, e.count, e.dtype, e.op, false, batch.streams->get());
  ASSERT_TRUE(e.executor->run_and_wait(e.args).is_ok());
  auto result = host::execute(*e.program, host_options(e.args, e.executor->slot_bytes()), e.bufs.host);
  ASSERT_TRUE(result.status.is_ok());
  EXPECT_EQ(compare(*e.program, e.dtype, e.bufs), "");
}

// ---- The resident grid (efccl/device/resident.h) ----

/// The grid runs only where kernels load eagerly (device/resident.h): the `resident/` ctest
/// registration sets CUDA_MODULE_LOADING=EAGER; the plain one, where loading is lazy, checks
/// instead that resident execution stays off (IsOffWhileKernelsLoadLazily).
#define SKIP_UNLESS_EAGER_LOADING()                                                          \
  do {                                                                                       \
    if (!device::resident_loading_allows())                                                  \
      GTEST_SKIP() << "the resident grid needs CUDA_MODULE_LOADING=EAGER (kernels load "     \
                      "lazily in this process); ctest's resident/ registration sets it";     \
  } while (0)

/// Makes GPU 0's grid leave (it comes back at the next post), so that the buffers allocated next
/// exist before it is launched again: compute-sanitizer's memcheck reports a running kernel's
/// accesses to memory allocated after its launch as out of bounds (docs/device-executor.md,
/// "Sanitizers"), and the ResidentGrid tests are what its runs cover.
void leave_grid_before_allocating() {
  const Status quiet = device::quiesce_resident(0);
  ASSERT_TRUE(quiet.is_ok()) << quiet.message();
}

/// Resident execution on GPU 0 with `ctas` CTAs for one test: the grid is made to leave first,
/// so that it starts again with this CTA count; the previous configuration comes back after.
class ResidentOn {
 public:
  explicit ResidentOn(uint32_t ctas, std::chrono::microseconds idle = std::chrono::milliseconds(2))
      : previous_(device::resident_config()) {
    cudaDeviceSynchronize();  // nothing of an earlier test still posted
    const Status quiet = device::quiesce_resident(0);
    EXPECT_TRUE(quiet.is_ok()) << quiet.message();
    device::ResidentConfig config;
    config.enabled = true;
    config.ctas = ctas;
    config.idle = idle;
    device::set_resident_config(config);
    device::retain_resident(0);
  }
  ~ResidentOn() {
    const Status released = device::release_resident(0);
    EXPECT_TRUE(released.is_ok()) << released.message();
    device::set_resident_config(previous_);
  }
  ResidentOn(const ResidentOn&) = delete;
  ResidentOn& operator=(const ResidentOn&) = delete;

 private:
  device::ResidentConfig previous_;
};

TEST(ResidentGrid, RunsEagerCallsWithoutLaunchingAndReusesRepeatedContents) {
  // Four ranks on GPU 0, every protocol: each call is posted, not launched, and matches the
  // host executor. A call repeated on the same buffers reuses its slot's content (a persistent
  // operation: two stream memory operations and nothing else); new inputs in the same buffers
  // change nothing the grid reads.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  // Idle for 200 ms before the grid leaves (not 2 ms): the check that the grid is still running
  // after the calls must not depend on how fast the host compares (compute-sanitizer's tools
  // slow the host's work between calls past 2 ms). The grid is made to leave before each
  // round of allocations instead (leave_grid_before_allocating).
  ResidentOn resident(64, std::chrono::milliseconds(200));
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), protocol);
    const std::vector<int> devices = map_ranks(p.nranks, false);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    Streams streams(ex.devices());
    const uint64_t count = ef::count_granularity(p) * 300;
    CallBuffers bufs;
    make_buffers(p, devices, count, DataType::kFloat32, false, false, 41, bufs);
    const auto args = run_args(p, bufs, count, DataType::kFloat32, RedOp::kSum, false, streams.get());
    leave_grid_before_allocating();  // the calls below allocate nothing: one grid runs them all
    for (int call = 0; call < 6; ++call) {
      if (call > 0) refill_inputs(p, DataType::kFloat32, 41 + call, bufs);
      const device::ResidentStats before = device::resident_stats();
      ASSERT_TRUE(ex.run_and_wait(args).is_ok());
      const device::ResidentStats after = device::resident_stats();
      EXPECT_EQ(after.posts - before.posts, 1u) << "call " << call << " was launched";
      if (call > 0) {
        EXPECT_EQ(after.new_contents, before.new_contents) << "call " << call;
      }
      auto result = host::execute(p, host_options(args, kSmallSlotBytes), bufs.host);
      ASSERT_TRUE(result.status.is_ok()) << result.status.message();
      const std::string failure = compare(p, DataType::kFloat32, bufs);
      ASSERT_TRUE(failure.empty()) << "call " << call << ": " << failure;
    }
    EXPECT_TRUE(device::resident_running(0));
    // Every datatype and operator goes through the grid's run-time kernel selection.
    for (const MatrixEntry& m : kMatrix) {
      leave_grid_before_allocating();  // run_and_compare allocates the entry's buffers
      const uint64_t posts = device::resident_stats().posts;
      const std::string failure = run_and_compare(ex, p, devices, streams, count, m.dtype, m.op,
                                                  false, false, 77, kSmallSlotBytes);
      ASSERT_TRUE(failure.empty()) << describe(m.dtype, m.op, false, count) << ": " << failure;
      EXPECT_GE(device::resident_stats().posts, posts + 1) << describe(m.dtype, m.op, false, count);
    }
  }
}

TEST(ResidentGrid, BackToBackPostsWithManyContents) {
  // 300 in-place calls queued without waiting, each with its own count (a new content each,
  // more than the 128 slots: once every slot is in flight a call is launched instead), then one
  // wait: the chain of results is the host executor's.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  ResidentOn resident(64);
  const DataType dtype = DataType::kInt32;
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    const ef::Program& p = program_as(example("allpairs_allreduce_3r.json"), protocol);
    const std::vector<int> devices = map_ranks(p.nranks, false);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    Streams streams(ex.devices());
    const uint64_t g = ef::count_granularity(p);
    const uint64_t largest = g * 301;
    CallBuffers bufs;
    make_buffers(p, devices, largest, dtype, /*inplace=*/true, false, 5, bufs);
    const auto count_of = [&](int call) { return g * (1 + static_cast<uint64_t>(call)); };
    // The scratch for the largest call first, so that nothing is allocated while the grid runs:
    // compute-sanitizer's memcheck reports a running kernel's accesses to memory allocated after
    // its launch as out of bounds (docs/device-executor.md), and this is one of the cases its
    // runs cover. (The executor's growing of scratch beside a running grid is the launched
    // path's, whose old buffers stay until the executor ends.)
    ASSERT_TRUE(ex.reserve(largest, dtype).is_ok());
    const device::ResidentStats before = device::resident_stats();
    constexpr int kCalls = 300;
    for (int call = 0; call < kCalls; ++call) {
      const Status s = ex.run(run_args(p, bufs, count_of(call), dtype, RedOp::kSum, true,
                                       streams.get()));
      ASSERT_TRUE(s.is_ok()) << s.message();
    }
    const Status waited =
        ex.wait(run_args(p, bufs, largest, dtype, RedOp::kSum, true, streams.get()));
    ASSERT_TRUE(waited.is_ok()) << waited.message();
    const device::ResidentStats after = device::resident_stats();
    EXPECT_GT(after.posts - before.posts, 0u);
    EXPECT_EQ(after.posts - before.posts + (after.no_slot - before.no_slot),
              static_cast<uint64_t>(kCalls));
    std::printf("[ resident ] %s: %llu posted, %llu launched for want of a slot\n",
                protocol_name(protocol).c_str(),
                static_cast<unsigned long long>(after.posts - before.posts),
                static_cast<unsigned long long>(after.no_slot - before.no_slot));
    for (int call = 0; call < kCalls; ++call) {
      const uint64_t count = count_of(call);
      const auto args = run_args(p, bufs, count, dtype, RedOp::kSum, true, streams.get());
      const std::size_t bytes = count * ef::size_of(dtype);
      std::vector<host::RankBuffers> front(p.nranks);
      for (int r = 0; r < p.nranks; ++r)
        front[r].output.assign(bufs.host[r].output.begin(), bufs.host[r].output.begin() + bytes);
      auto result = host::execute(p, host_options(args, kSmallSlotBytes), front);
      ASSERT_TRUE(result.status.is_ok()) << result.status.message();
      for (int r = 0; r < p.nranks; ++r)
        std::copy(front[r].output.begin(), front[r].output.end(), bufs.host[r].output.begin());
    }
    const std::string failure = compare(p, dtype, bufs);
    ASSERT_TRUE(failure.empty()) << failure;
  }
}

TEST(ResidentGrid, RanksSharingAGpuMoveDataDirectlyInPostedCalls) {
  // The grid's kernel holds the direct transfers too (resident_kernel.cu, compiled as
  // relocatable code): posted calls of 2 and 4 ranks on GPU 0 use them, in place and out of
  // place, and give the host executor's results with them and without (RunArgs::direct). On
  // the same buffers the two settings post two contents (the call's direct mode reaches the
  // grid; a post that dropped it would find the first content again), and the first content
  // is found again when direct transfers come back.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  ResidentOn resident(64, std::chrono::milliseconds(200));
  uint64_t seed = 3100;
  for (int nranks : {2, 4}) {
    algorithms::AlgorithmParams params;
    params.ranks = nranks;
    params.channels = 2;
    params.protocol = ef::Protocol::kSimple;
    auto generated = algorithms::generate_algorithm("ring_allreduce", params);
    ASSERT_TRUE(generated.is_ok()) << generated.status().message();
    const ef::Program& p = *generated;
    const std::vector<int> devices = map_ranks(p.nranks, false);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    device::DeviceExecutor& ex = **executor;
    EXPECT_GT(ex.direct_ops(false), 0u) << nranks << " ranks";
    EXPECT_GT(ex.direct_ops(true), 0u) << nranks << " ranks";
    Streams streams(ex.devices());
    const uint64_t count = ef::count_granularity(p) * 517;
    for (bool inplace : {false, true}) {
      CallBuffers bufs;
      make_buffers(p, devices, count, DataType::kFloat32, inplace, false, ++seed, bufs);
      ASSERT_TRUE(ex.reserve(count, DataType::kFloat32).is_ok());
      leave_grid_before_allocating();  // the calls below allocate nothing
      int call = 0;
      for (bool direct : {true, false, true}) {
        const std::string where = std::to_string(nranks) + " ranks " +
                                  describe(DataType::kFloat32, RedOp::kSum, inplace, count) +
                                  (direct ? " direct" : " slots") + ", call " +
                                  std::to_string(call);
        if (call > 0) refill_inputs(p, DataType::kFloat32, ++seed, bufs);
        auto args = run_args(p, bufs, count, DataType::kFloat32, RedOp::kSum, inplace,
                             streams.get());
        args.direct = direct;
        const device::ResidentStats before = device::resident_stats();
        const Status run = ex.run_and_wait(args);
        ASSERT_TRUE(run.is_ok()) << where << ": " << run.message();
        const device::ResidentStats after = device::resident_stats();
        EXPECT_EQ(after.posts, before.posts + 1) << where << ": not posted";
        EXPECT_EQ(after.new_contents, before.new_contents + (call < 2 ? 1u : 0u)) << where;
        auto host = host::execute(p, host_options(args, kSmallSlotBytes), bufs.host);
        ASSERT_TRUE(host.status.is_ok()) << where << ": " << host.status.message();
        const std::string failure = compare(p, DataType::kFloat32, bufs);
        ASSERT_TRUE(failure.empty()) << where << ": " << failure;
        ++call;
      }
    }
  }
}

TEST(ResidentGrid, ProgramsNeedingMoreCtasThanTheGridAreLaunched) {
  // With one resident CTA no program of several ranks on a GPU fits: every call is launched
  // (and correct); with enough CTAs the same calls are posted.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL);
  const std::vector<int> devices = map_ranks(p.nranks, false);
  for (uint32_t ctas : {1u, 64u}) {
    SCOPED_TRACE("resident CTAs " + std::to_string(ctas));
    ResidentOn resident(ctas);
    auto executor = small_slot_executor(p, devices);
    ASSERT_TRUE(executor.is_ok()) << executor.status().message();
    Streams streams((*executor)->devices());
    const uint64_t posts = device::resident_stats().posts;
    const uint64_t launches = device::interpreter_launch_count();
    const std::string failure =
        run_and_compare(**executor, p, devices, streams, ef::count_granularity(p) * 100,
                        DataType::kFloat32, RedOp::kSum, false, false, 3, kSmallSlotBytes);
    ASSERT_TRUE(failure.empty()) << failure;
    EXPECT_EQ(device::interpreter_launch_count() - launches, 1u);  // posts count as launches
    EXPECT_EQ(device::resident_stats().posts - posts, ctas == 1 ? 0u : 1u);
  }
}

TEST(ResidentGrid, BatchIsOnePost) {
  // A batch of three calls of two executors on GPU 0: one fused descriptor, one post.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  ResidentOn resident(64);
  const ef::Program& ring = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const ef::Program& ring128 = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL128);
  std::vector<std::unique_ptr<device::DeviceExecutor>> executors;
  for (const ef::Program* p : {&ring, &ring128}) {
    auto e = small_slot_executor(*p, map_ranks(p->nranks, false));
    ASSERT_TRUE(e.is_ok()) << e.status().message();
    executors.push_back(std::move(e.value()));
  }
  Streams streams(executors[0]->devices());
  std::vector<BatchEntry> entries(3);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    entries[i].program = i == 1 ? &ring128 : &ring;
    entries[i].executor = executors[i == 1 ? 1 : 0].get();
    entries[i].devices = map_ranks(4, false);
    entries[i].count = ef::count_granularity(ring) * (50 + 70 * i);
    entries[i].inplace = i == 2;
  }
  for (int round = 0; round < 3; ++round) {
    leave_grid_before_allocating();  // run_batch_of allocates the round's buffers
    const uint64_t posts = device::resident_stats().posts;
    device::BatchReport report;
    const Status s = run_batch_of(entries, streams, 300 * round, &report);
    ASSERT_TRUE(s.is_ok()) << s.message();
    for (BatchEntry& e : entries) ASSERT_TRUE(e.executor->wait(e.args).is_ok());
    EXPECT_EQ(report.launches, 1u);
    EXPECT_EQ(device::resident_stats().posts - posts, 1u) << "round " << round;
    const std::string failure = compare_batch(entries);
    ASSERT_TRUE(failure.empty()) << "round " << round << ": " << failure;
  }
}

TEST(ResidentGrid, CapturedCallsAreLaunchedAndReplayCorrectly) {
  // A call captured into a CUDA graph is a kernel node (a resident post would need the grid
  // alive for as long as the graph exists; docs/device-executor.md); eager calls around it are
  // posted, and both orders of replays and posts give the host executor's results.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  ResidentOn resident(64);
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL);
  const std::vector<int> devices = map_ranks(p.nranks, false);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  device::DeviceExecutor& ex = **executor;
  Streams streams(ex.devices());
  const uint64_t count = ef::count_granularity(p) * 200;
  CallBuffers bufs;
  make_buffers(p, devices, count, DataType::kFloat32, false, false, 8, bufs);
  const auto args = run_args(p, bufs, count, DataType::kFloat32, RedOp::kSum, false, streams.get());
  ASSERT_TRUE(ex.run_and_wait(args).is_ok());  // eager: posted
  const uint64_t posts = device::resident_stats().posts;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(streams.get()[0], cudaStreamCaptureModeGlobal));
  const Status captured = ex.run(args);
  ASSERT_CUDA(cudaStreamEndCapture(streams.get()[0], &graph));
  ASSERT_TRUE(captured.is_ok()) << captured.message();
  EXPECT_EQ(device::resident_stats().posts, posts);
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 4; ++round) {
    refill_inputs(p, DataType::kFloat32, 80 + round, bufs);
    if (round % 2 == 0) {
      ASSERT_CUDA(cudaGraphLaunch(exec, streams.get()[0]));
      ASSERT_TRUE(ex.wait(args).is_ok());
    } else {
      ASSERT_TRUE(ex.run_and_wait(args).is_ok());
    }
    auto result = host::execute(p, host_options(args, kSmallSlotBytes), bufs.host);
    ASSERT_TRUE(result.status.is_ok()) << result.status.message();
    const std::string failure = compare(p, DataType::kFloat32, bufs);
    ASSERT_TRUE(failure.empty()) << "round " << round << ": " << failure;
  }
  EXPECT_EQ(device::resident_stats().posts, posts + 2);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(ResidentGrid, AbortStopsABlockedRunAndTheGridLeavesWithinASecond) {
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  if (visible_gpus(nullptr) > 1) GTEST_SKIP() << "the blocked program spreads over GPUs; uses GPU 0 only";
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    // Idle 500 ms (not 2 ms): the check below that the grid is still up after the abort must
    // not race the keeper, which stops a drained grid once nothing was posted for the idle time
    // (the post was over 100 ms before the abort; with 2 ms the check failed 2 runs in 3).
    ResidentOn resident(16, std::chrono::milliseconds(500));
    BlockedCall call;
    start_blocked_call(std::chrono::seconds(60), protocol, call);
    ASSERT_TRUE(call.executor);
    const uint64_t posts = device::resident_stats().posts;
    ASSERT_TRUE(call.executor->run(call.args).is_ok());
    EXPECT_EQ(device::resident_stats().posts, posts + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(cudaStreamQuery(call.streams->get()[0]), cudaErrorNotReady)
        << "the blocked run did not block its stream";
    const auto start = std::chrono::steady_clock::now();
    std::thread aborter([&] { call.executor->abort(); });
    const Status s = call.executor->wait(call.args);
    aborter.join();
    const auto aborted = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.message();
    EXPECT_LT(aborted, std::chrono::seconds(1)) << s.message();
    // The grid is still up (other executors may use it); stopping it (what the last release
    // does, also in ResidentOn's destructor) takes under a second.
    EXPECT_TRUE(device::resident_running(0));
    call.executor.reset();  // waits for its posted run, as a communicator's destruction does
    const auto stopping = std::chrono::steady_clock::now();
    const Status stopped = device::quiesce_resident(0);
    EXPECT_TRUE(stopped.is_ok()) << stopped.message();
    EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(1));
    EXPECT_FALSE(device::resident_running(0));
  }
}

TEST(ResidentGrid, TimeoutOfAPostedRunNamesTheThreadblock) {
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  if (visible_gpus(nullptr) > 1) GTEST_SKIP() << "the blocked program spreads over GPUs; uses GPU 0 only";
  ResidentOn resident(16);
  BlockedCall call;
  start_blocked_call(std::chrono::milliseconds(200), ef::Protocol::kLL128, call);
  ASSERT_TRUE(call.executor);
  const uint64_t posts = device::resident_stats().posts;
  const Status s = call.executor->run_and_wait(call.args);
  EXPECT_EQ(device::resident_stats().posts, posts + 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("threadblock 0 op 0 (recv) iteration 0"), std::string::npos)
      << s.message();
  // The grid took the failure in its stride: a healthy program runs on it next.
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const std::vector<int> devices = map_ranks(p.nranks, false);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  Streams streams((*executor)->devices());
  const std::string failure =
      run_and_compare(**executor, p, devices, streams, ef::count_granularity(p) * 64,
                      DataType::kFloat32, RedOp::kSum, false, false, 12, kSmallSlotBytes);
  EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(device::resident_stats().posts, posts + 2);
}

TEST(ResidentGrid, AnIdleGridLeavesSoThatDeviceSynchronizeReturns) {
  // cudaDeviceSynchronize (and cudaFree) wait for every kernel, the grid too: it leaves once
  // nothing is posted for `idle`, and comes back with the next post.
  SKIP_WITHOUT_GPU();
  SKIP_UNLESS_EAGER_LOADING();
  ResidentOn resident(64, std::chrono::milliseconds(2));
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kLL);
  const std::vector<int> devices = map_ranks(p.nranks, false);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  Streams streams((*executor)->devices());
  for (int round = 0; round < 3; ++round) {
    const uint64_t launches = device::resident_stats().grid_launches;
    const std::string failure =
        run_and_compare(**executor, p, devices, streams, ef::count_granularity(p) * 32,
                        DataType::kFloat32, RedOp::kSum, false, false, 20 + round, kSmallSlotBytes);
    ASSERT_TRUE(failure.empty()) << failure;
    EXPECT_EQ(device::resident_stats().grid_launches, launches + 1) << "round " << round;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_CUDA(cudaDeviceSynchronize());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
    EXPECT_FALSE(device::resident_running(0));
  }
}

TEST(ResidentGrid, IsOffWhileKernelsLoadLazily) {
  // Under lazy loading (CUDA's default) a kernel's first load may wait for every kernel of the
  // device, the grid included, which leaves only once the doorbells already enqueued have rung:
  // a program's first cudaMemsetAsync hung beside a running grid. So resident execution is off
  // there: nothing is posted, nothing reserved, every call launched and correct.
  SKIP_WITHOUT_GPU();
  if (device::resident_loading_allows())
    GTEST_SKIP() << "kernels load eagerly in this process (CUDA_MODULE_LOADING=EAGER): the "
                    "other ResidentGrid tests cover it; this one runs in the plain registration";
  ResidentOn resident(64);
  EXPECT_EQ(device::resident_capacity(0), 0u);
  const ef::Program& p = program_as(example("ring_allreduce_4r_2ch.json"), ef::Protocol::kSimple);
  const std::vector<int> devices = map_ranks(p.nranks, false);
  auto executor = small_slot_executor(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  Streams streams((*executor)->devices());
  const device::ResidentStats before = device::resident_stats();
  const uint64_t launches = device::interpreter_launch_count();
  const std::string failure =
      run_and_compare(**executor, p, devices, streams, ef::count_granularity(p) * 100,
                      DataType::kFloat32, RedOp::kSum, false, false, 5, kSmallSlotBytes);
  ASSERT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(device::interpreter_launch_count() - launches, 1u);
  EXPECT_EQ(device::resident_stats().posts, before.posts);
  EXPECT_EQ(device::resident_stats().grid_launches, before.grid_launches);
  EXPECT_FALSE(device::resident_running(0));
}

// ---- Sizes derived from the program ----

TEST(DeviceExecutor, ScratchThatOverflowsIsRefusedBeforeAnythingRuns) {
  // Validation refuses more than 2^24 chunks per buffer (10^12 scratch chunks are not a
  // program); at the limit, a call of 2^41 floats per chunk would need 2^24 * 2^43 bytes of
  // scratch: run(), reserve() and run_batch() refuse it, naming the rank and the buffer, and
  // launch nothing.
  SKIP_WITHOUT_GPU();
  ef::Program p = send_first_program();
  const std::vector<int> devices = map_ranks(2, true);
  p.ranks[0].scratch_chunks = 1'000'000'000'000;
  auto refused = device::DeviceExecutor::create(p, devices);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("scratch_chunks is 1000000000000"), std::string::npos)
      << refused.status().message();
  p.ranks[0].scratch_chunks = ef::kMaxChunks;
  auto executor = device::DeviceExecutor::create(p, devices);
  ASSERT_TRUE(executor.is_ok()) << executor.status().message();
  device::DeviceExecutor& ex = **executor;
  Streams streams(ex.devices());

  const uint64_t huge = uint64_t{1} << 41;
  const Status reserved = ex.reserve(huge, DataType::kFloat32);
  ASSERT_FALSE(reserved.is_ok());
  EXPECT_NE(reserved.message().find("rank 0: the program's scratch buffer of " +
                                    std::to_string(ef::kMaxChunks) + " chunks"),
            std::string::npos)
      << reserved.message();

  CallBuffers bufs;
  make_buffers(p, devices, 64, DataType::kFloat32, false, false, 60, bufs);
  device::RunArgs args = run_args(p, bufs, 64, DataType::kFloat32, RedOp::kSum, false,
                                  streams.get());
  args.count = huge;  // the buffers are never touched: the call is refused first
  const uint64_t before = device::interpreter_launch_count();
  const Status ran = ex.run(args);
  ASSERT_FALSE(ran.is_ok());
  EXPECT_NE(ran.message().find("overflows 64-bit sizes"), std::string::npos) << ran.message();
  const Status batched = device::DeviceExecutor::run_batch({{&ex, &args}});
  ASSERT_FALSE(batched.is_ok());
  EXPECT_NE(batched.message().find("overflows 64-bit sizes"), std::string::npos)
      << batched.message();
  EXPECT_EQ(device::interpreter_launch_count(), before);

  // Sizes that fit but cannot be allocated (2^24 chunks of 2^20 floats, 64 TiB): a clear error
  // too.
  args.count = uint64_t{1} << 20;
  const Status small = ex.run(args);
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.message().find("growing the scratch of rank 0"), std::string::npos)
      << small.message();
  EXPECT_EQ(device::interpreter_launch_count(), before);

  // The failed allocation leaves no error behind for the next launch to report as its own.
  const ef::Program healthy = send_first_program();
  auto other = device::DeviceExecutor::create(healthy, devices);
  ASSERT_TRUE(other.is_ok()) << other.status().message();
  CallBuffers other_bufs;
  make_buffers(healthy, devices, 64, DataType::kFloat32, false, false, 61, other_bufs);
  const device::RunArgs other_args = run_args(healthy, other_bufs, 64, DataType::kFloat32,
                                              RedOp::kSum, false, streams.get());
  const Status ok = (*other)->run_and_wait(other_args);
  ASSERT_TRUE(ok.is_ok()) << ok.message();
  auto result = host::execute(healthy, host_options(other_args, (*other)->slot_bytes()),
                              other_bufs.host);
  ASSERT_TRUE(result.status.is_ok()) << result.status.message();
  EXPECT_EQ(compare(healthy, DataType::kFloat32, other_bufs), "");
}

}  // namespace
}  // namespace efccl
