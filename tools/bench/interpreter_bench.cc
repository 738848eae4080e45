// Bandwidth and latency of the GPU interpreter on one program, without the NCCL API layer:
// generates a library algorithm (or loads a file), runs it on the given GPUs and prints
// nccl-tests-style rows (size, time, algbw, busbw) from CUDA-event timings.
//
//   interpreter_bench --algorithm ring_allreduce --devices 0,1 --instances 8
//       [--min-bytes 8] [--max-bytes 1G] [--factor 4] [--iters 20] [--warmup 5]
//       [--slot-bytes B] [--protocol Simple|LL|LL128]
//   interpreter_bench --file prog.json --devices 0,0,1,1 ...
#include <cuda_runtime_api.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_args.h"
#include "efccl/algorithms/algorithm_library.h"
#include "efccl/device/device_executor.h"
#include "efccl/ef/load.h"
#include "efccl/ef/validate.h"

namespace {

namespace ef = efccl::ef;

[[noreturn]] void die(const std::string& message) {
  std::cerr << "interpreter_bench: " << message << '\n';
  std::exit(1);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

uint64_t parse_size(std::string_view s) {
  const auto v = efccl::bench::parse_size(s);
  if (!v) die("bad size '" + std::string(s) + "'");
  return *v;
}

ef::Protocol parse_protocol_option(std::string_view s) {
  const auto protocol = ef::parse_protocol(s);
  if (!protocol) die("--protocol must be Simple, LL or LL128, got '" + std::string(s) + "'");
  return *protocol;
}

std::vector<int> parse_devices(std::string_view s) {
  std::vector<int> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    out.push_back(static_cast<int>(parse_size(s.substr(0, comma))));
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
  }
  return out;
}

/// nccl-tests' bus-bandwidth factor: how many times the data crosses the slowest link.
double bus_factor(ef::Collective c, int n) {
  switch (c) {
    case ef::Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case ef::Collective::kAllGather:
    case ef::Collective::kReduceScatter:
    case ef::Collective::kAllToAll:
      return static_cast<double>(n - 1) / n;
    default:
      return 1.0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string algorithm = "ring_allreduce", file;
  std::vector<int> devices = {0, 1};
  int instances = 1, channels = 1, iters = 20, warmup = 5;
  uint64_t min_bytes = 8, max_bytes = 1ull << 30, factor = 4;
  std::size_t slot_bytes = 0;
  std::optional<ef::Protocol> protocol;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--algorithm") algorithm = next();
    else if (a == "--file") file = next();
    else if (a == "--devices") devices = parse_devices(next());
    else if (a == "--instances") instances = static_cast<int>(parse_size(next()));
    else if (a == "--channels") channels = static_cast<int>(parse_size(next()));
    else if (a == "--iters") iters = static_cast<int>(parse_size(next()));
    else if (a == "--warmup") warmup = static_cast<int>(parse_size(next()));
    else if (a == "--min-bytes") min_bytes = parse_size(next());
    else if (a == "--max-bytes") max_bytes = parse_size(next());
    else if (a == "--factor") factor = std::max<uint64_t>(2, parse_size(next()));
    else if (a == "--slot-bytes") slot_bytes = parse_size(next());
    else if (a == "--protocol") protocol = parse_protocol_option(next());
    else die("unknown option '" + std::string(a) + "'");
  }

  ef::Program program;
  if (!file.empty()) {
    auto loaded = ef::load_program_file(file);
    if (!loaded.program) die(loaded.diagnostics.empty() ? "cannot load " + file
                                                        : loaded.diagnostics[0].to_string());
    program = std::move(*loaded.program);
  } else {
    efccl::algorithms::AlgorithmParams params;
    params.ranks = static_cast<int32_t>(devices.size());
    params.instances = instances;
    params.channels = channels;
    auto generated = efccl::algorithms::generate_algorithm(algorithm, params);
    if (!generated) die(generated.status().message());
    program = std::move(*generated);
  }
  if (protocol) program.protocol = *protocol;  // never changes results (§5), only the wire
  if (static_cast<std::size_t>(program.nranks) != devices.size())
    die("the program has " + std::to_string(program.nranks) + " ranks but --devices names " +
        std::to_string(devices.size()));

  efccl::device::ExecutorConfig config;
  if (slot_bytes) config.slot_bytes = slot_bytes;
  auto created = efccl::device::DeviceExecutor::create(program, devices, config);
  if (!created) die(created.status().message());
  efccl::device::DeviceExecutor& ex = **created;

  const auto dtype = ef::DataType::kFloat32;
  const int n = program.nranks;
  const uint64_t gran = ef::count_granularity(program);
  const uint64_t max_count = std::max<uint64_t>(gran, max_bytes / 4 / gran * gran);
  std::vector<void*> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    check(cudaSetDevice(devices[r]), "cudaSetDevice");
    const uint64_t in_bytes = ef::api_input_elements(program, r, max_count) * 4;
    const uint64_t out_bytes = ef::api_output_elements(program, r, max_count) * 4;
    if (in_bytes) check(cudaMalloc(&in[r], in_bytes), "cudaMalloc");
    if (out_bytes) check(cudaMalloc(&out[r], out_bytes), "cudaMalloc");
    if (in_bytes) check(cudaMemset(in[r], 0x3c, in_bytes), "cudaMemset");
  }
  if (auto s = ex.reserve(max_count, dtype); !s) die(s.message());
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> start, stop;
  for (int d : ex.devices()) {
    check(cudaSetDevice(d), "cudaSetDevice");
    cudaStream_t s;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    streams.push_back(s);
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "cudaEventCreate");
    check(cudaEventCreate(&b), "cudaEventCreate");
    start.push_back(a);
    stop.push_back(b);
  }

  std::printf("# %s: %d ranks on devices", program.name.c_str(), n);
  for (int d : devices) std::printf(" %d", d);
  std::printf(", %zu threadblocks on rank 0, %s, slot %zu B\n",
              program.ranks[0].threadblocks.size(),
              std::string(ef::to_string(program.protocol)).c_str(), ex.slot_bytes());
  std::printf("%14s %14s %10s %10s %10s\n", "size(B)", "count", "time(us)", "algbw", "busbw");
  // Sizes as nccl-tests counts them: the per-rank buffer the collective's count describes.
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    uint64_t count = bytes / 4;
    if (ef::count_is_per_block(program.collective)) count /= static_cast<uint64_t>(n);
    count = std::max<uint64_t>(gran, count / gran * gran);
    efccl::device::RunArgs args;
    args.count = count;
    args.dtype = dtype;
    for (int r = 0; r < n; ++r) {
      args.inputs.push_back(in[r]);
      args.outputs.push_back(out[r]);
    }
    args.streams = streams;
    for (int w = 0; w < warmup; ++w)
      if (auto s = ex.run(args); !s) die(s.message());
    if (auto s = ex.wait(args); !s) die(s.message());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      check(cudaSetDevice(ex.devices()[i]), "cudaSetDevice");
      check(cudaEventRecord(start[i], streams[i]), "cudaEventRecord");
    }
    for (int it = 0; it < iters; ++it)
      if (auto s = ex.run(args); !s) die(s.message());
    for (std::size_t i = 0; i < streams.size(); ++i) {
      check(cudaSetDevice(ex.devices()[i]), "cudaSetDevice");
      check(cudaEventRecord(stop[i], streams[i]), "cudaEventRecord");
    }
    if (auto s = ex.wait(args); !s) die(s.message());
    float worst_ms = 0;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start[i], stop[i]), "cudaEventElapsedTime");
      worst_ms = std::max(worst_ms, ms);
    }
    const double us = 1000.0 * worst_ms / iters;
    const double size = static_cast<double>(ef::count_is_per_block(program.collective)
                                                ? count * n * 4
                                                : count * 4);
    const double algbw = size / us / 1e3;  // GB/s
    std::printf("%14.0f %14llu %10.2f %10.2f %10.2f\n", size,
                static_cast<unsigned long long>(count), us, algbw,
                algbw * bus_factor(program.collective, n));
  }
  return 0;
}
