#include "peer_mesh.h"

#include <mpi.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/refusal_report.h"
#include "efccl/net/socket.h"

namespace efccl::mpishim {
namespace {

using net::Deadline;
using net::Fd;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kFrameMagic = 0xefcc1a9171f3a9e1ull;
constexpr uint64_t kHandshakeMagic = 0xefcc1a9171f3a9e2ull;
constexpr uint64_t kMaxMessageBytes = 1ull << 36;  // a corrupt header is not an allocation
constexpr size_t kMaxStashedBytes = size_t{1} << 32;
constexpr size_t kMaxPending = 64;  // accepted connections waiting for their handshake

/// The fixed header before every payload (same host, so native byte order).
struct WireHeader {
  uint64_t magic;
  uint64_t comm_id;
  uint64_t seq;
  uint64_t bytes;
  uint32_t kind;
  int32_t arg0;
  int32_t arg1;
  uint32_t reserved;
};

/// The first bytes on a peer connection: who dials, in which job.
struct Handshake {
  uint64_t magic;
  int32_t rank;
  int32_t size;
  char job[48];
};

Handshake make_handshake(const std::string& job, int rank, int size) {
  Handshake h{};
  h.magic = kHandshakeMagic;
  h.rank = rank;
  h.size = size;
  std::strncpy(h.job, job.c_str(), sizeof(h.job) - 1);
  return h;
}

std::string handle_name(int32_t handle) {
  switch (handle) {
    case MPI_BYTE:
      return "MPI_BYTE";
    case MPI_INT:
      return "MPI_INT";
    case MPI_LONG:
      return "MPI_LONG";
    case MPI_LONG_LONG:
      return "MPI_LONG_LONG";
    case MPI_INT64_T:
      return "MPI_INT64_T";
    case MPI_DOUBLE:
      return "MPI_DOUBLE";
    case MPI_SUM:
      return "MPI_SUM";
    case MPI_MIN:
      return "MPI_MIN";
    case MPI_MAX:
      return "MPI_MAX";
    default:
      return std::to_string(handle);
  }
}

/// "MPI_Bcast(root 1, MPI_INT), collective #3 on its communicator".
std::string describe(const Tag& t) {
  std::string args;
  switch (t.kind) {
    case CallKind::kBcast:
      args = "root " + std::to_string(t.arg0) + ", " + handle_name(t.arg1);
      break;
    case CallKind::kGather:
      args = "root " + std::to_string(t.arg0);
      break;
    case CallKind::kAllreduce:
      args = handle_name(t.arg0) + ", " + handle_name(t.arg1);
      break;
    default:
      break;
  }
  return std::string(call_name(t.kind)) + "(" + args + "), collective #" + std::to_string(t.seq) +
         " on its communicator";
}

}  // namespace

const char* call_name(CallKind kind) {
  switch (kind) {
    case CallKind::kBarrier:
      return "MPI_Barrier";
    case CallKind::kBcast:
      return "MPI_Bcast";
    case CallKind::kGather:
      return "MPI_Gather";
    case CallKind::kAllgather:
      return "MPI_Allgather";
    case CallKind::kAllreduce:
      return "MPI_Allreduce";
    case CallKind::kCommSplit:
      return "MPI_Comm_split";
    case CallKind::kFinalize:
      return "MPI_Finalize";
  }
  return "an unknown MPI call";
}

StatusOr<std::unique_ptr<PeerMesh>> PeerMesh::connect(const std::string& job, int rank, int size,
                                                      const net::SocketAddress& server,
                                                      Deadline deadline) {
  auto mesh = std::make_unique<PeerMesh>();
  mesh->rank_ = rank;
  mesh->size_ = size;
  mesh->peers_.resize(static_cast<size_t>(size));
  mesh->stash_.resize(static_cast<size_t>(size));

  const std::string at_server = "rendezvous server " + server.to_string();
  auto s = net::connect_to(server, deadline);
  if (!s) return Status::error(at_server + ": " + s.status().message());
  mesh->server_ = std::move(*s);
  // Listen on the interface that reaches the launcher: the peers are where it is.
  auto local = net::local_address(mesh->server_.get());
  if (!local) return local.status();
  local->set_port(0);
  net::SocketAddress listening;
  auto listener = net::listen_on(*local, false, &listening);
  if (!listener) return Status::error("listening for peers: " + listener.status().message());

  const std::string hello = mprun::format_hello({job, rank, size, listening});
  if (Status st = net::send_all(mesh->server_.get(), hello.data(), hello.size(), deadline); !st)
    return Status::error(at_server + ": sending HELLO: " + st.message());
  auto line = net::recv_line(mesh->server_.get(), mprun::kMaxLineSize, deadline);
  if (!line)
    return Status::error(at_server +
                         ": waiting for the other ranks to register: " + line.status().message());
  auto peers = mprun::parse_peers(*line, size);
  if (!peers) return Status::error(at_server + " refused this rank: " + peers.status().message());

  // Lower ranks are dialled; higher ranks dial us (the listener's backlog holds them meanwhile).
  const Handshake mine = make_handshake(job, rank, size);
  for (int p = 0; p < rank; ++p) {
    auto fd = net::connect_to((*peers)[static_cast<size_t>(p)], deadline);
    if (!fd)
      return Status::error("connecting to rank " + std::to_string(p) + ": " +
                           fd.status().message());
    if (Status st = net::send_all(fd->get(), &mine, sizeof(mine), deadline); !st)
      return Status::error("greeting rank " + std::to_string(p) + ": " + st.message());
    mesh->peers_[static_cast<size_t>(p)] = std::move(*fd);
  }
  if (Status st = mesh->accept_peers(job, listener->get(), size - 1 - rank, deadline); !st)
    return st;
  return mesh;
}

Status PeerMesh::accept_peers(const std::string& job, int listener, int count, Deadline deadline) {
  struct Pending {
    Fd fd;
    std::string from;
    Handshake theirs{};
    size_t got = 0;
    Clock::time_point since;
  };
  std::vector<Pending> pending;
  net::RefusalReport refusals("efccl mpishim: rank " + std::to_string(rank_) + ": peer listener");
  const auto say = [](const std::optional<std::string>& line) {
    if (line) std::fprintf(stderr, "%s\n", line->c_str());
  };
  const auto refuse = [&](Pending& p, const std::string& why) {
    say(refusals.refused(p.from, why));
    p.fd.reset();
  };
  /// Why a complete handshake does not come from an expected peer; empty when it does.
  const auto check = [&](Handshake& h) -> std::string {
    h.job[sizeof(h.job) - 1] = '\0';
    if (h.magic != kHandshakeMagic) return "not an MPI shim peer (wrong magic)";
    if (job != h.job) return "a peer of another job";
    if (h.size != size_) return "claims a job of " + std::to_string(h.size) + " ranks";
    if (h.rank <= rank_ || h.rank >= size_)
      return "claims rank " + std::to_string(h.rank) + ", which does not dial rank " +
             std::to_string(rank_);
    if (peers_[static_cast<size_t>(h.rank)].valid())
      return "claims rank " + std::to_string(h.rank) + ", which is connected already";
    return "";
  };
  Clock::time_point accept_paused_until{};
  std::vector<pollfd> fds;
  for (int accepted = 0; accepted < count;) {
    const Clock::time_point now = Clock::now();
    for (Pending& p : pending)
      if (now - p.since > kHandshakeTimeout)
        refuse(p, "no handshake within " + std::to_string(kHandshakeTimeout.count()) + " ms");
    std::erase_if(pending, [](const Pending& p) { return !p.fd.valid(); });
    say(refusals.flush(now));
    if (deadline.expired())
      return Status::error("timed out waiting for " + std::to_string(count - accepted) +
                           " higher rank(s) to connect" +
                           (refusals.total() == 0 ? std::string()
                                                  : " (" + std::to_string(refusals.total()) +
                                                        " other connection(s) refused)"));
    fds.clear();
    fds.push_back({now >= accept_paused_until ? listener : -1, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), deadline.poll_ms(100));
    if (ready < 0 && errno != EINTR) return Status::error("poll(): " + net::errno_text(errno));
    if (ready <= 0) continue;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      const ssize_t n = ::recv(p.fd.get(), reinterpret_cast<char*>(&p.theirs) + p.got,
                               sizeof(p.theirs) - p.got, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) {
        refuse(p, n == 0 ? "closed before its handshake" : net::errno_text(errno));
        continue;
      }
      p.got += static_cast<size_t>(n);
      if (p.got < sizeof(p.theirs)) continue;
      if (const std::string why = check(p.theirs); !why.empty()) {
        refuse(p, why);
        continue;
      }
      peers_[static_cast<size_t>(p.theirs.rank)] = std::move(p.fd);
      ++accepted;
      if (accepted == count) say(refusals.flush_final());
    }
    std::erase_if(pending, [](const Pending& p) { return !p.fd.valid(); });
    if ((fds[0].revents & POLLIN) != 0) {
      const Status st = net::accept_pending(listener, [&](Fd fd, const net::SocketAddress& from) {
        pending.push_back(Pending{std::move(fd), from.to_string(), {}, 0, Clock::now()});
      });
      if (!st) accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
      // The newest are kept: a peer sends its handshake as soon as it connected.
      while (pending.size() > kMaxPending) {
        refuse(pending.front(), "too many connections without a handshake");
        pending.erase(pending.begin());
      }
    }
  }
  return Status::ok();
}

