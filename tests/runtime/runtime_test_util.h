// Shared helpers of the runtime GPU tests: cliques of communicators, typed host values.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "efccl/ef/datatype.h"
#include "efccl/host/numeric.h"

namespace efccl::runtime::testing {

inline int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define EFCCL_REQUIRE_GPUS(n)                                                              \
  do {                                                                                     \
    const int have = ::efccl::runtime::testing::visible_gpus();                             \
    if (have < (n))                                                                        \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), " << have << " visible";        \
  } while (0)

#ifdef NCCL_HEADER
/// NVIDIA's libnccl.so.2 for EFCCL_FALLBACK=nccl tests: $EFCCL_REAL_NCCL, else the one next to
/// the nccl.h the tests are built with; "" when there is none.
inline std::string real_nccl_library() {
  if (const char* p = std::getenv("EFCCL_REAL_NCCL"); p != nullptr && *p != '\0') return p;
  const auto root = std::filesystem::path(NCCL_HEADER).parent_path().parent_path();
  for (const char* lib : {"lib64", "lib"})
    if (std::filesystem::exists(root / lib / "libnccl.so.2"))
      return (root / lib / "libnccl.so.2").string();
  return "";
}

/// Declares `path`: NVIDIA's libnccl.so.2, or the test skips saying where it looked.
#define EFCCL_REQUIRE_REAL_NCCL(path)                                      \
  const std::string path = ::efccl::runtime::testing::real_nccl_library(); \
  if (path.empty()) {                                                      \
    GTEST_SKIP() << "no real libnccl.so.2 next to " << NCCL_HEADER         \
                 << " (set EFCCL_REAL_NCCL to one to run this test)";      \
  }
#endif

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define NCCL_OK(x) ASSERT_EQ((x), ncclSuccess) << #x << ": " << ncclGetLastError(nullptr)

/// Communicators from one ncclCommInitAll, with one stream per rank.
struct TestClique {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;

  explicit TestClique(std::vector<int> devs) : devices(std::move(devs)) {
    comms.resize(devices.size());
    EXPECT_EQ(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()), ncclSuccess)
        << ncclGetLastError(nullptr);
    for (int d : devices) {
      cudaSetDevice(d);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      streams.push_back(s);
    }
  }
  ~TestClique() {
    for (std::size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
      EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    }
  }
  int n() const { return static_cast<int>(devices.size()); }
  void sync() {
    for (std::size_t r = 0; r < streams.size(); ++r) {
      cudaSetDevice(devices[r]);
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
      ncclResult_t async = ncclSuccess;
      EXPECT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess) << ncclGetLastError(nullptr);
    }
  }
};

/// Sets an environment variable for a scope (a clique reads EFCCL_* when it is created).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// A device buffer of `count` floats equal to `value` (null when the allocation fails).
inline float* filled_buffer(int device, std::size_t count, float value) {
  cudaSetDevice(device);
  float* p = nullptr;
  if (cudaMalloc(&p, count * sizeof(float)) != cudaSuccess) return nullptr;
  std::vector<float> host(count, value);
  cudaMemcpy(p, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  return p;
}

/// `n` ranks over the visible GPUs, several per GPU when fewer are visible.
inline std::vector<int> spread_ranks(int n) {
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r % visible_gpus());
  return devices;
}

/// One thread per rank, without a group (nccl-tests -t N -g 1): in round i each thread calls
/// ncclAllReduce in place on rank-valued floats (rank `lates[i]` after a pause) and, as soon as
/// the call returns, copies the result to the host on the same stream. NCCL's contract: the
/// work is on the stream when the call returns, so every copy sees the sum, and the ranks that
/// were not late waited. With `init`, each thread first makes its rank's communicator itself
/// (`comms[r] = init(r)`, PyTorch's pattern); the threads live through all rounds.
inline void expect_thread_per_rank_stream_order(std::vector<ncclComm_t>& comms,
                                                const std::vector<int>& devices,
                                                const std::vector<int>& lates,
                                                const std::function<ncclComm_t(int)>& init = nullptr) {
  using Clock = std::chrono::steady_clock;
  const int n = static_cast<int>(comms.size());
  const std::size_t rounds = lates.size();
  constexpr std::size_t kCount = (1 << 20) + 5;
  constexpr auto kPause = std::chrono::milliseconds(300);
  std::vector<std::vector<ncclResult_t>> results(rounds, std::vector<ncclResult_t>(n, ncclInternalError));
  std::vector<std::vector<double>> waited(rounds, std::vector<double>(n, 0));
  std::vector<std::vector<std::vector<float>>> got(rounds, std::vector<std::vector<float>>(n));
  std::vector<std::string> errors(n);
  std::barrier round_start(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(devices[r]);
      if (init) comms[r] = init(r);
      cudaStream_t stream = nullptr;
      float* buffer = nullptr;
      float* host = nullptr;
      const bool ready = comms[r] != nullptr &&
                         cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
                         cudaMalloc(&buffer, kCount * sizeof(float)) == cudaSuccess &&
                         cudaMallocHost(&host, kCount * sizeof(float)) == cudaSuccess;
      if (!ready) errors[r] = "setup failed: " + std::string(ncclGetLastError(nullptr));
      const std::vector<float> init_values(kCount, static_cast<float>(r + 1));
      for (std::size_t i = 0; i < rounds; ++i) {
        round_start.arrive_and_wait();
        if (!ready) continue;
        cudaMemcpy(buffer, init_values.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
        cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
        if (r == lates[i]) std::this_thread::sleep_for(kPause);
        const auto start = Clock::now();
        results[i][r] = ncclAllReduce(buffer, buffer, kCount, ncclFloat, ncclSum, comms[r], stream);
        waited[i][r] = std::chrono::duration<double>(Clock::now() - start).count();
        if (results[i][r] != ncclSuccess) errors[r] = ncclGetLastError(nullptr);
        cudaMemcpyAsync(host, buffer, kCount * sizeof(float), cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
        got[i][r].assign(host, host + kCount);
      }
      if (host != nullptr) cudaFreeHost(host);
      if (buffer != nullptr) cudaFree(buffer);
      if (stream != nullptr) cudaStreamDestroy(stream);
    });
  for (auto& t : threads) t.join();
  const float sum = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t i = 0; i < rounds; ++i)
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("round " + std::to_string(i) + " (late rank " + std::to_string(lates[i]) +
                   "), rank " + std::to_string(r));
      ASSERT_EQ(results[i][r], ncclSuccess) << errors[r];
      ASSERT_EQ(got[i][r].size(), kCount);
      for (std::size_t e : {std::size_t{0}, kCount / 2, kCount - 1})
        EXPECT_EQ(got[i][r][e], sum) << "element " << e
                                     << ": the call returned before its work was on its stream";
      if (r != lates[i]) {
        EXPECT_GE(waited[i][r], 0.2) << "did not wait for the late rank";
      }
    }
}

