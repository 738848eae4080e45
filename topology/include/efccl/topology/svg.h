// The graph as a picture (docs/topology.md, "Pictures"): `efccl topo --svg FILE`.
//
//   std::ofstream("dgx.svg") << topo::to_svg(*topo::preset("dgx-h100", 2));
//
// One box per host: CPUs with their memory at the top, PCIe switches below, GPUs and NICs in
// a row under their switches, the NVSwitch fabric as a bar under the GPUs (or NVLink arcs
// between GPUs); rail switches under the hosts. Each duplex pair of links is one line labelled
// with its capacity per direction (GB/s) and its lanes; colours by link kind, with a legend.
#pragma once

#include <string>

#include "efccl/topology/topology.h"

namespace efccl::topo {

/// A self-contained SVG document (no scripts, no external fonts or images; text escaped);
/// the same graph gives the same bytes.
std::string to_svg(const Topology& t);

}  // namespace efccl::topo
