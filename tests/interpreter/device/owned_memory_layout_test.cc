// Executor-owned memory of a rank (interpreter/device/src/owned_memory_layout.h): scratch, then
// the program buffers the API does not provide, each 256-byte aligned, and every size derived
// from the program checked for overflow.
#include "owned_memory_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace efccl::device {
namespace {

/// A 2-rank reduce to rank 0 (nchunksperloop 2): every rank has an input of 2 chunks, an
/// output of 2 chunks (the API provides it only at the root) and `scratch` scratch chunks.
ef::Program reduce_program(int64_t scratch) {
  ef::Program p;
  p.name = "reduce";
  p.collective = ef::Collective::kReduce;
  p.nranks = 2;
  p.nchunksperloop = 2;
  p.root = 0;
  for (int r = 0; r < 2; ++r) {
    ef::Rank rank;
    rank.input_chunks = 2;
    rank.output_chunks = 2;
    rank.scratch_chunks = scratch;
    p.ranks.push_back(rank);
  }
  return p;
}

TEST(OwnedMemoryLayout, ScratchThenBuffersTheApiDoesNotProvide) {
  const ef::Program p = reduce_program(3);
  // count 100 floats: 50 elements per chunk.
  auto root = owned_memory_layout(p, 0, 50, 100, 4);
  ASSERT_TRUE(root.is_ok()) << root.status().message();
  EXPECT_EQ(root->input_elements, 100u);
  EXPECT_EQ(root->output_elements, 100u);
  EXPECT_EQ(root->scratch_bytes, 768u);  // 600 bytes, aligned to 256
  EXPECT_FALSE(root->input_offset);      // the API's buffers
  EXPECT_FALSE(root->output_offset);
  EXPECT_EQ(root->bytes, 768u);

  auto other = owned_memory_layout(p, 1, 50, 100, 4);
  ASSERT_TRUE(other.is_ok()) << other.status().message();
  EXPECT_FALSE(other->input_offset);
  ASSERT_TRUE(other->output_offset);  // NCCL ignores a non-root's output: the executor owns it
  EXPECT_EQ(*other->output_offset, 768u);
  EXPECT_EQ(other->bytes, 768u + 512u);  // 400 bytes of output, aligned
}

TEST(OwnedMemoryLayout, ScratchChunksThatOverflowAreAnError) {
  // Validation accepts 10^12 scratch chunks; 2^25 floats per chunk make 2^65 bytes.
  const ef::Program p = reduce_program(1'000'000'000'000);
  const uint64_t chunk = uint64_t{1} << 25;
  auto layout = owned_memory_layout(p, 1, chunk, 2 * chunk, 4);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_EQ(layout.status().message(),
            "rank 1: the program's scratch buffer of 1000000000000 chunks of 33554432 elements of "
            "4 bytes overflows 64-bit sizes");
  // 10^12 * 2^25 elements do not fit in 64 bits either: one-byte elements overflow too.
  EXPECT_FALSE(owned_memory_layout(p, 1, chunk, 2 * chunk, 1).is_ok());
  // Small chunks fit.
  auto small = owned_memory_layout(p, 1, 1, 2, 8);
  ASSERT_TRUE(small.is_ok()) << small.status().message();
  EXPECT_EQ(small->scratch_bytes, 8'000'000'000'000u);
}

TEST(OwnedMemoryLayout, AlignmentThatOverflowsIsAnError) {
  // Exactly 2^64 - 8 bytes of scratch: the bytes fit, rounding up to 256 does not.
  ef::Program p = reduce_program(1);
  p.ranks[0].input_chunks = p.ranks[0].output_chunks = 0;
  const uint64_t elements = (~uint64_t{0} - 7) / 8;
  auto layout = owned_memory_layout(p, 0, elements, 2 * elements, 8);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("scratch buffer"), std::string::npos)
      << layout.status().message();
}

TEST(OwnedMemoryLayout, InputAndOutputSizesAreCheckedToo) {
  ef::Program p = reduce_program(0);
  p.ranks[1].input_chunks = int64_t{1} << 40;  // as many chunks as validation admits
  auto layout = owned_memory_layout(p, 1, uint64_t{1} << 22, uint64_t{1} << 23, 8);
  ASSERT_FALSE(layout.is_ok());
  EXPECT_NE(layout.status().message().find("rank 1: the program's input buffer of 1099511627776 "
                                           "chunks"),
            std::string::npos)
      << layout.status().message();
}

TEST(OwnedMemoryLayout, ApiBuffersThatOverflowAreAnError) {
  // 2^62 elements of 8 bytes in the root's API buffers.
  const ef::Program p = reduce_program(0);
  const uint64_t count = uint64_t{1} << 62;
  auto layout = owned_memory_layout(p, 0, 1, count, 8);
  ASSERT_FALSE(layout.is_ok());
  // The program's buffers (2 chunks of 1 element) fit; the API's do not.
  EXPECT_NE(layout.status().message().find("API buffer"), std::string::npos)
      << layout.status().message();
}

TEST(OwnedMemoryLayout, UsesOfABatchAreChecked) {
  auto fits = owned_bytes_for_uses(8, 1024);
  ASSERT_TRUE(fits.is_ok());
  EXPECT_EQ(*fits, 8192u);
  auto overflows = owned_bytes_for_uses(32, uint64_t{1} << 60);
  ASSERT_FALSE(overflows.is_ok());
  EXPECT_EQ(overflows.status().message(),
            "32 uses of 1152921504606846976 bytes of executor-owned memory overflow 64-bit sizes");
}

}  // namespace
}  // namespace efccl::device
