// libefccl.so exports every function nccl.h declares, each pncclX as the same function, and
// nothing of efccl's internals.
#include <dlfcn.h>
#include <nccl.h>

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

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

TEST_F(Exports, InternalsAreHidden) {
  EXPECT_EQ(dlsym(handle_, "_ZN5efccl7runtime18last_error_messageEv"), nullptr);
  EXPECT_EQ(dlsym(handle_, "_ZN5efccl2ef8validateERKNS0_7ProgramERKNS0_15ValidateOptionsE"), nullptr);
}

}  // namespace
