// Errors at the API boundary. Inside the library errors travel as efccl::Status; where an
// NCCL result code must be chosen (argument checks, usage rules, CUDA failures) they travel as
// an ApiStatus, which report() turns into ncclResult_t, the thread's ncclGetLastError message
// and a WARN log line.
#pragma once

#include <nccl.h>

#include <string>
#include <utility>

#include "efccl/common/status.h"

namespace efccl::runtime {

/// An NCCL result code with the reason behind it.
class ApiStatus {
 public:
  ApiStatus() = default;
  ApiStatus(ncclResult_t code, std::string message) : code_(code), message_(std::move(message)) {}
  static ApiStatus ok() { return {}; }
  static ApiStatus invalid_argument(std::string m) { return {ncclInvalidArgument, std::move(m)}; }
  static ApiStatus invalid_usage(std::string m) { return {ncclInvalidUsage, std::move(m)}; }
  static ApiStatus internal(std::string m) { return {ncclInternalError, std::move(m)}; }
  static ApiStatus system(std::string m) { return {ncclSystemError, std::move(m)}; }
  static ApiStatus cuda(std::string m) { return {ncclUnhandledCudaError, std::move(m)}; }
  /// A Status from a lower layer, given the code its failure means here.
  static ApiStatus from(const Status& s, ncclResult_t code_if_failed) {
    return s ? ApiStatus() : ApiStatus(code_if_failed, s.message());
  }

  bool is_ok() const { return code_ == ncclSuccess; }
  explicit operator bool() const { return is_ok(); }
  ncclResult_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ncclResult_t code_ = ncclSuccess;
  std::string message_;
};

/// At the API boundary: records the message for ncclGetLastError (calling thread), logs it
/// as a warning prefixed with `function`, and returns the code.
ncclResult_t report(const char* function, const ApiStatus& status);

/// Records a failure for ncclGetLastError without logging it (for results that are polled,
/// such as ncclCommGetAsyncError's, which the async error's own warning already logged).
void remember(const char* function, const ApiStatus& status);

/// The calling thread's last error message ("" when none).
const char* last_error_message();

}  // namespace efccl::runtime
