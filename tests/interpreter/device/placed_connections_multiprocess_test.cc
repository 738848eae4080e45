// Placed connections between the processes of a multi-process executor (PeerProcesses): the
// receiver's process owns a placed connection's memory and shares it, slot-device memory
// through CUDA IPC and pinned host memory through POSIX shared memory. Two processes, forked
// before anything touches CUDA (a forked child cannot use its parent's CUDA context), exchange
// their descriptions through pipes, run their ranks and compare them with the host executor;
// each child reports through its exit status (0 pass, 77 no GPU, anything else a failure it
// printed). Afterwards nothing of theirs may be left in /dev/shm, also when a peer died during
// a call (the survivor must fail within its timeout) or before the exchange.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device_test_support.h"
#include "efccl/device/device_executor.h"
#include "efccl/host/executor.h"
#include "placed_programs.h"

namespace efccl {
namespace {

using ef::DataType;
using ef::RedOp;
using namespace test_support;  // NOLINT(google-build-using-namespace): the suite's helpers

constexpr int kSkip = 77;
constexpr std::size_t kSmallSlotBytes = 256;

int g_proc = -1;

/// A child's failure: printed with its process index, then the child exits 1.
#define CHILD_CHECK(cond, ...)                                                                   \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "[process %d] %s:%d: check failed: %s: ", g_proc, __FILE__, __LINE__, \
                   #cond);                                                                       \
      std::fprintf(stderr, __VA_ARGS__);                                                         \
      std::fprintf(stderr, "\n");                                                                \
      std::fflush(stderr);                                                                       \
      _exit(1);                                                                                  \
    }                                                                                            \
  } while (0)

// ---- The pipes between the two processes ----

/// This process's ends of the two pipes to the other process.
struct Link {
  int in = -1;   ///< from the other process
  int out = -1;  ///< to it
};

bool write_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

