// `efccl topo` (topo_command.h): where the graph comes from, and its summary.
//
// The CLI is built without CUDA (tools/cli/CMakeLists.txt links no CUDA target), so --detect
// passes no CUDA devices: DetectOptions{} lets detection find the GPUs in sysfs and NVML.
#include "topo_command.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "args.h"
#include "input_file.h"
#include "efccl/topology/detect.h"
#include "efccl/topology/nccl_xml.h"
#include "efccl/topology/presets.h"
#include "efccl/topology/svg.h"
#include "efccl/topology/topology.h"

namespace efccl::cli {
namespace {

namespace topo = efccl::topo;

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
/// The summary lists hosts one by one up to this many; --json lists every node.
constexpr int32_t kMaxListedHosts = 8;

/// A graph and what its source had to say about it.
struct Loaded {
  topo::Topology topology;
  std::string source;              ///< "preset dgx-h100", "detected", "FILE (NCCL XML)"
  std::vector<std::string> notes;  ///< detection's notes
};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

/// `id` without its host prefix ("h0.gpu3" -> "gpu3") when the prefix is the node's host.
std::string short_id(const topo::Node& n) {
  const std::string prefix = "h" + std::to_string(n.host) + ".";
  return n.id.rfind(prefix, 0) == 0 ? n.id.substr(prefix.size()) : n.id;
}

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }
std::string or_dash(int32_t v) { return v < 0 ? "-" : std::to_string(v); }

/// Prints rows as columns two spaces apart, each line indented by `indent`.
void print_table(const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  std::vector<std::size_t> width;
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  for (const auto& row : rows) {
    std::string line = indent;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << '\n';
  }
}

/// The graph of one host repeated `nodes` times (hosts joined by rail switches).
std::optional<topo::Topology> cluster_of(const topo::Topology& host, int32_t nodes,
                                         const std::string& what) {
  if (nodes == 1 && host.hosts() <= 1) return host;
  auto merged = topo::repeat_host(host, nodes, what);
  if (!merged) {
    std::cerr << "efccl topo: --nodes " << nodes << ": " << merged.status().message() << '\n';
    return std::nullopt;
  }
  return std::move(*merged);
}

void print_host(const topo::Topology& t, int32_t host) {
  std::cout << "host " << host << '\n';
  const auto gpus = t.gpus_of_host(host);
  if (gpus.empty()) {
    std::cout << "  GPUs: none (no GPU was found)\n";
  } else {
    std::vector<std::vector<std::string>> rows = {
        {"GPU", "name", "pci", "numa", "sm", "rail NIC", "NVLink GB/s/dir", "NVLink peers"}};
    for (topo::NodeIndex g : gpus) {
      const topo::Node& n = t.node(g);
      const auto rail = t.rail_nic(g);
      int32_t links = 0;
      for (topo::LinkIndex l : t.out_links(g))
        if (t.link(l).kind == topo::LinkKind::kNvlink) links += t.link(l).lanes;
      std::string peers;
      for (topo::NodeIndex other : gpus)
        if (t.nvlink_peers(g, other)) peers += (peers.empty() ? "" : " ") + short_id(t.node(other));
      const double nvlink = t.nvlink_gbps(g);
      rows.push_back({n.id, or_dash(n.name), or_dash(n.pci), or_dash(n.numa),
                      n.sm > 0 ? std::to_string(n.sm) : "-",
                      rail ? t.node(*rail).id + " (" + or_dash(t.node(*rail).name) + ")" : "-",
                      nvlink > 0 ? number(nvlink) + " (" + std::to_string(links) + " links)" : "-",
                      or_dash(peers)});
    }
    print_table(rows, "  ");
  }
  std::vector<std::vector<std::string>> nics = {{"NIC", "name", "GB/s", "rail", "numa", "pci"}};
  for (topo::NodeIndex x : t.nics()) {
    const topo::Node& n = t.node(x);
    if (n.host != host) continue;
    nics.push_back(
        {n.id, or_dash(n.name), number(n.gbps), or_dash(n.rail), or_dash(n.numa), or_dash(n.pci)});
  }
  if (nics.size() == 1)
    std::cout << "  NICs: none\n";
  else
    print_table(nics, "  ");

  std::string switches;
  for (topo::NodeIndex s : t.nodes_of(topo::NodeKind::kPcieSwitch)) {
    const topo::Node& n = t.node(s);
    if (n.host != host) continue;
    switches += "\n    " + n.id + " (numa " + or_dash(n.numa) +
                (n.pci.empty() ? "" : ", pci " + n.pci) + ")";
  }
  std::cout << "  PCIe switches:" << (switches.empty() ? " none" : switches) << '\n';
  std::string cpus;
  for (topo::NodeIndex c : t.nodes_of(topo::NodeKind::kCpu)) {
    const topo::Node& n = t.node(c);
    if (n.host != host) continue;
    cpus += "\n    " + n.id + " (numa " + or_dash(n.numa);
    if (auto mem = t.memory_of(c)) {
      double gbps = 0;
      for (topo::LinkIndex l : t.out_links(c))
        if (t.link(l).to == *mem) gbps = t.link(l).gbps;
      cpus += ", memory " + t.node(*mem).id + " " + number(gbps) + " GB/s";
    }
    for (topo::LinkIndex l : t.out_links(c))
      if (t.link(l).kind == topo::LinkKind::kSmp)
        cpus += ", to " + t.node(t.link(l).to).id + " " + number(t.link(l).gbps) + " GB/s";
    cpus += ")";
  }
  std::cout << "  CPUs:" << (cpus.empty() ? " none" : cpus) << '\n';
  std::string nvswitches;
  for (topo::NodeIndex s : t.nodes_of(topo::NodeKind::kNvSwitch))
    if (t.node(s).host == host) nvswitches += " " + t.node(s).id;
  if (!nvswitches.empty()) std::cout << "  NVSwitch fabric:" << nvswitches << '\n';
}

void print_summary(const Loaded& loaded) {
  const topo::Topology& t = loaded.topology;
  const auto count = [&](topo::NodeKind k) { return t.nodes_of(k).size(); };
  std::cout << "source: " << loaded.source << '\n'
            << "hosts " << t.hosts() << ", GPUs " << t.gpus().size() << ", NICs " << t.nics().size()
            << ", PCIe switches " << count(topo::NodeKind::kPcieSwitch) << ", CPUs "
            << count(topo::NodeKind::kCpu) << ", NVSwitch fabrics "
            << count(topo::NodeKind::kNvSwitch) << ", rail switches "
            << count(topo::NodeKind::kRailSwitch) << '\n'
            << "nodes " << t.nodes().size() << ", links " << t.links().size()
            << " (directed; GB/s per direction)\n";
  if (t.gpus().empty()) std::cout << "no GPU was found\n";
  const int32_t hosts = t.hosts();
  for (int32_t h = 0; h < hosts && h < kMaxListedHosts; ++h) {
    std::cout << '\n';
    print_host(t, h);
  }
  if (hosts > kMaxListedHosts)
    std::cout << "\nhosts " << kMaxListedHosts << ".." << hosts - 1
              << ": not listed (--json lists every node)\n";
  const auto rails = t.nodes_of(topo::NodeKind::kRailSwitch);
  if (!rails.empty()) {
    std::cout << "\nrail switches:\n";
    std::vector<std::vector<std::string>> rows;
    for (topo::NodeIndex r : rails) {
      std::size_t nics = 0;
      double lo = 0, hi = 0;
      for (topo::LinkIndex l : t.out_links(r)) {
        const double g = t.link(l).gbps;
        lo = nics == 0 ? g : std::min(lo, g);
        hi = nics == 0 ? g : std::max(hi, g);
        ++nics;
      }
      rows.push_back({t.node(r).id, std::to_string(nics) + " NICs",
                      (lo == hi ? number(lo) : number(lo) + ".." + number(hi)) + " GB/s each"});
    }
    print_table(rows, "  ");
  }
  if (!loaded.notes.empty()) {
    std::cout << "\nnotes:\n";
    for (const auto& note : loaded.notes) std::cout << "  " << note << '\n';
  }
}

}  // namespace

