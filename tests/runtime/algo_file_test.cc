// A user program named by EFCCL_ALGO_FILES is chosen for the calls it claims and skipped,
// with the reason logged, for those it cannot run.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/ef/json_io.h"
#include "efccl/common/log.h"
#include "efccl/runtime/observer.h"
#include "runtime_test_util.h"

namespace efccl::runtime::testing {
namespace {

TEST(RuntimeAlgoFile, UserProgramIsPickedAndSkippedWithReasons) {
  EFCCL_REQUIRE_GPUS(1);
  std::vector<int> devices(visible_gpus());
  std::iota(devices.begin(), devices.end(), 0);
  if (devices.size() == 1) devices = {0, 0};
  const int n = static_cast<int>(devices.size());

  // Two files: one for this clique (granularity n), one for n+1 ranks (never usable here).
  const std::string dir = "/tmp/efccl_algo_file_test_" + std::to_string(getpid());
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::string files;
  for (int ranks : {n, n + 1}) {
    algorithms::AlgorithmParams params;
    params.ranks = ranks;
    auto p = algorithms::generate_algorithm("ring_allreduce", params);
    ASSERT_TRUE(p) << p.status().message();
    p->name = "user_ring_" + std::to_string(ranks);
    const std::string file = dir + "/" + p->name + ".json";
    std::ofstream(file) << ef::save_json(*p);
    files += (files.empty() ? "" : ",") + file;
  }
  ASSERT_EQ(setenv("EFCCL_ALGO_FILES", files.c_str(), 1), 0);

  std::vector<SelectionRecord> seen;
  std::vector<std::string> lines;
  set_selection_observer([&](const SelectionRecord& r) { seen.push_back(r); });
  set_log_sink([&](const std::string& line) { lines.push_back(line); });
  {
    TestClique c(devices);
    std::vector<float*> buf(n);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(devices[r]);
      CUDA_OK(cudaMalloc(&buf[r], 4096 * sizeof(float)));
      std::vector<float> h(4096, static_cast<float>(r + 1));
      CUDA_OK(cudaMemcpy(buf[r], h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
      cudaStreamSynchronize(cudaStreamLegacy);  // a pageable copy's DMA may still be running
    }
    const auto run = [&](std::size_t count) {
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < n; ++r) NCCL_OK(ncclAllReduce(buf[r], buf[r], count, ncclFloat, ncclSum, c.comms[r], c.streams[r]));
      NCCL_OK(ncclGroupEnd());
      c.sync();
    };
    run(static_cast<std::size_t>(n) * 256);
    bool picked = false;
    for (const auto& r : seen)
      if (!r.skipped && r.program == "user_ring_" + std::to_string(n)) picked = true;
    EXPECT_TRUE(picked);
    std::vector<float> h(4096);
    cudaSetDevice(devices[0]);
    CUDA_OK(cudaMemcpy(h.data(), buf[0], h.size() * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h[0], n * (n + 1) / 2.0f);

    seen.clear();
    run(static_cast<std::size_t>(n) * 256 + 1);  // not a multiple of the granularity n
    bool skipped_granularity = n == 1, skipped_ranks = false, builtin = false;
    for (const auto& r : seen) {
      if (r.skipped && r.reason.find("granularity") != std::string::npos) skipped_granularity = true;
      if (r.skipped && r.reason.find("ranks") != std::string::npos) skipped_ranks = true;
      if (!r.skipped && r.source == "builtin") builtin = true;
    }
    EXPECT_TRUE(skipped_granularity);
    EXPECT_TRUE(skipped_ranks);
    EXPECT_TRUE(builtin);
    bool logged = false;
    for (const auto& l : lines)
      if (l.find("EFCCL INFO skipping user program 'user_ring_") != std::string::npos) logged = true;
    EXPECT_TRUE(logged);
    for (int r = 0; r < n; ++r) cudaFree(buf[r]);
  }
  set_selection_observer(nullptr);
  set_log_sink(nullptr);
  unsetenv("EFCCL_ALGO_FILES");
  (void)system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace efccl::runtime::testing
