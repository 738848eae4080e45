// The torch backend's private efccl function table (python/torch_backend/src/efccl_library.h),
// without torch: libefccl.so opened with RTLD_LOCAL next to a real NCCL already in the global
// scope (as torch loads its libnccl.so.2) still gives efccl's functions; a real NCCL under any
// name is refused; a missing file names the variable that sets the path. Needs no GPU.
#include "efccl_library.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace efccl::torch_backend {
namespace {

using AllReduceFn = decltype(EfcclLibrary::AllReduce);

/// The real NCCL, loaded globally as torch does (null when none is installed).
void* load_real_nccl_globally() {
  const std::string path = REAL_NCCL_LIBRARY;
  if (path.empty()) return nullptr;
  return dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
}

std::string failure_of(const std::string& path) {
  try {
    (void)load_efccl_library(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(EfcclLibrary, ResolvesEfcclBesideAGlobalNccl) {
  void* real = load_real_nccl_globally();
  if (real == nullptr) GTEST_SKIP() << "no real libnccl.so.2 installed (REAL_NCCL_LIBRARY)";
  auto global = reinterpret_cast<AllReduceFn>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  ASSERT_NE(global, nullptr) << "the real NCCL did not enter the global scope";
  const EfcclLibrary& lib = load_efccl_library(EFCCL_SHARED_LIBRARY);
  EXPECT_TRUE(efccl_library_loaded());
  EXPECT_EQ(&efccl_library(), &lib);
  EXPECT_NE(lib.AllReduce, nullptr);
  EXPECT_NE(lib.AllReduce, global) << "the table resolved torch's NCCL instead of efccl";
  EXPECT_EQ(lib.AllReduce, reinterpret_cast<AllReduceFn>(dlsym(lib.handle, "ncclAllReduce")));
  EXPECT_NE(lib.SetSelectionCallback, nullptr) << "efcclSetSelectionCallback missing";
  EXPECT_EQ(lib.version, NCCL_VERSION_CODE);
  // The global name still means the real NCCL: nothing of efccl leaked into the global scope.
  EXPECT_EQ(reinterpret_cast<AllReduceFn>(dlsym(RTLD_DEFAULT, "ncclAllReduce")), global);
  // Loading the same file again is the same table; another file is refused.
  EXPECT_EQ(&load_efccl_library(EFCCL_SHARED_LIBRARY), &lib);
  EXPECT_NE(failure_of(REAL_NCCL_LIBRARY).find("already loaded"), std::string::npos);
}

/// The table is process-wide; ctest runs each test in a process of its own.
#define SKIP_UNLESS_FRESH_PROCESS()                                                  \
  if (efccl_library_loaded())                                                        \
  GTEST_SKIP() << "needs a process where libefccl.so is not loaded yet (ctest runs " \
                  "each test alone)"

TEST(EfcclLibrary, RefusesARealNccl) {
  SKIP_UNLESS_FRESH_PROCESS();
  if (std::string(REAL_NCCL_LIBRARY).empty())
    GTEST_SKIP() << "no real libnccl.so.2 installed (REAL_NCCL_LIBRARY)";
  const std::string why = failure_of(REAL_NCCL_LIBRARY);
  EXPECT_NE(why.find("not an efccl library"), std::string::npos) << why;
  EXPECT_FALSE(efccl_library_loaded());
}

TEST(EfcclLibrary, MissingFileNamesTheVariable) {
  SKIP_UNLESS_FRESH_PROCESS();
  const std::string why = failure_of("/nonexistent/libefccl.so");
  EXPECT_NE(why.find("/nonexistent/libefccl.so"), std::string::npos) << why;
  EXPECT_NE(why.find("EFCCL_LIBRARY"), std::string::npos) << why;
  EXPECT_FALSE(efccl_library_loaded());
  EXPECT_THROW((void)efccl_library(), std::runtime_error);
}

TEST(EfcclLibrary, DescribesAFailureWithEfcclsMessage) {
  const EfcclLibrary& lib = load_efccl_library(EFCCL_SHARED_LIBRARY);
  int count = 0;
  const ncclResult_t r = lib.CommCount(nullptr, &count);
  ASSERT_NE(r, ncclSuccess);
  const std::string text = describe_failure("ncclCommCount", r);
  EXPECT_EQ(text.rfind("ncclCommCount failed: ", 0), 0u) << text;
  EXPECT_GT(text.size(), std::string("ncclCommCount failed: ").size() + 10) << text;
}

}  // namespace
}  // namespace efccl::torch_backend
