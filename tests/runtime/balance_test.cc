// The balancer on GPUs (docs/balancer.md, "In the runtime"): ranks sharing one GPU plan as if on
// another machine (EFCCL_BALANCE_TOPOLOGY) and run balanced programs — relays as forwards
// through ranks taking part or as slot devices, the host path through real pinned memory —
// bit-exactly, for all-to-all-v with skewed uneven splits (grouped ncclSend/ncclRecv at
// arbitrary offsets of one buffer), batch_isend_irecv-like groups, ncclAlltoAll and a lone
// pair, eagerly and under CUDA-graph capture, in one process (ncclCommInitAll with the device
// repeated) and across two processes. The statistics file (EFCCL_BALANCE_STATS) says which
// paths ran: each test asserts that multi-path plans did.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::string temp_path(const std::string& what) {
  static int n = 0;
  return "/tmp/efccl-balance-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + "-" +
         what + ".json";
}

/// The plans of every communicator written to `path` (one JSON object per line).
std::vector<nlohmann::json> stats_of(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// The path names ("via") of every multi-path transfer in `stats`, and how often plans ran.
struct Seen {
  std::set<std::string> vias;
  std::size_t multi_path = 0, runs = 0, measured = 0, captured = 0;
  std::set<std::string> kinds;
};
Seen seen_in(const std::vector<nlohmann::json>& stats) {
  Seen s;
  for (const nlohmann::json& comm : stats)
    for (const nlohmann::json& plan : comm["plans"]) {
      s.runs += plan["runs"].get<std::size_t>();
      s.measured += plan["measured_runs"].get<std::size_t>();
      s.captured += plan["captured_runs"].get<std::size_t>();
      s.kinds.insert(plan["kind"].get<std::string>());
      for (const nlohmann::json& pair : plan["pairs"]) {
        std::size_t paths = 0;
        for (const nlohmann::json& p : pair["paths"])
          if (p["channels"].get<int>() > 0) {
            ++paths;
            s.vias.insert(p["via"].get<std::string>());
          }
        if (paths > 1) ++s.multi_path;
      }
    }
  return s;
}

bool any_via(const Seen& s, const std::string& part) {
  for (const std::string& v : s.vias)
    if (v.find(part) != std::string::npos) return true;
  return false;
}

/// The environment of a balanced test: a simulated topology, a low threshold, a stats file.
struct BalanceEnv {
  std::string stats = temp_path("stats");
  ScopedEnv topology, min_bytes, file;
  explicit BalanceEnv(const char* preset)
      : topology("EFCCL_BALANCE_TOPOLOGY", preset),
        min_bytes("EFCCL_BALANCE_MIN_BYTES", "65536"),
        file("EFCCL_BALANCE_STATS", stats.c_str()) {
    std::remove(stats.c_str());
  }
  ~BalanceEnv() { std::remove(stats.c_str()); }
};

/// Elements rank s sends rank d in the skewed all-to-all-v: uneven, odd, one hot pair.
std::size_t skewed_count(int s, int d, int n) {
  if (s == d) return 1000 + 17 * static_cast<std::size_t>(s);
  if (s == 0 && d == 1 % n) return 3 * kMiB / 4 + 13;  // ~3 MiB of int32: the hotspot
  return 40000 + 9973 * static_cast<std::size_t>((s * 3 + d) % 5) + static_cast<std::size_t>(d);
}

/// Set by the one-process tests: CUDA is then initialised in this process, and children forked
/// from it cannot use CUDA (the multi-process test needs a process of its own, as ctest runs it).
bool cuda_used_here = false;

int32_t value(int s, int d, std::size_t i) {
  return static_cast<int32_t>((s * 131 + d * 7919) * 1000003u + i * 2654435761u);
}

/// Device buffers of one rank: its sends concatenated (by destination) and its receives (by
/// source), at the offsets all_to_all_single with uneven splits uses.
struct AllToAllV {
  int n = 0;
  std::vector<std::vector<std::size_t>> count, send_off, recv_off;  // [s][d]
  std::vector<int32_t*> send, recv;
  std::vector<std::size_t> send_total, recv_total;

  AllToAllV(TestClique& c, const std::function<std::size_t(int, int)>& counts) : n(c.n()) {
    count.assign(n, std::vector<std::size_t>(n));
    send_off = recv_off = count;
    send_total.assign(n, 0);
    recv_total.assign(n, 0);
    for (int s = 0; s < n; ++s)
      for (int d = 0; d < n; ++d) count[s][d] = counts(s, d);
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) {
        send_off[r][q] = send_total[r];
        send_total[r] += count[r][q];
        recv_off[q][r] = recv_total[r];
        recv_total[r] += count[q][r];
      }
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      int32_t* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, send_total[r] * 4), cudaSuccess);
      send.push_back(p);
      EXPECT_EQ(cudaMalloc(&p, recv_total[r] * 4), cudaSuccess);
      recv.push_back(p);
      std::vector<int32_t> h(send_total[r]);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count[r][q]; ++i) h[send_off[r][q] + i] = value(r, q, i);
      EXPECT_EQ(cudaMemcpy(send[r], h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    clear();
  }
  ~AllToAllV() {
    for (int32_t* p : send) cudaFree(p);
    for (int32_t* p : recv) cudaFree(p);
  }
  void clear() {
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(cudaMemset(recv[r], 0xff, recv_total[r] * 4), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  /// The group, as PyTorch's all_to_all_single with splits issues it.
  void enqueue(TestClique& c) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) {
        ASSERT_EQ(
            ncclSend(send[r] + send_off[r][q], count[r][q], ncclInt32, q, c.comms[r], c.streams[r]),
            ncclSuccess);
        ASSERT_EQ(
            ncclRecv(recv[r] + recv_off[q][r], count[q][r], ncclInt32, q, c.comms[r], c.streams[r]),
            ncclSuccess);
      }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void expect_received(TestClique& c, const std::string& what) {
    c.sync();
    for (int r = 0; r < n; ++r) {
      std::vector<int32_t> h(recv_total[r]);
      cudaSetDevice(c.devices[r]);
      ASSERT_EQ(cudaMemcpy(h.data(), recv[r], h.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count[q][r]; ++i)
          ASSERT_EQ(h[recv_off[q][r] + i], value(q, r, i))
              << what << ": rank " << r << " from rank " << q << " element " << i << " of "
              << count[q][r];
    }
  }
};

/// Captures `enqueue` into one graph over every stream of `c` (forked from rank 0's).
cudaGraphExec_t capture(TestClique& c, const std::function<void()>& enqueue) {
  const int n = c.n();
  std::vector<cudaEvent_t> fork(n), join(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(c.devices[r]);
    cudaEventCreateWithFlags(&fork[r], cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join[r], cudaEventDisableTiming);
  }
  cudaSetDevice(c.devices[0]);
  EXPECT_EQ(cudaStreamBeginCapture(c.streams[0], cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaEventRecord(fork[0], c.streams[0]);
  for (int r = 1; r < n; ++r) cudaStreamWaitEvent(c.streams[r], fork[0], 0);
  enqueue();
  for (int r = 1; r < n; ++r) {
    cudaEventRecord(join[r], c.streams[r]);
    cudaStreamWaitEvent(c.streams[0], join[r], 0);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(c.streams[0], &graph), cudaSuccess);
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  for (int r = 0; r < n; ++r) {
    cudaEventDestroy(fork[r]);
    cudaEventDestroy(join[r]);
  }
  return exec;
}

/// Eagerly three times, then captured and replayed twice; every run checked.
void run_eager_and_captured(TestClique& c, AllToAllV& a, const std::string& what) {
  for (int i = 0; i < 3; ++i) {
    a.clear();
    a.enqueue(c);
    a.expect_received(c, what + ", eager run " + std::to_string(i));
  }
  a.clear();
  cudaGraphExec_t exec = capture(c, [&] { a.enqueue(c); });
  ASSERT_NE(exec, nullptr);
  for (int i = 0; i < 2; ++i) {
    a.clear();
    cudaSetDevice(c.devices[0]);
    ASSERT_EQ(cudaGraphLaunch(exec, c.streams[0]), cudaSuccess);
    a.expect_received(c, what + ", graph replay " + std::to_string(i));
  }
  cudaGraphExecDestroy(exec);
}

TEST(Balance, SkewedAllToAllVInOneProcess) {
  EFCCL_REQUIRE_GPUS(1);
  cuda_used_here = true;
  struct Case {
    const char* preset;
    int n;
    const char* relay;  // the relay kind the plan must use ("" none)
  };
  for (const Case& k :
       {Case{"preset:nimble-h100", 2, "no kernel there"},
        Case{"preset:nimble-h100", 4, "forwarded by rank"}, Case{"preset:h200-nv18-x2", 4, ""}}) {
    SCOPED_TRACE(std::string(k.preset) + ", " + std::to_string(k.n) + " ranks on GPU 0");
    BalanceEnv env(k.preset);
    {
      TestClique c(std::vector<int>(static_cast<std::size_t>(k.n), 0));
      AllToAllV a(c, [&](int s, int d) { return skewed_count(s, d, k.n); });
      run_eager_and_captured(c, a, "all-to-all-v");
    }
    const Seen s = seen_in(stats_of(env.stats));
    EXPECT_GT(s.multi_path, 0u) << "no multi-path plan ran";
    EXPECT_TRUE(any_via(s, "host memory"));
    if (*k.relay != 0) {
      EXPECT_TRUE(any_via(s, k.relay)) << k.relay;
    }
    EXPECT_GE(s.runs, 4u);
    EXPECT_GE(s.measured, 1u) << "eager runs are timed";
    EXPECT_GE(s.captured, 1u);
  }
}

TEST(Balance, BatchIsendIrecvLikeGroupInOneProcess) {
  // Each rank sends two tensors (separate buffers, different sizes) to its next and previous
  // rank and receives two: torch.distributed.batch_isend_irecv's pattern.
  EFCCL_REQUIRE_GPUS(1);
  cuda_used_here = true;
  BalanceEnv env("preset:nimble-h100");
  {
    const int n = 4;
    TestClique c(std::vector<int>(n, 0));
    const auto size = [](int s, int d) { return 300000 + 4099 * static_cast<std::size_t>(s) + d; };
    std::vector<int32_t*> to_next(n), to_prev(n), from_prev(n), from_next(n);
    for (int r = 0; r < n; ++r) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      for (auto [p, s, d] : {std::tuple{&to_next[r], r, next}, std::tuple{&to_prev[r], r, prev}}) {
        cudaMalloc(p, size(s, d) * 4);
        std::vector<int32_t> h(size(s, d));
        for (std::size_t i = 0; i < h.size(); ++i) h[i] = value(s, d, i);
        cudaMemcpy(*p, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
      }
      cudaMalloc(&from_prev[r], size(prev, r) * 4);
      cudaMalloc(&from_next[r], size(next, r) * 4);
    }
    const auto enqueue = [&] {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        NCCL_OK(ncclSend(to_next[r], size(r, next), ncclInt32, next, c.comms[r], c.streams[r]));
        NCCL_OK(ncclRecv(from_prev[r], size(prev, r), ncclInt32, prev, c.comms[r], c.streams[r]));
        NCCL_OK(ncclSend(to_prev[r], size(r, prev), ncclInt32, prev, c.comms[r], c.streams[r]));
        NCCL_OK(ncclRecv(from_next[r], size(next, r), ncclInt32, next, c.comms[r], c.streams[r]));
      }
      NCCL_OK(ncclGroupEnd());
    };
    const auto check = [&](const std::string& what) {
      c.sync();
      for (int r = 0; r < n; ++r) {
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        for (auto [p, s] : {std::pair{from_prev[r], prev}, std::pair{from_next[r], next}}) {
          std::vector<int32_t> h(size(s, r));
          cudaMemcpy(h.data(), p, h.size() * 4, cudaMemcpyDeviceToHost);
          for (std::size_t i = 0; i < h.size(); ++i)
            ASSERT_EQ(h[i], value(s, r, i))
                << what << ": rank " << r << " from " << s << " element " << i;
          cudaMemset(p, 0, h.size() * 4);
        }
      }
      cudaDeviceSynchronize();
    };
    for (int round = 0; round < 2; ++round) {
      enqueue();
      check("eager round " + std::to_string(round));
    }
    cudaGraphExec_t exec = capture(c, enqueue);
    ASSERT_NE(exec, nullptr);
    for (int replay = 0; replay < 2; ++replay) {
      cudaSetDevice(c.devices[0]);
      ASSERT_EQ(cudaGraphLaunch(exec, c.streams[0]), cudaSuccess);
      check("graph replay " + std::to_string(replay));
    }
    cudaGraphExecDestroy(exec);
    for (auto* v : {&to_next, &to_prev, &from_prev, &from_next})
      for (int32_t* p : *v) cudaFree(p);
  }
  const Seen s = seen_in(stats_of(env.stats));
  EXPECT_GT(s.multi_path, 0u);
  EXPECT_TRUE(any_via(s, "host memory"));
}

TEST(Balance, AllToAllAndLonePairInOneProcess) {
  EFCCL_REQUIRE_GPUS(1);
  cuda_used_here = true;
  // Uniform all-to-all: forced over every candidate so that relays are used too.
  BalanceEnv env("preset:nimble-h100");
  ScopedEnv force("EFCCL_BALANCE_FORCE", "spread");
  {
    const int n = 4;
    TestClique c(std::vector<int>(n, 0));
    const std::size_t count = 262144 + 77;  // per pair: ~1 MiB of int32, not whole chunks
    std::vector<int32_t*> in(n), out(n);
    for (int r = 0; r < n; ++r) {
      cudaMalloc(&in[r], count * n * 4);
      cudaMalloc(&out[r], count * n * 4);
      std::vector<int32_t> h(count * n);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) h[q * count + i] = value(r, q, i);
      cudaMemcpy(in[r], h.data(), h.size() * 4, cudaMemcpyHostToDevice);
    }
    const auto run = [&] {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < n; ++r)
        NCCL_OK(ncclAlltoAll(in[r], out[r], count, ncclInt32, c.comms[r], c.streams[r]));
      NCCL_OK(ncclGroupEnd());
    };
    const auto check = [&](const std::string& what) {
      c.sync();
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> h(count * n);
        cudaMemcpy(h.data(), out[r], h.size() * 4, cudaMemcpyDeviceToHost);
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < count; ++i)
            ASSERT_EQ(h[q * count + i], value(q, r, i)) << what << ": rank " << r << " from " << q;
        cudaMemset(out[r], 0, count * n * 4);
      }
      cudaDeviceSynchronize();
    };
    run();
    check("ncclAlltoAll");
    cudaGraphExec_t exec = capture(c, run);
    ASSERT_NE(exec, nullptr);
    cudaGraphLaunch(exec, c.streams[0]);
    check("ncclAlltoAll, graph replay");
    cudaGraphExecDestroy(exec);

    // A lone pair 0 -> 2 (ranks 1 and 3 idle: relays through their GPUs are slot devices),
    // eagerly and captured.
    // 5 MiB + 12 bytes: buffers of their own (the all-to-all's hold 4 MiB + 1232 bytes).
    const std::size_t pair = 5 * kMiB / 4 + 3;
    int32_t* lone_in = nullptr;
    int32_t* lone_out = nullptr;
    ASSERT_EQ(cudaMalloc(&lone_in, pair * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lone_out, pair * 4), cudaSuccess);
    {
      std::vector<int32_t> h(pair);
      for (std::size_t i = 0; i < pair; ++i) h[i] = value(0, 2, i);
      ASSERT_EQ(cudaMemcpy(lone_in, h.data(), pair * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    const auto lone = [&] {
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclSend(lone_in, pair, ncclInt32, 2, c.comms[0], c.streams[0]));
      NCCL_OK(ncclRecv(lone_out, pair, ncclInt32, 0, c.comms[2], c.streams[2]));
      NCCL_OK(ncclGroupEnd());
    };
    const auto check_lone = [&](const std::string& what) {
      c.sync();
      std::vector<int32_t> h(pair), want(pair);
      cudaMemcpy(h.data(), lone_out, pair * 4, cudaMemcpyDeviceToHost);
      for (std::size_t i = 0; i < pair; ++i) want[i] = value(0, 2, i);
      ASSERT_EQ(h, want) << what;
      cudaMemset(lone_out, 0, pair * 4);
      cudaDeviceSynchronize();
    };
    for (int i = 0; i < 2; ++i) {
      lone();
      check_lone("lone pair, run " + std::to_string(i));
    }
    cudaGraphExec_t lone_exec = capture(c, lone);
    ASSERT_NE(lone_exec, nullptr);
    cudaGraphLaunch(lone_exec, c.streams[0]);
    check_lone("lone pair, graph replay");
    cudaGraphExecDestroy(lone_exec);
    cudaFree(lone_in);
    cudaFree(lone_out);
    for (int r = 0; r < n; ++r) {
      cudaFree(in[r]);
      cudaFree(out[r]);
    }
  }
  const Seen s = seen_in(stats_of(env.stats));
  EXPECT_TRUE(s.kinds.contains("alltoall"));
  EXPECT_TRUE(s.kinds.contains("p2p"));
  EXPECT_TRUE(any_via(s, "host memory"));
  EXPECT_TRUE(any_via(s, "forwarded by rank"));
  EXPECT_TRUE(any_via(s, "no kernel there"));
}

TEST(Balance, OffRunsTheSameGroupsWithoutPlans) {
  EFCCL_REQUIRE_GPUS(1);
  cuda_used_here = true;
  BalanceEnv env("preset:nimble-h100");
  ScopedEnv off("EFCCL_BALANCE", "0");
  {
    TestClique c(std::vector<int>(2, 0));
    AllToAllV a(c, [](int s, int d) { return skewed_count(s, d, 2); });
    a.enqueue(c);
    a.expect_received(c, "EFCCL_BALANCE=0");
  }
  EXPECT_TRUE(stats_of(env.stats).empty()) << "no balancer, no statistics";
}

// ---- across processes -------------------------------------------------------------------------

constexpr int kSkip = 77;

/// Forks `n` processes running `body(rank, id)`; their exit statuses (-signal if killed).
std::vector<int> run_processes(int n, const std::function<int(int, const ncclUniqueId&)>& body,
                               int timeout_s) {
  std::vector<int> fds(2 * n);
  for (int p = 0; p < n; ++p)
    if (pipe(&fds[2 * p]) != 0) return {};
  std::vector<pid_t> pids;
  for (int p = 0; p < n; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      ncclUniqueId id;
      if (p == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(1);
        for (int q = 1; q < n; ++q)
          if (write(fds[2 * q + 1], &id, sizeof(id)) != sizeof(id)) _exit(1);
      } else if (read(fds[2 * p], &id, sizeof(id)) != sizeof(id)) {
        _exit(1);
      }
      const int status = body(p, id);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  for (int fd : fds) close(fd);
  std::vector<int> status(n, -1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (int left = n; left > 0;) {
    for (int p = 0; p < n; ++p) {
      int ws = 0;
      if (status[p] == -1000 && waitpid(pids[p], &ws, WNOHANG) == pids[p]) {
        status[p] = WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int p = 0; p < n; ++p)
        if (status[p] == -1000) {
          kill(pids[p], SIGKILL);
          waitpid(pids[p], nullptr, 0);
          status[p] = -SIGKILL;
        }
      ADD_FAILURE() << "the processes did not finish within " << timeout_s << " s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

#define CHILD_CHECK(cond, what)                                                               \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "[rank %d] %s:%d: %s failed: %s (%s)\n", rank, __FILE__, __LINE__, \
                   #cond, std::string(what).c_str(), ncclGetLastError(nullptr));              \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

/// One rank of the two-process test: a lone pair, the skewed all-to-all-v as a group, an
/// ncclAlltoAll and the lone pair captured in a graph, every result checked.
int two_process_rank(int rank, const ncclUniqueId& id) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) return kSkip;
  const int n = 2, peer = 1 - rank;
  CHILD_CHECK(cudaSetDevice(rank % gpus) == cudaSuccess, "cudaSetDevice");
  ncclComm_t comm = nullptr;
  CHILD_CHECK(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess, "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const auto check = [&](const int32_t* got, int from, std::size_t count, std::size_t offset,
                         const char* what) -> bool {
    std::vector<int32_t> h(count);
    cudaMemcpy(h.data(), got, count * 4, cudaMemcpyDeviceToHost);
    for (std::size_t i = 0; i < count; ++i)
      if (h[i] != value(from, rank, i + offset)) {
        std::fprintf(stderr, "[rank %d] %s: element %zu from rank %d is %d, expected %d\n", rank,
                     what, i, from, h[i], value(from, rank, i + offset));
        return false;
      }
    return true;
  };
  // All-to-all-v, skewed: counts as in the one-process test; one buffer per direction.
  std::vector<std::size_t> send_off(n + 1), recv_off(n + 1);
  for (int q = 0; q < n; ++q) {
    send_off[q + 1] = send_off[q] + skewed_count(rank, q, n);
    recv_off[q + 1] = recv_off[q] + skewed_count(q, rank, n);
  }
  int32_t *send = nullptr, *recv = nullptr;
  CHILD_CHECK(cudaMalloc(&send, send_off[n] * 4) == cudaSuccess, "cudaMalloc");
  CHILD_CHECK(cudaMalloc(&recv, recv_off[n] * 4) == cudaSuccess, "cudaMalloc");
  std::vector<int32_t> h(send_off[n]);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < skewed_count(rank, q, n); ++i)
      h[send_off[q] + i] = value(rank, q, i);
  cudaMemcpy(send, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  const auto alltoallv = [&] {
    ncclGroupStart();
    for (int q = 0; q < n; ++q) {
      ncclSend(send + send_off[q], skewed_count(rank, q, n), ncclInt32, q, comm, stream);
      ncclRecv(recv + recv_off[q], skewed_count(q, rank, n), ncclInt32, q, comm, stream);
    }
    return ncclGroupEnd();
  };
  for (int i = 0; i < 3; ++i) {
    cudaMemset(recv, 0xff, recv_off[n] * 4);
    cudaDeviceSynchronize();
    CHILD_CHECK(alltoallv() == ncclSuccess, "all-to-all-v");
    CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
    for (int q = 0; q < n; ++q)
      CHILD_CHECK(check(recv + recv_off[q], q, skewed_count(q, rank, n), 0, "all-to-all-v"),
                  "all-to-all-v result");
  }
  // ncclAlltoAll of ~1 MiB a pair (forced over every candidate: see the environment).
  const std::size_t count = 262144 + 77;
  int32_t *in = nullptr, *out = nullptr;
  CHILD_CHECK(cudaMalloc(&in, count * n * 4) == cudaSuccess, "cudaMalloc");
  CHILD_CHECK(cudaMalloc(&out, count * n * 4) == cudaSuccess, "cudaMalloc");
  std::vector<int32_t> hin(count * n);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < count; ++i) hin[q * count + i] = value(rank, q, i);
  cudaMemcpy(in, hin.data(), hin.size() * 4, cudaMemcpyHostToDevice);
  CHILD_CHECK(ncclAlltoAll(in, out, count, ncclInt32, comm, stream) == ncclSuccess, "alltoall");
  CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "sync");
  for (int q = 0; q < n; ++q)
    CHILD_CHECK(check(out + q * count, q, count, 0, "ncclAlltoAll"), "alltoall result");
  // The lone pair 0 -> 1 of the all-to-all-v's hot size, captured and replayed.
  const std::size_t hot = skewed_count(0, 1, n);
  const auto lone = [&] {
    return rank == 0 ? ncclSend(send + send_off[1], hot, ncclInt32, 1, comm, stream)
                     : ncclRecv(recv, hot, ncclInt32, 0, comm, stream);
  };
  CHILD_CHECK(lone() == ncclSuccess, "lone pair");
  cudaStreamSynchronize(stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHILD_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess,
              "capture");
  CHILD_CHECK(lone() == ncclSuccess, "captured lone pair");
  CHILD_CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess, "end capture");
  CHILD_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
  for (int i = 0; i < 2; ++i) {
    if (rank == 1) cudaMemset(recv, 0, hot * 4);
    cudaDeviceSynchronize();
    CHILD_CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess, "replay");
    CHILD_CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "replay sync");
    if (rank == 1) CHILD_CHECK(check(recv, 0, hot, 0, "lone pair replay"), "replay result");
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  CHILD_CHECK(async == ncclSuccess, "async error");
  CHILD_CHECK(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  (void)peer;
  return 0;
}

// Forks before this process touches CUDA (a forked child cannot use its parent's CUDA): run it
// in a process of its own (ctest does; by hand: --gtest_filter=Balance.TwoProcesses*).
TEST(Balance, TwoProcessesPlanPairLocally) {
  if (cuda_used_here)
    GTEST_SKIP() << "an earlier test of this process initialised CUDA, which processes forked "
                    "from it cannot use: run this test in a process of its own "
                    "(--gtest_filter=Balance.TwoProcessesPlanPairLocally; ctest does)";
  BalanceEnv env("preset:nimble-h100");
  ScopedEnv force("EFCCL_BALANCE_FORCE", "spread");
  const std::string stats = env.stats.substr(0, env.stats.size() - 5) + "-%p.json";
  ScopedEnv file("EFCCL_BALANCE_STATS", stats.c_str());
  const std::vector<int> status = run_processes(2, two_process_rank, 300);
  ASSERT_EQ(status.size(), 2u);
  if (status[0] == kSkip || status[1] == kSkip) GTEST_SKIP() << "no GPU in the children";
  EXPECT_EQ(status[0], 0);
  EXPECT_EQ(status[1], 0);
  // Each process wrote its own file (%p); together they show the multi-path pair plans.
  std::vector<nlohmann::json> all;
  const std::string dir = "/tmp/";
  const std::string prefix = stats.substr(dir.size(), stats.size() - dir.size() - 7);
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    for (auto& j : stats_of(e.path().string())) all.push_back(std::move(j));
    std::filesystem::remove(e.path());
  }
  ASSERT_EQ(all.size(), 2u) << "one statistics object per process";
  const Seen s = seen_in(all);
  EXPECT_GT(s.multi_path, 0u);
  EXPECT_TRUE(any_via(s, "host memory"));
  EXPECT_TRUE(any_via(s, "no kernel there")) << "relays as slot devices across processes";
  EXPECT_FALSE(any_via(s, "forwarded by rank")) << "pair-local plans never forward";
  EXPECT_TRUE(s.kinds.contains("alltoall"));
  for (const nlohmann::json& comm : all)
    for (const nlohmann::json& plan : comm["plans"])
      EXPECT_EQ(plan["scope"].get<std::string>() == "pair", plan["kind"] == "p2p");
}

}  // namespace
}  // namespace efccl::runtime::testing
