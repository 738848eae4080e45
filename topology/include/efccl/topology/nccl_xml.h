// NCCL's topology XML (NCCL_TOPO_DUMP_FILE / NCCL_TOPO_FILE) as a graph, on the hardened XML
// reader the MSCCL importer uses: full dumps (<system> <cpu> <pci> <gpu> <nvlink> <nic> <net>,
// collapsed NVSwitch fabrics as the target "fffffff:ff:ff.0") and the PCI hints cloud images ship
// (GPUs as class 0x0302xx, NICs as 0x0207xx / 0x0200xx, under PCIe switches).
#pragma once

#include <string>
#include <string_view>

#include "efccl/topology/topology.h"

namespace efccl::topo {

/// Parses NCCL topology XML `text` as one host (host 0). Errors name `where` (the file), the
/// line and what is wrong. Bounded time and memory (the XML reader's limits, kMaxNodes).
StatusOr<Topology> from_nccl_xml(std::string_view text, std::string_view where);
/// Reads and parses the file at `path` (at most 16 MiB).
StatusOr<Topology> load_nccl_xml(const std::string& path);

}  // namespace efccl::topo
