// NCCL API argument checking that fails before any GPU is touched (runs in CPU-only CI).
#include <nccl.h>

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

std::string last_error() { return ncclGetLastError(nullptr); }

TEST(RuntimeApiArgs, VersionIsNccl22809) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, 22809);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error().find("version is NULL"), std::string::npos) << last_error();
}

TEST(RuntimeApiArgs, ErrorStringsAreDistinct) {
  std::set<std::string> seen;
  for (int r = 0; r < ncclNumResults; ++r) {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(r));
    ASSERT_NE(s, nullptr);
    EXPECT_FALSE(std::string(s).empty());
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(ncclNumResults));
  EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(99)), "unknown result code");
}

TEST(RuntimeApiArgs, NullCommIsInvalidArgument) {
  int value = 0;
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error().find("ncclAllReduce: comm is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(ncclCommCount(nullptr, &value), ncclInvalidArgument);
  EXPECT_EQ(ncclCommCuDevice(nullptr, &value), ncclInvalidArgument);
  EXPECT_EQ(ncclCommUserRank(nullptr, &value), ncclInvalidArgument);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(nullptr, &async), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(nullptr, 1, ncclFloat, 0, nullptr, nullptr), ncclInvalidArgument);
}

TEST(RuntimeApiArgs, ForeignPointerIsNotACommunicator) {
  alignas(64) char fake[256] = {};
  auto comm = reinterpret_cast<ncclComm_t>(fake);
  int n = 0;
  EXPECT_EQ(ncclCommCount(comm, &n), ncclInvalidArgument);
  EXPECT_NE(last_error().find("not a live communicator"), std::string::npos) << last_error();
  EXPECT_EQ(ncclBroadcast(fake, fake, 4, ncclInt32, 0, comm, nullptr), ncclInvalidArgument);
}

TEST(RuntimeApiArgs, DestroyAndAbortAcceptNull) {
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

TEST(RuntimeApiArgs, GroupEndWithoutStartIsInvalidUsage) {
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(last_error().find("without a matching ncclGroupStart"), std::string::npos) << last_error();
}

TEST(RuntimeApiArgs, ErrorInsideGroupIsReturnedByGroupEnd) {
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // nesting
  EXPECT_EQ(ncclAllGather(nullptr, nullptr, 1, ncclFloat, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);  // inner end: nothing runs yet
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  EXPECT_NE(last_error().find("call in it failed"), std::string::npos) << last_error();
  // The next group starts clean.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
}

TEST(RuntimeApiArgs, InitAllRejectsBadArguments) {
  ncclComm_t comms[2] = {};
  EXPECT_EQ(ncclCommInitAll(nullptr, 1, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(comms, 0, nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error().find("ndev 0"), std::string::npos) << last_error();
  const int bad[2] = {-1, 0};
  EXPECT_NE(ncclCommInitAll(comms, 2, bad), ncclSuccess);  // invalid device, or no CUDA at all
}

TEST(RuntimeApiArgs, GroupSimulateEndNeedsAGroup) {
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidUsage);
  EXPECT_NE(last_error().find("without a matching ncclGroupStart"), std::string::npos) << last_error();
}

TEST(RuntimeApiArgs, SplitShrinkRevokeCheckTheirArguments) {
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, &comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);  // cleared first, as NCCL
  EXPECT_NE(last_error().find("comm is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_NE(last_error().find("newcomm is NULL"), std::string::npos) << last_error();
  int dead = 0;
  EXPECT_EQ(ncclCommSplit(reinterpret_cast<ncclComm_t>(&dead), 0, 0, &comm, nullptr),
            ncclInvalidArgument);
  EXPECT_NE(last_error().find("not a live communicator"), std::string::npos) << last_error();
  EXPECT_EQ(ncclCommShrink(nullptr, nullptr, 0, &comm, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(nullptr, nullptr, 0, nullptr, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRevoke(nullptr, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
}

TEST(RuntimeApiArgs, MemAllocChecksItsPointer) {
  EXPECT_EQ(ncclMemAlloc(nullptr, 16), ncclInvalidArgument);
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(ncclMemAlloc(&p, 0), ncclSuccess);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
}

}  // namespace
