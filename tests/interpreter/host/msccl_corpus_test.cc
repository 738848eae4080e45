// Every MSCCL file of the compatibility corpus imports, validates, and produces the correct
// result on the host executor for the datatype/operator matrix in every mode it allows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "efccl/ef/load.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"
#include "msccl_corpus.h"

namespace efccl {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> corpus_files() {
  std::vector<std::string> files;
  const std::string dir = test_support::msccl_corpus_dir();
  if (dir.empty()) return files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".xml") files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(MscclCorpus, IsPresent) {
  // The files below are instantiated from the corpus; without one there are none to run.
  EFCCL_REQUIRE_MSCCL_CORPUS();
  EXPECT_EQ(corpus_files().size(), 15u) << "corpus directory: " << test_support::msccl_corpus_dir();
}

class CorpusFile : public ::testing::TestWithParam<std::string> {
 protected:
  ef::Program load() {
    auto loaded = ef::load_program_file(test_support::msccl_corpus_file(GetParam()));
    for (const auto& d : loaded.diagnostics) ADD_FAILURE() << d.to_string();
    EXPECT_TRUE(loaded.program.has_value());
    return loaded.program ? *loaded.program : ef::Program{};
  }
};

struct MatrixEntry {
  ef::DataType dtype;
  ef::RedOp op;
};
constexpr MatrixEntry kMatrix[] = {
    {ef::DataType::kFloat32, ef::RedOp::kSum},   {ef::DataType::kBFloat16, ef::RedOp::kMax},
    {ef::DataType::kInt32, ef::RedOp::kProd},    {ef::DataType::kFloat16, ef::RedOp::kAvg},
    {ef::DataType::kFp8E4M3, ef::RedOp::kSum},
};

TEST_P(CorpusFile, ValidatesAndVerifiesForTheMatrix) {
  const ef::Program p = load();
  ASSERT_GT(p.nranks, 0);
  const auto diagnostics = ef::validate(p);
  for (const auto& d : diagnostics) ADD_FAILURE() << d.to_string();
  ASSERT_TRUE(diagnostics.empty());

  const auto modes = host::allowed_inplace_modes(p);
  ASSERT_FALSE(modes.empty());
  for (bool inplace : modes) {
    for (const auto& m : kMatrix) {
      host::ExecOptions o;
      o.count = ef::count_granularity(p) * 3;
      o.dtype = m.dtype;
      o.op = m.op;
      o.inplace = inplace;
      auto r = host::run_and_verify(p, o, /*seed=*/42);
      EXPECT_TRUE(r.pass) << GetParam() << (inplace ? " inplace " : " outofplace ")
                          << ef::to_string(m.dtype) << "/" << ef::to_string(m.op) << ": "
                          << r.message;
    }
  }
}

TEST_P(CorpusFile, TiledExecutionMatchesTheDefinition) {
  // 7 elements per chunk through 8-byte slots (2 floats): 4 iterations, the last one partial.
  const ef::Program p = load();
  ASSERT_GT(p.nranks, 0);
  host::ExecOptions o;
  o.count = ef::count_granularity(p) * 7;
  o.dtype = ef::DataType::kFloat32;
  o.op = ef::RedOp::kSum;
  o.inplace = !p.outofplace;
  o.slot_bytes = 8;
  auto r = host::run_and_verify(p, o, /*seed=*/3);
  EXPECT_TRUE(r.pass) << r.message;
  EXPECT_EQ(r.exec.iterations, 4u);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CorpusFile);  // no corpus: MscclCorpus.IsPresent skips
INSTANTIATE_TEST_SUITE_P(Files, CorpusFile, ::testing::ValuesIn(corpus_files()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace efccl
