// One rank of the MPI shim's test (mpishim_test.cc starts several under efccl-mprun). Mode
// "all" checks the result of every function of the shim on every rank; "bother" does the same
// after rank 0 opened 200 idle connections to the launcher and sent it a line full of control
// characters; the other modes break a rule on purpose so the test can check that the job fails
// with a clear message.
#include <arpa/inet.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

int g_rank = 0, g_size = 1, g_passed = 0, g_failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  }
}

/// Rank `rank`'s element i: exactly representable, sign varying with i (sums are exact too).
template <typename T>
T value(int rank, int i) {
  T v = static_cast<T>((rank + 1) * (i + 1));
  if (i % 2 == 1) v = -v;
  if constexpr (std::is_floating_point_v<T>) v += static_cast<T>(0.25) * i;
  return v;
}

template <typename T>
void check_allreduce(MPI_Datatype type, const char* type_name) {
  constexpr int kCount = 5;
  const struct {
    MPI_Op op;
    const char* name;
  } ops[] = {{MPI_SUM, "sum"}, {MPI_MIN, "min"}, {MPI_MAX, "max"}};
  for (const auto& op : ops) {
    std::vector<T> expected(kCount);
    for (int i = 0; i < kCount; ++i) {
      expected[i] = value<T>(0, i);
      for (int r = 1; r < g_size; ++r) {
        const T v = value<T>(r, i);
        expected[i] = op.op == MPI_SUM   ? expected[i] + v
                      : op.op == MPI_MIN ? (v < expected[i] ? v : expected[i])
                                         : (v > expected[i] ? v : expected[i]);
      }
    }
    for (bool in_place : {false, true}) {
      std::vector<T> send(kCount), recv(kCount, T(99));
      for (int i = 0; i < kCount; ++i) send[i] = value<T>(g_rank, i);
      if (in_place) {
        recv = send;
        MPI_Allreduce(MPI_IN_PLACE, recv.data(), kCount, type, op.op, MPI_COMM_WORLD);
      } else {
        MPI_Allreduce(send.data(), recv.data(), kCount, type, op.op, MPI_COMM_WORLD);
      }
      check(recv == expected, std::string("MPI_Allreduce ") + op.name + " " + type_name +
                                  (in_place ? " in place" : ""));
      if (!in_place) check(send[1] == value<T>(g_rank, 1), "MPI_Allreduce keeps sendbuf");
    }
  }
}

void check_allgather() {
  // nccl-tests' host-hash exchange: in place, send type MPI_DATATYPE_NULL.
  std::vector<uint64_t> hashes(g_size, 0);
  hashes[g_rank] = 0xabc0000000ull + g_rank;
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, hashes.data(), sizeof(uint64_t), MPI_BYTE,
                MPI_COMM_WORLD);
  bool ok = true;
  for (int r = 0; r < g_size; ++r) ok = ok && hashes[r] == 0xabc0000000ull + r;
  check(ok, "MPI_Allgather in place (MPI_BYTE)");

  const int mine[2] = {g_rank, g_rank * g_rank};
  std::vector<int> all(2 * g_size, -1);
  MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, MPI_COMM_WORLD);
  ok = true;
  for (int r = 0; r < g_size; ++r) ok = ok && all[2 * r] == r && all[2 * r + 1] == r * r;
  check(ok, "MPI_Allgather MPI_INT");
}

