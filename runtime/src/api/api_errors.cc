// The NCCL ABI: version, result strings, the last error, the debug configuration.
#include <nccl.h>

#include "api/entry_point.h"
#include "efccl/common/log.h"

using efccl::runtime::ApiStatus;
using efccl::runtime::run_entry_point;

EFCCL_API ncclResult_t ncclGetVersion(int* version) {
  return run_entry_point("ncclGetVersion", [&] {
    if (version == nullptr) return ApiStatus::invalid_argument("version is NULL");
    *version = NCCL_VERSION_CODE;
    return ApiStatus::ok();
  });
}
EFCCL_ALIAS(ncclGetVersion)

EFCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error (run with NCCL_DEBUG=INFO for details)";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "operation in progress";
    default:
      return "unknown result code";
  }
}
EFCCL_ALIAS(ncclGetErrorString)

EFCCL_API const char* ncclGetLastError(ncclComm_t /*comm*/) {
  return efccl::runtime::last_error_message();
}
EFCCL_ALIAS(ncclGetLastError)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
EFCCL_API void ncclResetDebugInit() {
  try {
    efccl::reload_log_config();
  } catch (...) {  // out of memory: the old configuration stays
  }
}
EFCCL_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop
