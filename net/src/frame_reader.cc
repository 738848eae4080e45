#include "efccl/net/frame_reader.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "efccl/net/socket.h"

namespace efccl::net {
namespace {

std::string hex(uint64_t v) {
  std::ostringstream m;
  m << "0x" << std::hex << v;
  return m.str();
}

}  // namespace

FrameReader::Result FrameReader::feed(std::string_view bytes, const Check& check,
                                      const OnFrame& on_frame, std::string* why) {
  std::size_t at = 0;
  while (at < bytes.size()) {
    if (header_got_ < sizeof(FrameHeader)) {
      const std::size_t take = std::min(sizeof(FrameHeader) - header_got_, bytes.size() - at);
      const bool had_magic = header_got_ >= sizeof(uint64_t);
      std::memcpy(header_bytes_ + header_got_, bytes.data() + at, take);
      header_got_ += take;
      at += take;
      if (!had_magic && header_got_ >= sizeof(uint64_t)) {
        uint64_t m;
        std::memcpy(&m, header_bytes_, sizeof(m));
        if (m != magic_) {
          *why = "wrong magic " + hex(m);
          return Result::kBad;
        }
      }
      if (header_got_ < sizeof(FrameHeader)) continue;
      std::memcpy(&header_, header_bytes_, sizeof(FrameHeader));
      if (!check(header_, why)) return Result::kBad;
      payload_.clear();
      payload_.reserve(static_cast<std::size_t>(std::min<uint64_t>(header_.length, kReserveStep)));
    } else {
      const std::size_t take = static_cast<std::size_t>(
          std::min<uint64_t>(header_.length - payload_.size(), bytes.size() - at));
      payload_.append(bytes.data() + at, take);  // grows (geometrically) with what arrived
      at += take;
    }
    if (header_got_ == sizeof(FrameHeader) && payload_.size() == header_.length) {
      header_got_ = 0;
      std::string payload = std::move(payload_);
      payload_ = std::string();
      if (!on_frame(header_, std::move(payload))) return Result::kStop;
    }
  }
  return Result::kAgain;
}

FrameReader::Result FrameReader::read(int fd, std::vector<char>& buffer, std::size_t budget,
                                      const Check& check, const OnFrame& on_frame,
                                      std::string* why) {
  std::size_t consumed = 0;
  while (consumed < budget) {
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n == 0) return Result::kEof;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Result::kAgain;
      *why = errno_text(errno);
      return Result::kError;
    }
    consumed += static_cast<std::size_t>(n);
    const Result r =
        feed(std::string_view(buffer.data(), static_cast<std::size_t>(n)), check, on_frame, why);
    if (r != Result::kAgain) return r;
  }
  return Result::kAgain;
}

}  // namespace efccl::net
