// Bounded sysfs reads: attributes, directories, the PCI tree, NUMA nodes (sysfs_pci.h).
#include "sysfs_pci.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

namespace efccl::topo::sysfs {
namespace fs = std::filesystem;

namespace {

// A path deeper than this many bridges is not a machine we know; stop there.
constexpr std::size_t kMaxBridges = 32;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_hex_digit(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

std::optional<uint32_t> hex_field(std::string_view s, std::size_t max_digits) {
  if (s.empty() || s.size() > max_digits) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    if (!is_hex_digit(c)) return std::nullopt;
    v = v * 16 +
        static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                  ? c - '0'
                                  : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
  }
  return v;
}

PciLink read_link(const fs::path& dir) {
  PciLink link;
  if (auto s = read_attribute(dir / "max_link_speed"))
    if (auto gts = parse_link_speed(*s)) link.gts = *gts;
  if (auto s = read_attribute(dir / "max_link_width"))
    if (auto w = parse_integer(*s); w && *w >= 1 && *w <= 64) link.width = static_cast<int>(*w);
  return link;
}

std::optional<uint32_t> read_hex(const fs::path& file) {
  auto s = read_attribute(file);
  return s ? parse_hex(*s) : std::nullopt;
}

bool is_bridge(uint32_t class_code) { return (class_code >> 8) == 0x0604; }

}  // namespace

std::optional<std::string> read_attribute(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return std::nullopt;
  }
  std::string text(kMaxAttributeBytes, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0) {
      ::close(fd);
      return std::nullopt;  // EIO is what some sysfs attributes answer when not applicable
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  return std::string(trim(text));
}

bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      std::string_view na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      while (na.size() > 1 && na.front() == '0') na.remove_prefix(1);
      while (nb.size() > 1 && nb.front() == '0') nb.remove_prefix(1);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  return a < b;  // equal up to leading zeros: any fixed order
}

std::vector<std::string> list_directory(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return names;
  for (; it != fs::directory_iterator() && names.size() < kMaxDirectoryEntries; it.increment(ec)) {
    if (ec) break;
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return natural_less(a, b); });
  return names;
}

std::optional<std::string> normalize_bus_id(std::string_view text) {
  text = trim(text);
  // [domain:]bus:device.function
  const std::size_t dot = text.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::size_t colon2 = text.rfind(':', dot);
  if (colon2 == std::string_view::npos) return std::nullopt;
  const std::size_t colon1 = colon2 == 0 ? std::string_view::npos : text.rfind(':', colon2 - 1);
  std::optional<uint32_t> domain = 0;
  std::string_view bus_text;
  if (colon1 == std::string_view::npos) {
    bus_text = text.substr(0, colon2);
  } else {
    domain = hex_field(text.substr(0, colon1), 8);
    bus_text = text.substr(colon1 + 1, colon2 - colon1 - 1);
  }
  const auto bus = hex_field(bus_text, 2);
  const auto device = hex_field(text.substr(colon2 + 1, dot - colon2 - 1), 2);
  const auto function = hex_field(text.substr(dot + 1), 1);
  if (!domain || !bus || !device || !function || *device > 0x1f || *function > 7)
    return std::nullopt;
  char out[32];
  std::snprintf(out, sizeof out, "%04x:%02x:%02x.%x", *domain, *bus, *device, *function);
  return std::string(out);
}

std::optional<double> parse_link_speed(std::string_view text) {
  text = trim(text);
  double gts = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), gts);
  if (ec != std::errc() || !(gts > 0 && gts <= 1024)) return std::nullopt;
  const std::string_view unit = trim(text.substr(static_cast<std::size_t>(end - text.data())));
  if (unit.substr(0, 4) != "GT/s") return std::nullopt;
  return gts;
}

