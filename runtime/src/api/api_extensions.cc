// efccl's C extensions beyond the NCCL ABI (efccl/runtime/extensions.h), exported beside it.
#include "api/entry_point.h"
#include "efccl/runtime/extensions.h"
#include "efccl/runtime/observer.h"

using efccl::runtime::ApiStatus;
using efccl::runtime::run_entry_point;

extern "C" EFCCL_API ncclResult_t efcclSetSelectionCallback(efcclSelectionCallback_t callback,
                                                            void* user) {
  return run_entry_point("efcclSetSelectionCallback", [&] {
    if (callback == nullptr) {
      efccl::runtime::set_selection_observer(nullptr);
      return ApiStatus::ok();
    }
    efccl::runtime::set_selection_observer(
        [callback, user](const efccl::runtime::SelectionRecord& r) {
          const efcclSelection_t s{
              r.collective.c_str(), r.program.c_str(), r.source.c_str(), r.reason.c_str(),
              r.skipped ? 1 : 0,    r.count,           r.nranks};
          callback(&s, user);
        });
    return ApiStatus::ok();
  });
}
