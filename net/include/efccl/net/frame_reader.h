// Incremental parsing of frames (frame.h) from a stream that arrives in pieces. Memory grows
// with the bytes that actually arrived, never with the length a header claims, and a header is
// checked (by the caller's rule) before any of its payload is kept. A wrong magic is detected as
// soon as 8 bytes arrived.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/net/frame.h"

namespace efccl::net {

/// Parses the frames of one connection.
class FrameReader {
 public:
  enum class Result {
    kAgain,  ///< everything available was consumed; more may come
    kEof,    ///< read(): the peer closed the stream
    kError,  ///< read(): a socket error (*why)
    kBad,    ///< a wrong magic or a header the check refused (*why); stop using this reader
    kStop,   ///< on_frame asked to stop; bytes after that frame were not parsed
  };
  /// Whether a header is acceptable; false (with the reason in *why) ends parsing with kBad.
  using Check = std::function<bool(const FrameHeader& header, std::string* why)>;
  /// A complete frame; false ends parsing with kStop.
  using OnFrame = std::function<bool(const FrameHeader& header, std::string payload)>;

  explicit FrameReader(uint64_t magic) : magic_(magic) {}

  /// Parses `bytes`, calling `check` on every header and `on_frame` on every complete frame.
  Result feed(std::string_view bytes, const Check& check, const OnFrame& on_frame,
              std::string* why);
  /// Reads what non-blocking `fd` has (at most about `budget` bytes, in pieces of `buffer`'s
  /// size) and feeds it.
  Result read(int fd, std::vector<char>& buffer, std::size_t budget, const Check& check,
              const OnFrame& on_frame, std::string* why);

  /// Payload bytes of the current frame held so far.
  std::size_t held_bytes() const { return payload_.size(); }

 private:
  /// Payload memory reserved when a header arrives (at most); beyond, it grows as bytes arrive.
  static constexpr std::size_t kReserveStep = std::size_t{64} << 10;

  uint64_t magic_;
  char header_bytes_[sizeof(FrameHeader)] = {};
  std::size_t header_got_ = 0;
  FrameHeader header_;
  std::string payload_;
};

}  // namespace efccl::net