std::optional<long> parse_integer(std::string_view text) {
  text = trim(text);
  long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

std::optional<uint32_t> parse_hex(std::string_view text) {
  text = trim(text);
  if (text.substr(0, 2) == "0x" || text.substr(0, 2) == "0X") text.remove_prefix(2);
  return hex_field(text, 8);
}

std::optional<double> parse_ib_rate(std::string_view text) {
  text = trim(text);
  double gb = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), gb);
  if (ec != std::errc() || !(gb > 0 && gb <= 100000)) return std::nullopt;
  const std::string_view unit = trim(text.substr(static_cast<std::size_t>(end - text.data())));
  if (unit.substr(0, 2) != "Gb") return std::nullopt;
  return gb;
}

StatusOr<PciDevice> SysfsTree::device_at(const fs::path& link) const {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(link, ec)))
    return Status::error(link.string() + " is missing");
  const fs::path real = fs::canonical(link, ec);
  if (ec) return Status::error(link.string() + " cannot be resolved (" + ec.message() + ")");
  // The PCI components of the resolved path, each with the directory it names.
  std::vector<std::pair<std::string, fs::path>> components;
  fs::path prefix;
  for (const fs::path& part : real) {
    prefix /= part;
    if (auto id = normalize_bus_id(part.string())) components.emplace_back(*id, prefix);
  }
  // The device is the deepest PCI component (a net device's `device` may be a virtio device
  // below its PCI function).
  if (components.empty())
    return Status::error(link.string() + " -> " + real.string() + " is not a PCI device");
  PciDevice d;
  const fs::path& dir = components.back().second;
  d.bus_id = components.back().first;
  d.class_code = read_hex(dir / "class");
  d.vendor = read_hex(dir / "vendor");
  if (auto s = read_attribute(dir / "numa_node"))
    if (auto n = parse_integer(*s); n && *n >= 0 && *n < 65536) d.numa = static_cast<int>(*n);
  d.link = read_link(dir);
  components.pop_back();
  for (const auto& [id, bridge_dir] : components) {
    if (d.bridges.size() >= kMaxBridges) break;
    const auto cls = read_hex(bridge_dir / "class");
    if (cls && !is_bridge(*cls)) continue;  // not a PCI-to-PCI bridge: not a hop of the tree
    d.bridges.push_back({id, read_link(bridge_dir)});
  }
  return d;
}

StatusOr<PciDevice> SysfsTree::device(const std::string& bus_id) const {
  return device_at(root_ / "bus" / "pci" / "devices" / bus_id);
}

std::vector<std::string> SysfsTree::nvidia_gpus() const {
  std::vector<std::string> gpus;
  for (const std::string& name : list_directory(root_ / "bus" / "pci" / "devices")) {
    const auto id = normalize_bus_id(name);
    if (!id) continue;
    if (is_nvidia_gpu(name)) gpus.push_back(*id);
  }
  std::sort(gpus.begin(), gpus.end());  // fixed-width lower-case hex: text order is bus order
  gpus.erase(std::unique(gpus.begin(), gpus.end()), gpus.end());
  return gpus;
}

bool SysfsTree::is_nvidia_gpu(const std::string& bus_id) const {
  const fs::path dir = root_ / "bus" / "pci" / "devices" / bus_id;
  const auto vendor = read_hex(dir / "vendor");
  const auto cls = read_hex(dir / "class");
  return vendor && *vendor == 0x10de && cls && ((*cls >> 8) == 0x0300 || (*cls >> 8) == 0x0302);
}

std::vector<int> SysfsTree::cpu_numa_nodes() const {
  std::vector<int> nodes;
  const fs::path base = root_ / "devices" / "system" / "node";
  for (const std::string& name : list_directory(base)) {
    if (name.size() < 5 || name.compare(0, 4, "node") != 0) continue;
    const auto n = parse_integer(std::string_view(name).substr(4));
    if (!n || *n < 0 || *n >= 65536 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    const auto cpus = read_attribute(base / name / "cpulist");
    if (cpus && cpus->empty()) continue;  // memory only (CXL, HBM): no CPU to hang devices on
    nodes.push_back(static_cast<int>(*n));
  }
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

}  // namespace efccl::topo::sysfs
