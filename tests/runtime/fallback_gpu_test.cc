// EFCCL_FALLBACK=nccl on GPUs, in MSCCL's mode (EFCCL_BUILTINS=0 and a user program for
// allreduce only): allreduce runs on efccl, allgather/broadcast/reducescatter/reduce on NCCL,
// call by call and all in one group, with exact integer results; communicators from a grouped
// ncclCommInitRank and from ncclCommSplit get their own NCCL communicators; without the fallback
// the uncovered call fails saying why; several ranks on one GPU have no fallback. Skips without
// the GPUs or without NVIDIA's libnccl.so.2 ($EFCCL_REAL_NCCL, or next to nccl.h).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/json_io.h"
#include "efccl/common/log.h"
#include "efccl/runtime/observer.h"
#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// MSCCL's mode while it lives: EFCCL_BUILTINS=0, a user ring allreduce for `nranks`, and the
/// fallback to `real` (or none); records selections and log lines.
class MscclMode {
 public:
  MscclMode(int nranks, const std::string& real, bool fallback) {
    dir_ = "/tmp/efccl_fallback_gpu_test_" + std::to_string(getpid());
    EXPECT_EQ(system(("mkdir -p " + dir_).c_str()), 0);
    algorithms::AlgorithmParams params;
    params.ranks = nranks;
    auto p = algorithms::generate_algorithm("ring_allreduce", params);
    EXPECT_TRUE(p) << p.status().message();
    p->name = "user_allreduce";
    file = dir_ + "/user_allreduce.json";
    std::ofstream(file) << ef::save_json(*p);
    setenv("EFCCL_BUILTINS", "0", 1);
    setenv("EFCCL_ALGO_FILES", file.c_str(), 1);
    setenv("EFCCL_FALLBACK", fallback ? "nccl" : "off", 1);
    setenv("EFCCL_NCCL_LIB", real.c_str(), 1);
    set_selection_observer([this](const SelectionRecord& r) {
      std::lock_guard<std::mutex> lock(mu_);
      selections_.push_back(r);
    });
    set_log_sink([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(line);
    });
  }
  ~MscclMode() {
    set_selection_observer(nullptr);
    set_log_sink(nullptr);
    for (const char* v : {"EFCCL_BUILTINS", "EFCCL_ALGO_FILES", "EFCCL_FALLBACK", "EFCCL_NCCL_LIB"})
      unsetenv(v);
    (void)system(("rm -rf " + dir_).c_str());
  }
  /// Whether a log line holds every one of `parts`.
  bool logged(std::initializer_list<std::string> parts) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& l : lines_) {
      bool all = true;
      for (const std::string& p : parts) all = all && contains(l, p);
      if (all) return true;
    }
    return false;
  }
  /// Whether `collective` was run by the user program.
  bool ran_user_program(const std::string& collective) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const SelectionRecord& r : selections_)
      if (r.collective == collective && !r.skipped && r.source == file) return true;
    return false;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    selections_.clear();
    lines_.clear();
  }
  std::string file;

 private:
  std::string dir_;
  std::mutex mu_;
  std::vector<SelectionRecord> selections_;
  std::vector<std::string> lines_;
};

/// The ranks of a communicator as one thread drives them: GPUs, communicators, streams.
struct RankSet {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  int n() const { return static_cast<int>(comms.size()); }
  static RankSet of(const TestClique& c) { return {c.devices, c.comms, c.streams}; }
  /// Waits for every stream and checks each communicator's asynchronous error (NCCL's too).
  void sync() const {
    for (std::size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(devices[r]);
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      ncclResult_t async = ncclSuccess;
      EXPECT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess) << ncclGetLastError(nullptr);
    }
  }
};

/// Rank r's element i of the input every collective reads: distinct integers.
int32_t value(int r, std::size_t i) { return r * 100000 + static_cast<int32_t>(i); }

/// Per-rank device buffers of the four collectives, `count` int32 per block.
struct Buffers {
  int n = 0;
  std::size_t count = 0;
  std::vector<int32_t*> send, allreduce, allgather, broadcast, reducescatter, reduce;

