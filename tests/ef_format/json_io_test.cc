// EF JSON load/save: round trips, the canonical form, one failing example per structural error
// with its exact JSON pointer, hostile input, and agreement with docs/ef-format.schema.json.
#include "efccl/ef/json_io.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "program_builders.h"

namespace efccl::ef {
namespace {

using nlohmann::json;

using test_builders::make_op;

/// Two ranks exchanging a chunk, plus a local copy; custom, so postconditions are present.
/// Every optional field has a non-default value, and every object kind appears.
Program exchange_program() {
  Program p;
  p.name = "exchange";
  p.collective = Collective::kCustom;
  p.protocol = Protocol::kLL128;
  p.nranks = 2;
  p.nchunksperloop = 2;
  p.nchannels = 2;
  p.root = 1;
  p.inplace = false;
  p.outofplace = true;
  p.min_bytes = 64;
  p.max_bytes = 1u << 20;
  for (int32_t r = 0; r < 2; ++r) {
    Rank rank;
    rank.input_chunks = 2;
    rank.output_chunks = 2;
    rank.scratch_chunks = 1;
    Threadblock net;
    net.send_peer = 1 - r;
    net.recv_peer = 1 - r;
    net.channel = 1;
    net.ops.push_back(make_op(OpCode::kSend, BufferRef{BufferKind::kInput, 0}, std::nullopt, 1));
    net.ops.push_back(
        make_op(OpCode::kRecv, std::nullopt, BufferRef{BufferKind::kScratch, 0}, 1, {{0, 0}}));
    Threadblock local;
    local.ops.push_back(make_op(OpCode::kCopy, BufferRef{BufferKind::kScratch, 0},
                                BufferRef{BufferKind::kOutput, 1}, 1, {{0, 1}, {0, 0}}));
    local.ops.push_back(make_op(OpCode::kNop, std::nullopt, std::nullopt, 0));
    rank.threadblocks = {net, local};
    p.ranks.push_back(rank);
  }
  p.postconditions = {{0, 1, {{1, 0}}}, {1, 1, {{0, 0}, {1, 1}}}};
  // Connection placement: rank 0 -> 1 through slot device 1, rank 1 -> 0 through host memory.
  p.slot_devices = 2;
  p.placements = {{0, 1, 1, SlotLocation::kDevice, 1}, {1, 0, 1, SlotLocation::kHost, 0}};
  return p;
}

/// A ring allreduce skeleton over n ranks: reduce-scatter then allgather, one threadblock.
Program ring_allreduce(int32_t n) {
  Program p;
  p.name = "ring allreduce";
  p.nranks = n;
  p.nchunksperloop = n;
  for (int32_t r = 0; r < n; ++r) {
    Rank rank;
    rank.input_chunks = n;
    rank.output_chunks = n;
    Threadblock tb;
    tb.send_peer = (r + 1) % n;
    tb.recv_peer = (r + n - 1) % n;
    tb.ops.push_back(make_op(OpCode::kSend, BufferRef{BufferKind::kInput, r}, std::nullopt, 1));
    for (int32_t step = 1; step < n - 1; ++step) {
      const int64_t c = (r - step + n) % n;
      tb.ops.push_back(
          make_op(OpCode::kRecvReduceSend, BufferRef{BufferKind::kInput, c}, std::nullopt, 1));
    }
    const int64_t own = (r + 1) % n;
    tb.ops.push_back(make_op(OpCode::kRecvReduceCopySend, BufferRef{BufferKind::kInput, own},
                             BufferRef{BufferKind::kOutput, own}, 1));
    for (int32_t step = 1; step < n - 1; ++step) {
      const int64_t c = (own - step + n) % n;
      tb.ops.push_back(
          make_op(OpCode::kRecvCopySend, std::nullopt, BufferRef{BufferKind::kOutput, c}, 1));
    }
    tb.ops.push_back(
        make_op(OpCode::kRecv, std::nullopt, BufferRef{BufferKind::kOutput, (own + 1) % n}, 1));
    rank.threadblocks.push_back(tb);
    p.ranks.push_back(rank);
  }
  return p;
}

/// save -> load -> save; checks the program survives and the text is byte-identical.
void expect_round_trip(const Program& program) {
  const std::string first = save_json(program);
  const JsonLoadResult loaded = load_json(first, "rt.json");
  ASSERT_TRUE(loaded.program.has_value())
      << (loaded.diagnostics.empty() ? "" : loaded.diagnostics[0].to_string()) << "\n"
      << first;
  EXPECT_TRUE(loaded.diagnostics.empty());
  EXPECT_EQ(*loaded.program, program);
  EXPECT_EQ(save_json(*loaded.program), first);
}

std::string all_diagnostics(const Diagnostics& diagnostics) {
  std::string out;
  for (const auto& d : diagnostics) out += d.to_string() + "\n";
  return out;
}

// ---- Round trips and the canonical form ----

TEST(JsonIoTest, RoundTripsCustomProgramWithEveryField) { expect_round_trip(exchange_program()); }

TEST(JsonIoTest, RoundTripsMultiRankOps) {
  const Program p = test_builders::mrc_allreduce(3);
  expect_round_trip(p);
  const std::string text = save_json(p);
  EXPECT_NE(text.find("{\"op\": \"mrc\", \"count\": 1, \"sources\": [{\"rank\": 0, \"buf\": "
                      "\"input\", \"off\": 0}, "),
            std::string::npos)
      << text;
  // Operand lists are read wherever they appear (whether an op takes them is validation's);
  // their entries are objects of exactly rank, buf and off.
  std::string bad = text;
  bad.replace(bad.find("\"rank\": 0, \"buf\""), 9, "\"rnk\": 0");
  const JsonLoadResult loaded = load_json(bad, "bad.json");
  EXPECT_FALSE(loaded.program.has_value());
  ASSERT_FALSE(loaded.diagnostics.empty());
  EXPECT_NE(loaded.diagnostics[0].location.find("/sources/0"), std::string::npos)
      << loaded.diagnostics[0].to_string();
}

TEST(JsonIoTest, PlacementFieldsAreWrittenOnlyWhereAProgramHasThem) {
  const std::string with = save_json(exchange_program());
  EXPECT_NE(with.find("  \"slot_devices\": 2,\n  \"connections\": [\n"
                      "    {\"sender\": 0, \"receiver\": 1, \"channel\": 1, \"slots\": \"device\", "
                      "\"device\": 1},\n"
                      "    {\"sender\": 1, \"receiver\": 0, \"channel\": 1, \"slots\": \"host\"}\n"
                      "  ],\n  \"ranks\": ["),
            std::string::npos)
      << with;
  Program plain = exchange_program();
  plain.slot_devices = 0;
  plain.placements.clear();
  const std::string without = save_json(plain);
  EXPECT_EQ(without.find("slot_devices"), std::string::npos);
  EXPECT_EQ(without.find("connections"), std::string::npos);
  const JsonLoadResult loaded = load_json(without);
  ASSERT_TRUE(loaded.program) << all_diagnostics(loaded.diagnostics);
  EXPECT_EQ(loaded.program->slot_devices, 0);
  EXPECT_TRUE(loaded.program->placements.empty());
  // A placement of a receiver's slots is written as such and reads back.
  plain.placements = {{0, 1, 1, SlotLocation::kReceiver, 0}};
  expect_round_trip(plain);
}

TEST(JsonIoTest, RoundTripsRingsWithUnboundedMaxBytes) {
  for (int32_t n : {1, 2, 3, 8}) {
    SCOPED_TRACE(n);
    const Program p = ring_allreduce(n);
    ASSERT_FALSE(p.max_bytes.has_value());
    expect_round_trip(p);
    EXPECT_NE(save_json(p).find("\"max_bytes\": null,"), std::string::npos);
  }
}

TEST(JsonIoTest, RoundTripsEdgeValues) {
  Program p = ring_allreduce(2);
  p.name = std::string("quote\" back\\slash tab\t nl\n nul") + '\0' +
           " \x7f caf\xc3\xa9 \xf0\x9f\x98\x80";
  p.max_bytes = UINT64_MAX;
  p.min_bytes = UINT64_MAX;
  p.nchunksperloop = INT32_MAX;
  p.nchannels = 1024;
  p.ranks[0].scratch_chunks = int64_t{1} << 40;
  p.ranks[1].threadblocks.clear();                   // a rank with no threadblocks
  p.ranks[0].threadblocks.push_back(Threadblock{});  // and a threadblock with no ops
  p.ranks[0].threadblocks[0].ops[0].deps = {{INT32_MAX, INT32_MAX}};
  expect_round_trip(p);
}

TEST(JsonIoTest, SavesTheCanonicalFormWithOneOpPerLine) {
  Program p;
  p.name = "tiny";
  p.nranks = 1;
  p.nchunksperloop = 1;
  p.max_bytes = 4096;
  Rank rank;
  rank.input_chunks = 1;
  rank.output_chunks = 1;
  Threadblock tb;
  tb.ops.push_back(make_op(OpCode::kCopy, BufferRef{BufferKind::kInput, 0},
                           BufferRef{BufferKind::kOutput, 0}, 1));
  tb.ops.push_back(make_op(OpCode::kNop, std::nullopt, std::nullopt, 0, {{0, 0}, {1, 2}}));
  rank.threadblocks.push_back(tb);
  p.ranks.push_back(rank);
  p.collective = Collective::kCustom;
  p.postconditions = {{0, 0, {{0, 0}}}};
  EXPECT_EQ(save_json(p), R"({
  "format": "efccl-ef",
  "version": 1,
  "name": "tiny",
  "collective": "custom",
  "protocol": "Simple",
  "nranks": 1,
  "nchunksperloop": 1,
  "nchannels": 1,
  "root": 0,
  "inplace": true,
  "outofplace": true,
  "min_bytes": 0,
  "max_bytes": 4096,
  "ranks": [
    {
      "input_chunks": 1,
      "output_chunks": 1,
      "scratch_chunks": 0,
      "threadblocks": [
        {
          "send": -1,
          "recv": -1,
          "channel": 0,
          "ops": [
            {"op": "copy", "src": {"buf": "input", "off": 0}, "dst": {"buf": "output", "off": 0}, "count": 1},
            {"op": "nop", "count": 0, "deps": [{"tb": 0, "op": 0}, {"tb": 1, "op": 2}]}
          ]
        }
      ]
    }
  ],
  "postconditions": [
    {"rank": 0, "index": 0, "sources": [{"rank": 0, "index": 0}]}
  ]
}
)");
}

TEST(JsonIoTest, SaveReplacesInvalidUtf8SoTheOutputLoads) {
  Program p = ring_allreduce(2);
  p.name = "bad \xff\xc3 end";
  const JsonLoadResult loaded = load_json(save_json(p));
  ASSERT_TRUE(loaded.program) << all_diagnostics(loaded.diagnostics);
  EXPECT_EQ(loaded.program->name, "bad \xef\xbf\xbd\xef\xbf\xbd end");
}

TEST(JsonIoTest, OptionalFieldsTakeTheirDefaultsAndSourceIsRecorded) {
  const char* text = R"({"format": "efccl-ef", "version": 1, "collective": "allgather",
    "protocol": "LL", "nranks": 1, "nchunksperloop": 1,
    "ranks": [{"input_chunks": 1, "output_chunks": 1, "threadblocks": [
      {"send": -1, "recv": -1, "channel": 0, "ops": [{"op": "nop", "count": 0}]}]}]})";
  const JsonLoadResult loaded = load_json(text, "dir/min.json");
  ASSERT_TRUE(loaded.program) << all_diagnostics(loaded.diagnostics);
  const Program& p = *loaded.program;
  EXPECT_EQ(p.name, "");
  EXPECT_EQ(p.collective, Collective::kAllGather);
  EXPECT_EQ(p.protocol, Protocol::kLL);
  EXPECT_EQ(p.nchannels, 1);
  EXPECT_EQ(p.root, 0);
  EXPECT_TRUE(p.inplace);
  EXPECT_TRUE(p.outofplace);
  EXPECT_EQ(p.min_bytes, 0u);
  EXPECT_FALSE(p.max_bytes.has_value());
  EXPECT_TRUE(p.postconditions.empty());
  EXPECT_EQ(p.ranks.at(0).scratch_chunks, 0);
  const Op& op = p.ranks.at(0).threadblocks.at(0).ops.at(0);
  EXPECT_EQ(op.code, OpCode::kNop);
  EXPECT_FALSE(op.src.has_value());
  EXPECT_FALSE(op.dst.has_value());
  EXPECT_TRUE(op.deps.empty());
  EXPECT_FALSE(op.declared_hasdep.has_value());
  EXPECT_EQ(p.source.format, SourceMap::Format::kJson);
  EXPECT_EQ(p.source.file, "dir/min.json");
}

