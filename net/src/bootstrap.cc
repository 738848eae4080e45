#include "efccl/net/bootstrap.h"

#include <sys/random.h>

#include <cerrno>
#include <utility>

#include "bootstrap_root.h"
#include "bootstrap_transport.h"
#include "efccl/common/hash.h"
#include "efccl/common/log.h"
#include "efccl/net/interfaces.h"

namespace efccl::net {
namespace {

/// A random 64-bit value for NCCL_COMM_ID's rank 0 token (0 when none can be had: then a
/// stranger who guesses 0 could claim rank 0, which is what NCCL allows anyway).
uint64_t random_token() {
  uint64_t v = 0;
  for (;;) {
    const ssize_t n = getrandom(&v, sizeof(v), 0);
    if (n == static_cast<ssize_t>(sizeof(v))) return v | 1;
    if (n < 0 && errno == EINTR) continue;
    return 0;
  }
}

}  // namespace

struct Bootstrap::Private {};

Bootstrap::Bootstrap(const Private&, std::shared_ptr<BootstrapTransport> transport, uint64_t space,
                     std::vector<int> world_ranks, int rank)
    : transport_(std::move(transport)),
      space_(space),
      world_(std::move(world_ranks)),
      rank_(rank),
      nranks_(static_cast<int>(world_.size())) {}

Bootstrap::~Bootstrap() { close(); }

StatusOr<std::shared_ptr<Bootstrap>> Bootstrap::start(const UniqueId& id, int nranks, int rank,
                                                      std::string info, Deadline deadline) {
  if (nranks < 1 || nranks > kMaxRanks)
    return Status::error("nranks " + std::to_string(nranks) + " must be in 1.." +
                         std::to_string(kMaxRanks));
  if (rank < 0 || rank >= nranks)
    return Status::error("rank " + std::to_string(rank) + " is out of range [0, " +
                         std::to_string(nranks) + ")");
  if (info.size() > kMaxInfoBytes)
    return Status::error("the rank's description has " + std::to_string(info.size()) +
                         " bytes, more than the bootstrap's limit of " +
                         std::to_string(kMaxInfoBytes));
  const UniqueIdFields d = UniqueIdFields::decode(id);
  if (!d.valid())
    return Status::error("the unique id was not made by efccl's ncclGetUniqueId (or is corrupt)");
  std::shared_ptr<BootstrapRoot> root;
  uint64_t token = 0;
  if (d.root_by_rank0() && rank == 0) {
    token = random_token();
    BootstrapRoot::Options options;
    options.magic = d.magic;
    options.address = d.root;
    options.reuse_address = true;
    options.lifetime = deadline.is_never() ? std::chrono::milliseconds(120000) : deadline.budget();
    options.expected_nranks = nranks;
    options.rank0_token = token;
    auto launched = BootstrapRoot::launch(options);
    if (!launched)
      return Status::error("rank 0 could not start the rendezvous root at NCCL_COMM_ID's " +
                           d.root.to_string() + ": " + launched.status().message());
    root = *launched;
  }
  auto iface = choose_interface(&d.root);
  if (!iface) {
    if (root) root->abandon();
    return iface.status();
  }
  auto transport = std::make_shared<BootstrapTransport>(d.magic, nranks, rank, d.root, deadline);
  if (Status s = transport->open(iface->address, info, token); !s) {
    if (root) root->abandon();
    return Status::error("rank " + std::to_string(rank) + " cannot listen on interface " +
                         iface->name + ": " + s.message());
  }
  EFCCL_INFO(kLogInit, -1,
             "bootstrap rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                 " listening on " + transport->listen_name() + " (interface " + iface->name +
                 "), rendezvous at " + transport->root_name());
  std::vector<int> world(static_cast<std::size_t>(nranks));
  for (int r = 0; r < nranks; ++r) world[static_cast<std::size_t>(r)] = r;
  auto boot =
      std::make_shared<Bootstrap>(Private{}, std::move(transport), 0, std::move(world), rank);
  boot->root_ = std::move(root);
  return boot;
}

Status Bootstrap::wait_ready(Deadline deadline, const std::atomic<bool>* abort) {
  if (closed_.load()) return Status::error("the bootstrap was closed");
  return transport_->wait_ready(deadline, abort);
}

const std::vector<std::string>& Bootstrap::infos() const {
  static const std::vector<std::string> kNone;
  if (is_subset_) return subset_infos_;
  return transport_->ready() ? transport_->infos() : kNone;
}

std::string Bootstrap::listen_address() const { return transport_->listen_name(); }

Status Bootstrap::check_peer(int peer) const {
  if (closed_.load()) return Status::error("the bootstrap was closed");
  if (peer < 0 || peer >= nranks_)
    return Status::error("peer " + std::to_string(peer) + " is out of range [0, " +
                         std::to_string(nranks_) + ")");
  return Status::ok();
}

Status Bootstrap::send(int peer, uint64_t tag, std::string_view data, Deadline deadline,
                       const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->send(world(peer), peer, space_, tag, data, deadline, abort);
}

Status Bootstrap::connect(int peer, Deadline deadline, const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->connect(world(peer), peer, deadline, abort);
}

StatusOr<std::string> Bootstrap::recv(int peer, uint64_t tag, Deadline deadline,
                                      const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->recv(world(peer), peer, space_, tag, deadline, abort);
}

StatusOr<std::pair<std::size_t, std::string>> Bootstrap::recv_any(const std::vector<int>& peers,
                                                                  uint64_t tag, Deadline deadline,
                                                                  const std::atomic<bool>* abort) {
  if (closed_.load()) return Status::error("the bootstrap was closed");
  std::vector<int> world_peers;
  world_peers.reserve(peers.size());
  for (int peer : peers) {
    if (Status s = check_peer(peer); !s) return s;
    world_peers.push_back(world(peer));
  }
  return transport_->recv_any(world_peers, space_, tag, deadline, abort);
}

StatusOr<std::vector<std::string>> Bootstrap::allgather(uint64_t tag, std::string mine,
                                                        Deadline deadline,
                                                        const std::atomic<bool>* abort) {
  std::vector<int> all(static_cast<std::size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) all[static_cast<std::size_t>(r)] = r;
  return allgather(all, tag, std::move(mine), deadline, abort);
}

StatusOr<std::vector<std::string>> Bootstrap::allgather(const std::vector<int>& ranks, uint64_t tag,
                                                        std::string mine, Deadline deadline,
                                                        const std::atomic<bool>* abort) {
  std::size_t me = ranks.size();
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= nranks_ || (i > 0 && ranks[i] <= ranks[i - 1]))
      return Status::error("allgather: the ranks must be sorted, distinct and in [0, " +
                           std::to_string(nranks_) + ")");
    if (ranks[i] == rank_) me = i;
  }
  if (me == ranks.size())
    return Status::error("allgather: rank " + std::to_string(rank_) + " is not among the ranks");
  // A ring: in step s each member passes on the block it received in step s-1.
  const std::size_t n = ranks.size();
  std::vector<std::string> out(n);
  out[me] = std::move(mine);
  const int next = ranks[(me + 1) % n], prev = ranks[(me + n - 1) % n];
  for (std::size_t s = 0; s + 1 < n; ++s) {
    if (Status st = send(next, tag, out[(me + n - s) % n], deadline, abort); !st)
      return Status::error("allgather: " + st.message());
    auto got = recv(prev, tag, deadline, abort);
    if (!got) return Status::error("allgather: " + got.status().message());
    out[(me + n - s - 1) % n] = std::move(*got);
  }
  return out;
}

