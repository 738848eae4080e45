// Shared registrations without a GPU (comm/registration_wire.h, comm/shared_registrations.h,
// ranks_sharing_gpu in comm/shared_gpu_check.h): the messages and their checks, which ranks are
// partners, and a registration service answering requests that cannot be served (bytes that
// are no request, handles that do not open, closes of nothing) with a reason each, then telling
// its clients that it stopped. The mapping itself needs GPUs: shared_registrations_gpu_test.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/registration_wire.h"
#include "comm/shared_gpu_check.h"
#include "comm/shared_registrations.h"
#include "efccl/net/bootstrap.h"
#include "efccl/net/unique_id.h"

namespace {

using efccl::runtime::decode_reply;
using efccl::runtime::decode_request;
using efccl::runtime::encode;
using efccl::runtime::RegistrationKind;
using efccl::runtime::RegistrationReply;
using efccl::runtime::RegistrationRequest;
using std::chrono::milliseconds;
using std::chrono::seconds;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

RegistrationRequest import_request(uint64_t id) {
  RegistrationRequest r;
  r.kind = RegistrationKind::kImport;
  r.id = id;
  r.alloc_bytes = 1 << 20;
  for (std::size_t i = 0; i < efccl::runtime::kIpcHandleBytes; ++i)
    r.handle[i] = static_cast<unsigned char>(i * 7 + 1);
  return r;
}

TEST(RegistrationWire, RequestsAndRepliesRoundTrip) {
  const RegistrationRequest req = import_request(42);
  auto back = decode_request(encode(req));
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->kind, RegistrationKind::kImport);
  EXPECT_EQ(back->id, 42u);
  EXPECT_EQ(back->alloc_bytes, uint64_t{1} << 20);
  EXPECT_EQ(std::memcmp(back->handle, req.handle, sizeof(req.handle)), 0);

  RegistrationReply rep;
  rep.kind = RegistrationKind::kImport;
  rep.id = 42;
  rep.ok = true;
  rep.address = 0x7f0012340000ull;
  auto r = decode_reply(encode(rep));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_TRUE(r->ok);
  EXPECT_EQ(r->address, rep.address);
  EXPECT_EQ(r->id, 42u);

  rep.ok = false;
  rep.address = 0;
  rep.kind = RegistrationKind::kClose;
  rep.error = "rank 3 maps no registration 42 of rank 1";
  r = decode_reply(encode(rep));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error, rep.error);
  // An over-long reason is cut at the limit by the sender.
  rep.error.assign(5000, 'x');
  r = decode_reply(encode(rep));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(r->error.size(), efccl::runtime::kMaxReplyError);
}

TEST(RegistrationWire, MalformedRequestsAreRefusedWithTheReason) {
  const std::string good = encode(import_request(7));
  const auto refused = [](const std::string& bytes, const std::string& why) {
    auto r = decode_request(bytes);
    ASSERT_FALSE(r) << "accepted: " << why;
    EXPECT_TRUE(contains(r.status().message(), why)) << r.status().message();
  };
  refused("", "too short");
  refused(good.substr(0, 20), "too short");
  refused(good + "x", "wrong length");
  std::string bad = good;
  bad[0] ^= 1;
  refused(bad, "magic");
  bad = good;
  bad[4] = 9;
  refused(bad, "version 9");
  bad = good;
  bad[6] = 0;
  refused(bad, "unknown kind 0");
  bad[6] = 4;
  refused(bad, "unknown kind 4");
  bad[6] = 3;
  refused(bad, "only replies");
  refused(encode(import_request(0)), "id 0");
  RegistrationRequest empty = import_request(5);
  empty.alloc_bytes = 0;
  refused(encode(empty), "0 bytes");
  // A close carries no allocation: its size is not checked.
  RegistrationRequest close;
  close.kind = RegistrationKind::kClose;
  close.id = 5;
  EXPECT_TRUE(decode_request(encode(close)));
}

TEST(RegistrationWire, MalformedRepliesAreRefusedWithTheReason) {
  RegistrationReply ok;
  ok.kind = RegistrationKind::kImport;
  ok.id = 3;
  ok.ok = true;
  ok.address = 0x1000;
  const std::string good = encode(ok);
  const auto refused = [](const std::string& bytes, const std::string& why) {
    auto r = decode_reply(bytes);
    ASSERT_FALSE(r) << "accepted: " << why;
    EXPECT_TRUE(contains(r.status().message(), why)) << r.status().message();
  };
  refused(good.substr(0, 31), "too short");
  refused(good + std::string(efccl::runtime::kMaxReplyError + 1, 'e'), "too long");
  std::string bad = good;
  bad[16] = 2;
  refused(bad, "ok = 2");
  RegistrationReply zero = ok;
  zero.address = 0;
  refused(encode(zero), "address 0");
  RegistrationReply stopped;
  stopped.kind = RegistrationKind::kStopped;
  stopped.id = 9;
  refused(encode(stopped), "with id 9");
  RegistrationReply no_id = ok;
  no_id.id = 0;
  refused(encode(no_id), "with id 0");
}

