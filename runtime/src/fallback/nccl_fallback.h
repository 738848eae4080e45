// EFCCL_FALLBACK=nccl: collectives that no program covers run on a real NCCL (docs/fallback.md),
// MSCCL's model: the user's algorithm files run the calls they match, NCCL runs the rest. The
// real library is loaded in isolation (fallback/nccl_library.h).
//
// Communicators. With the fallback on, every communicator gets real NCCL communicators for its
// ranks in this process, created when it is (rank 0's process makes the real unique id and
// sends it to the others through efccl's bootstrap; a split or shrink child gets fresh ones the
// same way). They are created non-blocking and polled, so that init, like every wait here, has
// a deadline (EFCCL_INIT_TIMEOUT_MS) and an abort path; the price is NCCL's non-blocking mode on
// every forwarded call (NCCL 2.28 ends each such group on a thread of its own, which efccl polls).
// NCCL refuses several ranks on one GPU: such a communicator has no fallback (one WARN), and
// calls that need it fail saying why.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "fallback/nccl_library.h"
#include "fallback/real_config.h"
#include "launch/call.h"
#include "launch/collective_fallback.h"

namespace efccl::net {
class Bootstrap;
}  // namespace efccl::net

namespace efccl::runtime {

/// The real communicators of one clique's ranks in this process, or why it has none.
class NcclFallback final : public CollectiveFallback {
 public:
  /// `real[r]`, `devices[r]`: clique rank r's real communicator and GPU (null: not here).
  NcclFallback(std::shared_ptr<const NcclLibrary> library, std::vector<ncclComm_t> real,
               std::vector<int> devices);
  /// A clique NCCL cannot serve: calls that need the fallback fail with `why`.
  NcclFallback(std::shared_ptr<const NcclLibrary> library, std::string unavailable);
  /// Aborts the real communicators whose efccl communicators never released them.
  ~NcclFallback();
  NcclFallback(const NcclFallback&) = delete;
  NcclFallback& operator=(const NcclFallback&) = delete;

  /// Runs one collective that no program covers (`why`): the calls of this process's ranks,
  /// in one real group, on their streams. `timeout` bounds the wait for NCCL to end the
  /// (non-blocking) group.
  ApiStatus run(const std::vector<Call>& set, const std::string& why,
                std::chrono::nanoseconds timeout) override;
  /// ncclCommDestroy / ncclCommAbort of rank `rank`: the same on its real communicator.
  ApiStatus release(int32_t rank, bool abort) override;
  ApiStatus finalize(int32_t rank, std::chrono::nanoseconds timeout) override;
  ApiStatus revoke(int32_t rank, std::chrono::nanoseconds timeout) override;
  /// The real communicator's asynchronous error (ok while it has none).
  ApiStatus async_error(int32_t rank) override;

 private:
  ncclComm_t real(int32_t rank);

  std::shared_ptr<const NcclLibrary> library_;
  std::string unavailable_;
  std::mutex mu_;  ///< guards real_
  std::vector<ncclComm_t> real_;
  std::vector<int> devices_;
};

/// What the builder of a clique knows when it creates the fallback.
struct FallbackPlan {
  int nranks = 0;
  /// This process's ranks (clique ranks, ascending), their GPUs and their configs.
  std::vector<int32_t> ranks;
  std::vector<int> devices;
  std::vector<RealConfig> configs;  ///< by position in `ranks`; empty: NCCL's defaults
  /// Non-empty: NCCL cannot serve this communicator (several ranks on one GPU), and why.
  std::string shared_gpu;
  /// Multi-process: this process's leader bootstrap and every process's leader (ascending
  /// ranks); the id goes from rank 0's process to the others through them. Null: one process.
  std::shared_ptr<net::Bootstrap> leader;
  std::vector<int> leaders;
  const std::atomic<bool>* abort = nullptr;  ///< makes the waits give up (may be null)
};

/// The plan for a clique whose ranks all live in this process on `devices` (by rank).
FallbackPlan single_process_fallback_plan(const std::vector<int>& devices);

/// EFCCL_FALLBACK=nccl: loads the library and creates the real communicators of `plan` (every
/// process of the communicator calls it); *out stays null when the fallback is off. Fails with
/// the variable's bad value, the library's problem, or the real init's error code and message.
ApiStatus create_fallback(const FallbackPlan& plan, std::shared_ptr<NcclFallback>* out);

}  // namespace efccl::runtime
