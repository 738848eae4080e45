// libefccl.so exports every function nccl.h declares, each pncclX as the same function, and
// nothing of efccl's internals; every symbol the real libnccl.so.2 exports (when one is
// installed next to nccl.h) and every host function of NCCL's device API (nccl_device/*.h),
// whose pure helpers compute what NCCL computes and whose device communicators are refused.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device/core.h>

#include "efccl/runtime/extensions.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

/// Exported by libnccl.so.2 but not by efccl: NCCL's internal variant of ncclResetDebugInit,
/// declared in no public header (only NCCL's own unit tests call it). efccl has
/// ncclResetDebugInit and its alias.
const std::set<std::string> kNotExported = {"ncclResetDebugInitInternal"};

/// The real NCCL next to the nccl.h the tests are built with (or $EFCCL_REAL_NCCL).
std::string real_nccl_path() {
  if (const char* p = std::getenv("EFCCL_REAL_NCCL")) return p;
  const auto root = std::filesystem::path(NCCL_HEADER).parent_path().parent_path();
  for (const char* lib : {"lib64", "lib"})
    if (std::filesystem::exists(root / lib / "libnccl.so.2"))
      return (root / lib / "libnccl.so.2").string();
  return "";
}

/// Names of the functions and objects a shared library defines (`nm -D --defined-only`).
std::vector<std::string> defined_symbols(const std::string& library) {
  std::vector<std::string> names;
  std::FILE* nm = ::popen(("nm -D --defined-only '" + library + "' 2>/dev/null").c_str(), "r");
  if (nm == nullptr) return names;
  char line[1024];
  while (std::fgets(line, sizeof(line), nm) != nullptr) {
    std::istringstream fields(line);
    std::string address, type, name;
    if (fields >> address >> type >> name) names.push_back(name);
  }
  ::pclose(nm);
  return names;
}

/// Host functions the device API headers declare: `NCCL_EXTERN_C __host__ <type> nccl...(`.
std::set<std::string> device_api_host_functions() {
  std::set<std::string> names;
  const auto dir = std::filesystem::path(NCCL_HEADER).parent_path() / "nccl_device";
  if (!std::filesystem::is_directory(dir)) return names;
  const std::regex fn(
      R"(NCCL_EXTERN_C\s+__host__\s+[A-Za-z_][A-Za-z0-9_]*\s*\*?\s*(nccl[A-Z][A-Za-z0-9]*)\s*\()");
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".h") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (auto it = std::sregex_iterator(s.begin(), s.end(), fn); it != std::sregex_iterator(); ++it)
      names.insert((*it)[1]);
  }
  return names;
}

// The device API's handle types, with the layout of nccl_device/impl/*__types.h.
struct LsaBarrierHandle {
  uint32_t bufHandle;
  int nBarriers;
};
struct LLA2AHandle {
  uint32_t bufHandle;
  uint32_t nSlots;
};
struct GinBarrierHandle {
  uint32_t signal0;
  uint32_t bufHandle;
};

/// The pure device-API helpers of one library.
struct DeviceHelpers {
  int (*calc_slots)(int, int) = nullptr;
  ncclResult_t (*lsa_requirement)(ncclTeam_t, int, void*, ncclDevResourceRequirements_t*) = nullptr;
  ncclResult_t (*lla2a_requirement)(int, int, void*, ncclDevResourceRequirements_t*) = nullptr;

  explicit DeviceHelpers(void* library) {
    calc_slots = reinterpret_cast<decltype(calc_slots)>(dlsym(library, "ncclLLA2ACalcSlots"));
    lsa_requirement = reinterpret_cast<decltype(lsa_requirement)>(
        dlsym(library, "ncclLsaBarrierCreateRequirement"));
    lla2a_requirement =
        reinterpret_cast<decltype(lla2a_requirement)>(dlsym(library, "ncclLLA2ACreateRequirement"));
  }
  bool complete() const { return calc_slots && lsa_requirement && lla2a_requirement; }
};

std::set<std::string> header_functions() {
  std::ifstream in(NCCL_HEADER);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::set<std::string> names;
  // Declarations: a return type, the name, an opening parenthesis.
  const std::regex fn(R"((?:ncclResult_t|const char\s*\*|void)\s+(nccl[A-Z][A-Za-z0-9]*)\s*\()");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), fn); it != std::sregex_iterator(); ++it)
    names.insert((*it)[1]);
  return names;
}

