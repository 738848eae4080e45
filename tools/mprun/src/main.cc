// efccl-mprun: starts N ranks of a program on this machine (tools/mprun/README.md).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "efccl/mprun/rendezvous.h"
#include "launcher.h"

namespace {

constexpr const char* kUsage =
    "usage: efccl-mprun -n N [--hosts K] [--timeout SECONDS] [--grace SECONDS] [--id-file PATH]\n"
    "                   [--mps] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this machine. Each rank gets EFCCL_MPRUN_RANK, "
    "EFCCL_MPRUN_SIZE,\n"
    "EFCCL_MPRUN_ADDR (the rendezvous server of the MPI shim), EFCCL_MPRUN_ID_FILE (where rank 0\n"
    "may publish an ncclUniqueId) and torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
    "MASTER_ADDR, MASTER_PORT. Output lines are prefixed \"[rank] \".\n"
    "\n"
    "When a rank exits nonzero or is killed, when the timeout passes, or on SIGINT/SIGTERM, the\n"
    "other ranks get SIGTERM, then SIGKILL after the grace period, and efccl-mprun exits with\n"
    "that rank's status (128+signal when killed), 124 on timeout, 125 when it could not start.\n"
    "\n"
    "  -n, -np N          number of ranks (1..4096)\n"
    "  --hosts K          give the ranks K host identities (1..N), in contiguous blocks: rank r\n"
    "                     is on host r*K/N, with NCCL_HOSTID, EFCCL_MPRUN_HOST(S), GROUP_RANK\n"
    "                     and LOCAL_RANK/LOCAL_WORLD_SIZE of that host (efccl then connects the\n"
    "                     hosts over its network transport)\n"
    "  --timeout SECONDS  stop the job after this long (default: no limit)\n"
    "  --grace SECONDS    SIGTERM to SIGKILL (default 5)\n"
    "  --id-file PATH     EFCCL_MPRUN_ID_FILE (default: a file in a fresh temporary folder,\n"
    "                     removed at the end); a file already there is removed first\n"
    "  --mps              start a private MPS control daemon (nvidia-cuda-mps-control -d, its\n"
    "                     pipe and log folders in the job's temporary folder) so that ranks\n"
    "                     sharing a GPU run side by side; it is told to quit at the end\n";

int usage_error(const std::string& why) {
  std::fprintf(stderr, "efccl-mprun: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool parse_seconds(const char* text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !(v >= 0) || v > 1e7) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  efccl::mprun::LaunchOptions options;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "-n" || arg == "-np") {
      const char* v = value();
      char* end = nullptr;
      const long n = v != nullptr ? std::strtol(v, &end, 10) : 0;
      if (v == nullptr || *end != '\0' || n < 1 || n > efccl::mprun::kMaxRanks)
        return usage_error(std::string(arg) + " needs a number of ranks in 1..4096");
      options.nranks = static_cast<int>(n);
    } else if (arg == "--timeout" || arg == "--grace") {
      const char* v = value();
      double seconds = 0;
      if (v == nullptr || !parse_seconds(v, &seconds))
        return usage_error(std::string(arg) + " needs a number of seconds >= 0");
      (arg == "--timeout" ? options.timeout_s : options.grace_s) = seconds;
    } else if (arg == "--id-file") {
      const char* v = value();
      if (v == nullptr || v[0] == '\0') return usage_error("--id-file needs a path");
      options.id_file = v;
    } else if (arg == "--hosts") {
      const char* v = value();
      char* end = nullptr;
      const long k = v != nullptr ? std::strtol(v, &end, 10) : 0;
      if (v == nullptr || *end != '\0' || k < 1 || k > efccl::mprun::kMaxRanks)
        return usage_error("--hosts needs a number of hosts in 1..4096");
      options.hosts = static_cast<int>(k);
    } else if (arg == "--mps") {
      options.mps = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return usage_error("unknown option " + std::string(arg));
    } else {
      break;  // the program
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.nranks == 0) return usage_error("-n N is required");
  if (options.command.empty()) return usage_error("no program given");
  if (options.hosts > options.nranks)
    return usage_error("--hosts " + std::to_string(options.hosts) + " exceeds the " +
                       std::to_string(options.nranks) + " ranks");
  return efccl::mprun::run_job(options);
}
