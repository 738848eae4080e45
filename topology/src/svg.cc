// The graph as an SVG picture (efccl/topology/svg.h).
//
// Layout, per host: the PCIe forest (CPUs as roots, switches inside, GPUs and NICs as leaves)
// is laid out as a tidy tree, every leaf device in one row; host memory sits above its CPU;
// NVLink goes below the device row (a bar per NVSwitch fabric, brackets between GPUs linked
// directly). Hosts stand side by side; rail switches are a row under them, reached by
// orthogonal wires on one track per rail. Lines are drawn under the boxes, except network
// wires, which cross the NVLink area on a white halo; labels come last, each on a white plate.
#include "efccl/topology/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "svg_text.h"

namespace efccl::topo {
namespace {

using svg_text::box_lines;
using svg_text::escape;
using svg_text::gbps_text;
using svg_text::heat_color;
using svg_text::px;
using svg_text::text_width;
using svg_text::value_text;

// Geometry, in px. Text widths are estimated (no font metrics): 0.62 em per character.
constexpr double kFont = 12;
constexpr double kSmallFont = 10;
constexpr double kLineHeight = 14;
constexpr double kPadX = 8, kPadY = 6;
constexpr double kMargin = 20;
constexpr double kTitleHeight = 34;
constexpr double kHostHeader = 30;
constexpr double kHostPad = 16;
constexpr double kHostGap = 40;
constexpr double kSiblingGap = 14;               // between sibling subtrees of the PCIe forest
constexpr double kUnitGap = 30;                  // between the subtrees of two CPUs
constexpr double kRowGap = 58;                   // between rows: room for a line and its label
constexpr double kMemoryGap = 30;                // between a host memory and its CPU
constexpr double kArcFirst = 32, kArcStep = 24;  // NVLink brackets: first depth, step
constexpr double kBarHeight = 26, kBarGap = 64;  // NVSwitch bars
constexpr double kAttachStep = 8;                // between NVLink lines leaving one GPU
constexpr double kNetLabelDrop = 14, kTrackFirst = 34, kTrackStep = 10;  // network wires
constexpr double kRailGap = 16;

// Colours and legend entries, indexed by LinkKind (nvlink, pcie, host, smp, net, c2c).
constexpr const char* kLinkStroke[] = {"#3d8a00", "#2467c9", "#8e44ad",
                                       "#d9730d", "#c0392b", "#138d75"};
constexpr std::string_view kLinkLegend[] = {"NVLink",
                                            "PCIe",
                                            "CPU to its memory",
                                            "CPU to CPU (UPI / xGMI)",
                                            "network: NIC to rail switch",
                                            "chip to chip (GPU to CPU)"};
const char* link_stroke(LinkKind k) { return kLinkStroke[static_cast<int>(k) % 6]; }

// Indexed by NodeKind (gpu, nvswitch, pcie_switch, cpu, host_memory, nic, rail_switch).
struct Colors {
  const char* stroke;
  const char* fill;
};
constexpr Colors kNodeColors[] = {
    {"#3d8a00", "#e4f4d4"}, {"#3d8a00", "#c4e4a4"}, {"#2467c9", "#dde9fa"}, {"#555555", "#ececec"},
    {"#8e44ad", "#f1e5f7"}, {"#c0392b", "#fbe3df"}, {"#c0392b", "#f6c9c2"}};
Colors node_colors(NodeKind k) { return kNodeColors[static_cast<int>(k) % 7]; }

struct Box {
  double x = 0, y = 0, w = 0, h = 0;
  bool placed = false;
  double cx() const { return x + w / 2; }
  double cy() const { return y + h / 2; }
  double right() const { return x + w; }
  double bottom() const { return y + h; }
};

/// All links between two nodes of one kind, as one line: capacities summed per direction.
struct Edge {
  NodeIndex a = 0, b = 0;  ///< a: the source of the first link seen
  LinkKind kind = LinkKind::kPcie;
  double ab = 0, ba = 0;
  int32_t lanes = 0;
  std::vector<LinkIndex> ab_links, ba_links;  ///< the links of each direction
};

std::vector<Edge> edges_of(const Topology& t) {
  std::vector<Edge> edges;
  std::map<std::tuple<NodeIndex, NodeIndex, int>, std::size_t> by_pair;
  for (const Link& l : t.links()) {
    const auto key =
        std::make_tuple(std::min(l.from, l.to), std::max(l.from, l.to), static_cast<int>(l.kind));
    auto [it, added] = by_pair.try_emplace(key, edges.size());
    if (added) edges.push_back({l.from, l.to, l.kind, 0, 0, 0, {}, {}});
    Edge& e = edges[it->second];
    const auto index = static_cast<LinkIndex>(&l - t.links().data());
    (l.from == e.a ? e.ab_links : e.ba_links).push_back(index);
    if (l.from == e.a) {
      e.ab += l.gbps;
      e.lanes += l.lanes;
    } else {
      e.ba += l.gbps;
      if (e.ab == 0) e.lanes += l.lanes;
    }
  }
  return edges;
}

std::string edge_label(const Edge& e) {
  std::string s = gbps_text(e.ab);
  if (e.ba > 0 && std::fabs(e.ab - e.ba) > 1e-9 * std::max(e.ab, e.ba))
    s += " / " + gbps_text(e.ba);
  s += " GB/s";
  if (e.lanes > 1) s += " \u00d7" + std::to_string(e.lanes);
  return s;
}

/// Accumulates the drawing in layers (painted in this order) and lays the graph out.
class Drawing {
 public:
  explicit Drawing(const Topology& t, const LinkHeat* heat = nullptr, double heat_max = 0,
                   std::string_view unit = {})
      : t_(t),
        boxes_(t.nodes().size()),
        heat_(heat),
        heat_max_(heat_max),
        unit_(unit),
        parent_(t.nodes().size(), kNone) {}
  /// The picture's elements (no <svg> element around them) and its size.
  std::string render(double& width, double& height);

