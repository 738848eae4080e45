// ncclSend/ncclRecv groups: a ring, all-to-all to several peers (separate buffers and slices
// of one buffer), sends to self, and unmatched sends.
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

std::vector<int> all_devices() {
  std::vector<int> d(visible_gpus());
  std::iota(d.begin(), d.end(), 0);
  if (d.size() == 1) d = {0, 0, 0};  // still several ranks
  return d;
}

/// Device buffer of `n` ints on `dev`, filled with `fill(i)`.
int* make_buffer(int dev, std::size_t n, const std::function<int(std::size_t)>& fill) {
  cudaSetDevice(dev);
  int* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(int)), cudaSuccess);
  std::vector<int> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = fill(i);
  EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
  return p;
}

std::vector<int> read_buffer(int dev, const int* p, std::size_t n) {
  std::vector<int> h(n);
  cudaSetDevice(dev);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(RuntimeP2p, SendRecvRing) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(all_devices());
  const int n = c.n();
  for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{(1 << 20) + 3}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    std::vector<int*> send(n), recv(n);
    for (int r = 0; r < n; ++r) {
      send[r] = make_buffer(c.devices[r], count, [r](std::size_t i) { return r * 1000003 + static_cast<int>(i); });
      recv[r] = make_buffer(c.devices[r], count, [](std::size_t) { return -1; });
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclSend(send[r], count, ncclInt32, (r + 1) % n, c.comms[r], c.streams[r]));
      NCCL_OK(ncclRecv(recv[r], count, ncclInt32, (r + n - 1) % n, c.comms[r], c.streams[r]));
    }
    NCCL_OK(ncclGroupEnd());
    c.sync();
    for (int r = 0; r < n; ++r) {
      const int from = (r + n - 1) % n;
      const auto got = read_buffer(c.devices[r], recv[r], count);
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(got[i], from * 1000003 + static_cast<int>(i)) << "rank " << r << " element " << i;
      cudaFree(send[r]);
      cudaFree(recv[r]);
    }
  }
}

TEST(RuntimeP2p, GroupedSendRecvToEveryPeer) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c(all_devices());
  const int n = c.n();
  const std::size_t count = 4099;
  for (bool slices : {false, true}) {
    SCOPED_TRACE(slices ? "slices of one buffer" : "one buffer per peer");
    // send[r][q]: what r sends to q (itself included); recv[r][q]: what r receives from q.
    std::vector<std::vector<int*>> send(n, std::vector<int*>(n)), recv(n, std::vector<int*>(n));
    std::vector<int*> send_base(n), recv_base(n);
    for (int r = 0; r < n; ++r) {
      if (slices) {
        send_base[r] = make_buffer(c.devices[r], count * n, [r, count](std::size_t i) {
          return r * 100000 + static_cast<int>(i / count) * 10000 + static_cast<int>(i % count);
        });
        recv_base[r] = make_buffer(c.devices[r], count * n, [](std::size_t) { return -1; });
      }
      for (int q = 0; q < n; ++q) {
        send[r][q] = slices ? send_base[r] + q * count
                            : make_buffer(c.devices[r], count, [r, q](std::size_t i) {
                                return r * 100000 + q * 10000 + static_cast<int>(i);
                              });
        recv[r][q] = slices ? recv_base[r] + q * count
                            : make_buffer(c.devices[r], count, [](std::size_t) { return -1; });
      }
    }
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) {
        NCCL_OK(ncclSend(send[r][q], count, ncclInt32, q, c.comms[r], c.streams[r]));
        NCCL_OK(ncclRecv(recv[r][q], count, ncclInt32, q, c.comms[r], c.streams[r]));
      }
    NCCL_OK(ncclGroupEnd());
    c.sync();
    for (int r = 0; r < n; ++r)
      for (int q = 0; q < n; ++q) {
        const auto got = read_buffer(c.devices[r], recv[r][q], count);
        for (std::size_t i = 0; i < count; ++i)
          ASSERT_EQ(got[i], q * 100000 + r * 10000 + static_cast<int>(i))
              << "rank " << r << " from " << q << " element " << i;
      }
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(c.devices[r]);
      if (slices) {
        cudaFree(send_base[r]);
        cudaFree(recv_base[r]);
      } else {
        for (int q = 0; q < n; ++q) {
          cudaFree(send[r][q]);
          cudaFree(recv[r][q]);
        }
      }
    }
  }
}

TEST(RuntimeP2p, UnmatchedSendIsInvalidUsage) {
  EFCCL_REQUIRE_GPUS(1);
  TestClique c({0, 0});
  cudaSetDevice(0);
  int* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, 64));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(buf, 4, ncclInt32, 1, c.comms[0], c.streams[0]));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("posts 1 ncclSend to rank 1 but rank 1 posts 0"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  cudaFree(buf);
}

}  // namespace
}  // namespace efccl::runtime::testing
