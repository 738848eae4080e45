// EFCCL_FALLBACK=nccl: collectives that no program covers run on a real NCCL (docs/fallback.md),
// MSCCL's model: the user's algorithm files run the calls they match, NCCL runs the rest.
//
// Loading. EFCCL_NCCL_LIB names the library; without it efccl looks for libnccl.so.2 in the
// LD_LIBRARY_PATH directories, then through the loader, then in /usr/local/cuda/lib64, skipping
// every file that is efccl (build/lib/libnccl.so.2 is an alias of libefccl.so). A library is
// refused when its ncclGetVersion lives in this efccl or in any efccl build (libefccl.so carries
// an ELF note, "efccl"), and when its version is not 2.x with x >= 28. Every function efccl
// calls is resolved from the handle with dlsym, never through the global namespace.
//
// Isolation. libnccl.so.2 binds ~19 references to its own exported nccl* symbols through the
// PLT (ncclCommInitAll -> ncclGetUniqueId, ncclCommDestroy -> ncclCommGetAsyncError, ncclBcast
// -> ncclBroadcast, ncclMemAlloc, ...). Loaded into the global scope after efccl (LD_PRELOAD,
// or libefccl.so as libnccl.so.2), those bind to efccl's exports: a real ncclCommDestroy would
// ask efccl for the async error of a handle efccl does not know (and fail), a real
// ncclCommInitAll would run on an efccl unique id. None of these efccl functions calls NCCL,
// so no loop can form today, but the real library would misbehave. Therefore:
//  - a library not loaded yet is opened RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND: its references
//    bind to its own definitions first, and its symbols stay out of the global scope;
//  - a library already loaded with efccl ahead of it in the global scope (PyTorch's
//    libtorch_cuda.so needs libnccl.so.2; a program linked against NCCL under LD_PRELOAD) was
//    relocated against efccl already and cannot be rebound: efccl loads a private copy of the
//    file (copied into an anonymous memfd, opened as above), which costs the library's size in
//    memory (about 200 MB for 2.28) in that case only. dlmopen into a new namespace is not used:
//    it would load a second libcudart/libcuda whose contexts and streams are not the
//    application's;
//  - every call into the real library passes a per-thread guard, so that a real function
//    reaching efccl and efccl calling NCCL again becomes an error instead of a loop.
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
#include "launch/call.h"
#include "efccl/common/status.h"
#include "comm/rendezvous.h"

struct ncclComm;

namespace efccl::runtime {

class Bootstrap;

/// EFCCL_FALLBACK: unset, "", "none" or "off" -> kOff; "nccl" -> kNccl (case-insensitive).
enum class FallbackMode { kOff, kNccl };
StatusOr<FallbackMode> fallback_mode_from_environment();

/// A real NCCL loaded beside efccl (never unloaded); its entry points, resolved from its handle.
class NcclLibrary {
 public:
  /// Loads the library at `path` (once per file and process; later calls share it) and checks
  /// that it is a real NCCL 2.28 or newer 2.x, not efccl.
  static StatusOr<std::shared_ptr<const NcclLibrary>> load(const std::string& path);
  /// The default search: libnccl.so.2 in the LD_LIBRARY_PATH directories, through the loader,
  /// then in /usr/local/cuda/lib64; files that are efccl are skipped.
  static StatusOr<std::shared_ptr<const NcclLibrary>> find();

