// Small-message latency through the NCCL API, split into what the host pays and what the GPUs
// pay: single process, one communicator per GPU (ncclCommInitAll), float sum.
//
//   latency_bench [--gpus N | --devices 0,0,...] [--min-bytes 8] [--max-bytes 64K] [--factor 4]
//                 [--iters 200] [--coll allreduce|sendrecv|allgather|reducescatter|broadcast|reduce]
//                 [--repeats 3] [--group 1]
//                 [--no-graph] [--bw 64M] [--bw-iters 20] [--inplace]
//
// --devices gives each rank's CUDA device (one communicator per entry): "0,0" puts two ranks on
// GPU 0, which efccl allows and NCCL refuses. Sizes are a rank's count x 4 bytes (allgather: its
// input, reduce-scatter: its output); broadcast and reduce use root 0.
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
// When ranks share a GPU (--devices 0,0), the graph column captures every rank's stream into
// one graph (the others fork from the first rank's capture and join it again), since efccl
// joins the streams of ranks on one GPU around each launch.
// --bw BYTES: afterwards, --bw-iters eager calls of BYTES per rank (best of --repeats): the
// time per call, algbw (nccl-tests' size / time: allgather's whole output, reduce-scatter's
// whole input, BYTES otherwise) and busbw (nccl-tests' factor: allreduce 2(n-1)/n, allgather
// and reduce-scatter (n-1)/n, sendrecv, broadcast and reduce 1), GB/s.
// --inplace: the collectives in place (NCCL's aliasing), sendrecv as before.
// Direct transfers between ranks sharing a GPU (docs/device-executor.md): EFCCL_DIRECT=0 / 1,
// printed on the first line too.
// Resident interpreter vs launches (docs/performance.md): run it twice under LD_PRELOAD, with
// EFCCL_RESIDENT=0 and =1; the first line says which.
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
  int iters = 200, repeats = 3, group = 1, bw_iters = 20;
  bool inplace = false;
  uint64_t bw_bytes = 0;
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
    else if (a == "--inplace")
      inplace = true;
    else if (a == "--no-graph")
      graph = false;
    else if (a == "--bw")
      bw_bytes = parse_size(value());
    else if (a == "--bw-iters")
      bw_iters = static_cast<int>(parse_size(value()));
    else
      die("unknown argument " + std::string(a) + " (see the comment at the top of the source)");
  }
  if (coll != "allreduce" && coll != "sendrecv" && coll != "allgather" &&
      coll != "reducescatter" && coll != "broadcast" && coll != "reduce")
    die("--coll must be allreduce, sendrecv, allgather, reducescatter, broadcast or reduce");
  if (factor < 2 || iters < 1 || repeats < 1 || min_bytes < 4 || group < 1 || group > 256 ||
      bw_iters < 1 || (bw_bytes != 0 && bw_bytes < 4))
    die("bad --factor/--iters/--repeats/--min-bytes/--group/--bw/--bw-iters");
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
  // Ranks sharing a GPU: one graph for every rank's stream (see the top).
  std::vector<int> sorted_devs = devs;
  std::sort(sorted_devs.begin(), sorted_devs.end());
  const bool joined_graph =
      std::adjacent_find(sorted_devs.begin(), sorted_devs.end()) != sorted_devs.end();
  std::vector<ncclComm_t> comms(gpus);
  check(ncclCommInitAll(comms.data(), gpus, devs.data()), "ncclCommInitAll");
  std::vector<cudaStream_t> streams(gpus);
  std::vector<float*> send(gpus), recv(gpus);
  const uint64_t buffer_bytes = std::max(max_bytes, bw_bytes);
  const uint64_t max_elems = buffer_bytes / sizeof(float);
  for (int g = 0; g < gpus; ++g) {
    check(cudaSetDevice(devs[g]), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&send[g], buffer_bytes * gpus * group), "cudaMalloc");
    check(cudaMalloc(&recv[g], buffer_bytes * gpus * group), "cudaMalloc");
    check(cudaMemset(send[g], 0, buffer_bytes * gpus * group), "cudaMemset");
  }
  auto one_call = [&](size_t count) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (int k = 0; k < group; ++k) {
      const size_t at = static_cast<size_t>(k) * max_elems * gpus;  // this call's buffers
      for (int g = 0; g < gpus; ++g) {
        float* s = send[g] + at;
        float* r = recv[g] + at;
        if (inplace && (coll == "allreduce" || coll == "broadcast" || coll == "reduce")) s = r;
        if (inplace && coll == "allgather") s = r + static_cast<size_t>(g) * count;
        if (inplace && coll == "reducescatter") r = s + static_cast<size_t>(g) * count;
        if (coll == "allreduce") {
          check(ncclAllReduce(s, r, count, ncclFloat, ncclSum, comms[g], streams[g]),
                "ncclAllReduce");
        } else if (coll == "allgather") {
          check(ncclAllGather(s, r, count, ncclFloat, comms[g], streams[g]), "ncclAllGather");
        } else if (coll == "reducescatter") {
          check(ncclReduceScatter(s, r, count, ncclFloat, ncclSum, comms[g], streams[g]),
                "ncclReduceScatter");
        } else if (coll == "broadcast") {
          check(ncclBroadcast(s, r, count, ncclFloat, 0, comms[g], streams[g]), "ncclBroadcast");
        } else if (coll == "reduce") {
          check(ncclReduce(s, r, count, ncclFloat, ncclSum, 0, comms[g], streams[g]),
                "ncclReduce");
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

  const char* resident = std::getenv("EFCCL_RESIDENT");
  const char* direct = std::getenv("EFCCL_DIRECT");
  std::printf(
      "# latency_bench %s, %d rank(s) on devices", coll.c_str(), gpus);
  for (int d : devs) std::printf(" %d", d);
  std::printf(", %d group(s) of %d call(s) per round, best of %d rounds (us per call), "
              "EFCCL_RESIDENT=%s EFCCL_DIRECT=%s%s%s\n",
              iters, group, repeats, resident != nullptr ? resident : "(unset)",
              direct != nullptr ? direct : "(unset)", inplace ? ", in place" : "",
              joined_graph && graph ? ", one graph for all ranks" : "");
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
    // Joined: one graph (the first rank's), the other streams forked from its capture.
    const int ngraphs = joined_graph ? 1 : gpus;
    std::vector<cudaGraph_t> graphs(ngraphs);
    std::vector<cudaGraphExec_t> execs(ngraphs);
    std::vector<cudaEvent_t> fork(gpus), join(gpus);
    if (joined_graph) {
      for (int g = 0; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaEventCreateWithFlags(&fork[g], cudaEventDisableTiming), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&join[g], cudaEventDisableTiming), "cudaEventCreate");
      }
      check(cudaSetDevice(devs[0]), "cudaSetDevice");
      check(cudaStreamBeginCapture(streams[0], cudaStreamCaptureModeThreadLocal),
            "cudaStreamBeginCapture");
      check(cudaEventRecord(fork[0], streams[0]), "cudaEventRecord");
      for (int g = 1; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaStreamWaitEvent(streams[g], fork[0], 0), "cudaStreamWaitEvent");
      }
    } else {
      for (int g = 0; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaStreamBeginCapture(streams[g], cudaStreamCaptureModeThreadLocal),
              "cudaStreamBeginCapture");
      }
    }
    for (int it = 0; it < iters; ++it) one_call(count);
    // Every capture ends before any graph is instantiated (not allowed while this thread
    // still captures).
    if (joined_graph) {
      for (int g = 1; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaEventRecord(join[g], streams[g]), "cudaEventRecord");
        check(cudaSetDevice(devs[0]), "cudaSetDevice");
        check(cudaStreamWaitEvent(streams[0], join[g], 0), "cudaStreamWaitEvent");
      }
      check(cudaSetDevice(devs[0]), "cudaSetDevice");
      check(cudaStreamEndCapture(streams[0], &graphs[0]), "cudaStreamEndCapture");
    } else {
      for (int g = 0; g < gpus; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaStreamEndCapture(streams[g], &graphs[g]), "cudaStreamEndCapture");
      }
    }
    for (int g = 0; g < ngraphs; ++g) {
      check(cudaSetDevice(devs[g]), "cudaSetDevice");
      check(cudaGraphInstantiate(&execs[g], graphs[g], 0), "cudaGraphInstantiate");
    }
    for (int r = 0; r < repeats + 1; ++r) {
      const double t0 = now_us();
      for (int g = 0; g < ngraphs; ++g) {
        check(cudaSetDevice(devs[g]), "cudaSetDevice");
        check(cudaGraphLaunch(execs[g], streams[g]), "cudaGraphLaunch");
      }
      sync_all();
      const double t1 = now_us();
      if (r > 0)
        best_graph = std::min(best_graph, (t1 - t0) / iters / group);  // the first warms up
    }
    for (int g = 0; g < ngraphs; ++g) {
      check(cudaGraphExecDestroy(execs[g]), "cudaGraphExecDestroy");
      check(cudaGraphDestroy(graphs[g]), "cudaGraphDestroy");
    }
    if (joined_graph)
      for (int g = 0; g < gpus; ++g) {
        check(cudaEventDestroy(fork[g]), "cudaEventDestroy");
        check(cudaEventDestroy(join[g]), "cudaEventDestroy");
      }
    std::printf("  %10llu %10.2f %10.2f %10.2f\n",
                static_cast<unsigned long long>(count * sizeof(float)), best_issue, best_eager,
                best_graph);
    std::fflush(stdout);
  }
  if (bw_bytes != 0) {
    const size_t count = bw_bytes / sizeof(float);
    for (int w = 0; w < 5; ++w) one_call(count);
    sync_all();
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = now_us();
      for (int it = 0; it < bw_iters; ++it) one_call(count);
      sync_all();
      best = std::min(best, (now_us() - t0) / bw_iters / group);
    }
    const double n = gpus;
    const bool blocks = coll == "allgather" || coll == "reducescatter";
    const double bytes = static_cast<double>(count * sizeof(float)) * (blocks ? n : 1.0);
    const double algbw = bytes / best / 1e3;  // bytes per us = MB/s; / 1e3 = GB/s
    const double factor = coll == "allreduce" ? 2 * (n - 1) / n : blocks ? (n - 1) / n : 1.0;
    std::printf("# bandwidth: %llu bytes per rank, %d calls, best of %d rounds\n",
                static_cast<unsigned long long>(count * sizeof(float)), bw_iters, repeats);
    std::printf("# %10s %10s %10s %10s\n", "bytes", "us", "algbw", "busbw");
    std::printf("  %10llu %10.1f %10.2f %10.2f\n",
                static_cast<unsigned long long>(count * sizeof(float)), best, algbw,
                algbw * factor);
  }
  for (int g = 0; g < gpus; ++g) check(ncclCommDestroy(comms[g]), "ncclCommDestroy");
  return 0;
}
