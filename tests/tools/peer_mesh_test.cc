// The MPI shim's peer mesh (tools/mpishim/src/peer_mesh.h) with strangers at every rank's peer
// listener: silent connections, wrong handshakes and 200 idle connections opened before the
// peers dial. The mesh forms anyway, promptly, and carries messages.
#include "peer_mesh.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>

#include <cstring>
#include <thread>

#include "efccl/mprun/rendezvous.h"
#include "efccl/net/socket.h"

namespace {

using efccl::mpishim::PeerMesh;
using efccl::net::Deadline;
using efccl::net::Fd;
using efccl::net::SocketAddress;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kRanks = 3;
const std::string kJob = "mesh-test-job";

/// A stand-in for efccl-mprun's server: collects the ranks' HELLOs, lets `before_peers` bother
/// their listeners, then sends everyone the peer list.
void serve_rendezvous(int listener,
                      const std::function<void(const std::vector<SocketAddress>&)>& before_peers) {
  std::vector<Fd> ranks(kRanks);
  std::vector<SocketAddress> listens(kRanks);
  for (int joined = 0; joined < kRanks;) {
    pollfd p{listener, POLLIN, 0};
    ::poll(&p, 1, 100);
    std::vector<Fd> fresh;
    ASSERT_TRUE(efccl::net::accept_pending(
        listener, [&](Fd fd, const SocketAddress&) { fresh.push_back(std::move(fd)); }));
    for (Fd& fd : fresh) {
      auto line = efccl::net::recv_line(fd.get(), 1000, Deadline::after(seconds(10)));
      ASSERT_TRUE(line) << line.status().message();
      auto hello = efccl::mprun::parse_hello(*line);
      ASSERT_TRUE(hello) << hello.status().message();
      listens[static_cast<std::size_t>(hello->rank)] = hello->listen;
      ranks[static_cast<std::size_t>(hello->rank)] = std::move(fd);
      ++joined;
    }
  }
  before_peers(listens);
  const std::string peers = efccl::mprun::format_peers(listens);
  for (Fd& fd : ranks)
    ASSERT_TRUE(
        efccl::net::send_all(fd.get(), peers.data(), peers.size(), Deadline::after(seconds(5))));
  std::this_thread::sleep_for(milliseconds(200));  // the ranks read it before we close
}

/// The handshake a dialling rank sends (peer_mesh.cc's layout).
std::string handshake(uint64_t magic, int32_t rank, int32_t size, const std::string& job) {
  std::string h(8 + 4 + 4 + 48, '\0');
  std::memcpy(h.data(), &magic, 8);
  std::memcpy(h.data() + 8, &rank, 4);
  std::memcpy(h.data() + 12, &size, 4);
  std::memcpy(h.data() + 16, job.data(), std::min<std::size_t>(job.size(), 47));
  return h;
}

TEST(PeerMesh, StrangersAtThePeerListenersDoNotStopTheMesh) {
  auto loopback = SocketAddress::parse("127.0.0.1:1");
  loopback->set_port(0);
  SocketAddress server_address;
  auto listener = efccl::net::listen_on(*loopback, false, &server_address);
  ASSERT_TRUE(listener) << listener.status().message();

  // At each listener: 200 connections that say nothing, then (newest, so they are kept and
  // read) a silent one, wrong handshakes and garbage. The old mesh blocked on the first silent
  // connection until its timeout, and ended the rank on the first wrong one.
  std::vector<Fd> idle;
  std::vector<std::vector<Fd>> wrong(kRanks);
  std::thread server([&] {
    serve_rendezvous(listener->get(), [&](const std::vector<SocketAddress>& listens) {
      for (int r = 0; r < kRanks; ++r) {
        const SocketAddress& at = listens[static_cast<std::size_t>(r)];
        for (int i = 0; i < 200; ++i) {
          auto fd = efccl::net::connect_to(at, Deadline::after(seconds(5)));
          ASSERT_TRUE(fd) << fd.status().message();
          idle.push_back(std::move(*fd));
        }
        for (const std::string& bytes :
             {std::string(), handshake(0xefcc1a9171f3a9e2ull, 2, kRanks, "another-job"),
              handshake(0xefcc1a9171f3a9e2ull, 0, kRanks, kJob), std::string(64, '\xff')}) {
          auto fd = efccl::net::connect_to(at, Deadline::after(seconds(5)));
          ASSERT_TRUE(fd) << fd.status().message();
          if (!bytes.empty()) {
            ASSERT_TRUE(efccl::net::send_all(fd->get(), bytes.data(), bytes.size(),
                                             Deadline::after(seconds(5))));
          }
          wrong[static_cast<std::size_t>(r)].push_back(std::move(*fd));
        }
      }
    });
  });

  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<PeerMesh>> meshes(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      auto mesh = PeerMesh::connect(kJob, r, kRanks, server_address, Deadline::after(seconds(30)));
      if (mesh)
        meshes[static_cast<std::size_t>(r)] = std::move(*mesh);
      else
        errors[static_cast<std::size_t>(r)] = mesh.status().message();
    });
  for (auto& t : ranks) t.join();
  server.join();
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r = 0; r < kRanks; ++r)
    ASSERT_NE(meshes[static_cast<std::size_t>(r)], nullptr) << "rank " << r << ": " << errors[r];
  EXPECT_LT(took, PeerMesh::kHandshakeTimeout.count() / 1000.0)
      << "a silent stranger held the mesh up";
  // The ranks that accept (0 and 1) read and refused the wrong ones (rank 2 dials only).
  for (int r = 0; r < 2; ++r)
    for (std::size_t i = 1; i < wrong[static_cast<std::size_t>(r)].size(); ++i) {
      char c;
      const ssize_t n = ::recv(wrong[static_cast<std::size_t>(r)][i].get(), &c, 1, 0);
      EXPECT_LE(n, 0) << "rank " << r << " kept wrong connection " << i;
    }

  // The mesh carries messages both ways.
  const efccl::mpishim::Tag tag{0, 1, efccl::mpishim::CallKind::kBarrier, 0, 0};
  for (int r = 0; r < kRanks; ++r)
    for (int p = 0; p < kRanks; ++p)
      if (p != r) {
        const int32_t value = 100 * r + p;
        ASSERT_TRUE(meshes[static_cast<std::size_t>(r)]->send(p, tag, &value, sizeof(value),
                                                              Deadline::after(seconds(5))));
      }
  for (int r = 0; r < kRanks; ++r)
    for (int p = 0; p < kRanks; ++p)
      if (p != r) {
        auto got = meshes[static_cast<std::size_t>(r)]->recv(p, tag, Deadline::after(seconds(5)));
        ASSERT_TRUE(got) << got.status().message();
        int32_t value = 0;
        ASSERT_EQ(got->size(), sizeof(value));
        std::memcpy(&value, got->data(), sizeof(value));
        EXPECT_EQ(value, 100 * p + r);
      }
}

}  // namespace
