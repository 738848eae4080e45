// The unique id (efccl/net/unique_id.h): random ids that name their root, the layout the runtime
// relies on, and NCCL_COMM_ID's ids, which every process makes alike (NCCL's fixed magic): two
// processes' ids compared byte for byte.
#include "efccl/net/unique_id.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "net_test_util.h"

namespace {

using efccl::net::UniqueId;
using efccl::net::UniqueIdFields;
using namespace net_test;

constexpr const char* kRoleVar = "EFCCL_UNIQUE_ID_TEST_OUT";

// A child process (this binary again): makes an id and writes its hex digits to the file named
// by kRoleVar, before gtest starts.
const bool kIsChild = [] {
  if (const char* out = std::getenv(kRoleVar)) {
    UniqueId id;
    const efccl::Status s = efccl::net::create_unique_id(&id, seconds(5));
    std::FILE* f = std::fopen(out, "w");
    if (f == nullptr) std::_Exit(3);
    std::fputs(s ? to_hex(id).c_str() : ("error: " + s.message()).c_str(), f);
    std::fclose(f);
    std::_Exit(s ? 0 : 2);
  }
  return false;
}();

std::string id_made_by_a_child(const std::string& file) {
  const pid_t pid = spawn_self({std::string(kRoleVar) + "=" + file});
  EXPECT_EQ(wait_child(pid, seconds(20)), 0);
  std::FILE* f = std::fopen(file.c_str(), "r");
  if (f == nullptr) return "";
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::remove(file.c_str());
  return std::string(buf, n);
}

TEST(UniqueId, RandomIdsNameTheirRoot) {
  UniqueId a, b;
  ASSERT_TRUE(efccl::net::create_unique_id(&a, seconds(5)));
  ASSERT_TRUE(efccl::net::create_unique_id(&b, seconds(5)));
  EXPECT_NE(magic_of(a), magic_of(b));
  EXPECT_NE(std::memcmp(a.internal, b.internal, sizeof(a.internal)), 0);
  const UniqueIdFields fields = UniqueIdFields::decode(a);
  EXPECT_TRUE(fields.valid());
  EXPECT_FALSE(fields.root_by_rank0());
  EXPECT_EQ(std::memcmp(fields.encode().internal, a.internal, sizeof(a.internal)), 0);
  const std::string root = efccl::net::describe_unique_id(a);
  EXPECT_EQ(root, fields.root.to_string());
  auto resolved = efccl::net::resolve_socket_address(root);
  ASSERT_TRUE(resolved) << root << ": " << resolved.status().message();
  EXPECT_EQ(*resolved, root);
  const int fd = connect_to(root);  // a root listens there
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  UniqueId zero;
  EXPECT_EQ(efccl::net::describe_unique_id(zero), "<not an efccl unique id>");
  EXPECT_FALSE(efccl::net::create_unique_id(nullptr, seconds(5)));
}

TEST(UniqueId, CommIdIdsAreTheSameBytesInEveryProcess) {
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  ScopedEnv comm_id("NCCL_COMM_ID", address.c_str());
  const std::string dir = ::testing::TempDir();
  const std::string first = id_made_by_a_child(dir + "/unique_id_test.a");
  const std::string second = id_made_by_a_child(dir + "/unique_id_test.b");
  ASSERT_EQ(first.size(), 2 * efccl::net::kUniqueIdBytes) << first;
  EXPECT_EQ(first, second) << "two processes made different ids for NCCL_COMM_ID=" << address;
  UniqueId here;
  ASSERT_TRUE(efccl::net::create_unique_id(&here, seconds(5)));
  EXPECT_EQ(to_hex(here), first);
  const UniqueIdFields fields = UniqueIdFields::decode(here);
  EXPECT_EQ(fields.magic, UniqueIdFields::kCommIdMagic);
  EXPECT_TRUE(fields.root_by_rank0());
  EXPECT_EQ(efccl::net::describe_unique_id(here), address);
  EXPECT_LT(connect_to(address), 0) << "no root is started before rank 0 joins";
}

TEST(UniqueId, BadCommIdIsNamed) {
  ScopedEnv bad("NCCL_COMM_ID", "not-an-address");
  UniqueId id;
  const efccl::Status s = efccl::net::create_unique_id(&id, seconds(5));
  ASSERT_FALSE(s);
  EXPECT_TRUE(contains(s.message(), "NCCL_COMM_ID=not-an-address is invalid")) << s.message();
}

}  // namespace