void check_gather() {
  // nccl-tests' device report: fixed-size lines of MPI_BYTE to rank 0.
  constexpr int kLine = 32;
  char line[kLine] = {};
  std::snprintf(line, kLine, "rank %d reporting", g_rank);
  std::vector<char> lines(g_rank == 0 ? kLine * g_size : 0);
  MPI_Gather(line, kLine, MPI_BYTE, g_rank == 0 ? lines.data() : nullptr, kLine, MPI_BYTE, 0,
             MPI_COMM_WORLD);
  if (g_rank == 0) {
    bool ok = true;
    for (int r = 0; r < g_size; ++r)
      ok = ok && std::string(&lines[r * kLine]) == "rank " + std::to_string(r) + " reporting";
    check(ok, "MPI_Gather MPI_BYTE to rank 0");
  }
  // Timings: doubles to the last rank, which contributes in place.
  const int root = g_size - 1;
  double times[3] = {g_rank + 0.25, g_rank + 0.5, g_rank + 0.75};
  std::vector<double> all(g_rank == root ? 3 * g_size : 0, -1);
  if (g_rank == root) {
    std::memcpy(&all[3 * root], times, sizeof(times));
    MPI_Gather(MPI_IN_PLACE, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, root, MPI_COMM_WORLD);
    bool ok = true;
    for (int r = 0; r < g_size; ++r)
      ok = ok && all[3 * r] == r + 0.25 && all[3 * r + 1] == r + 0.5 && all[3 * r + 2] == r + 0.75;
    check(ok, "MPI_Gather MPI_DOUBLE to the last rank, in place at the root");
  } else {
    MPI_Gather(times, 3, MPI_DOUBLE, nullptr, 3, MPI_DOUBLE, root, MPI_COMM_WORLD);
  }
}

void check_bcast() {
  unsigned char id[128] = {};
  if (g_rank == 0)
    for (int i = 0; i < 128; ++i) id[i] = static_cast<unsigned char>(i * 7 + 1);
  MPI_Bcast(id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  bool ok = true;
  for (int i = 0; i < 128; ++i) ok = ok && id[i] == static_cast<unsigned char>(i * 7 + 1);
  check(ok, "MPI_Bcast 128 bytes from rank 0");

  long long v[2] = {g_rank == g_size - 1 ? -5ll : 0, g_rank == g_size - 1 ? 1ll << 40 : 0};
  MPI_Bcast(v, 2, MPI_LONG_LONG, g_size - 1, MPI_COMM_WORLD);
  check(v[0] == -5 && v[1] == 1ll << 40, "MPI_Bcast MPI_LONG_LONG from the last rank");
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check_barrier() {
  // The last rank arrives late; nobody may leave before it arrived (one clock: one machine).
  if (g_rank == g_size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long long arrived = now_ns();
  MPI_Barrier(MPI_COMM_WORLD);
  const long long left = now_ns();
  std::vector<long long> arrivals(g_size);
  MPI_Allgather(&arrived, 1, MPI_LONG_LONG, arrivals.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
  long long last = 0;
  for (long long a : arrivals) last = a > last ? a : last;
  check(left >= last, "MPI_Barrier: no rank leaves before the last one arrived");
}

void check_split() {
  // Even and odd ranks, each ordered by descending world rank (key = -rank).
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, -g_rank, &half);
  std::vector<int> members;  // world ranks of my color, in the new order
  for (int r = g_size - 1; r >= 0; --r)
    if (r % 2 == g_rank % 2) members.push_back(r);
  int size = -1, rank = -1;
  MPI_Comm_size(half, &size);
  MPI_Comm_rank(half, &rank);
  check(size == static_cast<int>(members.size()), "MPI_Comm_split: size of the color");
  check(rank >= 0 && rank < size && members[rank] == g_rank, "MPI_Comm_split: rank ordered by key");

  long sum = g_rank;
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_LONG, MPI_SUM, half);
  long expected = 0;
  for (int r : members) expected += r;
  check(sum == expected, "MPI_Allreduce on a split communicator");

  std::vector<int> gathered(members.size(), -1);
  MPI_Allgather(&g_rank, 1, MPI_INT, gathered.data(), 1, MPI_INT, half);
  check(gathered == members, "MPI_Allgather on a split communicator, in key order");

  int from_root = g_rank;
  MPI_Bcast(&from_root, 1, MPI_INT, 0, half);
  check(from_root == members[0], "MPI_Bcast from rank 0 of a split communicator");
  MPI_Barrier(half);

  // One color for all, like nccl-tests without NCCL_TESTS_SPLIT: the same as the world.
  MPI_Comm all = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, 0, g_rank, &all);
  MPI_Comm_size(all, &size);
  MPI_Comm_rank(all, &rank);
  check(size == g_size && rank == g_rank, "MPI_Comm_split with one color keeps the world order");
  int m = g_rank;
  MPI_Allreduce(MPI_IN_PLACE, &m, 1, MPI_INT, MPI_MAX, all);
  check(m == g_size - 1, "MPI_Allreduce max on the one-color communicator");

  MPI_Comm_free(&half);
  MPI_Comm_free(&all);
  check(half == MPI_COMM_NULL && all == MPI_COMM_NULL, "MPI_Comm_free sets MPI_COMM_NULL");
}

int run_all() {
  const char* env_rank = std::getenv("EFCCL_MPRUN_RANK");
  const char* env_size = std::getenv("EFCCL_MPRUN_SIZE");
  check(std::atoi(env_rank != nullptr ? env_rank : "0") == g_rank &&
            std::atoi(env_size != nullptr ? env_size : "1") == g_size,
        "MPI_Comm_rank and MPI_Comm_size match the launcher's environment");
  check_allreduce<int>(MPI_INT, "MPI_INT");
  check_allreduce<long>(MPI_LONG, "MPI_LONG");
  check_allreduce<long long>(MPI_LONG_LONG, "MPI_LONG_LONG");
  check_allreduce<int64_t>(MPI_INT64_T, "MPI_INT64_T");
  check_allreduce<double>(MPI_DOUBLE, "MPI_DOUBLE");
  int nothing = 42;
  MPI_Allreduce(MPI_IN_PLACE, &nothing, 0, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  check(nothing == 42, "MPI_Allreduce of 0 elements");
  check_allgather();
  check_gather();
  check_bcast();
  check_barrier();
  check_split();

  int failed = g_failed;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) {
    if (failed == 0)
      std::printf("mpishim_check: all %d checks passed on each of %d ranks\n", g_passed, g_size);
    else
      std::printf("mpishim_check: %d check(s) failed\n", failed);
  }
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}

}  // namespace

