// The picture (efccl/topology/svg.h): well-formed XML, every GPU and NIC named, text escaped,
// one line per duplex pair, the same bytes for the same graph.
#include "efccl/topology/svg.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "efccl/topology/presets.h"

namespace {

using namespace efccl::topo;

Topology must(efccl::StatusOr<Topology> t) {
  EXPECT_TRUE(t) << t.status().message();
  return t ? std::move(*t) : Topology{};
}

/// "" when `svg` is well-formed as far as this test needs: tags balanced and nested, attribute
/// values quoted, '&' only in the five predefined entities, no control characters and no
/// invalid UTF-8 lead bytes; else what is wrong.
std::string well_formed(std::string_view svg) {
  std::vector<std::string> open;
  std::size_t i = 0;
  for (unsigned char c : svg)
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0xff || c == 0xfe || c == 0xc0 || c == 0xc1)
      return "a byte XML does not allow: " + std::to_string(c);
  while (i < svg.size()) {
    const std::size_t lt = svg.find('<', i);
    const std::string_view text = svg.substr(i, lt == std::string_view::npos ? svg.npos : lt - i);
    for (std::size_t amp = text.find('&'); amp != text.npos; amp = text.find('&', amp + 1)) {
      bool ok = false;
      for (std::string_view e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
        ok = ok || text.substr(amp, e.size()) == e;
      if (!ok) return "a bare '&' in text: " + std::string(text.substr(amp, 12));
    }
    if (text.find('>') != text.npos) return "a bare '>' in text";
    if (lt == std::string_view::npos) break;
    const std::size_t gt = svg.find('>', lt);
    if (gt == std::string_view::npos) return "a tag that never ends";
    const std::string_view tag = svg.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag.starts_with("?")) continue;  // the XML declaration
    if (tag.find('<') != tag.npos) return "'<' inside a tag: " + std::string(tag);
    if (tag.starts_with("/")) {
      const std::string name(tag.substr(1));
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : "<" + open.back() + ">");
      open.pop_back();
      continue;
    }
    // Attribute values: quotes come in pairs.
    std::size_t quotes = 0;
    for (char c : tag) quotes += c == '"';
    if (quotes % 2 != 0) return "an unbalanced quote in <" + std::string(tag) + ">";
    const std::string name(tag.substr(0, tag.find_first_of(" /")));
    if (!tag.ends_with("/")) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

std::size_t count(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != text.npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Svg, EveryPresetIsWellFormedAndNamesEveryGpuAndNic) {
  for (std::string_view name : preset_names())
    for (int nodes : {1, 2}) {
      const Topology t = must(preset(name, nodes));
      const std::string svg = to_svg(t);
      ASSERT_EQ(well_formed(svg), "") << name << " x" << nodes;
      EXPECT_TRUE(svg.starts_with("<?xml")) << name;
      EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), svg.npos);
      for (NodeIndex n : t.gpus()) EXPECT_NE(svg.find(">" + t.node(n).id + "<"), svg.npos);
      for (NodeIndex n : t.nics()) EXPECT_NE(svg.find(">" + t.node(n).id + "<"), svg.npos);
      for (NodeIndex r : t.nodes_of(NodeKind::kRailSwitch))
        EXPECT_NE(svg.find(">" + t.node(r).id + "<"), svg.npos) << name;
      // Self-contained: nothing fetched, nothing run.
      EXPECT_EQ(svg.find("<script"), svg.npos);
      EXPECT_EQ(svg.find("href"), svg.npos);
      EXPECT_EQ(svg.find("@import"), svg.npos);
    }
}

TEST(Svg, EachDuplexPairIsOneLabelledLine) {
  const Topology t = must(preset("dgx-h100", 2));
  const std::string svg = to_svg(t);
  // 8 GPUs per host, each 18 NVLink4 links into its host's fabric: one line per GPU.
  EXPECT_EQ(count(svg, ">450 GB/s \u00d718<"), 16u);
  // One network wire per NIC; a host's GPU and NIC each under a Gen5 x16 switch.
  EXPECT_EQ(count(svg, ">50 GB/s<"), 16u);
  EXPECT_EQ(count(svg, ">63 GB/s \u00d716<"), 48u);  // CPU-switch, switch-GPU, switch-NIC
  EXPECT_EQ(count(svg, ">62 GB/s<"), 2u);            // one UPI line per host
  EXPECT_EQ(count(svg, "marker-end"), 0u);           // every link has its reverse
  EXPECT_NE(svg.find("NVSwitch fabric"), svg.npos);
  EXPECT_NE(svg.find(">host 1<"), svg.npos);

  const std::string pair = to_svg(must(preset("h200-nv18-x2")));
  EXPECT_EQ(count(pair, ">395 GB/s \u00d718<"), 1u);
  EXPECT_EQ(count(pair, ">55 GB/s \u00d716<"), 2u);
}

TEST(Svg, TextIsEscapedAndInvalidBytesReplaced) {
  Topology t;
  Node cpu;
  cpu.kind = NodeKind::kCpu;
  cpu.id = "h0.cpu0";
  const NodeIndex c = *t.add_node(cpu);
  Node gpu;
  gpu.kind = NodeKind::kGpu;
  gpu.id = "h0.gpu<0>&\"'";
  gpu.name = "A&B <script>alert(1)</script> \x01\xff\xc3";
  gpu.sm = 90;
  const NodeIndex g = *t.add_node(gpu);
  Node nic;
  nic.kind = NodeKind::kNic;
  nic.id = "h0.nic]]>";
  nic.name = "mlx5_\u00e9";  // valid UTF-8 stays
  nic.gbps = 50;
  const NodeIndex x = *t.add_node(nic);
  ASSERT_TRUE(t.add_duplex(c, g, LinkKind::kPcie, 63, 0.6, 16));
  ASSERT_TRUE(t.add_duplex(c, x, LinkKind::kPcie, 32, 0.6, 8));
  const std::string svg = to_svg(t);
  ASSERT_EQ(well_formed(svg), "");
  EXPECT_EQ(svg.find("<script"), svg.npos);
  EXPECT_NE(svg.find("h0.gpu&lt;0&gt;&amp;&quot;&apos;"), svg.npos);
  EXPECT_NE(svg.find("A&amp;B &lt;script&gt;alert(1)&lt;/script&gt; ???"), svg.npos);
  EXPECT_NE(svg.find("h0.nic]]&gt;"), svg.npos);
  EXPECT_NE(svg.find("mlx5_\u00e9"), svg.npos);
}

