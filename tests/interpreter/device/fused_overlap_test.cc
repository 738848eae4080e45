// calls_overlapping_others (fused_overlap.h): which calls of a fused launch must keep their
// slots because another call of the launch touches their bytes.
#include "fused_overlap.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace efccl::device {
namespace {

std::vector<bool> overlapping(const std::vector<std::vector<ByteRange>>& calls) {
  std::vector<const std::vector<ByteRange>*> pointers;
  for (const auto& c : calls) pointers.push_back(&c);
  return calls_overlapping_others(pointers);
}

TEST(FusedOverlap, DisjointCallsKeepDirectTransfers) {
  EXPECT_EQ(overlapping({{{0, 100}, {100, 200}}, {{200, 300}}, {{1000, 1001}}}),
            (std::vector<bool>{false, false, false}));
  EXPECT_TRUE(overlapping({}).empty());
}

TEST(FusedOverlap, ACallsOwnAliasingDoesNotCount) {
  // In place: a rank's input and output are the same bytes; or a call that prepare() kept on
  // slots because two of its ranks share memory.
  EXPECT_EQ(overlapping({{{0, 100}, {0, 100}, {50, 150}}, {{150, 200}}}),
            (std::vector<bool>{false, false}));
}

TEST(FusedOverlap, EitherSideOfAnOverlapIsMarked) {
  // A slots-only call (say a premultiplying one, which still lists its buffers) reading bytes
  // that a later direct call writes: both are marked, so the direct one keeps its slots.
  EXPECT_EQ(overlapping({{{0, 100}}, {{200, 300}, {99, 120}}, {{400, 500}}}),
            (std::vector<bool>{true, true, false}));
  // A range inside another; touching ends don't overlap.
  EXPECT_EQ(overlapping({{{0, 1000}}, {{10, 20}}, {{1000, 2000}}}),
            (std::vector<bool>{true, true, false}));
  // Empty ranges never overlap.
  EXPECT_EQ(overlapping({{{50, 50}}, {{0, 100}}}), (std::vector<bool>{false, false}));
}

TEST(FusedOverlap, MatchesEveryPairCompared) {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 500; ++round) {
    const int ncalls = 1 + static_cast<int>(rng() % 6);
    std::vector<std::vector<ByteRange>> calls(ncalls);
    for (auto& c : calls) {
      const int n = static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        const uintptr_t begin = rng() % 1000, length = rng() % 100;
        c.emplace_back(begin, begin + length);
      }
    }
    std::vector<bool> expected(ncalls, false);
    for (int i = 0; i < ncalls; ++i)
      for (int j = 0; j < ncalls; ++j)
        if (i != j)
          for (const auto& a : calls[i])
            for (const auto& b : calls[j])
              if (a.first < a.second && b.first < b.second && a.first < b.second &&
                  b.first < a.second)
                expected[i] = true;
    ASSERT_EQ(overlapping(calls), expected) << "round " << round;
  }
}

}  // namespace
}  // namespace efccl::device
