// Peer bytes made printable (efccl/net/printable.h).
#include "efccl/net/printable.h"

#include <gtest/gtest.h>

namespace {

using efccl::net::printable;

TEST(Printable, KeepsAsciiAndEscapesTheRest) {
  EXPECT_EQ(printable("HELLO job 0 2 127.0.0.1:5"), "HELLO job 0 2 127.0.0.1:5");
  EXPECT_EQ(printable("\x1b[2Jx\r\n"), "\\x1b[2Jx\\x0d\\x0a");
  EXPECT_EQ(printable(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(printable("back\\slash"), "back\\\\slash");
  EXPECT_EQ(printable("\xff\x7f"), "\\xff\\x7f");
}

TEST(Printable, BoundsTheLength) {
  const std::string long_text(1000, 'z');
  const std::string shown = printable(long_text, 10);
  EXPECT_EQ(shown, "zzzzzzzzzz...(1000 bytes)");
  EXPECT_EQ(printable("", 10), "");
  EXPECT_EQ(printable("abc", 3), "abc");
  // Escapes count at their printed width, and none is cut in half.
  EXPECT_EQ(printable(std::string(100, '\0'), 10), "\\x00\\x00...(100 bytes)");
  EXPECT_EQ(printable("\\\\\\", 5), "\\\\\\\\...(3 bytes)");
  const std::string worst = printable(std::string(1000, '\x01'), 120);
  EXPECT_LE(worst.size(), 120u + std::string("...(1000 bytes)").size());
}

}  // namespace
