// One proxy thread: polls its sockets (and, for the first thread, the listener) and steps their
// tasks. It never blocks: with bytes moving it polls without waiting; with tasks waiting for a
// counter of the GPU (a slot posted or freed) it sleeps 5 us doubling up to 50 us while bytes
// moved within the last 10 ms, up to 1 ms after that, and not at all while kicked; with nothing
// but sockets to wait for it sleeps in poll until one is ready, its waker rings, or 100 ms pass.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/waker.h"
#include "proxy_listener.h"
#include "socket_task.h"

namespace efccl::net {

class ProxyThread {
 public:
  /// `listener`: the proxy's listener (first thread only; null for the others).
  ProxyThread(int index, Waker waker, std::unique_ptr<ProxyListener> listener);
  ~ProxyThread();

  Status start();
  /// Stops and joins the thread; the connections of its tasks fail (kSystem, "the proxy
  /// stopped").
  void stop();
  /// Hands a task to the thread (any thread).
  void add(std::unique_ptr<SocketTask> task);
  /// Makes the thread look now and spin until `until_ns` (steady clock).
  void kick(int64_t until_ns);
  void wake() const { waker_.wake(); }
  std::thread::id id() const { return id_; }

 private:
  void run();
  void serve();
  /// Ends every task (their connections fail with `why` unless they ended already).
  void drop_all(const std::string& why);

  const int index_;
  const pid_t owner_pid_ = getpid();
  Waker waker_;
  std::unique_ptr<ProxyListener> listener_;
  std::thread thread_;
  std::thread::id id_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> hot_until_ns_{0};
  std::mutex inbox_mu_;
  std::vector<std::unique_ptr<SocketTask>> inbox_;  // under inbox_mu_
  bool stopped_ = false;                            // under inbox_mu_: add() drops tasks
  std::vector<std::unique_ptr<SocketTask>> tasks_;  // the thread only
};

}  // namespace efccl::net
