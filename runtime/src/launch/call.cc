#include "launch/call.h"

#include <cstdint>

namespace efccl::runtime {

bool is_inplace(const Call& c) {
  const auto send = reinterpret_cast<uintptr_t>(c.sendbuff);
  const auto recv = reinterpret_cast<uintptr_t>(c.recvbuff);
  const uint64_t bytes = c.count * ef::size_of(c.dtype);
  switch (c.kind) {
    case CallKind::kAllReduce:
    case CallKind::kAllToAll:
    case CallKind::kBroadcast:
    case CallKind::kReduce:
      return send == recv;
    case CallKind::kAllGather:
      return send == recv + static_cast<uint64_t>(c.rank) * bytes;
    case CallKind::kReduceScatter:
      return recv == send + static_cast<uint64_t>(c.rank) * bytes;
    case CallKind::kGather:
      return send == recv + static_cast<uint64_t>(c.root) * bytes;
    case CallKind::kScatter:
      return recv == send + static_cast<uint64_t>(c.root) * bytes;
    default:
      return false;
  }
}

ef::Collective collective_of(CallKind k) {
  switch (k) {
    case CallKind::kAllReduce:
      return ef::Collective::kAllReduce;
    case CallKind::kBroadcast:
      return ef::Collective::kBroadcast;
    case CallKind::kReduce:
      return ef::Collective::kReduce;
    case CallKind::kAllGather:
      return ef::Collective::kAllGather;
    case CallKind::kReduceScatter:
      return ef::Collective::kReduceScatter;
    case CallKind::kAllToAll:
      return ef::Collective::kAllToAll;
    case CallKind::kGather:
      return ef::Collective::kGather;
    case CallKind::kScatter:
      return ef::Collective::kScatter;
    default:
      return ef::Collective::kCustom;
  }
}

const char* api_name(CallKind k) {
  switch (k) {
    case CallKind::kAllReduce:
      return "ncclAllReduce";
    case CallKind::kBroadcast:
      return "ncclBroadcast";
    case CallKind::kReduce:
      return "ncclReduce";
    case CallKind::kAllGather:
      return "ncclAllGather";
    case CallKind::kReduceScatter:
      return "ncclReduceScatter";
    case CallKind::kAllToAll:
      return "ncclAlltoAll";
    case CallKind::kGather:
      return "ncclGather";
    case CallKind::kScatter:
      return "ncclScatter";
    case CallKind::kSend:
      return "ncclSend";
    case CallKind::kRecv:
      return "ncclRecv";
  }
  return "?";
}

std::string describe(const Call& c) {
  std::string s = std::string(api_name(c.kind)) + "(count " + std::to_string(c.count) + ", " +
                  std::string(ef::to_string(c.dtype));
  if (reduces(c.kind)) s += ", " + std::string(ef::to_string(c.op));
  if (is_rooted(c.kind)) s += ", root " + std::to_string(c.root);
  if (is_p2p(c.kind)) s += ", peer " + std::to_string(c.peer);
  return s + ")";
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s;
  for (int32_t r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace efccl::runtime
