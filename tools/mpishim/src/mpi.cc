// The MPI shim's entry points (include/mpi.h). Every collective of a communicator goes through
// one rank: contributions travel to the communicator's rank 0 (or to the root), which combines
// them in rank order and sends the result back, so every rank gets bit-identical results.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/deadline.h"
#include "efccl/net/socket_address.h"
#include "peer_mesh.h"

#define EFCCL_MPI_API extern "C" __attribute__((visibility("default")))

namespace {

using efccl::Status;
using efccl::mpishim::CallKind;
using efccl::mpishim::PeerMesh;
using efccl::mpishim::Tag;
using efccl::net::Deadline;

constexpr double kDefaultTimeoutSeconds = 300;

/// A communicator: its members' world ranks, in communicator rank order.
struct Communicator {
  uint64_t id = 0;  ///< the same on every member; world is 0
  int rank = 0;
  std::vector<int> world;
  uint64_t seq = 0;  ///< collectives called on it so far
  int size() const { return static_cast<int>(world.size()); }
};

struct Job {
  bool initialized = false;
  bool finalized = false;
  int world_rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{static_cast<long long>(kDefaultTimeoutSeconds * 1000)};
  std::unique_ptr<PeerMesh> mesh;  ///< null in a job of one rank
  std::map<MPI_Comm, Communicator> comms;
  MPI_Comm next_handle = MPI_COMM_WORLD + 1;
  uint64_t next_comm_serial = 0;
};

Job& job() {
  static Job j;
  return j;
}

/// MPI calls are serialized (nccl-tests makes them from whichever thread finishes last).
std::mutex& call_mutex() {
  static std::mutex m;
  return m;
}

[[noreturn]] void fatal(const char* function, const std::string& why) {
  std::fflush(stdout);
  std::fprintf(stderr, "efccl mpishim: rank %d: %s: %s\n", job().world_rank, function, why.c_str());
  std::fflush(nullptr);
  std::_Exit(1);
}

Deadline deadline() { return Deadline::after(job().timeout); }

/// A transport failure, with the limit when it was a timeout.
[[noreturn]] void peer_failure(const char* fn, const Status& s) {
  std::string why = s.message();
  if (why.find("timed out") != std::string::npos) {
    char limit[32];
    std::snprintf(limit, sizeof(limit), "%g", job().timeout.count() / 1000.0);
    why += std::string(" (after ") + limit + " s; EFCCL_MPISHIM_TIMEOUT sets the limit)";
  }
  fatal(fn, why);
}

void check_running(const char* fn) {
  if (!job().initialized) fatal(fn, "MPI_Init has not been called");
  if (job().finalized) fatal(fn, "called after MPI_Finalize");
}

Communicator& comm_of(const char* fn, MPI_Comm comm) {
  check_running(fn);
  auto it = job().comms.find(comm);
  if (it == job().comms.end())
    fatal(fn, "invalid communicator handle " + std::to_string(comm) +
                  (comm == MPI_COMM_NULL ? " (MPI_COMM_NULL)" : ""));
  return it->second;
}

size_t type_size(const char* fn, MPI_Datatype t) {
  switch (t) {
    case MPI_BYTE:
      return 1;
    case MPI_INT:
      return sizeof(int);
    case MPI_LONG:
      return sizeof(long);
    case MPI_LONG_LONG:
      return sizeof(long long);
    case MPI_INT64_T:
      return sizeof(int64_t);
    case MPI_DOUBLE:
      return sizeof(double);
    default:
      fatal(fn, "invalid datatype handle " + std::to_string(t) +
                    " (the shim has MPI_BYTE, MPI_INT, MPI_LONG, MPI_LONG_LONG, MPI_INT64_T, "
                    "MPI_DOUBLE)");
  }
}

/// count elements of t, in bytes.
size_t bytes_of(const char* fn, const char* what, int count, MPI_Datatype t) {
  if (count < 0) fatal(fn, std::string(what) + " count " + std::to_string(count) + " is negative");
  return static_cast<size_t>(count) * type_size(fn, t);
}

void check_root(const char* fn, const Communicator& c, int root) {
  if (root < 0 || root >= c.size())
    fatal(fn, "root " + std::to_string(root) + " is not a rank of the communicator (size " +
                  std::to_string(c.size()) + ")");
}

void check_buffer(const char* fn, const char* what, const void* p, size_t bytes) {
  if (p == nullptr && bytes > 0) fatal(fn, std::string(what) + " is NULL");
}

void send_to(const char* fn, const Communicator& c, int member, const Tag& tag, const void* data,
             size_t bytes) {
  if (Status s =
          job().mesh->send(c.world[static_cast<size_t>(member)], tag, data, bytes, deadline());
      !s)
    peer_failure(fn, s);
}

/// The message `tag` from communicator rank `member`, which must hold `expected` bytes.
std::vector<char> recv_from(const char* fn, const Communicator& c, int member, const Tag& tag,
                            size_t expected) {
  const int peer = c.world[static_cast<size_t>(member)];
  auto m = job().mesh->recv(peer, tag, deadline());
  if (!m) peer_failure(fn, m.status());
  if (m->size() != expected)
    fatal(fn, "rank " + std::to_string(peer) + " sent " + std::to_string(m->size()) +
                  " bytes where this rank expects " + std::to_string(expected) +
                  " (counts and datatypes must agree across ranks)");
  return std::move(*m);
}

Tag next_tag(Communicator& c, CallKind kind, int arg0 = 0, int arg1 = 0) {
  return Tag{c.id, ++c.seq, kind, arg0, arg1};
}

// ---- Reductions ----

template <typename T>
void reduce_into(char* acc, const char* in, size_t count, MPI_Op op) {
  for (size_t i = 0; i < count; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    if (op == MPI_SUM) {
      if constexpr (std::is_integral_v<T>)  // wraps like the hardware, without overflow UB
        a = static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) +
                           static_cast<std::make_unsigned_t<T>>(b));
      else
        a = a + b;
    } else if (op == MPI_MIN) {
      a = std::min(a, b);
    } else {
      a = std::max(a, b);
    }
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

void reduce_into(char* acc, const char* in, size_t count, MPI_Datatype t, MPI_Op op) {
  switch (t) {
    case MPI_INT:
      reduce_into<int>(acc, in, count, op);
      break;
    case MPI_LONG:
      reduce_into<long>(acc, in, count, op);
      break;
    case MPI_LONG_LONG:
      reduce_into<long long>(acc, in, count, op);
      break;
    case MPI_INT64_T:
      reduce_into<int64_t>(acc, in, count, op);
      break;
    case MPI_DOUBLE:
      reduce_into<double>(acc, in, count, op);
      break;
    default:
      break;  // checked before
  }
}

const char* op_name(MPI_Op op) {
  switch (op) {
    case MPI_SUM:
      return "MPI_SUM";
    case MPI_MIN:
      return "MPI_MIN";
    case MPI_MAX:
      return "MPI_MAX";
    default:
      return nullptr;
  }
}

// ---- Collectives (the caller holds call_mutex) ----

/// Every member reaches it before any leaves.
void barrier(const char* fn, Communicator& c, CallKind kind) {
  const Tag tag = next_tag(c, kind);
  if (c.size() == 1) return;
  if (c.rank == 0) {
    for (int m = 1; m < c.size(); ++m) recv_from(fn, c, m, tag, 0);
    for (int m = 1; m < c.size(); ++m) send_to(fn, c, m, tag, nullptr, 0);
  } else {
    send_to(fn, c, 0, tag, nullptr, 0);
    recv_from(fn, c, 0, tag, 0);
  }
}

double parse_timeout() {
  const char* text = std::getenv("EFCCL_MPISHIM_TIMEOUT");
  if (text == nullptr || text[0] == '\0') return kDefaultTimeoutSeconds;
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v > 0) || v > 1e7)
    fatal("MPI_Init",
          std::string("EFCCL_MPISHIM_TIMEOUT='") + text + "' is not a number of seconds > 0");
  return v;
}