/// Reads exactly `n` bytes unless the other end closes, fails or `deadline` passes.
bool read_all(int fd, void* data, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;  // EOF: the other process is gone
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// PeerProcesses::exchange over the link: this process's blob out, the other's in; per rank,
/// the blob of the process that runs it.
std::function<StatusOr<std::vector<std::string>>(const std::string&)> pipe_exchange(
    Link link, std::vector<bool> local) {
  return [link, local](const std::string& mine) -> StatusOr<std::vector<std::string>> {
    const uint64_t size = mine.size();
    if (!write_all(link.out, &size, sizeof(size)) || !write_all(link.out, mine.data(), size))
      return Status::error("writing to the other process failed");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    uint64_t their_size = 0;
    if (!read_all(link.in, &their_size, sizeof(their_size), deadline) || their_size > (1u << 20))
      return Status::error("the other process sent nothing (gone?)");
    std::string theirs(their_size, '\0');
    if (!read_all(link.in, theirs.data(), their_size, deadline))
      return Status::error("the other process's description was cut short");
    std::vector<std::string> per_rank;
    for (bool here : local) per_rank.push_back(here ? mine : theirs);
    return per_rank;
  };
}

// ---- Forking ----

/// Forks two processes running `body(proc, link)`; returns their exit statuses (-signal if
/// killed) and their pids.
struct JobResult {
  int status[2] = {-1000, -1000};
  pid_t pid[2] = {0, 0};
};

JobResult run_two_processes(const std::function<int(int proc, Link link)>& body,
                            int timeout_s = 300) {
  int to1[2], to0[2];  // process 0 -> 1, process 1 -> 0
  JobResult job;
  if (pipe(to1) != 0 || pipe(to0) != 0) {
    ADD_FAILURE() << "pipe failed";
    return job;
  }
  for (int proc = 0; proc < 2; ++proc) {
    const pid_t pid = fork();
    if (pid == 0) {
      g_proc = proc;
      Link link;
      link.in = proc == 0 ? to0[0] : to1[0];
      link.out = proc == 0 ? to1[1] : to0[1];
      // Only this process's ends stay open, so that the other's death reads as EOF.
      close(proc == 0 ? to0[1] : to1[1]);
      close(proc == 0 ? to1[0] : to0[0]);
      signal(SIGPIPE, SIG_IGN);  // a write to a dead peer fails instead of killing this one
      const int status = body(proc, link);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(status);
    }
    job.pid[proc] = pid;
  }
  for (int fd : {to1[0], to1[1], to0[0], to0[1]}) close(fd);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = 2;
  while (left > 0) {
    for (int p = 0; p < 2; ++p) {
      if (job.status[p] != -1000) continue;
      int ws = 0;
      if (waitpid(job.pid[p], &ws, WNOHANG) == job.pid[p]) {
        job.status[p] = WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int p = 0; p < 2; ++p)
        if (job.status[p] == -1000) {
          kill(job.pid[p], SIGKILL);
          waitpid(job.pid[p], nullptr, 0);
          job.status[p] = -SIGKILL;
        }
      ADD_FAILURE() << "the processes did not finish within " << timeout_s << " s (killed)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return job;
}

/// Names in /dev/shm that processes `pid` created (SharedHostSegment: "efccl-<pid hex>-...").
std::vector<std::string> shm_names_of(pid_t pid) {
  char prefix[64];
  std::snprintf(prefix, sizeof(prefix), "efccl-%x-", static_cast<unsigned>(pid));
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

/// Skips when a child found no GPU; fails on any other non-zero status; checks /dev/shm.
void check_job(const JobResult& job, bool may_be_killed = false) {
  for (int p = 0; p < 2; ++p) {
    const auto left = shm_names_of(job.pid[p]);
    EXPECT_TRUE(left.empty()) << "process " << p << " left /dev/shm/" << left.front();
  }
  if (job.status[0] == kSkip || job.status[1] == kSkip) GTEST_SKIP() << "no CUDA device visible";
  for (int p = 0; p < 2; ++p) {
    if (may_be_killed && job.status[p] == -SIGKILL) continue;
    EXPECT_EQ(job.status[p], 0) << "process " << p << " failed (its output is above)";
  }
}

// ---- One process's part ----

/// The GPU of process `proc`, and the slot devices of the connections it receives: a GPU of
/// neither process where there is one, else the other process's, else (one GPU) its own.
struct ProcessGpus {
  int device = 0;
  int slot_device = 0;
};

ProcessGpus gpus_of(int proc, int ngpus) {
  ProcessGpus g;
  g.device = proc % ngpus;
  g.slot_device = ngpus >= 3 ? 2 : ngpus == 2 ? 1 - proc : 0;
  return g;
}

/// An executor for the ranks of `p` that `proc` runs (`process_of[rank]`).
std::unique_ptr<device::DeviceExecutor> create_part(const ef::Program& p,
                                                    const std::vector<int>& process_of, int proc,
                                                    const ProcessGpus& gpus, Link link,
                                                    std::size_t slot_bytes) {
  device::PeerProcesses peers;
  std::vector<int> devices;
  for (int r = 0; r < p.nranks; ++r) {
    const bool here = process_of[r] == proc;
    peers.local.push_back(here);
    peers.location.push_back(process_of[r]);  // one GPU per process
    devices.push_back(here ? gpus.device : -1);
  }
  peers.fingerprint = p.name + "/" + std::string(ef::to_string(p.protocol));
  peers.exchange = pipe_exchange(link, peers.local);
  device::ExecutorConfig config;
  config.slot_bytes = slot_bytes;
  // Only the slot devices of connections this process receives are read; the others stay -1.
  config.slot_devices.assign(static_cast<std::size_t>(p.slot_devices), -1);
  for (const ef::ConnectionPlacement& pl : p.placements)
    if (pl.location == ef::SlotLocation::kDevice && process_of[pl.receiver] == proc)
      config.slot_devices[static_cast<std::size_t>(pl.device)] = gpus.slot_device;
  auto created = device::DeviceExecutor::create(p, devices, config, &peers);
  CHILD_CHECK(created.is_ok(), "%s: %s", p.name.c_str(), created.status().message().c_str());
  return std::move(*created);
}

/// Runs a call on this process's ranks and compares them with the host executor's.
void run_and_check(device::DeviceExecutor& ex, const ef::Program& p,
                   const std::vector<int>& process_of, int proc, const ProcessGpus& gpus,
                   uint64_t count, DataType dtype, uint64_t seed, std::size_t slot_bytes) {
  std::vector<bool> local;
  for (int r = 0; r < p.nranks; ++r) local.push_back(process_of[r] == proc);
  // Every rank's buffers on this process's GPU (the other process's are not passed), the same
  // contents in both processes (same seed), so each computes every rank on the host.
  CallBuffers bufs;
  make_buffers(p, std::vector<int>(p.nranks, gpus.device), count, dtype, false, false, seed, bufs);
  Streams streams(ex.devices());
  const auto args = run_args(p, bufs, count, dtype, RedOp::kSum, false, streams.get());
  const Status s = ex.run_and_wait(args);
  CHILD_CHECK(s.is_ok(), "%s over %s, %s: %s", p.name.c_str(), protocol_name(p.protocol).c_str(),
              describe(dtype, RedOp::kSum, false, count).c_str(), s.message().c_str());
  auto result = host::execute(p, host_options(args, slot_bytes), bufs.host);
  CHILD_CHECK(result.status.is_ok(), "host executor: %s", result.status.message().c_str());
  const std::string failure = compare(p, dtype, bufs, &local);
  CHILD_CHECK(failure.empty(), "%s over %s, %s: %s", p.name.c_str(),
              protocol_name(p.protocol).c_str(), describe(dtype, RedOp::kSum, false, count).c_str(),
              failure.c_str());
}

/// 0 with a GPU, else kSkip (printed).
int visible_gpus_or_skip(int* ngpus) {
  std::string why;
  *ngpus = visible_gpus(&why);
  if (*ngpus > 0) return 0;
  std::fprintf(stderr, "[process %d] %s\n", g_proc, why.c_str());
  return kSkip;
}

TEST(PlacedConnectionsAcrossProcesses, HostAndSlotDevicePlacementsMatchTheHostExecutor) {
  // The lone pair both ways (rank 0 in process 0, rank 1 in process 1): each process owns the
  // host and slot-device memory of the connections it receives and maps the other's. The
  // forward through a third rank with ranks 0 and 2 in process 0 and rank 1 in process 1:
  // host memory 0->1 across, slot device 1->2 across, slot device 0->2 within process 0.
  const JobResult job = run_two_processes([](int proc, Link link) {
    int ngpus = 0;
    if (int skip = visible_gpus_or_skip(&ngpus); skip != 0) return skip;
    const ProcessGpus gpus = gpus_of(proc, ngpus);
    uint64_t seed = 10;
    for (ef::Protocol protocol : kProtocols) {
      const std::vector<std::pair<ef::Program, std::vector<int>>> programs = {
          {lone_pair(protocol, true), {0, 1}}, {forward_through_third_rank(protocol), {0, 1, 0}}};
      for (const auto& [p, process_of] : programs) {
        for (std::size_t slot_bytes : {kSmallSlotBytes, std::size_t{0}}) {
          auto ex = create_part(p, process_of, proc, gpus, link, slot_bytes);
          const uint64_t g = ef::count_granularity(p);
          if (slot_bytes == 0) {
            run_and_check(*ex, p, process_of, proc, gpus, g * 300001, DataType::kFloat32, ++seed,
                          slot_bytes);
            continue;
          }
          for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt8,
                                 DataType::kFloat64, DataType::kUint64})
            for (uint64_t count : {g, 7 * g, 257 * g})
              run_and_check(*ex, p, process_of, proc, gpus, count, dtype, ++seed, slot_bytes);
        }
      }
    }
    return 0;
  });
  check_job(job);
}

TEST(PlacedConnectionsAcrossProcesses, APeerThatDiesMidCallFailsTheSurvivorWithinItsTimeout) {
  // Process 1 launches its part of the lone pair (both ways, so each process owns and maps
  // placed memory) and is killed while its kernel waits; process 0 then runs its part, which
  // must give up at its timeout, and goes cleanly. Nothing may stay in /dev/shm.
  for (ef::Protocol protocol : kProtocols) {
    SCOPED_TRACE(protocol_name(protocol));
    const JobResult job = run_two_processes([protocol](int proc, Link link) {
      int ngpus = 0;
      if (int skip = visible_gpus_or_skip(&ngpus); skip != 0) return skip;
      const ProcessGpus gpus = gpus_of(proc, ngpus);
      const ef::Program p = lone_pair(protocol, true);
      const std::vector<int> process_of = {0, 1};
      auto ex = create_part(p, process_of, proc, gpus, link, kSmallSlotBytes);
      const uint64_t count = ef::count_granularity(p) * 4096;
      CallBuffers bufs;
      make_buffers(p, {gpus.device, gpus.device}, count, DataType::kFloat32, false, false, 1, bufs);
      Streams streams(ex->devices());
      auto args = run_args(p, bufs, count, DataType::kFloat32, RedOp::kSum, false, streams.get());
      args.timeout = std::chrono::seconds(2);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      if (proc == 1) {
        // Its kernel waits for data process 0 has not sent: it is mid-call when it dies.
        const Status s = ex->run(args);
        CHILD_CHECK(s.is_ok(), "%s", s.message().c_str());
        CHILD_CHECK(write_all(link.out, "L", 1), "telling process 0");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        raise(SIGKILL);
        return 1;  // not reached
      }
      char launched = 0;
      CHILD_CHECK(read_all(link.in, &launched, 1, deadline), "process 1 never launched");
      char more = 0;
      CHILD_CHECK(!read_all(link.in, &more, 1, deadline), "process 1 did not die");  // EOF
      const auto start = std::chrono::steady_clock::now();
      const Status s = ex->run_and_wait(args);
      const auto elapsed = std::chrono::steady_clock::now() - start;
      CHILD_CHECK(!s.is_ok(), "the call succeeded without its peer");
      CHILD_CHECK(s.message().find("timed out") != std::string::npos, "%s", s.message().c_str());
      CHILD_CHECK(elapsed < std::chrono::seconds(20), "gave up after %lld ms: %s",
                  static_cast<long long>(
                      std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()),
                  s.message().c_str());
      ex.reset();  // the executor goes: its names must be gone
      return 0;
    });
    EXPECT_EQ(job.status[1] == kSkip ? -SIGKILL : job.status[1], -SIGKILL)
        << "process 1 should have been killed";
    check_job(job, /*may_be_killed=*/true);
  }
}

TEST(PlacedConnectionsAcrossProcesses, APeerGoneBeforeTheExchangeLeavesNoSharedMemory) {
  // Process 0 creates its host memory and then finds nobody to exchange with: creation fails
  // naming the exchange, and the name it made is removed.
  const JobResult job = run_two_processes([](int proc, Link link) {
    if (proc == 1) return 0;  // gone at once: its pipe ends close
    int ngpus = 0;
    if (int skip = visible_gpus_or_skip(&ngpus); skip != 0) return skip;
    const ProcessGpus gpus = gpus_of(proc, ngpus);
    const ef::Program p = lone_pair(ef::Protocol::kSimple, true);
    device::PeerProcesses peers;
    peers.local = {true, false};
    peers.location = {0, 1};
    peers.fingerprint = "gone";
    peers.exchange = pipe_exchange(link, peers.local);
    device::ExecutorConfig config;
    config.slot_devices = {gpus.slot_device};
    auto created = device::DeviceExecutor::create(p, {gpus.device, -1}, config, &peers);
    CHILD_CHECK(!created.is_ok(), "created without its peer");
    CHILD_CHECK(
        created.status().message().find("exchanging connection memory") != std::string::npos, "%s",
        created.status().message().c_str());
    return 0;
  });
  if (job.status[0] == kSkip) GTEST_SKIP() << "no CUDA device visible";
  check_job(job);
}

}  // namespace
}  // namespace efccl
