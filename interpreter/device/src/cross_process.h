// Direct transfers between ranks of different processes on one GPU (docs/device-executor.md,
// "Direct transfers between processes"): which other processes' launches a local device's
// launch meets, which of their ranks it addresses (remote rank j: -2 - j in the tables), and
// what each call publishes for them. Pure C++ except for the boards it points at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "connection_layout.h"
#include "efccl/ef/program.h"
#include "kernel_params.h"

namespace efccl::device {

/// One local device's meeting with the launches of other processes on its GPU.
struct XprocPlan {
  bool enabled = false;
  std::vector<int> remote_ranks;   ///< remote index j -> global rank (grouped by location)
  std::vector<int64_t> locations;  ///< the met locations, in XprocParams order
  std::vector<uint32_t> slots;     ///< their slots on the GPU
  std::vector<uint32_t> rank_begin, rank_count;
  std::vector<int> reader;         ///< per met location: one of its ranks
  uint32_t my_slot = 0;
  XprocBoard* mine = nullptr;      ///< set once the arenas are mapped
  std::vector<XprocBoard*> remote;
};

/// The plan of the local device whose launch serves `local_ranks` (ascending; location
/// `location[local_ranks[0]]`). Enabled when `gpus` names the ranks' GPU, ranks of other
/// locations share it, the program is Simple, every two locations on the GPU are joined by a
/// connection (placed at the receiver, not network: they all meet), and the GPU's locations
/// fit the kernel's limits (kMaxXprocSlots locations, kMaxXprocLocalRanks ranks each): every
/// process of the GPU decides alike from the same inputs. Otherwise disabled, with the reason
/// in `*why` when the GPU is shared but the program or a limit stands in the way.
XprocPlan plan_xproc(const ef::Program& program, const std::vector<int>& local_ranks,
                     const std::vector<int64_t>& location, const std::vector<std::string>& gpus,
                     const std::vector<ConnectionPlan>& connections, std::string* why);

/// What one call publishes to each met location (XprocParams::published; `ctas`: this launch's
/// CTAs): the local ranks' buffers as each reader reaches them (`translate`), and one verdict
/// for all readers: valid only when every buffer is reachable from every reader and
/// `direct_shift` is not kDirectOff. `ranges[li]` lists local rank li's buffers (kind,
/// address, bytes) that the call uses.
struct XprocBuffer {
  int kind = 0;
  char* address = nullptr;
  std::size_t bytes = 0;
};
void publish_xproc(
    const XprocPlan& plan, const std::vector<int>& local_ranks, uint32_t ctas,
    const std::vector<std::vector<XprocBuffer>>& ranges, int32_t direct_shift,
    const std::function<std::optional<uint64_t>(int, const void*, std::size_t, int)>& translate,
    XprocParams* out);

}  // namespace efccl::device
