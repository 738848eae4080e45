// A real NCCL loaded beside efccl for EFCCL_FALLBACK=nccl (fallback/nccl_fallback.h runs
// collectives on it; docs/fallback.md).
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
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/api_status.h"
#include "efccl/common/status.h"

namespace efccl::runtime {

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

/// A failed real call: its code, and efccl's message naming the function, the library and what
/// NCCL said.
ApiStatus real_failure(const NcclLibrary& lib, const std::string& what, ncclResult_t r);

/// Polls the real communicators until none reports ncclInProgress (non-blocking NCCL), the
/// deadline passes or `*abort` (may be null) becomes true.
ApiStatus wait_real(const NcclLibrary& lib, const std::vector<ncclComm_t>& comms,
                    const std::string& what, std::chrono::steady_clock::time_point deadline,
                    std::chrono::nanoseconds timeout, const std::atomic<bool>* abort);

}  // namespace efccl::runtime