/// Connections to the launcher's rendezvous server that never say HELLO (kept open until exit),
/// and one that sends a line with control characters; before MPI_Init, so they are there first.
std::vector<int> bother_the_launcher(int idle) {
  std::vector<int> fds;
  const char* addr = std::getenv("EFCCL_MPRUN_ADDR");
  if (addr == nullptr) return fds;
  const std::string text = addr;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(text.substr(text.rfind(':') + 1).c_str())));
  inet_pton(AF_INET, text.substr(0, text.rfind(':')).c_str(), &sa.sin_addr);
  for (int i = 0; i <= idle; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      std::printf("FAIL rank %d: connecting to the launcher: %s\n", g_rank, std::strerror(errno));
      close(fd);
      continue;
    }
    fds.push_back(fd);
    if (i == 0) {  // first, and alone for a moment: its refusal is the one reported at once
      const std::string evil =
          "\x1b[2J\x1b[31mHELLO \x07"
          "evil\x1b]0;owned\x07 0 2 1.2.3.4:5\n";
      (void)!write(fd, evil.data(), evil.size());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  return fds;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "all";
  std::vector<int> bothering;
  if (mode == "bother" && std::getenv("EFCCL_MPRUN_RANK") != nullptr &&
      std::string(std::getenv("EFCCL_MPRUN_RANK")) == "0")
    bothering = bother_the_launcher(200);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (mode == "all" || mode == "bother") return run_all();
  if (mode == "mismatch") {  // rank 0 in MPI_Barrier, the others in MPI_Allreduce
    int x = 1;
    if (g_rank == 0)
      MPI_Barrier(MPI_COMM_WORLD);
    else
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  } else if (mode == "late") {  // the last rank keeps the others waiting
    if (g_rank == g_size - 1) std::this_thread::sleep_for(std::chrono::seconds(30));
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (mode == "abort") {
    if (g_rank == 1) MPI_Abort(MPI_COMM_WORLD, 7);
    MPI_Barrier(MPI_COMM_WORLD);
  } else if (mode == "vanish") {  // rank 1 exits (status 0) without taking part
    if (g_rank == 1) std::_Exit(0);
    MPI_Barrier(MPI_COMM_WORLD);
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  MPI_Finalize();
  return 0;
}
