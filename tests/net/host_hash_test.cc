// The host identity (efccl/net/host_hash.h).
#include "efccl/net/host_hash.h"

#include <gtest/gtest.h>

#include "net_test_util.h"

namespace {

TEST(HostHash, IsStableAndHonoursHostId) {
  const uint64_t h = efccl::net::host_hash();
  EXPECT_NE(h, 0u);
  EXPECT_EQ(h, efccl::net::host_hash());
  net_test::ScopedEnv id("NCCL_HOSTID", "some-other-host");
  EXPECT_NE(efccl::net::host_hash(), h);
}

}  // namespace
