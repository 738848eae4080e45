// Interfaces (efccl/net/interfaces.h): NCCL_SOCKET_IFNAME's syntax and the choice of interface.
#include "efccl/net/interfaces.h"

#include <gtest/gtest.h>
#include <net/if.h>

#include "net_test_util.h"

namespace {

using efccl::net::interface_matches;
using namespace net_test;

TEST(Interfaces, NamesMatchLikeNccl) {
  EXPECT_TRUE(interface_matches("eth", "eth0"));
  EXPECT_TRUE(interface_matches("ib,eth", "eth1"));
  EXPECT_FALSE(interface_matches("ib,eth", "lo"));
  EXPECT_FALSE(interface_matches("^docker,lo", "docker0"));
  EXPECT_FALSE(interface_matches("^docker,lo", "lo"));
  EXPECT_TRUE(interface_matches("^docker,lo", "eth0"));
  EXPECT_TRUE(interface_matches("=eth0", "eth0"));
  EXPECT_FALSE(interface_matches("=eth0", "eth01"));
  EXPECT_FALSE(interface_matches("^=eth0", "eth0"));
  EXPECT_TRUE(interface_matches("^=eth0", "eth01"));
  EXPECT_TRUE(interface_matches("eth0:1234", "eth0"));
  EXPECT_FALSE(interface_matches("", "eth0"));
}

TEST(Interfaces, LoopbackIsListedAndChosenWhenAsked) {
  bool loopback = false;
  for (const auto& i : efccl::net::list_interfaces(AF_INET))
    if ((i.flags & IFF_LOOPBACK) != 0 && i.address.host_string() == "127.0.0.1") loopback = true;
  EXPECT_TRUE(loopback);
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", "=lo");
  ScopedEnv family("NCCL_SOCKET_FAMILY", "AF_INET");
  auto chosen = efccl::net::choose_interface(nullptr);
  ASSERT_TRUE(chosen) << chosen.status().message();
  EXPECT_EQ(chosen->name, "lo");
  EXPECT_EQ(chosen->describe(), "lo 127.0.0.1");
  auto near = efccl::net::SocketAddress::parse("127.0.0.9:5");
  ASSERT_TRUE(near);
  EXPECT_TRUE(chosen->on_subnet(*near));
}

TEST(Interfaces, NoMatchIsNamed) {
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", "no_such_if");
  auto chosen = efccl::net::choose_interface(nullptr);
  ASSERT_FALSE(chosen);
  EXPECT_TRUE(contains(chosen.status().message(),
                       "NCCL_SOCKET_IFNAME=no_such_if selects no network interface"))
      << chosen.status().message();
}

}  // namespace
