#include "base/api_status.h"

#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {
thread_local std::string t_last_error;
}  // namespace

ncclResult_t report(const char* function, const ApiStatus& status) {
  if (status.is_ok()) return ncclSuccess;
  if (status.code() == ncclInProgress) return ncclInProgress;  // non-blocking: not a failure
  t_last_error = std::string(function) + ": " + status.message();
  EFCCL_WARN(-1, t_last_error);
  return status.code();
}

void remember(const char* function, const ApiStatus& status) {
  if (!status.is_ok()) t_last_error = std::string(function) + ": " + status.message();
}

const char* last_error_message() { return t_last_error.c_str(); }

}  // namespace efccl::runtime
