// What it costs when processes without MPS take turns on one GPU (issue 21; docs/performance.md,
// "Several processes on one GPU without MPS: what the GPU's time slicing costs"). Without MPS the
// kernels of different processes do not run at the same time: the GPU switches between their
// contexts. This measures what a call pays for that in four shapes of a collective's
// synchronisation:
//
//   shared_gpu_switch_bench [--procs 2] [--iters 2000] [--mode pingpong|last|served|spin]
//                           [--bytes N] [--limit 120]
//
//   pingpong  strict turns: process r waits on the host (a word in shared host memory) for its
//             turn, then launches a one-thread kernel that hands the turn on. One iteration is
//             one turn of every process: `procs` switches between contexts, nothing spins.
//   last      no kernel waits for another process: each launches a one-thread kernel that counts
//             its arrival (an atomic in device memory shared through CUDA IPC), then one that runs
//             only in the last process to arrive and publishes the iteration as done; every
//             process's stream then waits for `done` with cuStreamWaitValue32. (The last to
//             arrive would run the whole collective.)
//   served    one process serves the others, as a resident grid hosted by one process would:
//             process 0 runs one kernel for the whole run that answers every doorbell; each other
//             process rings its doorbell (a word in process 0's memory, through CUDA IPC) with
//             cuStreamWriteValue32 and waits for the answer with cuStreamWaitValue32: its stream
//             runs no kernel at all. (Process 0 prints the serving kernel's time.) With
//             --bytes N, each of those calls also copies N bytes into a buffer of process 0
//             (IPC) before its doorbell and N bytes back after the answer (cudaMemcpyAsync,
//             device to device): a staging copy in and out, as a served rank's data would move.
//   spin      each process's kernel counts its arrival and spins until all arrived, as the
//             interpreter's CTAs wait for their peers: the running context keeps the GPU until
//             its time slice ends.
//
// Every process prints µs per iteration of a loop that enqueues without waiting, then µs per
// iteration synchronised each time. Processes are forked before CUDA starts; device 0. A
// kernel's or the host's wait for another process gives up after 10 s (a process gone), process
// 0 leaves only once the others have closed their mapping of its memory (or 10 s passed), and
// the parent kills its children after --limit seconds (default 120), so a broken run ends with a
// non-zero exit instead of hanging. (A stream waiting with cuStreamWaitValue32 for a process that
// is gone has no deadline of its own: the parent's limit ends it.)
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>

namespace {

constexpr int kMaxProcs = 8;
constexpr auto kHostWaitLimit = std::chrono::seconds(10);

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "shared_gpu_switch_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::_Exit(1);
  }
}

void check(CUresult e, const char* what) {
  if (e != CUDA_SUCCESS) {
    std::fprintf(stderr, "shared_gpu_switch_bench: %s: CUresult %d\n", what, static_cast<int>(e));
    std::_Exit(1);
  }
}

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue32 = WaitValue32;

/// A driver function through the runtime's entry-point query (no link against libcuda).
void* driver_entry(const char* name) {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion(name, &entry, 12000, cudaEnableDefault, &found),
        name);
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    std::fprintf(stderr, "shared_gpu_switch_bench: %s not found\n", name);
    std::_Exit(1);
  }
  return entry;
}
WaitValue32 wait_value32() { return reinterpret_cast<WaitValue32>(driver_entry("cuStreamWaitValue32")); }
WriteValue32 write_value32() { return reinterpret_cast<WriteValue32>(driver_entry("cuStreamWriteValue32")); }

/// A kernel's wait gives up after this long (the GPU's global timer, nanoseconds).
constexpr uint64_t kKernelWaitNs = 10'000'000'000ULL;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hand_on(volatile uint32_t* turn, uint32_t next) {
  __threadfence_system();
  *turn = next;
}

__global__ void arrive(uint32_t* arrivals, uint32_t iteration, uint32_t procs, uint32_t* last) {
  const uint32_t before = atomicAdd(arrivals, 1u);
  *last = before == iteration * procs - 1 ? iteration : 0u;
}

__global__ void finish_if_last(const uint32_t* last, volatile uint32_t* done, uint32_t iteration) {
  if (*last != iteration) return;
  __threadfence_system();
  *done = iteration;
}

/// Lane 0 of warp r (1 <= r < procs) answers process r's doorbells 1 .. calls in order (a warp
/// per process, so that the processes' polls do not diverge within one warp).
__global__ void serve(volatile uint32_t* doorbells, volatile uint32_t* answers, uint32_t procs,
                      uint32_t calls, uint32_t* timed_out) {
  const uint32_t r = threadIdx.x / 32;
  if (threadIdx.x % 32 != 0 || r == 0 || r >= procs) return;
  for (uint32_t k = 1; k <= calls; ++k) {
    const uint64_t start = global_ns();
    while (doorbells[r * 32] < k) {
      if (global_ns() - start > kKernelWaitNs) {
        *timed_out = 1;
        return;
      }
    }
    __threadfence_system();
    answers[r * 32] = k;
  }
}

