// Deadlines (efccl/net/deadline.h): the budget they were made with, and poll(2) timeouts.
#include "efccl/net/deadline.h"

#include <gtest/gtest.h>

#include <thread>

namespace {

using efccl::net::Deadline;
using std::chrono::milliseconds;

TEST(Deadline, RemembersItsBudget) {
  const Deadline d = Deadline::after(milliseconds(3000));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(d.budget(), milliseconds(3000));
  EXPECT_LE(d.left(), milliseconds(2981));
  EXPECT_GT(d.left(), milliseconds(2000));
  EXPECT_FALSE(d.expired());
  const Deadline same_point(d.when());
  EXPECT_EQ(same_point.when(), d.when());
  EXPECT_LE(same_point.budget(), milliseconds(2981)) << "a time point's budget is what was left";
}

TEST(Deadline, NeverAndExpired) {
  const Deadline never;
  EXPECT_TRUE(never.is_never());
  EXPECT_FALSE(never.expired());
  EXPECT_EQ(never.poll_ms(), -1);
  EXPECT_EQ(never.poll_ms(10), 10);
  EXPECT_EQ(never.when(), Deadline::Clock::time_point::max());
  const Deadline past = Deadline::after(milliseconds(0));
  EXPECT_TRUE(past.expired());
  EXPECT_EQ(past.poll_ms(), 0);
  EXPECT_EQ(past.left(), milliseconds(0));
  const Deadline soon = Deadline::after(milliseconds(50000));
  EXPECT_LE(soon.poll_ms(10), 10);
  EXPECT_GT(soon.poll_ms(), 40000);
  EXPECT_EQ(soon.earlier(never).when(), soon.when());
  EXPECT_EQ(never.earlier(soon).when(), soon.when());
  EXPECT_EQ(soon.earlier(past).when(), past.when());
}

}  // namespace