/// Encodes `v` as one element of `t` (rounded to nearest) into `out`.
inline void encode(ef::DataType t, double v, void* out) {
  switch (t) {
    case ef::DataType::kInt8: { auto x = static_cast<int8_t>(v); std::memcpy(out, &x, 1); break; }
    case ef::DataType::kUint8: { auto x = static_cast<uint8_t>(v); std::memcpy(out, &x, 1); break; }
    case ef::DataType::kInt32: { auto x = static_cast<int32_t>(v); std::memcpy(out, &x, 4); break; }
    case ef::DataType::kUint32: { auto x = static_cast<uint32_t>(v); std::memcpy(out, &x, 4); break; }
    case ef::DataType::kInt64: { auto x = static_cast<int64_t>(v); std::memcpy(out, &x, 8); break; }
    case ef::DataType::kUint64: { auto x = static_cast<uint64_t>(v); std::memcpy(out, &x, 8); break; }
    case ef::DataType::kFloat16: { auto x = host::float_to_half(static_cast<float>(v)); std::memcpy(out, &x, 2); break; }
    case ef::DataType::kFloat32: { auto x = static_cast<float>(v); std::memcpy(out, &x, 4); break; }
    case ef::DataType::kFloat64: std::memcpy(out, &v, 8); break;
    case ef::DataType::kBFloat16: { auto x = host::float_to_bfloat16(static_cast<float>(v)); std::memcpy(out, &x, 2); break; }
    case ef::DataType::kFp8E4M3: { auto x = host::float_to_fp8_e4m3(static_cast<float>(v)); std::memcpy(out, &x, 1); break; }
    case ef::DataType::kFp8E5M2: { auto x = host::float_to_fp8_e5m2(static_cast<float>(v)); std::memcpy(out, &x, 1); break; }
  }
}

inline double decode(ef::DataType t, const void* in) {
  switch (t) {
    case ef::DataType::kInt8: { int8_t x; std::memcpy(&x, in, 1); return x; }
    case ef::DataType::kUint8: { uint8_t x; std::memcpy(&x, in, 1); return x; }
    case ef::DataType::kInt32: { int32_t x; std::memcpy(&x, in, 4); return x; }
    case ef::DataType::kUint32: { uint32_t x; std::memcpy(&x, in, 4); return x; }
    case ef::DataType::kInt64: { int64_t x; std::memcpy(&x, in, 8); return static_cast<double>(x); }
    case ef::DataType::kUint64: { uint64_t x; std::memcpy(&x, in, 8); return static_cast<double>(x); }
    case ef::DataType::kFloat16: { uint16_t x; std::memcpy(&x, in, 2); return host::half_to_float(x); }
    case ef::DataType::kFloat32: { float x; std::memcpy(&x, in, 4); return x; }
    case ef::DataType::kFloat64: { double x; std::memcpy(&x, in, 8); return x; }
    case ef::DataType::kBFloat16: { uint16_t x; std::memcpy(&x, in, 2); return host::bfloat16_to_float(x); }
    case ef::DataType::kFp8E4M3: { uint8_t x; std::memcpy(&x, in, 1); return host::fp8_e4m3_to_float(x); }
    case ef::DataType::kFp8E5M2: { uint8_t x; std::memcpy(&x, in, 1); return host::fp8_e5m2_to_float(x); }
  }
  return 0;
}

/// Relative tolerance of a reduced value in `t` (the reduction order differs from the host's).
inline double tolerance(ef::DataType t) {
  switch (t) {
    case ef::DataType::kFloat16: return 1.0 / 256;
    case ef::DataType::kBFloat16: return 1.0 / 64;
    case ef::DataType::kFp8E4M3: return 1.0 / 4;
    case ef::DataType::kFp8E5M2: return 1.0 / 2;
    case ef::DataType::kFloat32: return 1e-5;
    case ef::DataType::kFloat64: return 1e-12;
    default: return 0;
  }
}

}  // namespace efccl::runtime::testing
