// Throttled reports of refused connections (efccl/net/refusal_report.h).
#include "efccl/net/refusal_report.h"

#include <gtest/gtest.h>

namespace {

using efccl::net::RefusalReport;
using Clock = RefusalReport::Clock;
using std::chrono::milliseconds;

TEST(RefusalReport, FirstAtOnceThenACountPerInterval) {
  RefusalReport report("root at X", milliseconds(1000));
  const Clock::time_point t0 = Clock::now();
  auto first = report.refused("1.2.3.4:5", "wrong magic", t0);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, "root at X: refused a connection from 1.2.3.4:5: wrong magic");
  for (int i = 0; i < 999; ++i)
    EXPECT_FALSE(report.refused("1.2.3.4:" + std::to_string(i), "garbage", t0 + milliseconds(i)));
  EXPECT_FALSE(report.flush(t0 + milliseconds(999)));
  auto summary = report.flush(t0 + milliseconds(1000));
  ASSERT_TRUE(summary);
  EXPECT_EQ(*summary,
            "root at X: refused 999 more connections since the last report (the latest from "
            "1.2.3.4:998: garbage)");
  EXPECT_FALSE(report.flush(t0 + milliseconds(5000))) << "nothing new to report";
  EXPECT_EQ(report.total(), 1000u);
  // After a quiet interval the next refusal is reported at once again.
  auto later = report.refused("5.6.7.8:9", "no hello", t0 + milliseconds(5000));
  ASSERT_TRUE(later);
  EXPECT_EQ(*later, "root at X: refused a connection from 5.6.7.8:9: no hello");
}

TEST(RefusalReport, CountCarriedIntoTheNextLine) {
  RefusalReport report("server", milliseconds(100));
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(report.refused("a", "x", t0));
  EXPECT_FALSE(report.refused("b", "y", t0 + milliseconds(10)));
  auto next = report.refused("c", "z", t0 + milliseconds(200));
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, "server: refused a connection from c: z (and 1 more since the last report)");
  EXPECT_FALSE(report.flush(t0 + milliseconds(1000)));
  // A server that stops reports what it counted at once.
  EXPECT_FALSE(report.refused("d", "w", t0 + milliseconds(210)));
  EXPECT_FALSE(report.flush(t0 + milliseconds(220)));
  auto last = report.flush_final(t0 + milliseconds(220));
  ASSERT_TRUE(last);
  EXPECT_EQ(*last,
            "server: refused 1 more connection since the last report (the latest from d: w)");
  EXPECT_FALSE(report.flush_final(t0 + milliseconds(230)));
}

}  // namespace
