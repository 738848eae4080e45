// Two "hosts" on one machine: two network namespaces joined by a veth pair, with addresses of
// their own (10.213.N.1/24 and .2/24) and no route to anything else. Made with iproute2 (`ip`),
// which needs root; create() says why when it cannot. Processes are started in a namespace by
// re-executing the running binary there. Removed (with the veth pair) when the object goes.
// Used by the proxy transport's tests (tests/net) and its benchmark (tools/bench).
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

extern char** environ;

namespace efccl_test {

class NetworkNamespaces {
 public:
  /// The pair, or null with the reason in *why (not root, no `ip`, no namespaces here).
  static std::unique_ptr<NetworkNamespaces> create(std::string* why) {
    if (geteuid() != 0) {
      *why = "creating network namespaces needs root";
      return nullptr;
    }
    if (!run("command -v ip")) {
      *why = "iproute2 (`ip`) is not installed (scripts/install-deps.sh installs it)";
      return nullptr;
    }
    std::unique_ptr<NetworkNamespaces> n(new NetworkNamespaces());
    const std::string tag = std::to_string(getpid());
    const int subnet = 1 + getpid() % 250;
    for (int i = 0; i < 2; ++i) {
      n->ns_[i] = std::string("efccl") + (i == 0 ? "A" : "B") + tag;
      n->if_[i] = std::string("efn") + (i == 0 ? "A" : "B") + tag;  // 15 characters at most
      n->ip_[i] = "10.213." + std::to_string(subnet) + "." + std::to_string(i + 1);
    }
    if (!run("ip netns add " + n->ns_[0])) {
      *why = "`ip netns add` failed (no CAP_SYS_ADMIN, or no network namespaces here)";
      return nullptr;
    }
    n->made_[0] = true;
    n->made_[1] = run("ip netns add " + n->ns_[1]);
    bool ok = n->made_[1] && run("ip link add " + n->if_[0] + " type veth peer name " + n->if_[1]);
    for (int i = 0; ok && i < 2; ++i)
      ok = run("ip link set " + n->if_[i] + " netns " + n->ns_[i]) &&
           run("ip -n " + n->ns_[i] + " addr add " + n->ip_[i] + "/24 dev " + n->if_[i]) &&
           run("ip -n " + n->ns_[i] + " link set " + n->if_[i] + " up") &&
           run("ip -n " + n->ns_[i] + " link set lo up");
    if (!ok) {
      *why = "creating a veth pair between two network namespaces failed";
      run("ip link del " + n->if_[0]);
      return nullptr;
    }
    return n;
  }

  ~NetworkNamespaces() {
    for (int i = 0; i < 2; ++i)
      if (made_[i]) run("ip netns del " + ns_[i]);  // takes its end of the veth pair along
  }
  NetworkNamespaces(const NetworkNamespaces&) = delete;
  NetworkNamespaces& operator=(const NetworkNamespaces&) = delete;

  /// Host i's namespace, interface ("efnA1234") and address ("10.213.N.1").
  const std::string& name(int i) const { return ns_[i]; }
  const std::string& interface(int i) const { return if_[i]; }
  const std::string& address(int i) const { return ip_[i]; }

  /// Starts this binary again in host `i`'s namespace with `argv` and this process's
  /// environment plus `vars` ("NAME=value"). A child that cannot enter exits 126.
  pid_t spawn(int i, std::vector<std::string> argv, const std::vector<std::string>& vars) const {
    return spawn_in("/var/run/netns/" + ns_[i], std::move(argv), vars);
  }

  /// The same without a namespace when `netns` is empty (loopback runs).
  static pid_t spawn_in(const std::string& netns, std::vector<std::string> argv,
                        const std::vector<std::string>& vars) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.insert(env.end(), vars.begin(), vars.end());
    std::vector<char*> envp, args;
    for (std::string& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    if (argv.empty()) argv.push_back("child");
    for (std::string& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      if (!netns.empty()) {
        const int fd = open(netns.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(126);
      }
      execve("/proc/self/exe", args.data(), envp.data());
      _exit(127);
    }
    return pid;
  }

  /// Takes host i's link down: packets stop, and no end of stream reaches anyone.
  bool link_down(int i) const { return run("ip -n " + ns_[i] + " link set " + if_[i] + " down"); }

  /// Runs a shell line quietly; true when it exits 0.
  static bool run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }

 private:
  NetworkNamespaces() = default;
  std::string ns_[2], if_[2], ip_[2];
  bool made_[2] = {false, false};
};

}  // namespace efccl_test
