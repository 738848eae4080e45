// An owned file descriptor. Descriptors are tracked for fork(): a process forked from one that
// holds sockets (e.g. PyTorch DataLoader workers forked from a rank) would otherwise keep them
// alive, so that a peer could not see the rank die (no end of file while the child lives) and
// would connect to a listener nobody serves. A forked child therefore finds every tracked
// descriptor replaced by /dev/null (close-on-exec), keeping the number taken so that a stale
// close() later stays harmless. A launcher's pipe ends that a child must inherit are untracked.
#pragma once

namespace efccl::net {

/// An owned file descriptor, closed when it goes, and released in forked children.
class Fd {
 public:
  Fd() = default;
  /// Owns `fd` (a negative value: none) and tracks it for fork().
  explicit Fd(int fd);
  /// Owns `fd` without tracking it: forked children keep it (a pipe end handed to a child).
  static Fd untracked(int fd);

  Fd(Fd&& other) noexcept;
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  /// Closes the descriptor held, then owns (and tracks) `fd`.
  void reset(int fd = -1);
  /// Gives up ownership without closing; the caller owns the descriptor (untracked).
  int release();

 private:
  int fd_ = -1;
  bool tracked_ = false;
};

}  // namespace efccl::net
