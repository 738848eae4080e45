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
}

}  // namespace
