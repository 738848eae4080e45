// The launches of one submission (an ungrouped call, or one thread's outermost ncclGroupEnd on
// one clique), enqueued together: runners add them as they match calls, and the submission
// flushes the batch once, so that DeviceExecutor::run_batch can put the group's program runs in
// one fused launch per device and stream (EFCCL_GROUP_FUSION=1, the default). With fusion off,
// every launch goes out as it is added. The clique owns one batch (its storage is kept between
// submissions) and starts it anew for each submission, under its lock.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "base/api_status.h"
#include "launch/executor_store.h"
#include "launch/rank_streams.h"

namespace efccl::runtime {

class LaunchBatch {
 public:
  LaunchBatch(ExecutorStore& executors, RankStreams& streams, bool fuse)
      : executors_(executors), streams_(streams), fuse_(fuse) {}
  LaunchBatch(const LaunchBatch&) = delete;
  LaunchBatch& operator=(const LaunchBatch&) = delete;

  /// Begins a submission: nothing pending, no failure, no runs counted.
  void start();
  /// Checks the executor (an earlier failure stops it; a capture pins it to its graph), orders
  /// the launch after its ranks' streams, and runs it now (no fusion) or at flush().
  ApiStatus add(Launch launch, bool capturing);
  /// Enqueues the launches added since the last flush, in order, then joins every rank's stream
  /// to its launch (also after a failure). Returns the first failure of a flush of this batch
  /// so far (a launch that add() ran at once reports its failure there instead).
  ApiStatus flush();
  /// Launches added and not yet flushed.
  std::size_t pending() const { return pending_.size(); }
  /// Which run of `program` in this batch the next one is: 0, 1, 2, ... (runs of one executor
  /// in one fused launch take turns on the same CTAs; a runner may give later runs copies).
  int next_use(const void* program) { return uses_[program]++; }
  bool fusing() const { return fuse_; }

 private:
  ExecutorStore& executors_;
  RankStreams& streams_;
  const bool fuse_;
  std::vector<Launch> pending_;
  std::vector<Launch> flushing_;  ///< the launches of the flush in progress (storage kept)
  std::vector<device::BatchCall> calls_;
  std::map<const void*, int> uses_;
  ApiStatus failure_;
};

}  // namespace efccl::runtime
