// The POSIX shared-memory segments behind host-placed connections between processes
// (interpreter/device/src/shared_host_segment.h): shared contents, and names that never
// outlive their use — gone once the other process has mapped the segment, or when the creator
// lets it go, also when the other process never comes or the creator dies. No CUDA needed.
#include "shared_host_segment.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>

namespace efccl::device {
namespace {

namespace fs = std::filesystem;

/// Where shm_open's names live on Linux.
bool name_exists(const std::string& name) {
  std::error_code ec;
  return fs::exists("/dev/shm" + name, ec);
}

/// Runs `body` in a child process; returns its exit status (or -signal).
template <typename Body>
int in_child(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int ws = 0;
  waitpid(pid, &ws, 0);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
}

TEST(SharedHostSegment, CreatedZeroedAndNamed) {
  auto s = SharedHostSegment::create(3 * 4096 + 5);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  EXPECT_TRUE(SharedHostSegment::is_valid_name(s->name())) << s->name();
  EXPECT_LE(s->name().size(), SharedHostSegment::kMaxNameLength);
  EXPECT_TRUE(name_exists(s->name()));
  EXPECT_EQ(s->bytes(), 3u * 4096 + 5);
  for (std::size_t i = 0; i < s->bytes(); ++i) ASSERT_EQ(s->data()[i], 0) << "byte " << i;
  auto t = SharedHostSegment::create(64);
  ASSERT_TRUE(t.is_ok());
  EXPECT_NE(s->name(), t->name());
}

TEST(SharedHostSegment, TheOpenerSharesTheMemoryAndRemovesTheName) {
  auto s = SharedHostSegment::create(4096);
  ASSERT_TRUE(s.is_ok()) << s.status().message();
  const std::string name = s->name();
  std::memset(s->data(), 0x5a, 4096);
  const int status = in_child([&] {
    auto opened = SharedHostSegment::open_and_unlink(name, 4096);
    if (!opened.is_ok()) return 2;
    if (name_exists(name)) return 3;  // removed at once
    if (opened->data()[4095] != 0x5a) return 4;
    opened->data()[0] = 0x11;  // seen by the creator
    return 0;
  });
  ASSERT_EQ(status, 0);
  EXPECT_EQ(s->data()[0], 0x11);
  EXPECT_FALSE(name_exists(name));
}

TEST(SharedHostSegment, TheCreatorRemovesANameNobodyOpened) {
  std::string name;
  {
    auto s = SharedHostSegment::create(128);
    ASSERT_TRUE(s.is_ok());
    name = s->name();
    EXPECT_TRUE(name_exists(name));
    SharedHostSegment moved = std::move(*s);  // moves keep one owner of the name
    EXPECT_TRUE(name_exists(name));
  }
  EXPECT_FALSE(name_exists(name));
}

TEST(SharedHostSegment, ASegmentWhoseCreatorDiedLosesItsNameWhenOpened) {
  // The creator dies (SIGKILL: no destructor) after publishing the name; the opener still maps
  // the memory and the name goes with its open.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    auto s = SharedHostSegment::create(256);
    if (!s.is_ok()) _exit(2);
    s->data()[7] = 42;
    char name[SharedHostSegment::kMaxNameLength + 1] = {};
    std::memcpy(name, s->name().c_str(), s->name().size());
    if (write(fds[1], name, sizeof(name)) != static_cast<ssize_t>(sizeof(name))) _exit(3);
    raise(SIGKILL);
  }
  close(fds[1]);
  char name[SharedHostSegment::kMaxNameLength + 1] = {};
  ASSERT_EQ(read(fds[0], name, sizeof(name)), static_cast<ssize_t>(sizeof(name)));
  close(fds[0]);
  int ws = 0;
  waitpid(pid, &ws, 0);
  ASSERT_TRUE(WIFSIGNALED(ws));
  ASSERT_TRUE(name_exists(name));
  auto opened = SharedHostSegment::open_and_unlink(name, 256);
  ASSERT_TRUE(opened.is_ok()) << opened.status().message();
  EXPECT_EQ(opened->data()[7], 42);
  EXPECT_FALSE(name_exists(name));
}

TEST(SharedHostSegment, WrongSizeAndForeignNamesAreRefused) {
  auto s = SharedHostSegment::create(4096);
  ASSERT_TRUE(s.is_ok());
  const std::string name = s->name();
  auto wrong = SharedHostSegment::open_and_unlink(name, 8192);
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().message(), "shared memory " + name + " holds 4096 bytes, expected 8192");
  for (const std::string& bad :
       {std::string("/efccl-"), std::string("/dev/shm/efccl-1"), std::string("/other-1-2-3"),
        std::string("/efccl-12/../x"), std::string("/efccl-XYZ"), std::string(""),
        "/efccl-" + std::string(60, '1')}) {
    EXPECT_FALSE(SharedHostSegment::is_valid_name(bad)) << bad;
    auto opened = SharedHostSegment::open_and_unlink(bad, 4096);
    ASSERT_FALSE(opened.is_ok()) << bad;
    EXPECT_EQ(opened.status().message(),
              "'" + bad + "' is not the name of an efccl shared memory segment");
  }
  auto missing = SharedHostSegment::open_and_unlink("/efccl-0-0-0", 64);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("shm_open(/efccl-0-0-0)"), std::string::npos)
      << missing.status().message();
  auto empty = SharedHostSegment::create(0);
  EXPECT_FALSE(empty.is_ok());
}

}  // namespace
}  // namespace efccl::device
