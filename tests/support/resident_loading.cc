// Linked into the test binaries that ctest also runs as `resident/...` (efccl_add_resident_run):
// under EFCCL_RESIDENT=1 the resident grid runs only where CUDA loads kernels eagerly
// (efccl/device/resident.h), so this sets CUDA_MODULE_LOADING=EAGER, unless it is set already,
// before anything starts CUDA. (The registration cannot pass it: gtest_discover_tests of CMake
// 3.25 splits a two-entry ENVIRONMENT property.) Under the plain registration nothing changes,
// and the tests there check that resident execution stays off under lazy loading.
#include <cstdlib>
#include <cstring>

namespace {

const bool eager_loading_for_resident_runs = [] {
  const char* resident = std::getenv("EFCCL_RESIDENT");
  if (resident != nullptr && std::strcmp(resident, "1") == 0)
    setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  return true;
}();

}  // namespace
