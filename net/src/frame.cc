#include "efccl/net/frame.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "efccl/net/socket.h"

namespace efccl::net {

void put_u32(std::string& out, uint32_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

uint32_t get_u32(std::string_view bytes, std::size_t at) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + at, sizeof(v));
  return v;
}

std::string frame_bytes(uint64_t magic, uint32_t type, uint64_t space, uint64_t tag,
                        std::string_view payload) {
  FrameHeader h;
  h.magic = magic;
  h.type = type;
  h.space = space;
  h.tag = tag;
  h.length = payload.size();
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out.append(payload);
  return out;
}

Status write_frame(int fd, const FrameHeader& header, std::string_view payload, Deadline deadline,
                   const std::atomic<bool>* abort, std::size_t* written) {
  constexpr int kAbortCheckMs = 10;
  const std::size_t total = sizeof(header) + payload.size();
  *written = 0;
  while (*written < total) {
    iovec iov[2];
    int n = 0;
    if (*written < sizeof(header)) {
      iov[n++] = {const_cast<char*>(reinterpret_cast<const char*>(&header)) + *written,
                  sizeof(header) - *written};
      iov[n++] = {const_cast<char*>(payload.data()), payload.size()};
    } else {
      const std::size_t at = *written - sizeof(header);
      iov[n++] = {const_cast<char*>(payload.data()) + at, payload.size() - at};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      *written += static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      return Status::error(errno_text(errno));
    if (abort != nullptr && abort->load(std::memory_order_acquire)) return Status::error("aborted");
    if (deadline.expired()) return Status::error("timed out");
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, deadline.poll_ms(kAbortCheckMs));
  }
  return Status::ok();
}

}  // namespace efccl::net
