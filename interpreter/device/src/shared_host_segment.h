// A POSIX shared-memory segment (shm_open, /dev/shm): the host memory of host-placed
// connections whose two ends run in different processes of one host (pure C++, no CUDA; the
// executor pins and maps it with cudaHostRegister, connection_arena.cc).
//
// Names never outlive their use: the receiver's process creates the segment and sends its name
// through the executor's exchange; the one other process that maps it (the senders' process:
// one segment per pair of locations) removes the name as soon as it has mapped it, and the
// creator removes it when it goes, if still there. So the name is gone once both have mapped
// it, and a segment whose creator dies after the exchange loses its name when the other
// process maps it; only a creator that dies between creating the segment and sending its name
// leaves one behind.
#pragma once

#include <cstddef>
#include <string>

#include "efccl/common/status.h"

namespace efccl::device {

/// One segment mapped into this process (read and write, shared); unmapped when it goes.
class SharedHostSegment {
 public:
  /// Longest name create() makes and open_and_unlink() accepts, without the final NUL.
  static constexpr std::size_t kMaxNameLength = 63;

  SharedHostSegment() = default;
  SharedHostSegment(SharedHostSegment&& o) noexcept { *this = std::move(o); }
  SharedHostSegment& operator=(SharedHostSegment&& o) noexcept;
  SharedHostSegment(const SharedHostSegment&) = delete;
  SharedHostSegment& operator=(const SharedHostSegment&) = delete;
  /// Unmaps; removes the name if this process created it and it is still there.
  ~SharedHostSegment();

  /// Creates a segment of `bytes` (> 0) zero bytes under a fresh name ("/efccl-<pid>-<n>-<r>")
  /// and maps it. Its memory is reserved now (a full /dev/shm is an error here, not a SIGBUS
  /// later).
  static StatusOr<SharedHostSegment> create(std::size_t bytes);
  /// Maps the segment `name` that another process created, which must hold exactly `bytes`,
  /// and removes its name.
  static StatusOr<SharedHostSegment> open_and_unlink(const std::string& name, std::size_t bytes);
  /// Whether `name` is one that create() makes: a peer's message names only such segments.
  static bool is_valid_name(const std::string& name);

  /// Removes the name now (the mapping stays); idempotent.
  void unlink();

  char* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  char* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool linked_ = false;  ///< this process created the name and has not removed it
};

}  // namespace efccl::device
