// Communicators spanning hosts, on one machine: every process claims a host of its own through
// NCCL_HOSTID (as efccl-mprun --hosts does), so the ranks of different "hosts" meet only through
// network connections (the proxies over TCP, pinned host memory at both ends), all on GPU 0.
// Every test forks its processes before anything touches CUDA; rank 0 creates the unique id and
// hands it to the others through pipes; each child checks its results exactly and reports
// through its exit status (0 pass, 77 no GPU, anything else a failure it printed).
//
// Processes sharing a GPU without MPS time-slice it, so sizes stay small; the same tests run
// fast under MPS (tests/net/run_gpu_two_hosts.sh starts a private daemon).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "efccl/common/log.h"
#include "efccl/runtime/observer.h"

namespace {

constexpr int kSkip = 77;
int g_rank = -1;

/// A child's failure: printed with its rank, then the child exits 1.
#define CHILD_CHECK(cond, ...)                                                                \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, \
                   #cond);                                                                    \
      std::fprintf(stderr, __VA_ARGS__);                                                      \
      std::fprintf(stderr, "\n");                                                             \
      std::fflush(stderr);                                                                    \
      _exit(1);                                                                               \
    }                                                                                         \
  } while (0)
#define CHILD_CUDA(x)                                             \
  do {                                                            \
    const cudaError_t e_ = (x);                                   \
    CHILD_CHECK(e_ == cudaSuccess, "%s", cudaGetErrorString(e_)); \
  } while (0)
#define CHILD_NCCL(x)                                                                             \
  do {                                                                                            \
    const ncclResult_t r_ = (x);                                                                  \
    CHILD_CHECK(r_ == ncclSuccess, "%s (%s)", ncclGetErrorString(r_), ncclGetLastError(nullptr)); \
  } while (0)

struct Job {
  int nprocs = 2;
  /// Process p's host: NCCL_HOSTID=efccl-multihost-test-<host[p]>.
  std::vector<int> host;
  /// Runs in each child; returns its exit status.
  std::function<int(int proc, const ncclUniqueId& id)> body;
  std::vector<std::string> env;  ///< "NAME=value" set in every child
  int timeout_s = 300;
};

