#include "efccl/net/printable.h"

namespace efccl::net {

std::string printable(std::string_view bytes, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const std::size_t shown = bytes.size() < max_bytes ? bytes.size() : max_bytes;
  out.reserve(shown + 16);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (shown < bytes.size()) out += "...(" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

}  // namespace efccl::net
