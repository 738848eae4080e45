// How one thread interrupts another's poll(2): an eventfd that the waiting thread polls.
#pragma once

#include "efccl/common/status.h"
#include "efccl/net/fd.h"

namespace efccl::net {

/// An eventfd to wake a thread blocked in poll(2).
class Waker {
 public:
  /// A new eventfd (non-blocking, close-on-exec).
  static StatusOr<Waker> create();

  /// The descriptor to poll for POLLIN.
  int fd() const { return fd_.get(); }
  /// Makes fd() readable (any thread).
  void wake() const;
  /// Consumes the wake-ups (the polling thread, after poll returned).
  void drain() const;

 private:
  Fd fd_;
};

}  // namespace efccl::net
