// Bandwidth of the proxy transport (efccl/net/proxy.h) between two processes playing two hosts,
// against a plain TCP stream between the same two processes in the same run.
//
//   net_transport_bench [--bytes 1G] [--slot-bytes 512K] [--slots 8] [--threads 1] [--socks 1]
//                       [--repeats 5] [--netns]
//
// The test process starts a receiver (rank 0) and a sender (rank 1), this binary again, which
// meet through the bootstrap (NCCL_COMM_ID). Each repeat moves --bytes twice, alternating: a
// plain stream (one blocking TCP socket; the sender send()s a buffer of --slot-bytes again and
// again, the receiver recv()s into one, as iperf does), then the proxy transport (a connection
// of --slots slots of --slot-bytes, --threads x --socks sockets; one thread per process plays
// the GPU: the sender posts full slots once they are free, the receiver frees them once they
// arrived, each looking every kGpuCheck (100 us) so as not to take a core from the proxy
// threads, as a GPU would not).
// Both are timed at the receiver, from a barrier to the last byte. Loopback by default; --netns
// puts the two processes in two network namespaces joined by a veth pair (root; see
// tests/support/network_namespaces.h). Prints GB/s per repeat, the medians and their ratio,
// and the CPU time both processes spent per GiB in each phase (the GPU's stand-ins included).
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_args.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/proxy.h"
#include "efccl/net/socket.h"
#include "network_namespaces.h"

namespace {

using efccl::Status;
using efccl::net::Bootstrap;
using efccl::net::Deadline;
using efccl::net::NetConnection;
using Clock = std::chrono::steady_clock;

constexpr const char* kRoleVar = "EFCCL_NET_BENCH_ROLE";
constexpr uint64_t kTag = 0x6e657462656e6300;
/// How often the threads playing the GPUs look at their counters.
constexpr std::chrono::microseconds kGpuCheck{100};

struct Options {
  uint64_t bytes = 1ull << 30;
  uint64_t slot_bytes = 512 * 1024;
  uint32_t slots = 8;
  int threads = 1;
  int socks = 1;
  int repeats = 5;
  bool netns = false;
};

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "net_transport_bench: %s\n", why.c_str());
  std::exit(1);
}

void check(const Status& s, const char* what) {
  if (!s) die(std::string(what) + ": " + s.message());
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    const auto size = [&] {
      auto v = efccl::bench::parse_size(value());
      if (!v || *v == 0) die(std::string(a) + ": not a size");
      return *v;
    };
    if (a == "--bytes")
      o.bytes = size();
    else if (a == "--slot-bytes")
      o.slot_bytes = size();
    else if (a == "--slots")
      o.slots = static_cast<uint32_t>(size());
    else if (a == "--threads")
      o.threads = static_cast<int>(size());
    else if (a == "--socks")
      o.socks = static_cast<int>(size());
    else if (a == "--repeats")
      o.repeats = static_cast<int>(size());
    else if (a == "--netns")
      o.netns = true;
    else
      die("unknown argument " + std::string(a) +
          " (--bytes, --slot-bytes, --slots, --threads, --socks, --repeats, --netns)");
  }
  o.bytes = std::max<uint64_t>(1, o.bytes / o.slot_bytes) * o.slot_bytes;
  return o;
}

Deadline soon() { return Deadline::after(std::chrono::seconds(120)); }

/// CPU seconds this process has used (user and system, every thread).
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double gbps(uint64_t bytes, Clock::time_point from) {
  return static_cast<double>(bytes) / std::chrono::duration<double>(Clock::now() - from).count() /
         1e9;
}

/// Plays the GPU's wait for a counter without taking a core from the proxy threads (a GPU
/// spins on its own silicon): checks every kGpuCheck. Fails when the connection ends.
void await(NetConnection& c, NetConnection::Counter counter, uint64_t value) {
  const efccl::net::SlotRegion& r = c.region();
  const Deadline deadline = soon();
  for (;;) {
    const uint64_t now = counter == NetConnection::Counter::kTail ? r.load_tail() : r.load_head();
    if (now >= value) return;
    if (c.state() != NetConnection::State::kOpen || deadline.expired())
      check(c.wait_for(counter, value, Deadline::after(std::chrono::milliseconds(1))), "waiting");
    std::this_thread::sleep_for(kGpuCheck);
  }
}