int cmd_topo(const std::vector<std::string>& argv) {
  Args args(argv, {"--xml", "--preset", "--json-file", "--nodes", "--svg"}, {"--detect", "--json"});
  if (!args.positional().empty())
    throw UsageError{"topo takes no positional argument, got '" + args.positional()[0] + "'"};
  std::vector<std::string> sources;
  if (args.has("--detect")) sources.push_back("--detect");
  for (const char* flag : {"--xml", "--preset", "--json-file"})
    if (args.value(flag)) sources.push_back(flag);
  if (sources.size() > 1)
    throw UsageError{sources[0] + " and " + sources[1] + " exclude each other (one source)"};
  const int32_t nodes =
      args.value("--nodes") ? parse_i32("--nodes", *args.value("--nodes"), 1, topo::kMaxHosts) : 1;
  if (auto svg = args.value("--svg"); svg && svg->empty()) throw UsageError{"--svg: empty path"};

  Loaded loaded;
  if (auto name = args.value("--preset")) {
    const auto names = topo::preset_names();
    if (std::find(names.begin(), names.end(), *name) == names.end()) {
      std::string known;
      for (std::string_view n : names) known += (known.empty() ? "" : ", ") + std::string(n);
      throw UsageError{"--preset: unknown preset '" + *name + "' (known: " + known + ")"};
    }
    auto t = topo::preset(*name, nodes);
    if (!t) {
      std::cerr << "efccl topo: " << t.status().message() << '\n';
      return kExitFailed;
    }
    loaded.topology = std::move(*t);
    loaded.source = "preset " + *name + (nodes > 1 ? ", " + std::to_string(nodes) + " hosts" : "");
  } else {
    std::optional<topo::Topology> host;
    if (auto path = args.value("--xml")) {
      std::error_code ec;
      if (!std::filesystem::exists(*path, ec)) {
        std::cerr << *path << ": no such file\n";
        return kExitFailed;
      }
      auto t = topo::load_nccl_xml(*path);
      if (!t) {
        const std::string& m = t.status().message();
        std::cerr << (m.find(*path) == std::string::npos ? *path + ": " : "") << m << '\n';
        return kExitFailed;
      }
      host = std::move(*t);
      loaded.source = *path + " (NCCL topology XML)";
    } else if (auto path = args.value("--json-file")) {
      auto text = read_input_file(*path, "efccl topo");
      if (!text) return kExitFailed;
      auto t = topo::from_json(*text, *path);
      if (!t) {
        std::cerr << t.status().message() << '\n';
        return kExitFailed;
      }
      host = std::move(*t);
      loaded.source = *path + " (efccl topology JSON)";
    } else {
      topo::DetectOptions options;  // no CUDA here: detection finds the GPUs itself
      if (const char* file = std::getenv("NCCL_TOPO_FILE"); file && *file)
        options.nccl_topo_file = file;
      topo::Detection d = topo::detect_host(options);
      host = std::move(d.topology);
      loaded.notes = std::move(d.notes);
      loaded.source =
          "detected on this host" + (options.nccl_topo_file.empty()
                                         ? std::string()
                                         : " (NCCL_TOPO_FILE=" + options.nccl_topo_file + ")");
    }
    auto cluster = cluster_of(*host, nodes, loaded.source);
    if (!cluster) return kExitFailed;
    loaded.topology = std::move(*cluster);
    if (nodes > 1) loaded.source += ", " + std::to_string(nodes) + " copies";
  }

  if (args.has("--json")) {
    std::cout << topo::to_json(loaded.topology) << '\n';
    for (const auto& note : loaded.notes) std::cerr << "efccl topo: note: " << note << '\n';
  } else {
    print_summary(loaded);
  }
  if (auto path = args.value("--svg")) {
    std::ofstream out(*path, std::ios::binary | std::ios::trunc);
    out << topo::to_svg(loaded.topology);
    out.close();
    if (!out) {
      std::cerr << *path << ": cannot write\n";
      return kExitFailed;
    }
    if (!args.has("--json")) std::cout << "\npicture: " << *path << '\n';
  }
  return kExitOk;
}

}  // namespace efccl::cli