TEST(JsonIoTest, LeavesSemanticRulesToValidation) {
  // nranks != ranks, a nop with src, a buffer range past the end: all structurally fine.
  Program p = ring_allreduce(3);
  p.nranks = 5;
  p.ranks[0].threadblocks[0].ops[0].src->offset = 999;
  p.ranks[0].threadblocks[0].ops.push_back(
      make_op(OpCode::kNop, BufferRef{BufferKind::kInput, 0}, std::nullopt, 7));
  expect_round_trip(p);
}

// ---- Structural errors: one example each, with the exact pointer ----

struct StructuralCase {
  std::string name;
  std::function<void(json&)> mutate;
  std::string location;
  std::string message;  ///< a substring of the expected message
};

json base_document() { return json::parse(save_json(exchange_program())); }

void set(json& doc, const std::string& pointer, json value) {
  doc[json::json_pointer(pointer)] = std::move(value);
}
void erase(json& doc, const std::string& pointer) {
  const json::json_pointer p(pointer);
  doc[p.parent_pointer()].erase(p.back());
}

TEST(JsonIoTest, ReportsEachStructuralErrorAtItsPointer) {
  const std::string op0 = "/ranks/1/threadblocks/0/ops/0";
  const std::string op1 = "/ranks/1/threadblocks/0/ops/1";
  const std::vector<StructuralCase> cases = {
      {"missing top-level", [](json& d) { erase(d, "/nranks"); }, "/nranks",
       "missing required field \"nranks\""},
      {"missing op count", [&](json& d) { erase(d, op1 + "/count"); }, op1 + "/count",
       "missing required field \"count\""},
      {"missing src offset", [&](json& d) { erase(d, op0 + "/src/off"); }, op0 + "/src/off",
       "missing required field \"off\""},
      {"missing sources", [](json& d) { erase(d, "/postconditions/1/sources"); },
       "/postconditions/1/sources", "missing required field \"sources\""},
      {"unknown top-level", [](json& d) { d["nrank"] = 2; }, "/nrank",
       "unknown field \"nrank\"; expected one of: format, version,"},
      {"unknown op field", [&](json& d) { set(d, op1 + "/cnt", 1); }, op1 + "/cnt",
       "unknown field \"cnt\"; expected one of: op, src, dst, count, sources, targets, deps"},
      {"unknown dep field", [&](json& d) { set(d, op1 + "/deps/0/tbid", 0); }, op1 + "/deps/0/tbid",
       "unknown field \"tbid\""},
      {"integer as string", [](json& d) { d["nranks"] = "2"; }, "/nranks",
       "expected an integer from 1 to 4096, found the string \"2\""},
      {"nranks zero", [](json& d) { d["nranks"] = 0; }, "/nranks", "from 1 to 4096, found 0"},
      {"nranks too large", [](json& d) { d["nranks"] = 4097; }, "/nranks", "found 4097"},
      {"nchannels too large", [](json& d) { d["nchannels"] = 1025; }, "/nchannels",
       "from 1 to 1024, found 1025"},
      {"nchunksperloop too large", [](json& d) { d["nchunksperloop"] = int64_t{1} << 31; },
       "/nchunksperloop", "from 1 to 2147483647, found 2147483648"},
      {"root negative", [](json& d) { d["root"] = -1; }, "/root", "from 0 to 4095, found -1"},
      {"offset negative", [&](json& d) { set(d, op0 + "/src/off", -1); }, op0 + "/src/off",
       "from 0 to 1099511627776, found -1"},
      {"offset too large", [&](json& d) { set(d, op0 + "/src/off", (int64_t{1} << 40) + 1); },
       op0 + "/src/off", "found 1099511627777"},
      {"chunks too large", [](json& d) { set(d, "/ranks/0/input_chunks", (int64_t{1} << 40) + 1); },
       "/ranks/0/input_chunks", "found 1099511627777"},
      {"count negative", [&](json& d) { set(d, op1 + "/count", -3); }, op1 + "/count", "found -3"},
      {"send below -1", [](json& d) { set(d, "/ranks/0/threadblocks/0/send", -2); },
       "/ranks/0/threadblocks/0/send", "from -1 to 4095, found -2"},
      {"recv too large", [](json& d) { set(d, "/ranks/0/threadblocks/1/recv", 4096); },
       "/ranks/0/threadblocks/1/recv", "found 4096"},
      {"channel negative", [](json& d) { set(d, "/ranks/0/threadblocks/1/channel", -1); },
       "/ranks/0/threadblocks/1/channel", "from 0 to 1023, found -1"},
      {"dep tb negative", [&](json& d) { set(d, op1 + "/deps/0/tb", -1); }, op1 + "/deps/0/tb",
       "from 0 to 2147483647, found -1"},
      {"dep op too large", [&](json& d) { set(d, op1 + "/deps/0/op", int64_t{1} << 31); },
       op1 + "/deps/0/op", "found 2147483648"},
      {"postcondition rank", [](json& d) { set(d, "/postconditions/0/sources/0/rank", 4096); },
       "/postconditions/0/sources/0/rank", "from 0 to 4095, found 4096"},
      {"float count", [&](json& d) { set(d, op1 + "/count", 1.0); }, op1 + "/count",
       "expected an integer from 0 to 1099511627776, found 1.0 (integers are written without"},
      {"bool as integer", [](json& d) { set(d, "/ranks/1/output_chunks", true); },
       "/ranks/1/output_chunks", "found true"},
      {"unknown collective", [](json& d) { d["collective"] = "allreduc"; }, "/collective",
       "expected one of \"allreduce\", \"allgather\", \"reducescatter\", \"broadcast\", "
       "\"reduce\", \"alltoall\", \"gather\", \"scatter\", \"custom\", found the string "
       "\"allreduc\""},
      {"protocol case", [](json& d) { d["protocol"] = "simple"; }, "/protocol",
       "expected one of \"Simple\", \"LL\", \"LL128\", found the string \"simple\""},
      {"unknown op", [&](json& d) { set(d, op0 + "/op", "sned"); }, op0 + "/op",
       "found the string \"sned\""},
      {"op as number", [&](json& d) { set(d, op0 + "/op", 0); }, op0 + "/op", "found 0"},
      {"unknown buffer", [&](json& d) { set(d, op0 + "/src/buf", "in"); }, op0 + "/src/buf",
       "expected one of \"input\", \"output\", \"scratch\", found the string \"in\""},
      {"wrong format", [](json& d) { d["format"] = "msccl"; }, "/format",
       "expected \"efccl-ef\", found \"msccl\""},
      {"format not a string", [](json& d) { d["format"] = nullptr; }, "/format",
       "expected a string, found null"},
      {"future version", [](json& d) { d["version"] = 2; }, "/version",
       "unsupported format version 2; this loader reads version 1"},
      {"max_bytes string", [](json& d) { d["max_bytes"] = "big"; }, "/max_bytes",
       "expected an integer or null, found the string \"big\""},
      {"min_bytes negative", [](json& d) { d["min_bytes"] = -1; }, "/min_bytes",
       "expected an integer from 0 to 18446744073709551615, found -1"},
      {"min_bytes null", [](json& d) { d["min_bytes"] = nullptr; }, "/min_bytes",
       "expected an integer, found null"},
      {"inplace as number", [](json& d) { d["inplace"] = 1; }, "/inplace",
       "expected true or false, found 1"},
      {"name too long", [](json& d) { d["name"] = std::string(257, 'n'); }, "/name",
       "expected at most 256 bytes, found 257"},
      {"name not a string", [](json& d) { d["name"] = json::array(); }, "/name",
       "expected a string, found an array"},
      {"ranks not an array", [](json& d) { d["ranks"] = json::object(); }, "/ranks",
       "expected an array, found an object"},
      {"rank not an object", [](json& d) { set(d, "/ranks/0", 5); }, "/ranks/0",
       "expected a rank object, found 5"},
      {"threadblock not an object", [](json& d) { set(d, "/ranks/1/threadblocks/1", "tb"); },
       "/ranks/1/threadblocks/1", "expected a threadblock object, found the string \"tb\""},
      {"op not an object", [&](json& d) { set(d, op1, json::array()); }, op1,
       "expected an op object, found an array"},
      {"src not an object",
       [&](json& d) {
         set(d, op0 + "/src", json::array({"input", 0}));
       },
       op0 + "/src", "expected a buffer reference object, found an array"},
      {"deps not an array", [&](json& d) { set(d, op1 + "/deps", json::object()); }, op1 + "/deps",
       "expected an array, found an object"},
      {"dep not an object", [&](json& d) { set(d, op1 + "/deps/0", 0); }, op1 + "/deps/0",
       "expected a dependency object, found 0"},
      {"postconditions not an array", [](json& d) { d["postconditions"] = nullptr; },
       "/postconditions", "expected an array, found null"},
      {"source not an object", [](json& d) { set(d, "/postconditions/1/sources/1", "x"); },
       "/postconditions/1/sources/1", "expected a chunk source object"},
      {"slot_devices negative", [](json& d) { d["slot_devices"] = -1; }, "/slot_devices",
       "from 0 to 2147483647, found -1"},
      {"connections not an array", [](json& d) { d["connections"] = 3; }, "/connections",
       "expected an array, found 3"},
      {"connection not an object", [](json& d) { set(d, "/connections/1", "host"); },
       "/connections/1", "expected a connection object, found the string \"host\""},
      {"unknown slots", [](json& d) { set(d, "/connections/1/slots", "nic"); },
       "/connections/1/slots",
       "expected one of \"receiver\", \"host\", \"device\", found the string \"nic\""},
      {"missing slots", [](json& d) { erase(d, "/connections/0/slots"); }, "/connections/0/slots",
       "missing required field \"slots\""},
      {"device slots without device", [](json& d) { erase(d, "/connections/0/device"); },
       "/connections/0/device", "missing required field \"device\""},
      {"device with host slots", [](json& d) { set(d, "/connections/1/device", 0); },
       "/connections/1/device",
       "\"device\" is allowed only with \"slots\": \"device\" (found \"slots\": \"host\")"},
      {"device negative", [](json& d) { set(d, "/connections/0/device", -1); },
       "/connections/0/device", "from 0 to 2147483647, found -1"},
      {"connection channel too large", [](json& d) { set(d, "/connections/0/channel", 1024); },
       "/connections/0/channel", "from 0 to 1023, found 1024"},
      {"connection sender too large", [](json& d) { set(d, "/connections/0/sender", 4096); },
       "/connections/0/sender", "from 0 to 4095, found 4096"},
      {"unknown connection field", [](json& d) { set(d, "/connections/0/gpu", 1); },
       "/connections/0/gpu",
       "unknown field \"gpu\"; expected one of: sender, receiver, channel, slots, device"},
  };
  for (const StructuralCase& c : cases) {
    SCOPED_TRACE(c.name);
    json doc = base_document();
    c.mutate(doc);
    const JsonLoadResult loaded = load_json(doc.dump(), "case.json");
    EXPECT_FALSE(loaded.program.has_value());
    ASSERT_EQ(loaded.diagnostics.size(), 1u) << all_diagnostics(loaded.diagnostics);
    const Diagnostic& d = loaded.diagnostics[0];
    EXPECT_EQ(d.file, "case.json");
    EXPECT_EQ(d.rule, "schema");
    EXPECT_EQ(d.location, c.location);
    EXPECT_NE(d.message.find(c.message), std::string::npos) << d.message;
  }
}

