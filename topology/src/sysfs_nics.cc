// Network ports from class/infiniband and class/net (sysfs_nics.h).
#include "sysfs_nics.h"

#include <set>

namespace efccl::topo::sysfs {
namespace fs = std::filesystem;

namespace {

/// A device or interface name as the graph keeps it: printable ASCII (Linux allows any byte
/// but '/' and NUL in an interface name), other bytes as '?', at most 64 bytes.
std::string printable_name(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (out.size() >= 64) break;
    const auto u = static_cast<unsigned char>(c);
    out += u >= 0x20 && u < 0x7f ? c : '?';
  }
  return out;
}


std::string gbits_text(double gbits) {
  std::string s = std::to_string(gbits);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

/// The port of an InfiniBand device a NIC stands for: the lowest-numbered ACTIVE one (a port
/// whose state cannot be read counts as usable). nullopt when every port reports another state.
std::optional<std::string> usable_port(const fs::path& ports, const std::vector<std::string>& names,
                                       std::string& states) {
  for (const std::string& port : names) {
    const auto state = read_attribute(ports / port / "state");
    if (!state || state->find("ACTIVE") != std::string::npos) return port;
    states += (states.empty() ? "" : ", ") + std::string("port ") + port + " " + *state;
  }
  return std::nullopt;
}

void add_infiniband(const SysfsTree& tree, std::vector<DetectedNic>& nics,
                    std::vector<std::string>& notes) {
  const fs::path base = tree.root() / "class" / "infiniband";
  for (const std::string& dev : list_directory(base)) {
    if (nics.size() >= kMaxNics) return;
    const fs::path ports = base / dev / "ports";
    const std::vector<std::string> port_names = list_directory(ports);
    std::string states;
    std::optional<std::string> port;
    if (!port_names.empty()) {
      port = usable_port(ports, port_names, states);
      if (!port) {
        notes.push_back("InfiniBand device " + dev + " has no active port (" + states +
                        "): not used");
        continue;
      }
    }
    DetectedNic nic;
    nic.name = printable_name(dev);
    std::optional<double> gbits;
    if (port)
      if (auto rate = read_attribute(ports / *port / "rate")) gbits = parse_ib_rate(*rate);
    if (!gbits) {
      notes.push_back("InfiniBand device " + dev + ": port rate unreadable (" +
                      (ports / (port ? *port : std::string("1")) / "rate").string() +
                      "): " + gbits_text(kAssumedNicGbits) + " Gb/s assumed");
      gbits = kAssumedNicGbits;
    }
    nic.gbps = *gbits / 8.0;
    if (auto pci = tree.device_at(base / dev / "device"))
      nic.pci = std::move(*pci);
    else
      notes.push_back("InfiniBand device " + dev + ": " + pci.status().message() +
                      ": placed under the first CPU");
    nics.push_back(std::move(nic));
  }
}

void add_ethernet(const SysfsTree& tree, std::vector<DetectedNic>& nics,
                  std::vector<std::string>& notes) {
  std::set<std::string> taken;  // PCI functions already listed (RoCE, IPoIB, representors)
  for (const DetectedNic& n : nics)
    if (n.pci) taken.insert(n.pci->bus_id);
  const fs::path base = tree.root() / "class" / "net";
  for (const std::string& name : list_directory(base)) {
    if (nics.size() >= kMaxNics) return;
    if (name == "lo") continue;
    const fs::path dir = base / name;
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(dir / "device", ec))) continue;  // virtual: no device
    auto pci = tree.device_at(dir / "device");
    if (pci && taken.count(pci->bus_id)) continue;
    if (auto state = read_attribute(dir / "operstate"); state && *state == "down") {
      notes.push_back("network interface " + name + " is down: not used");
      continue;
    }
    DetectedNic nic;
    nic.name = printable_name(name);
    std::optional<long> mbits;
    if (auto speed = read_attribute(dir / "speed")) mbits = parse_integer(*speed);
    if (mbits && *mbits > 0 && *mbits <= 100'000'000) {
      nic.gbps = static_cast<double>(*mbits) / 8000.0;
    } else {
      notes.push_back("network interface " + name + ": speed unknown (" + (dir / "speed").string() +
                      (mbits ? " says " + std::to_string(*mbits) : std::string(" unreadable")) +
                      "): " + gbits_text(kAssumedNicGbits) + " Gb/s assumed");
      nic.gbps = kAssumedNicGbits / 8.0;
    }
    if (pci) {
      taken.insert(pci->bus_id);
      nic.pci = std::move(*pci);
    } else {
      notes.push_back("network interface " + name + ": " + pci.status().message() +
                      ": placed under the first CPU");
    }
    nics.push_back(std::move(nic));
  }
}

}  // namespace

std::vector<DetectedNic> list_nics(const SysfsTree& tree, std::vector<std::string>& notes) {
  std::vector<DetectedNic> nics;
  add_infiniband(tree, nics, notes);
  add_ethernet(tree, nics, notes);
  return nics;
}

}  // namespace efccl::topo::sysfs
