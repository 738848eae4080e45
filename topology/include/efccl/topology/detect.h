// Detection of the running host as a one-host graph (host 0), CUDA-free: the caller passes what
// CUDA reports (each visible device's PCI bus id, in CUDA's order, and its compute capability);
// NVML is opened at run time (dlopen "libnvidia-ml.so.1") for NVLink counts and remote ends;
// sysfs gives the PCI tree, NUMA nodes, /sys/class/infiniband and /sys/class/net.
//
// Detection never fails a communicator: what it cannot read (no NVML, no sysfs entry) is said
// in `notes` (logged at INFO by the runtime) and it falls back to what CUDA reported: GPUs
// under one CPU over PCIe of an assumed generation.
//
//   topo::DetectOptions o;
//   o.gpus = {{"0000:1b:00.0", 90}};          // from cudaDeviceGetPCIBusId / the properties
//   topo::Detection d = topo::detect_host(o);
//   // d.topology: one host; d.notes: "NVML not found (libnvidia-ml.so.1): ..." and so on
#pragma once

#include <string>
#include <vector>

#include "efccl/topology/topology.h"

namespace efccl::topo {

struct DetectedGpu {
  std::string pci;  ///< "0000:1b:00.0" (any case; normalised to lower case)
  int sm = 0;       ///< compute capability x 10
  std::string name;  ///< the device name, where known
};

struct DetectOptions {
  /// The visible CUDA devices in CUDA's order (device ordinal = position). Empty: every GPU
  /// sysfs lists (class 0x0302xx / 0x0300xx of vendor 0x10de), in bus id order.
  std::vector<DetectedGpu> gpus;
  /// Every GPU of the host, whatever this process sees: the GPUs sysfs lists in bus id order
  /// (what `gpus` says of one, matched by bus id, completes it; GPUs of `gpus` sysfs does not
  /// list come after them), so that processes with different CUDA_VISIBLE_DEVICES describe
  /// their host alike. `device` is then the position in bus id order, not a CUDA ordinal.
  bool whole_host = false;
  /// The sysfs root ("/sys"); tests point it at a tree of their own.
  std::string sysfs_root = "/sys";
  /// Whether to open NVML (tests turn it off).
  bool use_nvml = true;
  /// The file of NCCL_TOPO_FILE (as NCCL: it overrides or completes detection); empty: none.
  std::string nccl_topo_file;
};

struct Detection {
  Topology topology;               ///< always a usable one-host graph
  std::vector<std::string> notes;  ///< what could not be read, and what was assumed instead
};

Detection detect_host(const DetectOptions& options);

}  // namespace efccl::topo
