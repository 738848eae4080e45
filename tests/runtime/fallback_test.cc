// EFCCL_FALLBACK=nccl without a GPU: the variables, loading the real NCCL (and refusing efccl
// under any of its names), the isolation of the real library's references to its own symbols,
// and the re-entry guard. Tests that need NVIDIA's libnccl.so.2 skip, saying so, where none is
// installed next to the nccl.h the tests are built with (or at $EFCCL_REAL_NCCL): CI's CPU
// machines build no runtime at all (no CUDA toolkit), the CUDA toolkit here ships one.
#include "fallback/nccl_fallback.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime_test_util.h"

namespace efccl::runtime {
namespace {

namespace fs = std::filesystem;

const fs::path kEfccl = EFCCL_SHARED_LIBRARY;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// The canonical file that holds the code at `fn`.
std::string file_of(const void* fn) {
  Dl_info info{};
  if (dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "";
  std::error_code ec;
  const auto p = fs::canonical(info.dli_fname, ec);
  return ec ? std::string(info.dli_fname) : p.string();
}

using BcastFn = ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
using LastErrorFn = const char* (*)(ncclComm_t);
using VersionFn = ncclResult_t (*)(int*);

/// libefccl.so loaded into the global scope, as LD_PRELOAD puts it; its last-error message shows
/// whether any of its entry points ran.
struct GlobalEfccl {
  void* handle = nullptr;
  LastErrorFn last_error = nullptr;
  VersionFn get_version = nullptr;
  GlobalEfccl() {
    handle = dlopen(kEfccl.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) return;
    last_error = reinterpret_cast<LastErrorFn>(dlsym(handle, "ncclGetLastError"));
    get_version = reinterpret_cast<VersionFn>(dlsym(handle, "ncclGetVersion"));
  }
  /// Makes efccl's last error a known message that no collective writes.
  void mark() const { (void)get_version(nullptr); }
  bool untouched() const {
    return std::string(last_error(nullptr)) == "ncclGetVersion: version is NULL";
  }
};

TEST(Fallback, ModeFromTheEnvironment) {
  ASSERT_EQ(unsetenv("EFCCL_FALLBACK"), 0);
  auto mode = fallback_mode_from_environment();
  ASSERT_TRUE(mode);
  EXPECT_EQ(*mode, FallbackMode::kOff);
  for (const char* off : {"", "none", "off", "OFF"}) {
    ASSERT_EQ(setenv("EFCCL_FALLBACK", off, 1), 0);
    mode = fallback_mode_from_environment();
    ASSERT_TRUE(mode) << off;
    EXPECT_EQ(*mode, FallbackMode::kOff) << off;
  }
  for (const char* on : {"nccl", "NCCL"}) {
    ASSERT_EQ(setenv("EFCCL_FALLBACK", on, 1), 0);
    mode = fallback_mode_from_environment();
    ASSERT_TRUE(mode) << on;
    EXPECT_EQ(*mode, FallbackMode::kNccl) << on;
  }
  ASSERT_EQ(setenv("EFCCL_FALLBACK", "rccl", 1), 0);
  mode = fallback_mode_from_environment();
  ASSERT_FALSE(mode);
  EXPECT_TRUE(contains(mode.status().message(), "EFCCL_FALLBACK=rccl")) << mode.status().message();
}

TEST(Fallback, BadValueFailsCommunicatorCreation) {
  ASSERT_EQ(setenv("EFCCL_FALLBACK", "yes", 1), 0);
  std::shared_ptr<NcclFallback> fallback;
  const ApiStatus s = create_fallback(single_process_fallback_plan({0, 1}), &fallback);
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "EFCCL_FALLBACK=yes is not a fallback efccl knows"))
      << s.message();
  EXPECT_EQ(fallback, nullptr);

