#include "efccl/net/waker.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace efccl::net {

StatusOr<Waker> Waker::create() {
  Waker w;
  w.fd_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!w.fd_.valid()) return Status::error(std::string("eventfd(): ") + std::strerror(errno));
  return w;
}

void Waker::wake() const {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd_.get(), &one, sizeof(one));
}

void Waker::drain() const {
  uint64_t v;
  [[maybe_unused]] const ssize_t n = ::read(fd_.get(), &v, sizeof(v));
}

}  // namespace efccl::net
