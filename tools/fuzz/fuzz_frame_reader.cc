// libFuzzer target for the bootstrap's frame reader (efccl/net/frame_reader.h): any byte stream,
// cut into pieces anywhere, must parse into whole frames or end in a refusal, without crashing,
// and the reader never holds more payload than the bytes it was given.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "efccl/net/frame_reader.h"

namespace {

constexpr uint64_t kMagic = 0x4449'5f4d'4d4f'4345ull;  // NCCL_COMM_ID's: strangers know it

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_frame_reader: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using efccl::net::FrameHeader;
  using efccl::net::FrameReader;
  if (size < 2) return 0;
  // The first byte picks the piece size (how the bytes arrive), the second whether the stream
  // starts with the magic (so that the fuzzer reaches the headers behind it).
  const std::size_t piece = 1 + data[0] % 97;
  std::string stream;
  if (data[1] & 1) stream.append(reinterpret_cast<const char*>(&kMagic), sizeof(kMagic));
  stream.append(reinterpret_cast<const char*>(data) + 2, size - 2);

  FrameReader reader(kMagic);
  std::size_t fed = 0, payload_bytes = 0;
  // The transport's rule for an authenticated connection, with a small limit.
  const FrameReader::Check check = [](const FrameHeader& h, std::string* why) {
    const bool ok = (h.type == efccl::net::kData && h.length <= 4096) ||
                    (h.type == efccl::net::kGoodbye && h.length == 0);
    if (!ok) *why = "unexpected frame";
    return ok;
  };
  const FrameReader::OnFrame on_frame = [&](const FrameHeader& h, std::string payload) {
    if (payload.size() != h.length) fail("a frame's payload differs from its header's length");
    if (h.magic != kMagic) fail("a frame with a wrong magic was delivered");
    payload_bytes += payload.size();
    return true;
  };
  for (std::size_t at = 0; at < stream.size(); at += piece) {
    const std::string_view bytes = std::string_view(stream).substr(at, piece);
    fed += bytes.size();
    std::string why;
    const FrameReader::Result r = reader.feed(bytes, check, on_frame, &why);
    if (reader.held_bytes() > fed) fail("the reader holds more than it was given");
    if (payload_bytes > fed) fail("more payload delivered than bytes fed");
    if (r == FrameReader::Result::kBad) {
      if (why.empty()) fail("a refusal without a reason");
      break;
    }
    if (r != FrameReader::Result::kAgain) fail("feed() returned a socket result");
  }
  return 0;
}
