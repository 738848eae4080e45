// Errors inside efccl travel as a Status carrying a message (STYLE.md); diagnostics about a
// program additionally name the file, the location inside it and the rule that was broken.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace efccl {

/// Success, or a failure with a human-readable message.
class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }

  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

/// A value or the Status explaining why there is none.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}              // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : v_(std::move(status)) {}       // NOLINT(google-explicit-constructor)
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return std::get<Status>(v_); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

/// One problem found in a program file: `FILE: LOCATION: message (rule)`.
struct Diagnostic {
  std::string file;      ///< path as given by the user, or "<memory>"
  std::string location;  ///< JSON pointer, or XML element path with ids and line
  std::string rule;      ///< short stable rule name, e.g. "connection-mismatch"
  std::string message;   ///< what was expected and what was found

  /// The one-line form printed by `efccl validate`.
  std::string to_string() const;
};

using Diagnostics = std::vector<Diagnostic>;

}  // namespace efccl