int parse_env_int(const char* name, int lo, int hi) {
  const char* text = std::getenv(name);
  char* end = nullptr;
  const long v = text != nullptr ? std::strtol(text, &end, 10) : 0;
  if (text == nullptr || end == text || *end != '\0' || v < lo || v > hi)
    fatal("MPI_Init", std::string(name) + "='" + (text != nullptr ? text : "(unset)") +
                          "' is not an integer in " + std::to_string(lo) + ".." +
                          std::to_string(hi));
  return static_cast<int>(v);
}

}  // namespace

EFCCL_MPI_API int MPI_Init(int* /*argc*/, char*** /*argv*/) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Init";
  Job& j = job();
  if (j.initialized) fatal(fn, "MPI_Init was called already");
  j.timeout = std::chrono::milliseconds(static_cast<long long>(parse_timeout() * 1000));
  if (std::getenv(efccl::mprun::kEnvSize) != nullptr) {
    j.world_size = parse_env_int(efccl::mprun::kEnvSize, 1, efccl::mprun::kMaxRanks);
    j.world_rank = parse_env_int(efccl::mprun::kEnvRank, 0, j.world_size - 1);
  }  // else: not started by efccl-mprun, a job of one rank
  if (j.world_size > 1) {
    const char* addr = std::getenv(efccl::mprun::kEnvAddr);
    const char* key = std::getenv(efccl::mprun::kEnvJob);
    if (addr == nullptr || key == nullptr)
      fatal(fn, std::string(efccl::mprun::kEnvAddr) + " and " + efccl::mprun::kEnvJob +
                    " must be set when " + efccl::mprun::kEnvSize +
                    " > 1 (start the job with efccl-mprun)");
    auto server = efccl::net::SocketAddress::parse(addr, AF_UNSPEC,
                                                   efccl::net::SocketAddress::Lookup::kNumericOnly);
    if (!server) fatal(fn, std::string(efccl::mprun::kEnvAddr) + ": " + server.status().message());
    auto mesh = PeerMesh::connect(key, j.world_rank, j.world_size, *server, deadline());
    if (!mesh) peer_failure(fn, mesh.status());
    j.mesh = std::move(*mesh);
  }
  Communicator world;
  world.id = 0;
  world.rank = j.world_rank;
  for (int r = 0; r < j.world_size; ++r) world.world.push_back(r);
  j.comms.emplace(MPI_COMM_WORLD, std::move(world));
  j.initialized = true;
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Finalize(void) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Finalize";
  barrier(fn, comm_of(fn, MPI_COMM_WORLD), CallKind::kFinalize);
  job().mesh.reset();
  job().comms.clear();
  job().finalized = true;
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Abort(MPI_Comm /*comm*/, int errorcode) {
  // No lock: another thread may be blocked in a call; abort must not wait for it.
  std::fflush(stdout);
  std::fprintf(stderr, "efccl mpishim: rank %d: MPI_Abort(errorcode %d): stopping the job\n",
               job().world_rank, errorcode);
  if (job().mesh) job().mesh->send_abort(errorcode);
  std::fflush(nullptr);
  std::_Exit(errorcode > 0 && errorcode < 256 ? errorcode : 1);
}

