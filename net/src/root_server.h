// The one thread of a process that serves every pending rendezvous root (bootstrap_root.h):
// 500 unused unique ids cost 500 listening sockets, not 500 threads. The thread starts with the
// first root and ends when the last one finished; a forked child starts its own when it needs one.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/waker.h"

namespace efccl::net {

class BootstrapRoot;

/// Serves the process's roots on one poll loop.
class RootServer {
 public:
  /// The process's server (never destroyed: its thread may outlive static destructors).
  static RootServer& instance();

  /// Serves `root` until it finished, starting the thread if none runs.
  Status add(std::shared_ptr<BootstrapRoot> root);
  /// Interrupts the thread's poll (a root changed state from another thread).
  void wake();

 private:
  RootServer() = default;
  void run();
  static void lock_for_fork();
  static void unlock_after_fork();
  static void reset_in_child();

  std::mutex mu_;
  std::vector<std::shared_ptr<BootstrapRoot>> roots_;
  std::unique_ptr<Waker> waker_;
  bool running_ = false;
  bool inherited_ = false;  ///< set in a forked child: roots_ and waker_ belong to the parent
};

}  // namespace efccl::net