  Buffers(const RankSet& c, std::size_t count_) : n(c.n()), count(count_) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[static_cast<std::size_t>(r)]);
      std::vector<int32_t> h(count * static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(r, i);
      send.push_back(alloc(h));
      allreduce.push_back(alloc(std::vector<int32_t>(count, -1)));
      allgather.push_back(alloc(std::vector<int32_t>(count * static_cast<std::size_t>(n), -1)));
      broadcast.push_back(
          alloc(std::vector<int32_t>(h.begin(), h.begin() + static_cast<long>(count))));
      reducescatter.push_back(alloc(std::vector<int32_t>(count, -1)));
      reduce.push_back(alloc(std::vector<int32_t>(count, -1)));
    }
  }
  ~Buffers() {
    for (auto* list : {&send, &allreduce, &allgather, &broadcast, &reducescatter, &reduce})
      for (int32_t* p : *list) cudaFree(p);
  }
  static int32_t* alloc(const std::vector<int32_t>& h) {
    int32_t* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
    cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
    return d;
  }
  static std::vector<int32_t> download(const int32_t* d, std::size_t n) {
    std::vector<int32_t> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

  /// Checks every result exactly: allreduce sum, allgather, broadcast from `root`,
  /// reducescatter sum times `rs_scale` (a premulsum scalar), reduce max at `root`.
  void check(const RankSet& c, int root, int rs_scale) const {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[static_cast<std::size_t>(r)]);
      const auto ar = download(allreduce[static_cast<std::size_t>(r)], count);
      const auto ag =
          download(allgather[static_cast<std::size_t>(r)], count * static_cast<std::size_t>(n));
      const auto bc = download(broadcast[static_cast<std::size_t>(r)], count);
      const auto rs = download(reducescatter[static_cast<std::size_t>(r)], count);
      const auto rd = download(reduce[static_cast<std::size_t>(r)], count);
      int wrong = 0;
      for (std::size_t i = 0; i < count && wrong < 5; ++i) {
        int32_t sum = 0, rs_sum = 0;
        for (int q = 0; q < n; ++q) {
          sum += value(q, i);
          rs_sum += value(q, static_cast<std::size_t>(r) * count + i);
        }
        const auto expect = [&](bool ok, const char* what, int32_t got, int32_t want) {
          if (ok) return;
          ++wrong;
          ADD_FAILURE() << what << " rank " << r << " [" << i << "] = " << got << ", expected "
                        << want;
        };
        expect(ar[i] == sum, "allreduce", ar[i], sum);
        for (int q = 0; q < n; ++q) {
          const int32_t g = ag[static_cast<std::size_t>(q) * count + i];
          expect(g == value(q, i), "allgather", g, value(q, i));
        }
        expect(bc[i] == value(root, i), "broadcast", bc[i], value(root, i));
        expect(rs[i] == rs_scale * rs_sum, "reducescatter", rs[i], rs_scale * rs_sum);
        if (r == root) expect(rd[i] == value(n - 1, i), "reduce max", rd[i], value(n - 1, i));
      }
    }
  }
};

/// The collectives of every rank, each in a group of its own (one thread drives every rank,
/// as NCCL asks), or all in one group.
void run_collectives(const RankSet& c, Buffers& b, int root, bool one_group, ncclRedOp_t rs_op,
                     ncclRedOp_t* per_rank_rs_ops = nullptr) {
  const auto each = [&](auto&& call) {
    if (!one_group) {
      NCCL_OK(ncclGroupStart());
    }
    for (int r = 0; r < c.n(); ++r)
      call(r, c.comms[static_cast<std::size_t>(r)], c.streams[static_cast<std::size_t>(r)]);
    if (!one_group) {
      NCCL_OK(ncclGroupEnd());
    }
  };
  if (one_group) {
    NCCL_OK(ncclGroupStart());
  }
  each([&](int r, ncclComm_t comm, cudaStream_t s) {
    NCCL_OK(ncclAllReduce(b.send[r], b.allreduce[r], b.count, ncclInt32, ncclSum, comm, s));
  });
  each([&](int r, ncclComm_t comm, cudaStream_t s) {
    NCCL_OK(ncclAllGather(b.send[r], b.allgather[r], b.count, ncclInt32, comm, s));
  });
  each([&](int r, ncclComm_t comm, cudaStream_t s) {
    NCCL_OK(ncclBroadcast(b.broadcast[r], b.broadcast[r], b.count, ncclInt32, root, comm, s));
  });
  each([&](int r, ncclComm_t comm, cudaStream_t s) {
    NCCL_OK(ncclReduceScatter(b.send[r], b.reducescatter[r], b.count, ncclInt32,
                              per_rank_rs_ops != nullptr ? per_rank_rs_ops[r] : rs_op, comm, s));
  });
  each([&](int r, ncclComm_t comm, cudaStream_t s) {
    NCCL_OK(ncclReduce(b.send[r], b.reduce[r], b.count, ncclInt32, ncclMax, root, comm, s));
  });
  if (one_group) {
    NCCL_OK(ncclGroupEnd());
  }
  c.sync();
}