EFCCL_MPI_API int MPI_Comm_rank(MPI_Comm comm, int* rank) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const Communicator& c = comm_of("MPI_Comm_rank", comm);
  if (rank == nullptr) fatal("MPI_Comm_rank", "rank is NULL");
  *rank = c.rank;
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Comm_size(MPI_Comm comm, int* size) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const Communicator& c = comm_of("MPI_Comm_size", comm);
  if (size == nullptr) fatal("MPI_Comm_size", "size is NULL");
  *size = c.size();
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Comm_split";
  Communicator& c = comm_of(fn, comm);
  if (newcomm == nullptr) fatal(fn, "newcomm is NULL");
  if (color < 0)
    fatal(fn, "color " + std::to_string(color) +
                  " is negative (the shim has no MPI_UNDEFINED: every rank joins a communicator)");
  const Tag tag = next_tag(c, CallKind::kCommSplit);
  const int32_t mine[2] = {color, key};

  // Rank 0 of `c` forms the groups and tells each member its communicator: id, rank, size,
  // then the members' world ranks.
  std::vector<int64_t> reply;
  if (c.rank == 0) {
    struct Member {
      int color, key, rank;
    };
    std::vector<Member> members{{color, key, 0}};
    for (int m = 1; m < c.size(); ++m) {
      const auto in = recv_from(fn, c, m, tag, sizeof(mine));
      int32_t theirs[2];
      std::memcpy(theirs, in.data(), sizeof(theirs));
      if (theirs[0] < 0) fatal(fn, "rank " + std::to_string(c.world[m]) + " gave a negative color");
      members.push_back({theirs[0], theirs[1], m});
    }
    std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
      return a.color != b.color ? a.color < b.color
             : a.key != b.key   ? a.key < b.key
                                : a.rank < b.rank;
    });
    for (size_t first = 0; first < members.size();) {
      size_t last = first;
      while (last < members.size() && members[last].color == members[first].color) ++last;
      // Ids are unique in the job: this rank's world rank, then its own counter.
      const uint64_t id =
          (static_cast<uint64_t>(job().world_rank + 1) << 32) | ++job().next_comm_serial;
      std::vector<int64_t> message{static_cast<int64_t>(id), 0, static_cast<int64_t>(last - first)};
      for (size_t i = first; i < last; ++i)
        message.push_back(c.world[static_cast<size_t>(members[i].rank)]);
      for (size_t i = first; i < last; ++i) {
        message[1] = static_cast<int64_t>(i - first);
        if (members[i].rank == 0)
          reply = message;
        else
          send_to(fn, c, members[i].rank, tag, message.data(), message.size() * sizeof(int64_t));
      }
      first = last;
    }
  } else {
    send_to(fn, c, 0, tag, mine, sizeof(mine));
    auto m = job().mesh->recv(c.world[0], tag, deadline());
    if (!m) peer_failure(fn, m.status());
    reply.resize(m->size() / sizeof(int64_t));
    std::memcpy(reply.data(), m->data(), reply.size() * sizeof(int64_t));
    if (reply.size() < 3 || m->size() % sizeof(int64_t) != 0 ||
        reply[2] != static_cast<int64_t>(reply.size()) - 3)
      fatal(fn, "malformed reply from rank " + std::to_string(c.world[0]));
  }
  Communicator made;
  made.id = static_cast<uint64_t>(reply[0]);
  made.rank = static_cast<int>(reply[1]);
  for (size_t i = 3; i < reply.size(); ++i) made.world.push_back(static_cast<int>(reply[i]));
  const MPI_Comm handle = job().next_handle++;
  job().comms.emplace(handle, std::move(made));
  *newcomm = handle;
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Comm_free(MPI_Comm* comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Comm_free";
  if (comm == nullptr) fatal(fn, "comm is NULL");
  comm_of(fn, *comm);
  if (*comm == MPI_COMM_WORLD) fatal(fn, "MPI_COMM_WORLD cannot be freed");
  job().comms.erase(*comm);
  *comm = MPI_COMM_NULL;
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Barrier(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  barrier("MPI_Barrier", comm_of("MPI_Barrier", comm), CallKind::kBarrier);
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root,
                            MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Bcast";
  Communicator& c = comm_of(fn, comm);
  const size_t bytes = bytes_of(fn, "", count, datatype);
  check_root(fn, c, root);
  check_buffer(fn, "buffer", buffer, bytes);
  const Tag tag = next_tag(c, CallKind::kBcast, root, datatype);
  if (c.rank == root) {
    for (int m = 0; m < c.size(); ++m)
      if (m != root) send_to(fn, c, m, tag, buffer, bytes);
  } else {
    const auto in = recv_from(fn, c, root, tag, bytes);
    if (bytes > 0) std::memcpy(buffer, in.data(), bytes);
  }
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                             void* recvbuf, int recvcount, MPI_Datatype recvtype, int root,
                             MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Gather";
  Communicator& c = comm_of(fn, comm);
  check_root(fn, c, root);
  const bool in_place = sendbuf == MPI_IN_PLACE;
  if (in_place && c.rank != root) fatal(fn, "MPI_IN_PLACE is only valid at the root");
  const size_t send_bytes = in_place ? 0 : bytes_of(fn, "send", sendcount, sendtype);
  if (!in_place) check_buffer(fn, "sendbuf", sendbuf, send_bytes);
  const Tag tag = next_tag(c, CallKind::kGather, root);
  if (c.rank != root) {
    send_to(fn, c, root, tag, sendbuf, send_bytes);
    return MPI_SUCCESS;
  }
  const size_t block = bytes_of(fn, "receive", recvcount, recvtype);
  check_buffer(fn, "recvbuf", recvbuf, block * c.size());
  char* out = static_cast<char*>(recvbuf);
  if (!in_place) {
    if (send_bytes != block)
      fatal(fn, "the root sends " + std::to_string(send_bytes) + " bytes but receives blocks of " +
                    std::to_string(block));
    if (block > 0) std::memmove(out + static_cast<size_t>(root) * block, sendbuf, block);
  }
  for (int m = 0; m < c.size(); ++m) {
    if (m == root) continue;
    const auto in = recv_from(fn, c, m, tag, block);
    if (block > 0) std::memcpy(out + static_cast<size_t>(m) * block, in.data(), block);
  }
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                                void* recvbuf, int recvcount, MPI_Datatype recvtype,
                                MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Allgather";
  Communicator& c = comm_of(fn, comm);
  const size_t block = bytes_of(fn, "receive", recvcount, recvtype);
  const size_t total = block * static_cast<size_t>(c.size());
  check_buffer(fn, "recvbuf", recvbuf, total);
  char* out = static_cast<char*>(recvbuf);
  const char* mine = out + static_cast<size_t>(c.rank) * block;
  if (sendbuf != MPI_IN_PLACE) {
    const size_t send_bytes = bytes_of(fn, "send", sendcount, sendtype);
    if (send_bytes != block)
      fatal(fn, "this rank sends " + std::to_string(send_bytes) + " bytes but receives blocks of " +
                    std::to_string(block));
    check_buffer(fn, "sendbuf", sendbuf, block);
    mine = static_cast<const char*>(sendbuf);
  }
  const Tag tag = next_tag(c, CallKind::kAllgather);
  if (c.rank == 0) {
    if (block > 0 && mine != out) std::memmove(out, mine, block);
    for (int m = 1; m < c.size(); ++m) {
      const auto in = recv_from(fn, c, m, tag, block);
      if (block > 0) std::memcpy(out + static_cast<size_t>(m) * block, in.data(), block);
    }
    for (int m = 1; m < c.size(); ++m) send_to(fn, c, m, tag, out, total);
  } else {
    send_to(fn, c, 0, tag, mine, block);
    const auto in = recv_from(fn, c, 0, tag, total);
    if (total > 0) std::memcpy(out, in.data(), total);
  }
  return MPI_SUCCESS;
}

EFCCL_MPI_API int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count,
                                MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(call_mutex());
  const char* fn = "MPI_Allreduce";
  Communicator& c = comm_of(fn, comm);
  const size_t bytes = bytes_of(fn, "", count, datatype);
  if (op_name(op) == nullptr)
    fatal(fn,
          "invalid op handle " + std::to_string(op) + " (the shim has MPI_SUM, MPI_MIN, MPI_MAX)");
  if (datatype == MPI_BYTE) fatal(fn, std::string(op_name(op)) + " is not defined on MPI_BYTE");
  check_buffer(fn, "recvbuf", recvbuf, bytes);
  const char* mine = sendbuf == MPI_IN_PLACE ? static_cast<const char*>(recvbuf)
                                             : static_cast<const char*>(sendbuf);
  check_buffer(fn, "sendbuf", mine, bytes);
  const Tag tag = next_tag(c, CallKind::kAllreduce, datatype, op);
  std::vector<char> acc(mine, mine + bytes);
  if (c.rank == 0) {
    for (int m = 1; m < c.size(); ++m) {
      const auto in = recv_from(fn, c, m, tag, bytes);
      reduce_into(acc.data(), in.data(), static_cast<size_t>(count), datatype, op);
    }
    for (int m = 1; m < c.size(); ++m) send_to(fn, c, m, tag, acc.data(), bytes);
  } else {
    send_to(fn, c, 0, tag, mine, bytes);
    acc = recv_from(fn, c, 0, tag, bytes);
  }
  if (bytes > 0) std::memcpy(recvbuf, acc.data(), bytes);
  return MPI_SUCCESS;
}
