// efccl-mprun's rendezvous server (protocol: efccl/mprun/rendezvous.h). It never blocks: the
// launcher polls its descriptors together with the ranks' output pipes and calls handle() for
// the ready ones; replies are a few bytes per rank and are sent with a short deadline.
#pragma once

#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/mprun/socket.h"

namespace efccl::mprun {

class RendezvousServer {
 public:
  /// What a handle() call saw that the launcher acts on.
  struct Event {
    enum class Kind { kAbort, kWarning } kind = Kind::kWarning;
    int rank = -1;      ///< kAbort: who called MPI_Abort
    int errorcode = 0;  ///< kAbort
    std::string text;   ///< kWarning: a line for stderr
  };

  /// Listens on 127.0.0.1 (any free port) for the `size` ranks of job `job`.
  static StatusOr<RendezvousServer> start(int size, std::string job);

  const Address& address() const { return address_; }
  /// The descriptors to poll for input: the listener and every connection.
  std::vector<int> fds() const;
  /// Handles input on `fd` (one of fds()), appending what the launcher must act on to `events`.
  void handle(int fd, std::vector<Event>* events);

 private:
  struct Connection {
    Fd fd;
    std::string input;  ///< bytes of an incomplete line
    int rank = -1;      ///< after its HELLO
  };

  void accept_one(std::vector<Event>* events);
  /// One complete line from `c`; false when the connection must be closed.
  bool on_line(Connection& c, const std::string& line, std::vector<Event>* events);
  void reject(Connection& c, const std::string& why, std::vector<Event>* events);

  int size_ = 0;
  std::string job_;
  Fd listener_;
  Address address_;
  std::vector<Connection> connections_;
  std::vector<Address> peers_;  ///< by rank; port 0 until registered
  int registered_ = 0;
  bool peers_sent_ = false;
};

}  // namespace efccl::mprun
