// NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD as NCCL reads them (efccl/net/proxy_settings.h).
#include "efccl/net/proxy_settings.h"

#include <gtest/gtest.h>

#include "net_test_util.h"

namespace {

using efccl::net::Interface;
using efccl::net::ProxySettings;
using net_test::ScopedEnv;

Interface loopback() {
  Interface i;
  i.name = "lo";
  return i;
}

TEST(ProxySettings, DefaultsToOneThreadAndOneSocket) {
  ScopedEnv t("NCCL_SOCKET_NTHREADS", nullptr), s("NCCL_NSOCKS_PERTHREAD", nullptr);
  const ProxySettings p = ProxySettings::for_interface(loopback());
  EXPECT_EQ(p.nthreads, 1);
  EXPECT_EQ(p.nsocks_per_thread, 1);
  EXPECT_EQ(p.sockets_per_connection(), 1);
}

TEST(ProxySettings, ReadsTheVariables) {
  ScopedEnv t("NCCL_SOCKET_NTHREADS", "4"), s("NCCL_NSOCKS_PERTHREAD", "2");
  const ProxySettings p = ProxySettings::for_interface(loopback());
  EXPECT_EQ(p.nthreads, 4);
  EXPECT_EQ(p.nsocks_per_thread, 2);
  EXPECT_EQ(p.sockets_per_connection(), 8);
  EXPECT_NE(p.describe().find("4 thread(s) x 2 socket(s)"), std::string::npos) << p.describe();
}

TEST(ProxySettings, ClampsToNcclsBounds) {
  {
    ScopedEnv t("NCCL_SOCKET_NTHREADS", "40"), s("NCCL_NSOCKS_PERTHREAD", "1");
    EXPECT_EQ(ProxySettings::for_interface(loopback()).nthreads, 16);
  }
  {
    ScopedEnv t("NCCL_SOCKET_NTHREADS", "3"), s("NCCL_NSOCKS_PERTHREAD", "64");
    const ProxySettings p = ProxySettings::for_interface(loopback());
    EXPECT_EQ(p.nthreads, 3);
    EXPECT_EQ(p.nsocks_per_thread, 21);  // 64 sockets at most per connection
    EXPECT_LE(p.sockets_per_connection(), 64);
  }
  {
    ScopedEnv t("NCCL_SOCKET_NTHREADS", "0"), s("NCCL_NSOCKS_PERTHREAD", "-5");
    const ProxySettings p = ProxySettings::for_interface(loopback());
    EXPECT_EQ(p.nthreads, 1);
    EXPECT_EQ(p.nsocks_per_thread, 1);
  }
}

TEST(ProxySettings, AnUnreadableValueMeansTheDefault) {
  net_test::LogCapture log;  // sees every line, whatever NCCL_DEBUG says
  ScopedEnv t("NCCL_SOCKET_NTHREADS", "lots"), s("NCCL_NSOCKS_PERTHREAD", "-2");
  const ProxySettings p = ProxySettings::for_interface(loopback());
  EXPECT_EQ(p.nthreads, 1);
  EXPECT_EQ(p.nsocks_per_thread, 1);
  EXPECT_EQ(log.count("NCCL_SOCKET_NTHREADS=lots is not an integer"), 1);
}

TEST(ProxySettings, FromTheEnvironmentHonoursTheInterfaceChoice) {
  ScopedEnv i("NCCL_SOCKET_IFNAME", "=lo"), f("NCCL_SOCKET_FAMILY", "AF_INET");
  auto p = ProxySettings::from_environment();
  ASSERT_TRUE(p) << p.status().message();
  EXPECT_EQ(p->interface.name, "lo");
  ScopedEnv none("NCCL_SOCKET_IFNAME", "=no-such-interface");
  auto q = ProxySettings::from_environment();
  ASSERT_FALSE(q);
  EXPECT_NE(q.status().message().find("no-such-interface"), std::string::npos);
}

}  // namespace
