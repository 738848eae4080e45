// efccl-mprun's rendezvous server (protocol: efccl/mprun/rendezvous.h). It never blocks for a
// stranger: the launcher polls its descriptors together with the ranks' output pipes, calls
// handle() for the ready ones and tick() every round. A connection that has not said HELLO
// within a short time is dropped, and at most a few such connections are kept (the oldest go
// first), so idle or hostile local connections never take a rank's place. Refusals are
// reported at most once a second, with a count.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/fd.h"
#include "efccl/net/refusal_report.h"
#include "efccl/net/socket_address.h"

namespace efccl::mprun {

class RendezvousServer {
 public:
  using Clock = std::chrono::steady_clock;

  /// What a handle() or tick() call saw that the launcher acts on.
  struct Event {
    enum class Kind { kAbort, kWarning } kind = Kind::kWarning;
    int rank = -1;      ///< kAbort: who called MPI_Abort
    int errorcode = 0;  ///< kAbort
    std::string text;   ///< kWarning: a line for stderr (printable)
  };

  /// How long and how many connections may stay without a HELLO.
  struct Limits {
    std::chrono::milliseconds hello_timeout{5000};
    std::size_t max_strangers = 64;
  };

  /// Listens on 127.0.0.1 (any free port) for the `size` ranks of job `job`.
  static StatusOr<RendezvousServer> start(int size, std::string job, Limits limits);
  static StatusOr<RendezvousServer> start(int size, std::string job) {
    return start(size, std::move(job), Limits());
  }

  const net::SocketAddress& address() const { return address_; }
  /// The descriptors to poll for input: the listener and every connection.
  std::vector<int> fds() const;
  /// Handles input on `fd` (one of fds()), appending what the launcher must act on to `events`.
  void handle(int fd, std::vector<Event>* events);
  /// Drops connections that did not say HELLO in time and reports refusals counted since the
  /// last report; call it every round of the launcher's loop.
  void tick(std::vector<Event>* events);
  /// Reports the refusals counted since the last report at once (the job ends).
  void finish(std::vector<Event>* events);
  /// Every rank has registered and got the peer list.
  bool complete() const { return peers_sent_; }

 private:
  struct Connection {
    net::Fd fd;
    std::string input;  ///< bytes of an incomplete line
    int rank = -1;      ///< after its HELLO
    std::string from;
    Clock::time_point since;
  };

  void accept_all(std::vector<Event>* events);
  /// One complete line from `c`; false when the connection must be closed.
  bool on_line(Connection& c, const std::string& line, std::vector<Event>* events);
  /// Refuses `c` (counted, reported throttled) and tells it why, without waiting for it.
  void reject(Connection& c, const std::string& why, std::vector<Event>* events);
  void report(std::optional<std::string> line, std::vector<Event>* events);

  int size_ = 0;
  std::string job_;
  Limits limits_;
  net::Fd listener_;
  net::SocketAddress address_;
  std::vector<Connection> connections_;
  std::vector<net::SocketAddress> peers_;  ///< by rank; invalid until registered
  int registered_ = 0;
  bool peers_sent_ = false;
  net::RefusalReport refusals_{"rendezvous server"};
  Clock::time_point accept_paused_until_{};
};

}  // namespace efccl::mprun
