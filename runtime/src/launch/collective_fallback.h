// Where collectives that no program covers can run instead (EFCCL_FALLBACK=nccl): declared here,
// where the runners need it, and implemented by fallback/ (a real NCCL loaded beside efccl).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "launch/call.h"

namespace efccl::runtime {

class CollectiveFallback {
 public:
  virtual ~CollectiveFallback() = default;
  /// Runs one matched collective of this process's ranks (`set`, ascending ranks) that no
  /// program covers (`why`), on the calls' streams; waits at most `timeout` for it to be enqueued.
  virtual ApiStatus run(const std::vector<Call>& set, const std::string& why,
                        std::chrono::nanoseconds timeout) = 0;
  /// ncclCommDestroy (`abort` false) / ncclCommAbort of rank `rank`.
  virtual ApiStatus release(int32_t rank, bool abort) = 0;
  virtual ApiStatus finalize(int32_t rank, std::chrono::nanoseconds timeout) = 0;
  virtual ApiStatus revoke(int32_t rank, std::chrono::nanoseconds timeout) = 0;
  /// The asynchronous error of rank `rank`'s part (ok while it has none).
  virtual ApiStatus async_error(int32_t rank) = 0;
};

}  // namespace efccl::runtime
