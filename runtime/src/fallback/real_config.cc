#include "fallback/real_config.h"

namespace efccl::runtime {

ncclConfig_t RealConfig::get() const {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = fields.blocking;
  c.cgaClusterSize = fields.cgaClusterSize;
  c.minCTAs = fields.minCTAs;
  c.maxCTAs = fields.maxCTAs;
  c.netName = net_name ? net_name->c_str() : nullptr;
  c.splitShare = fields.splitShare;
  c.trafficClass = fields.trafficClass;
  c.commName = comm_name ? comm_name->c_str() : nullptr;
  c.collnetEnable = fields.collnetEnable;
  c.CTAPolicy = fields.CTAPolicy;
  c.shrinkShare = fields.shrinkShare;
  c.nvlsCTAs = fields.nvlsCTAs;
  c.nChannelsPerNetPeer = fields.nChannelsPerNetPeer;
  c.nvlinkCentricSched = fields.nvlinkCentricSched;
  return c;
}

}  // namespace efccl::runtime
