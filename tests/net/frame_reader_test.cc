// Frame parsing (efccl/net/frame_reader.h): frames split anywhere, a wrong magic caught after 8
// bytes, headers checked before any payload is kept, and memory that follows the bytes that
// arrived, not the length a header claims.
#include "efccl/net/frame_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "net_test_util.h"

namespace {

using efccl::net::FrameHeader;
using efccl::net::FrameReader;
using net_test::frame;

constexpr uint64_t kMagic = 0x1122334455667788ull;

struct Collected {
  std::vector<std::pair<uint64_t, std::string>> frames;  // tag, payload
  FrameReader::Check check = [](const FrameHeader& h, std::string* why) {
    if (h.length > 1000) {
      *why = "too long";
      return false;
    }
    return true;
  };
  FrameReader::OnFrame on_frame = [this](const FrameHeader& h, std::string payload) {
    frames.emplace_back(h.tag, std::move(payload));
    return true;
  };
};

TEST(FrameReader, FramesSplitAnywhereArriveWhole) {
  const std::string stream = frame(kMagic, 6, "first", 1) + frame(kMagic, 6, "", 2) +
                             frame(kMagic, 6, std::string(700, 'q'), 3);
  for (std::size_t piece : {1u, 3u, 8u, 39u, 40u, 41u, 1000u}) {
    FrameReader reader(kMagic);
    Collected c;
    std::string why;
    for (std::size_t at = 0; at < stream.size(); at += piece)
      ASSERT_EQ(reader.feed(std::string_view(stream).substr(at, piece), c.check, c.on_frame, &why),
                FrameReader::Result::kAgain)
          << why;
    ASSERT_EQ(c.frames.size(), 3u) << "pieces of " << piece;
    EXPECT_EQ(c.frames[0], std::make_pair(uint64_t{1}, std::string("first")));
    EXPECT_EQ(c.frames[1], std::make_pair(uint64_t{2}, std::string()));
    EXPECT_EQ(c.frames[2].second, std::string(700, 'q'));
    EXPECT_EQ(reader.held_bytes(), 0u);
  }
}

TEST(FrameReader, WrongMagicIsCaughtAfterEightBytes) {
  FrameReader reader(kMagic);
  Collected c;
  std::string why;
  const std::string bad = frame(kMagic + 1, 6, "x");
  EXPECT_EQ(reader.feed(bad.substr(0, 7), c.check, c.on_frame, &why), FrameReader::Result::kAgain);
  EXPECT_EQ(reader.feed(bad.substr(7, 1), c.check, c.on_frame, &why), FrameReader::Result::kBad);
  EXPECT_EQ(why, "wrong magic 0x1122334455667789");
}

TEST(FrameReader, HeadersAreCheckedBeforeThePayloadIsKept) {
  FrameReader reader(kMagic);
  Collected c;
  std::string why;
  EXPECT_EQ(reader.feed(frame(kMagic, 6, std::string(1001, 'z')), c.check, c.on_frame, &why),
            FrameReader::Result::kBad);
  EXPECT_EQ(why, "too long");
  EXPECT_EQ(reader.held_bytes(), 0u);
}

TEST(FrameReader, MemoryFollowsTheBytesThatArrived) {
  // A header that claims 1 TiB, accepted by a permissive check: nothing near that is reserved.
  FrameReader reader(kMagic);
  std::string header = frame(kMagic, 6, "");
  const uint64_t claimed = uint64_t{1} << 40;
  std::memcpy(header.data() + 24, &claimed, 8);
  std::string why;
  const auto accept_all = [](const FrameHeader&, std::string*) { return true; };
  const auto never = [](const FrameHeader&, std::string) { return true; };
  EXPECT_EQ(reader.feed(header, accept_all, never, &why), FrameReader::Result::kAgain);
  EXPECT_EQ(reader.feed(std::string(100, 'a'), accept_all, never, &why),
            FrameReader::Result::kAgain);
  EXPECT_EQ(reader.held_bytes(), 100u);
}

TEST(FrameReader, StopEndsParsing) {
  FrameReader reader(kMagic);
  int seen = 0;
  std::string why;
  const auto check = [](const FrameHeader&, std::string*) { return true; };
  const auto stop = [&](const FrameHeader&, std::string) {
    ++seen;
    return false;
  };
  EXPECT_EQ(reader.feed(frame(kMagic, 6, "a") + frame(kMagic, 6, "b"), check, stop, &why),
            FrameReader::Result::kStop);
  EXPECT_EQ(seen, 1);
}

}  // namespace
