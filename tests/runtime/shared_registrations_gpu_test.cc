// Registered buffers mapped into the other processes on one GPU (comm/shared_registrations.h):
// two forked processes with one rank each on GPU 0 register buffers; each process reads and
// writes the other's through the address its service reported, deregistration unmaps before it
// returns, memory without a legacy IPC handle stays local, and destroying a communicator with
// registrations left unmaps them in the other process, also when both destroy at once. Then
// every data-moving collective of two and three processes on GPU 0, in and out of place, with
// EFCCL_DIRECT_PROCESSES=1 and registered buffers (their launches meet and move data directly:
// device-executor.md), without registration (they meet, and keep the slots) and by default:
// exact every way. Without MPS the processes' kernels take turns on the GPU,
// which makes the calls slow but not wrong.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/shared_registrations.h"
#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/json_io.h"
#include "forked_job.h"

namespace {

using Clock = std::chrono::steady_clock;

/// One float allreduce, waited for: both processes are past the calls before it.
void barrier(ncclComm_t comm, cudaStream_t stream, float* word) {
  CHILD_NCCL(ncclAllReduce(word, word, 1, ncclFloat, ncclSum, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
}

/// Every process's `mine`, by process (an allgather through the communicator).
std::vector<uint64_t> exchange(ncclComm_t comm, cudaStream_t stream, uint64_t mine) {
  uint64_t* d = nullptr;
  CHILD_CUDA(cudaMalloc(&d, 2 * sizeof(uint64_t)));
  CHILD_CUDA(cudaMemcpy(d + g_rank, &mine, sizeof(mine), cudaMemcpyHostToDevice));
  CHILD_NCCL(ncclAllGather(d + g_rank, d, 1, ncclUint64, comm, stream));
  CHILD_CUDA(cudaStreamSynchronize(stream));
  std::vector<uint64_t> all(2);
  CHILD_CUDA(cudaMemcpy(all.data(), d, 2 * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  CHILD_CUDA(cudaFree(d));
  return all;
}

unsigned char pattern(int proc, std::size_t i) {
  return static_cast<unsigned char>((i * 31 + static_cast<std::size_t>(proc) * 101 + 7) & 0xff);
}

struct Rank {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* word = nullptr;
};

/// Process `proc`'s rank of `id` on GPU 0, or kSkip in `*skip` without a GPU.
Rank join(int proc, const ncclUniqueId& id) {
  Rank r;
  CHILD_CUDA(cudaSetDevice(0));
  CHILD_NCCL(ncclCommInitRank(&r.comm, 2, id, proc));
  CHILD_CUDA(cudaStreamCreate(&r.stream));
  CHILD_CUDA(cudaMalloc(&r.word, sizeof(float)));
  CHILD_CUDA(cudaMemset(r.word, 0, sizeof(float)));
  CHILD_CHECK(r.comm->shared_registrations != nullptr,
              "a communicator whose GPU another process shares has no shared registrations");
  CHILD_CHECK(r.comm->shared_registrations->partner_count() == 1, "partners: %zu",
              r.comm->shared_registrations->partner_count());
  return r;
}

TEST(SharedRegistrations, RegisteredBuffersAreMappedInTheOtherProcessUntilDeregistered) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1"};  // the mappings' only user
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    Rank r = join(proc, id);
    efccl::runtime::SharedRegistrations& shared = *r.comm->shared_registrations;
    constexpr std::size_t kBytes = 1 << 20, kLead = 256, kAt = 4096, kLen = 4096;
    char* alloc = nullptr;
    CHILD_CUDA(cudaMalloc(&alloc, kLead + kBytes));
    char* buff = alloc + kLead;  // inside its allocation: the offset must be carried over
    std::vector<unsigned char> mine(kBytes);
    for (std::size_t i = 0; i < kBytes; ++i) mine[i] = pattern(proc, i);
    CHILD_CUDA(cudaMemcpy(buff, mine.data(), kBytes, cudaMemcpyHostToDevice));
    CHILD_CHECK(!shared.partner_address(buff, 16, 0).has_value(), "shared before registering");
    void* handle = nullptr;
    CHILD_NCCL(ncclCommRegister(r.comm, buff, kBytes, &handle));
    const auto there = shared.partner_address(buff + kAt, kLen, 0);
    CHILD_CHECK(there.has_value(), "the registered buffer has no address in the other process");
    CHILD_CHECK(!shared.partner_address(buff, kBytes + 1, 0).has_value(), "past the end");
    CHILD_CHECK(!shared.partner_address(alloc, 16, 0).has_value(), "before the start");
    CHILD_CHECK(!shared.partner_address(buff, 16, 1).has_value(), "a partner that is not");
    // Each process learns where it reaches the other's buffer + kAt.
    const std::vector<uint64_t> at = exchange(r.comm, r.stream, *there);
    CHILD_CHECK(shared.imported() == 1, "this process maps %zu registrations of the other",
                shared.imported());
    const int other = 1 - proc;
    char* peer = reinterpret_cast<char*>(at[static_cast<std::size_t>(other)]);
    std::vector<unsigned char> seen(kLen);
    CHILD_CUDA(cudaMemcpy(seen.data(), peer, kLen, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kLen; ++i)
      CHILD_CHECK(seen[i] == pattern(other, kAt + i), "byte %zu of the other's buffer: %d", i,
                  static_cast<int>(seen[i]));
    // Writes land in the other process's buffer: each writes 64 bytes of 0xA0 + proc there.
    CHILD_CUDA(cudaMemset(peer, 0xA0 + proc, 64));
    CHILD_CUDA(cudaDeviceSynchronize());
    barrier(r.comm, r.stream, r.word);
    std::vector<unsigned char> own(64);
    CHILD_CUDA(cudaMemcpy(own.data(), buff + kAt, 64, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < 64; ++i)
      CHILD_CHECK(own[i] == 0xA0 + other, "byte %zu written by the other process: %d", i,
                  static_cast<int>(own[i]));
    // Deregistering returns once the other process retired its mapping, also while that
    // process waits in a collective for this one (unmapping there waits for its kernels, so it
    // happens in the background): process 1 enters the barrier first.
    if (proc == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const auto t0 = Clock::now();
      CHILD_NCCL(ncclCommDeregister(r.comm, handle));
      CHILD_CHECK(Clock::now() - t0 < std::chrono::seconds(5), "deregister took %.1f s",
                  std::chrono::duration<double>(Clock::now() - t0).count());
      CHILD_CHECK(!shared.partner_address(buff + kAt, kLen, 0).has_value(), "still shared");
    }
    barrier(r.comm, r.stream, r.word);
    if (proc == 1) CHILD_NCCL(ncclCommDeregister(r.comm, handle));
    barrier(r.comm, r.stream, r.word);
    CHILD_CHECK(shared.imported() == 0, "still mapping %zu registrations", shared.imported());
    CHILD_CHECK(ncclCommDeregister(r.comm, handle) == ncclInvalidArgument, "a second deregister");
    CHILD_NCCL(ncclCommDestroy(r.comm));
    CHILD_CUDA(cudaFree(alloc));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(SharedRegistrations, MemoryWithoutALegacyIpcHandleStaysLocal) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1"};  // the mappings' only user
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    Rank r = join(proc, id);
    efccl::runtime::SharedRegistrations& shared = *r.comm->shared_registrations;
    // Memory of a stream-ordered pool and pinned host memory: registered, not shared.
    void* pooled = nullptr;
    CHILD_CUDA(cudaMallocAsync(&pooled, 1 << 20, r.stream));
    CHILD_CUDA(cudaStreamSynchronize(r.stream));
    void* pinned = nullptr;
    CHILD_CUDA(cudaMallocHost(&pinned, 1 << 16));
    void* h1 = nullptr;
    void* h2 = nullptr;
    CHILD_NCCL(ncclCommRegister(r.comm, pooled, 1 << 20, &h1));
    CHILD_NCCL(ncclCommRegister(r.comm, pinned, 1 << 16, &h2));
    CHILD_CHECK(!shared.partner_address(pooled, 16, 0).has_value(), "pool memory was shared");
    CHILD_CHECK(!shared.partner_address(pinned, 16, 0).has_value(), "host memory was shared");
    barrier(r.comm, r.stream, r.word);
    CHILD_CHECK(shared.imported() == 0, "maps %zu registrations", shared.imported());
    CHILD_NCCL(ncclCommDeregister(r.comm, h1));
    CHILD_NCCL(ncclCommDeregister(r.comm, h2));
    CHILD_NCCL(ncclCommDestroy(r.comm));
    CHILD_CUDA(cudaFreeAsync(pooled, r.stream));
    CHILD_CUDA(cudaStreamSynchronize(r.stream));
    CHILD_CUDA(cudaFreeHost(pinned));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(SharedRegistrations, DestroyUnmapsWhatIsStillRegisteredInTheOtherProcess) {
  Job job;
  job.env = {"EFCCL_DIRECT_PROCESSES=1"};  // the mappings' only user
  job.body = [](int proc, const ncclUniqueId& id) {
    if (gpus_in_child() < 1) return kSkip;
    Rank a = join(proc, id);
    // A second communicator keeps the two processes in step once `a` is gone.
    Rank b = a;
    CHILD_NCCL(ncclCommSplit(a.comm, 0, proc, &b.comm, nullptr));
    char* buff = nullptr;
    CHILD_CUDA(cudaMalloc(&buff, 1 << 20));
    void* ha = nullptr;
    void* hb = nullptr;
    CHILD_NCCL(ncclCommRegister(a.comm, buff, 1 << 20, &ha));
    CHILD_NCCL(ncclCommRegister(b.comm, buff, 1 << 20, &hb));
    CHILD_CHECK(a.comm->shared_registrations->partner_address(buff, 16, 0).has_value(),
                "the registration on a was not shared");
    CHILD_CHECK(b.comm->shared_registrations->partner_address(buff, 16, 0).has_value(),
                "the registration on b was not shared");
    barrier(b.comm, b.stream, b.word);
    CHILD_CHECK(a.comm->shared_registrations->imported() == 1, "a maps %zu",
                a.comm->shared_registrations->imported());
    CHILD_CHECK(b.comm->shared_registrations->imported() == 1, "b maps %zu",
                b.comm->shared_registrations->imported());
    barrier(b.comm, b.stream, b.word);  // both looked before anything is destroyed
    // Process 0 destroys `a` without deregistering: process 1's mapping of it goes first.
    auto keep = a.comm->shared_registrations;  // to look at process 1's service afterwards
    if (proc == 0) {
      const auto t0 = Clock::now();
      CHILD_NCCL(ncclCommDestroy(a.comm));
      CHILD_CHECK(Clock::now() - t0 < std::chrono::seconds(10), "destroy took %.1f s",
                  std::chrono::duration<double>(Clock::now() - t0).count());
    }
    barrier(b.comm, b.stream, b.word);
    if (proc == 1) {
      CHILD_CHECK(keep->imported() == 0, "process 1 still maps %zu of process 0's",
                  keep->imported());
      // Its own registration on `a`: the other side is gone, so destroy does not wait for it.
      const auto t0 = Clock::now();
      CHILD_NCCL(ncclCommDestroy(a.comm));
      CHILD_CHECK(Clock::now() - t0 < std::chrono::seconds(10), "destroy took %.1f s",
                  std::chrono::duration<double>(Clock::now() - t0).count());
    }
    keep.reset();
    // Both destroy `b` at once, each with a registration the other maps.
    barrier(b.comm, b.stream, b.word);
    const auto t0 = Clock::now();
    CHILD_NCCL(ncclCommDestroy(b.comm));
    CHILD_CHECK(Clock::now() - t0 < std::chrono::seconds(10), "destroy of b took %.1f s",
                std::chrono::duration<double>(Clock::now() - t0).count());
    CHILD_CUDA(cudaFree(buff));
    return 0;
  };
  EXPECT_JOB_PASSED(run_job(job));
}

/// The value rank `r` sends at element i (small integers: sums are exact in float).
float value(int r, std::size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)); }

/// Every collective that moves data between the ranks, in and out of place, with buffers of at
/// least kXprocMinBytes per rank (so that the processes' launches meet), registered or not:
/// the results must be exact either way (registered: direct transfers between the processes;
/// not: the connections' slots).
int collectives_between_processes(int proc, int nprocs, const ncclUniqueId& id, bool registered,
                                  bool direct, std::size_t count = std::size_t{1} << 18) {
  if (gpus_in_child() < 1) return kSkip;
  CHILD_CUDA(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, nprocs, id, proc));
  // Registrations are mapped into the other processes only for direct transfers between them.
  CHILD_CHECK((comm->shared_registrations != nullptr) == direct, "shared registrations: %s",
              comm->shared_registrations != nullptr ? "started" : "none");
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreate(&stream));
  const std::size_t kCount = count;  // default: 1 MiB of floats per rank buffer
  const std::size_t big = kCount * static_cast<std::size_t>(nprocs);
  float* send = nullptr;
  float* recv = nullptr;
  CHILD_CUDA(cudaMalloc(&send, big * sizeof(float)));
  CHILD_CUDA(cudaMalloc(&recv, big * sizeof(float)));
  void* hs = nullptr;
  void* hr = nullptr;
  if (registered) {
    CHILD_NCCL(ncclCommRegister(comm, send, big * sizeof(float), &hs));
    CHILD_NCCL(ncclCommRegister(comm, recv, big * sizeof(float), &hr));
  }
  std::vector<float> host(big);
  const auto fill = [&](float* d, std::size_t n, int r) {
    for (std::size_t i = 0; i < n; ++i) host[i] = value(r, i);
    CHILD_CUDA(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  };
  const auto expect = [&](const float* d, std::size_t n, const std::function<float(std::size_t)>& want,
                          const char* what) {
    std::vector<float> got(n);
    CHILD_CUDA(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < n; ++i)
      CHILD_CHECK(got[i] == want(i), "%s (%s): element %zu is %g, expected %g", what,
                  registered ? "registered" : "not registered", i, got[i], want(i));
  };
  const float total = static_cast<float>(nprocs * (nprocs + 1) / 2);
  const auto sum = [&](std::size_t i) { return total * static_cast<float>(i % 7 + 1); };
  for (const bool inplace : {false, true}) {
    // allreduce
    fill(inplace ? recv : send, kCount, proc);
    CHILD_NCCL(ncclAllReduce(inplace ? recv : send, recv, kCount, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(recv, kCount, sum, inplace ? "allreduce in place" : "allreduce");
    // allgather: rank r's block r
    float* mine = inplace ? recv + proc * kCount : send;
    fill(mine, kCount, proc);
    CHILD_NCCL(ncclAllGather(mine, recv, kCount, ncclFloat, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(recv, big, [&](std::size_t i) { return value(static_cast<int>(i / kCount), i % kCount); },
           inplace ? "allgather in place" : "allgather");
    // reduce-scatter: block `proc` of the sum (element index within the whole input)
    fill(inplace ? recv : send, big, proc);
    CHILD_NCCL(ncclReduceScatter(inplace ? recv : send, inplace ? recv + proc * kCount : recv,
                                 kCount, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(inplace ? recv + proc * kCount : recv, kCount,
           [&](std::size_t i) { return sum(proc * kCount + i); },
           inplace ? "reduce-scatter in place" : "reduce-scatter");
    // broadcast from rank 0
    fill(inplace ? recv : send, kCount, proc);
    CHILD_NCCL(ncclBroadcast(inplace ? recv : send, recv, kCount, ncclFloat, 0, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    expect(recv, kCount, [&](std::size_t i) { return value(0, i); },
           inplace ? "broadcast in place" : "broadcast");
    // reduce to the last rank
    const int root = nprocs - 1;
    fill(inplace ? recv : send, kCount, proc);
    CHILD_NCCL(ncclReduce(inplace ? recv : send, recv, kCount, ncclFloat, ncclSum, root, comm,
                          stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    if (proc == root) expect(recv, kCount, sum, inplace ? "reduce in place" : "reduce");
  }
  if (registered) {
    CHILD_NCCL(ncclCommDeregister(comm, hs));
    CHILD_NCCL(ncclCommDeregister(comm, hr));
  }
  CHILD_NCCL(ncclCommDestroy(comm));
  CHILD_CUDA(cudaFree(send));
  CHILD_CUDA(cudaFree(recv));
  return 0;
}

TEST(SharedRegistrations, CollectivesOfTwoProcessesOnOneGpuAreExactWithRegisteredBuffers) {
  // Direct transfers between the processes (EFCCL_DIRECT_PROCESSES=1), with registered buffers
  // and without (the launches meet, and keep the slots); and the default (no meeting).
  for (const auto& [registered, direct] : {std::pair{true, true}, std::pair{false, true},
                                           std::pair{true, false}}) {
    SCOPED_TRACE(std::string(registered ? "registered" : "not registered") +
                 (direct ? ", EFCCL_DIRECT_PROCESSES=1" : ", default"));
    Job job;
    if (direct) job.env = {"EFCCL_DIRECT_PROCESSES=1"};
    job.body = [registered = registered, direct = direct](int proc, const ncclUniqueId& id) {
      return collectives_between_processes(proc, 2, id, registered, direct);
    };
    EXPECT_JOB_PASSED(run_job(job));
  }
}

TEST(SharedRegistrations, CollectivesOfThreeProcessesOnOneGpuAreExactWithRegisteredBuffers) {
  Job job;
  job.nprocs = 3;
  job.env = {"EFCCL_DIRECT_PROCESSES=1"};
  job.body = [](int proc, const ncclUniqueId& id) {
    return collectives_between_processes(proc, 3, id, true, true);
  };
  EXPECT_JOB_PASSED(run_job(job));
}

TEST(SharedRegistrations, CollectivesOfTwoProcessesOnOneGpuAreExactWithTheWiderRings) {
  // 16 MiB per rank buffer: the tuning table gives the rings of two processes sharing a GPU 64
  // CTAs per rank (2 lanes per instance; select/tuning.h), directly between registered
  // buffers and through the slots.
  for (const bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "EFCCL_DIRECT_PROCESSES=1" : "default");
    Job job;
    if (direct) job.env = {"EFCCL_DIRECT_PROCESSES=1"};
    job.body = [direct](int proc, const ncclUniqueId& id) {
      return collectives_between_processes(proc, 2, id, true, direct, std::size_t{1} << 22);
    };
    EXPECT_JOB_PASSED(run_job(job));
  }
}

/// An allreduce of 4 MiB per rank, registered, in and out of place, through the program the
/// job's EFCCL_ALGO_FILES names: exact.
int allreduce_through_user_program(int proc, int nprocs, const ncclUniqueId& id) {
  if (gpus_in_child() < 1) return kSkip;
  CHILD_CUDA(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  CHILD_NCCL(ncclCommInitRank(&comm, nprocs, id, proc));
  cudaStream_t stream = nullptr;
  CHILD_CUDA(cudaStreamCreate(&stream));
  constexpr std::size_t kCount = std::size_t{1} << 20;
  float* send = nullptr;
  float* recv = nullptr;
  CHILD_CUDA(cudaMalloc(&send, kCount * sizeof(float)));
  CHILD_CUDA(cudaMalloc(&recv, kCount * sizeof(float)));
  void* hs = nullptr;
  void* hr = nullptr;
  CHILD_NCCL(ncclCommRegister(comm, send, kCount * sizeof(float), &hs));
  CHILD_NCCL(ncclCommRegister(comm, recv, kCount * sizeof(float), &hr));
  std::vector<float> host(kCount);
  const float total = static_cast<float>(nprocs * (nprocs + 1) / 2);
  for (const bool inplace : {false, true}) {
    for (std::size_t i = 0; i < kCount; ++i) host[i] = value(proc, i);
    float* in = inplace ? recv : send;
    CHILD_CUDA(cudaMemcpy(in, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice));
    CHILD_NCCL(ncclAllReduce(in, recv, kCount, ncclFloat, ncclSum, comm, stream));
    CHILD_CUDA(cudaStreamSynchronize(stream));
    CHILD_CUDA(cudaMemcpy(host.data(), recv, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < kCount; ++i)
      CHILD_CHECK(host[i] == total * static_cast<float>(i % 7 + 1),
                  "allreduce (%s): element %zu is %g", inplace ? "in place" : "out of place", i,
                  host[i]);
  }
  CHILD_NCCL(ncclCommDeregister(comm, hs));
  CHILD_NCCL(ncclCommDeregister(comm, hr));
  CHILD_NCCL(ncclCommDestroy(comm));
  CHILD_CUDA(cudaFree(send));
  CHILD_CUDA(cudaFree(recv));
  return 0;
}

TEST(SharedRegistrations, LaunchesOfFourProcessesOnOneGpuFitTogether) {
  // All-pairs with 16 instances: 96 threadblocks per rank, 384 on the GPU. Every process's
  // launch waits for the others' (they meet: EFCCL_DIRECT_PROCESSES=1, registered buffers), so
  // all four must be co-resident; each process counts the others' threadblocks when it sizes
  // its CTAs. Before it did, on an H200 under MPS the fourth launch never started and the
  // other three timed out (2026-11-28).
  efccl::algorithms::AlgorithmParams params;
  params.ranks = 4;
  params.instances = 16;
  auto p = efccl::algorithms::generate_algorithm("allpairs_allreduce", params);
  ASSERT_TRUE(p) << p.status().message();
  p->min_bytes = 0;
  p->max_bytes.reset();  // every size
  const std::string file = "/tmp/efccl_four_processes_" + std::to_string(getpid()) + ".json";
  std::ofstream(file) << efccl::ef::save_json(*p);
  Job job;
  job.nprocs = 4;
  job.env = {"EFCCL_DIRECT_PROCESSES=1", "EFCCL_ALGO_FILES=" + file, "EFCCL_TIMEOUT_MS=60000"};
  job.body = [](int proc, const ncclUniqueId& id) {
    return allreduce_through_user_program(proc, 4, id);
  };
  EXPECT_JOB_PASSED(run_job(job));
  std::remove(file.c_str());
}

}  // namespace
