#include "launch/rank_streams.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/device_guard.h"

namespace efccl::runtime {
namespace {

ApiStatus cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(std::string(what) + ": " + cudaGetErrorString(e));
}

/// `stream`'s capture id and dependency set when it is capturing (else nullopt, `id` 0).
/// Copied at once: the arrays CUDA returns are valid only until the next call on the stream.
StatusOr<std::optional<CaptureDependencies>> capture_dependencies(cudaStream_t stream,
                                                                  unsigned long long* id) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t count = 0;
  *id = 0;
  const cudaError_t e =
      cudaStreamGetCaptureInfo(stream, &status, id, nullptr, &nodes, &edges, &count);
  if (e != cudaSuccess)
    return Status::error(std::string("cudaStreamGetCaptureInfo (joining the streams of ranks "
                                      "sharing a GPU): ") +
                         cudaGetErrorString(e));
  if (status != cudaStreamCaptureStatusActive) return std::optional<CaptureDependencies>();
  CaptureDependencies d;
  if (count > 0) d.nodes.assign(nodes, nodes + count);
  if (edges != nullptr && count > 0) d.edges.assign(edges, edges + count);
  return std::optional<CaptureDependencies>(std::move(d));
}

/// Appends `node` (with its edge data, or a default edge) to `to` unless it is there already.
void add_dependency(CaptureDependencies& to, cudaGraphNode_t node, const cudaGraphEdgeData* edge) {
  if (std::find(to.nodes.begin(), to.nodes.end(), node) != to.nodes.end()) return;
  if (edge != nullptr && to.edges.empty()) to.edges.resize(to.nodes.size(), cudaGraphEdgeData{});
  to.nodes.push_back(node);
  if (!to.edges.empty()) to.edges.push_back(edge != nullptr ? *edge : cudaGraphEdgeData{});
}

}  // namespace

StatusOr<std::unique_ptr<RankStreams>> RankStreams::create(const std::vector<int>& devices,
                                                           const std::vector<bool>& local) {
  std::unique_ptr<RankStreams> s(new RankStreams());
  s->devices_ = devices;
  s->ready_.assign(devices.size(), nullptr);
  s->done_.assign(devices.size(), nullptr);
  DeviceGuard guard;
  for (std::size_t r = 0; r < devices.size(); ++r) {
    if (!local[r]) continue;
    cudaError_t e = cudaSetDevice(devices[r]);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->ready_[r], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->done_[r], cudaEventDisableTiming);
    if (e != cudaSuccess)
      return Status::error("creating the events of rank " + std::to_string(r) + " on device " +
                           std::to_string(devices[r]) + ": " + cudaGetErrorString(e));
  }
  return s;
}

RankStreams::~RankStreams() {
  DeviceGuard guard;
  for (std::size_t r = 0; r < devices_.size(); ++r) {
    if (ready_[r] == nullptr && done_[r] == nullptr) continue;
    cudaSetDevice(devices_[r]);
    if (ready_[r] != nullptr) cudaEventDestroy(ready_[r]);
    if (done_[r] != nullptr) cudaEventDestroy(done_[r]);
  }
}

