// Sockets (efccl/net/socket.h): listening, the one accept loop, connecting with retries,
// whole-buffer and line I/O, each bounded by its deadline.
#include "efccl/net/socket.h"

#include <gtest/gtest.h>

#include <thread>

#include "net_test_util.h"

namespace {

using efccl::net::Deadline;
using efccl::net::Fd;
using efccl::net::SocketAddress;
using namespace net_test;

SocketAddress loopback(uint16_t port = 0) {
  auto a = SocketAddress::parse("127.0.0.1:1");
  EXPECT_TRUE(a);
  a->set_port(port);
  return *a;
}

TEST(Socket, ListenAcceptConnectAndTalk) {
  SocketAddress bound;
  auto listener = efccl::net::listen_on(loopback(), false, &bound);
  ASSERT_TRUE(listener) << listener.status().message();
  EXPECT_NE(bound.port(), 0);
  auto client = efccl::net::connect_to(bound, Deadline::after(seconds(5)));
  ASSERT_TRUE(client) << client.status().message();
  std::vector<Fd> accepted;
  std::vector<std::string> from;
  const auto deadline = in(seconds(5));
  while (accepted.empty() && Clock::now() < deadline) {
    ASSERT_TRUE(efccl::net::accept_pending(listener->get(), [&](Fd fd, const SocketAddress& a) {
      accepted.push_back(std::move(fd));
      from.push_back(a.to_string());
    }));
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_EQ(accepted.size(), 1u);
  auto local = efccl::net::local_address(client->get());
  ASSERT_TRUE(local);
  EXPECT_EQ(from[0], local->to_string());

  const std::string text = "two lines\nthe second\nrest";
  ASSERT_TRUE(
      efccl::net::send_all(client->get(), text.data(), text.size(), Deadline::after(seconds(5))));
  auto line = efccl::net::recv_line(accepted[0].get(), 100, Deadline::after(seconds(5)));
  ASSERT_TRUE(line) << line.status().message();
  EXPECT_EQ(*line, "two lines");
  auto second = efccl::net::recv_line(accepted[0].get(), 100, Deadline::after(seconds(5)));
  ASSERT_TRUE(second);
  EXPECT_EQ(*second, "the second");
  char rest[4] = {};
  ASSERT_TRUE(efccl::net::recv_all(accepted[0].get(), rest, 4, Deadline::after(seconds(5))));
  EXPECT_EQ(std::string(rest, 4), "rest");
  // Nothing more comes: the waits end at their deadlines.
  const auto t0 = Clock::now();
  auto none = efccl::net::recv_line(accepted[0].get(), 100, Deadline::after(milliseconds(100)));
  ASSERT_FALSE(none);
  EXPECT_TRUE(contains(none.status().message(), "timed out")) << none.status().message();
  EXPECT_LT(seconds_since(t0), 2.0);
  // A line longer than allowed, and the end of the stream.
  const std::string long_line(300, 'x');
  ASSERT_TRUE(efccl::net::send_all(client->get(), long_line.data(), long_line.size(),
                                   Deadline::after(seconds(5))));
  auto too_long = efccl::net::recv_line(accepted[0].get(), 100, Deadline::after(seconds(5)));
  ASSERT_FALSE(too_long);
  EXPECT_TRUE(contains(too_long.status().message(), "longer than 100"))
      << too_long.status().message();
  client->reset();
  char c;
  auto eof = efccl::net::recv_all(accepted[0].get(), &c, 1, Deadline::after(seconds(5)));
  // Bytes of the long line may still be queued: read until the end of stream is reported.
  while (eof) eof = efccl::net::recv_all(accepted[0].get(), &c, 1, Deadline::after(seconds(5)));
  EXPECT_TRUE(contains(eof.message(), "closed by the other side")) << eof.message();
}

TEST(Socket, AFreePortLiesBelowTheEphemeralRangeAndCanBeBound) {
  // efccl-mprun's MASTER_PORT: outside the range the kernel takes outgoing connections' local
  // ports from, so that none of them takes it before torch's store binds it.
  const uint16_t ephemeral = efccl::net::first_ephemeral_port();
  for (int i = 0; i < 20; ++i) {
    auto port = efccl::net::free_port(loopback());
    ASSERT_TRUE(port) << port.status().message();
    if (ephemeral > 10001) {
      EXPECT_GE(*port, 10000);
      EXPECT_LT(*port, ephemeral);
    }
    SocketAddress bound;
    EXPECT_TRUE(efccl::net::listen_on(loopback(*port), true, &bound)) << *port;
  }
}

TEST(Socket, ConnectRetriesUntilSomeoneListensOrTheDeadline) {
  auto port = efccl::net::free_port(loopback());
  ASSERT_TRUE(port) << port.status().message();
  const auto t0 = Clock::now();
  auto refused = efccl::net::connect_to(loopback(*port), Deadline::after(milliseconds(200)));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.status().message(), "connecting to 127.0.0.1:"))
      << refused.status().message();
  EXPECT_GE(seconds_since(t0), 0.15);
  EXPECT_LT(seconds_since(t0), 2.0);
  // A listener that appears later is found.
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(100));
    SocketAddress bound;
    auto listener = efccl::net::listen_on(loopback(*port), true, &bound);
    ASSERT_TRUE(listener) << listener.status().message();
    std::this_thread::sleep_for(milliseconds(500));
  });
  auto connected = efccl::net::connect_to(loopback(*port), Deadline::after(seconds(5)));
  late.join();
  EXPECT_TRUE(connected) << connected.status().message();
  // An abort flag ends the retries.
  std::atomic<bool> abort{true};
  auto aborted = efccl::net::connect_to(loopback(*port), Deadline::after(seconds(5)), &abort);
  ASSERT_FALSE(aborted);
}

TEST(Socket, ListeningOnANonIpAddressFails) {
  SocketAddress none;
  auto listener = efccl::net::listen_on(none, false, nullptr);
  ASSERT_FALSE(listener);
  EXPECT_TRUE(contains(listener.status().message(), "not an IP address"))
      << listener.status().message();
}

}  // namespace