  const std::string& path() const { return path_; }  ///< the file it was loaded from
  int version() const { return version_; }           ///< ncclGetVersion's code, e.g. 22809
  bool private_copy() const { return private_copy_; }
  /// "NCCL 2.28.9 from /path" (" (private copy)" when it is one).
  std::string describe() const;
  /// Another symbol of the library, from its handle (null when it has none).
  void* symbol(const char* name) const;

  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetLastError) get_last_error = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclCommFinalize) comm_finalize = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclCommRevoke) comm_revoke = nullptr;
  decltype(&::ncclCommSplit) comm_split = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) red_op_create_pre_mul_sum = nullptr;
  decltype(&::ncclRedOpDestroy) red_op_destroy = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclReduce) reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclAlltoAll) all_to_all = nullptr;
  decltype(&::ncclGather) gather = nullptr;
  decltype(&::ncclScatter) scatter = nullptr;

  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

 private:
  NcclLibrary() = default;
  /// Opens `path` (a file, or a bare name for the loader) isolated as the header says.
  static StatusOr<std::shared_ptr<const NcclLibrary>> open(const std::string& path);

  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  bool private_copy_ = false;
};

/// EFCCL_NCCL_LIB's library, or the default search's when it is unset.
StatusOr<std::shared_ptr<const NcclLibrary>> nccl_library_from_environment();

/// Marks the calling thread as inside the real NCCL while it lives. status() fails when the
/// thread already was: the real library called back into efccl, which must not call it again.
class RealNcclCall {
 public:
  explicit RealNcclCall(const char* function);
  ~RealNcclCall();
  RealNcclCall(const RealNcclCall&) = delete;
  RealNcclCall& operator=(const RealNcclCall&) = delete;
  /// ok, or ncclInternalError naming both calls.
  const ApiStatus& status() const { return status_; }

 private:
  ApiStatus status_;
  bool entered_ = false;
};

/// The real communicators of one clique's ranks in this process, or why it has none.
class CliqueFallback {
 public:
  /// `real[r]`, `devices[r]`: clique rank r's real communicator and GPU (null: not here).
  CliqueFallback(std::shared_ptr<const NcclLibrary> library, std::vector<ncclComm_t> real,
                 std::vector<int> devices);
  /// A clique NCCL cannot serve: calls that need the fallback fail with `why`.
  CliqueFallback(std::shared_ptr<const NcclLibrary> library, std::string unavailable);
  /// Aborts the real communicators whose efccl communicators never released them.
  ~CliqueFallback();
  CliqueFallback(const CliqueFallback&) = delete;
  CliqueFallback& operator=(const CliqueFallback&) = delete;

  /// Runs one collective that no program covers (`why`): the calls of this process's ranks,
  /// in one real group, on their streams. `timeout` bounds the wait for NCCL to end the
  /// (non-blocking) group.
  ApiStatus run(const std::vector<Call>& set, const std::string& why,
                std::chrono::nanoseconds timeout);
  /// ncclCommDestroy / ncclCommAbort of rank `rank`: the same on its real communicator.
  ApiStatus release(int32_t rank, bool abort);
  ApiStatus finalize(int32_t rank, std::chrono::nanoseconds timeout);
  ApiStatus revoke(int32_t rank, std::chrono::nanoseconds timeout);
  /// The real communicator's asynchronous error (ok while it has none).
  ApiStatus async_error(int32_t rank);

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
  std::shared_ptr<Bootstrap> leader;
  std::vector<int> leaders;
  const std::atomic<bool>* abort = nullptr;  ///< makes the waits give up (may be null)
};

/// The plan for a clique whose ranks all live in this process on `devices` (by rank).
FallbackPlan single_process_fallback_plan(const std::vector<int>& devices);

/// EFCCL_FALLBACK=nccl: loads the library and creates the real communicators of `plan` (every
/// process of the communicator calls it); *out stays null when the fallback is off. Fails with
/// the variable's bad value, the library's problem, or the real init's error code and message.
ApiStatus create_fallback(const FallbackPlan& plan, std::shared_ptr<CliqueFallback>* out);

// Hooks of the API entry points: no-ops for communicators without a fallback.
ApiStatus release_fallback(ncclComm* comm, bool abort);
ApiStatus finalize_fallback(ncclComm* comm);
ApiStatus revoke_fallback(ncclComm* comm);
ApiStatus fallback_async_error(ncclComm* comm);

}  // namespace efccl::runtime