  ASSERT_EQ(setenv("EFCCL_FALLBACK", "off", 1), 0);
  EXPECT_TRUE(create_fallback(single_process_fallback_plan({0, 1}), &fallback).is_ok());
  EXPECT_EQ(fallback, nullptr) << "off: no fallback, nothing loaded";
}

TEST(Fallback, MissingLibraryIsNamed) {
  ASSERT_EQ(setenv("EFCCL_FALLBACK", "nccl", 1), 0);
  ASSERT_EQ(setenv("EFCCL_NCCL_LIB", "/nonexistent/libnccl.so.2", 1), 0);
  std::shared_ptr<NcclFallback> fallback;
  const ApiStatus s = create_fallback(single_process_fallback_plan({0}), &fallback);
  EXPECT_EQ(s.code(), ncclSystemError);
  EXPECT_TRUE(contains(s.message(),
                       "EFCCL_NCCL_LIB=/nonexistent/libnccl.so.2: "
                       "/nonexistent/libnccl.so.2: No such file or directory"))
      << s.message();
  EXPECT_EQ(fallback, nullptr);
}

TEST(Fallback, EfcclItselfIsRefusedUnderEveryName) {
  for (const fs::path& p :
       {kEfccl, kEfccl.parent_path() / "libnccl.so.2", kEfccl.parent_path() / "libnccl.so"}) {
    ASSERT_TRUE(fs::exists(p)) << p;
    auto lib = NcclLibrary::load(p.string());
    ASSERT_FALSE(lib) << p;
    EXPECT_TRUE(contains(lib.status().message(), p.string() +
                                                     " is not a real NCCL: it is an efccl "
                                                     "library (it carries efccl's ELF note)"))
        << lib.status().message();
  }
}

TEST(Fallback, EfcclAheadInTheSearchPathIsSkipped) {
  EFCCL_REQUIRE_REAL_NCCL(real);
  // build/lib holds libnccl.so.2 -> libefccl.so: the search must go past it.
  const std::string dirs =
      kEfccl.parent_path().string() + ":" + fs::path(real).parent_path().string();
  ASSERT_EQ(setenv("LD_LIBRARY_PATH", dirs.c_str(), 1), 0);
  auto lib = NcclLibrary::find();
  ASSERT_TRUE(lib) << lib.status().message();
  EXPECT_EQ((*lib)->path(), fs::canonical(real).string());
  EXPECT_EQ(file_of(reinterpret_cast<const void*>((*lib)->get_version)),
            fs::canonical(real).string());
}

TEST(Fallback, LoadsTheRealLibrary) {
  EFCCL_REQUIRE_REAL_NCCL(real);
  ASSERT_EQ(setenv("EFCCL_NCCL_LIB", real.c_str(), 1), 0);
  auto lib = nccl_library_from_environment();
  ASSERT_TRUE(lib) << lib.status().message();
  int version = 0;
  ASSERT_EQ((*lib)->get_version(&version), ncclSuccess);
  EXPECT_EQ(version, (*lib)->version());
  if (std::getenv("EFCCL_REAL_NCCL") == nullptr) {
    EXPECT_EQ(version, NCCL_VERSION_CODE) << "the library next to nccl.h has its version";
  }
  EXPECT_GE(version, NCCL_VERSION(2, 28, 0));
  // The resolved function is NCCL's, not efccl's (neither this binary's nor libefccl.so's).
  const std::string owner = file_of(reinterpret_cast<const void*>((*lib)->get_version));
  EXPECT_EQ(owner, fs::canonical(real).string());
  EXPECT_NE(owner, fs::canonical("/proc/self/exe").string());
  EXPECT_NE(owner, fs::canonical(kEfccl).string());
  EXPECT_FALSE((*lib)->private_copy());
  EXPECT_TRUE(contains((*lib)->describe(), "from " + fs::canonical(real).string()))
      << (*lib)->describe();
  // Once per file: the same object again.
  auto again = NcclLibrary::load(real);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->get(), lib->get());
}

/// The isolation tests need a process that has not loaded the real NCCL yet (ctest runs each
/// test in its own process).
#define REQUIRE_UNLOADED(path)                                                          \
  if (dlopen((path).c_str(), RTLD_LAZY | RTLD_NOLOAD) != nullptr) {                     \
    GTEST_SKIP() << (path) << " is loaded already by an earlier test of this process; " \
                 << "run this test alone (ctest does)";                                 \
  }

TEST(Fallback, FreshLoadBindsTheLibraryToItself) {
  EFCCL_REQUIRE_REAL_NCCL(real);
  REQUIRE_UNLOADED(real);
  const GlobalEfccl efccl;
  ASSERT_NE(efccl.handle, nullptr) << dlerror();
  auto lib = NcclLibrary::load(real);
  ASSERT_TRUE(lib) << lib.status().message();
  EXPECT_FALSE((*lib)->private_copy());
  // NCCL's ncclBcast calls ncclBroadcast through its PLT: with RTLD_DEEPBIND that is NCCL's own.
  auto bcast = reinterpret_cast<BcastFn>((*lib)->symbol("ncclBcast"));
  ASSERT_NE(bcast, nullptr);
  efccl.mark();
  EXPECT_NE(bcast(nullptr, 0, ncclInt8, 0, nullptr, nullptr), ncclSuccess);
  EXPECT_TRUE(efccl.untouched()) << "NCCL's ncclBcast reached efccl: " << efccl.last_error(nullptr);
}

