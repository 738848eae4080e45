// Tells the observer installed through efccl/runtime/observer.h about every program selection.
#pragma once

#include "efccl/runtime/observer.h"

namespace efccl::runtime {

/// Passes a selection to the observer set by set_selection_observer (if any).
void notify_selection(const SelectionRecord& record);
/// Whether an observer is installed (cheap: callers skip building records nobody reads).
bool selection_observed();

}  // namespace efccl::runtime
