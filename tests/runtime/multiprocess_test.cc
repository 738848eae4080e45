// ncclCommInitRank across processes: every test forks its ranks' processes before anything
// touches CUDA (a forked child cannot use a CUDA context of its parent), rank 0 creates the
// unique id and hands it to the others through pipes, and each child checks its results and
// reports through its exit status (0 pass, 77 not enough GPUs, anything else a failure whose
// reason the child printed).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/json_io.h"
#include "efccl/common/log.h"
#include "efccl/runtime/observer.h"
#include "forked_job.h"
#include "runtime_test_util.h"

namespace {

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

/// Every collective and send/recv of one rank of `n`, one rank per process, checked exactly.
int collectives_body(int rank, int n, const ncclUniqueId& id, int gpus_needed) {
  if (gpus_in_child() < gpus_needed) return kSkip;
  CHILD_CUDA(cudaSetDevice(rank % gpus_in_child()));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, n, id, rank));
  int count = 0, me = -1;
  CHILD_NCCL(ncclCommCount(comm, &count));
  CHILD_NCCL(ncclCommUserRank(comm, &me));
  CHILD_CHECK(count == n && me == rank, "count %d rank %d", count, me);
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (const std::size_t elems : {std::size_t{1}, std::size_t{1000}, std::size_t{262147},
                                  std::size_t{4} << 20}) {
    // allreduce sum of floats, out of place and in place.
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
        CHILD_CHECK(out[i] == tri * static_cast<float>(i % 97), "allreduce elems %zu [%zu] = %g",
                    elems, i, out[i]);
    }
    cudaFree(sb);
    cudaFree(rb);

    // allgather and reducescatter of int64.
    std::vector<int64_t> mine(elems);
    for (std::size_t i = 0; i < elems; ++i) mine[i] = static_cast<int64_t>(rank) * 1000003 + static_cast<int64_t>(i);
    void* g_in = upload(mine);
    void* g_out = upload(std::vector<int64_t>(elems * static_cast<std::size_t>(n), -1));
    CHILD_NCCL(ncclAllGather(g_in, g_out, elems, ncclInt64, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    {
      const auto out = download<int64_t>(g_out, elems * static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < elems; i += 1 + elems / 64)
          CHILD_CHECK(out[static_cast<std::size_t>(r) * elems + i] == static_cast<int64_t>(r) * 1000003 + static_cast<int64_t>(i),
                      "allgather block %d [%zu]", r, i);
    }
    CHILD_NCCL(ncclReduceScatter(g_out, g_in, elems, ncclInt64, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    {
      const auto out = download<int64_t>(g_in, elems);
      for (std::size_t i = 0; i < elems; i += 1 + elems / 64) {
        // Every rank contributed the gathered vector, whose block `rank` is rank's own data.
        CHILD_CHECK(out[i] == static_cast<int64_t>(n) * (static_cast<int64_t>(rank) * 1000003 + static_cast<int64_t>(i)),
                    "reducescatter [%zu] = %lld", i, static_cast<long long>(out[i]));
      }
    }
    cudaFree(g_in);
    cudaFree(g_out);
  }

  // Rooted collectives and alltoall, small counts.
  const std::size_t c = 4099;
  for (int root = 0; root < n; ++root) {
    std::vector<int32_t> v(c);
    for (std::size_t i = 0; i < c; ++i) v[i] = rank * 7 + static_cast<int32_t>(i);
    void* b = upload(v);
    CHILD_NCCL(ncclBroadcast(b, b, c, ncclInt32, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    auto out = download<int32_t>(b, c);
    for (std::size_t i = 0; i < c; ++i)
      CHILD_CHECK(out[i] == root * 7 + static_cast<int32_t>(i), "broadcast root %d [%zu]", root, i);
    void* rb = upload(std::vector<int32_t>(c, -1));
    void* sb = upload(v);
    CHILD_NCCL(ncclReduce(sb, rb, c, ncclInt32, ncclMax, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    if (rank == root) {
      out = download<int32_t>(rb, c);
      for (std::size_t i = 0; i < c; ++i)
        CHILD_CHECK(out[i] == (n - 1) * 7 + static_cast<int32_t>(i), "reduce max root %d [%zu]", root, i);
    }
    cudaFree(b);
    cudaFree(rb);
    cudaFree(sb);
  }
  {
    std::vector<float> v(c * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank * 100000 + static_cast<int>(i));
    void* sb = upload(v);
    void* rb = upload(std::vector<float>(v.size(), -1.0f));
    CHILD_NCCL(ncclAlltoAll(sb, rb, c, ncclFloat, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const auto out = download<float>(rb, v.size());
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < c; ++i)
        CHILD_CHECK(out[static_cast<std::size_t>(r) * c + i] ==
                        static_cast<float>(r * 100000 + rank * static_cast<int>(c) + static_cast<int>(i)),
                    "alltoall from %d [%zu]", r, i);
    cudaFree(sb);
    cudaFree(rb);
  }

  // Send/receive: a ring (send to next, receive from previous) in one group, several sizes.
  for (const std::size_t bytes : {std::size_t{1}, std::size_t{4096}, std::size_t{3} << 20}) {
    std::vector<uint8_t> v(bytes);
    for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(rank * 31 + i);
    void* sb = upload(v);
    void* rb = upload(std::vector<uint8_t>(bytes, 0));
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    CHILD_NCCL(ncclGroupStart());
    CHILD_NCCL(ncclSend(sb, bytes, ncclUint8, next, comm, stream));
    CHILD_NCCL(ncclRecv(rb, bytes, ncclUint8, prev, comm, stream));
    CHILD_NCCL(ncclGroupEnd());
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const auto out = download<uint8_t>(rb, bytes);
    for (std::size_t i = 0; i < bytes; ++i)
      CHILD_CHECK(out[i] == static_cast<uint8_t>(prev * 31 + i), "ring recv %zu bytes [%zu]", bytes, i);
    cudaFree(sb);
    cudaFree(rb);
  }

  // An allreduce captured in a CUDA graph and replayed with new input.
  {
    const std::size_t e = 65536;
    void* b = upload(std::vector<float>(e, 1.0f));
    CHILD_NCCL(ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, stream));  // prepare outside capture
    CHILD_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHILD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CHILD_NCCL(ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamEndCapture(stream, &graph));
    CHILD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      const float start = static_cast<float>(rank + replay);
      CHILD_CUDA(cudaMemcpy(b, std::vector<float>(e, start).data(), e * sizeof(float), cudaMemcpyHostToDevice));
      cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
      CHILD_CUDA(cudaGraphLaunch(exec, stream));
      CHILD_CUDA(cudaStreamSynchronize(stream));
      const auto out = download<float>(b, e);
      const float want = static_cast<float>(n * (n - 1) / 2 + n * replay);
      CHILD_CHECK(out[0] == want && out[e - 1] == want, "graph replay %d: %g, want %g", replay, out[0], want);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(b);
  }

  ncclResult_t async = ncclInProgress;
  CHILD_NCCL(ncclCommGetAsyncError(comm, &async));
  CHILD_CHECK(async == ncclSuccess, "async error %d", async);
  CHILD_NCCL(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
  return 0;
}

TEST(MultiProcess, EveryCollectiveOneRankPerProcess) {
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) { return collectives_body(proc, 2, id, 2); };
  EXPECT_JOB_PASSED(run_job(job));
}

/// EFCCL_FALLBACK=nccl with one rank per process and GPU, in MSCCL's mode (the job's
/// environment): the user program runs allreduce; allgather and broadcast run on NCCL, whose
/// unique id rank 0's process sent through efccl's bootstrap. Exact int32 results.
int fallback_body(int rank, int n, const ncclUniqueId& id) {
  if (gpus_in_child() < n) return kSkip;
  CHILD_CUDA(cudaSetDevice(rank));
  std::mutex mu;
  std::vector<std::string> lines;
  efccl::set_log_sink([&](const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(line);
  });
  const auto logged = [&](const std::string& a, const std::string& b) {
    std::lock_guard<std::mutex> lock(mu);
    for (const std::string& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    return false;
  };
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, n, id, rank));
  CHILD_CHECK(logged("EFCCL_FALLBACK=nccl: NCCL communicators of rank(s) " + std::to_string(rank),
                     "(of " + std::to_string(n) + ") created on NCCL"),
              "no NCCL communicator was created");
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t count = 1 << 16;
  const auto value = [](int r, std::size_t i) { return r * 1000003 + static_cast<int32_t>(i); };
  std::vector<int32_t> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = value(rank, i);
  void* in = upload(mine);
  void* reduced = upload(std::vector<int32_t>(count, -1));
  void* gathered = upload(std::vector<int32_t>(count * static_cast<std::size_t>(n), -1));
  void* bcast = upload(mine);
  CHILD_NCCL(ncclAllReduce(in, reduced, count, ncclInt32, ncclSum, comm, stream));
  CHILD_NCCL(ncclAllGather(in, gathered, count, ncclInt32, comm, stream));
  CHILD_NCCL(ncclBroadcast(bcast, bcast, count, ncclInt32, n - 1, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  ncclResult_t async = ncclInProgress;
  CHILD_NCCL(ncclCommGetAsyncError(comm, &async));
  CHILD_CHECK(async == ncclSuccess, "async error %d", async);
  const auto r = download<int32_t>(reduced, count);
  const auto g = download<int32_t>(gathered, count * static_cast<std::size_t>(n));
  const auto b = download<int32_t>(bcast, count);
  for (std::size_t i = 0; i < count; ++i) {
    int32_t sum = 0;
    for (int q = 0; q < n; ++q) {
      sum += value(q, i);
      CHILD_CHECK(g[static_cast<std::size_t>(q) * count + i] == value(q, i),
                  "allgather block %d [%zu]", q, i);
    }
    CHILD_CHECK(r[i] == sum, "allreduce [%zu] = %d, expected %d", i, r[i], sum);
    CHILD_CHECK(b[i] == value(n - 1, i), "broadcast [%zu] = %d", i, b[i]);
  }
  CHILD_CHECK(!logged("ncclAllReduce(", "no program covers it"), "allreduce went to NCCL");
  CHILD_CHECK(logged("ncclAllGather(", "running it on NCCL"), "allgather was not run on NCCL");
  CHILD_CHECK(logged("ncclBroadcast(", "running it on NCCL"), "broadcast was not run on NCCL");
  for (void* p : {in, reduced, gathered, bcast}) cudaFree(p);
  CHILD_NCCL(ncclCommDestroy(comm));
  cudaStreamDestroy(stream);
  efccl::set_log_sink(nullptr);
  return 0;
}

TEST(MultiProcess, FallbackToNcclOneRankPerProcess) {
  EFCCL_REQUIRE_REAL_NCCL(real);
  // The user program (allreduce only), written before the children start.
  efccl::algorithms::AlgorithmParams params;
  params.ranks = 2;
  auto p = efccl::algorithms::generate_algorithm("ring_allreduce", params);
  ASSERT_TRUE(p) << p.status().message();
  const std::string file = "/tmp/efccl_mp_fallback_" + std::to_string(getpid()) + ".json";
  std::ofstream(file) << efccl::ef::save_json(*p);
  Job job;
  job.nprocs = 2;
  job.env = {"EFCCL_FALLBACK=nccl", "EFCCL_BUILTINS=0", "EFCCL_ALGO_FILES=" + file,
             "EFCCL_NCCL_LIB=" + real};
  job.body = [](int proc, const ncclUniqueId& id) { return fallback_body(proc, 2, id); };
  EXPECT_JOB_PASSED(run_job(job));
  std::remove(file.c_str());
}

TEST(MultiProcess, TwoProcessesShareOneGpu) {
  // Without MPS the two contexts time-slice the GPU, so keep the work small.
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    if (gpus_in_child() < 1) return kSkip;
    CHILD_CUDA(cudaSetDevice(0));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    void* b = upload(std::vector<int32_t>(1000, proc + 1));
    CHILD_NCCL(ncclAllReduce(b, b, 1000, ncclInt32, ncclSum, comm, nullptr));
    CHILD_CUDA(cudaStreamSynchronize(nullptr));
    const auto out = download<int32_t>(b, 1000);
    CHILD_CHECK(out[0] == 3 && out[999] == 3, "allreduce on one GPU: %d", out[0]);
    cudaFree(b);
    CHILD_NCCL(ncclCommDestroy(comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(MultiProcess, TwoRanksPerProcessInitInAGroup) {
  // nccl-tests under MPI with -g 2: each process initializes two ranks from one thread.
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    const int gpus = gpus_in_child();
    if (gpus < 2) return kSkip;
    const int n = 4;
    ncclComm_t comms[2] = {nullptr, nullptr};
    cudaStream_t streams[2] = {nullptr, nullptr};
    void* bufs[2] = {nullptr, nullptr};
    void* recv[2] = {nullptr, nullptr};
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l) {
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_NCCL(ncclCommInitRank(&comms[l], n, id, proc * 2 + l));
    }
    CHILD_NCCL(ncclGroupEnd());
    // Odd: the allreduce runs as two programs (ring body, all-pairs tail).
    const std::size_t e = std::getenv("EFCCL_TEST_ELEMENTS") != nullptr
                              ? std::strtoull(std::getenv("EFCCL_TEST_ELEMENTS"), nullptr, 10)
                              : 300001;
    for (int l = 0; l < 2; ++l) {
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_CUDA(cudaStreamCreateWithFlags(&streams[l], cudaStreamNonBlocking));
      bufs[l] = upload(std::vector<float>(e, static_cast<float>(proc * 2 + l + 1)));
      recv[l] = upload(std::vector<float>(e, 0.0f));
    }
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l)
      CHILD_NCCL(ncclAllReduce(bufs[l], bufs[l], e, ncclFloat, ncclSum, comms[l], streams[l]));
    CHILD_NCCL(ncclGroupEnd());
    // A ring of sends across the four ranks.
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l) {
      const int r = proc * 2 + l;
      CHILD_NCCL(ncclSend(bufs[l], e, ncclFloat, (r + 1) % n, comms[l], streams[l]));
      CHILD_NCCL(ncclRecv(recv[l], e, ncclFloat, (r + n - 1) % n, comms[l], streams[l]));
    }
    CHILD_NCCL(ncclGroupEnd());
    for (int l = 0; l < 2; ++l) {
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_CUDA(cudaStreamSynchronize(streams[l]));
      for (void* b : {bufs[l], recv[l]}) {
        const auto out = download<float>(b, e);
        std::size_t bad = e;
        for (std::size_t i = 0; i < e && bad == e; ++i)
          if (out[i] != 10.0f) bad = i;
        CHILD_CHECK(bad == e, "rank %d %s: [%zu] = %g (of %zu)", proc * 2 + l,
                    b == bufs[l] ? "allreduce" : "ring receive", bad, out[bad], e);
      }
      CHILD_NCCL(ncclCommDestroy(comms[l]));
    }
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(MultiProcess, GroupedSplitOfTwoRanksPerProcess) {
  // torch's split_group / new_group with several GPUs per process: one thread splits both of
  // its ranks of a parent spanning two processes inside one group. Colors by local GPU give two
  // children {0, 2} and {1, 3}, each spanning both processes; a second grouped split puts
  // every rank in one child (keys reversed) and leaves rank 3 out (NOCOLOR).
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    const int gpus = gpus_in_child();
    if (gpus < 2) return kSkip;
    ncclComm_t parent[2] = {nullptr, nullptr};
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l) {
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_NCCL(ncclCommInitRank(&parent[l], 4, id, proc * 2 + l));
    }
    CHILD_NCCL(ncclGroupEnd());
    ncclComm_t lane[2] = {nullptr, nullptr}, most[2] = {nullptr, nullptr};
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l) CHILD_NCCL(ncclCommSplit(parent[l], l, proc, &lane[l], nullptr));
    CHILD_NCCL(ncclGroupEnd());
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l) {
      const int r = proc * 2 + l;
      CHILD_NCCL(ncclCommSplit(parent[l], r == 3 ? NCCL_SPLIT_NOCOLOR : 5, 10 - r, &most[l], nullptr));
    }
    CHILD_NCCL(ncclGroupEnd());
    for (int l = 0; l < 2; ++l) {
      const int r = proc * 2 + l;
      int rank = -1, count = 0;
      CHILD_CHECK(lane[l] != nullptr, "rank %d: no lane communicator", r);
      CHILD_NCCL(ncclCommUserRank(lane[l], &rank));
      CHILD_NCCL(ncclCommCount(lane[l], &count));
      CHILD_CHECK(rank == proc && count == 2, "rank %d: lane rank %d of %d", r, rank, count);
      CHILD_CHECK((most[l] == nullptr) == (r == 3), "rank %d: NOCOLOR gives no communicator", r);
      if (most[l] != nullptr) {
        CHILD_NCCL(ncclCommUserRank(most[l], &rank));
        CHILD_NCCL(ncclCommCount(most[l], &count));
        CHILD_CHECK(rank == 2 - r && count == 3, "rank %d: rank %d of %d in the 3-rank child", r,
                    rank, count);
      }
    }
    // One allreduce per child, each group driving both local ranks.
    const std::size_t e = 4097;
    void* buf[2][2] = {{nullptr, nullptr}, {nullptr, nullptr}};
    cudaStream_t streams[2] = {nullptr, nullptr};
    for (int l = 0; l < 2; ++l) {
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_CUDA(cudaStreamCreateWithFlags(&streams[l], cudaStreamNonBlocking));
      for (int k = 0; k < 2; ++k) buf[l][k] = upload(std::vector<int32_t>(e, proc * 2 + l + 1));
    }
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l)
      CHILD_NCCL(ncclAllReduce(buf[l][0], buf[l][0], e, ncclInt32, ncclSum, lane[l], streams[l]));
    CHILD_NCCL(ncclGroupEnd());
    CHILD_NCCL(ncclGroupStart());
    for (int l = 0; l < 2; ++l)
      if (most[l] != nullptr)
        CHILD_NCCL(ncclAllReduce(buf[l][1], buf[l][1], e, ncclInt32, ncclSum, most[l], streams[l]));
    CHILD_NCCL(ncclGroupEnd());
    for (int l = 0; l < 2; ++l) {
      const int r = proc * 2 + l;
      CHILD_CUDA(cudaSetDevice(l));
      CHILD_CUDA(cudaStreamSynchronize(streams[l]));
      // Lane l holds ranks l and l + 2 (values l + 1 and l + 3); ranks 0..2 hold 1 + 2 + 3.
      const int32_t lane_sum = 2 * l + 4, most_sum = r == 3 ? 4 : 6;
      const auto a = download<int32_t>(buf[l][0], e);
      const auto b = download<int32_t>(buf[l][1], e);
      CHILD_CHECK(a[0] == lane_sum && a[e - 1] == lane_sum, "rank %d: lane allreduce %d, want %d", r,
                  a[e - 1], lane_sum);
      CHILD_CHECK(b[0] == most_sum && b[e - 1] == most_sum, "rank %d: 3-rank allreduce %d, want %d",
                  r, b[e - 1], most_sum);
      for (int k = 0; k < 2; ++k) cudaFree(buf[l][k]);
      CHILD_NCCL(ncclCommDestroy(lane[l]));
      if (most[l] != nullptr) CHILD_NCCL(ncclCommDestroy(most[l]));
      CHILD_NCCL(ncclCommDestroy(parent[l]));
    }
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(MultiProcess, SplitShrinkAndRevoke) {
  Job job;
  job.nprocs = 2;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    const int gpus = gpus_in_child();
    if (gpus < 1) return kSkip;
    CHILD_CUDA(cudaSetDevice(proc % gpus));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    const auto allreduce_sum = [&](ncclComm_t c, int value) -> int {
      void* b = upload(std::vector<int32_t>(333, value));
      if (ncclAllReduce(b, b, 333, ncclInt32, ncclSum, c, nullptr) != ncclSuccess) return -1;
      cudaStreamSynchronize(nullptr);
      const int v = download<int32_t>(b, 333)[332];
      cudaFree(b);
      return v;
    };
    // Both in one color, keys reversing the order: rank 1 becomes new rank 0.
    ncclComm_t both = nullptr;
    CHILD_NCCL(ncclCommSplit(comm, 7, 1 - proc, &both, nullptr));
    int r = -1, n = 0;
    CHILD_NCCL(ncclCommUserRank(both, &r));
    CHILD_NCCL(ncclCommCount(both, &n));
    CHILD_CHECK(r == 1 - proc && n == 2, "split: rank %d of %d", r, n);
    CHILD_CHECK(allreduce_sum(both, proc + 1) == 3, "allreduce on the split communicator");
    // Rank 1 opts out: rank 0 alone.
    ncclComm_t alone = nullptr;
    CHILD_NCCL(ncclCommSplit(comm, proc == 0 ? 0 : NCCL_SPLIT_NOCOLOR, 0, &alone, nullptr));
    CHILD_CHECK((alone == nullptr) == (proc == 1), "NOCOLOR gives no communicator");
    if (alone != nullptr) {
      CHILD_CHECK(allreduce_sum(alone, 5) == 5, "allreduce of one rank");
      CHILD_NCCL(ncclCommDestroy(alone));
    }
    // Shrink excluding rank 1: only rank 0 calls it.
    if (proc == 0) {
      int exclude[1] = {1};
      ncclComm_t shrunk = nullptr;
      CHILD_NCCL(ncclCommShrink(comm, exclude, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT));
      CHILD_NCCL(ncclCommCount(shrunk, &n));
      CHILD_CHECK(n == 1, "shrunk to %d ranks", n);
      CHILD_CHECK(allreduce_sum(shrunk, 9) == 9, "allreduce on the shrunk communicator");
      CHILD_NCCL(ncclCommDestroy(shrunk));
    }
    // Revoke: later calls are refused; the communicator can still be destroyed.
    CHILD_NCCL(ncclCommRevoke(both, NCCL_REVOKE_DEFAULT));
    void* b = upload(std::vector<int32_t>(4, 1));
    CHILD_CHECK(ncclAllReduce(b, b, 4, ncclInt32, ncclSum, both, nullptr) == ncclInvalidUsage,
                "a revoked communicator refuses collectives");
    ncclResult_t async = ncclInProgress;
    CHILD_NCCL(ncclCommGetAsyncError(both, &async));
    CHILD_CHECK(async == ncclSuccess, "revoked and quiescent: %d", async);
    cudaFree(b);
    CHILD_NCCL(ncclCommDestroy(both));
    CHILD_NCCL(ncclCommDestroy(comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(MultiProcess, KilledPeerMakesTheSurvivorFailInsteadOfHanging) {
  Job job;
  job.nprocs = 2;
  // The kernels' own deadline is far away: the error must come from noticing the dead peer.
  job.env = {"EFCCL_TIMEOUT_MS=600000"};
  job.timeout_s = 90;
  job.body = [](int proc, const ncclUniqueId& id) -> int {
    const int gpus = gpus_in_child();
    if (gpus < 1) return kSkip;
    CHILD_CUDA(cudaSetDevice(proc % gpus));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    const std::size_t e = 1 << 20;
    void* b = upload(std::vector<float>(e, 1.0f));
    CHILD_NCCL(ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, nullptr));
    CHILD_CUDA(cudaStreamSynchronize(nullptr));
    if (proc == 1) {
      // Dies without destroying its communicator while rank 0's next allreduce already waits
      // for it on the GPU.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      raise(SIGKILL);
    }
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t result = ncclSuccess;
    for (int i = 0; i < 1000 && result == ncclSuccess; ++i) {
      result = ncclAllReduce(b, b, e, ncclFloat, ncclSum, comm, nullptr);
      if (result != ncclSuccess) break;
      // Poll the way PyTorch's watchdog does.
      while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        if (async != ncclSuccess) {
          result = async;
          break;
        }
        CHILD_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60),
                    "still waiting 60 s after the peer died");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (result == ncclSuccess) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm, &async);
        result = async;
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[rank 0] error %d (%s) after %.2f s: %s\n", result,
                 ncclGetErrorString(result), waited, ncclGetLastError(comm));
    CHILD_CHECK(result == ncclRemoteError || result == ncclSystemError,
                "expected ncclRemoteError or ncclSystemError, got %d", result);
    CHILD_CHECK(waited < 30.0, "took %.1f s", waited);
    CHILD_CHECK(std::strstr(ncclGetLastError(comm), "rank 1") != nullptr,
                "the error does not name the dead peer: %s", ncclGetLastError(comm));
    cudaStreamSynchronize(nullptr);
    ncclCommAbort(comm);
    return 0;
  };
  const std::vector<int> statuses = run_job(job);
  ASSERT_EQ(statuses.size(), 2u);
  if (statuses[0] == kSkip) GTEST_SKIP() << "needs a CUDA device";
  EXPECT_EQ(statuses[0], 0) << "the survivor failed (see its output above)";
  EXPECT_EQ(statuses[1], -SIGKILL);
}

}  // namespace
