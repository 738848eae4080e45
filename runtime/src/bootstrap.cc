#include "bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <utility>

#include "efccl/common/hash.h"
#include "efccl/common/log.h"

namespace efccl::runtime {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- Constants of the id and the wire format ----

constexpr uint32_t kIdFormat = 0x31424645;  // "EFB1": an id made by create_unique_id
constexpr uint32_t kIdRootByRank0 = 1;      // NCCL_COMM_ID: rank 0's start() runs the root
/// NCCL_COMM_ID ids are made independently by every process, so their magic cannot be random.
constexpr uint64_t kCommIdMagic = 0x4449'5f4d'4d4f'4345ull;
constexpr uint32_t kProtocolVersion = 1;

constexpr milliseconds kPollSlice{10};               // abort flags are checked this often
constexpr milliseconds kStrangerTimeout{10000};      // an unauthenticated connection may idle
constexpr std::size_t kMaxStrangers = 128;           // unauthenticated connections kept at once
constexpr milliseconds kCountInterval{50};           // root: progress reports at most this often
constexpr std::chrono::seconds kFailedRootLife{30};  // root: answers late joiners after failing
constexpr std::chrono::seconds kFlushLimit{60};      // root: time to deliver the table
constexpr milliseconds kGoodbyeLimit{1000};          // close(): wait for peers to acknowledge
constexpr std::size_t kReadChunk = std::size_t{64} << 10;  // bytes read from a socket at once

enum FrameType : uint32_t {
  kRootHello = 1,  // rank -> root: who I am
  kRootCount,      // root -> rank: how many ranks joined so far
  kRootError,      // root -> rank: the rendezvous failed (text)
  kRootTable,      // root -> rank: every rank's address and info
  kPeerHello,      // first frame of a rank-to-rank connection
  kData,           // a message
  kGoodbye,        // the sender closes its bootstrap: not a failure
};

/// Every frame starts with this; `length` payload bytes follow.
struct FrameHeader {
  uint64_t magic = 0;
  uint64_t space = 0;
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t type = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(FrameHeader) == 40);

union SockAddr {
  sockaddr sa;
  sockaddr_in v4;
  sockaddr_in6 v6;
};
static_assert(sizeof(SockAddr) == 28);

constexpr std::size_t kHelloFixed = 16 + sizeof(SockAddr);  // version nranks rank 0 addr
constexpr std::size_t kPeerHelloBytes = 12;                 // nranks from to

// Id layout: magic, format, flags, root address.
constexpr std::size_t kIdMagicAt = 0, kIdFormatAt = 8, kIdFlagsAt = 12, kIdAddrAt = 16;
static_assert(kIdAddrAt + sizeof(SockAddr) <= NCCL_UNIQUE_ID_BYTES);

// ---- Small helpers ----

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
uint32_t get_u32(std::string_view s, std::size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

std::string errno_text(int e) { return std::strerror(e); }

std::string hex(uint64_t v) {
  std::ostringstream m;
  m << "0x" << std::hex << v;
  return m.str();
}

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<milliseconds>(to - from).count();
}

bool aborted(const std::atomic<bool>* abort) {
  return abort != nullptr && abort->load(std::memory_order_acquire);
}

/// Takes `lock` unless `deadline` passes or `*abort` is set first. Polls (contention is rare:
/// one writer per connection); std::timed_mutex would do, but TSan cannot see its locks.
bool lock_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                const std::atomic<bool>* abort) {
  while (!lock.try_lock()) {
    if (aborted(abort) || Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

/// The earlier of `deadline` and one poll slice from now.
Clock::time_point slice_end(Clock::time_point deadline) {
  return std::min(deadline, Clock::now() + kPollSlice);
}

int poll_timeout_ms(Clock::time_point until) {
  const long long ms = ms_between(Clock::now(), until);
  return static_cast<int>(std::clamp<long long>(ms + 1, 0, kPollSlice.count()));
}

// ---- Descriptors, and fork() ----

// A process forked from one with bootstraps (e.g. PyTorch DataLoader workers) inherits their
// sockets; were it to keep them, a peer could not see this process die (no EOF while the child
// lives) and would connect to a listener nobody serves. So the child replaces every bootstrap
// descriptor with /dev/null (pthread_atfork; a lock-free table, as any thread may hold locks at
// fork time). Slots hold fd + 1; 0 is free.
constexpr int kTrackedFds = 4096;
std::atomic<int> g_tracked_fds[kTrackedFds];

void release_fds_in_child() {
  const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (auto& slot : g_tracked_fds) {
    const int v = slot.load(std::memory_order_relaxed);
    if (v <= 0) continue;
    if (devnull >= 0)
      ::dup2(devnull, v - 1);  // keeps the number taken: a stale close() later stays harmless
    slot.store(0, std::memory_order_relaxed);
  }
  if (devnull >= 0) ::close(devnull);
}

void track_fd(int fd) {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, release_fds_in_child); });
  for (auto& slot : g_tracked_fds) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, fd + 1)) return;
  }  // table full: this descriptor is simply not released in forked children
}

void untrack_fd(int fd) {
  for (auto& slot : g_tracked_fds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

/// An owned file descriptor (tracked for fork(), above).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {
    if (fd_ >= 0) track_fd(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (fd_ >= 0) {
      untrack_fd(fd_);
      ::close(fd_);
    }
    fd_ = std::exchange(o.fd_, -1);  // already tracked
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      untrack_fd(fd_);
      ::close(fd_);
    }
    fd_ = fd;
    if (fd_ >= 0) track_fd(fd_);
  }

 private:
  int fd_ = -1;
};

// ---- Addresses ----

socklen_t addr_len(const SockAddr& a) {
  return a.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

bool addr_family_ok(const SockAddr& a) {
  return a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6;
}

void set_port(SockAddr& a, uint16_t port) {
  if (a.sa.sa_family == AF_INET6)
    a.v6.sin6_port = htons(port);
  else
    a.v4.sin_port = htons(port);
}

std::string addr_to_string(const SockAddr& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a.v4.sin_addr, buf, sizeof(buf));
    return std::string(buf) + ":" + std::to_string(ntohs(a.v4.sin_port));
  }
  if (a.sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a.v6.sin6_addr, buf, sizeof(buf));
    std::string host = buf;
    char ifname[IF_NAMESIZE] = {};
    if (a.v6.sin6_scope_id != 0 && if_indextoname(a.v6.sin6_scope_id, ifname) != nullptr)
      host += std::string("%") + ifname;
    return "[" + host + "]:" + std::to_string(ntohs(a.v6.sin6_port));
  }
  return "<address of family " + std::to_string(a.sa.sa_family) + ">";
}

/// NCCL_SOCKET_FAMILY: AF_INET, AF_INET6 (also ipv4/ipv6); anything else: either family.
int socket_family_from_env() {
  const char* env = std::getenv("NCCL_SOCKET_FAMILY");
  if (env == nullptr || *env == '\0') return AF_UNSPEC;
  std::string v(env);
  for (char& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (v == "AF_INET" || v == "IPV4") return AF_INET;
  if (v == "AF_INET6" || v == "IPV6") return AF_INET6;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    EFCCL_WARN(-1, std::string("NCCL_SOCKET_FAMILY=") + env +
                       " is neither AF_INET nor AF_INET6; using either family");
  });
  return AF_UNSPEC;
}

/// "host:port", "ipv4:port", "[ipv6]:port" (a bare IPv6 address: the last colon starts the port).
StatusOr<SockAddr> parse_address(std::string_view text, int family) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos)
      return Status::error("'" + std::string(text) + "': '[' without ']'");
    host = std::string(text.substr(1, close - 1));
    const std::string_view rest = text.substr(close + 1);
    if (rest.size() < 2 || rest.front() != ':')
      return Status::error("'" + std::string(text) + "' has no ':port' after the address");
    port = std::string(rest.substr(1));
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
      return Status::error("'" + std::string(text) +
                           "' is not host:port, ipv4:port or [ipv6]:port");
    host = std::string(text.substr(0, colon));
    port = std::string(text.substr(colon + 1));
  }
  unsigned long number = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || number > 65535) {
      number = 0;
      break;
    }
    number = number * 10 + static_cast<unsigned long>(c - '0');
  }
  if (number == 0 || number > 65535)
    return Status::error("'" + std::string(text) + "': port '" + port +
                         "' is not a number from 1 to 65535");
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return Status::error("'" + std::string(text) + "': cannot resolve '" + host +
                         "': " + gai_strerror(rc));
  SockAddr a{};
  for (addrinfo* i = found; i != nullptr; i = i->ai_next) {
    if ((i->ai_family == AF_INET || i->ai_family == AF_INET6) &&
        i->ai_addrlen <= sizeof(SockAddr)) {
      std::memcpy(&a, i->ai_addr, i->ai_addrlen);
      break;
    }
  }
  freeaddrinfo(found);
  if (!addr_family_ok(a))
    return Status::error("'" + std::string(text) + "': '" + host + "' has no IP address");
  set_port(a, static_cast<uint16_t>(number));
  return a;
}

