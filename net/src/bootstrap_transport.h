// One rank's sockets, progress thread and mailboxes, shared by a Bootstrap and its subsets.
// The progress thread drives the rendezvous (root_link.h), accepts connections from peers and
// authenticates them (the id's magic, then a hello naming both ranks), reads every message into
// a mailbox keyed by (namespace, peer, tag), and notices peers that die. Connections are opened
// on first use by the sending thread and kept until close().
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/fd.h"
#include "efccl/net/frame_reader.h"
#include "efccl/net/refusal_report.h"
#include "efccl/net/socket_address.h"
#include "efccl/net/waker.h"
#include "root_link.h"

namespace efccl::net {

/// One TCP connection to another rank (either side may have opened it).
struct BootstrapConnection {
  explicit BootstrapConnection(uint64_t magic) : reader(magic) {}
  Fd fd;
  int peer = -1;  ///< -1 until its hello authenticated it
  bool outgoing = false;
  std::string remote;
  std::mutex write_mu;
  bool write_broken = false;  ///< under write_mu: a frame was cut short
  FrameReader reader;         // progress thread only
  bool goodbye = false;       // progress thread only
  std::chrono::steady_clock::time_point since;
  std::atomic<bool> closed{false};
};

/// A rank's end of the bootstrap (see above). Ranks are the transport's own numbering (the
/// world); `shown` arguments are the caller's numbering, for messages only.
class BootstrapTransport : public std::enable_shared_from_this<BootstrapTransport> {
 public:
  using Clock = std::chrono::steady_clock;
  using Handler = std::function<void(int peer, const std::string& why)>;

  /// `deadline`: until when the root is tried (the whole init's deadline).
  BootstrapTransport(uint64_t magic, int nranks, int rank, const SocketAddress& root,
                     Deadline deadline);
  ~BootstrapTransport();

  /// Listens on `local`'s address (any port) and starts the progress thread, which joins the
  /// rendezvous announcing `info`; `rank0_token` goes with the hello (NCCL_COMM_ID's rank 0).
  Status open(const SocketAddress& local, const std::string& info, uint64_t rank0_token);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const std::string& root_name() const { return root_name_; }
  std::string listen_name() const { return listen_addr_.to_string(); }
  /// Every rank's info (set once, before ready() becomes true).
  const std::vector<std::string>& infos() const { return infos_; }
  bool ready();

  /// One more bootstrap shares this transport.
  void acquire();
  /// One bootstrap sharing this transport closed; the last one stops it (goodbyes, thread).
  void release();

  Status wait_ready(Deadline deadline, const std::atomic<bool>* abort);
  Status send(int peer, int shown, uint64_t space, uint64_t tag, std::string_view data,
              Deadline deadline, const std::atomic<bool>* abort);
  Status connect(int peer, int shown, Deadline deadline, const std::atomic<bool>* abort);
  StatusOr<std::string> recv(int peer, int shown, uint64_t space, uint64_t tag, Deadline deadline,
                             const std::atomic<bool>* abort);
  /// Bootstrap::recv_any, `peers` in the transport's numbering.
  StatusOr<std::pair<std::size_t, std::string>> recv_any(const std::vector<int>& peers,
                                                         uint64_t space, uint64_t tag,
                                                         Deadline deadline,
                                                         const std::atomic<bool>* abort);

  /// Registers (or, with an empty `fn`, removes) a failure handler for `members` (the
  /// handler's rank i is the transport's rank members[i]); id 0: a new one. Returns its id.
  uint64_t add_handler(std::vector<int> members, const Handler& fn, uint64_t id);
  void remove_handler(uint64_t id);

 private:
  enum class Phase { kJoining, kReady, kFailed };
  using MailKey = std::tuple<uint64_t, int, uint64_t>;  // space, peer, tag
  struct PeerState {
    std::mutex connect_mu;                           ///< one connection attempt at a time
    std::atomic<uint64_t> sent{0};                   ///< data frames written to the peer
    std::shared_ptr<BootstrapConnection> send_conn;  // below: under mu_
    bool failed = false;
    /// The peer closed its bootstrap and every data frame it sent here has been delivered:
    /// two ranks may each have connected to the other, and a goodbye read on one connection
    /// can overtake data still unread on the other, so a goodbye announces how many frames
    /// the peer sent in all (`announced`) and counts only once `received` reaches it.
    bool left = false;
    bool goodbye = false;
    uint64_t announced = 0;
    uint64_t received = 0;
    std::string why;
  };
  struct HandlerEntry {
    std::vector<int> members;
    Handler fn;
  };

  std::string peer_state_suffix(int peer);
  StatusOr<std::shared_ptr<BootstrapConnection>> connection_to(int peer, int shown,
                                                               Deadline deadline,
                                                               const std::atomic<bool>* abort);
  void deliver(uint64_t space, int from, uint64_t tag, std::string payload);
  /// A mailbox wait (under mu_) must end: why (broken, closed, aborted, deadline), else ok.
  Status mail_wait_ended(const std::string& what, Clock::time_point begin,
                         const Deadline& deadline, const std::atomic<bool>* abort) const;
  void apply(RootLink::Update& update);
  void fail_rendezvous(const std::string& why);
  void accept_all();
  void refuse(BootstrapConnection& c, const std::string& why);
  void drop(BootstrapConnection& c);
  void peer_broken(int peer, const std::string& why);
  bool on_frame(BootstrapConnection& c, const FrameHeader& h, std::string payload);
  void on_readable(BootstrapConnection& c);
  void expire_strangers();
  void run();
  void serve();
  /// An exception escaped the progress thread's work: every wait fails with `why`.
  void crash(const std::string& why) noexcept;
  void say_goodbye();

  const uint64_t magic_;
  const int nranks_, rank_;
  const SocketAddress root_;
  const std::string root_name_;
  const Deadline deadline_;
  const Clock::time_point started_;
  const pid_t owner_pid_ = getpid();
  Fd listen_;
  std::unique_ptr<Waker> waker_;
  SocketAddress listen_addr_;
  std::thread thread_;
  std::thread::id thread_id_;

  // Progress thread only.
  std::unique_ptr<RootLink> root_link_;
  std::vector<char> buffer_;
  RefusalReport refusals_;
  Clock::time_point listen_paused_until_{};

  std::mutex mu_;  // guards everything below, and PeerState's flagged fields
  std::condition_variable cv_;
  Phase phase_ = Phase::kJoining;
  std::string fail_reason_, last_connect_error_;
  std::string broken_;  ///< the progress thread failed: why (every wait fails)
  bool root_reached_ = false;
  int joined_ = -1;
  std::vector<SocketAddress> addrs_;
  std::vector<std::string> infos_;  // set once, before phase_ becomes kReady
  std::unique_ptr<PeerState[]> peers_;
  std::vector<std::shared_ptr<BootstrapConnection>> conns_;
  std::map<MailKey, std::deque<std::string>> mail_;
  std::map<uint64_t, HandlerEntry> handlers_;
  uint64_t next_handler_ = 0;
  int open_handles_ = 0;
  bool stopping_ = false;
};

}  // namespace efccl::net