Status PeerMesh::send(int peer, const Tag& tag, const void* data, size_t bytes, Deadline deadline) {
  const WireHeader h{kFrameMagic, tag.comm_id, tag.seq, bytes, static_cast<uint32_t>(tag.kind),
                     tag.arg0,    tag.arg1,    0};
  const int fd = peers_[static_cast<size_t>(peer)].get();
  const std::string to = "sending " + std::string(call_name(tag.kind)) + " data to rank " +
                         std::to_string(peer) + ": ";
  if (Status s = net::send_all(fd, &h, sizeof(h), deadline); !s)
    return Status::error(to + s.message());
  if (bytes > 0)
    if (Status s = net::send_all(fd, data, bytes, deadline); !s)
      return Status::error(to + s.message());
  return Status::ok();
}

StatusOr<std::vector<char>> PeerMesh::recv(int peer, const Tag& tag, Deadline deadline) {
  const std::string from =
      "waiting for rank " + std::to_string(peer) + " in " + call_name(tag.kind) + ": ";
  auto matches = [&](const Message& m) -> StatusOr<bool> {
    if (!m.tag.same_call(tag)) return false;
    if (m.tag.kind != tag.kind || m.tag.arg0 != tag.arg0 || m.tag.arg1 != tag.arg1)
      return Status::error("collective mismatch: rank " + std::to_string(peer) + " called " +
                           describe(m.tag) + " where this rank called " + describe(tag));
    return true;
  };
  auto& stash = stash_[static_cast<size_t>(peer)];
  for (auto it = stash.begin(); it != stash.end(); ++it) {
    auto m = matches(*it);
    if (!m) return m.status();
    if (*m) {
      std::vector<char> payload = std::move(it->payload);
      stashed_bytes_ -= payload.size();
      stash.erase(it);
      return payload;
    }
  }
  const int fd = peers_[static_cast<size_t>(peer)].get();
  for (;;) {
    WireHeader h{};
    if (Status s = net::recv_all(fd, &h, sizeof(h), deadline); !s)
      return Status::error(from + s.message());
    if (h.magic != kFrameMagic || h.bytes > kMaxMessageBytes)
      return Status::error(from + "received a corrupt message header");
    Message m{{h.comm_id, h.seq, static_cast<CallKind>(h.kind), h.arg0, h.arg1}, {}};
    m.payload.resize(h.bytes);
    if (h.bytes > 0)
      if (Status s = net::recv_all(fd, m.payload.data(), h.bytes, deadline); !s)
        return Status::error(from + s.message());
    auto match = matches(m);
    if (!match) return match.status();
    if (*match) return std::move(m.payload);
    stashed_bytes_ += m.payload.size();
    if (stashed_bytes_ > kMaxStashedBytes)
      return Status::error(from +
                           "more than 4 GiB of messages for other collectives arrived first");
    stash.push_back(std::move(m));
  }
}

void PeerMesh::send_abort(int errorcode) {
  const std::string line = mprun::format_abort(rank_, errorcode);
  (void)net::send_all(server_.get(), line.data(), line.size(),
                      Deadline::after(std::chrono::seconds(5)));
}

}  // namespace efccl::mpishim