TEST(JsonIoTest, TopLevelMustBeAnObject) {
  for (const char* text : {"[]", "1", "\"efccl-ef\"", "null"}) {
    SCOPED_TRACE(text);
    const JsonLoadResult loaded = load_json(text);
    EXPECT_FALSE(loaded.program);
    ASSERT_EQ(loaded.diagnostics.size(), 1u);
    EXPECT_EQ(loaded.diagnostics[0].location, "");
    EXPECT_EQ(loaded.diagnostics[0].rule, "schema");
    EXPECT_NE(loaded.diagnostics[0].message.find("expected an EF program object"),
              std::string::npos);
  }
}

TEST(JsonIoTest, CollectsSeveralDiagnosticsAndCapsThem) {
  json doc = base_document();
  doc["nranks"] = 0;
  set(doc, "/ranks/0/threadblocks/0/channel", -5);
  const JsonLoadResult two = load_json(doc.dump());
  ASSERT_EQ(two.diagnostics.size(), 2u) << all_diagnostics(two.diagnostics);
  EXPECT_EQ(two.diagnostics[0].location, "/nranks");
  EXPECT_EQ(two.diagnostics[1].location, "/ranks/0/threadblocks/0/channel");

  json& ops = doc[json::json_pointer("/ranks/0/threadblocks/1/ops")];
  for (int i = 0; i < 1000; ++i) ops.push_back({{"op", "bogus"}, {"count", -1}});
  const JsonLoadResult many = load_json(doc.dump());
  EXPECT_FALSE(many.program);
  EXPECT_EQ(many.diagnostics.size(), 100u);
}

