// What the GPU interpreter's tests share: GPU presence, the buffers of one call on the GPUs
// and on the host (laid out as the NCCL API defines them, filled with the same random
// contents), the comparison with the host reference executor, streams. Header-only.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "efccl/device/device_executor.h"
#include "efccl/ef/program.h"
#include "efccl/host/executor.h"
#include "efccl/host/numeric.h"

namespace efccl::test_support {

using ef::DataType;
using ef::RedOp;

// ---- GPU presence ----

inline int visible_gpus(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (why != nullptr) {
    *why = "no CUDA device visible (cudaGetDeviceCount=" + std::to_string(n) + ", error " +
           cudaGetErrorName(e) + ")";
  }
  return n;
}

/// Skips the test, saying why, when no CUDA device is visible.
#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    std::string why;                                                         \
    if (::efccl::test_support::visible_gpus(&why) == 0) GTEST_SKIP() << why; \
  } while (0)

#define ASSERT_CUDA(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

// ---- Protocols, rank mappings, modes ----

constexpr ef::Protocol kProtocols[] = {ef::Protocol::kSimple, ef::Protocol::kLL,
                                       ef::Protocol::kLL128};
constexpr ef::Protocol kFlaggedProtocols[] = {ef::Protocol::kLL, ef::Protocol::kLL128};

inline std::string protocol_name(ef::Protocol p) { return std::string(ef::to_string(p)); }

inline std::vector<int> map_ranks(int nranks, bool spread) {
  const int ngpus = spread ? visible_gpus(nullptr) : 1;
  std::vector<int> devices(nranks);
  for (int r = 0; r < nranks; ++r) devices[r] = static_cast<int>(int64_t{r} * ngpus / nranks);
  return devices;
}

inline std::vector<bool> modes(const ef::Program& p) {
  std::vector<bool> m;
  if (p.outofplace) m.push_back(false);
  if (p.inplace) m.push_back(true);
  return m;
}

// ---- Inputs ----

/// Random elements that keep sums and products finite (bitwise comparison must not depend on
/// NaN payloads, which CPUs and GPUs produce differently).
inline std::vector<uint8_t> random_elements(DataType t, uint64_t n, std::mt19937_64& rng) {
  const std::size_t size = ef::size_of(t);
  std::vector<uint8_t> bytes(n * size);
  std::uniform_real_distribution<double> real(-2.0, 2.0);
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t* at = bytes.data() + i * size;
    switch (t) {
      case DataType::kFloat32: {
        const auto v = static_cast<float>(real(rng));
        std::memcpy(at, &v, 4);
        break;
      }
      case DataType::kFloat64: {
        const double v = real(rng);
        std::memcpy(at, &v, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t v = host::float_to_half(static_cast<float>(real(rng)));
        std::memcpy(at, &v, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t v = host::float_to_bfloat16(static_cast<float>(real(rng)));
        std::memcpy(at, &v, 2);
        break;
      }
      case DataType::kFp8E4M3:
        *at = host::float_to_fp8_e4m3(static_cast<float>(real(rng)));
        break;
      case DataType::kFp8E5M2:
        *at = host::float_to_fp8_e5m2(static_cast<float>(real(rng)));
        break;
      default: {  // integers: any bits (sums and products wrap)
        const uint64_t v = rng();
        std::memcpy(at, &v, size);
      }
    }
  }
  return bytes;
}

// ---- Device memory ----

class DeviceMemory {
 public:
  DeviceMemory(int device, std::size_t bytes) : device_(device) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    if (cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 1)) != cudaSuccess) ptr_ = nullptr;
    cudaSetDevice(previous);
  }
  ~DeviceMemory() {
    if (ptr_ != nullptr) {
      int previous = 0;
      cudaGetDevice(&previous);
      cudaSetDevice(device_);
      cudaFree(ptr_);
      cudaSetDevice(previous);
    }
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  int device_;
  void* ptr_ = nullptr;
};

/// One call's buffers on the GPUs and on the host, laid out as the NCCL API defines them.
///
/// Host executor convention (executor.h): for in-place calls `output` holds the shared region
/// and `input` is empty. The shared region is the larger API buffer: the output when the input
/// lies inside it (allreduce, allgather, ...), the input when the output lies inside it
/// (reducescatter, scatter on the root). Ranks without aliasing (non-root ranks of rooted
/// collectives) keep separate buffers.
struct CallBuffers {
  struct Rank {
    std::unique_ptr<DeviceMemory> input, output;  ///< absent when shared or empty
    std::unique_ptr<DeviceMemory> region;         ///< in-place shared region
    const void* input_ptr = nullptr;
    void* output_ptr = nullptr;
    char* region_base = nullptr;  ///< device copy source of host.output when shared
    std::size_t region_bytes = 0;
    std::size_t input_bytes = 0, output_bytes = 0;
    bool shared = false;
  };
  std::vector<Rank> ranks;
  std::vector<host::RankBuffers> host;  ///< the same contents, for the host executor
};