void expect_routed(MscclMode& mode) {
  EXPECT_TRUE(mode.ran_user_program("allreduce")) << "allreduce must run the user program";
  for (const char* api : {"ncclAllGather(", "ncclBroadcast(", "ncclReduceScatter(", "ncclReduce("})
    EXPECT_TRUE(
        mode.logged({api, "no program covers it", "EFCCL_BUILTINS=0", "running it on NCCL 2."}))
        << api << " must be logged as run on NCCL";
  EXPECT_FALSE(mode.logged({"ncclAllReduce(", "no program covers it"}));
}

TEST(FallbackGpu, CoveredCallsRunOnEfcclTheRestOnNccl) {
  EFCCL_REQUIRE_GPUS(2);
  EFCCL_REQUIRE_REAL_NCCL(real);
  MscclMode mode(2, real, true);
  TestClique clique({0, 1});
  const RankSet c = RankSet::of(clique);
  ASSERT_TRUE(mode.logged(
      {"EFCCL_FALLBACK=nccl: NCCL communicators of rank(s) 0, 1 (of 2) created on NCCL"}));
  for (const std::size_t count : {std::size_t{4096}, std::size_t{1} << 20}) {
    mode.clear();
    Buffers b(c, count);
    run_collectives(c, b, /*root=*/1, /*one_group=*/false, ncclSum);
    b.check(c, 1, 1);
    expect_routed(mode);
  }
}

TEST(FallbackGpu, OneGroupMixesEfcclAndNcclCalls) {
  EFCCL_REQUIRE_GPUS(2);
  EFCCL_REQUIRE_REAL_NCCL(real);
  MscclMode mode(2, real, true);
  TestClique clique({0, 1});
  const RankSet c = RankSet::of(clique);
  Buffers b(c, 6144);
  // A premulsum reducescatter too: NCCL gets an operator of its own with each rank's scalar.
  ncclRedOp_t ops[2];
  int32_t three = 3;
  for (int r = 0; r < 2; ++r)
    NCCL_OK(
        ncclRedOpCreatePreMulSum(&ops[r], &three, ncclInt32, ncclScalarHostImmediate, c.comms[r]));
  run_collectives(c, b, /*root=*/0, /*one_group=*/true, ncclSum, ops);
  b.check(c, 0, 3);
  expect_routed(mode);
  for (int r = 0; r < 2; ++r) NCCL_OK(ncclRedOpDestroy(ops[r], c.comms[r]));
}

TEST(FallbackGpu, WithoutItTheUncoveredCallFailsSayingWhy) {
  EFCCL_REQUIRE_GPUS(2);
  EFCCL_REQUIRE_REAL_NCCL(real);
  MscclMode mode(2, real, /*fallback=*/false);
  TestClique clique({0, 1});
  const RankSet c = RankSet::of(clique);
  Buffers b(c, 4096);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(b.send[r], b.allreduce[r], b.count, ncclInt32, ncclSum, c.comms[r],
                          c.streams[r]));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllGather(b.send[r], b.allgather[r], b.count, ncclInt32, c.comms[r], c.streams[r]));
  EXPECT_EQ(ncclGroupEnd(), ncclInternalError);
  const std::string error = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(error, "ncclAllGather: no user program covers allgather count 4096 int32"))
      << error;
  EXPECT_TRUE(contains(error, "the built-in algorithms are disabled (EFCCL_BUILTINS=0)")) << error;
  c.sync();
  EXPECT_TRUE(mode.ran_user_program("allreduce"));
  EXPECT_FALSE(mode.logged({"running it on NCCL"}));
  const auto ar = Buffers::download(b.allreduce[0], 4);
  EXPECT_EQ(ar[3], value(0, 3) + value(1, 3));
}

