// The graph's JSON form (to_json / from_json) and joining hosts (merge_hosts).
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "efccl/topology/topology.h"

namespace efccl::topo {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxJsonBytes = 16u << 20;
constexpr double kNetLatencyUs = 1.5;  // a NIC to its rail switch (docs/topology.md)

/// `v` rounded to 6 significant digits, so that the text is the same on every machine.
double rounded(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return std::strtod(buf, nullptr);
}

json node_json(const Topology& t, NodeIndex i) {
  const Node& n = t.node(i);
  json j = {{"id", n.id}, {"host", n.host}};
  if (n.kind == NodeKind::kGpu) {
    const auto rail = t.rail_nic(i);
    j["rail"] = rail ? json(t.node(*rail).id) : json(nullptr);
    j["pci"] = n.pci;
    j["numa"] = n.numa;
    j["sm"] = n.sm;
    j["device"] = n.device;
    j["name"] = n.name;
    j["index"] = n.index;
    return j;
  }
  if (n.kind == NodeKind::kNic) {
    j["name"] = n.name;
    j["gbps"] = rounded(n.gbps);
    j["rail"] = n.rail;
    j["pci"] = n.pci;
    j["numa"] = n.numa;
    j["device"] = n.device;
    j["index"] = n.index;
    return j;
  }
  j["kind"] = std::string(to_string(n.kind));
  j["index"] = n.index;
  if (!n.pci.empty()) j["pci"] = n.pci;
  if (n.numa >= 0) j["numa"] = n.numa;
  if (n.rail >= 0) j["rail"] = n.rail;
  if (!n.name.empty()) j["name"] = n.name;
  return j;
}

/// Reads member `key` of object `o` as T, or fails naming `what`.
template <typename T>
Status read(const json& o, const char* key, T& out, const std::string& what, bool required) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) {
    if (required) return Status::error(what + ": no \"" + key + "\"");
    return Status::ok();
  }
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return Status::error(what + ": \"" + key + "\" is not a string");
    const std::string& text = it->get_ref<const std::string&>();
    if (text.size() > 256)
      return Status::error(what + ": \"" + key + "\" is longer than 256 bytes");
    for (char c : text)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        return Status::error(what + ": \"" + key + "\" has a byte that is not printable ASCII");
    out = text;
  } else if constexpr (std::is_same_v<T, double>) {
    if (!it->is_number()) return Status::error(what + ": \"" + key + "\" is not a number");
    out = it->get<double>();
    // Capacities, latencies and speeds: 1e-6 ... 1e7 (GB/s or us), or 0.
    if (!std::isfinite(out) || out < 0 || out > 1e7 || (out > 0 && out < 1e-6))
      return Status::error(what + ": \"" + key + "\" is not 0 or a number from 1e-6 to 1e7");
  } else {
    if (!it->is_number_integer())
      return Status::error(what + ": \"" + key + "\" is not an integer");
    if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{1} << 24)
      return Status::error(what + ": \"" + key + "\" is out of range");
    const auto v = it->get<int64_t>();
    if (v < -1 || v > (1 << 24)) return Status::error(what + ": \"" + key + "\" is out of range");
    out = static_cast<T>(v);
  }
  return Status::ok();
}

}  // namespace

