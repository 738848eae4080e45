// The multi-process bootstrap: how the ranks of a communicator, in any processes on any hosts,
// find each other from a unique id (unique_id.h) and exchange small messages over TCP.
//
// Each rank opens its own listen socket and tells the id's root (magic, nranks, rank, listen
// address, info blob); once all nranks have joined, the root sends every rank the table of all
// ranks and ends. Afterwards ranks talk directly: connections are opened on first use,
// authenticated by the magic and the ranks, and kept open until close(). One progress thread per
// bootstrap (shared with its subsets) accepts connections, reads messages into per-(namespace,
// peer, tag) mailboxes and notices peers that die. Nothing waits without a deadline and an abort
// flag; a peer's frame, a stranger's connection or a bad hello ends in an error for that
// connection or for the rendezvous, never in an abort of the process (bootstrap_root.h says what
// the root trusts).
//
// Environment, as NCCL reads it: NCCL_COMM_ID ("host:port", "[ipv6]:port": the root listens
// there, started by rank 0), NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY (interfaces.h), NCCL_HOSTID
// (host_hash.h).
//
// Sockets are close-on-exec and written with MSG_NOSIGNAL (no SIGPIPE). A bootstrap does not
// survive fork(): a forked child's copies of its descriptors are replaced by /dev/null (fd.h);
// the child must not use inherited bootstraps (destroying them is harmless).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "efccl/common/status.h"
#include "efccl/net/deadline.h"
#include "efccl/net/unique_id.h"

namespace efccl::net {

class BootstrapTransport;
class BootstrapRoot;

/// One rank's end of the rendezvous of a unique id and its messages to the other ranks.
/// Thread-safe: any thread may send/recv/allgather (collectives need one caller per tag).
class Bootstrap {
 public:
  using Clock = std::chrono::steady_clock;
  /// Largest `info` blob (start) and largest message (send).
  static constexpr std::size_t kMaxInfoBytes = 64 * 1024;
  static constexpr std::size_t kMaxMessageBytes = 256u * 1024 * 1024;
  /// Largest nranks of a rendezvous (2^20): a root refuses hellos that claim more.
  static constexpr int kMaxRanks = 1 << 20;

  /// Joins the rendezvous of `id` as `rank` of `nranks` without waiting for anyone: opens this
  /// rank's listen socket and starts its progress thread, which connects to the root (retrying
  /// until `deadline` while the root is not up yet) and announces (nranks, rank, address,
  /// `info`). Several ranks may be started from one thread before any is waited on. `deadline`
  /// is the whole init's (made at the API call, e.g. Deadline::after(init timeout)): a timeout
  /// is reported with its budget. With NCCL_COMM_ID rank 0 starts the root here, living until
  /// `deadline`'s budget passed without a join.
  static StatusOr<std::shared_ptr<Bootstrap>> start(const UniqueId& id, int nranks, int rank,
                                                    std::string info, Deadline deadline);

  /// Blocks until the root has sent the table of all ranks, `deadline` passes or `*abort`
  /// becomes true (checked every 10 ms; may be null). Returns at once when already ready; may be
  /// called again after a timeout (the rendezvous goes on in the background until close()).
  Status wait_ready(Deadline deadline, const std::atomic<bool>* abort);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  /// Every rank's `info` blob, by rank (valid after wait_ready succeeded; empty before).
  const std::vector<std::string>& infos() const;
  /// Where this rank accepts connections from its peers, e.g. "10.0.0.1:39811" (for logs).
  std::string listen_address() const;

