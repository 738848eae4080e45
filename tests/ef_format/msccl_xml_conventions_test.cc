// The conventions of msccl-tools' MSCCL XML (github.com/microsoft/msccl-tools, the MSCCLang
// compiler), imported with the meaning MSCCL's runtime gives them (docs/ef-format.md §9):
// * <algo> without `outofplace`: the program is for the one mode `inplace` names (the original
//   MSCCL runtime reads only `inplace` and runs a program for calls whose mode equals it);
// * an in-place-only program whose buffer lies inside the other one in in-place calls
//   (allgather's input, reducescatter's output, ...) declares it with 0 chunks and names the
//   region through the containing buffer.
// Each file here is msccl-tools' output, verbatim unless a test says what it changes; accepted
// ones must validate and verify on the host executor.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "efccl/ef/msccl_xml.h"
#include "efccl/ef/validate.h"
#include "efccl/host/executor.h"

namespace efccl {
namespace {

// examples/gc3/fig8a_ring_allgather.py 3 --inplace under msccl-tools.
constexpr std::string_view kInPlaceAllGather =
    R"(<algo name="allgather_ring" proto="Simple" nchannels="1" nchunksperloop="3" ngpus="3" coll="allgather" inplace="1">
  <gpu id="0" i_chunks="0" o_chunks="3" s_chunks="0">
    <tb id="0" send="1" recv="2" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="0" o_chunks="3" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="0" o_chunks="3" s_chunks="0">
    <tb id="0" send="0" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rcs" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

// examples/gc3/fig8a_ring_allgather.py 3 under msccl-tools (out-of-place).
constexpr std::string_view kOutOfPlaceAllGather =
    R"(<algo name="allgather_ring" proto="Simple" nchannels="1" nchunksperloop="3" ngpus="3" coll="allgather" inplace="0">
  <gpu id="0" i_chunks="1" o_chunks="3" s_chunks="0">
    <tb id="0" send="1" recv="2" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="3" s_chunks="0">
    <tb id="0" send="2" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="2" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="1" o_chunks="3" s_chunks="0">
    <tb id="0" send="0" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="rcs" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

// A 3-rank ring ReduceScatter(3, 1, inplace=True) written in MSCCLang, under msccl-tools: the
// output (inside the input) has 0 chunks, and the collective is spelled "reduce_scatter".
constexpr std::string_view kInPlaceReduceScatter =
    R"(<algo name="rs_ring" proto="Simple" nchannels="3" nchunksperloop="3" ngpus="3" coll="reduce_scatter" inplace="1">
  <gpu id="0" i_chunks="3" o_chunks="0" s_chunks="0">
    <tb id="0" send="-1" recv="2" chan="0">
      <step s="0" type="rrc" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="1" recv="-1" chan="2">
      <step s="0" type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="1" recv="2" chan="1">
      <step s="0" type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="3" o_chunks="0" s_chunks="0">
    <tb id="0" send="-1" recv="0" chan="1">
      <step s="0" type="rrc" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="2" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="2" recv="0" chan="2">
      <step s="0" type="rrcs" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="2" i_chunks="3" o_chunks="0" s_chunks="0">
    <tb id="0" send="-1" recv="1" chan="2">
      <step s="0" type="rrc" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="0" recv="-1" chan="1">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="0" recv="1" chan="0">
      <step s="0" type="rrcs" srcbuf="i" srcoff="0" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

// Hand-written: a 2-rank in-place allreduce that names only the output (input == output in an
// in-place call), its input declared with 0 chunks.
constexpr std::string_view kInPlaceAllReduceViaOutput =
    R"(<algo name="pair" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1">
  <gpu id="0" i_chunks="0" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="-1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="0" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="r" srcbuf="o" srcoff="-1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

/// `text` with the first occurrence of `from` (which must exist) replaced by `to`.
std::string with(std::string_view text, std::string_view from, std::string_view to) {
  std::string out(text);
  const std::size_t at = out.find(from);
  EXPECT_NE(at, std::string::npos) << "no " << from;
  if (at != std::string::npos) out.replace(at, from.size(), to);
  return out;
}

ef::Program load_ok(std::string_view text, const std::string& file = "msccl-tools.xml") {
  ef::XmlLoadResult result = ef::load_msccl_xml(text, file);
  for (const Diagnostic& d : result.diagnostics) ADD_FAILURE() << d.to_string();
  EXPECT_TRUE(result.program.has_value());
  return result.program ? std::move(*result.program) : ef::Program{};
}

void expect_valid(const ef::Program& p) {
  for (const Diagnostic& d : ef::validate(p)) ADD_FAILURE() << d.to_string();
}

/// Runs every mode the program allows for a few datatype/operator pairs; all must verify.
void expect_verifies(const ef::Program& p, std::vector<bool> expected_modes) {
  const std::vector<bool> modes = host::allowed_inplace_modes(p);
  EXPECT_EQ(modes, expected_modes);
  const std::pair<ef::DataType, ef::RedOp> matrix[] = {
      {ef::DataType::kFloat32, ef::RedOp::kSum},
      {ef::DataType::kBFloat16, ef::RedOp::kMax},
      {ef::DataType::kInt32, ef::RedOp::kProd},
      {ef::DataType::kFloat16, ef::RedOp::kAvg},
  };
  for (const bool inplace : modes) {
    for (const auto& [dtype, op] : matrix) {
      host::ExecOptions o;
      o.count = ef::count_granularity(p) * 5;
      o.dtype = dtype;
      o.op = op;
      o.inplace = inplace;
      const host::VerifyResult r = host::run_and_verify(p, o, /*seed=*/7);
      EXPECT_TRUE(r.pass) << p.name << (inplace ? " in-place " : " out-of-place ")
                          << ef::to_string(dtype) << "/" << ef::to_string(op) << ": " << r.message;
    }
  }
}

/// The diagnostics of importing and (when it imports) validating `text`.
Diagnostics problems(std::string_view text, const std::string& file = "bad.xml") {
  ef::XmlLoadResult result = ef::load_msccl_xml(text, file);
  if (!result.program) return result.diagnostics;
  return ef::validate(*result.program);
}

/// The one diagnostic among `all` with `rule` at `location`, checked to name `file` and `words`.
void expect_problem(const Diagnostics& all, std::string_view location, std::string_view rule,
                    std::string_view words, std::string_view file = "bad.xml") {
  for (const Diagnostic& d : all) {
    if (d.location != location || d.rule != rule) continue;
    EXPECT_EQ(d.file, file) << d.to_string();
    EXPECT_NE(d.message.find(words), std::string::npos)
        << d.to_string() << "\nexpected it to mention: " << words;
    return;
  }
  std::string got;
  for (const Diagnostic& d : all) got += "\n  " + d.to_string();
  ADD_FAILURE() << "no [" << rule << "] diagnostic at " << location << "; got:" << got;
}

// ---- outofplace ----

TEST(MscclToolsXml, AbsentOutofplaceIsTheOtherModeOfInplace) {
  const ef::Program in_place = load_ok(kInPlaceAllGather);
  EXPECT_TRUE(in_place.inplace);
  EXPECT_FALSE(in_place.outofplace);
  const ef::Program out_of_place = load_ok(kOutOfPlaceAllGather);
  EXPECT_FALSE(out_of_place.inplace);
  EXPECT_TRUE(out_of_place.outofplace);
  expect_valid(out_of_place);
  expect_verifies(out_of_place, {false});
}

TEST(MscclToolsXml, StatedOutofplaceIsReadAsWritten) {
  const ef::Program both =
      load_ok(with(kOutOfPlaceAllGather, "inplace=\"0\"", "inplace=\"0\" outofplace=\"1\""));
  EXPECT_FALSE(both.inplace);
  EXPECT_TRUE(both.outofplace);
  EXPECT_TRUE(
      load_ok(with(kInPlaceAllGather, "inplace=\"1\"", "inplace=\"1\" outofplace=\"0\"")).inplace);
  // A bad value is still an error, and `inplace` is still required (both MSCCL runtimes
  // require it).
  expect_problem(
      problems(with(kInPlaceAllGather, "inplace=\"1\"", "inplace=\"1\" outofplace=\"yes\"")),
      "algo@outofplace (line 1)", "schema", "\"0\" or \"1\"");
  expect_problem(problems(with(kInPlaceAllGather, " inplace=\"1\"", "")), "algo@inplace (line 1)",
                 "schema", "missing attribute inplace on <algo>");
}

// ---- buffers inside the other one ----

TEST(MscclToolsXml, InPlaceAllGatherInputOfZeroChunksIsTheOutputBlock) {
  const ef::Program p = load_ok(kInPlaceAllGather);
  for (const ef::Rank& rank : p.ranks) {
    EXPECT_EQ(rank.input_chunks, 1);  // nchunksperloop / ngpus, inside the output in-place
    EXPECT_EQ(rank.output_chunks, 3);
  }
  expect_valid(p);
  expect_verifies(p, {true});
}

TEST(MscclToolsXml, InPlaceReduceScatterOutputOfZeroChunksIsTheInputBlock) {
  const ef::Program p = load_ok(kInPlaceReduceScatter);
  EXPECT_EQ(p.collective, ef::Collective::kReduceScatter);
  for (const ef::Rank& rank : p.ranks) {
    EXPECT_EQ(rank.input_chunks, 3);
    EXPECT_EQ(rank.output_chunks, 1);
  }
  expect_valid(p);
  expect_verifies(p, {true});
}

TEST(MscclToolsXml, InPlaceAllReduceMayNameEitherBuffer) {
  // Input == output in-place: an input of 0 chunks gets nchunksperloop; an output of 0 chunks
  // (what msccl-tools writes for allreduce) stays 0, which docs/ef-format.md §2 allows.
  const ef::Program via_output = load_ok(kInPlaceAllReduceViaOutput);
  for (const ef::Rank& rank : via_output.ranks) {
    EXPECT_EQ(rank.input_chunks, 2);
    EXPECT_EQ(rank.output_chunks, 2);
  }
  expect_valid(via_output);
  expect_verifies(via_output, {true});

  std::string via_input(kInPlaceAllReduceViaOutput);
  for (const std::string_view from : {"buf=\"o\" srcoff=\"0\"", "buf=\"o\" srcoff=\"1\"",
                                      "buf=\"o\" dstoff=\"0\"", "buf=\"o\" dstoff=\"1\""})
    for (std::size_t at; (at = via_input.find(from)) != std::string::npos;)
      via_input.replace(at, 7, "buf=\"i\"");
  for (std::size_t at; (at = via_input.find("i_chunks=\"0\" o_chunks=\"2\"")) != std::string::npos;)
    via_input.replace(at, 25, "i_chunks=\"2\" o_chunks=\"0\"");
  const ef::Program p = load_ok(via_input);
  for (const ef::Rank& rank : p.ranks) {
    EXPECT_EQ(rank.input_chunks, 2);
    EXPECT_EQ(rank.output_chunks, 0);
  }
  expect_valid(p);
  expect_verifies(p, {true});
}

TEST(MscclToolsXml, ExportStatesTheBlockAndReadsBackTheSame) {
  const ef::Program p = load_ok(kInPlaceAllGather);
  const StatusOr<std::string> xml = ef::save_msccl_xml(p);
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  EXPECT_NE(xml->find("inplace=\"1\" outofplace=\"0\""), std::string::npos) << *xml;
  EXPECT_NE(xml->find("i_chunks=\"1\" o_chunks=\"3\""), std::string::npos) << *xml;
  EXPECT_EQ(load_ok(*xml), p);
}

// ---- what stays an error ----

TEST(MscclToolsXml, AStepNamingTheEmptyBufferIsOutsideIt) {
  // MSCCL's bounds check refuses the step; here the rank keeps its 0 chunks and validation
  // names the step. The other ranks are completed as usual.
  const std::string text = with(kInPlaceAllGather, "type=\"s\" srcbuf=\"o\" srcoff=\"0\"",
                                "type=\"s\" srcbuf=\"i\" srcoff=\"0\"");
  const ef::XmlLoadResult loaded = ef::load_msccl_xml(text, "bad.xml");
  ASSERT_TRUE(loaded.program.has_value());
  EXPECT_EQ(loaded.program->ranks.at(0).input_chunks, 0);
  EXPECT_EQ(loaded.program->ranks.at(1).input_chunks, 1);
  const Diagnostics all = problems(text);
  expect_problem(all, "algo/gpu[id=0]/tb[id=0]/step[s=0]@srcoff (line 4)", "buffer-range", "input");
  expect_problem(all, "algo/gpu[id=0]@i_chunks (line 2)", "collective-shape",
                 "input_chunks is 0; expected 1 for allgather");
}

TEST(MscclToolsXml, AnEmptyContainedBufferNeedsAnInPlaceOnlyProgram) {
  // For out-of-place calls the input is a buffer of its own that the program must read.
  for (const std::string_view modes :
       {"inplace=\"1\" outofplace=\"1\"", "inplace=\"0\"", "inplace=\"0\" outofplace=\"1\""}) {
    SCOPED_TRACE(modes);
    expect_problem(problems(with(kInPlaceAllGather, "inplace=\"1\"", modes)),
                   "algo/gpu[id=0]@i_chunks (line 2)", "collective-shape",
                   "input_chunks is 0; expected 1 for allgather (nchunksperloop 3, nranks 3)");
  }
  // A block size that does not divide stays an error about nchunksperloop.
  std::string uneven = with(kInPlaceAllGather, "nchunksperloop=\"3\"", "nchunksperloop=\"4\"");
  expect_problem(problems(uneven), "algo@nchunksperloop", "collective-shape",
                 "not a multiple of nranks 3");
  // Non-zero counts are never changed: a wrong one is reported as written.
  expect_problem(problems(with(kInPlaceAllGather, "i_chunks=\"0\"", "i_chunks=\"2\"")),
                 "algo/gpu[id=0]@i_chunks (line 2)", "collective-shape",
                 "input_chunks is 2; expected 1");
}

TEST(MscclToolsXml, RanksWithoutAliasingKeepTheirDeclaredBuffers) {
  // In-place gather aliases only the root's input; a non-root rank's input of 0 chunks is
  // reported, not completed.
  std::string gather = with(kInPlaceAllGather, "coll=\"allgather\"", "coll=\"gather\"");
  const ef::XmlLoadResult loaded = ef::load_msccl_xml(gather, "bad.xml");
  ASSERT_TRUE(loaded.program.has_value());
  EXPECT_EQ(loaded.program->ranks.at(0).input_chunks, 1);  // the root (0)
  EXPECT_EQ(loaded.program->ranks.at(1).input_chunks, 0);
  expect_problem(problems(gather), "algo/gpu[id=1]@i_chunks (line 9)", "collective-shape",
                 "input_chunks is 0; expected 1 for gather on a non-root rank");
}

// ---- hostile input ----

/// Imports, validates and (when valid) runs `text` in every mode it allows; returns whether it
/// imported and whether it was valid. Any outcome but a crash or a hang is fine.
std::pair<bool, bool> exercise(const std::string& text) {
  const ef::XmlLoadResult result = ef::load_msccl_xml(text, "mutated.xml");
  if (!result.program) {
    EXPECT_FALSE(result.diagnostics.empty());
    return {false, false};
  }
  if (!ef::validate(*result.program).empty()) return {true, false};
  for (const bool inplace : host::allowed_inplace_modes(*result.program)) {
    host::ExecOptions o;
    o.count = ef::count_granularity(*result.program) * 2;
    o.inplace = inplace;
    host::run_and_verify(*result.program, o, 1);
  }
  return {true, true};
}

const std::string_view kOriginals[] = {kInPlaceAllGather, kOutOfPlaceAllGather,
                                       kInPlaceReduceScatter, kInPlaceAllReduceViaOutput};

TEST(MscclToolsXml, MutatedBytesNeverCrashImportValidationOrExecution) {
  std::mt19937 rng(2024);
  const std::string replacements = "<>/=\"'&-0123456789 ios";
  int accepted = 0;
  for (int round = 0; round < 400; ++round) {
    std::string text(kOriginals[round % 4]);
    for (int k = 0; k < 2; ++k) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0:
          text[at] = replacements[rng() % replacements.size()];
          break;
        case 1:
          text.erase(at, rng() % 6);
          break;
        default:
          text.insert(at, 1, replacements[rng() % replacements.size()]);
          break;
      }
    }
    accepted += exercise(text).first;
  }
  EXPECT_GT(accepted, 0);
}