class Exports : public ::testing::Test {
 protected:
  void SetUp() override {
    handle_ = dlopen(EFCCL_SHARED_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  void TearDown() override {
    if (handle_ != nullptr) dlclose(handle_);
  }
  void* handle_ = nullptr;
};

TEST_F(Exports, EveryHeaderFunctionAndItsAlias) {
  const auto names = header_functions();
  ASSERT_GT(names.size(), 35u) << "could not read " << NCCL_HEADER;
  for (const std::string& name : names) {
    void* f = dlsym(handle_, name.c_str());
    void* p = dlsym(handle_, ("p" + name).c_str());
    EXPECT_NE(f, nullptr) << name << " is not exported";
    EXPECT_EQ(f, p) << "p" << name << " is not an alias of " << name;
  }
}

TEST_F(Exports, GetVersionThroughTheLibrary) {
  auto get_version = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(handle_, "ncclGetVersion"));
  ASSERT_NE(get_version, nullptr);
  int v = 0;
  EXPECT_EQ(get_version(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
}

// efccl's C extensions (efccl/runtime/extensions.h) are exported too; a callback can be set and
// removed (selections themselves need a GPU: the torch backend's checks read them back).
TEST_F(Exports, SelectionCallbackExtension) {
  auto set = reinterpret_cast<ncclResult_t (*)(efcclSelectionCallback_t, void*)>(
      dlsym(handle_, "efcclSetSelectionCallback"));
  ASSERT_NE(set, nullptr) << "efcclSetSelectionCallback is not exported";
  EXPECT_EQ(set([](const efcclSelection_t*, void*) {}, nullptr), ncclSuccess);
  EXPECT_EQ(set(nullptr, nullptr), ncclSuccess);
}

TEST_F(Exports, InternalsAreHidden) {
  EXPECT_EQ(dlsym(handle_, "_ZN5efccl7runtime18last_error_messageEv"), nullptr);
  EXPECT_EQ(dlsym(handle_, "_ZN5efccl2ef8validateERKNS0_7ProgramERKNS0_15ValidateOptionsE"),
            nullptr);
}

TEST_F(Exports, EveryDeviceApiHostFunctionAndItsAlias) {
  const auto names = device_api_host_functions();
  if (names.empty()) GTEST_SKIP() << "no nccl_device/ headers next to " << NCCL_HEADER;
  EXPECT_GE(names.size(), 11u);
  for (const std::string& name : names) {
    void* f = dlsym(handle_, name.c_str());
    EXPECT_NE(f, nullptr) << name << " is not exported";
    EXPECT_EQ(f, dlsym(handle_, ("p" + name).c_str()))
        << "p" << name << " is not an alias of " << name;
  }
}

TEST_F(Exports, EverySymbolOfTheRealLibnccl) {
  const std::string real = real_nccl_path();
  if (real.empty()) GTEST_SKIP() << "no libnccl.so.2 installed next to " << NCCL_HEADER;
  const auto names = defined_symbols(real);
  if (names.empty()) GTEST_SKIP() << "`nm -D` listed nothing for " << real << " (is nm installed?)";
  EXPECT_GT(names.size(), 100u);
  for (const std::string& name : names) {
    if (kNotExported.count(name) != 0) continue;
    void* f = dlsym(handle_, name.c_str());
    EXPECT_NE(f, nullptr) << real << " exports " << name << ", libefccl.so does not";
    if (f != nullptr && name.rfind("pnccl", 0) == 0) {
      EXPECT_EQ(f, dlsym(handle_, name.c_str() + 1))
          << name << " is not an alias of " << (name.c_str() + 1);
    }
  }
}

TEST_F(Exports, DeviceCommunicatorsAreRefusedWithAReason) {
  auto last_error =
      reinterpret_cast<const char* (*)(ncclComm_t)>(dlsym(handle_, "ncclGetLastError"));
  auto create =
      reinterpret_cast<ncclResult_t (*)(ncclComm_t, const ncclDevCommRequirements_t*, void*)>(
          dlsym(handle_, "ncclDevCommCreate"));
  auto destroy = reinterpret_cast<ncclResult_t (*)(ncclComm_t, const void*)>(
      dlsym(handle_, "ncclDevCommDestroy"));
  auto gin = reinterpret_cast<ncclResult_t (*)(ncclComm_t, ncclTeam_t, int, void*,
                                               ncclDevResourceRequirements_t*)>(
      dlsym(handle_, "ncclGinBarrierCreateRequirement"));
  ASSERT_TRUE(last_error && create && destroy && gin);
  ncclDevCommRequirements_t reqs{};
  char dev_comm[1024] = {};
  EXPECT_EQ(create(nullptr, &reqs, dev_comm), ncclInvalidUsage);
  EXPECT_NE(std::string(last_error(nullptr)).find("ncclDevCommCreate is not supported by efccl"),
            std::string::npos)
      << last_error(nullptr);
  EXPECT_EQ(destroy(nullptr, dev_comm), ncclInvalidUsage);
  EXPECT_NE(std::string(last_error(nullptr)).find("ncclDevCommDestroy"), std::string::npos);
  GinBarrierHandle handle{};
  ncclDevResourceRequirements_t req{};
  EXPECT_EQ(gin(nullptr, ncclTeam_t{2, 0, 1}, 4, &handle, &req), ncclInvalidUsage);
  EXPECT_NE(std::string(last_error(nullptr)).find("GIN"), std::string::npos) << last_error(nullptr);
}

TEST_F(Exports, TeamHelpersOnAnInvalidCommunicator) {
  auto last_error =
      reinterpret_cast<const char* (*)(ncclComm_t)>(dlsym(handle_, "ncclGetLastError"));
  auto to_world =
      reinterpret_cast<int (*)(ncclComm_t, ncclTeam_t, int)>(dlsym(handle_, "ncclTeamRankToWorld"));
  ASSERT_TRUE(last_error && to_world);
  for (const char* name : {"ncclTeamWorld", "ncclTeamLsa", "ncclTeamRail"}) {
    auto team = reinterpret_cast<ncclTeam_t (*)(ncclComm_t)>(dlsym(handle_, name));
    ASSERT_NE(team, nullptr) << name;
    const ncclTeam_t t = team(nullptr);
    EXPECT_EQ(t.nRanks, 0) << name << " of NULL is the empty team";
    EXPECT_EQ(t.stride, 1) << name;
    EXPECT_NE(std::string(last_error(nullptr)).find(name), std::string::npos)
        << last_error(nullptr);
  }
  EXPECT_EQ(to_world(nullptr, ncclTeam_t{1, 0, 1}, 0), -1);
}

TEST_F(Exports, PureDeviceHelpersComputeWhatNcclComputes) {
  const DeviceHelpers efccl(handle_);
  ASSERT_TRUE(efccl.complete());
  // NCCL 2.28's values.
  EXPECT_EQ(efccl.calc_slots(4, 100), 52);
  EXPECT_EQ(efccl.calc_slots(4, 8), 4);
  EXPECT_EQ(efccl.calc_slots(3, 16), 6);
  LsaBarrierHandle lsa;
  std::memset(&lsa, 0xcd, sizeof(lsa));
  ncclDevResourceRequirements_t req;
  std::memset(&req, 0xcd, sizeof(req));
  ASSERT_EQ(efccl.lsa_requirement(ncclTeam_t{4, 1, 1}, 2, &lsa, &req), ncclSuccess);
  EXPECT_EQ(req.bufferSize, 56u);  // (3 * 2 + 2 * 4) words
  EXPECT_EQ(req.bufferAlign, 4u);
  EXPECT_EQ(req.outBufferHandle, &lsa.bufHandle);
  EXPECT_EQ(req.next, nullptr);
  EXPECT_EQ(lsa.nBarriers, 2);
  LLA2AHandle lla;
  std::memset(&req, 0xcd, sizeof(req));
  ASSERT_EQ(efccl.lla2a_requirement(2, 8, &lla, &req), ncclSuccess);
  EXPECT_EQ(req.bufferSize, 544u);  // 2 blocks * (1 + 2 * 8) * 16 bytes
  EXPECT_EQ(req.bufferAlign, 16u);
  EXPECT_EQ(req.outBufferHandle, &lla.bufHandle);
  EXPECT_EQ(lla.nSlots, 8u);
  EXPECT_EQ(efccl.lla2a_requirement(2, 8, nullptr, &req), ncclInvalidArgument);
  EXPECT_EQ(efccl.lsa_requirement(ncclTeam_t{4, 1, 1}, -1, &lsa, &req), ncclInvalidArgument);

  // And the real NCCL's, where it is installed: the same answers over a grid.
  const std::string real = real_nccl_path();
  if (real.empty())
    GTEST_SKIP() << "no libnccl.so.2 installed next to " << NCCL_HEADER << " to compare with";
  void* nccl = dlopen(real.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(nccl, nullptr) << dlerror();
  const DeviceHelpers reference(nccl);
  ASSERT_TRUE(reference.complete());
  for (int elts : {-3, 0, 1, 7, 64, 4096})
    for (int size : {-9, 0, 1, 8, 9, 16, 100})
      EXPECT_EQ(efccl.calc_slots(elts, size), reference.calc_slots(elts, size))
          << elts << ", " << size;
  for (int ranks : {1, 2, 8})
    for (int barriers : {0, 1, 5}) {
      LsaBarrierHandle a, b;
      ncclDevResourceRequirements_t ra, rb;
      ASSERT_EQ(efccl.lsa_requirement(ncclTeam_t{ranks, 0, 1}, barriers, &a, &ra), ncclSuccess);
      ASSERT_EQ(reference.lsa_requirement(ncclTeam_t{ranks, 0, 1}, barriers, &b, &rb), ncclSuccess);
      EXPECT_EQ(ra.bufferSize, rb.bufferSize) << ranks << " ranks, " << barriers << " barriers";
      EXPECT_EQ(ra.bufferAlign, rb.bufferAlign);
      EXPECT_EQ(a.nBarriers, b.nBarriers);
      EXPECT_EQ(ra.ginSignalCount, rb.ginSignalCount);
    }
  for (int blocks : {0, 1, 4})
    for (int slots : {0, 3, 64}) {
      LLA2AHandle a, b;
      ncclDevResourceRequirements_t ra, rb;
      ASSERT_EQ(efccl.lla2a_requirement(blocks, slots, &a, &ra), ncclSuccess);
      ASSERT_EQ(reference.lla2a_requirement(blocks, slots, &b, &rb), ncclSuccess);
      EXPECT_EQ(ra.bufferSize, rb.bufferSize) << blocks << " blocks, " << slots << " slots";
      EXPECT_EQ(ra.bufferAlign, rb.bufferAlign);
      EXPECT_EQ(a.nSlots, b.nSlots);
    }
  dlclose(nccl);
}

}  // namespace
