// NVML at run time (nvlink_source.h): the few entry points detection needs, declared here from
// NVML's public API reference (no nvml.h needed, no link-time dependency on the driver).
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <utility>

#include "nvlink_source.h"
#include "sysfs_pci.h"

namespace efccl::topo {
namespace {

// NVML's types as its API reference defines them: enums are C ints, handles opaque pointers.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlFeatureEnabled = 1;   // nvmlEnableState_t NVML_FEATURE_ENABLED
constexpr int kNvlinkDeviceTypeGpu = 0;  // nvmlIntNvLinkDeviceType_t
constexpr int kNvlinkDeviceTypeIbmNpu = 1;
constexpr int kNvlinkDeviceTypeSwitch = 2;
constexpr unsigned kNvlinkMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS (Hopper: 18 links)
constexpr unsigned kNameLength = 96;      // NVML_DEVICE_NAME_V2_BUFFER_SIZE

/// nvmlPciInfo_t, field for field.
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
};

using InitFn = NvmlReturn (*)();
using ShutdownFn = NvmlReturn (*)();
using HandleByPciBusIdFn = NvmlReturn (*)(const char*, NvmlDevice*);
using NvlinkStateFn = NvmlReturn (*)(NvmlDevice, unsigned int, int*);
using NvlinkRemotePciInfoFn = NvmlReturn (*)(NvmlDevice, unsigned int, NvmlPciInfo*);
using NvlinkRemoteDeviceTypeFn = NvmlReturn (*)(NvmlDevice, unsigned int, int*);
using NameFn = NvmlReturn (*)(NvmlDevice, char*, unsigned int);

/// The entry points, resolved.
struct NvmlApi {
  InitFn init = nullptr;
  ShutdownFn shutdown = nullptr;
  HandleByPciBusIdFn handle_by_bus_id = nullptr;
  NvlinkStateFn nvlink_state = nullptr;
  NvlinkRemotePciInfoFn nvlink_remote_pci = nullptr;
  NvlinkRemoteDeviceTypeFn nvlink_remote_type = nullptr;  // absent in old drivers
  NameFn name = nullptr;
};

/// An initialised NVML; shut down and closed on destruction.
class NvmlLibrary final : public NvlinkSource {
 public:
  NvmlLibrary(void* handle, NvmlApi api) : handle_(handle), api_(api) {}
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;
  ~NvmlLibrary() override {
    api_.shutdown();
    dlclose(handle_);
  }

  StatusOr<GpuNvlinks> query(const std::string& pci) override {
    NvmlDevice device = nullptr;
    if (NvmlReturn r = api_.handle_by_bus_id(pci.c_str(), &device); r != kNvmlSuccess)
      return Status::error("nvmlDeviceGetHandleByPciBusId_v2(" + pci + ") returned " +
                           std::to_string(r));
    GpuNvlinks out;
    char name[kNameLength] = {};
    if (api_.name(device, name, kNameLength) == kNvmlSuccess) {
      name[kNameLength - 1] = '\0';
      out.name = name;
    }
    std::map<std::pair<std::string, NvlinkRemoteKind>, int> counts;
    for (unsigned link = 0; link < kNvlinkMaxLinks; ++link) {
      int active = 0;
      if (api_.nvlink_state(device, link, &active) != kNvmlSuccess || active != kNvmlFeatureEnabled)
        continue;  // absent (fewer links than the maximum) or down
      NvmlPciInfo info{};
      if (api_.nvlink_remote_pci(device, link, &info) != kNvmlSuccess) continue;
      info.bus_id[sizeof info.bus_id - 1] = '\0';
      std::string remote = sysfs::normalize_bus_id(info.bus_id).value_or("");
      if (remote.empty()) {
        char text[40];
        std::snprintf(text, sizeof text, "%04x:%02x:%02x.0", info.domain, info.bus & 0xff,
                      info.device & 0x1f);
        remote = text;
      }
      NvlinkRemoteKind kind = NvlinkRemoteKind::kUnknown;
      int type = -1;
      if (api_.nvlink_remote_type && api_.nvlink_remote_type(device, link, &type) == kNvmlSuccess)
        kind = type == kNvlinkDeviceTypeGpu      ? NvlinkRemoteKind::kGpu
               : type == kNvlinkDeviceTypeSwitch ? NvlinkRemoteKind::kSwitch
               : type == kNvlinkDeviceTypeIbmNpu ? NvlinkRemoteKind::kOther
                                                 : NvlinkRemoteKind::kUnknown;
      ++counts[{remote, kind}];
    }
    for (const auto& [key, links] : counts) out.remotes.push_back({key.first, key.second, links});
    return out;
  }

 private:
  void* handle_;
  NvmlApi api_;
};

template <typename Fn>
Fn symbol(void* handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(handle, name));
}

}  // namespace

StatusOr<std::unique_ptr<NvlinkSource>> open_nvml() {
  constexpr const char* kLibrary = "libnvidia-ml.so.1";
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return Status::error(std::string("NVML not found (") +
                         (why ? why : std::string(kLibrary) + ": dlopen failed") + ")");
  }
  NvmlApi api;
  api.init = symbol<InitFn>(handle, "nvmlInit_v2");
  api.shutdown = symbol<ShutdownFn>(handle, "nvmlShutdown");
  api.handle_by_bus_id = symbol<HandleByPciBusIdFn>(handle, "nvmlDeviceGetHandleByPciBusId_v2");
  api.nvlink_state = symbol<NvlinkStateFn>(handle, "nvmlDeviceGetNvLinkState");
  api.nvlink_remote_pci =
      symbol<NvlinkRemotePciInfoFn>(handle, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
  api.nvlink_remote_type =
      symbol<NvlinkRemoteDeviceTypeFn>(handle, "nvmlDeviceGetNvLinkRemoteDeviceType");
  api.name = symbol<NameFn>(handle, "nvmlDeviceGetName");
  const char* missing = !api.init                ? "nvmlInit_v2"
                        : !api.shutdown          ? "nvmlShutdown"
                        : !api.handle_by_bus_id  ? "nvmlDeviceGetHandleByPciBusId_v2"
                        : !api.nvlink_state      ? "nvmlDeviceGetNvLinkState"
                        : !api.nvlink_remote_pci ? "nvmlDeviceGetNvLinkRemotePciInfo_v2"
                        : !api.name              ? "nvmlDeviceGetName"
                                                 : nullptr;
  if (missing) {
    dlclose(handle);
    return Status::error(std::string(kLibrary) + " has no " + missing);
  }
  if (NvmlReturn r = api.init(); r != kNvmlSuccess) {
    dlclose(handle);
    return Status::error("nvmlInit_v2 returned " + std::to_string(r));
  }
  return std::unique_ptr<NvlinkSource>(std::make_unique<NvmlLibrary>(handle, api));
}

}  // namespace efccl::topo
