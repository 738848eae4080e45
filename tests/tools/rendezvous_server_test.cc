// efccl-mprun's rendezvous server (tools/mprun/src/rendezvous_server.h) driven directly: idle
// connections neither take a rank's place nor outlive the HELLO deadline, hostile lines are
// refused with a count, and the registered ranks get their peer list.
#include "rendezvous_server.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <thread>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/socket.h"

namespace {

using efccl::mprun::RendezvousServer;
using efccl::net::Deadline;
using efccl::net::Fd;
using std::chrono::milliseconds;
using std::chrono::seconds;

/// Runs the server's loop (as the launcher does) on a thread until stopped.
class Serving {
 public:
  explicit Serving(RendezvousServer* server) : server_(server) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        std::vector<pollfd> fds;
        for (int fd : server_->fds()) fds.push_back({fd, POLLIN, 0});
        ::poll(fds.data(), fds.size(), 20);
        std::vector<RendezvousServer::Event> events;
        for (const pollfd& p : fds)
          if (p.revents != 0) server_->handle(p.fd, &events);
        server_->tick(&events);
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& e : events) warnings_.push_back(e.text);
      }
      std::vector<RendezvousServer::Event> events;
      server_->finish(&events);
      for (auto& e : events) warnings_.push_back(e.text);
    });
  }
  ~Serving() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }

 private:
  RendezvousServer* server_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> warnings_;
  std::thread thread_;
};

Fd connect(const RendezvousServer& server) {
  auto fd = efccl::net::connect_to(server.address(), Deadline::after(seconds(5)));
  EXPECT_TRUE(fd) << fd.status().message();
  return fd ? std::move(*fd) : Fd();
}

/// Registers rank `rank` of `size` and returns the reply line.
std::string register_rank(const RendezvousServer& server, Fd& fd, const std::string& job, int rank,
                          int size) {
  auto listen = efccl::net::SocketAddress::parse("127.0.0.1:" + std::to_string(40000 + rank));
  const std::string hello = efccl::mprun::format_hello({job, rank, size, *listen});
  EXPECT_TRUE(
      efccl::net::send_all(fd.get(), hello.data(), hello.size(), Deadline::after(seconds(5))));
  auto line =
      efccl::net::recv_line(fd.get(), efccl::mprun::kMaxLineSize, Deadline::after(seconds(10)));
  return line ? *line : "error: " + line.status().message();
}

TEST(RendezvousServer, IdleConnectionsDoNotTakeARanksPlace) {
  auto server = RendezvousServer::start(2, "job-key");
  ASSERT_TRUE(server) << server.status().message();
  Serving serving(&*server);
  std::vector<Fd> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(connect(*server));
  Fd rank0 = connect(*server), rank1 = connect(*server);
  std::string reply1;
  std::thread second([&] { reply1 = register_rank(*server, rank1, "job-key", 1, 2); });
  const std::string reply0 = register_rank(*server, rank0, "job-key", 0, 2);
  second.join();
  EXPECT_EQ(reply0, "PEERS 127.0.0.1:40000 127.0.0.1:40001");
  EXPECT_EQ(reply1, reply0);
  EXPECT_TRUE(server->complete());
  serving.stop();
  // The idle ones beyond the 64 kept were refused, reported with a count, not one line each.
  const auto warnings = serving.warnings();
  EXPECT_LE(warnings.size(), 3u);
  ASSERT_FALSE(warnings.empty());
  EXPECT_NE(warnings[0].find("refused a connection from 127.0.0.1:"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings.back().find("more connections since the last report"), std::string::npos)
      << warnings.back();
}

TEST(RendezvousServer, ConnectionsWithoutHelloExpire) {
  RendezvousServer::Limits limits;
  limits.hello_timeout = milliseconds(200);
  auto server = RendezvousServer::start(1, "job-key", limits);
  ASSERT_TRUE(server) << server.status().message();
  Serving serving(&*server);
  Fd silent = connect(*server);
  char buf[256];
  const auto line = efccl::net::recv_line(silent.get(), sizeof(buf), Deadline::after(seconds(5)));
  ASSERT_TRUE(line) << line.status().message();
  EXPECT_EQ(*line, "ERROR no HELLO within 200 ms");
  Fd rank0 = connect(*server);
  EXPECT_EQ(register_rank(*server, rank0, "job-key", 0, 1), "PEERS 127.0.0.1:40000");
}

TEST(RendezvousServer, StrangersAreToldWhyAndTheRanksStillMeet) {
  auto server = RendezvousServer::start(2, "job-key");
  ASSERT_TRUE(server) << server.status().message();
  Serving serving(&*server);
  Fd other_job = connect(*server);
  EXPECT_EQ(register_rank(*server, other_job, "\x1b[31mother", 0, 2),
            "ERROR HELLO from another job (key '\\x1b[31mother')");
  Fd wrong_size = connect(*server);
  EXPECT_EQ(register_rank(*server, wrong_size, "job-key", 0, 3),
            "ERROR rank 0 says the job has 3 ranks; efccl-mprun started 2");
  Fd rank0 = connect(*server), rank1 = connect(*server), twice = connect(*server);
  std::string reply1;
  std::thread second([&] { reply1 = register_rank(*server, rank1, "job-key", 1, 2); });
  const std::string reply0 = register_rank(*server, rank0, "job-key", 0, 2);
  second.join();
  EXPECT_EQ(reply0, "PEERS 127.0.0.1:40000 127.0.0.1:40001");
  EXPECT_EQ(register_rank(*server, twice, "job-key", 1, 2), "ERROR rank 1 registered twice");
  serving.stop();
  for (const std::string& w : serving.warnings())
    for (char c : w) EXPECT_TRUE(static_cast<unsigned char>(c) >= 0x20) << w;
}

}  // namespace
