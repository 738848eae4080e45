// The proxy: the progress engine of a process's network connections (net_connection.h). It
// listens on one interface, authenticates the sockets that arrive, and runs
// ProxySettings::nthreads threads that move slots between the connections' regions and their
// sockets; socket i of a connection is served by one of them, so a connection with several
// sockets (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD) is carried by several threads.
//
// Making a connection (the runtime carries the handle through the communicator's bootstrap):
//
//   receiver:  auto recv = proxy->expect(region, "recv from rank 0", &handle);
//              bootstrap.send(sender, tag, handle);  ...  recv->wait_open(deadline);
//   sender:    auto handle = bootstrap.recv(receiver, tag);
//              auto send = proxy->connect(region, "send to rank 1", handle, deadline);
//
// Authentication: the handle holds a random 128-bit token made for that connection, and travels
// only through the bootstrap, whose connections prove the unique id's secret; every socket's
// hello must carry the token. A connection whose first bytes are not a hello, whose hello names
// no expected connection or carries a wrong token, or that says nothing within 10 s, is refused
// (closed; a WARN at most once a second with a count); at most 128 such connections are kept at
// a time (the oldest go first), and no byte from one reaches a connection's memory.
//
// Threads never block: they poll their sockets and the regions' counters, sleeping up to 1 ms
// when nothing moves (kick() makes them look at once and spin for a while: a kernel that uses
// network connections is about to start). Every wait of the API has a deadline and an abort
// flag. Memory is bounded: data moves between sockets and regions directly, headers and hellos
// have fixed sizes.
#pragma once

#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/fd.h"
#include "efccl/net/net_connection.h"
#include "efccl/net/proxy_settings.h"
#include "efccl/net/slot_region.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

class ConnectionCore;
class ProxyThread;
class SocketTask;

class Proxy : public std::enable_shared_from_this<Proxy> {
 public:
  /// Bytes of a connection handle (what expect() writes and connect() reads).
  static constexpr std::size_t kHandleBytes = 84;

  /// Listens on settings.interface's address (any port) and starts the threads.
  static StatusOr<std::shared_ptr<Proxy>> start(const ProxySettings& settings);

  const ProxySettings& settings() const { return settings_; }
  /// "10.0.0.1:39811" (for logs and messages).
  std::string listen_address() const { return listen_addr_.to_string(); }

  /// The receiving end of a new connection over `region` (its layout is the connection's);
  /// `*handle` receives the bytes its sender must pass to connect(). The end is kConnecting
  /// until the sender's sockets arrived (wait_open). `name` names it in messages.
  StatusOr<std::unique_ptr<NetConnection>> expect(const SlotRegion& region, std::string name,
                                                  std::string* handle);
  /// The sending end of the connection `handle` describes (its layout must be `region`'s):
  /// connects its sockets, each authenticated by the receiver, until `deadline` or `*abort`.
  StatusOr<std::unique_ptr<NetConnection>> connect(const SlotRegion& region, std::string name,
                                                   std::string_view handle, Deadline deadline,
                                                   const std::atomic<bool>* abort = nullptr);

  /// Makes every thread look at its connections now and spin for a while (~10 ms).
  void kick();
  /// Connections refused so far (strangers, wrong tokens).
  uint64_t refused() const { return refused_.load(); }

  /// Stops the threads; connections still open fail (kSystem, "the proxy stopped").
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  struct Private;  ///< lets make_shared reach the constructor, nothing else
  Proxy(const Private&, const ProxySettings& settings);

  // For the proxy's own parts (ProxyThread, NetConnection).
  /// The expected connection `id`, or null.
  std::shared_ptr<ConnectionCore> expected(uint64_t id);
  void forget(uint64_t id);
  /// Hands socket `index` of `core` to its thread.
  void attach(const std::shared_ptr<ConnectionCore>& core, uint32_t index, Fd fd);
  void count_refusal() { refused_.fetch_add(1); }
  /// Wakes every thread (a connection closes).
  void wake_all();
  /// Whether the calling thread is one of this proxy's.
  bool on_proxy_thread() const;
  /// Whether this is an inherited copy in a forked child (no threads; sockets are /dev/null).
  bool inherited() const { return getpid() != owner_pid_; }

 private:
  Status open();
  /// Sets the sockets' keepalive and TCP_USER_TIMEOUT (settings_.peer_timeout).
  void tune(int fd) const;

  const pid_t owner_pid_ = getpid();
  ProxySettings settings_;
  SocketAddress listen_addr_;
  std::vector<std::unique_ptr<ProxyThread>> threads_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint32_t> next_thread_{0};
  std::atomic<uint64_t> refused_{0};
  std::mutex mu_;
  std::map<uint64_t, std::weak_ptr<ConnectionCore>> expecting_;  // under mu_
};

}  // namespace efccl::net