  /// Sends `data` (at most kMaxMessageBytes) to `peer` (may be this rank) under `tag`. Messages
  /// from one peer with one tag arrive in the order sent. Returns once the bytes are handed to
  /// the kernel. Fails if the deadline passes or `*abort` becomes true first; a message cut
  /// short that way breaks the connection (the peer sees this rank fail).
  Status send(int peer, uint64_t tag, std::string_view data, Deadline deadline,
              const std::atomic<bool>* abort = nullptr);
  /// The next message from `peer` with `tag`. Messages that arrived before the peer left or
  /// died are still delivered; after that, waiting for more fails at once.
  StatusOr<std::string> recv(int peer, uint64_t tag, Deadline deadline,
                             const std::atomic<bool>* abort = nullptr);
  /// The next message with `tag` from any of `peers` (this bootstrap's numbering, each in
  /// range), with the index in `peers` of its sender: for a thread that serves requests from
  /// several peers. Messages of peers that failed or left are still delivered; those peers are
  /// then simply silent. Fails when `deadline` passes (Status message "timed out ..."), `*abort`
  /// is set, or the bootstrap closes or breaks.
  StatusOr<std::pair<std::size_t, std::string>> recv_any(const std::vector<int>& peers,
                                                         uint64_t tag, Deadline deadline,
                                                         const std::atomic<bool>* abort = nullptr);
  /// Opens (or finds) the connection to `peer` now instead of at the first send. Only peers
  /// with an open connection are watched for failure (set_peer_failure_handler): those this
  /// rank exchanged messages with (a ring allgather: its two neighbours) and those it connected.
  Status connect(int peer, Deadline deadline, const std::atomic<bool>* abort = nullptr);

  /// Every rank's `mine`, by rank (a ring; every rank calls it with the same tag).
  StatusOr<std::vector<std::string>> allgather(uint64_t tag, std::string mine, Deadline deadline,
                                               const std::atomic<bool>* abort = nullptr);
  /// Among `ranks` only (sorted, without repeats, including this rank; every member calls it
  /// with the same list and tag): the members' blobs in the order of `ranks`.
  StatusOr<std::vector<std::string>> allgather(const std::vector<int>& ranks, uint64_t tag,
                                               std::string mine, Deadline deadline,
                                               const std::atomic<bool>* abort = nullptr);
  /// Returns once every rank has entered the barrier with `tag` (dissemination, log2 rounds).
  Status barrier(uint64_t tag, Deadline deadline, const std::atomic<bool>* abort = nullptr);

  /// A bootstrap whose rank i is this one's rank `ranks[i]` (ranks distinct, in range, this rank
  /// among them), sharing this one's sockets and thread, with the message namespace derived from
  /// this one's and `space` (every member passes the same value). Null if this bootstrap is not
  /// ready or `ranks` is invalid (logged).
  std::shared_ptr<Bootstrap> subset(std::vector<int> ranks, uint64_t space);

  /// Called on the progress thread when the connection to a peer (in this bootstrap's
  /// numbering) breaks although the peer did not close(): its process died. Once per peer;
  /// peers that had failed before the handler was set are reported at once, from this call.
  /// The handler must not block; it may call close(). An empty function removes it.
  void set_peer_failure_handler(std::function<void(int peer, const std::string& why)> handler);

  /// Leaves: when the last bootstrap sharing the sockets (this one and its subsets) closes, tells
  /// every connected peer that this rank is leaving (so none reports a failure), waits up to 1 s
  /// for them to acknowledge, stops the thread and closes the sockets. With NCCL_COMM_ID, rank 0
  /// also stops the root if the rendezvous has not completed. Idempotent; the destructor calls it.
  void close();

  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  struct Private;  ///< lets make_shared reach the constructor, nothing else
  Bootstrap(const Private&, std::shared_ptr<BootstrapTransport> transport, uint64_t space,
            std::vector<int> world_ranks, int rank);

 private:
  int world(int rank) const { return world_[static_cast<std::size_t>(rank)]; }
  Status check_peer(int peer) const;

  std::shared_ptr<BootstrapTransport> transport_;
  std::shared_ptr<BootstrapRoot> root_;  ///< NCCL_COMM_ID: the root rank 0 started
  uint64_t space_ = 0;
  std::vector<int> world_;  ///< this bootstrap's rank -> the transport's rank
  int rank_ = 0;
  int nranks_ = 0;
  std::vector<std::string> subset_infos_;  ///< subsets: the members' infos
  bool is_subset_ = false;
  uint64_t handler_id_ = 0;
  std::atomic<bool> closed_{false};
};

}  // namespace efccl::net
