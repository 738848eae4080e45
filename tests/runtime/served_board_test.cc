// The board of a GPU served by one process (enqueue/served_board.h): records posted by one rank
// are read by the others in order, a full ring waits for every rank to consume, waits end at
// their deadline or on abort, and records another process wrote are checked before use.
#include "enqueue/served_board.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "launch/call.h"

namespace efccl::runtime {
namespace {

using namespace std::chrono_literals;

struct Memory {
  explicit Memory(int nranks) : bytes(ServedBoard::bytes_for(nranks)), data(bytes + 64) {}
  void* at() { return data.data(); }
  std::size_t bytes;
  std::vector<uint64_t> data;  // 8-byte aligned, more than enough
};

ServedCall allreduce(uint64_t count, uint64_t send) {
  ServedCall c;
  c.kind = static_cast<uint8_t>(CallKind::kAllReduce);
  c.dtype = 7;  // float
  c.count = count;
  c.send = send;
  c.recv = send + 4096;
  c.servable = 1;
  return c;
}

/// A well-formed allreduce with one field changed by `change`.
template <typename Change>
ServedCall changed(Change change) {
  ServedCall c = allreduce(1, 0);
  change(c);
  return c;
}

TEST(ServedBoard, PostedCallsAreReadInOrderByAnotherView) {
  Memory m(3);
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 3).is_ok());
  auto writer = ServedBoard::attach(m.at(), m.bytes, 3);
  auto reader = ServedBoard::attach(m.at(), m.bytes, 3);
  ASSERT_TRUE(writer.is_ok() && reader.is_ok());
  for (uint64_t seq = 1; seq <= 5; ++seq)
    ASSERT_TRUE(
        writer->post(2, seq, allreduce(seq * 10, 0x1000 * seq), net::Deadline::after(1s), nullptr)
            .is_ok());
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    ServedCall got;
    ASSERT_TRUE(reader->read(2, seq, &got, net::Deadline::after(1s), nullptr).is_ok());
    EXPECT_EQ(got.count, seq * 10);
    EXPECT_EQ(got.send, 0x1000 * seq);
    EXPECT_EQ(got.recv, 0x1000 * seq + 4096);
  }
}

TEST(ServedBoard, AReadWaitsForThePostAndEndsAtItsDeadlineOrOnAbort) {
  Memory m(2);
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 2).is_ok());
  auto board = ServedBoard::attach(m.at(), m.bytes, 2);
  ASSERT_TRUE(board.is_ok());
  ServedCall got;
  const auto t0 = std::chrono::steady_clock::now();
  Status s = board->read(1, 1, &got, net::Deadline::after(100ms), nullptr);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank 1 to issue collective 1"), std::string::npos) << s.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 100ms);
  std::atomic<bool> abort{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    abort = true;
  });
  s = board->read(1, 1, &got, net::Deadline::never(), &abort);
  stopper.join();
  EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.message();
  // A post from another thread ends the wait with its record.
  std::thread poster([&] {
    std::this_thread::sleep_for(20ms);
    auto other = ServedBoard::attach(m.at(), m.bytes, 2);
    ASSERT_TRUE(
        other->post(1, 1, allreduce(77, 0x2000), net::Deadline::after(1s), nullptr).is_ok());
  });
  s = board->read(1, 1, &got, net::Deadline::after(5s), nullptr);
  poster.join();
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(got.count, 77u);
}

TEST(ServedBoard, AFailedBoardEndsEveryWaitNamingTheRank) {
  Memory m(3);
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 3).is_ok());
  auto board = ServedBoard::attach(m.at(), m.bytes, 3);
  EXPECT_EQ(board->failed_by(), 0);
  std::thread failer([&] {
    std::this_thread::sleep_for(30ms);
    auto other = ServedBoard::attach(m.at(), m.bytes, 3);
    other->set_failed(2);
    other->set_failed(1);  // the first failure stays
  });
  ServedCall got;
  const Status s = board->read(1, 1, &got, net::Deadline::after(10s), nullptr);
  failer.join();
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("rank 2's served calls failed"), std::string::npos) << s.message();
  EXPECT_EQ(board->failed_by(), 3);
}