// ---- Interfaces ----

struct Interface {
  std::string name;
  SockAddr addr{};
  SockAddr mask{};
  unsigned flags = 0;
  bool link_local() const {
    return addr.sa.sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&addr.v6.sin6_addr);
  }
  std::string describe() const {
    SockAddr a = addr;
    set_port(a, 0);
    std::string s = addr_to_string(a);
    return name + " " + s.substr(0, s.rfind(':'));
  }
};

/// The addresses of interfaces that are up, IPv4 before IPv6, link-local IPv6 last.
std::vector<Interface> list_interfaces(int family) {
  std::vector<Interface> out;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const int f = i->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    if (family != AF_UNSPEC && f != family) continue;
    Interface it;
    it.name = i->ifa_name;
    it.flags = i->ifa_flags;
    std::memcpy(&it.addr, i->ifa_addr, f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (i->ifa_netmask != nullptr)
      std::memcpy(&it.mask, i->ifa_netmask,
                  f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    out.push_back(it);
  }
  freeifaddrs(all);
  std::stable_sort(out.begin(), out.end(), [](const Interface& a, const Interface& b) {
    const auto key = [](const Interface& x) {
      return std::make_pair(x.addr.sa.sa_family == AF_INET6, x.link_local());
    };
    return key(a) < key(b);
  });
  return out;
}

bool in_subnet(const Interface& i, const SockAddr& a) {
  if (i.addr.sa.sa_family != a.sa.sa_family) return false;
  if (a.sa.sa_family == AF_INET) {
    const uint32_t m = i.mask.v4.sin_addr.s_addr;
    return (i.addr.v4.sin_addr.s_addr & m) == (a.v4.sin_addr.s_addr & m);
  }
  const auto* x = i.addr.v6.sin6_addr.s6_addr;
  const auto* y = a.v6.sin6_addr.s6_addr;
  const auto* m = i.mask.v6.sin6_addr.s6_addr;
  for (int b = 0; b < 16; ++b)
    if ((x[b] & m[b]) != (y[b] & m[b])) return false;
  return true;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

/// The interface whose address the ranks use: NCCL_SOCKET_IFNAME's (else NCCL's default order:
/// not loopback nor docker/virbr, then docker/virbr, then loopback), preferring one on the
/// subnet of `near` (the root) when given.
StatusOr<Interface> choose_interface(const SockAddr* near) {
  const int family = socket_family_from_env();
  std::vector<Interface> all = list_interfaces(family);
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  std::vector<Interface> candidates;
  for (const Interface& i : all)
    if (spec == nullptr || *spec == '\0' || interface_matches(spec, i.name))
      candidates.push_back(i);
  if (candidates.empty()) {
    std::string seen;
    for (const Interface& i : all) seen += (seen.empty() ? "" : ", ") + i.describe();
    const std::string fam = family == AF_INET ? " IPv4" : family == AF_INET6 ? " IPv6" : "";
    if (spec != nullptr && *spec != '\0')
      return Status::error(std::string("NCCL_SOCKET_IFNAME=") + spec +
                           " selects no network interface that is up with an" + fam +
                           " address (up: " + (seen.empty() ? "none" : seen) + ")");
    return Status::error("no network interface is up with an" + fam + " address");
  }
  if (near != nullptr)
    for (const Interface& i : candidates)
      if (in_subnet(i, *near)) return i;
  if (spec != nullptr && *spec != '\0') return candidates.front();
  const auto virtual_bridge = [](const Interface& i) {
    return starts_with(i.name, "docker") || starts_with(i.name, "virbr");
  };
  for (const Interface& i : candidates)
    if ((i.flags & IFF_LOOPBACK) == 0 && !virtual_bridge(i)) return i;
  for (const Interface& i : candidates)
    if ((i.flags & IFF_LOOPBACK) == 0) return i;
  return candidates.front();
}

// ---- Sockets ----

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// A non-blocking listening socket on `addr` (port 0: any), and the address it got.
StatusOr<std::pair<Fd, SockAddr>> listen_on(const SockAddr& addr, bool reuse_address) {
  Fd fd(::socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::error("socket(): " + errno_text(errno));
  int one = 1;
  if (reuse_address) setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), &addr.sa, addr_len(addr)) != 0)
    return Status::error("cannot listen on " + addr_to_string(addr) + ": " + errno_text(errno));
  if (::listen(fd.get(), SOMAXCONN) != 0)
    return Status::error("listen() on " + addr_to_string(addr) + ": " + errno_text(errno));
  SockAddr bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd.get(), &bound.sa, &len) != 0)
    return Status::error("getsockname(): " + errno_text(errno));
  return std::make_pair(std::move(fd), bound);
}

/// Starts a non-blocking connect; errno-style failure in *error (0: in progress or done).
Fd start_connect(const SockAddr& addr, int* error) {
  Fd fd(::socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    *error = errno;
    return fd;
  }
  *error = 0;
  if (::connect(fd.get(), &addr.sa, addr_len(addr)) != 0 && errno != EINPROGRESS) {
    *error = errno;
    fd.reset();
  }
  return fd;
}

int socket_error(int fd) {
  int e = 0;
  socklen_t len = sizeof(e);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) return errno;
  return e;
}

void wake(int event_fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd, &one, sizeof(one));
}

void drain_wake(int event_fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(event_fd, &v, sizeof(v));
}

std::string frame_bytes(uint64_t magic, uint32_t type, uint64_t space, uint64_t tag,
                        std::string_view payload) {
  FrameHeader h;
  h.magic = magic;
  h.type = type;
  h.space = space;
  h.tag = tag;
  h.length = payload.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(payload);
  return out;
}

/// Writes `header` then `payload` on a non-blocking socket, waiting (poll) until `deadline` or
/// `*abort`. `*written`: bytes handed to the kernel (to tell a cut frame from an unsent one).
Status write_frame(int fd, const FrameHeader& header, std::string_view payload,
                   Clock::time_point deadline, const std::atomic<bool>* abort,
                   std::size_t* written) {
  const std::size_t total = sizeof(header) + payload.size();
  *written = 0;
  while (*written < total) {
    iovec iov[2];
    int n = 0;
    if (*written < sizeof(header)) {
      iov[n++] = {const_cast<char*>(reinterpret_cast<const char*>(&header)) + *written,
                  sizeof(header) - *written};
      iov[n++] = {const_cast<char*>(payload.data()), payload.size()};
    } else {
      const std::size_t at = *written - sizeof(header);
      iov[n++] = {const_cast<char*>(payload.data()) + at, payload.size() - at};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      *written += static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::error(errno_text(errno));
    if (aborted(abort)) return Status::error("aborted");
    if (Clock::now() >= deadline) return Status::error("timed out");
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, poll_timeout_ms(slice_end(deadline)));
  }
  return Status::ok();
}

// ---- Reading frames ----

enum class ReadResult { kAgain, kEof, kError, kBad, kStop };

/// Incremental frame parser for one connection.
struct FrameReader {
  char header_bytes[sizeof(FrameHeader)] = {};
  std::size_t header_got = 0;
  FrameHeader header;
  std::string payload;
  std::size_t payload_got = 0;
};