// ---- Numbers the DOM cannot hold as 64-bit integers ----

std::string with_nranks_literal(const std::string& literal) {
  std::string text = save_json(exchange_program());
  const std::string field = "\"nranks\": 2";
  text.replace(text.find(field), field.size(), "\"nranks\": " + literal);
  return text;
}

TEST(JsonIoTest, ReportsNumbersBeyond64BitsWithTheirLiteral) {
  for (const std::string literal :
       {"99999999999999999999999", "18446744073709551616", "-9223372036854775809"}) {
    SCOPED_TRACE(literal);
    const JsonLoadResult loaded = load_json(with_nranks_literal(literal));
    EXPECT_FALSE(loaded.program);
    ASSERT_EQ(loaded.diagnostics.size(), 1u) << all_diagnostics(loaded.diagnostics);
    EXPECT_EQ(loaded.diagnostics[0].location, "/nranks");
    EXPECT_EQ(loaded.diagnostics[0].rule, "schema");
    EXPECT_NE(loaded.diagnostics[0].message.find(literal + " (beyond 64 bits)"), std::string::npos)
        << loaded.diagnostics[0].message;
  }
}

TEST(JsonIoTest, ReportsFloatOverflowAtItsPointer) {
  const JsonLoadResult loaded = load_json(with_nranks_literal("1e400"));
  EXPECT_FALSE(loaded.program);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(loaded.diagnostics[0].location, "/nranks");
  EXPECT_EQ(loaded.diagnostics[0].rule, "schema");
  EXPECT_NE(loaded.diagnostics[0].message.find("1e400"), std::string::npos);

  // Inside an array the pointer names the element.
  std::string text = save_json(exchange_program());
  const std::string field = "\"sources\": [{\"rank\": 1, \"index\": 0}]";
  text.replace(text.find(field), field.size(),
               "\"sources\": [{\"rank\": 1, \"index\": 0}, -1e999]");
  const JsonLoadResult nested = load_json(text);
  ASSERT_EQ(nested.diagnostics.size(), 1u);
  EXPECT_EQ(nested.diagnostics[0].location, "/postconditions/0/sources/1");
}

