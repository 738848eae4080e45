#include "efccl/net/proxy_settings.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include "efccl/common/log.h"

namespace efccl::net {
namespace {

constexpr int kAuto = -2;

/// NCCL's automatic choice for a NIC vendor (PCI vendor id in sysfs).
void auto_counts(const std::string& ifname, int* nthreads, int* nsocks) {
  *nthreads = 1;
  *nsocks = 1;
  if (ifname.empty() || ifname.find('/') != std::string::npos) return;
  std::ifstream f("/sys/class/net/" + ifname + "/device/vendor");
  std::string vendor;
  if (!(f >> vendor)) return;
  if (vendor == "0x1d0f") {  // AWS ENA
    *nthreads = 2;
    *nsocks = 8;
  } else if (vendor == "0x1ae0") {  // Google gVNIC
    *nthreads = 4;
    *nsocks = 1;
  }
}

/// Warns once per (variable, text) pair.
void warn_once(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(line).second) EFCCL_WARN(-1, line);
}

/// The integer in `name`, or kAuto when unset; an unreadable value is warned about (kAuto).
int env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return kAuto;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < -1000000 || v > 1000000) {
    warn_once(std::string(name) + "=" + text + " is not an integer; using the default");
    return kAuto;
  }
  return static_cast<int>(v);
}

}  // namespace

ProxySettings ProxySettings::for_interface(const Interface& interface) {
  ProxySettings s;
  s.interface = interface;
  int threads = env_int("NCCL_SOCKET_NTHREADS");
  int socks = env_int("NCCL_NSOCKS_PERTHREAD");
  int auto_threads = 1, auto_socks = 1;
  if (threads == kAuto || socks == kAuto) auto_counts(interface.name, &auto_threads, &auto_socks);
  if (threads == kAuto) threads = auto_threads;
  if (socks == kAuto) socks = auto_socks;
  if (threads < 1) {
    warn_once("NCCL_SOCKET_NTHREADS=" + std::to_string(threads) + " is below 1; using 1");
    threads = 1;
  }
  if (threads > kMaxThreads) {
    warn_once("NCCL_SOCKET_NTHREADS=" + std::to_string(threads) + " exceeds " +
              std::to_string(kMaxThreads) + "; using " + std::to_string(kMaxThreads));
    threads = kMaxThreads;
  }
  if (socks < 1) {
    warn_once("NCCL_NSOCKS_PERTHREAD=" + std::to_string(socks) + " is below 1; using 1");
    socks = 1;
  }
  if (threads * socks > kMaxSockets) {
    const int fit = kMaxSockets / threads;
    warn_once(std::to_string(threads) + " threads x " + std::to_string(socks) + " sockets exceed " +
              std::to_string(kMaxSockets) +
              " sockets per connection; using NCCL_NSOCKS_PERTHREAD=" + std::to_string(fit));
    socks = fit;
  }
  s.nthreads = threads;
  s.nsocks_per_thread = socks;
  return s;
}

StatusOr<ProxySettings> ProxySettings::from_environment() {
  auto chosen = choose_interface(nullptr);
  if (!chosen) return chosen.status();
  return for_interface(*chosen);
}

std::string ProxySettings::describe() const {
  return std::to_string(nthreads) + " thread(s) x " + std::to_string(nsocks_per_thread) +
         " socket(s) on " + interface.describe();
}

}  // namespace efccl::net
