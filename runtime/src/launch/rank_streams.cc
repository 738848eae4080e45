#include "launch/rank_streams.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/device_guard.h"

namespace efccl::runtime {
namespace {

ApiStatus cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ApiStatus::ok();
  return ApiStatus::cuda(std::string(what) + ": " + cudaGetErrorString(e));
}

/// In a capture, an event wait adds the awaited nodes to the waiting stream's dependency set,
/// and a stream that captures no node of its own never clears that set. Joined with events
/// after every launch, a rank stream that only waits (the usual case for the other ranks of a
/// GPU) would carry every earlier launch, and the next launch, which waits for that stream
/// before it runs, would depend on all of them: n^2 / 2 edges for n calls in one graph (a
/// replay of 1000 two-rank calls took about 10 us per call instead of about 2 on an H100,
/// docs/performance.md). So when both streams capture into the same graph, `to`'s dependency
/// set is replaced by `from`'s: the launch (everything `to` had before was already an ancestor
/// of it, through order_before's wait). Returns false, changing nothing, when they do not.
StatusOr<bool> set_capture_dependencies(cudaStream_t from, cudaStream_t to) {
  cudaStreamCaptureStatus from_status = cudaStreamCaptureStatusNone;
  unsigned long long from_id = 0;
  const cudaGraphNode_t* nodes = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t count = 0;
  cudaError_t e = cudaStreamGetCaptureInfo(from, &from_status, &from_id, nullptr, &nodes, &edges,
                                           &count);
  if (e != cudaSuccess)
    return Status::error(std::string("cudaStreamGetCaptureInfo: ") + cudaGetErrorString(e));
  if (from_status != cudaStreamCaptureStatusActive) return false;
  // Copied before the next call on the stream, which may invalidate them.
  std::vector<cudaGraphNode_t> deps(nodes, nodes + count);
  std::vector<cudaGraphEdgeData> data;
  if (edges != nullptr) data.assign(edges, edges + count);
  cudaStreamCaptureStatus to_status = cudaStreamCaptureStatusNone;
  unsigned long long to_id = 0;
  e = cudaStreamGetCaptureInfo(to, &to_status, &to_id);
  if (e != cudaSuccess)
    return Status::error(std::string("cudaStreamGetCaptureInfo: ") + cudaGetErrorString(e));
  if (to_status != cudaStreamCaptureStatusActive || to_id != from_id) return false;
  e = cudaStreamUpdateCaptureDependencies(to, deps.data(), data.empty() ? nullptr : data.data(),
                                          deps.size(), cudaStreamSetCaptureDependencies);
  if (e != cudaSuccess)
    return Status::error(std::string("cudaStreamUpdateCaptureDependencies: ") +
                         cudaGetErrorString(e));
  return true;
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
  for (std::size_t i = 0; i < l.ranks.size(); ++i) {
    cudaStream_t launch_stream = l.args.streams[l.device_index[i]];
    if (l.rank_streams[i] == launch_stream) continue;
    const auto r = static_cast<std::size_t>(l.ranks[i]);
    cudaSetDevice(devices_[r]);
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
      auto set = set_capture_dependencies(l.args.streams[di], l.rank_streams[i]);
      if (!set) return ApiStatus::cuda(set.status().message());
      if (*set) continue;
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
