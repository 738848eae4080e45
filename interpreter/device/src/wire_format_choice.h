// Which wire format each connection of a program runs (WireFormat, docs/ef-format.md §5).
#pragma once

#include <string>
#include <vector>

#include "connection_layout.h"
#include "efccl/common/status.h"
#include "efccl/ef/program.h"

namespace efccl::device {

/// Sets the wire format of every connection: the program's protocol, except that an LL128
/// connection runs over LL where LL128's delivery assumption is not known to hold (both ends
/// GPUs of compute capability 9.0 or later, on one GPU or NVLink peers, the slots in the
/// receiver's memory). Connections to another process always run over LL: its two ends must
/// agree without another exchange, and this process cannot always see the other GPU. So do
/// placed connections (ef::SlotLocation): in host memory, PCIe gives no 128-byte atomicity; on
/// a slot device, the receiver would read lines over a link, which NVIDIA's LL128 never does
/// (its receivers read their own memory), even where both ends are NVLink peers of that GPU. `local[rank]`: this process runs the rank on
/// `rank_devices[rank]`. Returns empty, or which connections run over LL instead and why.
StatusOr<std::string> choose_wire_formats(const ef::Program& program,
                                          const std::vector<bool>& local,
                                          const std::vector<int>& rank_devices,
                                          std::vector<ConnectionPlan>& connections);

}  // namespace efccl::device
