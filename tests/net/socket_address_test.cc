// Socket addresses (efccl/net/socket_address.h): NCCL_COMM_ID's syntax, numeric-only parsing for
// text from peers, and the zeroed 28-byte form the wire and the unique id carry.
#include "efccl/net/socket_address.h"

#include <gtest/gtest.h>

#include "net_test_util.h"

namespace {

using efccl::net::SocketAddress;
using namespace net_test;

TEST(SocketAddress, ResolvesNcclCommIdSyntax) {
  using efccl::net::resolve_socket_address;
  auto v4 = resolve_socket_address("127.0.0.1:4242");
  ASSERT_TRUE(v4) << v4.status().message();
  EXPECT_EQ(*v4, "127.0.0.1:4242");
  auto v6 = resolve_socket_address("[::1]:80");
  ASSERT_TRUE(v6) << v6.status().message();
  EXPECT_EQ(*v6, "[::1]:80");
  auto bare6 = resolve_socket_address("::1:81");
  ASSERT_TRUE(bare6) << bare6.status().message();
  EXPECT_EQ(*bare6, "[::1]:81");
  auto named = resolve_socket_address("localhost:99");
  ASSERT_TRUE(named) << named.status().message();
  EXPECT_TRUE(*named == "127.0.0.1:99" || *named == "[::1]:99") << *named;
  for (const char* bad : {"", "1.2.3.4", "1.2.3.4:", "1.2.3.4:0", "1.2.3.4:65536", "1.2.3.4:http",
                          "[::1]80", "[::1", "no-such-host.invalid:80"}) {
    auto r = resolve_socket_address(bad);
    EXPECT_FALSE(r) << bad << " resolved to " << *r;
  }
}

TEST(SocketAddress, NumericOnlyNeverResolvesNames) {
  const auto numeric = SocketAddress::Lookup::kNumericOnly;
  auto v4 = SocketAddress::parse("10.1.2.3:7", AF_UNSPEC, numeric);
  ASSERT_TRUE(v4) << v4.status().message();
  EXPECT_EQ(v4->family(), AF_INET);
  EXPECT_EQ(v4->port(), 7);
  EXPECT_EQ(v4->to_string(), "10.1.2.3:7");
  EXPECT_EQ(v4->host_string(), "10.1.2.3");
  auto v6 = SocketAddress::parse("[fd00::2]:9", AF_UNSPEC, numeric);
  ASSERT_TRUE(v6) << v6.status().message();
  EXPECT_EQ(v6->to_string(), "[fd00::2]:9");
  auto named = SocketAddress::parse("localhost:99", AF_UNSPEC, numeric);
  ASSERT_FALSE(named);
  EXPECT_TRUE(contains(named.status().message(), "'localhost' is not an IP address"))
      << named.status().message();
  EXPECT_FALSE(SocketAddress::parse(std::string("1.2.3.4\0x:5", 11), AF_UNSPEC, numeric));
  EXPECT_FALSE(SocketAddress::parse("10.1.2.3:7", AF_INET6, numeric)) << "family respected";
}

TEST(SocketAddress, ScopedAddressesSurviveToStringAndParse) {
  // A scope id on an address that is not link-local, as a fuzzer found in an mprun PEERS line:
  // written by name ("lo") it would not parse back. Written as a number, it does, whatever the
  // address.
  const auto numeric = SocketAddress::Lookup::kNumericOnly;
  for (const char* text : {"[::%1]:2", "[fe80::1%1]:3", "[fd00::2%7]:9"}) {
    auto a = SocketAddress::parse(text, AF_UNSPEC, numeric);
    ASSERT_TRUE(a) << text << ": " << a.status().message();
    EXPECT_EQ(a->to_string(), text);
    auto again = SocketAddress::parse(a->to_string(), AF_UNSPEC, numeric);
    ASSERT_TRUE(again) << a->to_string() << ": " << again.status().message();
    EXPECT_TRUE(*again == *a) << text;
  }
}

TEST(SocketAddress, EqualAddressesHaveEqualBytes) {
  auto a = SocketAddress::parse("127.0.0.1:4242");
  auto b = SocketAddress::parse("127.0.0.1:4242");
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(*a == *b);
  EXPECT_EQ(std::memcmp(&*a, &*b, sizeof(SocketAddress)), 0);
  SocketAddress none;
  EXPECT_FALSE(none.valid());
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&none);
  for (std::size_t i = 0; i < sizeof(none); ++i) EXPECT_EQ(bytes[i], 0) << i;
  SocketAddress other = *a;
  other.set_port(1);
  EXPECT_FALSE(other == *a);
  EXPECT_EQ(other.port(), 1);
  EXPECT_EQ(a->length(), sizeof(sockaddr_in));
}

TEST(SocketAddress, SocketFamilyFromEnvironment) {
  {
    ScopedEnv family("NCCL_SOCKET_FAMILY", "AF_INET6");
    EXPECT_EQ(efccl::net::socket_family_from_env(), AF_INET6);
  }
  {
    ScopedEnv family("NCCL_SOCKET_FAMILY", "ipv4");
    EXPECT_EQ(efccl::net::socket_family_from_env(), AF_INET);
  }
  {
    ScopedEnv family("NCCL_SOCKET_FAMILY", "carrier-pigeon");
    EXPECT_EQ(efccl::net::socket_family_from_env(), AF_UNSPEC);
  }
  ScopedEnv family("NCCL_SOCKET_FAMILY", nullptr);
  EXPECT_EQ(efccl::net::socket_family_from_env(), AF_UNSPEC);
}

}  // namespace
