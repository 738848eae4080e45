// The balancer on real GPUs, through the NCCL API (libefccl.so): a lone pair GPU 0 -> GPU 1
// and a skewed all-to-all-v over every GPU (2-4), each with the balancer off (EFCCL_BALANCE=0)
// and on, in one process (ncclCommInitAll). Prints nccl-tests-style bandwidth per size, the
// paths the balanced plans ran, and their measured time beside the timing model's prediction
// (from the statistics the communicator writes when it ends, EFCCL_BALANCE_STATS).
//
//   balance_bench [--gpus N] [--sizes 64M,256M,1G] [--iters 20] [--hot 512M] [--cold 16M]
//
// Lone pair: rank 0 sends `size` bytes to rank 1, nothing else (algbw = size / time).
// All-to-all-v: n ranks, one buffer each way; rank 0 sends --hot bytes to rank 1, every other
// pair --cold bytes (PyTorch's all_to_all_single with splits: grouped ncclSend/ncclRecv at
// offsets of one buffer); time per call and the hot pair's bandwidth.
// Times: the best of 3 rounds of --iters back-to-back calls, synchronised at the end.
// Run with NCCL_NVLS_ENABLE=0 (as the lead's script does) where NCCL's algorithms may be
// compared; EFCCL_BALANCE_TOPOLOGY may put the plans on another machine's topology.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench_args.h"

namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "balance_bench: %s\n", message.c_str());
  std::exit(1);
}
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    die(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}

uint64_t parse_size(std::string_view s) {
  const auto v = efccl::bench::parse_size(s);
  if (!v) die("not a size: " + std::string(s));
  return *v;
}

std::string human(double bytes) {
  char t[32];
  if (bytes >= double(1 << 30))
    std::snprintf(t, sizeof(t), "%.0fG", bytes / double(1 << 30));
  else
    std::snprintf(t, sizeof(t), "%.0fM", bytes / double(1 << 20));
  return t;
}

struct Comms {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  explicit Comms(std::vector<int> devs) : devices(std::move(devs)) {
    comms.resize(devices.size());
    check(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()),
          "ncclCommInitAll");
    for (int d : devices) {
      check(cudaSetDevice(d), "cudaSetDevice");
      cudaStream_t s = nullptr;
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
      streams.push_back(s);
    }
  }
  ~Comms() {
    for (std::size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(devices[r]);
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
      ncclCommDestroy(comms[r]);
    }
  }
  void sync() {
    for (std::size_t r = 0; r < streams.size(); ++r) {
      check(cudaSetDevice(devices[r]), "cudaSetDevice");
      check(cudaStreamSynchronize(streams[r]), "cudaStreamSynchronize");
    }
  }
};

/// Microseconds per call: the best of 3 rounds of `iters` calls (after 2 warm-up calls).
double time_calls(Comms& c, int iters, const std::function<void()>& call) {
  for (int i = 0; i < 2; ++i) call();
  c.sync();
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    c.sync();
    best = std::min(
        best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                      .count() /
                  iters);
  }
  return best;
}

void* device_buffer(int device, uint64_t bytes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<uint64_t>(bytes, 1)), "cudaMalloc");
  check(cudaMemset(p, 1, bytes), "cudaMemset");
  return p;
}