/// Forks the job's processes; returns their exit statuses (-signal when killed).
std::vector<int> run_job(const Job& job) {
  std::vector<int> fds(static_cast<std::size_t>(2 * job.nprocs));
  for (int p = 0; p < job.nprocs; ++p)
    if (pipe(&fds[static_cast<std::size_t>(2 * p)]) != 0) return {};
  const std::string salt = std::to_string(getpid());
  std::vector<pid_t> pids;
  for (int p = 0; p < job.nprocs; ++p) {
    const pid_t pid = fork();
    if (pid == 0) {
      g_rank = p;
      const int host = job.host.empty() ? p : job.host[static_cast<std::size_t>(p)];
      setenv("NCCL_HOSTID", ("efccl-multihost-test-" + salt + "-" + std::to_string(host)).c_str(),
             1);
      for (const std::string& e : job.env) putenv(strdup(e.c_str()));
      ncclUniqueId id;
      if (p == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) {
          std::fprintf(stderr, "ncclGetUniqueId: %s\n", ncclGetLastError(nullptr));
          _exit(1);
        }
        for (int q = 1; q < job.nprocs; ++q)
          if (write(fds[static_cast<std::size_t>(2 * q + 1)], &id, sizeof(id)) != sizeof(id))
            _exit(1);
      } else if (read(fds[static_cast<std::size_t>(2 * p)], &id, sizeof(id)) != sizeof(id)) {
        _exit(1);  // rank 0 died before sending the id
      }
      const int status = job.body(p, id);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(status);
    }
    pids.push_back(pid);
  }
  for (int fd : fds) close(fd);
  std::vector<int> status(static_cast<std::size_t>(job.nprocs), -1000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(job.timeout_s);
  int left = job.nprocs;
  while (left > 0) {
    for (int p = 0; p < job.nprocs; ++p) {
      auto& st = status[static_cast<std::size_t>(p)];
      if (st != -1000) continue;
      int ws = 0;
      if (waitpid(pids[static_cast<std::size_t>(p)], &ws, WNOHANG) ==
          pids[static_cast<std::size_t>(p)]) {
        st = WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int p = 0; p < job.nprocs; ++p)
        if (status[static_cast<std::size_t>(p)] == -1000) {
          kill(pids[static_cast<std::size_t>(p)], SIGKILL);
          waitpid(pids[static_cast<std::size_t>(p)], nullptr, 0);
          status[static_cast<std::size_t>(p)] = -SIGKILL;
        }
      ADD_FAILURE() << "the job did not finish within " << job.timeout_s << " s (killed)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

#define EXPECT_JOB_PASSED(statuses)                                                        \
  do {                                                                                     \
    const std::vector<int> s_ = (statuses);                                                \
    ASSERT_FALSE(s_.empty()) << "could not start the job";                                 \
    bool skipped_ = false;                                                                 \
    for (int v : s_) skipped_ = skipped_ || v == kSkip;                                    \
    if (skipped_) GTEST_SKIP() << "no CUDA device is visible (the processes share GPU 0)"; \
    for (std::size_t p_ = 0; p_ < s_.size(); ++p_)                                         \
      EXPECT_EQ(s_[p_], 0) << "process " << p_ << " failed (see its output above)";        \
  } while (0)

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
std::vector<T> download(const void* d, std::size_t n) {
  std::vector<T> h(n);
  if (cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) h.clear();
  return h;
}

template <typename T>
void* upload(const std::vector<T>& h) {
  void* d = nullptr;
  if (cudaMalloc(&d, std::max<std::size_t>(1, h.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  return d;
}

/// The log lines and program selections a child saw.
struct Watch {
  std::mutex mu;
  std::vector<std::string> lines, programs;
  Watch() {
    efccl::set_log_sink([this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu);
      if (lines.size() < 100000) lines.push_back(line);
    });
    efccl::runtime::set_selection_observer([this](const efccl::runtime::SelectionRecord& r) {
      std::lock_guard<std::mutex> lock(mu);
      programs.push_back(r.program);
    });
  }
  ~Watch() {
    efccl::set_log_sink(nullptr);
    efccl::runtime::set_selection_observer(nullptr);
  }
  bool logged(const std::string& a, const std::string& b = "") {
    std::lock_guard<std::mutex> lock(mu);
    for (const std::string& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  }
  bool ran(const std::string& program_prefix) {
    std::lock_guard<std::mutex> lock(mu);
    for (const std::string& p : programs)
      if (p.rfind(program_prefix, 0) == 0) return true;
    return false;
  }
};

/// allreduce (float sum, out of place and in place; int32 max) of `elems` elements.
void check_allreduce(ncclComm_t comm, cudaStream_t stream, int rank, int n, std::size_t elems) {
  std::vector<float> in(elems);
  for (std::size_t i = 0; i < elems; ++i) in[i] = static_cast<float>((rank + 1) * (i % 97));
  void* sb = upload(in);
  void* rb = upload(std::vector<float>(elems, -1.0f));
  CHILD_NCCL(ncclAllReduce(sb, rb, elems, ncclFloat, ncclSum, comm, stream));
  CHILD_NCCL(ncclAllReduce(sb, sb, elems, ncclFloat, ncclSum, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  const float tri = static_cast<float>(n * (n + 1) / 2);
  for (void* b : {rb, sb}) {
    const auto out = download<float>(b, elems);
    for (std::size_t i = 0; i < elems; ++i)
      CHILD_CHECK(out[i] == tri * static_cast<float>(i % 97), "allreduce %s of %zu: [%zu] = %g",
                  b == rb ? "out of place" : "in place", elems, i, out[i]);
  }
  std::vector<int32_t> v(elems);
  for (std::size_t i = 0; i < elems; ++i)
    v[i] = static_cast<int32_t>((i * 7919 + static_cast<std::size_t>(rank) * 104729) % 100003);
  void* ib = upload(v);
  CHILD_NCCL(ncclAllReduce(ib, ib, elems, ncclInt32, ncclMax, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  const auto out = download<int32_t>(ib, elems);
  for (std::size_t i = 0; i < elems; ++i) {
    int32_t want = 0;
    for (int r = 0; r < n; ++r)
      want = std::max(
          want, static_cast<int32_t>((i * 7919 + static_cast<std::size_t>(r) * 104729) % 100003));
    CHILD_CHECK(out[i] == want, "allreduce max of %zu: [%zu] = %d, want %d", elems, i, out[i],
                want);
  }
  cudaFree(sb);
  cudaFree(rb);
  cudaFree(ib);
}

/// allgather and reducescatter of int64, `elems` per rank.
void check_gather_scatter(ncclComm_t comm, cudaStream_t stream, int rank, int n,
                          std::size_t elems) {
  const auto value = [](int r, std::size_t i) {
    return static_cast<int64_t>(r) * 1000003 + static_cast<int64_t>(i);
  };
  std::vector<int64_t> mine(elems);
  for (std::size_t i = 0; i < elems; ++i) mine[i] = value(rank, i);
  const std::size_t all = elems * static_cast<std::size_t>(n);
  void* in = upload(mine);
  void* gathered = upload(std::vector<int64_t>(all, -1));
  CHILD_NCCL(ncclAllGather(in, gathered, elems, ncclInt64, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  auto out = download<int64_t>(gathered, all);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < elems; ++i)
      CHILD_CHECK(out[static_cast<std::size_t>(r) * elems + i] == value(r, i),
                  "allgather of %zu: block %d [%zu]", elems, r, i);
  CHILD_NCCL(ncclReduceScatter(gathered, in, elems, ncclInt64, ncclSum, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  out = download<int64_t>(in, elems);
  for (std::size_t i = 0; i < elems; ++i)
    CHILD_CHECK(out[i] == static_cast<int64_t>(n) * value(rank, i),
                "reducescatter of %zu: [%zu] = %lld", elems, i, static_cast<long long>(out[i]));
  cudaFree(in);
  cudaFree(gathered);
}

/// broadcast, reduce, gather and scatter from every root in `roots`; alltoall.
void check_rooted_and_alltoall(ncclComm_t comm, cudaStream_t stream, int rank, int n, std::size_t c,
                               const std::vector<int>& roots) {
  const auto value = [](int r, std::size_t i) { return r * 7 + static_cast<int32_t>(i); };
  std::vector<int32_t> v(c);
  for (std::size_t i = 0; i < c; ++i) v[i] = value(rank, i);
  const std::size_t all = c * static_cast<std::size_t>(n);
  for (int root : roots) {
    void* b = upload(v);
    CHILD_NCCL(ncclBroadcast(b, b, c, ncclInt32, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    auto out = download<int32_t>(b, c);
    for (std::size_t i = 0; i < c; ++i)
      CHILD_CHECK(out[i] == value(root, i), "broadcast root %d [%zu]", root, i);
    void* sb = upload(v);
    void* rb = upload(std::vector<int32_t>(c, -1));
    CHILD_NCCL(ncclReduce(sb, rb, c, ncclInt32, ncclSum, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    if (rank == root) {
      out = download<int32_t>(rb, c);
      for (std::size_t i = 0; i < c; ++i) {
        int32_t want = 0;
        for (int r = 0; r < n; ++r) want += value(r, i);
        CHILD_CHECK(out[i] == want, "reduce root %d [%zu] = %d, want %d", root, i, out[i], want);
      }
    }
    void* gb = upload(std::vector<int32_t>(all, -1));
    CHILD_NCCL(ncclGather(sb, gb, c, ncclInt32, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    if (rank == root) {
      out = download<int32_t>(gb, all);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < c; ++i)
          CHILD_CHECK(out[static_cast<std::size_t>(r) * c + i] == value(r, i),
                      "gather root %d block %d [%zu]", root, r, i);
    }
    // scatter: the root's gathered buffer (every rank's v) goes back out, block r to rank r.
    void* back = upload(std::vector<int32_t>(c, -1));
    CHILD_NCCL(ncclScatter(gb, back, c, ncclInt32, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    out = download<int32_t>(back, c);
    for (std::size_t i = 0; i < c; ++i)
      CHILD_CHECK(out[i] == value(rank, i), "scatter root %d [%zu] = %d", root, i, out[i]);
    for (void* p : {b, sb, rb, gb, back}) cudaFree(p);
  }
  std::vector<float> a(all);
  for (std::size_t i = 0; i < all; ++i)
    a[i] = static_cast<float>(rank * 100000 + static_cast<int>(i));
  void* sb = upload(a);
  void* rb = upload(std::vector<float>(all, -1.0f));
  CHILD_NCCL(ncclAlltoAll(sb, rb, c, ncclFloat, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  const auto out = download<float>(rb, all);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < c; ++i)
      CHILD_CHECK(
          out[static_cast<std::size_t>(r) * c + i] ==
              static_cast<float>(r * 100000 + rank * static_cast<int>(c) + static_cast<int>(i)),
          "alltoall from %d [%zu]", r, i);
  cudaFree(sb);
  cudaFree(rb);
}

/// Send/receive: a ring (to the next rank, from the previous) in one group, and every rank
/// exchanging with its mirror (n - 1 - rank), several sizes.
void check_send_recv(ncclComm_t comm, cudaStream_t stream, int rank, int n,
                     const std::vector<std::size_t>& sizes) {
  for (const std::size_t bytes : sizes) {
    std::vector<uint8_t> v(bytes);
    for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(rank * 31 + i * 7);
    void* sb = upload(v);
    void* rb = upload(std::vector<uint8_t>(bytes, 0));
    void* mb = upload(std::vector<uint8_t>(bytes, 0));
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n, mirror = n - 1 - rank;
    CHILD_NCCL(ncclGroupStart());
    CHILD_NCCL(ncclSend(sb, bytes, ncclUint8, next, comm, stream));
    CHILD_NCCL(ncclRecv(rb, bytes, ncclUint8, prev, comm, stream));
    CHILD_NCCL(ncclGroupEnd());
    CHILD_NCCL(ncclGroupStart());
    CHILD_NCCL(ncclSend(sb, bytes, ncclUint8, mirror, comm, stream));
    CHILD_NCCL(ncclRecv(mb, bytes, ncclUint8, mirror, comm, stream));
    CHILD_NCCL(ncclGroupEnd());
    CHILD_CUDA(cudaStreamSynchronize(stream));
    auto out = download<uint8_t>(rb, bytes);
    for (std::size_t i = 0; i < bytes; ++i)
      CHILD_CHECK(out[i] == static_cast<uint8_t>(prev * 31 + i * 7), "ring recv %zu bytes [%zu]",
                  bytes, i);
    out = download<uint8_t>(mb, bytes);
    for (std::size_t i = 0; i < bytes; ++i)
      CHILD_CHECK(out[i] == static_cast<uint8_t>(mirror * 31 + i * 7),
                  "mirror recv %zu bytes [%zu]", bytes, i);
    for (void* p : {sb, rb, mb}) cudaFree(p);
  }
}

/// An allreduce captured in a CUDA graph and replayed with new input (the proxies are not
/// kicked at a replay; they still serve it).
void check_graph(ncclComm_t comm, cudaStream_t stream, int rank, int n) {
  const std::size_t e = 65536;
  void* b = upload(std::vector<float>(e, 1.0f));
  CHILD_NCCL(ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, stream));  // prepared uncaptured
  CHILD_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHILD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHILD_NCCL(ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, stream));
  CHILD_CUDA(cudaStreamEndCapture(stream, &graph));
  CHILD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    const float start = static_cast<float>(rank + replay);
    CHILD_CUDA(cudaMemcpy(b, std::vector<float>(e, start).data(), e * sizeof(float),
                          cudaMemcpyHostToDevice));
    cudaStreamSynchronize(cudaStreamLegacy);
    CHILD_CUDA(cudaGraphLaunch(exec, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const auto out = download<float>(b, e);
    const float want = static_cast<float>(n * (n - 1) / 2 + n * replay);
    CHILD_CHECK(out[0] == want && out[e - 1] == want, "graph replay %d: %g, want %g", replay,
                out[0], want);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(b);
}

/// Init on GPU 0, checks that the communicator knows it spans two hosts and that network
/// connections were made and logged; `work` runs the calls.
int two_host_body(int rank, int n, const ncclUniqueId& id,
                  const std::function<void(ncclComm_t, cudaStream_t, Watch&)>& work) {
  if (!have_gpu()) return kSkip;
  Watch watch;
  CHILD_CUDA(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, n, id, rank));
  CHILD_CHECK(watch.logged("nNodes 2", "Init COMPLETE"), "the init did not count two hosts");
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  work(comm, stream, watch);
  CHILD_CHECK(
      watch.logged("via NET/Socket", "[send]") && watch.logged("via NET/Socket", "[receive]"),
      "no network connection was logged (NET)");
  ncclResult_t async = ncclInProgress;
  CHILD_NCCL(ncclCommGetAsyncError(comm, &async));
  CHILD_CHECK(async == ncclSuccess, "async error %d", async);
  CHILD_NCCL(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
  return 0;
}

TEST(TwoHostsOnOneGpu, EveryCollectiveAndSendRecvOneRankPerHost) {
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) {
    return two_host_body(proc, 2, id, [proc](ncclComm_t comm, cudaStream_t stream, Watch&) {
      // All-pairs below 1 MiB, the ring with 16 and 32 instances above.
      for (const std::size_t elems :
           {std::size_t{1}, std::size_t{1000}, std::size_t{262147}, std::size_t{2} << 20})
        check_allreduce(comm, stream, proc, 2, elems);
      for (const std::size_t elems : {std::size_t{1}, std::size_t{4099}, std::size_t{300000}})
        check_gather_scatter(comm, stream, proc, 2, elems);
      check_rooted_and_alltoall(comm, stream, proc, 2, 4099, {0, 1});
      check_send_recv(comm, stream, proc, 2, {1, 4096, std::size_t{3} << 20});
      check_graph(comm, stream, proc, 2);
    });
  };
  EXPECT_JOB_PASSED(run_job(job));
}

/// NCCL_PROTO=LL / LL128: the flagged formats over network connections (LL128 runs them as LL),
/// which wait for the proxy's tail as Simple does.
void flagged_job(const char* proto) {
  Job job;
  job.nprocs = 2;
  job.env = {std::string("NCCL_PROTO=") + proto};
  job.body = [](int proc, const ncclUniqueId& id) {
    return two_host_body(proc, 2, id, [proc](ncclComm_t comm, cudaStream_t stream, Watch&) {
      for (const std::size_t elems : {std::size_t{1}, std::size_t{1000}, std::size_t{262147}})
        check_allreduce(comm, stream, proc, 2, elems);
      check_gather_scatter(comm, stream, proc, 2, 30001);
      check_rooted_and_alltoall(comm, stream, proc, 2, 999, {1});
      check_send_recv(comm, stream, proc, 2, {1, 4096, std::size_t{1} << 20});
    });
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(TwoHostsOnOneGpu, LLProgramsOverNetworkConnections) { flagged_job("LL"); }
TEST(TwoHostsOnOneGpu, LL128ProgramsOverNetworkConnections) { flagged_job("LL128"); }

TEST(TwoHostsOnOneGpu, FourRanksTwoPerHostRunTheHierarchicalPrograms) {
  // Ranks 0, 1 on host 0 and 2, 3 on host 1: the multi-host rows (all-pairs, multi-lane,
  // hierarchical allreduce) and the rings crossing each host boundary once.
  Job job;
  job.nprocs = 4;
  job.host = {0, 0, 1, 1};
  job.body = [](int proc, const ncclUniqueId& id) {
    return two_host_body(proc, 4, id, [proc](ncclComm_t comm, cudaStream_t stream, Watch& w) {
      // 3: all-pairs; 16K+5 and 300000 floats: multi-lane (4, 16 lanes); 1M+7 floats (4 MiB):
      // hierarchical with 16 instances and an all-pairs tail.
      for (const std::size_t elems : {std::size_t{3}, std::size_t{16 * 1024 + 5},
                                      std::size_t{300000}, (std::size_t{1} << 20) + 7})
        check_allreduce(comm, stream, proc, 4, elems);
      for (const char* program :
           {"allpairs_allreduce", "multilane_allreduce", "hierarchical_allreduce"})
        CHILD_CHECK(w.ran(program), "%s did not run", program);
      CHILD_CHECK(w.logged("tuning table across hosts (2 hosts x 2 rank(s))"),
                  "the selection did not name the hosts");
      for (const std::size_t elems : {std::size_t{1}, std::size_t{65537}})
        check_gather_scatter(comm, stream, proc, 4, elems);
      check_rooted_and_alltoall(comm, stream, proc, 4, 2049, {0, 3});
      check_send_recv(comm, stream, proc, 4, {1, 65536, std::size_t{1} << 20});
    });
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(TwoHostsOnOneGpu, APeerKilledMidTransferFailsTheSurvivorWithinItsTimeout) {
  // Both start a 64 MiB allreduce (the ring: every byte crosses the network); rank 1 kills
  // itself 20 ms later. Rank 0's kernel must give up and its communicator report
  // ncclRemoteError well within EFCCL_TIMEOUT_MS (30 s): the proxy sees the sockets die (and
  // the bootstrap the process), which aborts the executors.
  Job job;
  job.nprocs = 2;
  job.env = {"EFCCL_TIMEOUT_MS=30000"};
  job.timeout_s = 120;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    if (!have_gpu()) return kSkip;
    CHILD_CUDA(cudaSetDevice(0));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    cudaStream_t stream = nullptr;
    CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const std::size_t elems = std::size_t{16} << 20;
    void* b = upload(std::vector<float>(elems, 1.0f));
    // One full call first: the executor and its network connections exist on both sides.
    CHILD_NCCL(ncclAllReduce(b, b, elems, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const auto start = std::chrono::steady_clock::now();
    CHILD_NCCL(ncclAllReduce(b, b, elems, ncclFloat, ncclSum, comm, stream));
    if (proc == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      raise(SIGKILL);
    }
    ncclResult_t async = ncclSuccess;
    while (async == ncclSuccess || async == ncclInProgress) {
      CHILD_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30),
                  "no error within EFCCL_TIMEOUT_MS after the peer was killed");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      CHILD_CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess, "ncclCommGetAsyncError");
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[rank 0] the peer's death surfaced after %.2f s: %s\n", s,
                 ncclGetLastError(comm));
    CHILD_CHECK(async == ncclRemoteError, "async error %d (%s), want ncclRemoteError", async,
                ncclGetErrorString(async));
    // The aborted kernel has ended: the stream drains.
    CHILD_CUDA(cudaStreamSynchronize(stream));
    CHILD_CHECK(ncclAllReduce(b, b, elems, ncclFloat, ncclSum, comm, stream) == ncclRemoteError,
                "a later call must fail with ncclRemoteError");
    CHILD_NCCL(ncclCommAbort(comm));
    return 0;
  };
  const std::vector<int> s = run_job(job);
  ASSERT_EQ(s.size(), 2u);
  if (s[0] == kSkip) GTEST_SKIP() << "no CUDA device is visible";
  EXPECT_EQ(s[0], 0) << "the survivor failed (see its output above)";
  EXPECT_EQ(s[1], -SIGKILL) << "rank 1 should have killed itself";
}

}  // namespace
