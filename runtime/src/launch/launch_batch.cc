#include "launch/launch_batch.h"

#include <string>

#include "efccl/common/log.h"
#include "launch/network_proxy.h"

namespace efccl::runtime {
namespace {

/// A launch that failed: a capture-related failure is the caller's misuse, anything else ours.
ApiStatus launch_failure(const Status& s) {
  const bool capture = s.message().find("capture") != std::string::npos;
  return ApiStatus(capture ? ncclInvalidUsage : ncclInternalError, s.message());
}

}  // namespace

void LaunchBatch::start() {
  pending_.clear();
  uses_.clear();
  failure_ = ApiStatus::ok();
}

ApiStatus LaunchBatch::add(Launch launch, bool capturing) {
  if (ApiStatus s = executors_.ready_to_launch(*launch.executor, launch.rank_streams, capturing);
      !s)
    return s;
  if (ApiStatus s = streams_.order_before(launch); !s) return s;
  if (fuse_) {
    pending_.push_back(std::move(launch));
    return ApiStatus::ok();
  }
  if (launch.executor->network_ends() > 0) kick_network_proxy();
  const Status run = launch.executor->run(launch.args);
  const ApiStatus joined = streams_.join_after(launch);
  return !run ? launch_failure(run) : joined;  // the caller's call fails, not the batch
}

ApiStatus LaunchBatch::flush() {
  if (pending_.empty()) return failure_;
  std::vector<Launch>& launches = flushing_;
  launches.clear();
  launches.swap(pending_);  // add() may not run meanwhile, but keep the two apart anyway
  std::vector<device::BatchCall>& calls = calls_;
  calls.clear();
  bool network = false;
  for (Launch& l : launches) {
    calls.push_back({l.executor, &l.args});
    network = network || l.executor->network_ends() > 0;
  }
  // The proxies poll slowly when idle: their connections are about to be used.
  if (network) kick_network_proxy();
  device::BatchReport report;
  const Status run = calls.size() == 1 ? launches.front().executor->run(launches.front().args)
                                       : device::DeviceExecutor::run_batch(calls, &report);
  ApiStatus status = run ? ApiStatus::ok() : launch_failure(run);
  for (const Launch& l : launches)
    if (ApiStatus j = streams_.join_after(l); !j && status) status = j;
  if (calls.size() > 1)
    EFCCL_INFO(kLogColl, launches.front().executor->devices().front(),
               "group: " + std::to_string(calls.size()) + " program runs enqueued in " +
                   std::to_string(report.launches) + " launch(es) (" +
                   std::to_string(report.fused_calls) + " device part(s) fused)");
  if (!status && failure_) failure_ = status;
  launches.clear();
  return failure_;
}

}  // namespace efccl::runtime
