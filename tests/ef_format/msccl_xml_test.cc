#include "efccl/ef/msccl_xml.h"

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "msccl_corpus.h"

namespace efccl::ef {
namespace {

/// One connection of a program: (sender, receiver, channel).
struct ConnectionEnds {
  int32_t sender = 0, receiver = 0, channel = 0;
};

using Clock = std::chrono::steady_clock;

// Two ranks exchanging one chunk, in exactly the form save_msccl_xml writes (canonical).
constexpr std::string_view kBase =
    R"(<algo name="pair" proto="LL" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="4096">
  <gpu id="0" i_chunks="2" o_chunks="2" s_chunks="1">
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="1" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="-1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="1"/>
      <step s="1" type="re" srcbuf="s" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="2" send="-1" recv="-1" chan="0">
      <step s="0" type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="0" depid="1" deps="0" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="2" s_chunks="1">
    <tb id="0" send="0" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="1" dstbuf="o" dstoff="-1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <tb id="1" send="-1" recv="0" chan="0">
      <step s="0" type="r" srcbuf="i" srcoff="-1" dstbuf="s" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
)";

/// kBase with the first occurrence of `from` (which must exist) replaced by `to`.
std::string base_with(std::string_view from, std::string_view to) {
  std::string text(kBase);
  const std::size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "kBase has no " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

Program load_ok(std::string_view text, const std::string& file = "<memory>") {
  XmlLoadResult result = load_msccl_xml(text, file);
  for (const Diagnostic& d : result.diagnostics) ADD_FAILURE() << d.to_string();
  EXPECT_TRUE(result.program.has_value());
  return result.program ? std::move(*result.program) : Program{};
}

/// Loads text that must be rejected; returns the first diagnostic after checking it names
/// `location` and `words` and carries `rule`.
Diagnostic load_error(std::string_view text, std::string_view location, std::string_view words,
                      std::string_view rule = "schema") {
  XmlLoadResult result = load_msccl_xml(text, "bad.xml");
  EXPECT_FALSE(result.program.has_value());
  if (result.diagnostics.empty()) {
    ADD_FAILURE() << "no diagnostic";
    return {};
  }
  const Diagnostic& d = result.diagnostics.front();
  EXPECT_EQ(d.file, "bad.xml");
  EXPECT_EQ(d.location, location) << d.to_string();
  EXPECT_EQ(d.rule, rule) << d.to_string();
  EXPECT_NE(d.message.find(words), std::string::npos)
      << d.to_string() << "\nexpected it to mention: " << words;
  return d;
}

std::string read_corpus_file(const std::string& name) {
  std::ifstream in(test_support::msccl_corpus_file(name), std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

/// The program with every declared_hasdep cleared (EF JSON and memory programs have none).
Program without_declared_hasdep(Program p) {
  for (Rank& rank : p.ranks)
    for (Threadblock& tb : rank.threadblocks)
      for (Op& op : tb.ops) op.declared_hasdep.reset();
  return p;
}

// ---- Import ----

TEST(MscclXmlImport, MapsEveryAttribute) {
  const Program p = load_ok(kBase, "pair.xml");
  EXPECT_EQ(p.name, "pair");
  EXPECT_EQ(p.protocol, Protocol::kLL);
  EXPECT_EQ(p.collective, Collective::kAllReduce);
  EXPECT_EQ(p.nranks, 2);
  EXPECT_EQ(p.nchunksperloop, 2);
  EXPECT_EQ(p.nchannels, 1);
  EXPECT_EQ(p.root, 0);
  EXPECT_FALSE(p.inplace);
  EXPECT_TRUE(p.outofplace);
  EXPECT_EQ(p.min_bytes, 0u);
  EXPECT_EQ(p.max_bytes, std::optional<uint64_t>(4096));
  ASSERT_EQ(p.ranks.size(), 2u);

  const Rank& r0 = p.ranks.at(0);
  EXPECT_EQ(r0.input_chunks, 2);
  EXPECT_EQ(r0.output_chunks, 2);
  EXPECT_EQ(r0.scratch_chunks, 1);
  ASSERT_EQ(r0.threadblocks.size(), 3u);
  EXPECT_EQ(r0.threadblocks.at(0).send_peer, 1);
  EXPECT_EQ(r0.threadblocks.at(0).recv_peer, -1);
  EXPECT_EQ(r0.threadblocks.at(1).recv_peer, 1);

  const Op& send = r0.threadblocks.at(0).ops.at(0);
  EXPECT_EQ(send.code, OpCode::kSend);
  EXPECT_EQ(send.src, (BufferRef{BufferKind::kInput, 0}));
  EXPECT_FALSE(send.dst.has_value());  // unused by a send: not stored
  EXPECT_EQ(send.count, 1);
  EXPECT_TRUE(send.deps.empty());
  EXPECT_EQ(send.declared_hasdep, false);

  const Op& recv = r0.threadblocks.at(1).ops.at(0);
  EXPECT_EQ(recv.code, OpCode::kRecv);
  EXPECT_FALSE(recv.src.has_value());
  EXPECT_EQ(recv.dst, (BufferRef{BufferKind::kScratch, 0}));
  EXPECT_EQ(recv.declared_hasdep, true);

  const Op& reduce = r0.threadblocks.at(1).ops.at(1);
  EXPECT_EQ(reduce.code, OpCode::kReduce);
  EXPECT_EQ(reduce.src, (BufferRef{BufferKind::kScratch, 0}));
  EXPECT_EQ(reduce.dst, (BufferRef{BufferKind::kOutput, 1}));

  const Op& nop = r0.threadblocks.at(2).ops.at(0);
  EXPECT_EQ(nop.code, OpCode::kNop);
  EXPECT_EQ(nop.count, 0);
  EXPECT_FALSE(nop.src.has_value());
  EXPECT_FALSE(nop.dst.has_value());
  EXPECT_EQ(nop.deps, (std::vector<Dependency>{{1, 0}}));
}

TEST(MscclXmlImport, FillsTheSourceMap) {
  const Program p = load_ok(kBase, "pair.xml");
  EXPECT_EQ(p.source.format, SourceMap::Format::kMscclXml);
  EXPECT_EQ(p.source.file, "pair.xml");
  EXPECT_EQ(p.source.rank_lines, (std::vector<int>{2, 14}));
  EXPECT_EQ(p.source.tb_lines, (std::vector<std::vector<int>>{{3, 6, 10}, {15, 18}}));
  EXPECT_EQ(p.source.op_lines.at(0), (std::vector<std::vector<int>>{{4}, {7, 8}, {11}}));
  EXPECT_EQ(p.source.op_lines.at(1), (std::vector<std::vector<int>>{{16}, {19}}));
}

TEST(MscclXmlImport, SortsGpusAndTbsById) {
  // Swap the two <gpu> elements and the first two <tb> of gpu 0: the program is the same.
  const std::string text(kBase);
  const std::size_t gpu1 = text.find("  <gpu id=\"1\"");
  const std::size_t end = text.find("</algo>");
  const std::size_t tb1 = text.find("    <tb id=\"1\"");
  const std::size_t tb2 = text.find("    <tb id=\"2\"");
  const std::size_t gpu0 = text.find("  <gpu id=\"0\"");
  const std::size_t tb0 = text.find("    <tb id=\"0\"");
  const std::string gpu0_head = text.substr(gpu0, tb0 - gpu0);
  const std::string swapped = text.substr(0, gpu0) + text.substr(gpu1, end - gpu1) + gpu0_head +
                              text.substr(tb1, tb2 - tb1) + text.substr(tb0, tb1 - tb0) +
                              text.substr(tb2, gpu1 - tb2) + "</algo>\n";
  const Program p = load_ok(swapped);
  EXPECT_EQ(p, load_ok(kBase));
  EXPECT_EQ(p.source.rank_lines, (std::vector<int>{10, 2}));
  EXPECT_EQ(p.source.tb_lines.at(0), (std::vector<int>{15, 11, 18}));
}

TEST(MscclXmlImport, NamesTheElementPathAttributeAndLine) {
  const Diagnostic d = load_error(base_with("srcoff=\"0\"", "srcoff=\"12abc\""),
                                  "algo/gpu[id=0]/tb[id=0]/step[s=0]@srcoff (line 4)", "\"12abc\"");
  EXPECT_EQ(d.to_string(),
            "bad.xml: algo/gpu[id=0]/tb[id=0]/step[s=0]@srcoff (line 4): expected an integer in "
            "0 ... 9223372036854775807, found \"12abc\" [schema]");
}

TEST(MscclXmlImport, OperandsAStepDoesNotUseMustStillBeWellFormed) {
  // The send on line 4 does not use dstbuf/dstoff, the nop on line 11 neither operand.
  EXPECT_FALSE(load_ok(kBase).ranks.at(0).threadblocks.at(0).ops.at(0).dst.has_value());
  load_error(base_with("dstbuf=\"o\" dstoff=\"-1\" cnt=\"1\"", "dstbuf=\"q\" dstoff=\"-1\" cnt=\"1\""),
             "algo/gpu[id=0]/tb[id=0]/step[s=0]@dstbuf (line 4)",
             "unknown buffer \"q\"; expected i, o or s (also where the step type does not use it)");
  load_error(base_with("dstoff=\"-1\"", "dstoff=\"x\""),
             "algo/gpu[id=0]/tb[id=0]/step[s=0]@dstoff (line 4)",
             "expected an integer in -1 ... 9223372036854775807, found \"x\"");
  load_error(base_with("dstoff=\"-1\"", "dstoff=\"-2\""),
             "algo/gpu[id=0]/tb[id=0]/step[s=0]@dstoff (line 4)", "found \"-2\"");
  load_error(base_with("type=\"nop\" srcbuf=\"i\" srcoff=\"-1\"", "type=\"nop\" srcbuf=\"i\" srcoff=\"1.5\""),
             "algo/gpu[id=0]/tb[id=2]/step[s=0]@srcoff (line 11)", "found \"1.5\"");
  // A copy of the other side, as MSCCL writes it, is well-formed.
  load_ok(base_with("dstbuf=\"o\" dstoff=\"-1\" cnt=\"1\"", "dstbuf=\"o\" dstoff=\"0\" cnt=\"1\""));
}

TEST(MscclXmlImport, RejectsNamesLongerThanEfJsonAllows) {
  // EF JSON limits names to 256 bytes; a longer imported name would make import-msccl write
  // JSON that cannot be loaded back.
  const std::string at_limit(256, 'n');
  const Program p = load_ok(base_with("name=\"pair\"", "name=\"" + at_limit + "\""));
  EXPECT_EQ(p.name, at_limit);
  const Diagnostic d = load_error(base_with("name=\"pair\"", "name=\"" + at_limit + "x\""),
                                  "algo@name (line 1)", "at most 256 bytes, found 257");
  EXPECT_EQ(d.rule, "schema");
  // The limit counts the decoded bytes (an entity is one byte), as JSON's does.
  load_ok(base_with("name=\"pair\"", "name=\"" + std::string(255, 'n') + "&amp;\""));
}

TEST(MscclXmlImport, RejectsIntegersOutOfRange) {
  load_error(base_with("dstoff=\"1\"", "dstoff=\"99999999999999999999\""),
             "algo/gpu[id=0]/tb[id=1]/step[s=1]@dstoff (line 8)", "99999999999999999999");
  load_error(base_with("chan=\"0\"", "chan=\"2147483648\""),
             "algo/gpu[id=0]/tb[id=0]@chan (line 3)", "-2147483648 ... 2147483647");
  load_error(base_with("cnt=\"1\"", "cnt=\"-1\""), "algo/gpu[id=0]/tb[id=0]/step[s=0]@cnt (line 4)",
             "\"-1\"");
  load_error(base_with("i_chunks=\"2\"", "i_chunks=\"-3\""), "algo/gpu[id=0]@i_chunks (line 2)",
             "\"-3\"");
  load_error(base_with("ngpus=\"2\"", "ngpus=\"4097\""), "algo@ngpus (line 1)", "1 ... 4096");
  load_error(base_with("nchannels=\"1\"", "nchannels=\" 1\""), "algo@nchannels (line 1)",
             "\" 1\"");
  load_error(base_with("nchunksperloop=\"2\"", "nchunksperloop=\"+2\""),
             "algo@nchunksperloop (line 1)", "\"+2\"");
  load_error(base_with("minBytes=\"0\"", "minBytes=\"18446744073709551616\""),
             "algo@minBytes (line 1)", "byte count");
  load_error(base_with("minBytes=\"0\"", "minBytes=\"\""), "algo@minBytes (line 1)", "\"\"");
}

TEST(MscclXmlImport, AcceptsAny32BitPeerAndChannelForTheValidator) {
  const Program p = load_ok(base_with("send=\"1\"", "send=\"-7\""));
  EXPECT_EQ(p.ranks.at(0).threadblocks.at(0).send_peer, -7);  // peer-range is validate()'s rule
}

TEST(MscclXmlImport, RejectsUnknownStepTypesAndBuffers) {
  load_error(base_with("type=\"re\"", "type=\"reduce\""),
             "algo/gpu[id=0]/tb[id=1]/step[s=1]@type (line 8)", "unknown step type \"reduce\"");
  load_error(base_with("srcbuf=\"s\"", "srcbuf=\"x\""),
             "algo/gpu[id=0]/tb[id=1]/step[s=1]@srcbuf (line 8)", "unknown buffer \"x\"");
}

TEST(MscclXmlImport, UnusedOperandsMayBeAbsentButNotJunk) {
  // The recv's src and the nop's both operands hold junk: each is reported.
  std::string text = base_with("srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"s\"",
                               "srcbuf=\"zz\" srcoff=\"junk\" dstbuf=\"s\"");
  const std::string_view nop_fields =
      "type=\"nop\" srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"o\" dstoff=\"-1\"";
  text.replace(text.find(nop_fields), nop_fields.size(),
               "type=\"nop\" srcbuf=\"?\" srcoff=\"\" dstbuf=\"\" dstoff=\"99999999999999999999\"");
  const XmlLoadResult junk = load_msccl_xml(text, "junk.xml");
  EXPECT_FALSE(junk.program.has_value());
  std::vector<std::string> locations;
  for (const Diagnostic& d : junk.diagnostics) locations.push_back(d.location);
  EXPECT_EQ(locations, (std::vector<std::string>{
                           "algo/gpu[id=0]/tb[id=1]/step[s=0]@srcbuf (line 7)",
                           "algo/gpu[id=0]/tb[id=1]/step[s=0]@srcoff (line 7)",
                           "algo/gpu[id=0]/tb[id=2]/step[s=0]@srcbuf (line 11)",
                           "algo/gpu[id=0]/tb[id=2]/step[s=0]@srcoff (line 11)",
                           "algo/gpu[id=0]/tb[id=2]/step[s=0]@dstbuf (line 11)",
                           "algo/gpu[id=0]/tb[id=2]/step[s=0]@dstoff (line 11)"}));
  // Missing entirely is fine.
  const Program q = load_ok(base_with("srcbuf=\"i\" srcoff=\"-1\" dstbuf=\"s\"", "dstbuf=\"s\""));
  EXPECT_EQ(q, load_ok(kBase));
  // ... but a used field must be there.
  load_error(base_with("srcbuf=\"s\" srcoff=\"0\" ", ""),
             "algo/gpu[id=0]/tb[id=1]/step[s=1]@srcbuf (line 8)", "missing attribute srcbuf");
}

TEST(MscclXmlImport, MapsDependencyPairs) {
  load_error(base_with("depid=\"1\" deps=\"0\"", "depid=\"1\" deps=\"-1\""),
             "algo/gpu[id=0]/tb[id=2]/step[s=0]@deps (line 11)", "depid=1 and deps=-1");
  load_error(base_with("depid=\"1\" deps=\"0\"", "depid=\"-2\" deps=\"-2\""),
             "algo/gpu[id=0]/tb[id=2]/step[s=0]@depid (line 11)", "-1 ... 2147483647");
  const Program p = load_ok(base_with("depid=\"1\" deps=\"0\"", "depid=\"0\" deps=\"0\""));
  EXPECT_EQ(p.ranks.at(0).threadblocks.at(2).ops.at(0).deps, (std::vector<Dependency>{{0, 0}}));
  // Neither given: no dependency, and a missing hasdep stays undeclared.
  const Program q = load_ok(base_with(" depid=\"1\" deps=\"0\" hasdep=\"0\"", ""));
  EXPECT_TRUE(q.ranks.at(0).threadblocks.at(2).ops.at(0).deps.empty());
  EXPECT_EQ(q.ranks.at(0).threadblocks.at(2).ops.at(0).declared_hasdep, std::nullopt);
  load_error(base_with("hasdep=\"1\"", "hasdep=\"yes\""),
             "algo/gpu[id=0]/tb[id=1]/step[s=0]@hasdep (line 7)", "\"0\" or \"1\"");
}

TEST(MscclXmlImport, RequiresGpuIdsZeroToNgpusMinusOne) {
  load_error(base_with("<gpu id=\"1\"", "<gpu id=\"0\""), "algo/gpu[id=0]@id (line 14)",
             "duplicate gpu id 0 (first on line 2)");
  load_error(base_with("<gpu id=\"1\"", "<gpu id=\"2\""), "algo/gpu[id=2]@id (line 14)",
             "outside 0 ... 1");
  load_error(base_with("ngpus=\"2\"", "ngpus=\"3\""), "algo@ngpus (line 1)",
             "no <gpu> with id 2");
  load_error(base_with("<gpu id=\"1\"", "<gpu id=\"one\""), "algo/gpu[#1]@id (line 14)",
             "found \"one\"");
}

TEST(MscclXmlImport, RequiresTbIdsZeroToCountMinusOne) {
  load_error(base_with("<tb id=\"2\"", "<tb id=\"3\""), "algo/gpu[id=0]/tb[id=3]@id (line 10)",
             "outside 0 ... 2");
  load_error(base_with("<tb id=\"2\"", "<tb id=\"1\""), "algo/gpu[id=0]/tb[id=1]@id (line 10)",
             "duplicate tb id 1 (first on line 6)");
}

TEST(MscclXmlImport, RequiresStepNumbersInOrder) {
  load_error(base_with("<step s=\"1\"", "<step s=\"2\""),
             "algo/gpu[id=0]/tb[id=1]/step[s=2]@s (line 8)", "at position 1");
}

TEST(MscclXmlImport, RejectsUnknownAttributesAndElements) {
  load_error(base_with("coll=\"allreduce\"", "coll=\"allreduce\" colour=\"red\""),
             "algo@colour (line 1)", "unknown attribute colour");
  load_error(base_with("cnt=\"1\"", "cnt=\"1\" count=\"1\""),
             "algo/gpu[id=0]/tb[id=0]/step[s=0]@count (line 4)", "unknown attribute count");
  load_error(base_with("    </tb>", "    <note/></tb>"), "algo/gpu[id=0]/tb[id=0] (line 5)",
             "unexpected element <note> inside <tb>");
  load_error(base_with("hasdep=\"0\"/>", "hasdep=\"0\"><step/></step>"),
             "algo/gpu[id=0]/tb[id=0]/step[s=0] (line 4)", "inside <step>; it has no children");
  load_error("<algorithm/>", "algorithm (line 1)", "expected the root element <algo>");
  load_error(base_with("coll=\"allreduce\" ", ""), "algo@coll (line 1)", "missing attribute coll");
}

TEST(MscclXmlImport, ChecksAlgoExtras) {
  EXPECT_EQ(load_ok(base_with("ngpus=\"2\"", "ngpus=\"2\" nthreadblocks=\"3\" maxcount=\"1\"")),
            load_ok(kBase));
  load_error(base_with("ngpus=\"2\"", "ngpus=\"2\" nthreadblocks=\"2\""),
             "algo@nthreadblocks (line 1)", "gpu id 0 has 3 <tb>");
  EXPECT_EQ(load_ok(base_with("ngpus=\"2\"", "ngpus=\"2\" redop=\"sum\"")), load_ok(kBase));
  load_error(base_with("ngpus=\"2\"", "ngpus=\"2\" redop=\"xor\""), "algo@redop (line 1)",
             "unknown reduction \"xor\"");
  load_error(base_with("proto=\"LL\"", "proto=\"ll\""), "algo@proto (line 1)",
             "unknown protocol \"ll\"");
  load_error(base_with("coll=\"allreduce\"", "coll=\"allreduce2\""), "algo@coll (line 1)",
             "unknown collective");
  load_error(base_with("inplace=\"0\"", "inplace=\"2\""), "algo@inplace (line 1)",
             "\"0\" or \"1\"");
  EXPECT_EQ(load_ok(base_with("coll=\"allreduce\"", "coll=\"broadcast\" root=\"1\"")).root, 1);
  EXPECT_EQ(load_ok(base_with("coll=\"allreduce\"", "coll=\"custom\"")).collective,
            Collective::kCustom);
}

TEST(MscclXmlImport, ReadsByteRangesWithRcclsUnboundedConvention) {
  const auto range = [](std::string_view attributes) {
    const Program p = load_ok(base_with("minBytes=\"0\" maxBytes=\"4096\"", attributes));
    return std::make_pair(p.min_bytes, p.max_bytes);
  };
  using Range = std::pair<uint64_t, std::optional<uint64_t>>;
  EXPECT_EQ(range("minBytes=\"10\" maxBytes=\"0\""), (Range{10, std::nullopt}));
  EXPECT_EQ(range("minBytes=\"0\" maxBytes=\"0\""), (Range{0, 0}));
  EXPECT_EQ(range("minBytes=\"10\""), (Range{10, std::nullopt}));
  EXPECT_EQ(range(""), (Range{0, std::nullopt}));
  EXPECT_EQ(range("minBytes=\"10\" maxBytes=\"18446744073709551615\""),
            (Range{10, UINT64_MAX}));
}

TEST(MscclXmlImport, ReportsXmlErrorsAsSyntaxWithByteAndLine) {
  const std::size_t cut = kBase.find("</tb>\n") + 6;
  load_error(kBase.substr(0, cut), "byte " + std::to_string(cut) + " (line 6)",
             "<gpu> opened on line 2 is not closed", "syntax");
  load_error("<!DOCTYPE algo>\n<algo/>", "byte 0 (line 1)", "DOCTYPE", "syntax");
  std::string deep;
  for (int i = 0; i < 200000; ++i) deep += "<algo>";
  const auto start = Clock::now();
  load_error(deep, "byte 96 (line 1)", "nested deeper than the limit of 16", "syntax");
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200));
}

TEST(MscclXmlImport, ReportsSeveralProblemsAtOnce) {
  std::string text = base_with("cnt=\"1\"", "cnt=\"x\"");
  text.replace(text.find("chan=\"0\""), 8, "chan=\"y\"");
  const XmlLoadResult result = load_msccl_xml(text);
  EXPECT_FALSE(result.program.has_value());
  EXPECT_EQ(result.diagnostics.size(), 2u);
}

// ---- Export ----

TEST(MscclXmlExport, WritesCanonicalXml) {
  const StatusOr<std::string> xml = save_msccl_xml(load_ok(kBase));
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  EXPECT_EQ(*xml, kBase);
}

TEST(MscclXmlExport, ComputesHasdepAndRoundTripsSingleDependencyPrograms) {
  Program p = without_declared_hasdep(load_ok(kBase));
  p.name = "quotes \" & <tags> 'apostrophes'\ttab\nnewline\rcr";
  p.collective = Collective::kBroadcast;
  p.root = 1;
  p.max_bytes.reset();
  p.min_bytes = 7;
  const StatusOr<std::string> xml = save_msccl_xml(p);
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  const Program back = load_ok(*xml);
  EXPECT_EQ(without_declared_hasdep(back), p);
  // hasdep is 1 exactly where some op of the rank depends on the op.
  EXPECT_EQ(back.ranks.at(0).threadblocks.at(1).ops.at(0).declared_hasdep, true);
  EXPECT_EQ(back.ranks.at(0).threadblocks.at(1).ops.at(1).declared_hasdep, false);
  EXPECT_EQ(back.ranks.at(0).threadblocks.at(0).ops.at(0).declared_hasdep, false);
  EXPECT_EQ(back.ranks.at(1).threadblocks.at(1).ops.at(0).declared_hasdep, false);
}

Op copy_op(int64_t off, std::vector<Dependency> deps = {}) {
  Op op;
  op.code = OpCode::kCopy;
  op.src = BufferRef{BufferKind::kInput, off};
  op.dst = BufferRef{BufferKind::kOutput, off};
  op.count = 1;
  op.deps = std::move(deps);
  return op;
}

Op nop_op(Dependency dep) {
  Op op;
  op.code = OpCode::kNop;
  op.count = 0;
  op.deps = {dep};
  return op;
}

TEST(MscclXmlExport, LowersSeveralDependenciesToNopsAndShiftsTargets) {
  Program p;
  p.name = "deps";
  p.nranks = 1;
  p.nchunksperloop = 4;
  p.ranks.resize(1);
  p.ranks.at(0).input_chunks = 4;
  p.ranks.at(0).output_chunks = 4;
  auto& tbs = p.ranks.at(0).threadblocks;
  tbs.resize(3);
  tbs[0].ops = {copy_op(0), copy_op(1, {{1, 0}, {2, 0}}), copy_op(2)};
  tbs[1].ops = {copy_op(3, {{0, 0}}), copy_op(3, {{0, 2}})};
  tbs[2].ops = {copy_op(0, {{0, 1}, {1, 0}, {1, 1}})};

  const StatusOr<std::string> xml = save_msccl_xml(p);
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  const Program back = load_ok(*xml);
  const auto& out = back.ranks.at(0).threadblocks;
  ASSERT_EQ(out.size(), 3u);
  // tb 0: op 1 gains one nop; tb 2: op 0 gains two. Targets in them move down accordingly.
  EXPECT_EQ(without_declared_hasdep(back).ranks.at(0).threadblocks.at(0).ops,
            (std::vector<Op>{copy_op(0), nop_op({1, 0}), copy_op(1, {{2, 2}}), copy_op(2)}));
  EXPECT_EQ(without_declared_hasdep(back).ranks.at(0).threadblocks.at(1).ops,
            (std::vector<Op>{copy_op(3, {{0, 0}}), copy_op(3, {{0, 3}})}));
  EXPECT_EQ(without_declared_hasdep(back).ranks.at(0).threadblocks.at(2).ops,
            (std::vector<Op>{nop_op({0, 2}), nop_op({1, 0}), copy_op(0, {{1, 1}})}));
  const auto hasdep = [&](int tb, int op) { return out.at(tb).ops.at(op).declared_hasdep; };
  EXPECT_EQ(hasdep(0, 0), true);   // tb 1 op 0 waits for it
  EXPECT_EQ(hasdep(0, 1), false);  // inserted nop
  EXPECT_EQ(hasdep(0, 2), true);   // tb 2 waits for it
  EXPECT_EQ(hasdep(0, 3), true);
  EXPECT_EQ(hasdep(1, 0), true);
  EXPECT_EQ(hasdep(1, 1), true);
  EXPECT_EQ(hasdep(2, 0), false);
  EXPECT_EQ(hasdep(2, 2), true);
  // Exporting the lowered program changes nothing further.
  const StatusOr<std::string> again = save_msccl_xml(back);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, *xml);
}

TEST(MscclXmlExport, RefusesWhatMscclCannotExpress) {
  Program p = load_ok(kBase);
  // Multi-rank ops have no MSCCL step type, either way.
  Program multi = p;
  multi.ranks[0].threadblocks[0].ops[0].code = OpCode::kMultiReduceCopy;
  EXPECT_NE(save_msccl_xml(multi).status().message().find("multi-rank op (mrc)"),
            std::string::npos);
  EXPECT_FALSE(parse_msccl_op_code("mrc").has_value());
  EXPECT_EQ(parse_msccl_op_code("rrcs"), OpCode::kRecvReduceCopySend);
  p.collective = Collective::kCustom;
  EXPECT_NE(save_msccl_xml(p).status().message().find("custom"), std::string::npos);

  // Connection placement: MSCCL XML has no form for it; the import never produces it.
  p = load_ok(kBase);
  EXPECT_TRUE(p.placements.empty());
  EXPECT_EQ(p.slot_devices, 0);
  const ConnectionEnds placed = [&] {
    for (std::size_t r = 0; r < p.ranks.size(); ++r)
      for (const Threadblock& tb : p.ranks[r].threadblocks)
        if (tb.send_peer >= 0)
          return ConnectionEnds{static_cast<int32_t>(r), tb.send_peer, tb.channel};
    return ConnectionEnds{};
  }();
  p.placements = {{placed.sender, placed.receiver, placed.channel, SlotLocation::kHost, 0}};
  ASSERT_TRUE(save_msccl_xml(load_ok(kBase)).is_ok());
  const std::string message = save_msccl_xml(p).status().message();
  EXPECT_NE(message.find("MSCCL XML cannot carry connection placement"), std::string::npos)
      << message;
  p.placements.clear();
  p.slot_devices = 1;
  EXPECT_FALSE(save_msccl_xml(p).is_ok());

  p = load_ok(kBase);
  p.ranks.at(0).threadblocks.at(2).ops.at(0).deps = {{1, 5}};
  EXPECT_NE(save_msccl_xml(p).status().message().find("tb 1 op 5, which does not exist"),
            std::string::npos);

  p = load_ok(kBase);
  p.ranks.at(0).threadblocks.at(0).ops.at(0).dst = BufferRef{BufferKind::kOutput, 0};
  EXPECT_NE(save_msccl_xml(p).status().message().find("rank 0 tb 0 op 0 (send)"),
            std::string::npos);

  p = load_ok(kBase);
  p.nranks = 3;
  EXPECT_FALSE(save_msccl_xml(p).is_ok());

  p = load_ok(kBase);
  p.name = std::string("bell\x07");
  EXPECT_NE(save_msccl_xml(p).status().message().find("control character"), std::string::npos);
}

// ---- The MSCCL corpus ----

struct CorpusFile {
  const char* name;
  int32_t nranks;
  std::size_t tbs_on_rank0;
  std::map<std::string, std::size_t> op_counts;  ///< over all ranks, by MSCCL type name
};

const std::vector<CorpusFile>& corpus() {
  using Counts = std::map<std::string, std::size_t>;
  const Counts ring = {{"r", 384}, {"rcs", 5376}, {"rrcs", 384}, {"rrs", 5376}, {"s", 384}};
  const Counts pairs32_op = {{"cpy", 32}, {"nop", 2880}, {"r", 448}, {"re", 1792}, {"s", 448}};
  const Counts pairs32 = {{"nop", 2656}, {"r", 448}, {"re", 1792}, {"s", 448}};
  const Counts pairs64_op = {{"cpy", 64}, {"nop", 5760}, {"r", 896}, {"re", 3584}, {"s", 896}};
  const Counts pairs64 = {{"nop", 5312}, {"r", 896}, {"re", 3584}, {"s", 896}};
  static const std::vector<CorpusFile> files = {
      {"all-reduce-ring-ll.xml", 16, 24, ring},
      {"all-reduce-ring-ll128.xml", 16, 24, ring},
      {"all-reduce-ring-simple.xml", 16, 24, ring},
      {"allreduce-allpairs-8n-ll-32tb-op.xml", 8, 32, pairs32_op},
      {"allreduce-allpairs-8n-ll-32tb.xml", 8, 32, pairs32},
      {"allreduce-allpairs-8n-ll-64tb-op.xml", 8, 64, pairs64_op},
      {"allreduce-allpairs-8n-ll-64tb.xml", 8, 64, pairs64},
      {"allreduce-allpairs-8n-simple-op.xml", 8, 64, pairs64_op},
      {"allreduce-allpairs-8n-simple.xml", 8, 64, pairs64},
      {"allreduce-allpairs-8n-simple_2.xml", 8, 64, pairs64},
      {"alltoall-8n-0-9kb.xml", 8, 15, {{"cpy", 8}, {"r", 56}, {"s", 56}}},
      {"alltoall-8n-190kb-512kb.xml", 8, 60, {{"cpy", 32}, {"r", 224}, {"s", 224}}},
      {"alltoall-8n-512kb-7mb.xml", 8, 60, {{"cpy", 32}, {"r", 224}, {"s", 224}}},
      {"alltoall-8n-7mb-43mb.xml", 8, 64, {{"cpy", 64}, {"r", 448}, {"s", 448}}},
      {"alltoall-8n-9kb-190kb.xml", 8, 30, {{"cpy", 16}, {"r", 112}, {"s", 112}}},
  };
  return files;
}

void PrintTo(const CorpusFile& f, std::ostream* os) { *os << f.name; }

class MscclXmlCorpus : public testing::TestWithParam<CorpusFile> {};

TEST_P(MscclXmlCorpus, ImportsWithTheFilesCounts) {
  EFCCL_REQUIRE_MSCCL_CORPUS();
  const CorpusFile& f = GetParam();
  const std::string text = read_corpus_file(f.name);
  ASSERT_FALSE(text.empty()) << "missing " << test_support::msccl_corpus_file(f.name);
  const auto start = Clock::now();
  const Program p = load_ok(text, f.name);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(p.nranks, f.nranks);
  ASSERT_EQ(p.ranks.size(), static_cast<std::size_t>(f.nranks));
  EXPECT_EQ(p.ranks.at(0).threadblocks.size(), f.tbs_on_rank0);
  std::map<std::string, std::size_t> counts;
  std::size_t tbs = 0;
  for (const Rank& rank : p.ranks) {
    tbs += rank.threadblocks.size();
    for (const Threadblock& tb : rank.threadblocks)
      for (const Op& op : tb.ops) ++counts[std::string(to_msccl_string(op.code))];
  }
  EXPECT_EQ(counts, f.op_counts);
  // Every <tb> element became a threadblock.
  std::size_t tb_elements = 0;
  for (std::size_t at = text.find("<tb "); at != std::string::npos; at = text.find("<tb ", at + 1))
    ++tb_elements;
  EXPECT_EQ(tbs, tb_elements);
  EXPECT_EQ(p.source.file, f.name);
  EXPECT_EQ(p.source.op_lines.size(), p.ranks.size());
}

TEST_P(MscclXmlCorpus, ExportThenImportIsTheSameProgram) {
  EFCCL_REQUIRE_MSCCL_CORPUS();
  const CorpusFile& f = GetParam();
  const Program p = load_ok(read_corpus_file(f.name), f.name);
  const StatusOr<std::string> xml = save_msccl_xml(p);
  ASSERT_TRUE(xml.is_ok()) << xml.status().message();
  const Program back = load_ok(*xml);
  EXPECT_EQ(back, p);  // declared hasdep included: the corpus declares exactly the needed ones
  const StatusOr<std::string> again = save_msccl_xml(back);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, *xml);
}