/// Reads what is available (at most `budget` bytes) from non-blocking `fd`, calling
/// `check(header, &why)` on every header (false: kBad) and `on_frame(header, payload)` on every
/// complete frame (false: kStop). A wrong magic is detected as soon as 8 bytes arrived.
template <typename Check, typename OnFrame>
ReadResult read_frames(int fd, FrameReader& r, uint64_t magic, std::vector<char>& buffer,
                       std::size_t budget, std::string* why, Check check, OnFrame on_frame) {
  std::size_t consumed = 0;
  while (consumed < budget) {
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n == 0) return ReadResult::kEof;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ReadResult::kAgain;
      *why = errno_text(errno);
      return ReadResult::kError;
    }
    consumed += static_cast<std::size_t>(n);
    std::size_t at = 0;
    const auto size = static_cast<std::size_t>(n);
    while (at < size) {
      if (r.header_got < sizeof(FrameHeader)) {
        const std::size_t take = std::min(sizeof(FrameHeader) - r.header_got, size - at);
        const bool had_magic = r.header_got >= sizeof(uint64_t);
        std::memcpy(r.header_bytes + r.header_got, buffer.data() + at, take);
        r.header_got += take;
        at += take;
        if (!had_magic && r.header_got >= sizeof(uint64_t)) {
          uint64_t m;
          std::memcpy(&m, r.header_bytes, sizeof(m));
          if (m != magic) {
            *why = "wrong magic " + hex(m);
            return ReadResult::kBad;
          }
        }
        if (r.header_got < sizeof(FrameHeader)) continue;
        std::memcpy(&r.header, r.header_bytes, sizeof(FrameHeader));
        if (!check(r.header, why)) return ReadResult::kBad;
        r.payload.assign(static_cast<std::size_t>(r.header.length), '\0');
        r.payload_got = 0;
      } else {
        const std::size_t take = std::min(r.payload.size() - r.payload_got, size - at);
        std::memcpy(r.payload.data() + r.payload_got, buffer.data() + at, take);
        r.payload_got += take;
        at += take;
      }
      if (r.header_got == sizeof(FrameHeader) && r.payload_got == r.payload.size()) {
        r.header_got = 0;
        std::string payload = std::move(r.payload);
        r.payload.clear();
        if (!on_frame(r.header, std::move(payload))) return ReadResult::kStop;
      }
    }
  }
  return ReadResult::kAgain;
}

// ---- Id ----

struct DecodedId {
  uint64_t magic = 0;
  uint32_t format = 0;
  uint32_t flags = 0;
  SockAddr root{};
};

DecodedId decode_id(const ncclUniqueId& id) {
  DecodedId d;
  std::memcpy(&d.magic, id.internal + kIdMagicAt, 8);
  std::memcpy(&d.format, id.internal + kIdFormatAt, 4);
  std::memcpy(&d.flags, id.internal + kIdFlagsAt, 4);
  std::memcpy(&d.root, id.internal + kIdAddrAt, sizeof(SockAddr));
  return d;
}

void encode_id(const DecodedId& d, ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal + kIdMagicAt, &d.magic, 8);
  std::memcpy(id->internal + kIdFormatAt, &d.format, 4);
  std::memcpy(id->internal + kIdFlagsAt, &d.flags, 4);
  std::memcpy(id->internal + kIdAddrAt, &d.root, sizeof(SockAddr));
}