TEST(JsonIoTest, AcceptsTheLargestUnsignedBytes) {
  json doc = base_document();
  doc["max_bytes"] = UINT64_MAX;
  doc["min_bytes"] = UINT64_MAX;
  const JsonLoadResult loaded = load_json(doc.dump());
  ASSERT_TRUE(loaded.program) << all_diagnostics(loaded.diagnostics);
  EXPECT_EQ(loaded.program->max_bytes, UINT64_MAX);
  EXPECT_EQ(loaded.program->min_bytes, UINT64_MAX);

  set(doc, "/ranks/0/threadblocks/0/ops/0/count", UINT64_MAX);
  const JsonLoadResult too_big = load_json(doc.dump());
  ASSERT_EQ(too_big.diagnostics.size(), 1u);
  EXPECT_EQ(too_big.diagnostics[0].location, "/ranks/0/threadblocks/0/ops/0/count");
  EXPECT_NE(too_big.diagnostics[0].message.find("found 18446744073709551615"), std::string::npos);
}

// ---- Duplicate keys ----

TEST(JsonIoTest, RejectsDuplicateKeysAtTheirObject) {
  std::string text = save_json(exchange_program());
  text.replace(text.find("\"nranks\": 2"), 11, "\"nranks\": 2, \"nranks\": 3");
  const JsonLoadResult top = load_json(text);
  EXPECT_FALSE(top.program);
  ASSERT_EQ(top.diagnostics.size(), 1u) << all_diagnostics(top.diagnostics);
  EXPECT_EQ(top.diagnostics[0].location, "");
  EXPECT_EQ(top.diagnostics[0].rule, "syntax");
  EXPECT_NE(top.diagnostics[0].message.find("duplicate field \"nranks\""), std::string::npos);

  // Second rank, first threadblock, second op: its "count" appears twice.
  text = save_json(exchange_program());
  const std::string op = R"({"op": "recv", "dst": {"buf": "scratch", "off": 0}, "count": 1)";
  const std::size_t second_rank = text.find("\"input_chunks\"", text.find("\"input_chunks\"") + 1);
  const std::size_t at = text.find(op, second_rank) + op.size();
  text.insert(at, ", \"count\": 2");
  const JsonLoadResult nested = load_json(text);
  ASSERT_EQ(nested.diagnostics.size(), 1u) << all_diagnostics(nested.diagnostics);
  EXPECT_EQ(nested.diagnostics[0].location, "/ranks/1/threadblocks/0/ops/1");

  // Keys are escaped in pointers (RFC 6901).
  const JsonLoadResult escaped = load_json(R"({"a/b~": {"x": 1, "x": 2}})");
  ASSERT_FALSE(escaped.diagnostics.empty());
  EXPECT_EQ(escaped.diagnostics[0].location, "/a~1b~0");
  EXPECT_EQ(escaped.diagnostics[0].rule, "syntax");
}

