// The ranks' CUDA streams around a launch. One launch per device serves every rank of the
// device that takes part, on the stream of its lowest such rank (the same for every program run
// on the device, so that runs on one stream can share a fused launch); the other ranks' streams
// are joined to it with events before and after, so that each rank's later work follows it
// (after it, in a capture shared by both streams, by setting the other stream's capture
// dependencies instead of an event wait: see RankStreams::join_after).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/api_status.h"
#include "efccl/common/status.h"
#include "efccl/device/device_executor.h"

namespace efccl::runtime {

/// A capturing stream's dependency set (cudaStreamGetCaptureInfo): the nodes its next captured
/// work will follow, and their edge data (empty: every edge a default one).
struct CaptureDependencies {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> edges;
};

/// One executor run over some of the clique's ranks: what a runner hands to a LaunchBatch.
struct Launch {
  device::DeviceExecutor* executor = nullptr;
  /// The call; `args.streams` is filled by RankStreams::order_before (one per executor device).
  device::RunArgs args;
  std::vector<int32_t> ranks;              ///< the clique ranks of this process that take part
  std::vector<cudaStream_t> rank_streams;  ///< per entry of `ranks`: that rank's stream
  /// Set by order_before: per entry of `ranks`, the index of its device in the executor's
  /// devices(); per device, the entry whose stream the launch uses.
  std::vector<std::size_t> device_index, launch_rank;
  /// Set by order_before, per entry of `ranks` whose stream is not the launch stream but
  /// captures into the same graph: that stream's dependency set when the launch was made to
  /// follow it (so those nodes are the launch's ancestors).
  std::vector<std::optional<CaptureDependencies>> captured_before;
};

class RankStreams {
 public:
  /// Creates the events of every rank that runs in this process (`local[r]`) on its device
  /// (`devices[r]`).
  static StatusOr<std::unique_ptr<RankStreams>> create(const std::vector<int>& devices,
                                                       const std::vector<bool>& local);
  ~RankStreams();
  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;

  /// Before a launch: picks each device's launch stream and makes it wait for the other
  /// participating ranks' streams on that device.
  ApiStatus order_before(Launch& l);
  /// After a launch (also a failed one: the parts that went out still run, aborted where their
  /// call did not launch on every device, and every rank's later work must follow them): the
  /// other ranks' streams wait for the launch stream. In a capture shared with the launch
  /// stream, not by an event wait, which would add to the stream's dependency set for good
  /// (each later launch would depend on every earlier one), but by setting that set to the
  /// launch stream's plus whatever the stream gained since order_before (other launches of the
  /// same batch, a copy to self): what it held then is already among the launch's ancestors.
  ApiStatus join_after(const Launch& l);

 private:
  RankStreams() = default;
  std::vector<int> devices_;
  std::vector<cudaEvent_t> ready_;  ///< per rank: recorded on its stream before a launch
  std::vector<cudaEvent_t> done_;   ///< per rank: recorded on the launch stream after it
};

}  // namespace efccl::runtime
