// What a doorbell posted with stream memory operations costs when a resident kernel answers it
// (the resident interpreter's round trip, docs/device-executor.md), against a kernel launch.
//
//   stream_memop_bench [--iters 20000]
//
// Per line, microseconds per iteration of a loop that enqueues without waiting (`issue`: host
// time; `per-iter`: until the stream is idle, divided by the iterations):
//   launch          an empty kernel launched per iteration
//   echo <answer>   one cuStreamBatchMemOp per iteration (write word = i, wait word == 0); a
//                   one-thread kernel on another stream polls the word (device memory) without
//                   sleeping and answers by storing 0, with the fences named (PTX), e.g.
//                   "sc.sys;st" = fence.sc.sys then the store
// The answers differ only in where their fences sit; the resident grid's end of a run is one of
// them (resident_kernel.cu, finish_work). "echo st after D us" answers D µs after it saw the
// doorbell, as a run of that length would, also with other ways of waiting (the FLUSH flag, the
// write and the wait in two batches, the word in host memory). Then (answer "st") one stream recording an event after
// each doorbell, as an executor does after a post, and two streams served together, as a post
// for two ranks sharing a GPU is:
//   2 streams, event joins   stream B records an event that stream A waits for, A rings and
//                            waits, A records an event that B waits for (the runtime's joins
//                            around a post today)
//   2 streams, a bell each   each stream rings its own word and waits for it; a one-thread
//                            kernel answers once both rang (per-rank doorbells)
// The echo kernels poll until the host raises their stop word and the streams' waits have no
// deadline: a probe for a working GPU, not a test (run it under `timeout`).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "stream_memop_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void empty_kernel() {}

enum Answer : int {
  kPlain,              // st
  kSysFenceFirst,      // fence.sc.sys; st
  kSysFenceAfter,      // st; fence.sc.sys
  kGpuFenceFirst,      // fence.acq_rel.gpu; st
  kReleaseSys,         // st.release.sys
  kHostStoreAfter,     // st; st (host)
  kGpuThenSysAfter,    // fence.acq_rel.gpu; st; fence.sc.sys; st (host)
  kSysBothSides,       // fence.sc.sys; st; fence.sc.sys; st (host)
  kNumAnswers
};
const char* const kAnswerNames[kNumAnswers] = {
    "st",
    "sc.sys;st",
    "st;sc.sys",
    "acq_rel.gpu;st",
    "st.release.sys",
    "st;host st",
    "acq_rel.gpu;st;sc.sys;host st",
    "sc.sys;st;sc.sys;host st",
};

__global__ void echo_kernel(volatile uint32_t* word, const volatile uint32_t* stop, int answer,
                            volatile uint32_t* host_word) {
  if (threadIdx.x != 0) return;
  uint32_t n = 0;
  for (;;) {
    if (*word == 0) {
      if (*stop != 0) return;
      continue;
    }
    ++n;
    switch (answer) {
      case kPlain:
        *word = 0;
        break;
      case kSysFenceFirst:
        asm volatile("fence.sc.sys;" ::: "memory");
        *word = 0;
        break;
      case kSysFenceAfter:
        *word = 0;
        asm volatile("fence.sc.sys;" ::: "memory");
        break;
      case kGpuFenceFirst:
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        *word = 0;
        break;
      case kReleaseSys:
        asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(word), "r"(0u) : "memory");
        break;
      case kHostStoreAfter:
        *word = 0;
        *host_word = n;
        break;
      case kGpuThenSysAfter:
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        *word = 0;
        asm volatile("fence.sc.sys;" ::: "memory");
        *host_word = n;
        break;
      default:
        asm volatile("fence.sc.sys;" ::: "memory");
        *word = 0;
        asm volatile("fence.sc.sys;" ::: "memory");
        *host_word = n;
        break;
    }
  }
}

/// Answers each doorbell `delay_ns` after it saw it (plain store), as a run of that length would.
__global__ void delayed_echo_kernel(volatile uint32_t* word, const volatile uint32_t* stop,
                                    uint64_t delay_ns) {
  if (threadIdx.x != 0) return;
  for (;;) {
    if (*word == 0) {
      if (*stop != 0) return;
      continue;
    }
    uint64_t start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < delay_ns);
    *word = 0;
  }
}