// ---- Syntax errors and hostile input ----

TEST(JsonIoTest, SyntaxErrorsNameTheByteLineAndColumn) {
  const JsonLoadResult loaded = load_json("{\n  \"a\": tru}", "bad.json");
  EXPECT_FALSE(loaded.program);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  const Diagnostic& d = loaded.diagnostics[0];
  EXPECT_EQ(d.rule, "syntax");
  EXPECT_EQ(d.location, "byte 12 (line 2, column 11)");
  EXPECT_NE(d.message.find("invalid literal"), std::string::npos) << d.message;
  EXPECT_EQ(d.message.find("json.exception"), std::string::npos) << d.message;

  const JsonLoadResult trailing = load_json(save_json(exchange_program()) + "x");
  ASSERT_EQ(trailing.diagnostics.size(), 1u);
  EXPECT_EQ(trailing.diagnostics[0].rule, "syntax");
  EXPECT_TRUE(trailing.diagnostics[0].location.starts_with("byte "))
      << trailing.diagnostics[0].location;

  const JsonLoadResult comment = load_json("// comment\n" + save_json(exchange_program()));
  ASSERT_EQ(comment.diagnostics.size(), 1u);
  EXPECT_EQ(comment.diagnostics[0].location, "byte 0 (line 1, column 1)");
}

TEST(JsonIoTest, RejectsEveryTruncationOfAValidDocument) {
  const std::string text = save_json(ring_allreduce(2));
  const std::size_t complete = text.rfind('}') + 1;
  for (std::size_t n = 0; n < complete; ++n) {
    const JsonLoadResult loaded = load_json(text.substr(0, n));
    ASSERT_FALSE(loaded.program) << n;
    ASSERT_EQ(loaded.diagnostics.size(), 1u) << n;
    EXPECT_EQ(loaded.diagnostics[0].rule, "syntax") << n;
    EXPECT_TRUE(loaded.diagnostics[0].location.starts_with("byte ")) << n;
  }
  EXPECT_TRUE(load_json(text.substr(0, complete)).program);
}

TEST(JsonIoTest, SurvivesGarbageAndMutatedDocuments) {
  std::mt19937 random(12345);
  const std::string valid = save_json(exchange_program());
  int loaded_programs = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text;
    if (i % 2 == 0) {
      text.resize(random() % 300);
      for (char& c : text) c = static_cast<char>(random());
    } else {
      text = valid;
      for (int flips = 1 + static_cast<int>(random() % 4); flips > 0; --flips)
        text[random() % text.size()] = static_cast<char>(random());
    }
    const JsonLoadResult loaded = load_json(text);
    if (loaded.program) {
      ++loaded_programs;
      EXPECT_TRUE(loaded.diagnostics.empty());
      const std::string saved = save_json(*loaded.program);
      const JsonLoadResult again = load_json(saved);
      ASSERT_TRUE(again.program) << saved;
      EXPECT_EQ(save_json(*again.program), saved);
    } else {
      ASSERT_FALSE(loaded.diagnostics.empty()) << i;
      EXPECT_LE(loaded.diagnostics.size(), 100u);
    }
  }
  // Some flips (a digit, whitespace) leave a valid document: both paths were taken.
  EXPECT_GT(loaded_programs, 0);
}