TEST(MscclToolsXml, MutatedAttributesNeverCrashImportValidationOrExecution) {
  // Well-formed files with other values where these conventions matter: buffer sizes, buffer
  // names, modes, collectives, chunk counts.
  struct Pool {
    std::string_view attribute;
    std::vector<std::string_view> values;
  };
  const std::vector<Pool> pools = {
      {"i_chunks", {"0", "1", "2", "3", "6", "-1", "9223372036854775807"}},
      {"o_chunks", {"0", "1", "2", "3", "6", "-1", "9223372036854775807"}},
      {"srcbuf", {"i", "o", "s"}},
      {"dstbuf", {"i", "o", "s"}},
      {"inplace", {"0", "1"}},
      {"coll",
       {"allgather", "reduce_scatter", "reducescatter", "allreduce", "alltoall", "broadcast",
        "reduce", "gather", "scatter", "custom"}},
      {"nchunksperloop", {"1", "2", "3", "4", "6", "2147483647"}},
      {"srcoff", {"0", "1", "2", "5"}},
      {"dstoff", {"0", "1", "2", "5"}},
  };
  std::mt19937 rng(7);
  int accepted = 0, valid = 0;
  for (int round = 0; round < 1500; ++round) {
    std::string text(kOriginals[round % 4]);
    for (int k = 0, changes = 1 + static_cast<int>(rng() % 4); k < changes; ++k) {
      const Pool& pool = pools[rng() % pools.size()];
      const std::string key = " " + std::string(pool.attribute) + "=\"";
      std::vector<std::size_t> sites;
      for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
        sites.push_back(at + key.size());
      if (sites.empty()) continue;
      const std::size_t begin = sites[rng() % sites.size()];
      const std::size_t end = text.find('"', begin);
      text.replace(begin, end - begin, pool.values[rng() % pool.values.size()]);
    }
    if (const std::size_t at = text.find(" inplace=\"");
        at != std::string::npos && rng() % 4 == 0) {  // state outofplace too
      text.insert(at, rng() % 2 ? " outofplace=\"1\"" : " outofplace=\"0\"");
    }
    const auto [imported, is_valid] = exercise(text);
    accepted += imported;
    valid += is_valid;
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(valid, 50);
  std::printf("%d of 1500 mutated files imported, %d of them valid\n", accepted, valid);
}

}  // namespace
}  // namespace efccl
