// Small-message latency through the NCCL API, split into what the host pays and what the GPUs
// pay: single process, one communicator per GPU (ncclCommInitAll), float sum.
//
//   latency_bench [--gpus N | --devices 0,0,...] [--min-bytes 8] [--max-bytes 64K] [--factor 4]
//                 [--iters 200] [--coll allreduce|sendrecv|allgather] [--repeats 3] [--group 1]
//                 [--no-graph]
//
// --devices gives each rank's CUDA device (one communicator per entry): "0,0" puts two ranks on
// GPU 0, which efccl allows and NCCL refuses.
//
// Linked against NVIDIA's libnccl: run it as is for NCCL, with LD_PRELOAD=libefccl.so for
// efccl (the way nccl-tests is run). Per size it prints, in microseconds per call (the best of
// --repeats rounds):
//   issue  host time to enqueue one call on every GPU (ncclGroupStart .. ncclGroupEnd),
//          measured over --iters back-to-back calls without waiting
//   eager  the same loop until the streams finish, divided by --iters (nccl-tests' number)
//   graph  --iters calls captured into one CUDA graph per GPU, replayed: GPU time only
// --group N: each ncclGroupStart/End holds N calls per GPU on separate buffers (PyTorch's
// coalesced collectives, nccl-tests -m N); times are still per call. The warm-up groups run
// before anything is timed or captured. --no-graph skips the graph column (long eager runs,
// e.g. under a profiler, without capturing --iters groups).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bench_args.h"

namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "latency_bench: %s\n", message.c_str());
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

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = 0;
  std::vector<int> devs;
  uint64_t min_bytes = 8, max_bytes = 64 * 1024, factor = 4;
  int iters = 200, repeats = 3, group = 1;
  bool graph = true;
  std::string coll = "allreduce";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die("missing value after " + std::string(a));
      return argv[++i];
    };
    if (a == "--gpus")
      gpus = static_cast<int>(parse_size(value()));
    else if (a == "--devices") {
      const std::string_view list = value();
      std::size_t at = 0;
      while (at <= list.size()) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        devs.push_back(static_cast<int>(parse_size(list.substr(at, comma - at))));
        at = comma + 1;
      }
    } else if (a == "--min-bytes")
      min_bytes = parse_size(value());
    else if (a == "--max-bytes")
      max_bytes = parse_size(value());
    else if (a == "--factor")
      factor = parse_size(value());
    else if (a == "--iters")
      iters = static_cast<int>(parse_size(value()));
    else if (a == "--repeats")
      repeats = static_cast<int>(parse_size(value()));
    else if (a == "--coll")
      coll = std::string(value());
    else if (a == "--group")
      group = static_cast<int>(parse_size(value()));
    else if (a == "--no-graph")
      graph = false;
    else
      die("unknown argument " + std::string(a) + " (see the comment at the top of the source)");
  }
  if (coll != "allreduce" && coll != "sendrecv" && coll != "allgather")
    die("--coll must be allreduce, sendrecv or allgather");
  if (factor < 2 || iters < 1 || repeats < 1 || min_bytes < 4 || group < 1 || group > 256)
    die("bad --factor/--iters/--repeats/--min-bytes/--group");
  int available = 0;
  check(cudaGetDeviceCount(&available), "cudaGetDeviceCount");
  if (!devs.empty()) {
    if (gpus != 0) die("--gpus and --devices are alternatives");
    for (int d : devs)
      if (d < 0 || d >= available)
        die("--devices names device " + std::to_string(d) + " but " + std::to_string(available) +
            " are visible");
    gpus = static_cast<int>(devs.size());
  } else {
    if (gpus == 0) gpus = available;
    if (gpus < 1 || gpus > available)
      die("--gpus " + std::to_string(gpus) + " but " + std::to_string(available) + " visible");
    for (int g = 0; g < gpus; ++g) devs.push_back(g);
  }
  std::vector<ncclComm_t> comms(gpus);
  check(ncclCommInitAll(comms.data(), gpus, devs.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(gpus);
  std::vector<float*> send(gpus), recv(gpus);
  const uint64_t max_elems = max_bytes / sizeof(float);
  for (int g = 0; g < gpus; ++g) {
    check(cudaSetDevice(devs[g]), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&send[g], max_bytes * gpus * group), "cudaMalloc");
    check(cudaMalloc(&recv[g], max_bytes * gpus * group), "cudaMalloc");
    check(cudaMemset(send[g], 0, max_bytes * gpus * group), "cudaMemset");
  }
  auto one_call = [&](size_t count) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (int k = 0; k < group; ++k) {
      const size_t at = static_cast<size_t>(k) * max_elems * gpus;  // this call's buffers
      for (int g = 0; g < gpus; ++g) {
        float* s = send[g] + at;
        float* r = recv[g] + at;
        if (coll == "allreduce") {
          check(ncclAllReduce(s, r, count, ncclFloat, ncclSum, comms[g], streams[g]),
                "ncclAllReduce");
        } else if (coll == "allgather") {
          check(ncclAllGather(s, r, count, ncclFloat, comms[g], streams[g]), "ncclAllGather");
        } else {
          check(ncclSend(s, count, ncclFloat, (g + 1) % gpus, comms[g], streams[g]), "ncclSend");
          check(ncclRecv(r, count, ncclFloat, (g + gpus - 1) % gpus, comms[g], streams[g]),
                "ncclRecv");
        }
      }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  };
  auto sync_all = [&] {
    for (int g = 0; g < gpus; ++g)
      check(cudaStreamSynchronize(streams[g]), "cudaStreamSynchronize");
  };

  std::printf(
      "# latency_bench %s, %d GPU(s), %d group(s) of %d call(s) per round, best of %d rounds "
      "(us per call)\n",
      coll.c_str(), gpus, iters, group, repeats);
  std::printf("# %10s %10s %10s %10s\n", "bytes", "issue", "eager", "graph");
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const size_t count = std::max<uint64_t>(1, std::min(max_elems, bytes / sizeof(float)));
    for (int w = 0; w < 20; ++w) one_call(count);
    sync_all();
    double best_issue = 1e30, best_eager = 1e30, best_graph = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = now_us();
      for (int it = 0; it < iters; ++it) one_call(count);
      const double t1 = now_us();
      sync_all();
      const double t2 = now_us();
      best_issue = std::min(best_issue, (t1 - t0) / iters / group);
      best_eager = std::min(best_eager, (t2 - t0) / iters / group);
    }
    if (!graph) {
      std::printf("  %10llu %10.2f %10.2f %10s\n",
                  static_cast<unsigned long long>(count * sizeof(float)), best_issue, best_eager,
                  "-");
      std::fflush(stdout);
      continue;
    }
    // Graphs: one per GPU, each stream captured on its own (as nccl-tests -G does).
    std::vector<cudaGraph_t> graphs(gpus);
    std::vector<cudaGraphExec_t> execs(gpus);
    for (int g = 0; g < gpus; ++g) {
      check(cudaSetDevice(devs[g]), "cudaSetDevice");
      check(cudaStreamBeginCapture(streams[g], cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture");
    }
    for (int it = 0; it < iters; ++it) one_call(count);
    // Every capture ends before any graph is instantiated (not allowed while this thread
    // still captures).
    for (int g = 0; g < gpus; ++g) {
      check(cudaSetDevice(devs[g]), "cudaSetDevice");
      check(cudaStreamEndCapture(streams[g], &graphs[g]), "cudaStreamEndCapture");
    }
    for (int g = 0; g < gpus; ++g) {
      check(cudaSetDevice(devs[g]), "cudaSetDevice");
      check(cudaGraphInstantiate(&execs[g], graphs[g], 0), "cudaGraphInstantiate");
    }
    for (int r = 0; r < repeats + 1; ++r) {
      const double t0 = now_us();
      for (int g = 0; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaGraphLaunch(execs[g], streams[g]), "cudaGraphLaunch");
      }
      sync_all();
      const double t1 = now_us();
      if (r > 0)
        best_graph = std::min(best_graph, (t1 - t0) / iters / group);  // the first warms up
    }
    for (int g = 0; g < gpus; ++g) {
      check(cudaGraphExecDestroy(execs[g]), "cudaGraphExecDestroy");
      check(cudaGraphDestroy(graphs[g]), "cudaGraphDestroy");
    }
    std::printf("  %10llu %10.2f %10.2f %10.2f\n",
                static_cast<unsigned long long>(count * sizeof(float)), best_issue, best_eager,
                best_graph);
    std::fflush(stdout);
  }
  for (int g = 0; g < gpus; ++g) check(ncclCommDestroy(comms[g]), "ncclCommDestroy");
  return 0;
}