TEST(FallbackGpu, SeveralRanksOnOneGpuHaveNone) {
  EFCCL_REQUIRE_GPUS(1);
  EFCCL_REQUIRE_REAL_NCCL(real);
  MscclMode mode(2, real, true);
  TestClique clique({0, 0});
  const RankSet c = RankSet::of(clique);
  EXPECT_TRUE(
      mode.logged({"EFCCL WARN", "has no NCCL fallback: ranks 0 and 1 share CUDA device 0"}));
  Buffers b(c, 4096);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllReduce(b.send[r], b.allreduce[r], b.count, ncclInt32, ncclSum, c.comms[r],
                          c.streams[r]));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r)
    NCCL_OK(ncclAllGather(b.send[r], b.allgather[r], b.count, ncclInt32, c.comms[r], c.streams[r]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  const std::string error = ncclGetLastError(nullptr);
  EXPECT_TRUE(contains(error,
                       "EFCCL_FALLBACK=nccl cannot run it on this communicator: ranks 0 and 1 "
                       "share CUDA device 0"))
      << error;
  c.sync();
  const auto ar = Buffers::download(b.allreduce[1], 4);
  EXPECT_EQ(ar[2], value(0, 2) + value(1, 2));
}

TEST(FallbackGpu, InitRankAndSplitCommunicatorsGetTheirOwn) {
  EFCCL_REQUIRE_GPUS(2);
  EFCCL_REQUIRE_REAL_NCCL(real);
  MscclMode mode(2, real, true);
  // ncclCommInitRank for both ranks from one thread, in a group.
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::vector<ncclComm_t> comms(2, nullptr);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < 2; ++r) {
    CUDA_OK(cudaSetDevice(r));
    NCCL_OK(ncclCommInitRank(&comms[r], 2, id, r));
  }
  NCCL_OK(ncclGroupEnd());
  // Split (one thread per rank, as efccl asks): the same two ranks, in reverse order.
  std::vector<ncclComm_t> children(2, nullptr);
  std::vector<ncclResult_t> split(2, ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      split[r] = ncclCommSplit(comms[r], 0, 1 - r, &children[r], nullptr);
    });
  for (auto& t : threads) t.join();
  ASSERT_EQ(split[0], ncclSuccess);
  ASSERT_EQ(split[1], ncclSuccess);
  int child_rank = -1;
  NCCL_OK(ncclCommUserRank(children[0], &child_rank));
  EXPECT_EQ(child_rank, 1);

  // The parents, then the children by child rank (child 0 is parent rank 1, on GPU 1).
  for (const bool child : {false, true}) {
    mode.clear();
    RankSet c;
    c.devices = child ? std::vector<int>{1, 0} : std::vector<int>{0, 1};
    c.comms = child ? std::vector<ncclComm_t>{children[1], children[0]} : comms;
    for (int d : c.devices) {
      cudaSetDevice(d);
      cudaStream_t s = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      c.streams.push_back(s);
    }
    {
      Buffers b(c, 8192);
      run_collectives(c, b, 1, false, ncclSum);
      b.check(c, 1, 1);
    }
    expect_routed(mode);
    for (std::size_t r = 0; r < 2; ++r) {
      cudaSetDevice(c.devices[r]);
      cudaStreamDestroy(c.streams[r]);
    }
  }
  for (ncclComm_t comm : children) NCCL_OK(ncclCommFinalize(comm));
  for (ncclComm_t comm : children) NCCL_OK(ncclCommDestroy(comm));
  for (ncclComm_t comm : comms) NCCL_OK(ncclCommDestroy(comm));
}

}  // namespace
}  // namespace efccl::runtime::testing
