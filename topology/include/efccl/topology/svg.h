// The graph as a picture (docs/topology.md, "Pictures"): `efccl topo --svg FILE`.
//
//   std::ofstream("dgx.svg") << topo::to_svg(*topo::preset("dgx-h100", 2));
//
// One box per host: CPUs with their memory at the top, PCIe switches below, GPUs and NICs in
// a row under their switches, the NVSwitch fabric as a bar under the GPUs (or NVLink arcs
// between GPUs); rail switches under the hosts. Each duplex pair of links is one line labelled
// with its capacity per direction (GB/s) and its lanes; colours by link kind, with a legend.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "efccl/topology/topology.h"

namespace efccl::topo {

/// A self-contained SVG document (no scripts, no external fonts or images; text escaped);
/// the same graph gives the same bytes.
std::string to_svg(const Topology& t);

/// A value per link drawn over the picture (`efccl plan --svg`: the load of every link).
struct LinkHeat {
  std::string caption;        ///< the panel's title, e.g. "unbalanced"
  std::vector<double> value;  ///< per link of the graph (missing entries: 0)
};
/// The graph once per panel, stacked top to bottom: every line coloured (light grey through
/// yellow and orange to dark red) and widened by the larger value of its two directions, on
/// one scale for all panels (0 to the largest value), and labelled with both values and
/// `unit` ("a / b us"). Deterministic, like to_svg(t).
std::string to_svg(const Topology& t, std::span<const LinkHeat> panels, std::string_view unit);

}  // namespace efccl::topo
