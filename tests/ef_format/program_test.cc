// Chunk arithmetic, API buffer sizes and in-place aliasing per collective (ef-format.md §2).
#include "efccl/ef/program.h"

#include <gtest/gtest.h>

#include "efccl/ef/datatype.h"

namespace efccl::ef {
namespace {

Program shaped(Collective c, int nranks, int64_t nchunks, int root = 0) {
  Program p;
  p.collective = c;
  p.nranks = nranks;
  p.nchunksperloop = nchunks;
  p.root = root;
  p.ranks.resize(static_cast<std::size_t>(nranks));
  return p;
}

TEST(ChunkElements, AllReduceCutsCountIntoChunks) {
  auto p = shaped(Collective::kAllReduce, 8, 256);
  EXPECT_EQ(chunk_elements(p, 512), 2u);
  EXPECT_EQ(chunk_elements(p, 0), 0u);
  EXPECT_FALSE(chunk_elements(p, 100).has_value());  // not a multiple of 256
  EXPECT_EQ(count_granularity(p), 256u);
}

TEST(ChunkElements, PerBlockCollectivesMultiplyByRanks) {
  // MSCCL's rule: allgather/reducescatter/alltoall count is per block, total = count * n.
  auto p = shaped(Collective::kAllToAll, 8, 32);
  EXPECT_EQ(chunk_elements(p, 4), 1u);   // 4*8 / 32
  EXPECT_FALSE(chunk_elements(p, 3).has_value());
  EXPECT_EQ(count_granularity(p), 4u);   // 32 / gcd(32, 8)
  auto g = shaped(Collective::kAllGather, 3, 6);
  EXPECT_EQ(count_granularity(g), 2u);
  EXPECT_EQ(chunk_elements(g, 2), 1u);
}

TEST(ChunkElements, OverflowIsNotCovered) {
  auto p = shaped(Collective::kAllGather, 8, 8);
  EXPECT_FALSE(chunk_elements(p, UINT64_MAX / 2).has_value());
}

TEST(ApiElements, RootedCollectivesHaveNoBufferOffRoot) {
  auto reduce = shaped(Collective::kReduce, 4, 4, /*root=*/2);
  EXPECT_EQ(api_input_elements(reduce, 0, 8), 8u);
  EXPECT_EQ(api_output_elements(reduce, 0, 8), 0u);
  EXPECT_EQ(api_output_elements(reduce, 2, 8), 8u);
  auto bcast = shaped(Collective::kBroadcast, 4, 4, /*root=*/1);
  EXPECT_EQ(api_input_elements(bcast, 1, 8), 8u);
  EXPECT_EQ(api_input_elements(bcast, 0, 8), 0u);  // NCCL ignores sendbuff off the root
  EXPECT_EQ(api_output_elements(bcast, 0, 8), 8u);
  auto gather = shaped(Collective::kGather, 4, 4, 1);
  EXPECT_EQ(api_output_elements(gather, 1, 5), 20u);
  EXPECT_EQ(api_output_elements(gather, 0, 5), 0u);
  auto scatter = shaped(Collective::kScatter, 4, 4, 1);
  EXPECT_EQ(api_input_elements(scatter, 1, 5), 20u);
  EXPECT_EQ(api_input_elements(scatter, 3, 5), 0u);
  EXPECT_EQ(api_output_elements(scatter, 3, 5), 5u);
}

TEST(InPlaceAlias, FollowsNcclRules) {
  auto ag = shaped(Collective::kAllGather, 4, 4);
  auto a = inplace_alias(ag, 3, 10);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->input_inside_output);
  EXPECT_EQ(a->offset_elements, 30u);
  auto rs = shaped(Collective::kReduceScatter, 4, 4);
  a = inplace_alias(rs, 2, 10);
  ASSERT_TRUE(a);
  EXPECT_FALSE(a->input_inside_output);
  EXPECT_EQ(a->offset_elements, 20u);
  auto gather = shaped(Collective::kGather, 4, 4, 1);
  EXPECT_FALSE(inplace_alias(gather, 0, 10).has_value());
  a = inplace_alias(gather, 1, 10);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->offset_elements, 10u);
  auto ar = shaped(Collective::kAllReduce, 4, 4);
  a = inplace_alias(ar, 3, 10);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->offset_elements, 0u);
}

