// The proxy's listener, served by its first thread: accepts connections and authenticates each
// by its hello (proxy_wire.h) before handing it to the connection it names. Strangers are
// refused: a first word that is not the hello's magic at once, a wrong version, an unknown
// connection, a wrong token or a bad socket index once the hello is complete (with a reply
// saying why), silence after 10 s; at most 128 unauthenticated connections are kept (the oldest
// go first). Refusals are logged at most once a second, with a count.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <vector>

#include "efccl/net/fd.h"
#include "efccl/net/refusal_report.h"
#include "efccl/net/socket_address.h"
#include "proxy_wire.h"

namespace efccl::net {

class Proxy;

class ProxyListener {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kHelloTimeout{10000};
  static constexpr std::size_t kMaxPending = 128;

  ProxyListener(Proxy& proxy, Fd listener, const std::string& address);
  ~ProxyListener();

  /// Appends the listener's and the pending connections' pollfds; returns how many.
  std::size_t add_pollfds(std::vector<pollfd>& fds) const;
  /// Handles what poll reported for the `count` pollfds add_pollfds appended at `fds`.
  void service(const pollfd* fds, std::size_t count);

 private:
  struct Pending {
    Fd fd;
    std::string from;
    char hello[Hello::kBytes] = {};
    std::size_t got = 0;
    Clock::time_point since;
    bool done = false;
  };
  void accept_new();
  /// Reads `p`'s hello; true when `p` is finished with (handed over or refused).
  bool read_hello(Pending& p);
  void authenticate(Pending& p);
  void refuse(Pending& p, const std::string& why, bool reply,
              ReplyCode code = ReplyCode::kAccepted);

  Proxy& proxy_;
  Fd listener_;
  std::deque<Pending> pending_;
  RefusalReport refusals_;
  Clock::time_point paused_until_{};
};

}  // namespace efccl::net