ApiStatus RankStreams::order_before(Launch& l) {
  const std::vector<int>& devices = l.executor->devices();
  l.launch_rank.assign(devices.size(), SIZE_MAX);
  l.device_index.assign(l.ranks.size(), 0);
  l.args.streams.assign(devices.size(), nullptr);
  for (std::size_t i = 0; i < l.ranks.size(); ++i) {
    const int d = devices_[static_cast<std::size_t>(l.ranks[i])];
    const auto di = static_cast<std::size_t>(std::lower_bound(devices.begin(), devices.end(), d) -
                                             devices.begin());
    l.device_index[i] = di;
    if (l.launch_rank[di] == SIZE_MAX || l.ranks[i] < l.ranks[l.launch_rank[di]]) {
      l.launch_rank[di] = i;
      l.args.streams[di] = l.rank_streams[i];
    }
  }
  l.captured_before.assign(l.ranks.size(), std::nullopt);
  for (std::size_t i = 0; i < l.ranks.size(); ++i) {
    cudaStream_t launch_stream = l.args.streams[l.device_index[i]];
    if (l.rank_streams[i] == launch_stream) continue;
    const auto r = static_cast<std::size_t>(l.ranks[i]);
    cudaSetDevice(devices_[r]);
    unsigned long long launch_id = 0, rank_id = 0;
    auto launch_deps = capture_dependencies(launch_stream, &launch_id);
    if (!launch_deps) return ApiStatus::cuda(launch_deps.status().message());
    if (*launch_deps) {
      auto rank_deps = capture_dependencies(l.rank_streams[i], &rank_id);
      if (!rank_deps) return ApiStatus::cuda(rank_deps.status().message());
      if (*rank_deps && rank_id == launch_id) l.captured_before[i] = std::move(*rank_deps);
    }
    if (ApiStatus s = cuda_status(cudaEventRecord(ready_[r], l.rank_streams[i]), "cudaEventRecord");
        !s)
      return s;
    if (ApiStatus s =
            cuda_status(cudaStreamWaitEvent(launch_stream, ready_[r], 0), "cudaStreamWaitEvent");
        !s)
      return s;
  }
  return ApiStatus::ok();
}

ApiStatus RankStreams::join_after(const Launch& l) {
  const std::vector<int>& devices = l.executor->devices();
  for (std::size_t di = 0; di < devices.size(); ++di) {
    const std::size_t first = l.launch_rank[di];
    if (first == SIZE_MAX) continue;
    bool recorded = false;
    for (std::size_t i = 0; i < l.ranks.size(); ++i) {
      if (l.device_index[i] != di || l.rank_streams[i] == l.args.streams[di]) continue;
      const auto r0 = static_cast<std::size_t>(l.ranks[first]);
      cudaSetDevice(devices[di]);
      if (i < l.captured_before.size() && l.captured_before[i]) {
        // Both streams capture into one graph (order_before): set, do not add (see the header).
        unsigned long long launch_id = 0, rank_id = 0;
        auto launch_deps = capture_dependencies(l.args.streams[di], &launch_id);
        if (!launch_deps) return ApiStatus::cuda(launch_deps.status().message());
        auto rank_deps = capture_dependencies(l.rank_streams[i], &rank_id);
        if (!rank_deps) return ApiStatus::cuda(rank_deps.status().message());
        if (*launch_deps && *rank_deps && launch_id == rank_id) {
          CaptureDependencies next = std::move(**launch_deps);
          const CaptureDependencies& before = *l.captured_before[i];
          const CaptureDependencies& now = **rank_deps;
          for (std::size_t k = 0; k < now.nodes.size(); ++k)
            if (std::find(before.nodes.begin(), before.nodes.end(), now.nodes[k]) ==
                before.nodes.end())
              add_dependency(next, now.nodes[k], now.edges.empty() ? nullptr : &now.edges[k]);
          const cudaError_t e = cudaStreamUpdateCaptureDependencies(
              l.rank_streams[i], next.nodes.data(), next.edges.empty() ? nullptr : next.edges.data(),
              next.nodes.size(), cudaStreamSetCaptureDependencies);
          if (e != cudaSuccess)
            return ApiStatus::cuda(std::string("cudaStreamUpdateCaptureDependencies (rank ") +
                                   std::to_string(l.ranks[i]) + "'s stream after a launch on device " +
                                   std::to_string(devices[di]) + "): " + cudaGetErrorString(e));
          continue;
        }
      }
      if (!recorded) {
        if (ApiStatus s =
                cuda_status(cudaEventRecord(done_[r0], l.args.streams[di]), "cudaEventRecord");
            !s)
          return s;
        recorded = true;
      }
      if (ApiStatus s = cuda_status(cudaStreamWaitEvent(l.rank_streams[i], done_[r0], 0),
                                    "cudaStreamWaitEvent");
          !s)
        return s;
    }
  }
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