/// Fills both sides with the same random contents. `misalign` shifts every device buffer by
/// one element (so that no operand is 16-byte aligned).
inline void make_buffers(const ef::Program& p, const std::vector<int>& devices, uint64_t count,
                         DataType dtype, bool inplace, bool misalign, uint64_t seed,
                         CallBuffers& out) {
  const std::size_t size = ef::size_of(dtype);
  const std::size_t shift = misalign ? size : 0;
  std::mt19937_64 rng(seed);
  out.ranks.clear();
  out.ranks.resize(p.nranks);
  out.host.assign(p.nranks, {});
  for (int r = 0; r < p.nranks; ++r) {
    auto& b = out.ranks[r];
    auto& h = out.host[r];
    const uint64_t in = ef::api_input_elements(p, r, count);
    const uint64_t outn = ef::api_output_elements(p, r, count);
    const auto alias = inplace ? ef::inplace_alias(p, r, count) : std::nullopt;
    if (alias) {
      b.shared = true;
      // The host executor's shared region: the larger buffer, covering the inner one.
      const uint64_t region = alias->input_inside_output
                                  ? std::max(outn, alias->offset_elements + in)
                                  : std::max(in, alias->offset_elements + outn);
      b.region_bytes = region * size;
      b.region = std::make_unique<DeviceMemory>(devices[r], b.region_bytes + 2 * size);
      b.region_base = b.region->get() + shift;
      h.output = random_elements(dtype, region, rng);
      char* inner = b.region_base + alias->offset_elements * size;
      b.input_ptr = alias->input_inside_output ? inner : b.region_base;
      b.output_ptr = alias->input_inside_output ? b.region_base : inner;
      cudaMemcpy(b.region_base, h.output.data(), b.region_bytes, cudaMemcpyHostToDevice);
    } else {
      b.input_bytes = in * size;
      b.output_bytes = outn * size;
      h.input = random_elements(dtype, in, rng);
      h.output = random_elements(dtype, outn, rng);
      if (in > 0) {
        b.input = std::make_unique<DeviceMemory>(devices[r], b.input_bytes + 2 * size);
        b.input_ptr = b.input->get() + shift;
        cudaMemcpy(const_cast<void*>(b.input_ptr), h.input.data(), b.input_bytes,
                   cudaMemcpyHostToDevice);
      }
      if (outn > 0) {
        b.output = std::make_unique<DeviceMemory>(devices[r], b.output_bytes + 2 * size);
        b.output_ptr = b.output->get() + shift;
        cudaMemcpy(b.output_ptr, h.output.data(), b.output_bytes, cudaMemcpyHostToDevice);
      }
    }
  }
  cudaStreamSynchronize(cudaStreamLegacy);  // pageable copies' DMA may still be running
}

/// Rewrites the inputs on both sides (between graph replays), keeping the buffers.
inline void refill_inputs(const ef::Program& p, DataType dtype, uint64_t seed, CallBuffers& bufs) {
  std::mt19937_64 rng(seed);
  const std::size_t size = ef::size_of(dtype);
  for (int r = 0; r < p.nranks; ++r) {
    auto& b = bufs.ranks[r];
    auto& h = bufs.host[r];
    if (b.shared) {
      h.output = random_elements(dtype, b.region_bytes / size, rng);
      cudaMemcpy(b.region_base, h.output.data(), b.region_bytes, cudaMemcpyHostToDevice);
    } else {
      h.input = random_elements(dtype, b.input_bytes / size, rng);
      h.output = random_elements(dtype, b.output_bytes / size, rng);
      if (b.input_bytes > 0)
        cudaMemcpy(const_cast<void*>(b.input_ptr), h.input.data(), b.input_bytes,
                   cudaMemcpyHostToDevice);
      if (b.output_bytes > 0)
        cudaMemcpy(b.output_ptr, h.output.data(), b.output_bytes, cudaMemcpyHostToDevice);
    }
  }
  cudaStreamSynchronize(cudaStreamLegacy);  // pageable copies' DMA may still be running
}

