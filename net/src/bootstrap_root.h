// The rendezvous server of one unique id: collects every rank's hello, checks it, and sends each
// rank the table of all ranks once all nranks joined. Roots are served by one thread of the
// process (root_server.h), however many ids are pending.
//
// What a root trusts: a connection is refused unless its first 8 bytes are the id's magic. The
// magic is random and secret unless NCCL_COMM_ID is set (then it is public): there rank 0, which
// starts the root in its own process, tells it nranks and a token of its own hello, so that a
// stranger's hello can neither take rank 0's place nor define the job; it is refused, that
// connection only. Nothing is sized by a hello before it is checked: nranks is bounded
// (Bootstrap::kMaxRanks) and memory grows with the ranks that joined, not with the nranks they
// claim. A well-formed rendezvous that goes wrong (ranks disagree on nranks, a rank joins twice)
// fails for every rank with a message naming the culprits.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/fd.h"
#include "efccl/net/frame_reader.h"
#include "efccl/net/refusal_report.h"
#include "efccl/net/socket_address.h"

namespace efccl::net {

/// The rendezvous of one unique id (see above). Only the serving thread calls the methods below
/// launch(), address() and abandon().
class BootstrapRoot {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    uint64_t magic = 0;
    SocketAddress address;  ///< where to listen (port 0: any free port)
    bool reuse_address = false;
    /// A rendezvous that has not completed this long (plus 2 s) after the root started and after
    /// its latest join ends, failing for the ranks that joined (the init timeout).
    std::chrono::milliseconds lifetime{120000};
    /// NCCL_COMM_ID: rank 0's nranks, known before any hello (0: the first hello defines it).
    int expected_nranks = 0;
    /// NCCL_COMM_ID: only a hello of rank 0 carrying this token (frame tag) takes rank 0's place.
    uint64_t rank0_token = 0;
  };

  /// Listens and hands the root to the process's serving thread.
  static StatusOr<std::shared_ptr<BootstrapRoot>> launch(const Options& options);

  SocketAddress address() const { return address_; }
  /// Stops the root unless its rendezvous completed (then it finishes delivering the table).
  /// Any thread.
  void abandon();

  /// Appends the descriptors to poll.
  void add_poll_fds(std::vector<pollfd>* fds) const;
  /// Handles the poll results of the `count` entries that add_poll_fds appended at `fds`;
  /// `buffer`: scratch for reading.
  void step(const pollfd* fds, std::size_t count, std::vector<char>& buffer, Clock::time_point now);
  /// When step() must run again at the latest, even if no descriptor is ready.
  Clock::time_point next_timer(Clock::time_point now) const;
  /// True once nothing remains to serve: the server drops the root and calls close().
  bool finished(Clock::time_point now) const;
  /// Closes every descriptor.
  void close();
  /// An exception escaped step(): tells the ranks that joined (best effort) and finishes.
  void crash(const std::string& what) noexcept;

  explicit BootstrapRoot(const Options& options);

 private:
  struct Conn {
    explicit Conn(uint64_t magic) : reader(magic) {}
    Fd fd;
    std::string from;
    FrameReader reader;
    int rank = -1;
    std::deque<std::shared_ptr<const std::string>> out;
    std::size_t out_at = 0;
    bool closing = false;   ///< close once `out` is written
    bool draining = false;  ///< written and shut down: waiting for the rank's end of file
    bool dead = false;
    Clock::time_point since;
  };
  struct Member {
    Conn* conn = nullptr;
    SocketAddress address;
    std::string info;
  };

  void queue(Conn& c, uint32_t type, std::string_view payload);
  std::string count_payload() const;
  void warn(const std::string& message) const;
  void fail(const std::string& why, Conn* also);
  /// A connection that broke the protocol: closed without a word.
  void refuse(Conn& c, const std::string& why);
  /// A well-formed hello that cannot be accepted: told why, then closed.
  void reject(Conn& c, const std::string& why);
  void hello(Conn& c, const FrameHeader& h, const std::string& payload);
  void complete();
  void forget(Conn& c, const std::string& why);
  void on_readable(Conn& c, std::vector<char>& buffer);
  void on_writable(Conn& c);
  void accept_all(Clock::time_point now);
  void expire(Clock::time_point now);
  Clock::time_point expiry() const;

  const Options options_;
  Fd listen_;
  SocketAddress address_;
  std::string name_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Conn>> conns_;
  int nranks_ = 0, nranks_from_ = -1;
  std::map<int, Member> members_;  ///< the ranks that joined: memory follows them, not nranks
  bool count_dirty_ = false, completed_ = false, expired_ = false, crashed_ = false;
  std::string failed_;
  Clock::time_point started_, last_join_, failed_at_, completed_at_, last_count_;
  Clock::time_point listen_paused_until_;
  RefusalReport refusals_;
};

}  // namespace efccl::net