INSTANTIATE_TEST_SUITE_P(AllFiles, MscclXmlCorpus, testing::ValuesIn(corpus()),
                         [](const testing::TestParamInfo<CorpusFile>& info) {
                           std::string name = info.param.name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

// ---- Hostile input ----

TEST(MscclXmlHostile, MutatedCorpusFilesNeverCrash) {
  EFCCL_REQUIRE_MSCCL_CORPUS();
  const std::string original = read_corpus_file("alltoall-8n-0-9kb.xml");
  ASSERT_FALSE(original.empty());
  std::mt19937 rng(99);
  const std::string replacements = "<>/=\"'&-0123456789 xs";
  int accepted = 0;
  for (int round = 0; round < 300; ++round) {
    std::string text = original;
    for (int k = 0; k < 3; ++k) {
      const std::size_t at = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[at] = replacements[rng() % replacements.size()]; break;
        case 1: text.erase(at, rng() % 8); break;
        default: text.insert(at, 1, replacements[rng() % replacements.size()]); break;
      }
    }
    const XmlLoadResult result = load_msccl_xml(text);
    if (!result.program) {
      EXPECT_FALSE(result.diagnostics.empty());
      continue;
    }
    ++accepted;
    const StatusOr<std::string> xml = save_msccl_xml(*result.program);
    if (xml.is_ok()) {
      EXPECT_TRUE(load_msccl_xml(*xml).program.has_value());
    }
  }
  EXPECT_LT(accepted, 300);
}

}  // namespace
}  // namespace efccl::ef