Status Bootstrap::barrier(uint64_t tag, Deadline deadline, const std::atomic<bool>* abort) {
  if (closed_.load()) return Status::error("the bootstrap was closed");
  // Dissemination: in round k every rank signals rank+2^k and waits for rank-2^k.
  for (int step = 1; step < nranks_; step *= 2) {
    if (Status s = send((rank_ + step) % nranks_, tag, {}, deadline, abort); !s)
      return Status::error("barrier: " + s.message());
    auto got = recv((rank_ - step + nranks_) % nranks_, tag, deadline, abort);
    if (!got) return Status::error("barrier: " + got.status().message());
  }
  return Status::ok();
}

std::shared_ptr<Bootstrap> Bootstrap::subset(std::vector<int> ranks, uint64_t space) {
  if (closed_.load() || !transport_->ready()) {
    EFCCL_WARN(-1, "bootstrap subset: the parent bootstrap is closed or not ready");
    return nullptr;
  }
  std::vector<int> world(ranks.size());
  std::vector<bool> seen(static_cast<std::size_t>(nranks_), false);
  int me = -1;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= nranks_ || seen[static_cast<std::size_t>(r)]) {
      EFCCL_WARN(-1, "bootstrap subset: rank " + std::to_string(r) +
                         " is repeated or out of range [0, " + std::to_string(nranks_) + ")");
      return nullptr;
    }
    seen[static_cast<std::size_t>(r)] = true;
    world[i] = this->world(r);
    if (r == rank_) me = static_cast<int>(i);
  }
  if (me < 0) {
    EFCCL_WARN(-1, "bootstrap subset: rank " + std::to_string(rank_) + " is not a member");
    return nullptr;
  }
  // The namespace depends on the parent's, so nested subsets never collide with their parents.
  std::string key(reinterpret_cast<const char*>(&space_), sizeof(space_));
  key.append(reinterpret_cast<const char*>(&space), sizeof(space));
  const uint64_t derived = hash64(key, 0x6a09e667f3bcc909ull) | 1;  // never the root's 0
  transport_->acquire();
  auto sub = std::make_shared<Bootstrap>(Private{}, transport_, derived, std::move(world), me);
  sub->is_subset_ = true;
  const std::vector<std::string>& parent = infos();
  for (int r : ranks) sub->subset_infos_.push_back(parent[static_cast<std::size_t>(r)]);
  return sub;
}

void Bootstrap::set_peer_failure_handler(
    std::function<void(int peer, const std::string& why)> handler) {
  if (closed_.load()) return;
  if (!handler) {
    if (handler_id_ != 0) transport_->remove_handler(handler_id_);
    handler_id_ = 0;
    return;
  }
  handler_id_ = transport_->add_handler(world_, handler, handler_id_);
}

void Bootstrap::close() {
  if (closed_.exchange(true)) return;
  if (handler_id_ != 0) transport_->remove_handler(handler_id_);
  if (root_) root_->abandon();
  transport_->release();
}

}  // namespace efccl::net