Status random_magic(uint64_t* out) {
  for (;;) {
    std::size_t got = 0;
    while (got < sizeof(*out)) {
      const ssize_t n = getrandom(reinterpret_cast<char*>(out) + got, sizeof(*out) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    if (got < sizeof(*out)) {
      std::ifstream urandom("/dev/urandom", std::ios::binary);
      if (!urandom.read(reinterpret_cast<char*>(out), sizeof(*out)))
        return Status::error("cannot read random bytes (getrandom and /dev/urandom failed)");
    }
    if (*out != 0 && *out != kCommIdMagic) return Status::ok();
  }
}

}  // namespace

// ---- The root ----

/// The rendezvous server of one unique id: collects every rank's hello, checks them, and sends
/// each rank the table once all nranks joined. Runs on a detached thread that owns it.
class BootstrapRoot : public std::enable_shared_from_this<BootstrapRoot> {
 public:
  static StatusOr<std::shared_ptr<BootstrapRoot>> launch(uint64_t magic, const SockAddr& addr,
                                                         bool reuse_address) {
    auto listener = listen_on(addr, reuse_address);
    if (!listener) return listener.status();
    auto root = std::shared_ptr<BootstrapRoot>(new BootstrapRoot(magic));
    root->listen_ = std::move(listener->first);
    root->addr_ = listener->second;
    root->name_ = addr_to_string(root->addr_);
    root->wake_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!root->wake_.valid()) return Status::error("eventfd(): " + errno_text(errno));
    std::thread([root] { root->run(); }).detach();
    return root;
  }

  SockAddr address() const { return addr_; }

  /// Stops the root unless its rendezvous completed (then it finishes delivering the table).
  void abandon() {
    stop_.store(true);
    wake(wake_.get());
  }

 private:
  struct Conn {
    Fd fd;
    std::string from;
    FrameReader reader;
    int rank = -1;
    std::deque<std::shared_ptr<const std::string>> out;
    std::size_t out_at = 0;
    bool closing = false;   // close once `out` is written
    bool draining = false;  // written and shut down: waiting for the rank's EOF
    bool dead = false;
    Clock::time_point since;
  };

  explicit BootstrapRoot(uint64_t magic) : magic_(magic), buffer_(kReadChunk) {}

  void queue(Conn& c, uint32_t type, std::string_view payload) {
    c.out.push_back(std::make_shared<const std::string>(frame_bytes(magic_, type, 0, 0, payload)));
  }
  void queue(Conn& c, std::shared_ptr<const std::string> frame) {
    c.out.push_back(std::move(frame));
  }

  std::string count_payload() const {
    std::string p;
    put_u32(p, static_cast<uint32_t>(joined_));
    put_u32(p, static_cast<uint32_t>(nranks_));
    return p;
  }

  void fail(const std::string& why, Conn* also) {
    failed_ = why;
    failed_at_ = Clock::now();
    EFCCL_WARN(-1, "bootstrap root at " + name_ + ": the rendezvous failed: " + why);
    for (Conn* c : slots_)
      if (c != nullptr) {
        queue(*c, kRootError, why);
        c->closing = true;
        c->rank = -1;
      }
    if (also != nullptr) {
      queue(*also, kRootError, why);
      also->closing = true;
    }
    slots_.assign(slots_.size(), nullptr);
    joined_ = 0;
  }

  void refuse(Conn& c, const std::string& why) {
    EFCCL_WARN(-1,
               "bootstrap root at " + name_ + ": refused a connection from " + c.from + ": " + why);
    c.dead = true;
  }

  /// A rank's hello (magic already checked). Returns false when the connection is refused.
  bool hello(Conn& c, std::string payload) {
    const uint32_t version = get_u32(payload, 0);
    const auto n = static_cast<int>(get_u32(payload, 4));
    const auto rank = static_cast<int>(get_u32(payload, 8));
    SockAddr addr{};
    std::memcpy(&addr, payload.data() + 16, sizeof(addr));
    if (version != kProtocolVersion) {
      queue(c, kRootError,
            "bootstrap protocol version " + std::to_string(version) + " differs from the root's " +
                std::to_string(kProtocolVersion) + " (mixed efccl builds?)");
      c.closing = true;
      return true;
    }
    if (n < 1 || rank < 0 || rank >= n || !addr_family_ok(addr)) {
      refuse(c, "malformed hello (rank " + std::to_string(rank) + " of " + std::to_string(n) + ")");
      return false;
    }
    if (completed_) {
      queue(
          c, kRootError,
          "the rendezvous at " + name_ + " already completed without rank " + std::to_string(rank));
      c.closing = true;
      return true;
    }
    if (!failed_.empty()) {
      queue(c, kRootError, failed_);
      c.closing = true;
      return true;
    }
    if (nranks_ == 0) {
      nranks_ = n;
      nranks_from_ = rank;
      slots_.assign(static_cast<std::size_t>(n), nullptr);
      addrs_.assign(static_cast<std::size_t>(n), SockAddr{});
      infos_.assign(static_cast<std::size_t>(n), std::string());
    } else if (n != nranks_) {
      fail("rank " + std::to_string(rank) + " says nranks " + std::to_string(n) + ", rank " +
               std::to_string(nranks_from_) + " said " + std::to_string(nranks_),
           &c);
      return true;
    }
    const auto r = static_cast<std::size_t>(rank);
    if (slots_[r] != nullptr) {
      fail("rank " + std::to_string(rank) + " joined twice (from " + slots_[r]->from + " and " +
               c.from + ")",
           &c);
      return true;
    }
    slots_[r] = &c;
    c.rank = rank;
    addrs_[r] = addr;
    infos_[r] = payload.substr(kHelloFixed);
    ++joined_;
    EFCCL_INFO(kLogInit, -1,
               "bootstrap root at " + name_ + ": rank " + std::to_string(rank) + " of " +
                   std::to_string(n) + " joined from " + c.from + " (" + std::to_string(joined_) +
                   " joined)");
    queue(c, kRootCount, count_payload());
    count_dirty_ = true;
    if (joined_ == nranks_) complete();
    return true;
  }

  void complete() {
    std::string table;
    put_u32(table, static_cast<uint32_t>(nranks_));
    put_u32(table, 0);
    for (int r = 0; r < nranks_; ++r) {
      table.append(reinterpret_cast<const char*>(&addrs_[static_cast<std::size_t>(r)]),
                   sizeof(SockAddr));
      put_u32(table, static_cast<uint32_t>(infos_[static_cast<std::size_t>(r)].size()));
      table += infos_[static_cast<std::size_t>(r)];
    }
    auto frame = std::make_shared<const std::string>(frame_bytes(magic_, kRootTable, 0, 0, table));
    for (Conn* c : slots_) {
      queue(*c, frame);
      c->closing = true;
    }
    slots_.clear();  // the connections only deliver the table now
    completed_ = true;
    completed_at_ = Clock::now();
    listen_.reset();  // nobody else may join; strangers are refused by the kernel
    EFCCL_INFO(kLogInit, -1,
               "bootstrap root at " + name_ + ": all " + std::to_string(nranks_) +
                   " ranks joined; sending the table");
  }

  void on_readable(Conn& c) {
    std::string why;
    const auto check = [&](const FrameHeader& h, std::string* reason) {
      if (c.rank >= 0 || c.closing) {
        *reason = "unexpected data after the hello";
        return false;
      }
      if (h.type != kRootHello || h.length < kHelloFixed ||
          h.length > kHelloFixed + Bootstrap::kMaxInfoBytes) {
        *reason = "not a bootstrap hello (type " + std::to_string(h.type) + ", " +
                  std::to_string(h.length) + " bytes)";
        return false;
      }
      return true;
    };
    const auto on_frame = [&](const FrameHeader&, std::string payload) {
      return hello(c, std::move(payload));
    };
    const ReadResult rr =
        read_frames(c.fd.get(), c.reader, magic_, buffer_, 1 << 20, &why, check, on_frame);
    switch (rr) {
      case ReadResult::kAgain:
      case ReadResult::kStop:
        return;
      case ReadResult::kBad:
        if (c.rank >= 0 && !completed_) forget(c, "sent " + why);
        if (c.draining || c.closing) {
          c.dead = true;  // a rank that finished or was refused: nothing to report
          return;
        }
        refuse(c, why);
        return;
      case ReadResult::kEof:
      case ReadResult::kError:
        if (c.rank >= 0 && !completed_)
          forget(c, rr == ReadResult::kEof ? "closed its connection" : why);
        c.dead = true;
        return;
    }
  }

  /// A joined rank left before the rendezvous completed: it may join again.
  void forget(Conn& c, const std::string& why) {
    EFCCL_INFO(kLogInit, -1,
               "bootstrap root at " + name_ + ": rank " + std::to_string(c.rank) + " " + why +
                   " before the rendezvous completed");
    slots_[static_cast<std::size_t>(c.rank)] = nullptr;
    c.rank = -1;
    --joined_;
    count_dirty_ = true;
    if (joined_ == 0) nranks_ = 0;
  }

  void on_writable(Conn& c) {
    while (!c.out.empty()) {
      const std::string& f = *c.out.front();
      const ssize_t n =
          ::send(c.fd.get(), f.data() + c.out_at, f.size() - c.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        if (c.rank >= 0 && !completed_)
          forget(c, "could not be written to (" + errno_text(errno) + ")");
        c.dead = true;
        return;
      }
      c.out_at += static_cast<std::size_t>(n);
      if (c.out_at == f.size()) {
        c.out.pop_front();
        c.out_at = 0;
      }
    }
    if (c.closing && !c.draining) {
      // Let the rank close first, so that no unread byte turns our close into a reset.
      ::shutdown(c.fd.get(), SHUT_WR);
      c.draining = true;
      c.since = Clock::now();
    }
  }

  void run() {
    std::vector<pollfd> fds;
    Clock::time_point last_count{};
    for (;;) {
      const Clock::time_point now = Clock::now();
      if (stop_.load() && !completed_) break;
      if (!failed_.empty() && now - failed_at_ > kFailedRootLife) break;
      if (completed_ && (conns_.empty() || now - completed_at_ > kFlushLimit)) break;
      if (count_dirty_ && now - last_count >= kCountInterval) {
        for (Conn* c : slots_)
          if (c != nullptr) queue(*c, kRootCount, count_payload());
        count_dirty_ = false;
        last_count = now;
      }
      fds.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), static_cast<short>(listen_.valid() ? POLLIN : 0), 0});
      for (const auto& c : conns_)
        fds.push_back(
            {c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(kCountInterval.count()));
      if (rc < 0 && errno != EINTR) {
        EFCCL_WARN(-1, "bootstrap root at " + name_ + ": poll(): " + errno_text(errno));
        break;
      }
      if (fds[0].revents != 0) drain_wake(wake_.get());
      for (std::size_t i = 0; i < conns_.size(); ++i) {
        Conn& c = *conns_[i];
        const short ev = fds[i + 2].revents;
        if ((ev & POLLOUT) != 0) on_writable(c);
        if (!c.dead && (ev & (POLLIN | POLLHUP | POLLERR)) != 0) on_readable(c);
        if (!c.dead && c.closing && c.out.empty()) on_writable(c);  // queued while reading
      }
      if (listen_.valid() && (fds[1].revents & POLLIN) != 0) accept_all();
      expire();
      std::erase_if(conns_, [](const std::unique_ptr<Conn>& c) { return c->dead; });
    }
    EFCCL_INFO(kLogInit, -1, "bootstrap root at " + name_ + ": exits");
  }

  void accept_all() {
    for (;;) {
      SockAddr from{};
      socklen_t len = sizeof(from);
      const int fd = ::accept4(listen_.get(), &from.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          EFCCL_WARN(-1, "bootstrap root at " + name_ + ": accept(): " + errno_text(errno));
          std::this_thread::sleep_for(milliseconds(100));  // e.g. out of descriptors: no spin
        }
        return;
      }
      set_nodelay(fd);
      auto c = std::make_unique<Conn>();
      c->fd.reset(fd);
      c->from = addr_to_string(from);
      c->since = Clock::now();
      conns_.push_back(std::move(c));
    }
  }

  /// Drops connections that never said hello, or never acknowledged the end.
  void expire() {
    const Clock::time_point now = Clock::now();
    std::size_t strangers = 0;
    for (auto it = conns_.rbegin(); it != conns_.rend(); ++it) {
      Conn& c = **it;
      if (c.dead) continue;
      if (c.draining) {
        if (now - c.since > kGoodbyeLimit) c.dead = true;
        continue;
      }
      if (c.rank >= 0 || c.closing) continue;
      if (now - c.since > kStrangerTimeout)
        refuse(c, "no hello within " + std::to_string(kStrangerTimeout.count()) + " ms");
      else if (++strangers > kMaxStrangers)
        refuse(c, "too many connections without a hello");
    }
  }

  const uint64_t magic_;
  Fd listen_, wake_;
  SockAddr addr_{};
  std::string name_;
  std::atomic<bool> stop_{false};
  std::vector<char> buffer_;
  std::vector<std::unique_ptr<Conn>> conns_;
  int nranks_ = 0, nranks_from_ = -1, joined_ = 0;
  std::vector<Conn*> slots_;
  std::vector<SockAddr> addrs_;
  std::vector<std::string> infos_;
  bool count_dirty_ = false, completed_ = false;
  std::string failed_;
  Clock::time_point failed_at_, completed_at_;
};

// ---- The transport: one rank's sockets, progress thread and mailboxes ----

/// One TCP connection to another rank (either side may have opened it).
struct BootstrapConnection {
  Fd fd;
  int peer = -1;  ///< -1 until its hello authenticated it
  bool outgoing = false;
  std::string remote;
  std::mutex write_mu;
  bool write_broken = false;  ///< under write_mu: a frame was cut short
  FrameReader reader;         // progress thread only
  bool goodbye = false;       // progress thread only
  Clock::time_point since;
  std::atomic<bool> closed{false};
};

class BootstrapTransport : public std::enable_shared_from_this<BootstrapTransport> {
 public:
  using Handler = std::function<void(int peer, const std::string& why)>;

  BootstrapTransport(uint64_t magic, int nranks, int rank, const SockAddr& root,
                     Clock::time_point connect_deadline)
      : magic_(magic),
        nranks_(nranks),
        rank_(rank),
        root_addr_(root),
        root_name_(addr_to_string(root)),
        started_(Clock::now()),
        connect_deadline_(connect_deadline),
        buffer_(kReadChunk),
        peers_(new PeerState[static_cast<std::size_t>(nranks)]) {}

  ~BootstrapTransport() = default;