TEST(Svg, OneWayAndUnequalLinksSayWhichWay) {
  Topology t;
  Node a, b, c;
  a.kind = b.kind = c.kind = NodeKind::kGpu;
  a.id = "h0.gpu0";
  b.id = "h0.gpu1";
  c.id = "h0.gpu2";
  const NodeIndex ia = *t.add_node(a), ib = *t.add_node(b), ic = *t.add_node(c);
  ASSERT_TRUE(t.add_link({ia, ib, LinkKind::kNvlink, 100, 0.5, 4}));
  ASSERT_TRUE(t.add_link({ib, ic, LinkKind::kNvlink, 100, 0.5, 4}));
  ASSERT_TRUE(t.add_link({ic, ib, LinkKind::kNvlink, 50, 0.5, 2}));
  const std::string svg = to_svg(t);
  ASSERT_EQ(well_formed(svg), "");
  EXPECT_EQ(count(svg, "marker-end=\"url(#arrow)\""), 1u);  // gpu0 -> gpu1 only
  EXPECT_NE(svg.find(">100 / 50 GB/s \u00d74<"), svg.npos);
}

TEST(Svg, SameGraphSameBytes) {
  const std::string first = to_svg(must(preset("dgx-h100", 2)));
  EXPECT_EQ(first, to_svg(must(preset("dgx-h100", 2))));
  const Topology t = must(preset("nimble-h100", 3));
  const Topology copy = t;
  EXPECT_EQ(to_svg(t), to_svg(copy));
  EXPECT_NE(first, to_svg(t));
}

TEST(Svg, EmptyAndOddGraphsStillDraw) {
  EXPECT_EQ(well_formed(to_svg(Topology{})), "");
  Topology t;  // a NIC no CPU reaches, a switch without children, memory without a CPU
  Node nic;
  nic.kind = NodeKind::kNic;
  nic.id = "h2.nic0";
  nic.host = 2;
  nic.gbps = 25;
  ASSERT_TRUE(t.add_node(nic));
  Node sw;
  sw.kind = NodeKind::kPcieSwitch;
  sw.id = "h2.pcisw0";
  sw.host = 2;
  ASSERT_TRUE(t.add_node(sw));
  Node mem;
  mem.kind = NodeKind::kHostMemory;
  mem.id = "h0.mem0";
  ASSERT_TRUE(t.add_node(mem));
  const std::string svg = to_svg(t);
  EXPECT_EQ(well_formed(svg), "");
  for (const char* id : {">h2.nic0<", ">h2.pcisw0<", ">h0.mem0<", ">host 2<"})
    EXPECT_NE(svg.find(id), svg.npos) << id;
  EXPECT_EQ(svg.find(">host 1<"), svg.npos) << "a host without nodes is not drawn";
}

TEST(Svg, HeatMapsStackPanelsOnOneScale) {
  const Topology t = must(preset("h200-nv18-x2"));
  // The NVLink pair carries 40 and 10 us before, 20 and 0 after; nothing else carries anything.
  LinkHeat before{"unbalanced", std::vector<double>(t.links().size(), 0.0)};
  LinkHeat after{"balanced <max 20 us>", std::vector<double>(t.links().size(), 0.0)};
  for (LinkIndex l = 0; l < t.links().size(); ++l)
    if (t.link(l).kind == LinkKind::kNvlink) {
      const bool forward = t.node(t.link(l).from).id == "h0.gpu0";
      before.value[l] = forward ? 40 : 10;
      after.value[l] = forward ? 20 : 0;
    }
  const std::vector<LinkHeat> panels = {before, after};
  const std::string svg = to_svg(t, panels, "us");
  ASSERT_EQ(well_formed(svg), "");
  EXPECT_NE(svg.find(">unbalanced: 1 host, 2 GPUs"), svg.npos);
  EXPECT_NE(svg.find(">balanced &lt;max 20 us&gt;: 1 host"), svg.npos);
  EXPECT_NE(svg.find(">40 / 10 us<"), svg.npos);
  EXPECT_NE(svg.find(">20 / 0 us<"), svg.npos);
  EXPECT_NE(svg.find(">0 / 0 us<"), svg.npos);  // PCIe, idle
  EXPECT_EQ(count(svg, "<g transform=\"translate(0,"), 2u);
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_EQ(count(svg, "id=\"arrow\""), 1u);
  EXPECT_NE(svg.find("0 \u2013 40 us (one scale for every panel)"), svg.npos);
  // The busiest line is the scale's darkest colour and the widest; an idle one the lightest.
  EXPECT_NE(svg.find("stroke=\"#99000d\" stroke-width=\"6\""), svg.npos);
  EXPECT_NE(svg.find("stroke=\"#ededed\" stroke-width=\"1.6\""), svg.npos);
  EXPECT_EQ(svg, to_svg(t, panels, "us"));
  EXPECT_EQ(well_formed(to_svg(t, {}, "us")), "");
}

}  // namespace