std::string to_json(const Topology& t, int indent) {
  json j;
  j["hosts"] = t.hosts();
  j["gpus"] = json::array();
  for (NodeIndex g : t.gpus()) j["gpus"].push_back(node_json(t, g));
  j["nics"] = json::array();
  for (NodeIndex n : t.nics()) j["nics"].push_back(node_json(t, n));
  j["nodes"] = json::array();
  for (NodeIndex i = 0; i < t.nodes().size(); ++i)
    if (t.node(i).kind != NodeKind::kGpu && t.node(i).kind != NodeKind::kNic)
      j["nodes"].push_back(node_json(t, i));
  j["links"] = json::array();
  for (const Link& l : t.links())
    j["links"].push_back({{"from", t.node(l.from).id},
                          {"to", t.node(l.to).id},
                          {"kind", std::string(to_string(l.kind))},
                          {"gbps", rounded(l.gbps)},
                          {"latency_us", rounded(l.latency_us)},
                          {"lanes", l.lanes}});
  // Strings that are not UTF-8 (a graph built through the API) are replaced, never thrown on.
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

StatusOr<Topology> from_json(std::string_view text, std::string_view where) {
  const std::string w(where);
  if (text.size() > kMaxJsonBytes)
    return Status::error(w + ": " + std::to_string(text.size()) + " bytes, more than the " +
                         std::to_string(kMaxJsonBytes) + " a topology may have");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(w + ": not valid JSON");
  if (!j.is_object()) return Status::error(w + ": not a JSON object");
  Topology t;
  const auto add_nodes = [&](const char* key, std::optional<NodeKind> kind) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::error(w + ": no \"" + key + "\" array");
    if (!it->is_array()) return Status::error(w + ": \"" + key + "\" is not an array");
    if (it->size() > kMaxNodes)
      return Status::error(w + ": more than " + std::to_string(kMaxNodes) + " " + key);
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& o = (*it)[i];
      const std::string what = w + ": " + key + "[" + std::to_string(i) + "]";
      if (!o.is_object()) return Status::error(what + " is not an object");
      Node n;
      if (kind) {
        n.kind = *kind;
      } else {
        std::string k;
        if (Status s = read(o, "kind", k, what, true); !s) return s;
        auto parsed = node_kind_from_string(k);
        if (!parsed || *parsed == NodeKind::kGpu || *parsed == NodeKind::kNic)
          return Status::error(what + ": unknown kind '" + k + "'");
        n.kind = *parsed;
      }
      std::string rail_id;  // a GPU's rail is derived, not read
      if (Status s = read(o, "id", n.id, what, true); !s) return s;
      if (Status s = read(o, "host", n.host, what, true); !s) return s;
      if (Status s = read(o, "index", n.index, what, false); !s) return s;
      if (Status s = read(o, "pci", n.pci, what, false); !s) return s;
      if (Status s = read(o, "numa", n.numa, what, false); !s) return s;
      if (Status s = read(o, "name", n.name, what, false); !s) return s;
      if (Status s = read(o, "sm", n.sm, what, false); !s) return s;
      if (Status s = read(o, "device", n.device, what, false); !s) return s;
      if (n.kind != NodeKind::kGpu)
        if (Status s = read(o, "rail", n.rail, what, false); !s) return s;
      if (Status s = read(o, "gbps", n.gbps, what, n.kind == NodeKind::kNic); !s) return s;
      if (auto added = t.add_node(std::move(n)); !added)
        return Status::error(what + ": " + added.status().message());
    }
    return Status::ok();
  };
  if (Status s = add_nodes("gpus", NodeKind::kGpu); !s) return s;
  if (Status s = add_nodes("nics", NodeKind::kNic); !s) return s;
  if (Status s = add_nodes("nodes", std::nullopt); !s) return s;
  auto links = j.find("links");
  if (links == j.end() || !links->is_array())
    return Status::error(w + ": no \"links\" array");
  if (links->size() > kMaxLinks)
    return Status::error(w + ": more than " + std::to_string(kMaxLinks) + " links");
  std::map<std::string, NodeIndex, std::less<>> by_id;
  for (NodeIndex i = 0; i < t.nodes().size(); ++i) by_id.emplace(t.node(i).id, i);
  for (std::size_t i = 0; i < links->size(); ++i) {
    const json& o = (*links)[i];
    const std::string what = w + ": links[" + std::to_string(i) + "]";
    if (!o.is_object()) return Status::error(what + " is not an object");
    std::string from, to, kind;
    Link l;
    if (Status s = read(o, "from", from, what, true); !s) return s;
    if (Status s = read(o, "to", to, what, true); !s) return s;
    if (Status s = read(o, "kind", kind, what, true); !s) return s;
    if (Status s = read(o, "gbps", l.gbps, what, true); !s) return s;
    if (Status s = read(o, "latency_us", l.latency_us, what, false); !s) return s;
    if (Status s = read(o, "lanes", l.lanes, what, false); !s) return s;
    auto f = by_id.find(from);
    auto tt = by_id.find(to);
    if (f == by_id.end()) return Status::error(what + ": no node '" + from + "'");
    if (tt == by_id.end()) return Status::error(what + ": no node '" + to + "'");
    auto k = link_kind_from_string(kind);
    if (!k) return Status::error(what + ": unknown kind '" + kind + "'");
    l.from = f->second;
    l.to = tt->second;
    l.kind = *k;
    if (auto added = t.add_link(l); !added)
      return Status::error(what + ": " + added.status().message());
  }
  if (Status s = t.check(); !s) return Status::error(w + ": " + s.message());
  return t;
}