/// Answers two doorbells together: once both words are set, clears both.
__global__ void echo_pair_kernel(volatile uint32_t* a, volatile uint32_t* b,
                                 const volatile uint32_t* stop) {
  if (threadIdx.x != 0) return;
  for (;;) {
    if (*a == 0 || *b == 0) {
      if (*stop != 0) return;
      continue;
    }
    *a = 0;
    *b = 0;
  }
}

using BatchMemOp = CUresult (*)(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int);

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: stream_memop_bench [--iters N]\n");
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "stream_memop_bench: --iters must be positive\n");
    return 2;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr, echo_stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&echo_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  uint32_t* word = nullptr;
  check(cudaMalloc(&word, 64), "cudaMalloc");
  check(cudaMemset(word, 0, 64), "cudaMemset");
  uint32_t* host = nullptr;
  check(cudaHostAlloc(&host, 256, cudaHostAllocMapped), "cudaHostAlloc");
  std::memset(host, 0, 256);
  uint32_t* host_on_device = nullptr;
  check(cudaHostGetDevicePointer(&host_on_device, host, 0), "cudaHostGetDevicePointer");
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuStreamBatchMemOp", &entry, 12000, cudaEnableDefault,
                                         &found),
        "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    std::fprintf(stderr, "stream_memop_bench: cuStreamBatchMemOp not found\n");
    return 1;
  }
  const auto batch = reinterpret_cast<BatchMemOp>(entry);
  // A doorbell on `on`: write `*bell = value`, then wait until it is 0 (the answer); the wait
  // with `wait_flags`, in the same batch as the write or (`split`) in a batch of its own. False
  // when the driver refuses it.
  const auto try_ring = [&](cudaStream_t on, uint32_t* bell, uint32_t value, unsigned wait_flags,
                            bool split) {
    CUstreamBatchMemOpParams ops[2] = {};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = reinterpret_cast<CUdeviceptr>(bell);
    ops[0].writeValue.value = value;
    ops[0].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[1].waitValue.address = reinterpret_cast<CUdeviceptr>(bell);
    ops[1].waitValue.value = 0;
    ops[1].waitValue.flags = wait_flags;
    const auto cu = reinterpret_cast<CUstream>(on);
    if (!split) return batch(cu, 2, ops, 0) == CUDA_SUCCESS;
    return batch(cu, 1, &ops[0], 0) == CUDA_SUCCESS && batch(cu, 1, &ops[1], 0) == CUDA_SUCCESS;
  };
  const auto ring = [&](cudaStream_t on, uint32_t* bell, uint32_t value) {
    if (!try_ring(on, bell, value, CU_STREAM_WAIT_VALUE_EQ, false)) {
      std::fprintf(stderr, "stream_memop_bench: cuStreamBatchMemOp failed\n");
      std::exit(1);
    }
  };
  const auto doorbell = [&](uint32_t value) { ring(stream, word, value); };
  using Clock = std::chrono::steady_clock;
  const auto time_loop = [&](const std::string& name, auto body) {
    for (int i = 0; i < 200; ++i) body(i);  // warm-up
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) body(i);
    const auto t1 = Clock::now();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const auto t2 = Clock::now();
    std::printf("%-40s issue %7.2f us  per-iter %7.2f us\n", name.c_str(),
                std::chrono::duration<double, std::micro>(t1 - t0).count() / iters,
                std::chrono::duration<double, std::micro>(t2 - t0).count() / iters);
    std::fflush(stdout);
  };
  time_loop("launch", [&](int) { empty_kernel<<<1, 32, 0, stream>>>(); });
  for (int answer = 0; answer < kNumAnswers; ++answer) {
    host[0] = 0;  // stop word
    echo_kernel<<<1, 32, 0, echo_stream>>>(word, host_on_device, answer, host_on_device + 8);
    check(cudaGetLastError(), "launching the echo kernel");
    time_loop(std::string("echo ") + kAnswerNames[answer],
              [&](int i) { doorbell(static_cast<uint32_t>(i % 1000) + 1); });
    reinterpret_cast<volatile uint32_t*>(host)[0] = 1;
    check(cudaStreamSynchronize(echo_stream), "stopping the echo kernel");
  }

  // Two streams served together. Timed until both streams are idle.
  cudaStream_t second = nullptr;
  check(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ready = nullptr, done = nullptr;
  check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  const auto time_two = [&](const std::string& name, auto body) {
    for (int i = 0; i < 200; ++i) body(i);  // warm-up
    // Not cudaDeviceSynchronize: the echo kernel runs until told to stop.
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamSynchronize(second), "cudaStreamSynchronize");
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) body(i);
    const auto t1 = Clock::now();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamSynchronize(second), "cudaStreamSynchronize");
    const auto t2 = Clock::now();
    std::printf("%-40s issue %7.2f us  per-iter %7.2f us\n", name.c_str(),
                std::chrono::duration<double, std::micro>(t1 - t0).count() / iters,
                std::chrono::duration<double, std::micro>(t2 - t0).count() / iters);
    std::fflush(stdout);
  };
  for (const uint64_t delay_us : {2, 5, 10}) {
    host[0] = 0;
    delayed_echo_kernel<<<1, 32, 0, echo_stream>>>(word, host_on_device, delay_us * 1000);
    check(cudaGetLastError(), "launching the echo kernel");
    time_loop("echo st after " + std::to_string(delay_us) + " us",
              [&](int i) { doorbell(static_cast<uint32_t>(i % 1000) + 1); });
    reinterpret_cast<volatile uint32_t*>(host)[0] = 1;
    check(cudaStreamSynchronize(echo_stream), "stopping the echo kernel");
  }
  // The delayed echo with other ways of waiting: does any see the answer sooner?
  struct WaitVariant {
    const char* name;
    uint32_t* bell;
    unsigned flags;
    bool split;
    uint64_t delay_ns;
  };
  const WaitVariant variants[] = {
      {"after 2 us, wait flag FLUSH", word, CU_STREAM_WAIT_VALUE_EQ | CU_STREAM_WAIT_VALUE_FLUSH,
       false, 2000},
      {"after 2 us, write and wait apart", word, CU_STREAM_WAIT_VALUE_EQ, true, 2000},
      {"after 5 us, write and wait apart", word, CU_STREAM_WAIT_VALUE_EQ, true, 5000},
      {"after 10 us, write and wait apart", word, CU_STREAM_WAIT_VALUE_EQ, true, 10000},
      {"at once, write and wait apart", word, CU_STREAM_WAIT_VALUE_EQ, true, 0},
      {"after 2 us, word in host memory", host_on_device + 16, CU_STREAM_WAIT_VALUE_EQ, false, 2000},
  };
  for (const WaitVariant& v : variants) {
    host[0] = 0;
    host[16] = 0;
    delayed_echo_kernel<<<1, 32, 0, echo_stream>>>(v.bell, host_on_device, v.delay_ns);
    check(cudaGetLastError(), "launching the echo kernel");
    bool ok = true;
    time_loop(std::string("echo ") + v.name, [&](int i) {
      if (ok) ok = try_ring(stream, v.bell, static_cast<uint32_t>(i % 1000) + 1, v.flags, v.split);
    });
    if (!ok) std::printf("  (the driver refused this wait: the line above is not a measurement)\n");
    reinterpret_cast<volatile uint32_t*>(host)[0] = 1;
    check(cudaStreamSynchronize(echo_stream), "stopping the echo kernel");
  }
  host[0] = 0;
  echo_kernel<<<1, 32, 0, echo_stream>>>(word, host_on_device, kPlain, host_on_device + 8);
  check(cudaGetLastError(), "launching the echo kernel");
  time_two("1 stream, an event recorded after", [&](int i) {
    doorbell(static_cast<uint32_t>(i % 1000) + 1);
    check(cudaEventRecord(done, stream), "cudaEventRecord");
  });
  time_two("2 streams, event joins", [&](int i) {
    check(cudaEventRecord(ready, second), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
    doorbell(static_cast<uint32_t>(i % 1000) + 1);
    check(cudaEventRecord(done, stream), "cudaEventRecord");
    check(cudaStreamWaitEvent(second, done, 0), "cudaStreamWaitEvent");
  });
  reinterpret_cast<volatile uint32_t*>(host)[0] = 1;
  check(cudaStreamSynchronize(echo_stream), "stopping the echo kernel");
  host[0] = 0;
  echo_pair_kernel<<<1, 32, 0, echo_stream>>>(word, word + 8, host_on_device);
  check(cudaGetLastError(), "launching the echo kernel");
  time_two("2 streams, a bell each", [&](int i) {
    const auto value = static_cast<uint32_t>(i % 1000) + 1;
    ring(stream, word, value);
    ring(second, word + 8, value);
  });
  reinterpret_cast<volatile uint32_t*>(host)[0] = 1;
  check(cudaStreamSynchronize(echo_stream), "stopping the echo kernel");
  return 0;
}