TEST(JsonIoTest, RejectsDeepNestingWithoutRecursion) {
  const auto start = std::chrono::steady_clock::now();
  const std::string deep(200000, '[');
  const JsonLoadResult loaded = load_json(deep);
  EXPECT_FALSE(loaded.program);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(loaded.diagnostics[0].rule, "syntax");
  EXPECT_EQ(loaded.diagnostics[0].location, "byte 64 (line 1, column 65)");
  EXPECT_NE(loaded.diagnostics[0].message.find("more than 64 levels"), std::string::npos);

  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  EXPECT_EQ(load_json(objects).diagnostics.at(0).location.substr(0, 8), "byte 320");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  JsonLimits shallow;
  shallow.max_depth = 8;  // an EF program needs 9 (ops' deps entries)
  const JsonLoadResult limited = load_json(save_json(exchange_program()), "f", shallow);
  ASSERT_EQ(limited.diagnostics.size(), 1u);
  EXPECT_NE(limited.diagnostics[0].message.find("more than 8 levels"), std::string::npos);
}

TEST(JsonIoTest, BracketsInsideStringsDoNotCountAsNesting) {
  Program p = ring_allreduce(2);
  p.name = std::string(100, '[') + "\\\"{" + std::string(100, '{');
  expect_round_trip(p);
}

TEST(JsonIoTest, RejectsOversizedDocumentsBeforeParsing) {
  JsonLimits limits;
  limits.max_bytes = 100;
  const JsonLoadResult loaded = load_json(std::string(101, '{'), "big.json", limits);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(loaded.diagnostics[0].rule, "syntax");
  EXPECT_EQ(loaded.diagnostics[0].location, "");
  EXPECT_EQ(loaded.diagnostics[0].message, "the document is 101 bytes; the limit is 100 bytes");
}

TEST(JsonIoTest, TheMemoryBudgetStopsParsingWhereItRunsOut) {
  // 1000 empty objects cost about 100 KB parsed; a 20 KB budget stops among them.
  std::string text = "{\"ranks\": [{}";
  for (int i = 1; i < 1000; ++i) text += ",{}";
  text += "]}";
  JsonLimits limits;
  limits.max_memory_bytes = 20000;
  const JsonLoadResult loaded = load_json(text, "objects.json", limits);
  EXPECT_FALSE(loaded.program);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  const Diagnostic& d = loaded.diagnostics[0];
  EXPECT_EQ(d.rule, "syntax");
  EXPECT_EQ(d.location.rfind("/ranks/", 0), 0u) << d.location;
  const int stopped_at = std::stoi(d.location.substr(7));
  EXPECT_GT(stopped_at, 50);
  EXPECT_LT(stopped_at, 500);
  EXPECT_NE(d.message.find("needs more than 20000 bytes of memory, the loaders' budget"),
            std::string::npos)
      << d.message;

  // A real program fits in the default budget, and in one just large enough for it.
  const std::string program = save_json(exchange_program());
  EXPECT_TRUE(load_json(program).program);
  limits.max_memory_bytes = 40000;
  EXPECT_TRUE(load_json(program, "f", limits).program);
}

TEST(JsonIoTest, HugeStringsGiveShortDiagnostics) {
  const std::string huge(20u << 20, 'x');
  json doc = base_document();
  doc["name"] = huge;
  const JsonLoadResult long_name = load_json(doc.dump());
  ASSERT_EQ(long_name.diagnostics.size(), 1u);
  EXPECT_EQ(long_name.diagnostics[0].location, "/name");
  EXPECT_EQ(long_name.diagnostics[0].message, "expected at most 256 bytes, found 20971520");

  doc = base_document();
  doc[huge] = 1;
  const JsonLoadResult long_key = load_json(doc.dump());
  ASSERT_EQ(long_key.diagnostics.size(), 1u);
  EXPECT_EQ(long_key.diagnostics[0].location, "/" + std::string(64, 'x') + "...");
  EXPECT_LT(long_key.diagnostics[0].message.size(), 400u);

  const JsonLoadResult unterminated = load_json("{\"name\": \"" + huge);
  ASSERT_EQ(unterminated.diagnostics.size(), 1u);
  EXPECT_EQ(unterminated.diagnostics[0].rule, "syntax");
  EXPECT_LT(unterminated.diagnostics[0].message.size(), 400u);
}

TEST(JsonIoTest, NulBytesAreSyntaxErrorsUnlessEscaped) {
  const JsonLoadResult bare = load_json(std::string("{\0}", 3));
  ASSERT_EQ(bare.diagnostics.size(), 1u);
  EXPECT_EQ(bare.diagnostics[0].rule, "syntax");
  EXPECT_EQ(bare.diagnostics[0].location, "byte 1 (line 1, column 2)");

  std::string in_string = save_json(exchange_program());
  in_string.replace(in_string.find("exchange"), 8, std::string("exch\0nge", 8));
  const JsonLoadResult raw = load_json(in_string);
  ASSERT_EQ(raw.diagnostics.size(), 1u);
  EXPECT_EQ(raw.diagnostics[0].rule, "syntax");

  std::string escaped = save_json(exchange_program());
  escaped.replace(escaped.find("exchange"), 8, "exch\\u0000nge");
  const JsonLoadResult ok = load_json(escaped);
  ASSERT_TRUE(ok.program) << all_diagnostics(ok.diagnostics);
  EXPECT_EQ(ok.program->name, std::string("exch\0nge", 8));
}