StatusOr<Topology> merge_hosts(std::span<const Topology> hosts) {
  if (hosts.empty()) return Status::error("no hosts to merge");
  if (hosts.size() > static_cast<std::size_t>(kMaxHosts))
    return Status::error(std::to_string(hosts.size()) + " hosts, more than " +
                         std::to_string(kMaxHosts));
  Topology out;
  std::map<int32_t, std::vector<NodeIndex>> rails;  // NIC index -> NICs of that index
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const Topology& in = hosts[h];
    if (in.hosts() > 1)
      return Status::error("host " + std::to_string(h) + "'s graph spans " +
                           std::to_string(in.hosts()) + " hosts");
    const std::string prefix = "h" + std::to_string(h) + ".";
    const NodeIndex base = static_cast<NodeIndex>(out.nodes().size());
    for (const Node& n : in.nodes()) {
      if (n.kind == NodeKind::kRailSwitch) continue;
      Node copy = n;
      copy.host = static_cast<int32_t>(h);
      copy.id = prefix + (n.id.rfind("h0.", 0) == 0 ? n.id.substr(3) : n.id);
      if (copy.kind == NodeKind::kNic) copy.rail = copy.index;
      auto added = out.add_node(std::move(copy));
      if (!added) return added.status();
      if (n.kind == NodeKind::kNic) rails[n.index].push_back(*added);
    }
    // Rail switches of an input (a graph merged before) are dropped, and so are their links.
    std::vector<NodeIndex> renumber(in.nodes().size(), 0);
    NodeIndex next = base;
    for (NodeIndex i = 0; i < in.nodes().size(); ++i)
      renumber[i] = in.node(i).kind == NodeKind::kRailSwitch ? kMaxNodes : next++;
    for (const Link& l : in.links()) {
      if (renumber[l.from] == kMaxNodes || renumber[l.to] == kMaxNodes) continue;
      Link copy = l;
      copy.from = renumber[l.from];
      copy.to = renumber[l.to];
      if (auto added = out.add_link(copy); !added) return added.status();
    }
  }
  for (const auto& [rail, nics] : rails) {
    Node sw;
    sw.kind = NodeKind::kRailSwitch;
    sw.id = "rail" + std::to_string(rail);
    sw.host = -1;
    sw.index = rail;
    sw.rail = rail;
    auto added = out.add_node(std::move(sw));
    if (!added) return added.status();
    for (NodeIndex nic : nics) {
      const double gbps = out.node(nic).gbps;
      if (!(gbps > 0)) return Status::error("NIC '" + out.node(nic).id + "' has no speed");
      if (Status s = out.add_duplex(nic, *added, LinkKind::kNet, gbps, kNetLatencyUs); !s)
        return s;
    }
  }
  return out;
}

StatusOr<Topology> repeat_host(const Topology& host, int nodes, std::string_view what) {
  const std::string w(what);
  if (nodes < 1 || nodes > kMaxHosts)
    return Status::error("--nodes " + std::to_string(nodes) + ": a cluster has 1 ... " +
                         std::to_string(kMaxHosts) + " hosts");
  if (host.hosts() > 1)
    return Status::error(w + " already has " + std::to_string(host.hosts()) +
                         " hosts; --nodes repeats a one-host graph");
  if (static_cast<uint64_t>(nodes) * host.nodes().size() > kMaxNodes ||
      static_cast<uint64_t>(nodes) * host.links().size() > kMaxLinks)
    return Status::error("--nodes " + std::to_string(nodes) + " copies of " + w + " (" +
                         std::to_string(host.nodes().size()) + " nodes, " +
                         std::to_string(host.links().size()) + " links) exceed the " +
                         std::to_string(kMaxNodes) + " nodes or " + std::to_string(kMaxLinks) +
                         " links a graph may have");
  std::vector<Topology> hosts(static_cast<std::size_t>(nodes), host);
  return merge_hosts(hosts);
}

}  // namespace efccl::topo
