#include "comm/comm_config.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace efccl::runtime {
namespace {

constexpr unsigned int kConfigMagic = 0xcafebeef;

std::string describe_int(int v) {
  return v == NCCL_CONFIG_UNDEF_INT ? std::string("undefined") : std::to_string(v);
}

}  // namespace

ApiStatus parse_config(const ncclConfig_t* config, CommConfig* out) {
  *out = CommConfig();
  if (config == nullptr) return ApiStatus::ok();
  const ncclConfig_t defaults = NCCL_CONFIG_INITIALIZER;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.magic = 0;
  c.version = 0;
  std::size_t size = 0;
  std::memcpy(&size, config, sizeof(size));
  std::memcpy(static_cast<void*>(&c), config, std::min(size, sizeof(ncclConfig_t)));
  if (c.magic != kConfigMagic) {
    std::ostringstream m;
    m << "ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER (magic 0x" << std::hex
      << c.magic << ", expected 0x" << kConfigMagic << ", from the first " << std::dec
      << std::min(size, sizeof(ncclConfig_t)) << " bytes its size field gives)";
    return ApiStatus::invalid_argument(m.str());
  }
  if (c.version < NCCL_VERSION(2, 14, 0))
    return ApiStatus::invalid_argument(
        "ncclConfig_t version " + std::to_string(c.version) +
        " is older than 2.14.0, the first NCCL with ncclConfig_t (initialize it with "
        "NCCL_CONFIG_INITIALIZER)");
  if (c.version < NCCL_VERSION(2, 17, 0)) {
    c.cgaClusterSize = defaults.cgaClusterSize;
    c.minCTAs = defaults.minCTAs;
    c.maxCTAs = defaults.maxCTAs;
    c.netName = defaults.netName;
  }
  if (c.version < NCCL_VERSION(2, 25, 0)) c.trafficClass = defaults.trafficClass;
  if (c.version < NCCL_VERSION(2, 27, 0)) {
    c.collnetEnable = defaults.collnetEnable;
    c.CTAPolicy = defaults.CTAPolicy;
    c.shrinkShare = defaults.shrinkShare;
    c.nvlsCTAs = defaults.nvlsCTAs;
  }
  if (c.version < NCCL_VERSION(2, 28, 0)) {
    c.nChannelsPerNetPeer = defaults.nChannelsPerNetPeer;
    c.nvlinkCentricSched = defaults.nvlinkCentricSched;
  }

  constexpr int kUndef = NCCL_CONFIG_UNDEF_INT;
  constexpr int kMaxChannels = 64;  // NCCL's MAXCHANNELS
  const auto bad = [](const char* field, int v, const char* valid) {
    return ApiStatus::invalid_argument("invalid ncclConfig_t " + std::string(field) + " " +
                                       std::to_string(v) + " (valid: " + valid +
                                       ", or NCCL_CONFIG_UNDEF_INT)");
  };
  const auto bool_ok = [](int v) { return v == kUndef || v == 0 || v == 1; };
  if (!bool_ok(c.blocking)) return bad("blocking", c.blocking, "0 or 1");
  if (c.cgaClusterSize != kUndef && c.cgaClusterSize < 0)
    return bad("cgaClusterSize", c.cgaClusterSize, ">= 0");
  if (c.minCTAs != kUndef && c.minCTAs <= 0) return bad("minCTAs", c.minCTAs, ">= 1");
  if (c.maxCTAs != kUndef && c.maxCTAs <= 0) return bad("maxCTAs", c.maxCTAs, ">= 1");
  if (c.minCTAs != kUndef && c.maxCTAs != kUndef && c.minCTAs > c.maxCTAs)
    return ApiStatus::invalid_argument("invalid ncclConfig_t minCTAs " + std::to_string(c.minCTAs) +
                                       " > maxCTAs " + std::to_string(c.maxCTAs));
  if (!bool_ok(c.splitShare)) return bad("splitShare", c.splitShare, "0 or 1");
  if (!bool_ok(c.collnetEnable)) return bad("collnetEnable", c.collnetEnable, "0 or 1");
  constexpr int kAllPolicies =
      NCCL_CTA_POLICY_DEFAULT | NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO;
  if (c.CTAPolicy != kUndef && (c.CTAPolicy < 0 || c.CTAPolicy > kAllPolicies))
    return bad("CTAPolicy", c.CTAPolicy, "NCCL_CTA_POLICY_* flags");
  if (!bool_ok(c.shrinkShare)) return bad("shrinkShare", c.shrinkShare, "0 or 1");
  if (c.nvlsCTAs != kUndef && c.nvlsCTAs <= 0) return bad("nvlsCTAs", c.nvlsCTAs, ">= 1");
  if (c.nChannelsPerNetPeer != kUndef &&
      (c.nChannelsPerNetPeer <= 0 || c.nChannelsPerNetPeer > kMaxChannels))
    return bad("nChannelsPerNetPeer", c.nChannelsPerNetPeer, "1..64");
  if (!bool_ok(c.nvlinkCentricSched))
    return bad("nvlinkCentricSched", c.nvlinkCentricSched, "0 or 1");

  out->blocking = c.blocking != 0;  // undefined: blocking, as NCCL
  out->real.fields = c;
  if (c.netName != nullptr) out->real.net_name = c.netName;
  if (c.commName != nullptr) out->real.comm_name = c.commName;
  std::ostringstream hints;
  const auto hint = [&](const char* name, int v) {
    if (v != kUndef) hints << ' ' << name << '=' << describe_int(v);
  };
  hint("cgaClusterSize", c.cgaClusterSize);
  hint("minCTAs", c.minCTAs);
  hint("maxCTAs", c.maxCTAs);
  if (c.netName != nullptr) hints << " netName=" << c.netName;
  hint("splitShare", c.splitShare);
  hint("trafficClass", c.trafficClass);
  hint("collnetEnable", c.collnetEnable);
  hint("CTAPolicy", c.CTAPolicy);
  hint("shrinkShare", c.shrinkShare);
  hint("nvlsCTAs", c.nvlsCTAs);
  hint("nChannelsPerNetPeer", c.nChannelsPerNetPeer);
  hint("nvlinkCentricSched", c.nvlinkCentricSched);
  out->hints = hints.str();
  return ApiStatus::ok();
}

}  // namespace efccl::runtime