/// Empty when the GPU's buffers equal the host executor's, else the first difference. `only`:
/// the ranks to compare (null: all; multi-process tests compare their own).
inline std::string compare(const ef::Program& p, DataType dtype, const CallBuffers& bufs,
                           const std::vector<bool>* only = nullptr) {
  const std::size_t size = ef::size_of(dtype);
  auto check = [&](int r, const char* what, const void* device,
                   const std::vector<uint8_t>& want) -> std::string {
    std::vector<uint8_t> got(want.size());
    if (!want.empty() &&
        cudaMemcpy(got.data(), device, want.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      return std::string("cudaMemcpy back failed: ") + cudaGetErrorString(cudaGetLastError());
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (got[i] == want[i]) continue;
      const std::size_t e = i / size;
      std::ostringstream o;
      o << "rank " << r << " " << what << " element " << e << " of " << want.size() / size
        << ": host 0x";
      for (std::size_t k = size; k-- > 0;) o << std::hex << int{want[e * size + k]};
      o << ", gpu 0x";
      for (std::size_t k = size; k-- > 0;) o << std::hex << int{got[e * size + k]};
      return o.str();
    }
    return {};
  };
  for (int r = 0; r < p.nranks; ++r) {
    if (only != nullptr && !(*only)[r]) continue;
    const auto& b = bufs.ranks[r];
    const auto& h = bufs.host[r];
    std::string d;
    if (b.shared) {
      d = check(r, "in-place region", b.region_base, h.output);
    } else {
      d = check(r, "output", b.output_ptr, h.output);
      if (d.empty()) d = check(r, "input", b.input_ptr, h.input);
    }
    if (!d.empty()) return d;
  }
  return {};
}

inline device::RunArgs run_args(const ef::Program& p, const CallBuffers& bufs, uint64_t count,
                                DataType dtype, RedOp op, bool inplace,
                                const std::vector<cudaStream_t>& streams) {
  device::RunArgs a;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.inplace = inplace;
  if (op == RedOp::kPreMulSum)
    for (int r = 0; r < p.nranks; ++r) a.premul_scalars.push_back(1.0 + 0.25 * (r % 4));
  for (int r = 0; r < p.nranks; ++r) {
    a.inputs.push_back(bufs.ranks[r].input_ptr);
    a.outputs.push_back(bufs.ranks[r].output_ptr);
  }
  a.streams = streams;
  return a;
}

inline host::ExecOptions host_options(const device::RunArgs& a, std::size_t slot_bytes) {
  host::ExecOptions o;
  o.count = a.count;
  o.dtype = a.dtype;
  o.op = a.op;
  o.inplace = a.inplace;
  o.premul_scalars = a.premul_scalars;
  o.slot_bytes = slot_bytes;
  o.connection_slots = ef::kDefaultConnectionSlots;
  return o;
}

/// Streams for the executor's devices (default flags; destroyed with the fixture).
class Streams {
 public:
  explicit Streams(const std::vector<int>& devices) {
    for (int d : devices) {
      cudaSetDevice(d);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      streams_.push_back(s);
    }
    cudaSetDevice(0);
  }
  ~Streams() {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  const std::vector<cudaStream_t>& get() const { return streams_; }

 private:
  std::vector<cudaStream_t> streams_;
};

struct MatrixEntry {
  DataType dtype;
  RedOp op;
};

/// Runs one call on the GPU and on the host and compares; returns a failure description.
inline std::string run_and_compare(device::DeviceExecutor& executor, const ef::Program& p,
                                   const std::vector<int>& devices, const Streams& streams,
                                   uint64_t count, DataType dtype, RedOp op, bool inplace,
                                   bool misalign, uint64_t seed, std::size_t slot_bytes) {
  CallBuffers bufs;
  make_buffers(p, devices, count, dtype, inplace, misalign, seed, bufs);
  const auto args = run_args(p, bufs, count, dtype, op, inplace, streams.get());
  if (Status s = executor.run_and_wait(args); !s) return "GPU run failed: " + s.message();
  if (count == 0) return compare(p, dtype, bufs);  // nothing runs: buffers stay as they were
  auto result = host::execute(p, host_options(args, slot_bytes), bufs.host);
  if (!result.status) return "host executor failed: " + result.status.message();
  return compare(p, dtype, bufs);
}

inline std::string describe(DataType dtype, RedOp op, bool inplace, uint64_t count) {
  return std::string(ef::to_string(dtype)) + "/" + std::string(ef::to_string(op)) +
         (inplace ? " in-place" : " out-of-place") + " count " + std::to_string(count);
}

}  // namespace efccl::test_support
