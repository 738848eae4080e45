// efccl-mprun's line protocol (efccl/mprun/rendezvous.h): round trips, and lines from strangers
// rejected with their bytes escaped and bounded.
#include "efccl/mprun/rendezvous.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using namespace efccl::mprun;
using efccl::net::SocketAddress;

SocketAddress address(const char* text) {
  auto a = SocketAddress::parse(text, AF_UNSPEC, SocketAddress::Lookup::kNumericOnly);
  EXPECT_TRUE(a) << text;
  return *a;
}

bool printable_only(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) return false;
  return true;
}

TEST(Rendezvous, LinesRoundTrip) {
  const std::string hello = format_hello({"key", 2, 4, address("127.0.0.1:4242")});
  EXPECT_EQ(hello, "HELLO key 2 4 127.0.0.1:4242\n");
  auto parsed = parse_hello(hello.substr(0, hello.size() - 1));
  ASSERT_TRUE(parsed) << parsed.status().message();
  EXPECT_EQ(parsed->job, "key");
  EXPECT_EQ(parsed->rank, 2);
  EXPECT_EQ(parsed->size, 4);
  EXPECT_EQ(parsed->listen.to_string(), "127.0.0.1:4242");

  const std::string peers = format_peers({address("127.0.0.1:1"), address("[::1]:2")});
  EXPECT_EQ(peers, "PEERS 127.0.0.1:1 [::1]:2\n");
  auto list = parse_peers(peers.substr(0, peers.size() - 1), 2);
  ASSERT_TRUE(list) << list.status().message();
  EXPECT_EQ((*list)[1].to_string(), "[::1]:2");
  auto error = parse_peers(format_error("no\nway").substr(0, 12), 2);
  ASSERT_FALSE(error);
  EXPECT_EQ(error.status().message(), "no way");

  auto abort = parse_abort("ABORT 3 7");
  ASSERT_TRUE(abort);
  EXPECT_EQ(abort->first, 3);
  EXPECT_EQ(abort->second, 7);
  EXPECT_EQ(format_abort(3, 7), "ABORT 3 7\n");
}

TEST(Rendezvous, RejectedLinesAreEscapedAndBounded) {
  const std::string evil = "\x1b[2J\x1b]0;owned\x07" + std::string(5000, 'A');
  for (const auto& message : {parse_hello(evil).status().message(),
                              parse_hello("HELLO k \x1b 2 1.2.3.4:5").status().message(),
                              parse_peers(evil, 2).status().message(),
                              parse_peers("ERROR \x1b[31mred", 2).status().message(),
                              parse_abort(evil).status().message()}) {
    EXPECT_TRUE(printable_only(message)) << message;
    EXPECT_LT(message.size(), 400u) << message;
  }
  EXPECT_NE(parse_hello(evil).status().message().find("\\x1b[2J"), std::string::npos);
  EXPECT_EQ(parse_peers("ERROR \x1b[31mred", 2).status().message(), "\\x1b[31mred");
}

TEST(Rendezvous, AddressesAreNumericOnly) {
  auto named = parse_hello("HELLO k 0 2 localhost:5");
  ASSERT_FALSE(named);
  EXPECT_NE(named.status().message().find("not an IP address"), std::string::npos)
      << named.status().message();
  EXPECT_FALSE(parse_peers("PEERS example.com:1", 1));
  EXPECT_FALSE(parse_hello("HELLO k 0 2 1.2.3.4:0"));
  EXPECT_FALSE(parse_hello("HELLO k 2 2 1.2.3.4:5"));
  EXPECT_FALSE(parse_hello("HELLO k 0 5000 1.2.3.4:5"));
  EXPECT_FALSE(parse_peers("PEERS 1.2.3.4:5", 2));
  EXPECT_FALSE(parse_peers("PEERS 1.2.3.4:5", -1));
}

}  // namespace