  /// Opens the listen socket on `local` and starts the progress thread.
  Status open(const SockAddr& local, const std::string& info) {
    SockAddr any_port = local;
    set_port(any_port, 0);
    auto listener = listen_on(any_port, false);
    if (!listener) return listener.status();
    listen_ = std::move(listener->first);
    listen_addr_ = listener->second;
    wake_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_.valid()) return Status::error("eventfd(): " + errno_text(errno));
    std::string hello;
    put_u32(hello, kProtocolVersion);
    put_u32(hello, static_cast<uint32_t>(nranks_));
    put_u32(hello, static_cast<uint32_t>(rank_));
    put_u32(hello, 0);
    hello.append(reinterpret_cast<const char*>(&listen_addr_), sizeof(SockAddr));
    hello += info;
    root_out_ = frame_bytes(magic_, kRootHello, 0, 0, hello);
    auto self = shared_from_this();
    std::lock_guard<std::mutex> lock(mu_);  // run() starts by taking it: sees thread_id_
    open_handles_ = 1;
    thread_ = std::thread([self] { self->run(); });
    thread_id_ = thread_.get_id();
    return Status::ok();
  }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const std::string& root_name() const { return root_name_; }
  std::string listen_name() const { return addr_to_string(listen_addr_); }
  const std::vector<std::string>& infos() const { return infos_; }

  bool ready() {
    std::lock_guard<std::mutex> lock(mu_);
    return phase_ == Phase::kReady;
  }

  void acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    ++open_handles_;
  }

  /// One bootstrap sharing this transport closed; the last one stops it.
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--open_handles_ > 0) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (getpid() != owner_pid_) {
      // An inherited copy in a forked child: the thread does not exist here (nothing to join)
      // and the descriptors are /dev/null already. Forget the thread object.
      new std::thread(std::move(thread_));  // NOLINT: leaked on purpose, never destroyed
      return;
    }
    wake(wake_.get());
    if (std::this_thread::get_id() == thread_id_)
      thread_.detach();  // a handler closed its own bootstrap: the thread owns `this` until it ends
    else if (thread_.joinable())
      thread_.join();
  }

  Status wait_ready(Clock::time_point deadline, const std::atomic<bool>* abort) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (phase_ == Phase::kReady) return Status::ok();
      if (phase_ == Phase::kFailed) return Status::error(fail_reason_);
      if (stopping_) return Status::error("the bootstrap was closed during the rendezvous");
      const Clock::time_point now = Clock::now();
      if (aborted(abort) || now >= deadline) {
        std::string progress;
        if (!root_reached_)
          progress = "could not reach the rendezvous root at " + root_name_ +
                     (last_connect_error_.empty() ? "" : " (" + last_connect_error_ + ")");
        else if (joined_ >= 0)
          progress = "only " + std::to_string(joined_) + " of " + std::to_string(nranks_) +
                     " ranks joined the rendezvous at " + root_name_;
        else
          progress = "the rendezvous at " + root_name_ + " did not complete (no report yet)";
        if (aborted(abort)) return Status::error("aborted: " + progress);
        return Status::error(progress + " within " +
                             std::to_string(ms_between(started_, deadline)) + " ms");
      }
      cv_.wait_until(lock, slice_end(deadline));
    }
  }

  void deliver(uint64_t space, int from, uint64_t tag, std::string payload) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      mail_[MailKey{space, from, tag}].push_back(std::move(payload));
    }
    cv_.notify_all();
  }

  Status send(int peer, int shown, uint64_t space, uint64_t tag, std::string_view data,
              Clock::time_point deadline, const std::atomic<bool>* abort) {
    if (data.size() > Bootstrap::kMaxMessageBytes)
      return Status::error("a message of " + std::to_string(data.size()) +
                           " bytes exceeds the bootstrap's limit of " +
                           std::to_string(Bootstrap::kMaxMessageBytes));
    if (peer == rank_) {
      deliver(space, peer, tag, std::string(data));
      return Status::ok();
    }
    auto conn = connection_to(peer, shown, deadline, abort);
    if (!conn) return conn.status();
    BootstrapConnection& c = **conn;
    std::unique_lock<std::mutex> wl(c.write_mu, std::defer_lock);
    if (!lock_until(wl, deadline, abort))
      return Status::error(std::string(aborted(abort) ? "aborted" : "timed out") +
                           " waiting to send to rank " + std::to_string(shown));
    if (c.write_broken || c.closed.load())
      return Status::error("the connection to rank " + std::to_string(shown) + " is broken" +
                           peer_state_suffix(peer));
    FrameHeader h;
    h.magic = magic_;
    h.type = kData;
    h.space = space;
    h.tag = tag;
    h.length = data.size();
    std::size_t written = 0;
    Status s = write_frame(c.fd.get(), h, data, deadline, abort, &written);
    if (s) {
      peers_[static_cast<std::size_t>(peer)].sent.fetch_add(1);
      return s;
    }
    if (written > 0) {
      // Half a frame is on the wire: the stream cannot be used again.
      c.write_broken = true;
      ::shutdown(c.fd.get(), SHUT_RDWR);
    }
    return Status::error("sending " + std::to_string(data.size()) + " bytes to rank " +
                         std::to_string(shown) + " (" + c.remote + "): " + s.message() +
                         peer_state_suffix(peer));
  }

  Status connect(int peer, int shown, Clock::time_point deadline, const std::atomic<bool>* abort) {
    if (peer == rank_) return Status::ok();
    auto conn = connection_to(peer, shown, deadline, abort);
    return conn ? Status::ok() : conn.status();
  }

  StatusOr<std::string> recv(int peer, int shown, uint64_t space, uint64_t tag,
                             Clock::time_point deadline, const std::atomic<bool>* abort) {
    const Clock::time_point begin = Clock::now();
    const MailKey key{space, peer, tag};
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = mail_.find(key);
      if (it != mail_.end() && !it->second.empty()) {
        std::string m = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) mail_.erase(it);
        return m;
      }
      const std::string what =
          "a message from rank " + std::to_string(shown) + " (tag " + hex(tag) + ")";
      if (peer != rank_) {
        const PeerState& p = peers_[static_cast<std::size_t>(peer)];
        if (p.failed) return Status::error("waiting for " + what + ": " + p.why);
        if (p.left)
          return Status::error("waiting for " + what + ": rank " + std::to_string(shown) +
                               " closed its bootstrap (left) without sending it");
      }
      if (stopping_) return Status::error("the bootstrap was closed while waiting for " + what);
      if (aborted(abort)) return Status::error("aborted while waiting for " + what);
      if (Clock::now() >= deadline)
        return Status::error("timed out after " + std::to_string(ms_between(begin, deadline)) +
                             " ms waiting for " + what);
      cv_.wait_until(lock, slice_end(deadline));
    }
  }

  uint64_t add_handler(std::vector<int> members, const Handler& fn, uint64_t id) {
    std::vector<std::pair<int, std::string>> already;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (id == 0) id = ++next_handler_;
      if (!fn) {
        handlers_.erase(id);
        return id;
      }
      for (std::size_t i = 0; i < members.size(); ++i) {
        const PeerState& p = peers_[static_cast<std::size_t>(members[i])];
        if (p.failed) already.emplace_back(static_cast<int>(i), p.why);
      }
      handlers_[id] = HandlerEntry{std::move(members), fn};
    }
    for (const auto& [peer, why] : already) fn(peer, why);
    return id;
  }

  void remove_handler(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_.erase(id);
  }

 private:
  enum class Phase { kJoining, kReady, kFailed };
  enum class RootLink { kWait, kConnecting, kActive, kDone };
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
    std::vector<int> members;  ///< the handler's rank i is the transport's rank members[i]
    Handler fn;
  };

  std::string peer_state_suffix(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    const PeerState& p = peers_[static_cast<std::size_t>(peer)];
    if (p.failed) return " (" + p.why + ")";
    if (p.left) return " (it closed its bootstrap)";
    return "";
  }

  /// The connection this rank sends to `peer` on: always the same one once chosen, so that
  /// messages keep their order. Reuses a connection the peer opened, else opens one.
  StatusOr<std::shared_ptr<BootstrapConnection>> connection_to(int peer, int shown,
                                                               Clock::time_point deadline,
                                                               const std::atomic<bool>* abort) {
    PeerState& p = peers_[static_cast<std::size_t>(peer)];
    const std::string who = "rank " + std::to_string(shown);
    std::unique_lock<std::mutex> cl(p.connect_mu, std::defer_lock);
    if (!lock_until(cl, deadline, abort))
      return Status::error(std::string(aborted(abort) ? "aborted" : "timed out") +
                           " connecting to " + who);
    SockAddr addr{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (p.failed) return Status::error("cannot send to " + who + ": " + p.why);
      if (p.left) return Status::error("cannot send to " + who + ": it closed its bootstrap");
      if (stopping_) return Status::error("the bootstrap was closed");
      if (phase_ != Phase::kReady)
        return Status::error("cannot send to " + who + " before the rendezvous completed");
      if (p.send_conn && !p.send_conn->closed.load()) return p.send_conn;
      for (const auto& c : conns_)
        if (c->peer == peer && !c->closed.load()) return p.send_conn = c;
      addr = addrs_[static_cast<std::size_t>(peer)];
    }
    int error = 0;
    Fd fd = start_connect(addr, &error);
    for (;;) {
      if (error != 0)
        return Status::error("cannot connect to " + who + " at " + addr_to_string(addr) + ": " +
                             errno_text(error) + peer_state_suffix(peer));
      pollfd pf{fd.get(), POLLOUT, 0};
      const int rc = ::poll(&pf, 1, poll_timeout_ms(slice_end(deadline)));
      if (rc > 0) {
        error = socket_error(fd.get());
        if (error == 0) break;
        continue;
      }
      if (aborted(abort)) return Status::error("aborted while connecting to " + who);
      if (Clock::now() >= deadline)
        return Status::error("timed out connecting to " + who + " at " + addr_to_string(addr));
    }
    set_nodelay(fd.get());
    auto conn = std::make_shared<BootstrapConnection>();
    conn->fd = std::move(fd);
    conn->peer = peer;
    conn->outgoing = true;
    conn->remote = addr_to_string(addr);
    conn->since = Clock::now();
    std::string hello;
    put_u32(hello, static_cast<uint32_t>(nranks_));
    put_u32(hello, static_cast<uint32_t>(rank_));
    put_u32(hello, static_cast<uint32_t>(peer));
    FrameHeader h;
    h.magic = magic_;
    h.type = kPeerHello;
    h.length = hello.size();
    std::size_t written = 0;
    if (Status s = write_frame(conn->fd.get(), h, hello, deadline, abort, &written); !s)
      return Status::error("greeting " + who + " at " + conn->remote + ": " + s.message());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return Status::error("the bootstrap was closed");
      conns_.push_back(conn);
      p.send_conn = conn;
    }
    wake(wake_.get());
    EFCCL_INFO(kLogNet, -1,
               "bootstrap rank " + std::to_string(rank_) + ": connected to rank " +
                   std::to_string(peer) + " at " + conn->remote);
    return conn;
  }

  void fail_rendezvous(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (phase_ != Phase::kJoining) return;
      phase_ = Phase::kFailed;
      fail_reason_ = why;
    }
    cv_.notify_all();
    root_fd_.reset();
    root_link_ = RootLink::kDone;
  }

  /// Reads the root's table: nranks entries of (address, info length, info).
  bool learn_table(std::string_view t) {
    if (t.size() < 8 || get_u32(t, 0) != static_cast<uint32_t>(nranks_)) return false;
    std::vector<SockAddr> addrs(static_cast<std::size_t>(nranks_));
    std::vector<std::string> infos(static_cast<std::size_t>(nranks_));
    std::size_t at = 8;
    for (int r = 0; r < nranks_; ++r) {
      if (t.size() - at < sizeof(SockAddr) + 4) return false;
      std::memcpy(&addrs[static_cast<std::size_t>(r)], t.data() + at, sizeof(SockAddr));
      if (!addr_family_ok(addrs[static_cast<std::size_t>(r)])) return false;
      const uint32_t len = get_u32(t, at + sizeof(SockAddr));
      at += sizeof(SockAddr) + 4;
      if (len > Bootstrap::kMaxInfoBytes || t.size() - at < len) return false;
      infos[static_cast<std::size_t>(r)] = std::string(t.substr(at, len));
      at += len;
    }
    if (at != t.size()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (phase_ != Phase::kJoining) return true;
      addrs_ = std::move(addrs);
      infos_ = std::move(infos);
      joined_ = nranks_;
      phase_ = Phase::kReady;
    }
    cv_.notify_all();
    EFCCL_INFO(kLogInit, -1,
               "bootstrap rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) +
                   ": all ranks joined the rendezvous at " + root_name_ + " after " +
                   std::to_string(ms_between(started_, Clock::now())) + " ms");
    return true;
  }

  /// Advances the connection to the root: connect (retrying while refused), hello, answers.
  void step_root(short revents) {
    const Clock::time_point now = Clock::now();
    switch (root_link_) {
      case RootLink::kDone:
        return;
      case RootLink::kWait: {
        if (now < root_retry_at_) return;
        if (now >= connect_deadline_) {
          fail_rendezvous("could not reach the rendezvous root at " + root_name_ + " within " +
                          std::to_string(ms_between(started_, connect_deadline_)) + " ms (" +
                          last_connect_error_copy() + ")");
          return;
        }
        int error = 0;
        root_fd_ = start_connect(root_addr_, &error);
        if (error != 0) {
          root_retry(errno_text(error));
          return;
        }
        root_link_ = RootLink::kConnecting;
        return;
      }
      case RootLink::kConnecting: {
        if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) {
          if (now >= connect_deadline_) root_retry("connection attempt timed out");
          return;
        }
        if (const int error = socket_error(root_fd_.get()); error != 0) {
          root_retry(errno_text(error));
          return;
        }
        set_nodelay(root_fd_.get());
        root_link_ = RootLink::kActive;
        {
          std::lock_guard<std::mutex> lock(mu_);
          root_reached_ = true;
        }
        [[fallthrough]];
      }
      case RootLink::kActive:
        root_io(revents);
        return;
    }
  }

  std::string last_connect_error_copy() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_connect_error_;
  }

  void root_retry(const std::string& error) {
    root_fd_.reset();
    root_link_ = RootLink::kWait;
    root_retry_at_ = Clock::now() + root_backoff_;
    root_backoff_ = std::min(root_backoff_ * 2, milliseconds(200));
    std::lock_guard<std::mutex> lock(mu_);
    last_connect_error_ = error;
  }

  void root_io(short revents) {
    while (root_out_at_ < root_out_.size()) {
      const ssize_t n = ::send(root_fd_.get(), root_out_.data() + root_out_at_,
                               root_out_.size() - root_out_at_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) break;  // the read below reports the broken connection
      root_out_at_ += static_cast<std::size_t>(n);
    }
    if ((revents & (POLLIN | POLLHUP | POLLERR)) == 0) return;
    const uint64_t table_limit =
        8 + static_cast<uint64_t>(nranks_) * (sizeof(SockAddr) + 4 + Bootstrap::kMaxInfoBytes);
    std::string why;
    const auto check = [&](const FrameHeader& h, std::string* reason) {
      const bool ok = (h.type == kRootCount && h.length == 8) ||
                      (h.type == kRootError && h.length <= Bootstrap::kMaxInfoBytes) ||
                      (h.type == kRootTable && h.length <= table_limit);
      if (!ok)
        *reason = "unexpected message type " + std::to_string(h.type) + " of " +
                  std::to_string(h.length) + " bytes";
      return ok;
    };
    const auto on_frame = [&](const FrameHeader& h, const std::string& payload) {
      if (h.type == kRootCount) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          joined_ = static_cast<int>(get_u32(payload, 0));
        }
        cv_.notify_all();
        return true;
      }
      if (h.type == kRootError) {
        fail_rendezvous(payload);
        return false;
      }
      if (!learn_table(payload)) {
        fail_rendezvous("the rendezvous root at " + root_name_ + " sent a malformed table");
        return false;
      }
      root_fd_.reset();
      root_link_ = RootLink::kDone;
      return false;
    };
    const ReadResult rr =
        read_frames(root_fd_.get(), root_reader_, magic_, buffer_, 1u << 30, &why, check, on_frame);
    if (rr == ReadResult::kEof)
      fail_rendezvous("the rendezvous root at " + root_name_ +
                      " closed the connection before all ranks joined (did its process exit?)");
    else if (rr == ReadResult::kError)
      fail_rendezvous("lost the connection to the rendezvous root at " + root_name_ + ": " + why);
    else if (rr == ReadResult::kBad)
      fail_rendezvous("the rendezvous root at " + root_name_ + " sent garbage: " + why);
  }

  void accept_all() {
    for (;;) {
      SockAddr from{};
      socklen_t len = sizeof(from);
      const int fd = ::accept4(listen_.get(), &from.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          EFCCL_WARN(
              -1, "bootstrap rank " + std::to_string(rank_) + ": accept(): " + errno_text(errno));
          std::this_thread::sleep_for(milliseconds(100));  // e.g. out of descriptors: no spin
        }
        return;
      }
      set_nodelay(fd);
      auto c = std::make_shared<BootstrapConnection>();
      c->fd.reset(fd);
      c->remote = addr_to_string(from);
      c->since = Clock::now();
      std::lock_guard<std::mutex> lock(mu_);
      conns_.push_back(std::move(c));
    }
  }

  void refuse(BootstrapConnection& c, const std::string& why) {
    EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": refused a connection from " +
                       c.remote + ": " + why);
    drop(c);
  }

  void drop(BootstrapConnection& c) {
    c.closed.store(true);
    ::shutdown(c.fd.get(), SHUT_RDWR);  // the fd itself closes with the last reference
  }

  /// The connection to `peer` broke although it did not say goodbye: its process died.
  void peer_broken(int peer, const std::string& why) {
    std::vector<std::pair<int, Handler>> calls;
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PeerState& p = peers_[static_cast<std::size_t>(peer)];
      if (stopping_ || p.failed || p.left) return;
      p.failed = true;
      p.why = message = "rank " + std::to_string(peer) + " failed: " + why;
      for (const auto& [id, h] : handlers_)
        for (std::size_t i = 0; i < h.members.size(); ++i)
          if (h.members[i] == peer) calls.emplace_back(static_cast<int>(i), h.fn);
    }
    cv_.notify_all();
    EFCCL_WARN(-1, "bootstrap rank " + std::to_string(rank_) + ": " + message);
    for (auto& [local, fn] : calls) fn(local, message);
  }

  /// A frame on an authenticated connection, or the hello of a new one.
  bool on_frame(BootstrapConnection& c, const FrameHeader& h, std::string payload) {
    if (c.peer < 0) {
      const auto n = static_cast<int>(get_u32(payload, 0));
      const auto from = static_cast<int>(get_u32(payload, 4));
      const auto to = static_cast<int>(get_u32(payload, 8));
      if (n != nranks_ || to != rank_ || from < 0 || from >= nranks_ || from == rank_) {
        refuse(c, "hello from rank " + std::to_string(from) + " of " + std::to_string(n) +
                      " to rank " + std::to_string(to) + " does not fit rank " +
                      std::to_string(rank_) + " of " + std::to_string(nranks_));
        return false;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        const PeerState& p = peers_[static_cast<std::size_t>(from)];
        if (p.failed || p.left) {
          c.closed.store(true);
        } else {
          c.peer = from;
        }
      }
      if (c.peer < 0) {
        refuse(c, "rank " + std::to_string(from) + " had already failed or left");
        return false;
      }
      EFCCL_INFO(kLogNet, -1,
                 "bootstrap rank " + std::to_string(rank_) + ": rank " + std::to_string(from) +
                     " connected from " + c.remote);
      return true;
    }
    if (h.type == kData) {
      {
        // The message and the count together: a receiver that sees `left` finds it queued.
        std::lock_guard<std::mutex> lock(mu_);
        mail_[MailKey{h.space, c.peer, h.tag}].push_back(std::move(payload));
        PeerState& p = peers_[static_cast<std::size_t>(c.peer)];
        ++p.received;
        if (p.goodbye && !p.failed && p.received >= p.announced) p.left = true;
      }
      cv_.notify_all();
      return true;
    }
    // kGoodbye: the peer leaves in order; nothing it does from now on is a failure. Its tag
    // field carries the number of data frames it sent here (PeerState::left).
    c.goodbye = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PeerState& p = peers_[static_cast<std::size_t>(c.peer)];
      p.goodbye = true;
      p.announced = std::max(p.announced, h.tag);
      if (!p.failed && p.received >= p.announced) p.left = true;
    }
    cv_.notify_all();
    ::shutdown(c.fd.get(), SHUT_WR);  // acknowledges: the peer's close() sees our end of stream
    return true;
  }

  void on_readable(BootstrapConnection& c) {
    std::string why;
    const auto check = [&](const FrameHeader& h, std::string* reason) {
      bool ok;
      if (c.peer < 0)
        ok = h.type == kPeerHello && h.length == kPeerHelloBytes;
      else
        ok = (h.type == kData && h.length <= Bootstrap::kMaxMessageBytes) ||
             (h.type == kGoodbye && h.length == 0);
      if (!ok)
        *reason = "unexpected message type " + std::to_string(h.type) + " of " +
                  std::to_string(h.length) + " bytes";
      return ok;
    };
    const auto frame = [&](const FrameHeader& h, std::string payload) {
      return on_frame(c, h, std::move(payload));
    };
    const ReadResult rr =
        read_frames(c.fd.get(), c.reader, magic_, buffer_, 1 << 20, &why, check, frame);
    if (rr == ReadResult::kAgain || c.closed.load()) return;
    if (rr == ReadResult::kStop) return;
    if (c.peer < 0) {
      if (rr == ReadResult::kBad)
        refuse(c, why);
      else
        drop(c);  // a stranger that hung up
      return;
    }
    drop(c);
    if (c.goodbye) return;
    if (rr == ReadResult::kBad)
      peer_broken(c.peer, "it sent a malformed message on " + c.remote + " (" + why + ")");
    else if (rr == ReadResult::kEof)
      peer_broken(c.peer, "the connection to " + c.remote + " was closed (end of file)");
    else
      peer_broken(c.peer, "the connection to " + c.remote + " broke (" + why + ")");
  }

  void expire_strangers() {
    const Clock::time_point now = Clock::now();
    std::vector<std::shared_ptr<BootstrapConnection>> strangers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = conns_.rbegin(); it != conns_.rend(); ++it)
        if ((*it)->peer < 0 && !(*it)->closed.load()) strangers.push_back(*it);
    }
    for (std::size_t i = 0; i < strangers.size(); ++i) {
      if (now - strangers[i]->since > kStrangerTimeout)
        refuse(*strangers[i],
               "no hello within " + std::to_string(kStrangerTimeout.count()) + " ms");
      else if (i >= kMaxStrangers)
        refuse(*strangers[i], "too many connections without a hello");
    }
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<std::shared_ptr<BootstrapConnection>> snapshot;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
        std::erase_if(conns_, [](const auto& c) { return c->closed.load(); });
        snapshot = conns_;
      }
      fds.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      short root_events = 0;
      if (root_link_ == RootLink::kConnecting) root_events = POLLOUT;
      if (root_link_ == RootLink::kActive)
        root_events = static_cast<short>(POLLIN | (root_out_at_ < root_out_.size() ? POLLOUT : 0));
      fds.push_back({root_events != 0 ? root_fd_.get() : -1, root_events, 0});
      for (const auto& c : snapshot) fds.push_back({c->fd.get(), POLLIN, 0});
      int timeout = 100;
      if (root_link_ == RootLink::kWait)
        timeout = static_cast<int>(
            std::clamp<long long>(ms_between(Clock::now(), root_retry_at_), 0, 100));
      const int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        EFCCL_WARN(-1,
                   "bootstrap rank " + std::to_string(rank_) + ": poll(): " + errno_text(errno));
        std::this_thread::sleep_for(kPollSlice);
        continue;
      }
      if (fds[0].revents != 0) drain_wake(wake_.get());
      step_root(fds[2].revents);
      for (std::size_t i = 0; i < snapshot.size(); ++i)
        if ((fds[i + 3].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !snapshot[i]->closed.load())
          on_readable(*snapshot[i]);
      if ((fds[1].revents & POLLIN) != 0) accept_all();
      expire_strangers();
    }
    say_goodbye();
  }

  /// Tells every peer this rank leaves, then waits (bounded) for each to acknowledge by closing
  /// its end, so that no unread byte turns our close into a reset.
  void say_goodbye() {
    listen_.reset();
    root_fd_.reset();
    std::vector<std::shared_ptr<BootstrapConnection>> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns.swap(conns_);
      for (int p = 0; p < nranks_; ++p) peers_[static_cast<std::size_t>(p)].send_conn.reset();
    }
    const Clock::time_point deadline = Clock::now() + kGoodbyeLimit;
    std::vector<std::shared_ptr<BootstrapConnection>> waiting;
    for (const auto& c : conns) {
      if (c->closed.load() || c->peer < 0) continue;
      std::unique_lock<std::mutex> wl(c->write_mu, std::defer_lock);
      if (lock_until(wl, Clock::now() + milliseconds(100), nullptr) && !c->write_broken) {
        FrameHeader h;
        h.magic = magic_;
        h.type = kGoodbye;
        h.tag = peers_[static_cast<std::size_t>(c->peer)].sent.load();
        std::size_t written = 0;
        if (write_frame(c->fd.get(), h, {}, std::min(deadline, Clock::now() + milliseconds(200)),
                        nullptr, &written))
          waiting.push_back(c);
      }
      ::shutdown(c->fd.get(), SHUT_WR);
    }
    while (!waiting.empty() && Clock::now() < deadline) {
      std::vector<pollfd> fds;
      fds.reserve(waiting.size());
      for (const auto& c : waiting) fds.push_back({c->fd.get(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), poll_timeout_ms(slice_end(deadline)));
      std::vector<std::shared_ptr<BootstrapConnection>> still;
      for (std::size_t i = 0; i < waiting.size(); ++i) {
        bool done = false;
        if (fds[i].revents != 0) {
          for (;;) {
            const ssize_t n = ::recv(fds[i].fd, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
            if (n > 0) continue;  // whatever the peer still sent: nobody will read it
            done = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            break;
          }
        }
        if (!done) still.push_back(waiting[i]);
      }
      waiting.swap(still);
    }
    for (const auto& c : conns) drop(*c);
    EFCCL_INFO(
        kLogInit, -1,
        "bootstrap rank " + std::to_string(rank_) + " of " + std::to_string(nranks_) + ": closed" +
            (waiting.empty()
                 ? ""
                 : " (" + std::to_string(waiting.size()) + " peers did not acknowledge in time)"));
  }

  const uint64_t magic_;
  const int nranks_, rank_;
  const SockAddr root_addr_;
  const std::string root_name_;
  const Clock::time_point started_, connect_deadline_;
  const pid_t owner_pid_ = getpid();
  Fd listen_, wake_;
  SockAddr listen_addr_{};
  std::thread thread_;
  std::thread::id thread_id_;

  // Progress thread only.
  RootLink root_link_ = RootLink::kWait;
  Fd root_fd_;
  std::string root_out_;
  std::size_t root_out_at_ = 0;
  FrameReader root_reader_;
  Clock::time_point root_retry_at_{};
  milliseconds root_backoff_{10};
  std::vector<char> buffer_;

  std::mutex mu_;  // guards everything below, and PeerState's flagged fields
  std::condition_variable cv_;
  Phase phase_ = Phase::kJoining;
  std::string fail_reason_, last_connect_error_;
  bool root_reached_ = false;
  int joined_ = -1;
  std::vector<SockAddr> addrs_;
  std::vector<std::string> infos_;  // set once, before phase_ becomes kReady
  std::unique_ptr<PeerState[]> peers_;
  std::vector<std::shared_ptr<BootstrapConnection>> conns_;
  std::map<MailKey, std::deque<std::string>> mail_;
  std::map<uint64_t, HandlerEntry> handlers_;
  uint64_t next_handler_ = 0;
  int open_handles_ = 0;
  bool stopping_ = false;
};