__global__ void arrive_and_spin(uint32_t* arrivals, uint32_t iteration, uint32_t procs,
                                uint32_t* timed_out) {
  atomicAdd(arrivals, 1u);
  const uint64_t start = global_ns();
  while (atomicAdd(arrivals, 0u) < iteration * procs) {
    if (global_ns() - start > kKernelWaitNs) {
      *timed_out = 1;
      return;
    }
  }
}

struct Options {
  int procs = 2;
  int iters = 2000;
  std::string mode = "last";
  long long bytes = 0;  // served: staging copies per call
  int limit_s = 120;    // the parent kills the processes after this long
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--procs" && has_value) o.procs = std::atoi(argv[++i]);
    else if (a == "--iters" && has_value) o.iters = std::atoi(argv[++i]);
    else if (a == "--mode" && has_value) o.mode = argv[++i];
    else if (a == "--bytes" && has_value) o.bytes = std::atoll(argv[++i]);
    else if (a == "--limit" && has_value) o.limit_s = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: shared_gpu_switch_bench [--procs 1..%d] [--iters N] "
                           "[--mode pingpong|last|served|spin] [--bytes N] [--limit S] (unknown argument '%s')\n",
                   kMaxProcs, a.c_str());
      std::exit(2);
    }
  }
  if (o.procs < 1 || o.procs > kMaxProcs || o.iters < 4 ||
      (o.mode != "pingpong" && o.mode != "last" && o.mode != "spin" && o.mode != "served") ||
      (o.mode == "served" && o.procs < 2) || o.bytes < 0 || o.bytes > (1LL << 30) ||
      (o.bytes > 0 && o.mode != "served") || o.limit_s < 1) {
    std::fprintf(stderr, "shared_gpu_switch_bench: --procs 1..%d, --iters >= 4, --mode "
                         "pingpong|last|served|spin (served: --procs >= 2), --bytes 0..2^30 (served only), "
                         "--limit >= 1\n", kMaxProcs);
    std::exit(2);
  }
  return o;
}

/// Shared between the forked processes (anonymous shared mapping made before the fork).
struct SharedHost {
  volatile uint32_t turn;  // pingpong: whose turn (written by the kernels through the mapping)
  uint32_t pad[15];
  cudaIpcMemHandle_t arrivals_handle;
  volatile uint32_t handle_ready;
  uint32_t closed;  // processes other than 0 that are done with rank 0's memory
};

