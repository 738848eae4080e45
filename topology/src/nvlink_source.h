// Where detection learns a GPU's NVLinks (detect.h): NVML on a real machine (nvml_loader.cc),
// a fake in the tests. One interface so the graph assembly is tested without a GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "efccl/common/status.h"

namespace efccl::topo {

/// What is at the far end of some NVLinks of a GPU.
enum class NvlinkRemoteKind {
  kGpu,      ///< another GPU (the source said so)
  kSwitch,   ///< an NVSwitch (the source said so)
  kOther,    ///< a CPU (IBM NPU) or anything else the source names
  kUnknown,  ///< the source cannot tell; detection decides from the bus id
};

/// The active NVLinks of one GPU that end at one remote device.
struct NvlinkRemote {
  std::string pci;  ///< the remote's PCI bus id, normalised; may be a placeholder for switches
  NvlinkRemoteKind kind = NvlinkRemoteKind::kUnknown;
  int links = 0;
};

/// One GPU's view: its name where known, and its active NVLinks grouped by remote end.
struct GpuNvlinks {
  std::string name;
  std::vector<NvlinkRemote> remotes;
};

class NvlinkSource {
 public:
  virtual ~NvlinkSource() = default;
  /// The NVLinks of the GPU at bus id `pci` (normalised), or why they cannot be read.
  virtual StatusOr<GpuNvlinks> query(const std::string& pci) = 0;
};

/// NVML opened at run time (dlopen "libnvidia-ml.so.1", no link-time dependency), or why not
/// (library missing, nvmlInit failing, a symbol missing).
StatusOr<std::unique_ptr<NvlinkSource>> open_nvml();

}  // namespace efccl::topo
