// Text and colours of the SVG pictures (svg.cc): XML escaping, estimated text widths,
// coordinates, capacities and loads as the pictures print them, the heat map's colours, the
// text of a node's box.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/topology/topology.h"

namespace efccl::topo::svg_text {

// Text widths are estimated (no font metrics): 0.62 em per character.
inline constexpr double kEm = 0.62;

/// XML text: markup characters escaped; bytes that are not valid UTF-8, and control
/// characters XML 1.0 forbids, become '?'.
inline std::string escape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '&' || c == '<' || c == '>' || c == '"' || c == '\'') {
        out += c == '&'   ? "&amp;"
               : c == '<' ? "&lt;"
               : c == '>' ? "&gt;"
               : c == '"' ? "&quot;"
                          : "&apos;";
      } else {
        out += (c < 0x20 && c != '\t') || c == 0x7f ? '?' : static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: its length from the lead byte, then continuation bytes, no
    // overlong forms, surrogates or values past U+10FFFF.
    const int n = c >= 0xc2 && c <= 0xdf   ? 2
                  : c >= 0xe0 && c <= 0xef ? 3
                  : c >= 0xf0 && c <= 0xf4 ? 4
                                           : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && n >= 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
          (c == 0xf4 && c1 >= 0x90))
        ok = false;
    }
    if (!ok) {
      out += '?';
      ++i;
      continue;
    }
    out.append(s.substr(i, static_cast<std::size_t>(n)));
    i += static_cast<std::size_t>(n);
  }
  return out;
}

/// Characters as a reader counts them (UTF-8 continuation bytes not counted).
inline std::size_t glyphs(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

inline double text_width(std::string_view s, double font) { return glyphs(s) * font * kEm; }

/// A coordinate: one decimal, no trailing ".0"; the same bytes on every machine.
inline std::string px(double v) {
  if (!std::isfinite(v)) v = 0;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", std::round(v * 10) / 10);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  if (s == "-0") s = "0";
  return s;
}

/// A capacity for a label: whole GB/s from 100 up, else 3 significant digits.
inline std::string gbps_text(double v) {
  char buf[32];
  if (v >= 100)
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  else
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

/// White at 0, through yellow and orange, to dark red at 1.
inline std::string heat_color(double f) {
  static constexpr double kStops[][3] = {
      {0.93, 0.93, 0.93}, {1.0, 0.85, 0.2}, {0.95, 0.45, 0.1}, {0.6, 0.0, 0.05}};
  f = std::clamp(std::isfinite(f) ? f : 0.0, 0.0, 1.0) * 3;
  const int i = std::min(static_cast<int>(f), 2);
  const double u = f - i;
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c)
    rgb[c] =
        static_cast<int>(std::lround(255 * (kStops[i][c] + u * (kStops[i + 1][c] - kStops[i][c]))));
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}

/// A load for a label: whole numbers from 100 up, else 3 significant digits.
inline std::string value_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 && v < 1e15 ? "%.0f" : "%.3g", v);
  return buf;
}

/// The text lines of a node's box (the first in bold).
inline std::vector<std::string> box_lines(const Node& n) {
  std::vector<std::string> lines = {n.id};
  const auto numa = [&] { return n.numa >= 0 ? "numa " + std::to_string(n.numa) : std::string(); };
  switch (n.kind) {
    case NodeKind::kGpu: {
      if (!n.name.empty()) lines.push_back(n.name);
      std::string info = n.sm > 0 ? "sm " + std::to_string(n.sm) : "";
      if (n.numa >= 0) info += (info.empty() ? "" : " \u00b7 ") + numa();
      if (!info.empty()) lines.push_back(info);
      break;
    }
    case NodeKind::kNic:
      if (!n.name.empty()) lines.push_back(n.name);
      lines.push_back(gbps_text(n.gbps) + " GB/s" +
                      (n.rail >= 0 ? " \u00b7 rail " + std::to_string(n.rail) : ""));
      break;
    case NodeKind::kCpu:
      lines.push_back(n.numa >= 0 ? "CPU \u00b7 " + numa() : "CPU");
      break;
    case NodeKind::kHostMemory:
      lines.push_back("memory");
      break;
    default:
      break;
  }
  if (!n.pci.empty() && n.kind != NodeKind::kCpu && n.kind != NodeKind::kHostMemory)
    lines.push_back(n.pci);
  return lines;
}

}  // namespace efccl::topo::svg_text
