// Owned descriptors (efccl/net/fd.h): closed when they go, and released in forked children
// (replaced by /dev/null, close-on-exec) unless untracked.
#include "efccl/net/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <utility>

namespace {

using efccl::net::Fd;

bool is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(Fd, ClosesWhatItOwns) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  {
    Fd a(pipe_fds[0]);
    Fd b = Fd::untracked(pipe_fds[1]);
    EXPECT_TRUE(a.valid());
    Fd moved = std::move(a);
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(moved.get(), pipe_fds[0]);
    const int raw = b.release();
    EXPECT_FALSE(b.valid());
    EXPECT_EQ(raw, pipe_fds[1]);
    close(raw);
  }
  EXPECT_FALSE(is_open(pipe_fds[0]));
}

TEST(Fd, ForkedChildrenGetDevNullForTrackedDescriptors) {
  int tracked_pipe[2], kept_pipe[2];
  ASSERT_EQ(pipe2(tracked_pipe, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(kept_pipe, O_CLOEXEC), 0);
  Fd tracked(tracked_pipe[1]), tracked_read(tracked_pipe[0]);
  Fd kept = Fd::untracked(kept_pipe[1]), kept_read(kept_pipe[0]);
  const pid_t pid = fork();
  if (pid == 0) {
    // The tracked write end is /dev/null now (writes vanish), still close-on-exec; the
    // untracked one still reaches the parent.
    struct stat st {};
    const bool devnull = fstat(tracked.get(), &st) == 0 && S_ISCHR(st.st_mode);
    const bool cloexec = (fcntl(tracked.get(), F_GETFD) & FD_CLOEXEC) != 0;
    const char verdict = devnull && cloexec ? 'y' : 'n';
    const bool wrote = write(kept.get(), &verdict, 1) == 1;
    _exit(wrote ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char verdict = 0;
  ASSERT_EQ(read(kept_read.get(), &verdict, 1), 1);
  EXPECT_EQ(verdict, 'y');
  // The parent's own descriptor is untouched.
  struct stat st {};
  ASSERT_EQ(fstat(tracked.get(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

}  // namespace
