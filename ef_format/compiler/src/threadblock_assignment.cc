// Threadblock assignment (GC3 §5.3). A rank may have only one threadblock sending to a given
// (peer, channel) and one receiving from it, so every instruction using a connection belongs
// to that connection's threadblock; a fused op (rcs, rrcs, rrs) joins its receive and send
// connections into one threadblock, keyed (send peer, recv peer, channel) as in GC3; manual
// labels (sendtb/recvtb) join whatever carries them. Local ops follow their producer.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {

namespace {

using Conn = std::pair<int32_t, int32_t>;  // (peer, channel)

struct Group {
  int32_t parent = 0;
  std::optional<Conn> send, recv;
  int32_t channel = -1;
};

}  // namespace

struct ThreadblockGroups::Impl {
  // Node keys per rank: (0, peer, ch) send connection, (1, peer, ch) receive connection,
  // (2, label, 0) manual label.
  using Key = std::tuple<int, int32_t, int32_t>;
  std::vector<std::map<Key, int32_t>> nodes;
  std::vector<std::vector<Group>> groups;

  int32_t find(int32_t rank, int32_t x) {
    auto& g = groups[static_cast<std::size_t>(rank)];
    while (g[static_cast<std::size_t>(x)].parent != x) {
      auto& p = g[static_cast<std::size_t>(x)].parent;
      p = g[static_cast<std::size_t>(p)].parent;
      x = p;
    }
    return x;
  }

  static std::vector<Key> keys(const Instr& ins) {
    std::vector<Key> k;
    if (ef::op_sends(ins.code)) k.emplace_back(0, ins.send_peer, ins.channel);
    if (ef::op_receives(ins.code)) k.emplace_back(1, ins.recv_peer, ins.channel);
    if (ins.send_label >= 0) k.emplace_back(2, ins.send_label, 0);
    if (ins.recv_label >= 0) k.emplace_back(2, ins.recv_label, 0);
    return k;
  }
};

ThreadblockGroups::ThreadblockGroups(int32_t nranks) : impl_(std::make_unique<Impl>()) {
  impl_->nodes.resize(static_cast<std::size_t>(nranks));
  impl_->groups.resize(static_cast<std::size_t>(nranks));
}

ThreadblockGroups::~ThreadblockGroups() = default;

bool ThreadblockGroups::add(const Instr& ins, std::string* why) {
  auto& im = *impl_;
  const auto rank = static_cast<std::size_t>(ins.rank);
  const auto keys = Impl::keys(ins);
  if (keys.empty()) return true;

  // What the joined group would hold.
  std::set<int32_t> roots;
  std::set<Conn> sends, recvs;
  std::set<int32_t> channels;
  if (ef::op_sends(ins.code)) sends.insert({ins.send_peer, ins.channel});
  if (ef::op_receives(ins.code)) recvs.insert({ins.recv_peer, ins.channel});
  if (ins.has_channel) channels.insert(ins.channel);
  for (const auto& key : keys) {
    auto it = im.nodes[rank].find(key);
    if (it == im.nodes[rank].end()) continue;
    const int32_t root = im.find(ins.rank, it->second);
    if (!roots.insert(root).second) continue;
    const Group& g = im.groups[rank][static_cast<std::size_t>(root)];
    if (g.send) sends.insert(*g.send);
    if (g.recv) recvs.insert(*g.recv);
    if (g.channel >= 0) channels.insert(g.channel);
  }
  if (sends.size() > 1 || recvs.size() > 1 || channels.size() > 1) {
    if (why != nullptr) {
      *why = "rank " + std::to_string(ins.rank) + ": one threadblock would need ";
      if (sends.size() > 1) {
        *why += "to send to " + std::to_string(sends.size()) + " (peer, channel) pairs";
      } else if (recvs.size() > 1) {
        *why += "to receive from " + std::to_string(recvs.size()) + " (peer, channel) pairs";
      } else {
        *why += std::to_string(channels.size()) + " channels";
      }
    }
    return false;
  }

  // Create missing nodes and union everything into one group.
  auto& groups = im.groups[rank];
  int32_t target = -1;
  for (const auto& key : keys) {
    auto [it, inserted] = im.nodes[rank].emplace(key, static_cast<int32_t>(groups.size()));
    if (inserted) groups.push_back(Group{it->second, std::nullopt, std::nullopt, -1});
    const int32_t root = im.find(ins.rank, it->second);
    if (target < 0) {
      target = root;
    } else if (root != target) {
      groups[static_cast<std::size_t>(root)].parent = target;
    }
  }
  Group& g = groups[static_cast<std::size_t>(target)];
  if (!sends.empty()) g.send = *sends.begin();
  if (!recvs.empty()) g.recv = *recvs.begin();
  if (!channels.empty()) g.channel = *channels.begin();
  return true;
}

