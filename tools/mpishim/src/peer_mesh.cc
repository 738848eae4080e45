#include "peer_mesh.h"

#include <mpi.h>

#include <cstring>

#include "efccl/mprun/rendezvous.h"

namespace efccl::mpishim {
namespace {

using mprun::Deadline;
using mprun::Fd;

constexpr uint64_t kFrameMagic = 0xefcc1a9171f3a9e1ull;
constexpr uint64_t kHandshakeMagic = 0xefcc1a9171f3a9e2ull;
constexpr uint64_t kMaxMessageBytes = 1ull << 36;  // a corrupt header is not an allocation
constexpr size_t kMaxStashedBytes = size_t{1} << 32;

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
                                                      const mprun::Address& server,
                                                      Deadline deadline) {
  auto mesh = std::make_unique<PeerMesh>();
  mesh->rank_ = rank;
  mesh->size_ = size;
  mesh->peers_.resize(static_cast<size_t>(size));
  mesh->stash_.resize(static_cast<size_t>(size));

  const std::string at_server = "rendezvous server " + server.to_string();
  auto s = mprun::connect_tcp(server, deadline);
  if (!s) return Status::error(at_server + ": " + s.status().message());
  mesh->server_ = std::move(*s);
  // Listen on the interface that reaches the launcher: the peers are where it is.
  auto local = mprun::local_address(mesh->server_.get());
  if (!local) return local.status();
  mprun::Address listening;
  auto listener = mprun::listen_tcp(local->host, 0, size + 8, &listening);
  if (!listener) return Status::error("listening for peers: " + listener.status().message());

  const std::string hello = mprun::format_hello({job, rank, size, listening});
  if (Status st = mprun::send_all(mesh->server_.get(), hello.data(), hello.size(), deadline); !st)
    return Status::error(at_server + ": sending HELLO: " + st.message());
  auto line = mprun::recv_line(mesh->server_.get(), mprun::kMaxLineSize, deadline);
  if (!line)
    return Status::error(at_server +
                         ": waiting for the other ranks to register: " + line.status().message());
  auto peers = mprun::parse_peers(*line, size);
  if (!peers) return Status::error(at_server + " refused this rank: " + peers.status().message());

  // Lower ranks are dialled; higher ranks dial us (the listener's backlog holds them meanwhile).
  const Handshake mine = make_handshake(job, rank, size);
  for (int p = 0; p < rank; ++p) {
    auto fd = mprun::connect_tcp((*peers)[static_cast<size_t>(p)], deadline);
    if (!fd)
      return Status::error("connecting to rank " + std::to_string(p) + ": " +
                           fd.status().message());
    if (Status st = mprun::send_all(fd->get(), &mine, sizeof(mine), deadline); !st)
      return Status::error("greeting rank " + std::to_string(p) + ": " + st.message());
    mesh->peers_[static_cast<size_t>(p)] = std::move(*fd);
  }
  for (int accepted = 0; accepted < size - 1 - rank; ++accepted) {
    auto fd = mprun::accept_tcp(listener->get(), deadline);
    if (!fd)
      return Status::error("waiting for " + std::to_string(size - 1 - rank - accepted) +
                           " higher rank(s) to connect: " + fd.status().message());
    Handshake theirs{};
    if (Status st = mprun::recv_all(fd->get(), &theirs, sizeof(theirs), deadline); !st)
      return Status::error("reading a peer's greeting: " + st.message());
    theirs.job[sizeof(theirs.job) - 1] = '\0';
    if (theirs.magic != kHandshakeMagic || theirs.size != size || job != theirs.job ||
        theirs.rank <= rank || theirs.rank >= size ||
        mesh->peers_[static_cast<size_t>(theirs.rank)].valid())
      return Status::error("a connection that is not an expected peer of this job (claims rank " +
                           std::to_string(theirs.rank) + " of " + std::to_string(theirs.size) +
                           ")");
    mesh->peers_[static_cast<size_t>(theirs.rank)] = std::move(*fd);
  }
  return mesh;
}

Status PeerMesh::send(int peer, const Tag& tag, const void* data, size_t bytes, Deadline deadline) {
  const WireHeader h{kFrameMagic, tag.comm_id, tag.seq, bytes, static_cast<uint32_t>(tag.kind),
                     tag.arg0,    tag.arg1,    0};
  const int fd = peers_[static_cast<size_t>(peer)].get();
  const std::string to = "sending " + std::string(call_name(tag.kind)) + " data to rank " +
                         std::to_string(peer) + ": ";
  if (Status s = mprun::send_all(fd, &h, sizeof(h), deadline); !s)
    return Status::error(to + s.message());
  if (bytes > 0)
    if (Status s = mprun::send_all(fd, data, bytes, deadline); !s)
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
    if (Status s = mprun::recv_all(fd, &h, sizeof(h), deadline); !s)
      return Status::error(from + s.message());
    if (h.magic != kFrameMagic || h.bytes > kMaxMessageBytes)
      return Status::error(from + "received a corrupt message header");
    Message m{{h.comm_id, h.seq, static_cast<CallKind>(h.kind), h.arg0, h.arg1}, {}};
    m.payload.resize(h.bytes);
    if (h.bytes > 0)
      if (Status s = mprun::recv_all(fd, m.payload.data(), h.bytes, deadline); !s)
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
  (void)mprun::send_all(server_.get(), line.data(), line.size(),
                        Deadline::after(std::chrono::seconds(5)));
}

}  // namespace efccl::mpishim