TEST(ServedBoard, AFullRingWaitsUntilEveryRankConsumed) {
  Memory m(2);
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 2).is_ok());
  auto board = ServedBoard::attach(m.at(), m.bytes, 2);
  const uint64_t ring = ServedBoard::kRing;
  for (uint64_t seq = 1; seq <= ring; ++seq)
    ASSERT_TRUE(board->post(0, seq, allreduce(1, 0), net::Deadline::after(1s), nullptr).is_ok());
  // Call ring + 1 takes call 1's slot: rank 1 has not consumed call 1.
  Status s = board->post(0, ring + 1, allreduce(1, 0), net::Deadline::after(50ms), nullptr);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("ring is full"), std::string::npos) << s.message();
  board->consume(0, 1);
  board->consume(1, 1);
  EXPECT_TRUE(board->post(0, ring + 1, allreduce(1, 0), net::Deadline::after(1s), nullptr).is_ok());
}

TEST(ServedBoard, RecordsOutOfRangeAreRefusedNamingTheRank) {
  Memory m(2);
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 2).is_ok());
  auto board = ServedBoard::attach(m.at(), m.bytes, 2);
  const std::vector<std::pair<const char*, ServedCall>> bad = {
      {"kind", changed([](ServedCall& c) { c.kind = 8; })},  // kSend
      {"datatype", changed([](ServedCall& c) { c.dtype = 12; })},
      {"operator", changed([](ServedCall& c) { c.op = 6; })},
      {"root", changed([](ServedCall& c) { c.root = 2; })},
      {"servable", changed([](ServedCall& c) { c.servable = 9; })},
      {"captured", changed([](ServedCall& c) { c.captured = 2; })},
  };
  uint64_t seq = 0;
  for (const auto& [what, call] : bad) {
    ++seq;
    ASSERT_TRUE(board->post(1, seq, call, net::Deadline::after(1s), nullptr).is_ok());
    ServedCall got;
    Status s = board->read(1, seq, &got, net::Deadline::after(1s), nullptr);
    EXPECT_FALSE(s.is_ok()) << what;
    EXPECT_NE(s.message().find("rank 1's collective " + std::to_string(seq)), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find(what), std::string::npos) << s.message();
  }
}

TEST(ServedBoard, AttachRefusesMemoryThatIsNotABoardOfThatSize) {
  Memory m(2);
  std::memset(m.at(), 0xab, m.bytes);
  EXPECT_FALSE(ServedBoard::attach(m.at(), m.bytes, 2).is_ok());
  ASSERT_TRUE(ServedBoard::format(m.at(), m.bytes, 2).is_ok());
  EXPECT_FALSE(ServedBoard::attach(m.at(), m.bytes, 3).is_ok());      // other rank count
  EXPECT_FALSE(ServedBoard::attach(m.at(), m.bytes - 1, 2).is_ok());  // mapping too short
  EXPECT_FALSE(ServedBoard::format(m.at(), m.bytes - 1, 2).is_ok());
  EXPECT_TRUE(ServedBoard::attach(m.at(), m.bytes, 2).is_ok());
}

TEST(ServedBoard, CallsAreServedTogetherOnlyWhenAllAreServableAndAgree) {
  std::vector<ServedCall> calls = {allreduce(100, 0x1000), allreduce(100, 0x9000)};
  EXPECT_TRUE(served_together(calls));
  calls[1].servable = 0;
  EXPECT_FALSE(served_together(calls));
  calls[1] = allreduce(101, 0x9000);
  EXPECT_FALSE(served_together(calls));  // counts differ
  calls[1] = allreduce(100, 0x9000);
  calls[1].op = 2;
  EXPECT_FALSE(served_together(calls));  // operators differ
  calls[1] = allreduce(100, 0x9000);
  calls[1].kind = static_cast<uint8_t>(CallKind::kAllGather);
  EXPECT_FALSE(served_together(calls));
  calls[1] = allreduce(100, 0x9000);
  calls[1].captured = 1;
  EXPECT_FALSE(served_together(calls));  // one captured, one not
  calls[0].captured = 1;
  calls[0].slot = 3;
  calls[1].slot = 3;
  EXPECT_TRUE(served_together(calls));  // both captured, same graph slot
  calls[1].slot = 4;
  EXPECT_FALSE(served_together(calls));  // graph slots differ
  EXPECT_FALSE(served_together({}));
}

}  // namespace
}  // namespace efccl::runtime