int run_process(const Options& o, int rank, SharedHost* shared) {
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  check(cudaHostRegister(shared, sizeof(SharedHost), cudaHostRegisterMapped | cudaHostRegisterPortable),
        "cudaHostRegister(shared host memory)");
  uint32_t* turn_device = nullptr;
  check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&turn_device),
                                 const_cast<uint32_t*>(&shared->turn), 0),
        "cudaHostGetDevicePointer");
  // [0] arrivals, [32] done, [64 ..] doorbells and answers, from 4096: each process's staging
  // area (--bytes): one allocation, rank 0's, shared by IPC.
  uint32_t* words = nullptr;
  const size_t staging_bytes = static_cast<size_t>(o.bytes);
  if (rank == 0) {
    check(cudaMalloc(&words, 4096 + kMaxProcs * staging_bytes), "cudaMalloc");
    check(cudaMemset(words, 0, 4096), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaIpcGetMemHandle(&shared->arrivals_handle, words), "cudaIpcGetMemHandle");
    __atomic_store_n(&shared->handle_ready, 1u, __ATOMIC_RELEASE);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + kHostWaitLimit;
    while (__atomic_load_n(&shared->handle_ready, __ATOMIC_ACQUIRE) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "shared_gpu_switch_bench: rank %d: no IPC handle from rank 0 in 10 s\n", rank);
        return 1;
      }
      std::this_thread::yield();
    }
    check(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&words), shared->arrivals_handle,
                               cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  }
  uint32_t* arrivals = words;
  uint32_t* done = words + 32;
  uint32_t* doorbells = words + 64;               // served: [r * 32], r < kMaxProcs
  uint32_t* answers = words + 64 + 32 * kMaxProcs;
  char* staging = reinterpret_cast<char*>(words) + 4096 + rank * staging_bytes;
  char* data = nullptr;
  if (staging_bytes > 0) check(cudaMalloc(&data, staging_bytes), "cudaMalloc");
  uint32_t* local = nullptr;  // [0] last, [1] timed out
  check(cudaMalloc(&local, 64), "cudaMalloc");
  check(cudaMemset(local, 0, 64), "cudaMemset");
  const WaitValue32 stream_wait_value32 = wait_value32();
  const WriteValue32 stream_write_value32 = write_value32();
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  uint32_t iteration = 0;
  bool host_timed_out = false;
  const auto one = [&] {
    ++iteration;
    if (o.mode == "pingpong") {
      const uint32_t mine = (iteration - 1) * o.procs + rank;
      const auto deadline = std::chrono::steady_clock::now() + kHostWaitLimit;
      while (shared->turn != mine && !host_timed_out)
        host_timed_out = std::chrono::steady_clock::now() > deadline;
      if (host_timed_out) return;  // the turn stays here: the others time out too
      hand_on<<<1, 1, 0, stream>>>(turn_device, mine + 1);
    } else if (o.mode == "last") {
      arrive<<<1, 1, 0, stream>>>(arrivals, iteration, o.procs, local);
      finish_if_last<<<1, 1, 0, stream>>>(local, done, iteration);
      check(stream_wait_value32(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(done),
                                iteration, CU_STREAM_WAIT_VALUE_GEQ),
            "cuStreamWaitValue32");
    } else if (o.mode == "served") {
      const auto cu = reinterpret_cast<CUstream>(stream);
      if (staging_bytes > 0)
        check(cudaMemcpyAsync(staging, data, staging_bytes, cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync (in)");
      check(stream_write_value32(cu, reinterpret_cast<CUdeviceptr>(doorbells + rank * 32), iteration,
                                 CU_STREAM_WRITE_VALUE_DEFAULT),
            "cuStreamWriteValue32");
      check(stream_wait_value32(cu, reinterpret_cast<CUdeviceptr>(answers + rank * 32), iteration,
                                CU_STREAM_WAIT_VALUE_GEQ),
            "cuStreamWaitValue32");
      if (staging_bytes > 0)
        check(cudaMemcpyAsync(data, staging, staging_bytes, cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync (out)");
    } else {
      arrive_and_spin<<<1, 1, 0, stream>>>(arrivals, iteration, o.procs, local + 1);
    }
    check(cudaGetLastError(), "kernel launch");
  };
  const auto timed = [&](int n, bool sync_each) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n && !host_timed_out; ++i) {
      one();
      if (sync_each) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  // Rank 0's memory is mapped by the others: it may leave only once they have closed it.
  const auto leave = [&](int rc) {
    if (rank != 0) {
      if (cudaStreamSynchronize(stream) == cudaSuccess) (void)cudaIpcCloseMemHandle(words);
      __atomic_add_fetch(&shared->closed, 1u, __ATOMIC_ACQ_REL);
      return rc;
    }
    const auto deadline = std::chrono::steady_clock::now() + kHostWaitLimit;
    while (__atomic_load_n(&shared->closed, __ATOMIC_ACQUIRE) < static_cast<uint32_t>(o.procs - 1)) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "shared_gpu_switch_bench: rank 0: the others did not release its "
                             "memory within 10 s\n");
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return rc;
  };
  const int warmup = o.mode == "spin" ? 4 : 100;
  if (o.mode == "served" && rank == 0) {
    // The server: one kernel answering every call of the others (warm-up, enqueued, synced).
    const uint32_t calls = static_cast<uint32_t>(warmup + o.iters + o.iters / 4);
    const auto t0 = std::chrono::steady_clock::now();
    serve<<<1, 32 * o.procs, 0, stream>>>(doorbells, answers, o.procs, calls, local + 1);
    check(cudaGetLastError(), "kernel launch");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    uint32_t timed_out = 0;
    check(cudaMemcpy(&timed_out, local + 1, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (timed_out) {
      std::fprintf(stderr, "shared_gpu_switch_bench: the server waited 10 s for a doorbell\n");
      return leave(1);
    }
    std::printf("mode served procs %d rank 0: served %u calls per process in %.0f us\n", o.procs,
                calls, us);
    std::fflush(stdout);
    return leave(0);
  }
  timed(warmup, false);
  const double enqueued = timed(o.iters, false);
  const double synced = timed(o.iters / 4, true);
  uint32_t kernel_timed_out = 0;
  check(cudaMemcpy(&kernel_timed_out, local + 1, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  if (host_timed_out || kernel_timed_out) {
    std::fprintf(stderr, "shared_gpu_switch_bench: rank %d: a wait for the other processes gave up "
                         "after 10 s\n", rank);
    return leave(1);
  }
  std::printf("mode %s procs %d bytes %lld rank %d: %.2f us per call enqueued (%d calls), %.2f us "
              "per call synchronized (%d calls)\n",
              o.mode.c_str(), o.procs, o.bytes, rank, enqueued, o.iters, synced, o.iters / 4);
  std::fflush(stdout);
  return leave(0);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  void* mapping = mmap(nullptr, sizeof(SharedHost), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    std::perror("shared_gpu_switch_bench: mmap");
    return 1;
  }
  auto* shared = new (mapping) SharedHost{};
  pid_t children[kMaxProcs] = {};
  for (int r = 0; r < o.procs; ++r) {
    children[r] = fork();
    if (children[r] < 0) {
      std::perror("shared_gpu_switch_bench: fork");
      for (int k = 0; k < r; ++k) kill(children[k], SIGKILL);
      return 1;
    }
    if (children[r] == 0) std::_Exit(run_process(o, r, shared));
  }
  int failed = 0, left = o.procs;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.limit_s);
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    } else if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "shared_gpu_switch_bench: processes still running after %d s (--limit); "
                           "killed\n", o.limit_s);
      for (int r = 0; r < o.procs; ++r) kill(children[r], SIGKILL);
      while (waitpid(-1, &status, 0) > 0) {}
      return 1;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return failed ? 1 : 0;
}
