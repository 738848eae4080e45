// What every exported NCCL function shares: default visibility, its pncclX alias, and a guard
// that keeps C++ exceptions from crossing the C ABI (an allocation that fails inside efccl
// becomes ncclSystemError with a message in ncclGetLastError, anything else ncclInternalError).
#pragma once

#include <nccl.h>

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "base/api_status.h"
#include "enqueue/group.h"

#define EFCCL_API __attribute__((visibility("default")))
/// pnccl<name>: the same function under NCCL's profiling name.
#define EFCCL_ALIAS(name) extern "C" EFCCL_API decltype(name) p##name __attribute__((alias(#name)));

namespace efccl::runtime {

/// Runs `body` (returning an ApiStatus) as entry point `function` and reports its failure (log,
/// ncclGetLastError); ncclInProgress is not a failure. `grouped`: a call that a group records
/// (collectives, send/receive, init, split, shrink), whose failure also fails the group (NCCL
/// returns it again at ncclGroupEnd).
template <typename Body>
ncclResult_t run_entry_point(const char* function, Body&& body, bool grouped = false) noexcept {
  ApiStatus status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = ApiStatus::system(std::string(function) + " ran out of host memory");
  } catch (const std::exception& e) {
    status = ApiStatus::internal(std::string(function) + " failed: " + e.what());
  } catch (...) {
    status = ApiStatus::internal(std::string(function) + " failed with an unknown exception");
  }
  try {
    if (grouped && !status && status.code() != ncclInProgress) fail_group(status);
    return report(function, status);
  } catch (...) {
    return status.code();  // reporting needs memory too; the code still gets through
  }
}

/// run_entry_point for a call that a group records.
template <typename Body>
ncclResult_t run_grouped_entry_point(const char* function, Body&& body) noexcept {
  return run_entry_point(function, std::forward<Body>(body), true);
}

}  // namespace efccl::runtime
