// A GPU served by one process (enqueue/served_calls.h): 2 and 4 forked processes with one rank
// each on GPU 0, EFCCL_DIRECT_PROCESSES=1 and EFCCL_SERVE_PROCESSES=1 (served with or without an
// MPS daemon): every data-moving collective on registered buffers, in and out of place, small
// and large, is served (rank 0's process runs it for all) and exact; a call on a buffer that is
// not registered runs the usual way, also exact; calls on two streams without the user ordering
// them run in call order; with EFCCL_SERVE_PROCESSES=0 nothing is served, and calls smaller than
// EFCCL_SERVE_MIN_BYTES run the usual way; a call that another process never issues fails at
// EFCCL_TIMEOUT_MS instead of hanging, and so does a served call whose stream another process
// holds back (the watchdog), in both processes, while calls queued behind their own streams'
// work or an idle communicator do not time out. Calls captured into CUDA graphs by every process
// are served on every replay, exact; eager calls and replays back to back for longer than the
// timeout do not time out; a replay the other process never matches fails at the timeout and
// ends, as do replays after it; a replay waiting for a process that aborts ends without the
// timeout.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "forked_job.h"

namespace {

float value(int rank, std::size_t i) { return static_cast<float>((rank + 1) * (i % 7 + 1)); }

struct Buffers {
  float* send = nullptr;
  float* recv = nullptr;
  void* hs = nullptr;
  void* hr = nullptr;
};

/// Every data-moving collective of `nprocs` ranks with `count` elements per rank, in and out
/// of place, checked exactly; returns how many calls were made.
int collectives(int proc, int nprocs, ncclComm_t comm, cudaStream_t stream, const Buffers& b,
                std::size_t count) {
  const std::size_t big = count * static_cast<std::size_t>(nprocs);
  std::vector<float> host(big);
  const auto fill = [&](float* d, std::size_t n, const std::function<float(std::size_t)>& v) {
    for (std::size_t i = 0; i < n; ++i) host[i] = v(i);
    CHILD_CUDA(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  };
  const auto expect = [&](const float* d, std::size_t n,
                          const std::function<float(std::size_t)>& want, const char* what) {
    std::vector<float> got(n);
    CHILD_CUDA(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < n; ++i)
      CHILD_CHECK(got[i] == want(i), "%s, %zu elements: element %zu is %g, expected %g", what,
                  count, i, got[i], want(i));
  };
  const auto mine = [&](std::size_t i) { return value(proc, i); };
  const float total = static_cast<float>(nprocs * (nprocs + 1) / 2);
  const auto sum = [&](std::size_t i) { return total * static_cast<float>(i % 7 + 1); };
  int calls = 0;
  for (const bool inplace : {false, true}) {
    float* in = inplace ? b.recv : b.send;
    fill(in, count, mine);
    CHILD_NCCL(ncclAllReduce(in, b.recv, count, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(b.recv, count, sum, "allreduce");
    float* block = inplace ? b.recv + proc * count : b.send;
    fill(block, count, mine);
    CHILD_NCCL(ncclAllGather(block, b.recv, count, ncclFloat, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(
        b.recv, big, [&](std::size_t i) { return value(static_cast<int>(i / count), i % count); },
        "allgather");
    fill(in, big, mine);
    float* out = inplace ? b.recv + proc * count : b.recv;
    CHILD_NCCL(ncclReduceScatter(in, out, count, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(
        out, count, [&](std::size_t i) { return sum(proc * count + i); }, "reduce-scatter");
    fill(in, count, mine);
    CHILD_NCCL(ncclBroadcast(in, b.recv, count, ncclFloat, 1, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(
        b.recv, count, [&](std::size_t i) { return value(1, i); }, "broadcast from rank 1");
    const int root = nprocs - 1;
    fill(in, count, mine);
    CHILD_NCCL(ncclReduce(in, b.recv, count, ncclFloat, ncclSum, root, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    if (proc == root) expect(b.recv, count, sum, "reduce");
    calls += 5;
  }
  // all-to-all, out of place: block p of rank r goes to rank p's block r.
  fill(b.send, big, [&](std::size_t i) { return static_cast<float>(proc * 1000 + i / count); });
  CHILD_NCCL(ncclAlltoAll(b.send, b.recv, count, ncclFloat, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  expect(
      b.recv, big, [&](std::size_t i) { return static_cast<float>((i / count) * 1000 + proc); },
      "all-to-all");
  return calls + 1;
}

int served_collectives(int proc, int nprocs, const ncclUniqueId& id) {
  if (gpus_in_child() < 1) return kSkip;
  CHILD_CUDA(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, nprocs, id, proc));
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreate(&stream));
  const std::size_t kMost = std::size_t{1} << 20;  // floats per rank
  const std::size_t bytes = kMost * static_cast<std::size_t>(nprocs) * sizeof(float);
  Buffers b;
  CHILD_CUDA(cudaMalloc(&b.send, bytes));
  CHILD_CUDA(cudaMalloc(&b.recv, bytes));
  CHILD_NCCL(ncclCommRegister(comm, b.send, bytes, &b.hs));
  CHILD_NCCL(ncclCommRegister(comm, b.recv, bytes, &b.hr));
  uint64_t expected = 0;
  for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, kMost}) {
    expected += static_cast<uint64_t>(collectives(proc, nprocs, comm, stream, b, count));
    const uint64_t served = comm->clique->served_calls();
    CHILD_CHECK(served == expected, "%llu calls served, expected %llu",
                static_cast<unsigned long long>(served), static_cast<unsigned long long>(expected));
  }
  // Buffers that are not registered: the usual way, exact too.
  Buffers plain;
  CHILD_CUDA(cudaMalloc(&plain.send, 4096 * nprocs * sizeof(float)));
  CHILD_CUDA(cudaMalloc(&plain.recv, 4096 * nprocs * sizeof(float)));
  collectives(proc, nprocs, comm, stream, plain, 4096);
  CHILD_CHECK(comm->clique->served_calls() == expected,
              "calls on unregistered buffers were served");
  CHILD_NCCL(ncclCommDeregister(comm, b.hs));
  CHILD_NCCL(ncclCommDeregister(comm, b.hr));
  CHILD_NCCL(ncclCommDestroy(comm));
  for (float* p : {b.send, b.recv, plain.send, plain.recv}) CHILD_CUDA(cudaFree(p));
  return 0;
}

/// `body(proc, nprocs, id)` in jobs of 2 and 4 processes, served.
void in_two_and_four_processes(int (*body)(int proc, int nprocs, const ncclUniqueId& id)) {
  for (const int nprocs : {2, 4}) {
    SCOPED_TRACE(std::to_string(nprocs) + " processes");
    Job job;
    job.nprocs = nprocs;
    job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1"};
    job.body = [nprocs, body](int proc, const ncclUniqueId& id) { return body(proc, nprocs, id); };
    EXPECT_JOB_PASSED(run_job(job));
  }
}

TEST(ServedGpu, CollectivesOfTwoAndFourProcessesAreServedAndExact) {
  in_two_and_four_processes(served_collectives);
}

TEST(ServedGpu, NothingIsServedWhenTheSettingSaysNo) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=0"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    CHILD_CUDA(cudaSetDevice(0));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    cudaStream_t stream = nullptr;
    CHILD_CUDA(cudaStreamCreate(&stream));
    Buffers b;
    CHILD_CUDA(cudaMalloc(&b.send, 2 * 1000 * sizeof(float)));
    CHILD_CUDA(cudaMalloc(&b.recv, 2 * 1000 * sizeof(float)));
    CHILD_NCCL(ncclCommRegister(comm, b.send, 2 * 1000 * sizeof(float), &b.hs));
    CHILD_NCCL(ncclCommRegister(comm, b.recv, 2 * 1000 * sizeof(float), &b.hr));
    collectives(proc, 2, comm, stream, b, 1000);
    CHILD_CHECK(comm->clique->served_calls() == 0, "served with EFCCL_SERVE_PROCESSES=0");
    CHILD_NCCL(ncclCommDeregister(comm, b.hs));
    CHILD_NCCL(ncclCommDeregister(comm, b.hr));
    CHILD_NCCL(ncclCommDestroy(comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

/// Process `proc`'s rank of a 2-rank communicator on GPU 0, a stream, and 1 MiB registered.
struct Member {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
};
Member join_with_buffer(int proc, const ncclUniqueId& id) {
  Member m;
  CHILD_CUDA(cudaSetDevice(0));
  CHILD_NCCL(ncclCommInitRank(&m.comm, 2, id, proc));
  CHILD_CUDA(cudaStreamCreate(&m.stream));
  void* handle = nullptr;
  CHILD_CUDA(cudaMalloc(&m.buffer, 1 << 20));
  CHILD_NCCL(ncclCommRegister(m.comm, m.buffer, 1 << 20, &handle));
  return m;
}

TEST(ServedGpu, CallsSmallerThanTheServedMinimumRunTheUsualWay) {
  // EFCCL_SERVE_MIN_BYTES=65536: a call is served when its larger buffer holds 64 KiB or more
  // (an allgather's output counts), else it runs the usual way; exact either way, captured too.
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_SERVE_MIN_BYTES=65536"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    const Member m = join_with_buffer(proc, id);  // 1 MiB, registered
    float* in = m.buffer;
    float* out = m.buffer + (std::size_t{1} << 17);
    std::vector<float> host(std::size_t{1} << 17);
    uint64_t served = 0;
    const auto call = [&](const char* what, bool allgather, std::size_t count, bool want_served,
                          bool captured) {
      for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(proc + 1 + i % 5);
      CHILD_CUDA(cudaMemcpy(in, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (captured) CHILD_CUDA(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeGlobal));
      if (allgather)
        CHILD_NCCL(ncclAllGather(in, out, count, ncclFloat, m.comm, m.stream));
      else
        CHILD_NCCL(ncclAllReduce(in, out, count, ncclFloat, ncclSum, m.comm, m.stream));
      if (captured) {
        CHILD_CUDA(cudaStreamEndCapture(m.stream, &graph));
        CHILD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        CHILD_CUDA(cudaGraphLaunch(exec, m.stream));
      }
      CHILD_CUDA(cudaStreamSynchronize(m.stream));
      if (want_served) ++served;
      CHILD_CHECK(m.comm->clique->served_calls() == served, "%s: %llu calls served, expected %llu",
                  what, static_cast<unsigned long long>(m.comm->clique->served_calls()),
                  static_cast<unsigned long long>(served));
      const std::size_t n = allgather ? 2 * count : count;
      std::vector<float> got(n);
      CHILD_CUDA(cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t j = i % count;
        const float want = allgather ? static_cast<float>(i / count + 1 + j % 5)
                                     : static_cast<float>(3 + 2 * (j % 5));
        CHILD_CHECK(got[i] == want, "%s: element %zu is %g, expected %g", what, i, got[i], want);
      }
      if (captured) {
        CHILD_CUDA(cudaGraphExecDestroy(exec));
        CHILD_CUDA(cudaGraphDestroy(graph));
      }
    };
    call("allreduce of 1000 floats", false, 1000, false, false);
    call("allreduce of 16383 floats", false, 16383, false, false);
    call("allreduce of 16384 floats (64 KiB)", false, 16384, true, false);
    call("allgather of 4096 floats per rank (32 KiB out)", true, 4096, false, false);
    call("allgather of 8192 floats per rank (64 KiB out)", true, 8192, true, false);
    call("captured allreduce of 1000 floats", false, 1000, false, true);
    call("captured allreduce of 32768 floats", false, 32768, true, true);
    CHILD_NCCL(ncclCommDestroy(m.comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(ServedGpu, ACallAnotherProcessNeverIssuesFailsAtTheTimeout) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=2000"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    const Member m = join_with_buffer(proc, id);
    ncclComm_t comm = m.comm;
    cudaStream_t stream = m.stream;
    float* d = m.buffer;
    if (proc == 1) {
      // Never issues the call; stays alive past rank 0's timeout, then leaves.
      std::this_thread::sleep_for(std::chrono::seconds(5));
      (void)ncclCommAbort(comm);
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const ncclResult_t r = ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, stream);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHILD_CHECK(r != ncclSuccess, "the call succeeded without the other process");
    const std::string why = ncclGetLastError(comm);
    CHILD_CHECK(why.find("rank 1 to issue collective 1") != std::string::npos, "error: %s",
                why.c_str());
    CHILD_CHECK(s >= 1.9 && s < 4.5, "failed after %.2f s, expected about 2", s);
    (void)ncclCommAbort(comm);
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(ServedGpu, CallsOnTwoStreamsRunInCallOrder) {
  // Call i fills its own buffer with an asynchronous copy on stream i % 2 and reduces it there;
  // nothing orders the two streams. A served call must not run before the copy ahead of it on
  // its stream, even when the next call (on the other stream) arrives first.
  for (const int nprocs : {2, 4}) {
    SCOPED_TRACE(std::to_string(nprocs) + " processes");
    Job job;
    job.nprocs = nprocs;
    job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1"};
    job.body = [nprocs](int proc, const ncclUniqueId& id) {
      if (gpus_in_child() < 1) return kSkip;
      CHILD_CUDA(cudaSetDevice(0));
      ncclComm_t comm = nullptr;
      CHILD_NCCL(ncclCommInitRank(&comm, nprocs, id, proc));
      cudaStream_t streams[2];
      for (cudaStream_t& s : streams)
        CHILD_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      constexpr int kCalls = 8;
      constexpr std::size_t kCount = std::size_t{4} << 20;  // 16 MiB of floats per call
      std::vector<float*> bufs(kCalls);
      std::vector<void*> handles(kCalls);
      float* host = nullptr;
      CHILD_CUDA(cudaMallocHost(&host, kCalls * kCount * sizeof(float)));
      for (int i = 0; i < kCalls; ++i) {
        CHILD_CUDA(cudaMalloc(&bufs[i], kCount * sizeof(float)));
        CHILD_NCCL(ncclCommRegister(comm, bufs[i], kCount * sizeof(float), &handles[i]));
        for (std::size_t k = 0; k < kCount; ++k)
          host[i * kCount + k] = static_cast<float>((proc + 1) * (i + 1));
      }
      const uint64_t before = comm->clique->served_calls();
      for (int i = 0; i < kCalls; ++i) {
        cudaStream_t s = streams[i % 2];
        CHILD_CUDA(cudaMemcpyAsync(bufs[i], host + i * kCount, kCount * sizeof(float),
                                   cudaMemcpyHostToDevice, s));
        CHILD_NCCL(ncclAllReduce(bufs[i], bufs[i], kCount, ncclFloat, ncclSum, comm, s));
      }
      for (cudaStream_t s : streams) CHILD_CUDA(cudaStreamSynchronize(s));
      CHILD_CHECK(comm->clique->served_calls() - before == kCalls, "%llu of %d calls served",
                  static_cast<unsigned long long>(comm->clique->served_calls() - before), kCalls);
      const float ranks = static_cast<float>(nprocs * (nprocs + 1) / 2);
      std::vector<float> got(kCount);
      for (int i = 0; i < kCalls; ++i) {
        CHILD_CUDA(cudaMemcpy(got.data(), bufs[i], kCount * sizeof(float), cudaMemcpyDeviceToHost));
        for (std::size_t k = 0; k < kCount; k += 4093)
          CHILD_CHECK(got[k] == ranks * static_cast<float>(i + 1),
                      "call %d element %zu: %g, expected %g", i, k, got[k],
                      ranks * static_cast<float>(i + 1));
        CHILD_NCCL(ncclCommDeregister(comm, handles[i]));
        CHILD_CUDA(cudaFree(bufs[i]));
      }
      CHILD_NCCL(ncclCommDestroy(comm));
      CHILD_CUDA(cudaFreeHost(host));
      return 0;
    };
    EXPECT_JOB_PASSED(run_job(job));
  }
}

/// Process `proc`'s part of graphs captured by every process: allreduce, allgather,
/// reduce-scatter and broadcast of `count` elements per rank into separate parts of one
/// registered pool, captured in global mode while the served GPU's watchdog runs; each graph
/// served (counted at capture) and exact on every replay, with other inputs each time, also
/// after 50 replays back to back, and an eager call between replays still served.
int captured_collectives(int proc, int nprocs, const ncclUniqueId& id) {
  if (gpus_in_child() < 1) return kSkip;
  CHILD_CUDA(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, nprocs, id, proc));
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const float total = static_cast<float>(nprocs * (nprocs + 1) / 2);
  uint64_t served = 0;
  for (const std::size_t count : {std::size_t{1000}, std::size_t{1} << 18}) {
    const std::size_t big = count * static_cast<std::size_t>(nprocs);
    float* pool = nullptr;  // in, allreduce, allgather, reduce-scatter, broadcast: big each
    CHILD_CUDA(cudaMalloc(&pool, 5 * big * sizeof(float)));
    void* handle = nullptr;
    CHILD_NCCL(ncclCommRegister(comm, pool, 5 * big * sizeof(float), &handle));
    float* in = pool;
    float* ar = pool + big;
    float* ag = pool + 2 * big;
    float* rs = pool + 3 * big;
    float* bc = pool + 4 * big;
    cudaGraph_t graph = nullptr;
    CHILD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    CHILD_NCCL(ncclAllReduce(in, ar, count, ncclFloat, ncclSum, comm, stream));
    // The capture stays open over several of the watchdog's polls (every 10 ms): its queries
    // must not invalidate a capture in global mode.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHILD_NCCL(ncclAllGather(in, ag, count, ncclFloat, comm, stream));
    CHILD_NCCL(ncclReduceScatter(in, rs, count, ncclFloat, ncclSum, comm, stream));
    CHILD_NCCL(ncclBroadcast(in, bc, count, ncclFloat, 1, comm, stream));
    CHILD_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    CHILD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    served += 4;
    CHILD_CHECK(comm->clique->served_calls() == served, "%llu calls served after capture, not %llu",
                static_cast<unsigned long long>(comm->clique->served_calls()),
                static_cast<unsigned long long>(served));
    std::vector<float> host(big);
    for (int replay = 0; replay < 6; ++replay) {
      const float r = static_cast<float>(replay + 1);
      const auto v = [&](int rank, std::size_t i) { return value(rank, i) * r; };
      for (std::size_t i = 0; i < big; ++i) host[i] = v(proc, i);
      // On the graph's stream: the copy ends before this process's arrival is written.
      CHILD_CUDA(
          cudaMemcpyAsync(in, host.data(), big * sizeof(float), cudaMemcpyHostToDevice, stream));
      // The last round: 50 replays back to back (each handshake of a slot after the other,
      // several queued), same inputs, same results.
      for (int launch = 0; launch < (replay == 5 ? 50 : 1); ++launch)
        CHILD_CUDA(cudaGraphLaunch(exec, stream));
      CHILD_CUDA(cudaStreamSynchronize(stream));
      const auto expect = [&](const float* d, std::size_t n,
                              const std::function<float(std::size_t)>& want, const char* what) {
        CHILD_CUDA(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < n; ++i)
          CHILD_CHECK(host[i] == want(i), "replay %d, %s of %zu: element %zu is %g, expected %g",
                      replay, what, count, i, host[i], want(i));
      };
      expect(
          ar, count, [&](std::size_t i) { return total * static_cast<float>(i % 7 + 1) * r; },
          "allreduce");
      expect(
          ag, big, [&](std::size_t i) { return v(static_cast<int>(i / count), i % count); },
          "allgather");
      expect(
          rs, count,
          [&](std::size_t i) { return total * static_cast<float>((proc * count + i) % 7 + 1) * r; },
          "reduce-scatter");
      expect(
          bc, count, [&](std::size_t i) { return v(1, i); }, "broadcast from rank 1");
      if (replay == 2) {  // an eager served call between replays
        CHILD_NCCL(ncclAllReduce(in, ar, count, ncclFloat, ncclSum, comm, stream));
        CHILD_CUDA(cudaStreamSynchronize(stream));
        ++served;
        CHILD_CHECK(comm->clique->served_calls() == served, "the eager call was not served");
      }
    }
    CHILD_CUDA(cudaGraphExecDestroy(exec));
    CHILD_CUDA(cudaGraphDestroy(graph));
    CHILD_NCCL(ncclCommDeregister(comm, handle));
    CHILD_CUDA(cudaFree(pool));
  }
  CHILD_NCCL(ncclCommDestroy(comm));
  return 0;
}

TEST(ServedGpu, CapturedCollectivesAreServedAndExactOnEveryReplay) {
  in_two_and_four_processes(captured_collectives);
}

/// Both processes run one served 64 MiB allreduce 30000 times back to back (a few seconds),
/// captured in a graph or eager, with EFCCL_TIMEOUT_MS=300, and synchronise once at the end.
/// The stream is busy with served calls (or waits in the graph's slot) almost all the time,
/// but no call waits long, so the watchdog must not fail the communicator.
void calls_back_to_back(bool captured) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=300"};
  job.body = [captured](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    CHILD_CUDA(cudaSetDevice(0));
    ncclComm_t comm = nullptr;
    CHILD_NCCL(ncclCommInitRank(&comm, 2, id, proc));
    cudaStream_t stream = nullptr;
    CHILD_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    constexpr std::size_t kCount = std::size_t{16} << 20;  // 64 MiB of floats
    constexpr int kCalls = 30000;
    float* in = nullptr;
    float* out = nullptr;
    void* handles[2] = {};
    CHILD_CUDA(cudaMalloc(&in, kCount * sizeof(float)));
    CHILD_CUDA(cudaMalloc(&out, kCount * sizeof(float)));
    CHILD_NCCL(ncclCommRegister(comm, in, kCount * sizeof(float), &handles[0]));
    CHILD_NCCL(ncclCommRegister(comm, out, kCount * sizeof(float), &handles[1]));
    std::vector<float> host(kCount, static_cast<float>(proc + 1));
    CHILD_CUDA(cudaMemcpy(in, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (captured) {
      CHILD_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      CHILD_NCCL(ncclAllReduce(in, out, kCount, ncclFloat, ncclSum, comm, stream));
      CHILD_CUDA(cudaStreamEndCapture(stream, &graph));
      CHILD_CHECK(comm->clique->served_calls() == 1, "the captured call was not served");
      CHILD_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      if (captured)
        CHILD_CUDA(cudaGraphLaunch(exec, stream));
      else
        CHILD_NCCL(ncclAllReduce(in, out, kCount, ncclFloat, ncclSum, comm, stream));
    }
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!captured)
      CHILD_CHECK(comm->clique->served_calls() == static_cast<uint64_t>(kCalls),
                  "%llu of %d eager calls served",
                  static_cast<unsigned long long>(comm->clique->served_calls()), kCalls);
    ncclResult_t async = ncclSuccess;
    CHILD_NCCL(ncclCommGetAsyncError(comm, &async));
    CHILD_CHECK(async == ncclSuccess, "the communicator failed after %.2f s of calls: %s", s,
                ncclGetLastError(comm));
    CHILD_CUDA(cudaMemcpy(host.data(), out, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kCount; i += 4099)
      CHILD_CHECK(host[i] == 3.0f, "element %zu is %g, expected 3", i, host[i]);
    std::fprintf(stderr, "[rank %d] %d %s calls in %.2f s\n", proc, kCalls,
                 captured ? "replayed" : "eager", s);
    if (captured) {
      CHILD_CUDA(cudaGraphExecDestroy(exec));
      CHILD_CUDA(cudaGraphDestroy(graph));
    }
    for (void* h : handles) CHILD_NCCL(ncclCommDeregister(comm, h));
    CHILD_NCCL(ncclCommDestroy(comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(ServedGpu, ReplaysBackToBackForLongerThanTheTimeoutDoNotTimeOut) { calls_back_to_back(true); }

TEST(ServedGpu, EagerCallsBackToBackForLongerThanTheTimeoutDoNotTimeOut) {
  calls_back_to_back(false);
}

/// A served allreduce of 1024 floats in place on `m`'s buffer, captured on a stream of its own
/// and instantiated (every process captures it).
struct Captured {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};
Captured capture_served_allreduce(const Member& m) {
  Captured g;
  CHILD_CUDA(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  CHILD_CUDA(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeGlobal));
  CHILD_NCCL(ncclAllReduce(m.buffer, m.buffer, 1024, ncclFloat, ncclSum, m.comm, g.stream));
  CHILD_CUDA(cudaStreamEndCapture(g.stream, &g.graph));
  CHILD_CHECK(m.comm->clique->served_calls() == 1, "the captured call was not served");
  CHILD_CUDA(cudaGraphInstantiate(&g.exec, g.graph, 0));
  return g;
}

TEST(ServedGpu, AReplayWaitingForAProcessThatAbortsEndsWithoutTheTimeout) {
  // EFCCL_TIMEOUT_MS=60000. Rank 1 replays a captured served allreduce; rank 0 never replays
  // it and aborts after 1 s, then stays alive for 3 s: rank 1's replay must end and its
  // communicator report the failure well before its own timeout.
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=60000"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    const Member m = join_with_buffer(proc, id);
    const Captured g = capture_served_allreduce(m);
    cudaStream_t stream = g.stream;
    cudaGraphExec_t exec = g.exec;
    if (proc == 0) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      (void)ncclCommAbort(m.comm);
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return 0;
    }
    const auto t0 = std::chrono::steady_clock::now();
    CHILD_CUDA(cudaGraphLaunch(exec, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHILD_CHECK(s < 3.0, "the replay ended after %.2f s", s);
    ncclResult_t async = ncclSuccess;
    CHILD_NCCL(ncclCommGetAsyncError(m.comm, &async));
    CHILD_CHECK(async != ncclSuccess, "no failure reported after the other process aborted");
    CHILD_CUDA(cudaGraphExecDestroy(exec));
    CHILD_CUDA(cudaGraphDestroy(g.graph));
    (void)ncclCommAbort(m.comm);
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(ServedGpu, AReplayTheOtherProcessNeverMatchesFailsAtTheTimeout) {
  // Both processes capture a served allreduce; only `waiter` replays it (twice), the other
  // sleeps past EFCCL_TIMEOUT_MS=2000 and aborts. The waiter's watchdog must fail the
  // communicator at about 2 s and let the replay end; a replay after the failure ends too.
  for (const int waiter : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(waiter) + " replays");
    Job job;
    job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=2000"};
    job.body = [waiter](int proc, const ncclUniqueId& id) {
      if (gpus_in_child() < 1) return kSkip;
      const Member m = join_with_buffer(proc, id);
      const Captured g = capture_served_allreduce(m);
      cudaStream_t stream = g.stream;
      cudaGraphExec_t exec = g.exec;
      if (proc != waiter) {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        (void)ncclCommAbort(m.comm);
        return 0;
      }
      const auto t0 = std::chrono::steady_clock::now();
      const auto seconds = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      CHILD_CUDA(cudaGraphLaunch(exec, stream));
      ncclResult_t async = ncclSuccess;
      double failed_at = -1;
      while (seconds() < 8 && async == ncclSuccess) {
        CHILD_NCCL(ncclCommGetAsyncError(m.comm, &async));
        if (async != ncclSuccess) failed_at = seconds();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      CHILD_CHECK(async != ncclSuccess, "no failure reported within 8 s");
      CHILD_CHECK(failed_at >= 1.9 && failed_at < 4.0,
                  "failure reported after %.2f s, expected about 2", failed_at);
      CHILD_CUDA(cudaStreamSynchronize(stream));  // the watchdog wrote what it waited for
      const double before = seconds();
      CHILD_CUDA(cudaGraphLaunch(exec, stream));  // after the failure: lets it through too
      CHILD_CUDA(cudaStreamSynchronize(stream));
      CHILD_CHECK(seconds() - before < 1.0, "a replay after the failure took %.2f s",
                  seconds() - before);
      CHILD_CUDA(cudaGraphExecDestroy(exec));
      CHILD_CUDA(cudaGraphDestroy(g.graph));
      (void)ncclCommAbort(m.comm);
      return 0;
    };
    EXPECT_JOB_PASSED(run_job(job));
  }
}

/// A word in pinned host memory that `stream`'s later work waits for (cuStreamWaitValue32 >= 1)
/// until open() writes it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) {
    CHILD_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&word_), 64, cudaHostAllocMapped));
    *word_ = 0;
    uint32_t* device_word = nullptr;
    CHILD_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_word), word_, 0));
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found;
    CHILD_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &entry, 12000,
                                                cudaEnableDefault, &found));
    CHILD_CHECK(found == cudaDriverEntryPointSuccess, "no cuStreamWaitValue32");
    using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    CHILD_CHECK(
        reinterpret_cast<WaitValue32>(entry)(stream, reinterpret_cast<CUdeviceptr>(device_word), 1,
                                             CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS,
        "cuStreamWaitValue32");
  }
  ~StreamGate() {
    open();
    (void)cudaFreeHost(word_);  // after the stream passed: its owner synchronised it
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() const { *reinterpret_cast<volatile uint32_t*>(word_) = 1; }

 private:
  uint32_t* word_ = nullptr;
};

TEST(ServedGpu, AServedCallWhoseStreamAnotherProcessHoldsBackFailsAtTheTimeout) {
  // Rank 1's stream waits (cuStreamWaitValue32) on a host word before its served call, for 4 s;
  // EFCCL_TIMEOUT_MS=2000. Rank 0's stream waits for rank 1's arrival: its watchdog must fail
  // the communicator and let the stream go on; rank 1's own watchdog does the same, and once
  // its stream is let go the call ends; both report the failure.
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=2000"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    const Member m = join_with_buffer(proc, id);
    ncclComm_t comm = m.comm;
    cudaStream_t stream = m.stream;
    float* d = m.buffer;
    std::optional<StreamGate> gate;
    if (proc == 1) gate.emplace(stream);
    const auto t0 = std::chrono::steady_clock::now();
    CHILD_NCCL(ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, stream));
    CHILD_CHECK(comm->clique->served_calls() == 1, "the call was not served");
    ncclResult_t async = ncclSuccess;
    double failed_at = -1;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (gate && s > 4.0) gate->open();
      CHILD_NCCL(ncclCommGetAsyncError(comm, &async));
      if (async != ncclSuccess && failed_at < 0) failed_at = s;
      if (failed_at >= 0 && (proc == 0 || s > 4.5)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHILD_CHECK(async != ncclSuccess, "no failure reported within 8 s");
    CHILD_CHECK(failed_at >= 1.9 && failed_at < 4.0,
                "failure reported after %.2f s, expected about 2", failed_at);
    if (gate) gate->open();
    CHILD_CUDA(cudaStreamSynchronize(stream));  // ends: the words were written
    (void)ncclCommAbort(comm);
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(ServedGpu, ServedCallsQueuedBehindTheirOwnStreamsWorkOrIdleDoNotTimeOut) {
  // EFCCL_TIMEOUT_MS=300. Each process's stream waits 1 s on a host word of its own before its
  // served call: the call has not started, so neither watchdog may time it; then the
  // communicator stays idle for 1 s after a call, and a last call is served, exact, no failure.
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_SERVE_PROCESSES=1", "EFCCL_TIMEOUT_MS=300"};
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    const Member m = join_with_buffer(proc, id);
    const auto fill = [&](float v) {
      std::vector<float> host(1024, v);
      CHILD_CUDA(cudaMemcpy(m.buffer, host.data(), sizeof(float) * 1024, cudaMemcpyHostToDevice));
    };
    const auto expect_sum = [&](const char* what) {
      std::vector<float> host(1024);
      CHILD_CUDA(cudaMemcpy(host.data(), m.buffer, sizeof(float) * 1024, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < host.size(); ++i)
        CHILD_CHECK(host[i] == 3.0f, "%s: element %zu is %g, expected 3", what, i, host[i]);
      ncclResult_t async = ncclSuccess;
      CHILD_NCCL(ncclCommGetAsyncError(m.comm, &async));
      CHILD_CHECK(async == ncclSuccess, "%s: the communicator failed: %s", what,
                  ncclGetLastError(m.comm));
    };
    fill(static_cast<float>(proc + 1));
    StreamGate gate(m.stream);
    CHILD_NCCL(ncclAllReduce(m.buffer, m.buffer, 1024, ncclFloat, ncclSum, m.comm, m.stream));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    gate.open();
    CHILD_CUDA(cudaStreamSynchronize(m.stream));
    expect_sum("a call behind 1 s of its stream's own work");
    std::this_thread::sleep_for(std::chrono::seconds(1));
    fill(static_cast<float>(proc + 1));
    CHILD_NCCL(ncclAllReduce(m.buffer, m.buffer, 1024, ncclFloat, ncclSum, m.comm, m.stream));
    CHILD_CUDA(cudaStreamSynchronize(m.stream));
    expect_sum("a call after 1 s idle");
    CHILD_CHECK(m.comm->clique->served_calls() == 2, "%llu calls served, expected 2",
                static_cast<unsigned long long>(m.comm->clique->served_calls()));
    CHILD_NCCL(ncclCommDestroy(m.comm));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

}  // namespace