TEST(Names, RoundTripEveryEnum) {
  for (int i = 0; i <= static_cast<int>(Collective::kCustom); ++i) {
    auto c = static_cast<Collective>(i);
    EXPECT_EQ(parse_collective(to_string(c)), c);
  }
  for (int i = 0; i <= static_cast<int>(OpCode::kNop); ++i) {
    auto op = static_cast<OpCode>(i);
    EXPECT_EQ(parse_op_code(to_string(op)), op);
    EXPECT_EQ(parse_msccl_op_code(to_msccl_string(op)), op);
  }
  for (int i = 0; i < kNumDataTypes; ++i) {
    auto t = static_cast<DataType>(i);
    EXPECT_EQ(parse_data_type(to_string(t)), t);
  }
  for (int i = 0; i < kNumRedOps; ++i) {
    auto op = static_cast<RedOp>(i);
    EXPECT_EQ(parse_red_op(to_string(op)), op);
  }
  EXPECT_EQ(parse_data_type("bf16"), DataType::kBFloat16);
  EXPECT_FALSE(parse_data_type("float128").has_value());
  EXPECT_FALSE(parse_protocol("simple").has_value());  // names are case-sensitive
  EXPECT_EQ(size_of(DataType::kFp8E5M2), 1u);
  EXPECT_EQ(size_of(DataType::kFloat64), 8u);
}

TEST(OpProperties, MatchTheSemanticsTable) {
  EXPECT_TRUE(op_sends(OpCode::kRecvReduceSend));
  EXPECT_FALSE(op_writes_dst(OpCode::kRecvReduceSend));
  EXPECT_TRUE(op_receives(OpCode::kRecvCopySend));
  EXPECT_FALSE(op_reads_src(OpCode::kRecvCopySend));
  EXPECT_TRUE(op_reduces(OpCode::kReduce));
  EXPECT_FALSE(op_sends(OpCode::kNop));
  // mrc: no connection and no src/dst (its operands are sources and targets); it reduces.
  for (auto f : {op_sends, op_receives, op_reads_src, op_writes_dst})
    EXPECT_FALSE(f(OpCode::kMultiReduceCopy));
  EXPECT_TRUE(op_reduces(OpCode::kMultiReduceCopy));
  EXPECT_EQ(to_string(OpCode::kMultiReduceCopy), "mrc");
  EXPECT_EQ(parse_op_code("mrc"), OpCode::kMultiReduceCopy);
}

TEST(ProgramEquality, IgnoresSourceMap) {
  auto a = shaped(Collective::kAllReduce, 2, 2);
  auto b = a;
  b.source.file = "elsewhere.json";
  b.source.format = SourceMap::Format::kJson;
  EXPECT_EQ(a, b);
  b.ranks[0].scratch_chunks = 1;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace efccl::ef

namespace efccl::ef {
namespace {

TEST(CheckCall, NamesThePartThatDoesNotFit) {
  Program p;
  p.name = "ar";
  p.collective = Collective::kAllReduce;
  p.nranks = 4;
  p.nchunksperloop = 8;
  p.ranks.resize(4);
  p.inplace = false;
  EXPECT_TRUE(check_call(p, 16, DataType::kFloat32, RedOp::kSum, false, 0).is_ok());
  EXPECT_TRUE(check_call(p, 16, DataType::kFloat32, RedOp::kPreMulSum, false, 4).is_ok());
  EXPECT_NE(check_call(p, 12, DataType::kFloat32, RedOp::kSum, false, 0).message().find(
                "count 12 is not a multiple of the program's count granularity 8"),
            std::string::npos);
  EXPECT_NE(check_call(p, 16, DataType::kFloat32, RedOp::kSum, true, 0).message().find(
                "not valid for in-place calls"),
            std::string::npos);
  EXPECT_NE(check_call(p, 16, static_cast<DataType>(42), RedOp::kSum, false, 0).message().find(
                "unknown datatype value 42"),
            std::string::npos);
  EXPECT_NE(check_call(p, 16, DataType::kFloat32, RedOp::kPreMulSum, false, 3).message().find(
                "premul_scalars has 3 entries"),
            std::string::npos);
  p.collective = Collective::kAllGather;
  EXPECT_NE(check_call(p, UINT64_MAX / 2, DataType::kInt8, RedOp::kSum, false, 0).message().find(
                "overflows 64 bits"),
            std::string::npos);
}

}  // namespace
}  // namespace efccl::ef