 private:
  static constexpr NodeIndex kNone = ~NodeIndex{0};

  double host_layout(int32_t host, double left, double top);
  void place_rails(double top);
  void draw_edge(const Edge& e);
  void draw_node(NodeIndex n);
  void draw_legend(double top, double width);
  void label(double x, double y, const std::string& text, const char* color,
             const char* anchor = "middle", const char* halo = "#ffffff");
  void line(std::string& layer, const std::string& points, const Edge& e, bool one_way, bool halo);
  /// A direction's heat: the sum of its links' values.
  double heat_of(const std::vector<LinkIndex>& links) const;
  std::string edge_text(const Edge& e) const;
  void draw_heat_scale(double& y);

  const Topology& t_;
  std::vector<Box> boxes_;
  const LinkHeat* heat_;  // null: capacities; else loads, coloured on [0, heat_max_]
  double heat_max_;
  std::string unit_;
  std::vector<NodeIndex> parent_;  // PCIe forest
  std::vector<std::vector<NodeIndex>> children_;
  std::map<std::size_t, int> arc_level_;  // edge index -> bracket level (GPU pairs)
  std::map<std::pair<NodeIndex, std::size_t>, double> attach_;  // (gpu, edge) -> x
  std::vector<Box> hosts_;
  std::vector<int32_t> host_ids_;
  std::vector<NodeIndex> rails_;
  std::map<NodeIndex, double> track_;  // rail -> y of its track
  std::vector<Edge> edges_;
  double widest_ = 0, lowest_ = 0;
  std::string frames_, lines_, boxes_layer_, over_, labels_;
};

void Drawing::label(double x, double y, const std::string& text, const char* color,
                    const char* anchor, const char* halo) {
  // A plate under the text, so that lines passing under it never run through its words.
  const double w = text_width(text, kSmallFont) + 4;
  const std::string_view a = anchor;
  const double left = a == "end" ? x - w + 2 : a == "middle" ? x - w / 2 : x - 2;
  labels_ += "<rect x=\"" + px(left) + "\" y=\"" + px(y - kSmallFont + 1) + "\" width=\"" + px(w) +
             "\" height=\"" + px(kSmallFont + 3) + "\" rx=\"2\" fill=\"" + halo +
             "\" fill-opacity=\"0.9\"/>";
  labels_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(kSmallFont) +
             "\" fill=\"" + color + "\" text-anchor=\"" + anchor + "\">" + escape(text) +
             "</text>\n";
}

double Drawing::heat_of(const std::vector<LinkIndex>& links) const {
  double sum = 0;
  for (LinkIndex l : links)
    if (l < heat_->value.size() && std::isfinite(heat_->value[l])) sum += heat_->value[l];
  return sum;
}

std::string Drawing::edge_text(const Edge& e) const {
  if (heat_ == nullptr) return edge_label(e);
  std::string s = value_text(heat_of(e.ab_links));
  if (!e.ba_links.empty()) s += " / " + value_text(heat_of(e.ba_links));
  return s + " " + unit_;
}

void Drawing::line(std::string& layer, const std::string& points, const Edge& e, bool one_way,
                   bool halo) {
  std::string stroke = link_stroke(e.kind);
  std::string width = e.kind == LinkKind::kNvlink ? "2.2" : "1.6";
  if (heat_ != nullptr) {
    const double f =
        heat_max_ > 0 ? std::max(heat_of(e.ab_links), heat_of(e.ba_links)) / heat_max_ : 0.0;
    stroke = heat_color(f);
    width = px(1.6 + 4.4 * std::clamp(f, 0.0, 1.0));
  }
  if (halo)
    layer += "<polyline points=\"" + points +
             "\" fill=\"none\" stroke=\"#ffffff\" stroke-width=\"6\"/>\n";
  layer += "<polyline points=\"" + points + "\" fill=\"none\" stroke=\"" + stroke +
           "\" stroke-width=\"" + width + "\"" + (one_way ? " marker-end=\"url(#arrow)\"" : "") +
           "/>\n";
}

std::string pt(double x, double y) { return px(x) + "," + px(y) + " "; }

double Drawing::host_layout(int32_t host, double left, double top) {
  const auto in_host = [&](NodeIndex n) { return t_.node(n).host == host; };
  std::vector<NodeIndex> cpus, memories, switches, devices, nvswitches;
  for (NodeIndex n = 0; n < t_.nodes().size(); ++n) {
    if (!in_host(n)) continue;
    switch (t_.node(n).kind) {
      case NodeKind::kCpu:
        cpus.push_back(n);
        break;
      case NodeKind::kHostMemory:
        memories.push_back(n);
        break;
      case NodeKind::kPcieSwitch:
        switches.push_back(n);
        break;
      case NodeKind::kGpu:
      case NodeKind::kNic:
        devices.push_back(n);
        break;
      case NodeKind::kNvSwitch:
        nvswitches.push_back(n);
        break;
      default:
        break;
    }
  }
  if (cpus.empty() && memories.empty() && switches.empty() && devices.empty() && nvswitches.empty())
    return left;  // no node on this host: nothing to draw

  // The PCIe forest, breadth first from the CPUs, then from switches no CPU reaches.
  std::vector<NodeIndex> order;  // parents before children
  std::vector<int> depth(t_.nodes().size(), 0);
  std::vector<char> seen(t_.nodes().size(), 0);
  const auto grow = [&](NodeIndex root, int root_depth) {
    std::deque<NodeIndex> queue{root};
    seen[root] = 1;
    depth[root] = root_depth;
    while (!queue.empty()) {
      const NodeIndex n = queue.front();
      queue.pop_front();
      order.push_back(n);
      const NodeKind k = t_.node(n).kind;
      if (k != NodeKind::kCpu && k != NodeKind::kPcieSwitch) continue;
      for (LinkIndex l : t_.out_links(n)) {
        const Link& link = t_.link(l);
        const NodeIndex c = link.to;
        const NodeKind ck = t_.node(c).kind;
        if ((link.kind != LinkKind::kPcie && link.kind != LinkKind::kC2c) || seen[c] ||
            !in_host(c) ||
            (ck != NodeKind::kPcieSwitch && ck != NodeKind::kGpu && ck != NodeKind::kNic))
          continue;
        seen[c] = 1;
        parent_[c] = n;
        children_[n].push_back(c);
        depth[c] = depth[n] + 1;
        queue.push_back(c);
      }
    }
  };
  std::vector<NodeIndex> roots;
  for (NodeIndex c : cpus) {
    roots.push_back(c);
    grow(c, 0);
  }
  std::map<NodeIndex, NodeIndex> memory_of;  // cpu -> its memory, drawn above it
  for (NodeIndex c : cpus)
    if (auto m = t_.memory_of(c); m && in_host(*m) && !seen[*m]) {
      memory_of[c] = *m;
      seen[*m] = 1;
    }
  for (NodeIndex m : memories)
    if (!seen[m]) roots.push_back(m), seen[m] = 1, order.push_back(m);
  for (NodeIndex s : switches)
    if (!seen[s]) roots.push_back(s), grow(s, 1);
  for (NodeIndex d : devices)
    if (!seen[d]) roots.push_back(d), grow(d, 1);

  // Rows: memory, CPUs, one per switch depth, devices.
  int deepest_switch = 0;
  for (NodeIndex s : switches) deepest_switch = std::max(deepest_switch, depth[s]);
  double row_h[4] = {0, 0, 0, 0};  // memory, cpu, switch, device
  const auto slot = [](NodeKind k) {
    return k == NodeKind::kHostMemory   ? 0
           : k == NodeKind::kCpu        ? 1
           : k == NodeKind::kPcieSwitch ? 2
                                        : 3;
  };
  for (NodeIndex n : order)
    row_h[slot(t_.node(n).kind)] = std::max(row_h[slot(t_.node(n).kind)], boxes_[n].h);
  for (const auto& [c, m] : memory_of) row_h[0] = std::max(row_h[0], boxes_[m].h);
  double y = top + kHostHeader;
  const double memory_y = y;
  if (row_h[0] > 0) y += row_h[0] + kMemoryGap;
  const double cpu_y = y;
  if (row_h[1] > 0) y += row_h[1] + kRowGap;
  const double switch_y = y;
  y += deepest_switch * (row_h[2] + kRowGap);
  const double device_y = y;
  const auto row_y = [&](NodeIndex n) {
    switch (t_.node(n).kind) {
      case NodeKind::kHostMemory:
        return memory_y;
      case NodeKind::kCpu:
        return cpu_y;
      case NodeKind::kPcieSwitch:
        return switch_y + (std::max(depth[n], 1) - 1) * (row_h[2] + kRowGap);
      default:
        return device_y;
    }
  };

  // Widths of subtrees, children first; then spans, parents first.
  std::vector<double> span(t_.nodes().size(), 0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeIndex n = *it;
    double kids = 0;
    for (NodeIndex c : children_[n]) kids += span[c] + (kids > 0 ? kSiblingGap : 0);
    double own = boxes_[n].w;
    if (auto m = memory_of.find(n); m != memory_of.end()) own = std::max(own, boxes_[m->second].w);
    span[n] = std::max(own, kids);
  }
  std::vector<double> span_x(t_.nodes().size(), 0);
  double x = left + kHostPad;
  for (NodeIndex r : roots) {
    span_x[r] = x;
    x += span[r] + kUnitGap;
  }
  const double content_right = x - kUnitGap;
  for (NodeIndex n : order) {
    double kids = 0;
    for (NodeIndex c : children_[n]) kids += span[c] + (kids > 0 ? kSiblingGap : 0);
    double cx = span_x[n] + (span[n] - kids) / 2;
    for (NodeIndex c : children_[n]) {
      span_x[c] = cx;
      cx += span[c] + kSiblingGap;
    }
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeIndex n = *it;
    Box& b = boxes_[n];
    double center = span_x[n] + span[n] / 2;
    if (!children_[n].empty())
      center = (boxes_[children_[n].front()].cx() + boxes_[children_[n].back()].cx()) / 2;
    b.x = center - b.w / 2;
    b.y = row_y(n);
    b.placed = true;
    if (auto m = memory_of.find(n); m != memory_of.end()) {
      Box& mb = boxes_[m->second];
      mb.x = center - mb.w / 2;
      mb.y = memory_y;
      mb.placed = true;
    }
  }

  // NVLink below the device row: brackets between GPUs of this host, then one bar per fabric.
  double bottom = device_y + row_h[3];
  std::vector<std::tuple<double, double, std::size_t>> arcs;  // (left x, right x, edge)
  for (std::size_t e = 0; e < edges_.size(); ++e) {
    const Edge& edge = edges_[e];
    if (edge.kind != LinkKind::kNvlink || !in_host(edge.a) || !in_host(edge.b)) continue;
    if (t_.node(edge.a).kind != NodeKind::kGpu || t_.node(edge.b).kind != NodeKind::kGpu) continue;
    const double xa = boxes_[edge.a].cx(), xb = boxes_[edge.b].cx();
    arcs.emplace_back(std::min(xa, xb), std::max(xa, xb), e);
  }
  std::stable_sort(arcs.begin(), arcs.end(), [](const auto& p, const auto& q) {
    return std::get<1>(p) - std::get<0>(p) < std::get<1>(q) - std::get<0>(q);
  });
  std::vector<std::vector<std::pair<double, double>>> levels;
  int deepest_arc = -1;
  for (const auto& [l, r, e] : arcs) {
    std::size_t level = 0;
    for (; level < levels.size(); ++level) {
      bool free = true;
      for (const auto& [l2, r2] : levels[level]) free = free && !(l < r2 - 1e-6 && l2 < r - 1e-6);
      if (free) break;
    }
    if (level == levels.size()) levels.emplace_back();
    levels[level].emplace_back(l, r);
    arc_level_[e] = static_cast<int>(level);
    deepest_arc = std::max(deepest_arc, static_cast<int>(level));
  }
  if (deepest_arc >= 0) bottom += kArcFirst + deepest_arc * kArcStep + 20;
  std::map<NodeIndex, std::vector<std::pair<double, std::size_t>>> at_gpu;  // sort key, edge
  for (const auto& [l, r, e] : arcs) {
    const int level = arc_level_[e];
    for (NodeIndex g : {edges_[e].a, edges_[e].b}) {
      const NodeIndex other = g == edges_[e].a ? edges_[e].b : edges_[e].a;
      const bool goes_left = boxes_[other].cx() < boxes_[g].cx();
      // Left-going brackets, shallow first, then right-going ones, deep first: none crosses.
      at_gpu[g].emplace_back(goes_left ? -1000.0 + level : 1000.0 - level, e);
    }
  }
  for (std::size_t i = 0; i < nvswitches.size(); ++i) {
    const NodeIndex s = nvswitches[i];
    double l = 1e300, r = -1e300;
    for (std::size_t e = 0; e < edges_.size(); ++e) {
      const Edge& edge = edges_[e];
      if (edge.kind != LinkKind::kNvlink || (edge.a != s && edge.b != s)) continue;
      const NodeIndex g = edge.a == s ? edge.b : edge.a;
      if (!in_host(g) || !boxes_[g].placed || t_.node(g).kind != NodeKind::kGpu) continue;
      l = std::min(l, boxes_[g].x);
      r = std::max(r, boxes_[g].right());
      at_gpu[g].emplace_back(static_cast<double>(i), e);
    }
    if (l > r) l = left + kHostPad, r = std::max(content_right, l + boxes_[s].w);
    Box& b = boxes_[s];
    b.x = l - 10;
    b.w = std::max(r - l + 20, b.w);
    b.y = bottom + kBarGap;
    b.h = kBarHeight;
    b.placed = true;
    bottom = b.bottom();
  }
  for (auto& [g, list] : at_gpu) {
    std::stable_sort(list.begin(), list.end());
    for (std::size_t i = 0; i < list.size(); ++i)
      attach_[{g, list[i].second}] =
          boxes_[g].cx() + (static_cast<double>(i) - (list.size() - 1) / 2.0) * kAttachStep;
  }
  double host_right = std::max(content_right + kHostPad, left + 120);
  for (NodeIndex s : nvswitches) host_right = std::max(host_right, boxes_[s].right() + kHostPad);
  hosts_.push_back({left, top, host_right - left, bottom + kHostPad - top, true});
  host_ids_.push_back(host);
  return host_right;
}

void Drawing::place_rails(double top) {
  // Each rail under the mean of its NICs, then pushed right until none overlaps.
  std::vector<std::pair<double, NodeIndex>> wanted;
  for (NodeIndex r : t_.nodes_of(NodeKind::kRailSwitch)) {
    double sum = 0;
    int n = 0;
    for (LinkIndex l : t_.out_links(r))
      if (boxes_[t_.link(l).to].placed) sum += boxes_[t_.link(l).to].cx(), ++n;
    wanted.emplace_back(n > 0 ? sum / n : 1e300, r);
    rails_.push_back(r);
  }
  std::stable_sort(wanted.begin(), wanted.end());
  double free_x = kMargin;
  // Rail 0's track deepest: a host's wires, going right to their rails, then cross no drop of
  // the same host.
  for (std::size_t i = 0; i < rails_.size(); ++i)
    track_[rails_[i]] = top + kTrackFirst + (rails_.size() - 1 - i) * kTrackStep;
  const double rail_y = top + kTrackFirst + rails_.size() * kTrackStep + 24;
  for (auto& [x, r] : wanted) {
    Box& b = boxes_[r];
    if (x > 1e299) x = free_x + b.w / 2;
    b.x = std::max(x - b.w / 2, free_x);
    b.y = rail_y;
    b.placed = true;
    free_x = b.right() + kRailGap;
  }
  // Every wire straight down (one host, or rails right under their NICs): no tracks needed.
  bool straight = true;
  for (NodeIndex r : rails_)
    for (LinkIndex l : t_.out_links(r))
      straight = straight && (!boxes_[t_.link(l).to].placed ||
                              std::fabs(boxes_[t_.link(l).to].cx() - boxes_[r].cx()) < 0.05);
  for (NodeIndex r : rails_) {
    if (straight) boxes_[r].y = top + kTrackFirst + 12;
    widest_ = std::max(widest_, boxes_[r].right());
    lowest_ = std::max(lowest_, boxes_[r].bottom());
  }
}

void Drawing::draw_edge(const Edge& e) {
  const Box& a = boxes_[e.a];
  const Box& b = boxes_[e.b];
  const bool one_way = e.ba == 0;
  const char* color = link_stroke(e.kind);
  const std::string text = edge_text(e);
  const NodeKind ka = t_.node(e.a).kind, kb = t_.node(e.b).kind;
  const std::size_t index = static_cast<std::size_t>(&e - edges_.data());
  if (e.kind == LinkKind::kNet && (ka == NodeKind::kRailSwitch || kb == NodeKind::kRailSwitch) &&
      ka != kb) {
    // NIC down to its rail's track, along it, down to the rail switch.
    const bool a_is_rail = ka == NodeKind::kRailSwitch;
    const Box& nic = a_is_rail ? b : a;
    const Box& rail = a_is_rail ? a : b;
    const int32_t host = t_.node(a_is_rail ? e.b : e.a).host;
    double host_bottom = nic.bottom();
    for (std::size_t h = 0; h < hosts_.size(); ++h)
      if (host_ids_[h] == host) host_bottom = hosts_[h].bottom();
    const double track = track_[a_is_rail ? e.a : e.b];
    std::string points = a_is_rail ? pt(rail.cx(), rail.y) + pt(rail.cx(), track) +
                                         pt(nic.cx(), track) + pt(nic.cx(), nic.bottom())
                                   : pt(nic.cx(), nic.bottom()) + pt(nic.cx(), track) +
                                         pt(rail.cx(), track) + pt(rail.cx(), rail.y);
    line(over_, points, e, one_way, true);
    label(nic.cx(), host_bottom + kNetLabelDrop, text, color);
    return;
  }
  if (e.kind == LinkKind::kNvlink && (ka == NodeKind::kNvSwitch) != (kb == NodeKind::kNvSwitch)) {
    const bool a_is_fabric = ka == NodeKind::kNvSwitch;
    const NodeIndex g = a_is_fabric ? e.b : e.a;
    const Box& bar = a_is_fabric ? a : b;
    if (auto it = attach_.find({g, index}); it != attach_.end()) {
      const double x = it->second;
      line(lines_,
           a_is_fabric ? pt(x, bar.y) + pt(x, boxes_[g].bottom())
                       : pt(x, boxes_[g].bottom()) + pt(x, bar.y),
           e, one_way, false);
      label(x, (boxes_[g].bottom() + bar.y) / 2 + 4, text, color);
      return;
    }
  }
  if (auto level = arc_level_.find(index); level != arc_level_.end()) {
    const double depth = kArcFirst + level->second * kArcStep;
    const double y = std::max(a.bottom(), b.bottom()) + depth;
    const double xa = attach_[{e.a, index}], xb = attach_[{e.b, index}];
    line(lines_, pt(xa, a.bottom()) + pt(xa, y) + pt(xb, y) + pt(xb, b.bottom()), e, one_way,
         false);
    label((xa + xb) / 2, y + 4, text, color);
    return;
  }
  const bool tree = parent_[e.b] == e.a || parent_[e.a] == e.b;
  if (tree || (e.kind == LinkKind::kHost && std::fabs(a.cx() - b.cx()) < 1)) {
    const Box& up = a.y <= b.y ? a : b;
    const Box& down = a.y <= b.y ? b : a;
    line(lines_,
         &up == &a ? pt(up.cx(), up.bottom()) + pt(down.cx(), down.y)
                   : pt(down.cx(), down.y) + pt(up.cx(), up.bottom()),
         e, one_way, false);
    const double f = 0.55;
    const double lx = up.cx() + (down.cx() - up.cx()) * f;
    const double ly = up.bottom() + (down.y - up.bottom()) * f + 4;
    const double dx = down.cx() - up.cx();
    if (dx < -1)
      label(lx - 5, ly, text, color, "end");
    else
      label(lx + 5, ly, text, color, "start");
    return;
  }
  if (e.kind == LinkKind::kSmp && std::fabs(a.y - b.y) < 1) {
    const Box& l = a.x <= b.x ? a : b;
    const Box& r = a.x <= b.x ? b : a;
    bool between = false;  // another box of the row in the way: go under the row
    for (NodeIndex n = 0; n < t_.nodes().size(); ++n) {
      const Box& o = boxes_[n];
      between = between || (o.placed && std::fabs(o.y - a.y) < 1 && o.x > l.x + 1 && o.x < r.x - 1);
    }
    if (!between) {
      line(lines_,
           &l == &a ? pt(l.right(), l.cy()) + pt(r.x, r.cy())
                    : pt(r.x, r.cy()) + pt(l.right(), l.cy()),
           e, one_way, false);
      label((l.right() + r.x) / 2, l.cy() - 6, text, color);
    } else {
      const double y = std::max(l.bottom(), r.bottom()) + 16;
      line(lines_, pt(a.cx(), a.bottom()) + pt(a.cx(), y) + pt(b.cx(), y) + pt(b.cx(), b.bottom()),
           e, one_way, false);
      label((l.cx() + r.cx()) / 2, y + 4, text, color);
    }
    return;
  }
  // Anything else: a straight line between the centres (the boxes hide its ends).
  line(lines_, pt(a.cx(), a.cy()) + pt(b.cx(), b.cy()), e, one_way, false);
  label((a.cx() + b.cx()) / 2, (a.cy() + b.cy()) / 2 + 4, text, color);
}

void Drawing::draw_node(NodeIndex n) {
  const Node& node = t_.node(n);
  const Box& b = boxes_[n];
  const Colors c = node_colors(node.kind);
  std::string& out = boxes_layer_;
  out += "<g><title>" + escape(node.id) + " (" + escape(to_string(node.kind)) + ")</title>";
  out += "<rect x=\"" + px(b.x) + "\" y=\"" + px(b.y) + "\" width=\"" + px(b.w) + "\" height=\"" +
         px(b.h) + "\" rx=\"4\" fill=\"" + c.fill + "\" stroke=\"" + c.stroke +
         "\" stroke-width=\"1.2\"/>";
  if (node.kind == NodeKind::kNvSwitch) {
    out += "</g>\n";  // its text goes with the labels, over the network wires that cross it
    labels_ += "<text x=\"" + px(b.x + kPadX) + "\" y=\"" + px(b.y + b.h / 2 + 4) +
               "\" font-size=\"" + px(kFont) +
               "\" font-weight=\"bold\" fill=\"#1f4a00\" "
               "stroke=\"" +
               c.fill + "\" stroke-width=\"4\" paint-order=\"stroke\">" +
               escape(node.id + " \u00b7 NVSwitch fabric") + "</text>\n";
    return;
  }
  const auto lines = box_lines(node);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const double y = b.y + kPadY + kLineHeight * (static_cast<double>(i) + 1) - 3;
    out += "<text x=\"" + px(b.cx()) + "\" y=\"" + px(y) + "\" font-size=\"" +
           px(i == 0 ? kFont : kSmallFont) + "\" text-anchor=\"middle\"" +
           (i == 0 ? " font-weight=\"bold\"" : "") + " fill=\"#222222\">" + escape(lines[i]) +
           "</text>";
  }
  out += "</g>\n";
}

void Drawing::draw_legend(double top, double width) {
  std::vector<LinkKind> kinds;
  for (LinkKind k : {LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kHost, LinkKind::kSmp,
                     LinkKind::kNet, LinkKind::kC2c})
    for (const Edge& e : edges_)
      if (e.kind == k) {
        kinds.push_back(k);
        break;
      }
  double x = kMargin, y = top + 14;
  std::string& out = labels_;
  out += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(kFont) +
         "\" font-weight=\"bold\" fill=\"#222222\">links</text>\n";
  x += 50;
  for (LinkKind k : kinds) {
    const std::string name(kLinkLegend[static_cast<int>(k) % 6]);
    const double w = 40 + text_width(name, kFont) + 24;
    if (x + w > width && x > kMargin + 50) x = kMargin + 50, y += 20;
    out += "<line x1=\"" + px(x) + "\" y1=\"" + px(y - 4) + "\" x2=\"" + px(x + 32) + "\" y2=\"" +
           px(y - 4) + "\" stroke=\"" + link_stroke(k) + "\" stroke-width=\"2.5\"/>";
    out += "<text x=\"" + px(x + 40) + "\" y=\"" + px(y) + "\" font-size=\"" + px(kFont) +
           "\" fill=\"#222222\">" + escape(name) + "</text>\n";
    x += w;
  }
  if (heat_ != nullptr) draw_heat_scale(y);
  const std::string capacities =
      "Labels: capacity per direction in GB/s; one line per duplex pair (\"a / b\": the two "
      "directions differ; an arrow: one direction only).";
  const std::string loads = "Labels: " + unit_ +
                            " per direction (\"a / b\": the first from the upper or left end), "
                            "coloured by link kind; lines coloured and widened by the larger.";
  for (const std::string& note :
       {heat_ != nullptr ? loads : capacities,
        std::string("\u00d7N: NVLink links or PCIe lanes. Network wires cross the NVLink area "
                    "over a white gap; they do not connect to it.")}) {
    y += 16;
    out += "<text x=\"" + px(kMargin) + "\" y=\"" + px(y) + "\" font-size=\"" + px(kSmallFont) +
           "\" fill=\"#444444\">" + escape(note) + "</text>\n";
  }
  lowest_ = std::max(lowest_, y + 6);
}

void Drawing::draw_heat_scale(double& y) {
  y += 22;
  std::string& out = labels_;
  out += "<text x=\"" + px(kMargin) + "\" y=\"" + px(y) + "\" font-size=\"" + px(kFont) +
         "\" font-weight=\"bold\" fill=\"#222222\">load</text>\n";
  constexpr int kSwatches = 12;
  for (int i = 0; i < kSwatches; ++i) {
    const double x = kMargin + 50 + i * 24;
    out += "<rect x=\"" + px(x) + "\" y=\"" + px(y - 11) + "\" width=\"24\" height=\"12\" fill=\"" +
           heat_color((i + 0.5) / kSwatches) + "\"/>";
  }
  out += "\n<text x=\"" + px(kMargin + 50 + kSwatches * 24 + 8) + "\" y=\"" + px(y) +
         "\" font-size=\"" + px(kFont) + "\" fill=\"#222222\">0 \u2013 " +
         escape(value_text(heat_max_) + " " + unit_) + " (one scale for every panel)</text>\n";
}

std::string Drawing::render(double& width_out, double& height_out) {
  edges_ = edges_of(t_);
  children_.assign(t_.nodes().size(), {});
  // Box sizes: one width per kind, so that rows line up.
  std::map<int, double> kind_w, kind_h;
  for (NodeIndex n = 0; n < t_.nodes().size(); ++n) {
    const auto lines = box_lines(t_.node(n));
    double w = 0;
    for (std::size_t i = 0; i < lines.size(); ++i)
      w = std::max(w, text_width(lines[i], i == 0 ? kFont * 1.08 : kSmallFont));
    const int k = static_cast<int>(t_.node(n).kind);
    kind_w[k] = std::max(kind_w[k], w + 2 * kPadX);
    kind_h[k] = std::max(kind_h[k], lines.size() * kLineHeight + 2 * kPadY);
  }
  for (NodeIndex n = 0; n < t_.nodes().size(); ++n) {
    const int k = static_cast<int>(t_.node(n).kind);
    boxes_[n].w = std::max(kind_w[k], 56.0);
    boxes_[n].h = kind_h[k];
  }
  const double top = kMargin + kTitleHeight;
  double x = kMargin;
  for (int32_t h = 0; h < t_.hosts(); ++h) {
    const double right = host_layout(h, x, top);
    if (right > x) x = right + kHostGap;
  }
  double hosts_bottom = top;
  for (const Box& b : hosts_) hosts_bottom = std::max(hosts_bottom, b.bottom());
  widest_ = std::max(widest_, x - kHostGap);
  lowest_ = hosts_bottom;
  place_rails(hosts_bottom);
  for (const Edge& e : edges_)
    if (boxes_[e.a].placed && boxes_[e.b].placed) draw_edge(e);
  for (NodeIndex n = 0; n < t_.nodes().size(); ++n)
    if (boxes_[n].placed) draw_node(n);
  for (std::size_t h = 0; h < hosts_.size(); ++h) {
    const Box& b = hosts_[h];
    frames_ += "<rect x=\"" + px(b.x) + "\" y=\"" + px(b.y) + "\" width=\"" + px(b.w) +
               "\" height=\"" + px(b.h) +
               "\" rx=\"8\" fill=\"#fafafa\" stroke=\"#9a9a9a\" "
               "stroke-width=\"1.2\"/>\n<text x=\"" +
               px(b.x + 10) + "\" y=\"" + px(b.y + 19) + "\" font-size=\"" + px(kFont + 1) +
               "\" font-weight=\"bold\" fill=\"#444444\">" + "host " +
               std::to_string(host_ids_[h]) + "</text>\n";
  }
  const double width = std::max(widest_ + kMargin, 860.0);
  draw_legend(lowest_ + 24, width);
  const double height = lowest_ + kMargin;

  std::size_t rails = t_.nodes_of(NodeKind::kRailSwitch).size();
  std::string title =
      (heat_ != nullptr && !heat_->caption.empty() ? heat_->caption + ": " : "efccl topology: ") +
      std::to_string(t_.hosts()) + (t_.hosts() == 1 ? " host, " : " hosts, ") +
      std::to_string(t_.gpus().size()) + " GPUs, " + std::to_string(t_.nics().size()) + " NICs";
  if (rails > 0) title += ", " + std::to_string(rails) + " rail switches";

  width_out = width;
  height_out = height;
  std::string svg = "<title>" + escape(title) + "</title>\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" fill=\"#ffffff\"/>\n";
  svg += "<text x=\"" + px(kMargin) + "\" y=\"" + px(kMargin + 16) +
         "\" font-size=\"16\" "
         "font-weight=\"bold\" fill=\"#222222\">" +
         escape(title) + "</text>\n";
  svg += frames_ + lines_ + boxes_layer_ + over_ + labels_;
  return svg;
}

/// The document around pictures of `width` x `height`.
std::string document(const std::string& body, double width, double height) {
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" +
         px(height) + "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n";
  svg +=
      "<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
      "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"
      "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555555\"/></marker></defs>\n";
  return svg + body + "</svg>\n";
}

}  // namespace

std::string to_svg(const Topology& t) {
  double width = 0, height = 0;
  const std::string body = Drawing(t).render(width, height);
  return document(body, width, height);
}

std::string to_svg(const Topology& t, std::span<const LinkHeat> panels, std::string_view unit) {
  double scale = 0;
  for (const LinkHeat& panel : panels)
    for (double v : panel.value) scale = std::isfinite(v) ? std::max(scale, v) : scale;
  std::string body;
  double width = 0, top = 0;
  for (const LinkHeat& panel : panels) {
    double w = 0, h = 0;
    const std::string picture = Drawing(t, &panel, scale, unit).render(w, h);
    body += "<g transform=\"translate(0," + px(top) + ")\">\n" + picture + "</g>\n";
    width = std::max(width, w);
    top += h;
  }
  return document(body, width, top);
}

}  // namespace efccl::topo
