#include "efccl/net/printable.h"

namespace efccl::net {

std::string printable(std::string_view bytes, std::size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve((bytes.size() < max_bytes ? bytes.size() : max_bytes) + 24);
  std::size_t shown = 0;
  for (; shown < bytes.size(); ++shown) {
    const auto c = static_cast<unsigned char>(bytes[shown]);
    const bool plain = c >= 0x20 && c < 0x7f && c != '\\';
    const std::size_t width = plain ? 1 : c == '\\' ? 2 : 4;
    if (out.size() + width > max_bytes) break;
    if (c == '\\') {
      out += "\\\\";
    } else if (plain) {
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