// ---- Free functions ----

bool interface_matches(std::string_view spec, std::string_view name) {
  bool exclude = false, exact = false;
  if (!spec.empty() && spec.front() == '^') {
    exclude = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    exact = true;
    spec.remove_prefix(1);
  }
  bool listed = false;
  while (!spec.empty() && !listed) {
    const std::size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    if (const std::size_t colon = item.find(':'); colon != std::string_view::npos)
      item = item.substr(0, colon);  // "eth0:port" (NCCL's list syntax): the name only
    if (!item.empty()) listed = exact ? name == item : starts_with(name, item);
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return listed != exclude;
}

StatusOr<std::string> resolve_socket_address(std::string_view text) {
  auto a = parse_address(text, socket_family_from_env());
  if (!a) return a.status();
  return addr_to_string(*a);
}

std::string describe_unique_id(const ncclUniqueId& id) {
  const DecodedId d = decode_id(id);
  if (d.format != kIdFormat || !addr_family_ok(d.root)) return "<not an efccl unique id>";
  return addr_to_string(d.root);
}

uint64_t host_hash() {
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && *id != '\0')
    return hash64(id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string key = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  if (std::getline(boot, boot_id)) key += boot_id;
  return hash64(key);
}

Status create_unique_id(ncclUniqueId* out) {
  if (out == nullptr) return Status::error("the unique id pointer is null");
  DecodedId d;
  d.format = kIdFormat;
  if (const char* env = std::getenv("NCCL_COMM_ID"); env != nullptr && *env != '\0') {
    auto addr = parse_address(env, socket_family_from_env());
    if (!addr)
      return Status::error("NCCL_COMM_ID=" + std::string(env) + " is invalid: " +
                           addr.status().message() + " (use host:port, ipv4:port or [ipv6]:port)");
    d.magic = kCommIdMagic;
    d.flags = kIdRootByRank0;
    d.root = *addr;
    EFCCL_INFO(kLogInit | kLogEnv, -1,
               "NCCL_COMM_ID set by environment to " + std::string(env) +
                   ": rank 0 runs the rendezvous root at " + addr_to_string(d.root));
  } else {
    auto iface = choose_interface(nullptr);
    if (!iface) return Status::error("ncclGetUniqueId: " + iface.status().message());
    if (Status s = random_magic(&d.magic); !s) return s;
    SockAddr local = iface->addr;
    set_port(local, 0);
    auto root = BootstrapRoot::launch(d.magic, local, false);
    if (!root)
      return Status::error("starting the rendezvous root on " + iface->name + ": " +
                           root.status().message());
    d.root = (*root)->address();
    EFCCL_INFO(kLogInit, -1,
               "ncclGetUniqueId: rendezvous root listening on " + addr_to_string(d.root) +
                   " (interface " + iface->name + ")");
  }
  encode_id(d, out);
  return Status::ok();
}

// ---- Bootstrap ----

struct Bootstrap::Private {};

Bootstrap::Bootstrap(const Private&, std::shared_ptr<BootstrapTransport> transport, uint64_t space,
                     std::vector<int> world_ranks, int rank)
    : transport_(std::move(transport)),
      space_(space),
      world_(std::move(world_ranks)),
      rank_(rank),
      nranks_(static_cast<int>(world_.size())) {}

Bootstrap::~Bootstrap() { close(); }

StatusOr<std::shared_ptr<Bootstrap>> Bootstrap::start(const ncclUniqueId& id, int nranks, int rank,
                                                      std::string info,
                                                      Clock::time_point deadline) {
  if (nranks < 1) return Status::error("nranks " + std::to_string(nranks) + " must be >= 1");
  if (rank < 0 || rank >= nranks)
    return Status::error("rank " + std::to_string(rank) + " is out of range [0, " +
                         std::to_string(nranks) + ")");
  if (info.size() > kMaxInfoBytes)
    return Status::error("the rank's description has " + std::to_string(info.size()) +
                         " bytes, more than the bootstrap's limit of " +
                         std::to_string(kMaxInfoBytes));
  const DecodedId d = decode_id(id);
  if (d.format != kIdFormat || !addr_family_ok(d.root))
    return Status::error("the unique id was not made by efccl's ncclGetUniqueId (or is corrupt)");
  std::shared_ptr<BootstrapRoot> root;
  if ((d.flags & kIdRootByRank0) != 0 && rank == 0) {
    auto launched = BootstrapRoot::launch(d.magic, d.root, true);
    if (!launched)
      return Status::error("rank 0 could not start the rendezvous root at NCCL_COMM_ID's " +
                           addr_to_string(d.root) + ": " + launched.status().message());
    root = *launched;
  }
  auto iface = choose_interface(&d.root);
  if (!iface) {
    if (root) root->abandon();
    return iface.status();
  }
  auto transport = std::make_shared<BootstrapTransport>(d.magic, nranks, rank, d.root, deadline);
  if (Status s = transport->open(iface->addr, info); !s) {
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

Status Bootstrap::wait_ready(Clock::time_point deadline, const std::atomic<bool>* abort) {
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

Status Bootstrap::send(int peer, uint64_t tag, std::string_view data, Clock::time_point deadline,
                       const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->send(world(peer), peer, space_, tag, data, deadline, abort);
}

Status Bootstrap::connect(int peer, Clock::time_point deadline, const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->connect(world(peer), peer, deadline, abort);
}

StatusOr<std::string> Bootstrap::recv(int peer, uint64_t tag, Clock::time_point deadline,
                                      const std::atomic<bool>* abort) {
  if (Status s = check_peer(peer); !s) return s;
  return transport_->recv(world(peer), peer, space_, tag, deadline, abort);
}

StatusOr<std::vector<std::string>> Bootstrap::allgather(uint64_t tag, std::string mine,
                                                        Clock::time_point deadline,
                                                        const std::atomic<bool>* abort) {
  std::vector<int> all(static_cast<std::size_t>(nranks_));
  for (int r = 0; r < nranks_; ++r) all[static_cast<std::size_t>(r)] = r;
  return allgather(all, tag, std::move(mine), deadline, abort);
}

StatusOr<std::vector<std::string>> Bootstrap::allgather(const std::vector<int>& ranks, uint64_t tag,
                                                        std::string mine,
                                                        Clock::time_point deadline,
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

Status Bootstrap::barrier(uint64_t tag, Clock::time_point deadline,
                          const std::atomic<bool>* abort) {
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

}  // namespace efccl::runtime