TEST(JsonIoTest, RejectsInvalidUtf8InStrings) {
  std::string text = save_json(exchange_program());
  text.replace(text.find("exchange"), 8, "exch\xc3(nge");
  const JsonLoadResult loaded = load_json(text);
  ASSERT_EQ(loaded.diagnostics.size(), 1u);
  EXPECT_EQ(loaded.diagnostics[0].rule, "syntax");
}

// ---- The schema file agrees with the loader ----

json read_schema() {
  std::ifstream in(std::string(EFCCL_SOURCE_DIR) + "/docs/ef-format.schema.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return json::parse(buffer.str());
}

std::set<std::string> keys_of(const json& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.insert(key);
  return keys;
}

TEST(JsonIoTest, SchemaListsExactlyTheFieldsTheLoaderAccepts) {
  const json schema = read_schema();
  EXPECT_EQ(schema.at("$schema"), "https://json-schema.org/draft/2020-12/schema");
  // save_json writes every field of every object kind for this program.
  const json saved = base_document();
  const json& op = saved.at(json::json_pointer("/ranks/0/threadblocks/0/ops/1"));
  const std::vector<std::pair<json, json>> objects = {
      {schema, saved},
      {schema.at("$defs").at("rank"), saved.at("ranks").at(0)},
      {schema.at("$defs").at("threadblock"), saved.at("ranks").at(0).at("threadblocks").at(0)},
      {schema.at("$defs").at("op"), saved.at(json::json_pointer("/ranks/0/threadblocks/1/ops/0"))},
      {schema.at("$defs").at("buffer_ref"), op.at("dst")},
      {schema.at("$defs").at("dependency"), op.at("deps").at(0)},
      {schema.at("$defs").at("postcondition"), saved.at("postconditions").at(0)},
      {schema.at("$defs").at("chunk_source"), saved.at("postconditions").at(0).at("sources").at(0)},
      {schema.at("$defs").at("connection"), saved.at("connections").at(0)},
  };
  for (const auto& [definition, instance] : objects) {
    SCOPED_TRACE(definition.dump().substr(0, 80));
    EXPECT_EQ(definition.at("additionalProperties"), false);
    std::set<std::string> keys = keys_of(instance);
    if (&definition == &objects[3].first) keys.insert({"sources", "targets"});  // mrc's, below
    EXPECT_EQ(keys_of(definition.at("properties")), keys);
  }
  // An mrc op: its operand lists and their entries.
  const json mrc_op = json::parse(save_json(test_builders::mrc_allreduce(2)))
                          .at(json::json_pointer("/ranks/0/threadblocks/0/ops/0"));
  EXPECT_EQ(keys_of(mrc_op), (std::set<std::string>{"op", "count", "sources", "targets"}));
  const json& ref = schema.at("$defs").at("rank_buffer_ref");
  EXPECT_EQ(ref.at("additionalProperties"), false);
  EXPECT_EQ(keys_of(ref.at("properties")), keys_of(mrc_op.at("sources").at(0)));
}

TEST(JsonIoTest, SchemaRequiredFieldsAreExactlyTheLoadersRequiredFields) {
  const json schema = read_schema();
  std::set<std::string> required;
  for (const json& name : schema.at("required")) required.insert(name.get<std::string>());
  const json base = base_document();
  for (const auto& [key, value] : base.items()) {
    SCOPED_TRACE(key);
    json doc = base_document();
    doc.erase(key);
    const JsonLoadResult loaded = load_json(doc.dump());
    EXPECT_EQ(!loaded.diagnostics.empty(), required.count(key) == 1)
        << all_diagnostics(loaded.diagnostics);
  }
  // Nested kinds: an op needs op and count only.
  std::set<std::string> op_required;
  for (const json& name : schema.at("$defs").at("op").at("required"))
    op_required.insert(name.get<std::string>());
  EXPECT_EQ(op_required, (std::set<std::string>{"op", "count"}));
  std::set<std::string> rank_required;
  for (const json& name : schema.at("$defs").at("rank").at("required"))
    rank_required.insert(name.get<std::string>());
  EXPECT_EQ(rank_required,
            (std::set<std::string>{"input_chunks", "output_chunks", "threadblocks"}));
}

TEST(JsonIoTest, SchemaIntegerRangesMatchTheLoader) {
  const json schema = read_schema();
  const json& defs = schema.at("$defs");
  // (range in the schema, a field of the base document that uses it)
  const std::vector<std::pair<json, std::string>> ranges = {
      {schema.at("properties").at("nranks"), "/nranks"},
      {schema.at("properties").at("nchunksperloop"), "/nchunksperloop"},
      {schema.at("properties").at("nchannels"), "/nchannels"},
      {defs.at("rank_number"), "/root"},
      {defs.at("chunks"), "/ranks/0/threadblocks/0/ops/0/src/off"},
      {defs.at("peer"), "/ranks/0/threadblocks/0/send"},
      {defs.at("threadblock").at("properties").at("channel"), "/ranks/0/threadblocks/0/channel"},
      {defs.at("index"), "/ranks/0/threadblocks/0/ops/1/deps/0/op"},
  };
  for (const auto& [range, pointer] : ranges) {
    SCOPED_TRACE(pointer);
    const int64_t min = range.at("minimum").get<int64_t>();
    const int64_t max = range.at("maximum").get<int64_t>();
    for (const auto& [value, valid] : std::vector<std::pair<int64_t, bool>>{
             {min, true}, {max, true}, {min - 1, false}, {max + 1, false}}) {
      json doc = base_document();
      set(doc, pointer, value);
      const JsonLoadResult loaded = load_json(doc.dump());
      EXPECT_EQ(loaded.program.has_value(), valid) << value << all_diagnostics(loaded.diagnostics);
    }
  }
}

}  // namespace
}  // namespace efccl::ef