int32_t ThreadblockGroups::group_of(const Instr& ins) {
  auto& im = *impl_;
  for (const auto& key : Impl::keys(ins)) {
    auto it = im.nodes[static_cast<std::size_t>(ins.rank)].find(key);
    if (it != im.nodes[static_cast<std::size_t>(ins.rank)].end())
      return im.find(ins.rank, it->second);
  }
  return -1;
}

std::vector<std::vector<ef::Threadblock>> assign_threadblocks(Dag& dag, ThreadblockGroups& groups) {
  const int32_t n = dag.layout.nranks;
  std::vector<std::vector<ef::Threadblock>> tbs(static_cast<std::size_t>(n));
  std::vector<std::map<int32_t, int32_t>> tb_of_group(static_cast<std::size_t>(n));
  std::vector<std::map<int32_t, int32_t>> local_tb(static_cast<std::size_t>(n));  // by channel
  auto new_tb = [&](int32_t rank, int32_t send, int32_t recv, int32_t channel) {
    auto& list = tbs[static_cast<std::size_t>(rank)];
    list.push_back(ef::Threadblock{send, recv, channel, {}});
    return static_cast<int32_t>(list.size() - 1);
  };
  for (auto& ins : dag.instrs) {
    if (!ins.alive) continue;
    const auto rank = static_cast<std::size_t>(ins.rank);
    const int32_t group = groups.group_of(ins);
    if (group >= 0) {
      auto it = tb_of_group[rank].find(group);
      if (it == tb_of_group[rank].end()) {
        // The group's connections: gather them from its members as they appear. The first
        // member fixes the channel; others were checked compatible by ThreadblockGroups.
        it = tb_of_group[rank].emplace(group, new_tb(ins.rank, -1, -1, ins.channel)).first;
      }
      ins.tb = it->second;
      auto& tb = tbs[rank][static_cast<std::size_t>(ins.tb)];
      if (ef::op_sends(ins.code)) tb.send_peer = ins.send_peer;
      if (ef::op_receives(ins.code)) tb.recv_peer = ins.recv_peer;
      if (ins.has_channel || ef::op_sends(ins.code) || ef::op_receives(ins.code))
        tb.channel = ins.channel;
      continue;
    }
    // A local op: the threadblock of its latest producer on this rank (no synchronization
    // needed then), if the channel allows; else the rank's local threadblock of the channel.
    int32_t chosen = -1;
    int64_t best = -1;
    for (int32_t p : ins.preds) {
      const Instr& pred = dag.instrs[static_cast<std::size_t>(p)];
      if (!pred.alive || pred.rank != ins.rank || pred.tb < 0 || pred.order <= best) continue;
      if (ins.has_channel && tbs[rank][static_cast<std::size_t>(pred.tb)].channel != ins.channel)
        continue;
      best = pred.order;
      chosen = pred.tb;
    }
    if (chosen < 0) {
      auto it = local_tb[rank].find(ins.channel);
      if (it == local_tb[rank].end())
        it = local_tb[rank].emplace(ins.channel, new_tb(ins.rank, -1, -1, ins.channel)).first;
      chosen = it->second;
    }
    ins.tb = chosen;
  }
  return tbs;
}

}  // namespace efccl::compiler::detail
