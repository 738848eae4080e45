// A rank's connection to the rendezvous root (bootstrap_root.h), advanced by its transport's
// progress thread: connects (retrying while nobody listens there yet, until the deadline), says
// hello, then reads the root's progress reports and at last the table of all ranks, or the
// reason the rendezvous failed.
#pragma once

#include <poll.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "efccl/net/deadline.h"
#include "efccl/net/fd.h"
#include "efccl/net/frame_reader.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

/// One rank's side of the rendezvous. Progress thread only.
class RootLink {
 public:
  using Clock = std::chrono::steady_clock;

  /// What one step() learned.
  struct Update {
    bool reached = false;                      ///< connected to the root just now
    std::optional<std::string> connect_error;  ///< an attempt failed; retrying
    std::optional<int> joined;                 ///< the root's latest count of joined ranks
    std::optional<std::string> failed;         ///< the rendezvous failed: why
    bool table = false;                        ///< `addresses` and `infos` hold every rank's
    std::vector<SocketAddress> addresses;
    std::vector<std::string> infos;
  };

  /// `hello`: the whole kRootHello frame to send once connected.
  RootLink(uint64_t magic, int nranks, const SocketAddress& root, Deadline deadline,
           std::string hello);

  /// "10.0.0.1:4242" (for messages).
  const std::string& root_name() const { return root_name_; }
  /// The poll entry of the connection (descriptor -1 while there is none).
  pollfd poll_entry() const;
  /// How long poll may wait before step() must run again (a retry is due), at most `cap_ms`.
  int poll_timeout_ms(int cap_ms) const;
  /// Advances with the poll result of poll_entry(); `buffer`: scratch for reading.
  void step(short revents, std::vector<char>& buffer, Update* update);
  /// The rendezvous ended here (table received or failed).
  bool done() const { return state_ == State::kDone; }
  /// Closes the connection.
  void close();

 private:
  enum class State { kWait, kConnecting, kActive, kDone };

  void retry(const std::string& error, Update* update);
  void finish(std::string why, Update* update);
  void exchange(short revents, std::vector<char>& buffer, Update* update);
  bool learn_table(std::string_view t, Update* update) const;

  const int nranks_;
  const SocketAddress root_;
  const std::string root_name_;
  const Deadline deadline_;
  const std::string hello_;
  State state_ = State::kWait;
  Fd fd_;
  std::size_t hello_sent_ = 0;
  FrameReader reader_;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{10};
  std::string last_error_;
};

}  // namespace efccl::net
