// The runtime's environment settings (base/settings.h): defaults, accepted values, and bad
// values falling back to the default (with a warning) instead of being taken or ignored.
#include "base/settings.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "scoped_env.h"

namespace efccl::runtime {
namespace {

TEST(RuntimeSettings, ServeMinBytesDefaultsToEveryCallWithoutMpsAnd64KiBUnderIt) {
  ScopedEnv unset("EFCCL_SERVE_MIN_BYTES", nullptr);
  EXPECT_EQ(serve_min_bytes(false), 0u);
  EXPECT_EQ(serve_min_bytes(true), std::size_t{64} << 10);
}

TEST(RuntimeSettings, ServeMinBytesTakesZeroUpToTwoToTheForty) {
  {
    ScopedEnv zero("EFCCL_SERVE_MIN_BYTES", "0");
    EXPECT_EQ(serve_min_bytes(true), 0u);  // serve every call, also under MPS
  }
  {
    ScopedEnv most("EFCCL_SERVE_MIN_BYTES", "1099511627776");  // 2^40
    EXPECT_EQ(serve_min_bytes(false), std::size_t{1} << 40);
  }
  ScopedEnv some("EFCCL_SERVE_MIN_BYTES", "65536");
  EXPECT_EQ(serve_min_bytes(false), 65536u);
  EXPECT_EQ(serve_min_bytes(true), 65536u);
}

TEST(RuntimeSettings, BadServeMinBytesFallBackToTheDefault) {
  for (const char* bad : {"-1", "abc", "12k", " 5", "+5", "1099511627777"}) {  // 2^40 + 1
    SCOPED_TRACE(bad);
    ScopedEnv env("EFCCL_SERVE_MIN_BYTES", bad);
    EXPECT_EQ(serve_min_bytes(true), std::size_t{64} << 10);
    EXPECT_EQ(serve_min_bytes(false), 0u);
  }
}

TEST(RuntimeSettings, ServeProcessesIsOneZeroOrAuto) {
  const struct {
    const char* value;
    int want;
  } cases[] = {{nullptr, -1}, {"", -1}, {"auto", -1}, {"1", 1}, {"0", 0}, {"yes", -1}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.value == nullptr ? "(unset)" : c.value);
    ScopedEnv env("EFCCL_SERVE_PROCESSES", c.value);
    EXPECT_EQ(serve_processes_setting(), c.want);
  }
}

TEST(RuntimeSettings, PositiveSettingsRefuseZeroAndSigns) {
  for (const char* bad : {"0", "-5", "+5", "x"}) {
    SCOPED_TRACE(bad);
    ScopedEnv env("EFCCL_TIMEOUT_MS", bad);
    EXPECT_EQ(call_timeout(), std::chrono::milliseconds(600000));
  }
  ScopedEnv good("EFCCL_TIMEOUT_MS", "250");
  EXPECT_EQ(call_timeout(), std::chrono::milliseconds(250));
}

}  // namespace
}  // namespace efccl::runtime