TEST(Fallback, LibraryLoadedBehindEfcclGetsAPrivateCopy) {
  EFCCL_REQUIRE_REAL_NCCL(real);
  REQUIRE_UNLOADED(real);
  const GlobalEfccl efccl;
  ASSERT_NE(efccl.handle, nullptr) << dlerror();
  // The real NCCL loaded after efccl into the global scope (PyTorch's DT_NEEDED libnccl.so.2
  // under LD_PRELOAD=libefccl.so): its ncclBcast binds ncclBroadcast to efccl's.
  void* global = dlopen(real.c_str(), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(global, nullptr) << dlerror();
  auto global_bcast = reinterpret_cast<BcastFn>(dlsym(global, "ncclBcast"));
  ASSERT_NE(global_bcast, nullptr);
  efccl.mark();
  EXPECT_EQ(global_bcast(nullptr, 0, ncclInt8, 0, nullptr, nullptr), ncclInvalidArgument);
  EXPECT_TRUE(contains(efccl.last_error(nullptr), "ncclBroadcast: comm is NULL"))
      << "expected the interposition this test guards against; efccl's last error: "
      << efccl.last_error(nullptr);

  auto lib = NcclLibrary::load(real);
  ASSERT_TRUE(lib) << lib.status().message();
  EXPECT_TRUE((*lib)->private_copy());
  EXPECT_TRUE(contains((*lib)->describe(), "(private copy)")) << (*lib)->describe();
  EXPECT_EQ((*lib)->path(), fs::canonical(real).string());
  EXPECT_NE(reinterpret_cast<void*>((*lib)->get_version), dlsym(global, "ncclGetVersion"));
  int version = 0;
  ASSERT_EQ((*lib)->get_version(&version), ncclSuccess);
  EXPECT_GE(version, NCCL_VERSION(2, 28, 0));
  auto bcast = reinterpret_cast<BcastFn>((*lib)->symbol("ncclBcast"));
  ASSERT_NE(bcast, nullptr);
  efccl.mark();
  EXPECT_NE(bcast(nullptr, 0, ncclInt8, 0, nullptr, nullptr), ncclSuccess);
  EXPECT_TRUE(efccl.untouched()) << "the private copy's ncclBcast reached efccl: "
                                 << efccl.last_error(nullptr);
  // Asked for by the loader's name, the same copy again.
  auto by_name = NcclLibrary::load("libnccl.so.2");
  ASSERT_TRUE(by_name) << by_name.status().message();
  EXPECT_EQ(by_name->get(), lib->get());
}

TEST(Fallback, ReentryIsAnErrorNotARecursion) {
  {
    RealNcclCall outer("ncclGroupEnd");
    ASSERT_TRUE(outer.status().is_ok());
    {
      RealNcclCall inner("ncclAllGather");
      EXPECT_EQ(inner.status().code(), ncclInternalError);
      EXPECT_TRUE(
          contains(inner.status().message(), "called back into efccl during its ncclGroupEnd"))
          << inner.status().message();
      EXPECT_TRUE(contains(inner.status().message(), "its ncclAllGather again"))
          << inner.status().message();
    }
    RealNcclCall second("ncclAllReduce");  // a refused guard leaves the outer one in place
    EXPECT_FALSE(second.status().is_ok());
  }
  RealNcclCall after("ncclAllReduce");
  EXPECT_TRUE(after.status().is_ok()) << after.status().message();
}

TEST(Fallback, SeveralRanksOnOneGpuHaveNoFallback) {
  EXPECT_EQ(single_process_fallback_plan({0, 1, 2}).shared_gpu, "");
  EXPECT_EQ(single_process_fallback_plan({0, 1, 0}).shared_gpu,
            "ranks 0 and 2 share CUDA device 0");

  NcclFallback unavailable(nullptr, "ranks 0 and 1 share CUDA device 0");
  Call call;
  call.kind = CallKind::kAllGather;
  call.count = 8;
  const ApiStatus s =
      unavailable.run({call}, "no user program covers allgather", std::chrono::seconds(1));
  EXPECT_EQ(s.code(), ncclInvalidUsage);
  EXPECT_TRUE(contains(s.message(),
                       "ncclAllGather: no user program covers allgather; "
                       "EFCCL_FALLBACK=nccl cannot run it on this communicator: "
                       "ranks 0 and 1 share CUDA device 0"))
      << s.message();
}

}  // namespace
}  // namespace efccl::runtime
