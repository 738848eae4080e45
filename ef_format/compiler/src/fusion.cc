// Instruction fusion (GC3 §5.2): a receive whose received chunk is then sent on becomes one
// op that forwards it while it passes through the threadblock.
//
//   recv X; send X                    -> rcs X
//   rrc X = pop (op) Y; send X        -> rrcs       (X is still needed)
//   rrc X = pop (op) Y; send X        -> rrs        (X is read by nobody else and never observed)
//
// A send fuses only when the received value is all it waits for (its only predecessor), it
// sends exactly the received chunks, on the same channel, and the fused threadblock is
// allowed (one send and one receive connection).
#include <algorithm>
#include <string>
#include <vector>

#include "ir.h"

namespace efccl::compiler::detail {

void fuse(const Spec& spec, Dag& dag, ThreadblockGroups& groups) {
  const auto& opt = spec.options;
  if (!opt.fuse_rcs && !opt.fuse_rrcs && !opt.fuse_rrs) return;
  auto& instrs = dag.instrs;
  for (std::size_t id = 0; id < instrs.size(); ++id) {
    Instr& r = instrs[id];
    if (!r.alive) continue;
    const bool is_recv = r.code == ef::OpCode::kRecv;
    const bool is_rrc = r.code == ef::OpCode::kRecvReduceCopy;
    if (!is_recv && !is_rrc) continue;
    if (is_recv && !opt.fuse_rcs) continue;
    if (is_rrc && !opt.fuse_rrcs && !opt.fuse_rrs) continue;

    const auto self = static_cast<int32_t>(id);
    for (int32_t sid : r.succs) {
      Instr& s = instrs[static_cast<std::size_t>(sid)];
      if (!s.alive || s.code != ef::OpCode::kSend || s.rank != r.rank) continue;
      if (s.preds.size() != 1 || s.preds[0] != self) continue;
      if (s.count != r.count || !s.src || !r.dst || !(*s.src == *r.dst)) continue;
      if (s.channel != r.channel) continue;

      Instr fused = r;
      if (is_recv) {
        fused.code = ef::OpCode::kRecvCopySend;
      } else if (opt.fuse_rrs && r.writes_dead && r.value_readers.size() == 1 &&
                 r.value_readers[0] == sid) {
        fused.code = ef::OpCode::kRecvReduceSend;
        fused.dst.reset();
      } else if (opt.fuse_rrcs) {
        fused.code = ef::OpCode::kRecvReduceCopySend;
      } else {
        continue;
      }
      fused.send_peer = s.send_peer;
      fused.send_label = s.send_label;
      fused.pushes_to = s.pushes_to;
      std::string why;
      if (!groups.add(fused, &why)) continue;  // would need two connections in one threadblock

      // Rewire: the fused op takes the send's place in the DAG and on the connection.
      s.alive = false;
      fused.succs.erase(std::remove(fused.succs.begin(), fused.succs.end(), sid),
                        fused.succs.end());
      for (int32_t x : s.succs) {
        auto& preds = instrs[static_cast<std::size_t>(x)].preds;
        std::replace(preds.begin(), preds.end(), sid, self);
        std::sort(preds.begin(), preds.end());
        preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
        fused.succs.push_back(x);
      }
      std::sort(fused.succs.begin(), fused.succs.end());
      fused.succs.erase(std::unique(fused.succs.begin(), fused.succs.end()), fused.succs.end());
      if (fused.pushes_to >= 0) instrs[static_cast<std::size_t>(fused.pushes_to)].pops_from = self;
      instrs[id] = std::move(fused);
      break;
    }
  }
}

}  // namespace efccl::compiler::detail