/// The plans a statistics file lists, printed; returns their count.
int print_plans(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int plans = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json stats = nlohmann::json::parse(line);
    for (const nlohmann::json& p : stats["plans"]) {
      ++plans;
      std::printf(
          "    plan #%d (%s): %zu runs, measured %s us (mean of %zu), predicted %s us "
          "(default paths %s us)\n",
          p["id"].get<int>(), p["kind"].get<std::string>().c_str(), p["runs"].get<std::size_t>(),
          p["measured_us"].is_null()
              ? "-"
              : std::to_string(p["measured_us"]["mean"].get<double>()).c_str(),
          p["measured_runs"].get<std::size_t>(),
          p["predicted_us"].is_null() ? "-"
                                      : std::to_string(p["predicted_us"].get<double>()).c_str(),
          p["direct_predicted_us"].is_null()
              ? "-"
              : std::to_string(p["direct_predicted_us"].get<double>()).c_str());
      for (const nlohmann::json& pair : p["pairs"]) {
        std::string paths;
        for (const nlohmann::json& path_share : pair["paths"])
          paths += " [" + path_share["via"].get<std::string>() + " " +
                   human(path_share["bytes"].get<double>()) + "]";
        std::printf("      %d -> %d:%s\n", pair["src"].get<int>(), pair["dst"].get<int>(),
                    paths.c_str());
        break;  // the first split pair is enough to see the paths
      }
    }
  }
  return plans;
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = 0;
  check(cudaGetDeviceCount(&gpus), "cudaGetDeviceCount");
  std::vector<uint64_t> sizes = {64ull << 20, 256ull << 20, 1ull << 30};
  int iters = 20;
  uint64_t hot = 512ull << 20, cold = 16ull << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--gpus") {
      gpus = std::min(gpus, std::atoi(value().c_str()));
    } else if (a == "--iters") {
      iters = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--hot") {
      hot = parse_size(value());
    } else if (a == "--cold") {
      cold = parse_size(value());
    } else if (a == "--sizes") {
      sizes.clear();
      std::string list = value();
      for (std::size_t at = 0; at <= list.size();) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        sizes.push_back(parse_size(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else {
      die("unknown argument " + a);
    }
  }
  if (gpus < 2) die("needs at least 2 GPUs (" + std::to_string(gpus) + " visible)");
  gpus = std::min(gpus, 4);
  const std::string stats = "/tmp/efccl-balance-bench-" + std::to_string(getpid()) + ".json";
  const char* topology = std::getenv("EFCCL_BALANCE_TOPOLOGY");
  std::printf("balance_bench: %d GPUs, topology %s, %d iterations per round\n", gpus,
              topology != nullptr ? topology : "(the machine graph)", iters);

  // Lone pair 0 -> 1.
  std::printf("\nlone pair GPU 0 -> GPU 1 (algbw GB/s)\n%10s %12s %12s %8s\n", "size", "off",
              "balanced", "gain");
  uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  void* src = device_buffer(0, largest);
  void* dst = device_buffer(1, largest);
  std::vector<double> off_us, on_us;
  for (int mode = 0; mode < 2; ++mode) {
    setenv("EFCCL_BALANCE", mode == 0 ? "0" : "1", 1);
    setenv("EFCCL_BALANCE_STATS", stats.c_str(), 1);
    Comms c({0, 1});
    for (uint64_t bytes : sizes)
      (mode == 0 ? off_us : on_us).push_back(time_calls(c, iters, [&] {
        check(ncclGroupStart(), "ncclGroupStart");
        check(ncclSend(src, bytes, ncclInt8, 1, c.comms[0], c.streams[0]), "ncclSend");
        check(ncclRecv(dst, bytes, ncclInt8, 0, c.comms[1], c.streams[1]), "ncclRecv");
        check(ncclGroupEnd(), "ncclGroupEnd");
      }));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i)
    std::printf("%10s %12.1f %12.1f %7.2fx\n", human(double(sizes[i])).c_str(),
                double(sizes[i]) / off_us[i] / 1e3, double(sizes[i]) / on_us[i] / 1e3,
                off_us[i] / on_us[i]);
  std::printf("  balanced plans:\n");
  if (print_plans(stats) == 0) std::printf("    (none: nothing to balance on this machine)\n");
  std::remove(stats.c_str());
  cudaSetDevice(0);
  cudaFree(src);
  cudaSetDevice(1);
  cudaFree(dst);

  // Skewed all-to-all-v over every GPU.
  const int n = gpus;
  std::vector<std::vector<uint64_t>> bytes(n, std::vector<uint64_t>(n, cold));
  for (int r = 0; r < n; ++r) bytes[r][r] = 0;
  bytes[0][1] = hot;
  std::vector<void*> send(n), recv(n);
  std::vector<std::vector<uint64_t>> send_off(n, std::vector<uint64_t>(n + 1, 0)),
      recv_off(n, std::vector<uint64_t>(n + 1, 0));
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q) {
      send_off[r][q + 1] = send_off[r][q] + bytes[r][q];
      recv_off[r][q + 1] = recv_off[r][q] + bytes[q][r];
    }
  for (int r = 0; r < n; ++r) {
    send[r] = device_buffer(r, send_off[r][n]);
    recv[r] = device_buffer(r, recv_off[r][n]);
  }
  std::printf("\nskewed all-to-all-v, %d GPUs: rank 0 -> 1 %s, every other pair %s\n", n,
              human(double(hot)).c_str(), human(double(cold)).c_str());
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = r;
  double us[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    setenv("EFCCL_BALANCE", mode == 0 ? "0" : "1", 1);
    Comms c(devices);
    us[mode] = time_calls(c, iters, [&] {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < n; ++r)
        for (int q = 0; q < n; ++q) {
          if (bytes[r][q] > 0)
            check(ncclSend(static_cast<char*>(send[r]) + send_off[r][q], bytes[r][q], ncclInt8, q,
                           c.comms[r], c.streams[r]),
                  "ncclSend");
          if (bytes[q][r] > 0)
            check(ncclRecv(static_cast<char*>(recv[r]) + recv_off[r][q], bytes[q][r], ncclInt8, q,
                           c.comms[r], c.streams[r]),
                  "ncclRecv");
        }
      check(ncclGroupEnd(), "ncclGroupEnd");
    });
  }
  std::printf("  off %10.1f us (hot pair %.1f GB/s)\n  on  %10.1f us (hot pair %.1f GB/s), %.2fx\n",
              us[0], double(hot) / us[0] / 1e3, us[1], double(hot) / us[1] / 1e3, us[0] / us[1]);
  std::printf("  balanced plans (measured: the group's launches, start to end):\n");
  if (print_plans(stats) == 0) std::printf("    (none: nothing to balance on this machine)\n");
  std::remove(stats.c_str());
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaFree(send[r]);
    cudaFree(recv[r]);
  }
  return 0;
}