TEST(RanksSharingGpu, PartnersAreTheLowestRankOfEachOtherProcessOnTheGpu) {
  using efccl::runtime::RankLocation;
  // Host 1: process 10 (ranks 0, 1 on GPU A), process 11 (ranks 2, 3 on A; 4 on B),
  // process 12 (rank 5 on A). Host 2: process 13 (rank 6 on a GPU with A's bus id).
  const std::vector<RankLocation> table = {
      {1, 10, 100, "0000:0a:00.0"}, {1, 10, 100, "0000:0a:00.0"}, {1, 11, 101, "0000:0a:00.0"},
      {1, 11, 101, "0000:0a:00.0"}, {1, 11, 101, "0000:0b:00.0"}, {1, 12, 102, "0000:0a:00.0"},
      {2, 13, 103, "0000:0a:00.0"}};
  std::vector<int> partners, clients;
  efccl::runtime::ranks_sharing_gpu(table, 0, &partners, &clients);
  EXPECT_EQ(partners, (std::vector<int>{2, 5}));
  EXPECT_EQ(clients, (std::vector<int>{2, 3, 5}));
  efccl::runtime::ranks_sharing_gpu(table, 3, &partners, &clients);
  EXPECT_EQ(partners, (std::vector<int>{0, 5}));
  EXPECT_EQ(clients, (std::vector<int>{0, 1, 5}));
  efccl::runtime::ranks_sharing_gpu(table, 4, &partners, &clients);
  EXPECT_TRUE(partners.empty());
  EXPECT_TRUE(clients.empty());
  efccl::runtime::ranks_sharing_gpu(table, 6, &partners, &clients);
  EXPECT_TRUE(clients.empty());
  efccl::runtime::ranks_sharing_gpu(table, 7, &partners, &clients);  // out of range
  EXPECT_TRUE(clients.empty());
  std::vector<RankLocation> unknown = table;
  unknown[0].bus_id.clear();
  efccl::runtime::ranks_sharing_gpu(unknown, 0, &partners, &clients);
  EXPECT_TRUE(clients.empty());
}

/// Two ranks of one unique id, as threads of this process (their bootstraps are real).
std::vector<std::shared_ptr<efccl::net::Bootstrap>> two_ranks() {
  efccl::net::UniqueId id;
  EXPECT_TRUE(efccl::net::create_unique_id(&id, seconds(60)));
  std::vector<std::shared_ptr<efccl::net::Bootstrap>> boots;
  const auto deadline = efccl::net::Deadline::after(milliseconds(20000));
  for (int r = 0; r < 2; ++r) {
    auto b = efccl::net::Bootstrap::start(id, 2, r, "", deadline);
    EXPECT_TRUE(b) << b.status().message();
    if (!b) return {};
    boots.push_back(*b);
  }
  for (auto& b : boots) EXPECT_TRUE(b->wait_ready(deadline, nullptr));
  return boots;
}

TEST(SharedRegistrations, TheServiceAnswersEveryRequestItCannotServeWithAReason) {
  auto boots = two_ranks();
  ASSERT_EQ(boots.size(), 2u);
  // Rank 0 serves rank 1 (device 0: without a GPU every import fails, which is what is tested).
  auto service = efccl::runtime::SharedRegistrations::start(boots[0], 0, 0, {}, {1},
                                                            milliseconds(5000));
  ASSERT_TRUE(service) << service.status().message();
  efccl::net::Bootstrap& client = *boots[1];
  const auto deadline = [] { return efccl::net::Deadline::after(milliseconds(10000)); };
  const auto ask = [&](const std::string& bytes) {
    EXPECT_TRUE(client.send(0, efccl::runtime::kRegistrationRequestTag, bytes, deadline()));
    auto got = client.recv(0, efccl::runtime::kRegistrationReplyTag, deadline());
    EXPECT_TRUE(got) << got.status().message();
    auto r = decode_reply(got ? *got : std::string());
    EXPECT_TRUE(r) << r.status().message();
    return r ? *r : RegistrationReply{};
  };
  RegistrationReply r = ask("not a request");
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(contains(r.error, "rank 0 could not read the request")) << r.error;
  EXPECT_TRUE(contains(r.error, "too short")) << r.error;
  // A handle that names no allocation of another process does not open.
  r = ask(encode(import_request(11)));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.id, 11u);
  EXPECT_TRUE(contains(r.error, "cudaIpcOpenMemHandle")) << r.error;
  RegistrationRequest close;
  close.kind = RegistrationKind::kClose;
  close.id = 11;
  r = ask(encode(close));
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.kind, RegistrationKind::kClose);
  EXPECT_TRUE(contains(r.error, "maps no registration 11 of rank 1")) << r.error;
  EXPECT_EQ((*service)->imported(), 0u);
  // Stopping tells the client that nothing of its is mapped any more.
  const auto t0 = std::chrono::steady_clock::now();
  (*service)->stop(false);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(3));
  auto got = client.recv(0, efccl::runtime::kRegistrationReplyTag, deadline());
  ASSERT_TRUE(got) << got.status().message();
  auto stopped = decode_reply(*got);
  ASSERT_TRUE(stopped) << stopped.status().message();
  EXPECT_EQ(stopped->kind, RegistrationKind::kStopped);
  // The owner side with nothing it can export: not shared, nothing asked.
  auto owner = efccl::runtime::SharedRegistrations::start(boots[1], 1, 0, {{0, "rank 0's place"}},
                                                          {}, milliseconds(2000));
  ASSERT_TRUE(owner) << owner.status().message();
  std::vector<char> host(4096);
  EXPECT_EQ((*owner)->share(host.data(), host.size()), 0u);
  EXPECT_EQ((*owner)->share(nullptr, 16), 0u);
  EXPECT_FALSE((*owner)->partner_address(host.data(), 16, 0).has_value());
  EXPECT_TRUE((*owner)->unshare(12345));  // never shared: nothing to do
  auto none = boots[0]->recv(1, efccl::runtime::kRegistrationRequestTag,
                             efccl::net::Deadline::after(milliseconds(200)));
  EXPECT_FALSE(none);
}

}  // namespace
