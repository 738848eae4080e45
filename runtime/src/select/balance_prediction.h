// What the timing model (efccl/host/timing.h) predicts for a balanced group, and for the same
// group on the default paths (docs/balancer.md, "Statistics"): all of its transfers as one
// program over the clique's ranks on the balancer's topology, so that transfers sharing links
// are charged together (the runtime runs them as separate programs of one fused launch).
#pragma once

#include <cstdint>
#include <vector>

#include "efccl/common/status.h"
#include "select/balance_machine.h"
#include "select/balanced_transfer.h"

namespace efccl::runtime {

/// One transfer of a group: its bytes, and its program where balanced (else: default path).
struct PredictedTransfer {
  int32_t sender = 0, receiver = 0;  ///< clique ranks
  uint64_t bytes = 0;
  const BalancedTransfer* balanced = nullptr;  ///< null: all bytes on the default path
};

struct Prediction {
  double balanced_us = 0;  ///< as planned (tails on the default path)
  double direct_us = 0;    ///< every transfer on its default path
};

/// Both predictions; an error when the model cannot time the group (e.g. a rank on a GPU the
/// topology does not price).
StatusOr<Prediction> predict_group(const BalanceMachine& machine,
                                   const std::vector<PredictedTransfer>& transfers);

}  // namespace efccl::runtime