/// The plain stream: blocking send()/recv() of the whole buffer, as iperf does, until `bytes`
/// moved.
Status plain_stream(int fd, bool receiver, std::vector<char>& buffer, uint64_t bytes) {
  for (uint64_t done = 0; done < bytes;) {
    const std::size_t want =
        static_cast<std::size_t>(std::min<uint64_t>(buffer.size(), bytes - done));
    const ssize_t n = receiver ? ::recv(fd, buffer.data(), want, 0)
                               : ::send(fd, buffer.data(), want, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return Status::error(n == 0 ? "the peer closed the stream" : efccl::net::errno_text(errno));
  }
  return Status::ok();
}

/// Rank 0 receives and measures; rank 1 sends. Rank 0 prints one line per repeat.
int role_main(const Options& o, bool receiver) {
  const int rank = receiver ? 0 : 1, peer = 1 - rank;
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // the GPU's checks stay kGpuCheck apart
  efccl::net::UniqueId id;
  check(efccl::net::create_unique_id(&id, std::chrono::seconds(60)), "unique id");
  auto boot_or = Bootstrap::start(id, 2, rank, "", soon());
  if (!boot_or) die(boot_or.status().message());
  std::shared_ptr<Bootstrap> boot = *boot_or;
  check(boot->wait_ready(soon(), nullptr), "bootstrap");
  auto settings = efccl::net::ProxySettings::from_environment();
  if (!settings) die(settings.status().message());
  settings->nthreads = o.threads;
  settings->nsocks_per_thread = o.socks;
  auto proxy = efccl::net::Proxy::start(*settings);
  if (!proxy) die(proxy.status().message());
  efccl::net::SlotLayout layout;
  layout.nslots = o.slots;
  layout.slot_bytes = o.slot_bytes;
  layout.sized = true;
  auto memory = efccl::net::HostSlotMemory::allocate(layout);
  if (!memory) die(memory.status().message());
  const efccl::net::SlotRegion& r = memory->region();
  std::memset(r.slots, 0x5a, layout.nslots * layout.slot_bytes);

  // The connection (receiver -> handle -> sender) and the plain stream's socket.
  std::unique_ptr<NetConnection> c;
  efccl::net::Fd stream;
  std::vector<char> buffer(o.slot_bytes, 0x5a);
  if (receiver) {
    std::string handle;
    auto recv = (*proxy)->expect(r, "bench recv", &handle);
    if (!recv) die(recv.status().message());
    c = std::move(*recv);
    check(boot->send(peer, kTag, handle, soon()), "sending the handle");
    efccl::net::SocketAddress bound;
    auto listener = efccl::net::listen_on(settings->interface.address, false, &bound);
    if (!listener) die(listener.status().message());
    check(boot->send(peer, kTag + 1, bound.to_string(), soon()), "sending the address");
    check(c->wait_open(soon()), "opening the connection");
    for (auto until = Clock::now() + std::chrono::seconds(30); !stream.valid();) {
      check(
          efccl::net::accept_pending(
              listener->get(),
              [&](efccl::net::Fd fd, const efccl::net::SocketAddress&) { stream = std::move(fd); },
              1),
          "accept");
      if (Clock::now() > until) die("the sender's plain stream did not arrive");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    auto handle = boot->recv(peer, kTag, soon());
    if (!handle) die(handle.status().message());
    auto send = (*proxy)->connect(r, "bench send", *handle, soon());
    if (!send) die(send.status().message());
    c = std::move(*send);
    auto address = boot->recv(peer, kTag + 1, soon());
    if (!address) die(address.status().message());
    auto to = efccl::net::SocketAddress::parse(*address, AF_UNSPEC,
                                               efccl::net::SocketAddress::Lookup::kNumericOnly);
    if (!to) die(to.status().message());
    auto fd = efccl::net::connect_to(*to, soon());
    if (!fd) die(fd.status().message());
    stream = std::move(*fd);
  }

  // The plain stream blocks in the kernel, as a plain TCP program's would.
  ::fcntl(stream.get(), F_SETFL, ::fcntl(stream.get(), F_GETFL) & ~O_NONBLOCK);
  const uint64_t nslots_total = o.bytes / o.slot_bytes;
  uint64_t posted = 0;  // slots moved by earlier repeats (the counters keep growing)
  std::vector<double> plain, proxied;
  double cpu_plain = 0, cpu_proxy = 0;  // this process's CPU seconds in each phase
  for (int rep = 0; rep < o.repeats; ++rep) {
    // Plain TCP stream.
    check(boot->barrier(kTag + 10 + 2 * static_cast<uint64_t>(rep), soon()), "barrier");
    double c0 = cpu_seconds();
    Clock::time_point t0 = Clock::now();
    check(plain_stream(stream.get(), receiver, buffer, o.bytes), "plain stream");
    if (receiver) plain.push_back(gbps(o.bytes, t0));
    cpu_plain += cpu_seconds() - c0;
    // The proxy transport.
    check(boot->barrier(kTag + 11 + 2 * static_cast<uint64_t>(rep), soon()), "barrier");
    (*proxy)->kick();
    c0 = cpu_seconds();
    t0 = Clock::now();
    for (uint64_t k = posted; k < posted + nslots_total; ++k) {
      if (receiver) {
        await(*c, NetConnection::Counter::kTail, k + 1);
        r.store_head(k + 1);
      } else {
        if (k >= layout.nslots) await(*c, NetConnection::Counter::kHead, k + 1 - layout.nslots);
        r.sizes[k % layout.nslots] = static_cast<uint32_t>(o.slot_bytes);
        r.store_tail(k + 1);
      }
    }
    posted += nslots_total;
    cpu_proxy += cpu_seconds() - c0;
    if (receiver) {
      proxied.push_back(gbps(o.bytes, t0));
      std::printf("%-6d %12.3f %12.3f\n", rep + 1, plain.back(), proxied.back());
      std::fflush(stdout);
    }
  }
  if (!receiver)
    check(boot->send(peer, kTag + 2, std::to_string(cpu_plain) + " " + std::to_string(cpu_proxy),
                     soon()),
          "sending the CPU times");
  if (receiver) {
    auto theirs = boot->recv(peer, kTag + 2, soon());
    if (!theirs) die(theirs.status().message());
    double their_plain = 0, their_proxy = 0;
    std::sscanf(theirs->c_str(), "%lf %lf", &their_plain, &their_proxy);
    std::sort(plain.begin(), plain.end());
    std::sort(proxied.begin(), proxied.end());
    const double p = plain[plain.size() / 2], q = proxied[proxied.size() / 2];
    std::printf("median %12.3f %12.3f   proxy / plain = %.1f%%\n", p, q, 100.0 * q / p);
    const double gib = static_cast<double>(o.bytes) * o.repeats / (1 << 30);
    std::printf("CPU seconds per GiB, both processes: plain %.3f, proxy %.3f\n",
                (cpu_plain + their_plain) / gib, (cpu_proxy + their_proxy) / gib);
  }
  check(boot->barrier(kTag + 9, soon()), "final barrier");
  c->close();
  boot->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (const char* role = std::getenv(kRoleVar)) return role_main(o, std::string(role) == "recv");

  std::unique_ptr<efccl_test::NetworkNamespaces> hosts;
  std::string interface[2] = {"lo", "lo"}, address = "127.0.0.1", where = "loopback";
  if (o.netns) {
    std::string why;
    hosts = efccl_test::NetworkNamespaces::create(&why);
    if (hosts == nullptr) die("--netns: " + why);
    for (int i = 0; i < 2; ++i) interface[i] = hosts->interface(i);
    address = hosts->address(0);
    where = "two network namespaces joined by a veth pair (" + hosts->address(0) + ", " +
            hosts->address(1) + ")";
  }
  std::printf(
      "net_transport_bench: %.2f GiB per run, %u slots of %llu KiB, %d thread(s) x %d "
      "socket(s), %s\n",
      static_cast<double>(o.bytes) / (1 << 30), o.slots,
      static_cast<unsigned long long>(o.slot_bytes >> 10), o.threads, o.socks, where.c_str());
  std::printf("%-6s %12s %12s\n", "run", "plain GB/s", "proxy GB/s");
  std::fflush(stdout);
  std::vector<std::string> args(argv, argv + argc);
  const std::string comm_id = address + ":" + std::to_string(20000 + getpid() % 20000);
  pid_t pids[2];
  for (int i = 0; i < 2; ++i) {
    const std::vector<std::string> vars{std::string(kRoleVar) + "=" + (i == 0 ? "recv" : "send"),
                                        "NCCL_SOCKET_IFNAME==" + interface[i],
                                        "NCCL_COMM_ID=" + comm_id};
    pids[i] = hosts ? hosts->spawn(i, args, vars)
                    : efccl_test::NetworkNamespaces::spawn_in("", args, vars);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}
