// EF JSON (docs/ef-format.md §1-4, §6; schema docs/ef-format.schema.json).
//
// Loading runs in three stages so that hostile input stays cheap and nothing throws:
//   1. limits: the size check, then a linear scan that rejects nesting deeper than allowed
//      (so the parser below never sees deep input);
//   2. syntax: nlohmann's SAX parser feeding a DOM builder that also rejects duplicate keys
//      (nlohmann's own DOM parser keeps the last one silently), remembers the literal text
//      of floating-point numbers, so that errors can quote what the file says, and charges
//      every value to a memory budget before it is built (a file of `{}` would otherwise take
//      30 times its size);
//   3. structure: every field's presence, type, range and name, reported at its JSON pointer.
// Semantic rules (buffer ranges, connections, deadlock, ...) are validate()'s job.
//
// Saving is a hand-written emitter: fixed key order, 2-space indentation, one op per line.
#include "efccl/ef/json_io.h"

#include <array>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>

#include "memory_budget.h"

namespace efccl::ef {
namespace {

using Json = nlohmann::json;

// ---- Format constants ----

constexpr std::string_view kFormatName = "efccl-ef";
constexpr int64_t kFormatVersion = 1;
constexpr std::size_t kMaxNameBytes = 256;
constexpr std::size_t kMaxDiagnostics = 100;

/// An inclusive integer range a field must lie in.
struct Range {
  int64_t min;
  int64_t max;
};
constexpr int64_t kMaxRanks = 4096;
constexpr Range kNranksRange{1, kMaxRanks};
constexpr Range kRankRange{0, kMaxRanks - 1};
constexpr Range kPeerRange{-1, kMaxRanks - 1};
constexpr Range kNchannelsRange{1, 1024};
constexpr Range kChannelRange{0, 1023};
constexpr Range kNchunksperloopRange{1, std::numeric_limits<int32_t>::max()};
constexpr Range kChunksRange{0, int64_t{1} << 40};  // chunk counts, offsets, op counts, indices
constexpr Range kIndexRange{0, std::numeric_limits<int32_t>::max()};  // dependency tb / op
// Slot devices and their indices: validation names the limit (64), the loader only the type.
constexpr Range kSlotDeviceRange{0, std::numeric_limits<int32_t>::max()};

// Accepted fields of each object, in the order save_json writes them.
constexpr std::array<std::string_view, 17> kProgramFields = {
    "format",         "version",      "name",        "collective", "protocol",      "nranks",
    "nchunksperloop", "nchannels",    "root",        "inplace",    "outofplace",    "min_bytes",
    "max_bytes",      "slot_devices", "connections", "ranks",      "postconditions"};
constexpr std::array<std::string_view, 4> kRankFields = {"input_chunks", "output_chunks",
                                                         "scratch_chunks", "threadblocks"};
constexpr std::array<std::string_view, 4> kThreadblockFields = {"send", "recv", "channel", "ops"};
constexpr std::array<std::string_view, 7> kOpFields = {"op",      "src",     "dst", "count",
                                                       "sources", "targets", "deps"};
constexpr std::array<std::string_view, 2> kBufferRefFields = {"buf", "off"};
constexpr std::array<std::string_view, 3> kRankBufferRefFields = {"rank", "buf", "off"};
constexpr std::array<std::string_view, 2> kDependencyFields = {"tb", "op"};
constexpr std::array<std::string_view, 3> kPostconditionFields = {"rank", "index", "sources"};
constexpr std::array<std::string_view, 2> kChunkSourceFields = {"rank", "index"};
constexpr std::array<std::string_view, 5> kConnectionFields = {"sender", "receiver", "channel",
                                                               "slots", "device"};

// ---- Text helpers ----

/// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one
/// (overlong forms, surrogates and code points above U+10FFFF are invalid).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < length) return 0;
  if (byte(i + 1) < second_min || byte(i + 1) > second_max) return 0;
  for (std::size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

/// Appends `s` as the inside of a JSON string: quotes, backslashes and control characters are
/// escaped, valid UTF-8 is copied, and each byte that is not valid UTF-8 becomes U+FFFD, so the
/// output is always valid JSON. Prose (parser messages) keeps its quotes and backslashes.
enum class Escaping { kJsonString, kProse };
void append_escaped(std::string& out, std::string_view s,
                    Escaping escaping = Escaping::kJsonString) {
  constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_sequence_length(s, i);
      if (length == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.substr(i, length));
        i += length;
      }
      continue;
    }
    if ((c == '"' || c == '\\') && escaping == Escaping::kProse) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
}

/// `s` cut to at most `max_bytes` (at a UTF-8 boundary, "..." marking the cut) and escaped, for
/// messages: a 20 MB key must not make a 20 MB diagnostic.
std::string printable(std::string_view s, std::size_t max_bytes = 64,
                      Escaping escaping = Escaping::kJsonString) {
  std::string out;
  if (s.size() <= max_bytes) {
    append_escaped(out, s, escaping);
    return out;
  }
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  append_escaped(out, s.substr(0, cut), escaping);
  out += "...";
  return out;
}

std::string in_quotes(std::string_view s) { return "\"" + printable(s) + "\""; }

/// A key as a JSON pointer reference token (RFC 6901: '~' -> "~0", '/' -> "~1").
std::string pointer_token(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

/// "byte N (line L, column C)" for a 0-based byte offset; lines and columns count from 1.
std::string byte_location(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "byte " + std::to_string(offset) + " (line " + std::to_string(line) + ", column " +
         std::to_string(offset - line_start + 1) + ")";
}

// ---- Stage 1: limits ----

/// The size limit, then the depth limit by one linear pass over the text: brackets outside
/// strings open and close levels. Malformed text may confuse the count, but then the parser
/// rejects it anyway; what matters is that the parser never sees nesting beyond the limit.
std::optional<Diagnostic> check_limits(std::string_view text, const std::string& file,
                                       const JsonLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return Diagnostic{file, "", "syntax",
                      "the document is " + std::to_string(text.size()) + " bytes; the limit is " +
                          std::to_string(limits.max_bytes) + " bytes"};
  }
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limits.max_depth) {
        return Diagnostic{file, byte_location(text, i), "syntax",
                          "arrays and objects are nested more than " +
                              std::to_string(limits.max_depth) +
                              " levels deep (an EF program needs 9)"};
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return std::nullopt;
}

// ---- Stage 2: syntax ----

/// What the parsed document costs, estimated from the sizes of nlohmann's types plus the
/// allocator's header of every heap block (docs/ef-format.md §8, "Limits"). A value is charged
/// three slots of its parent array (a vector that grows holds its old storage and the new one,
/// twice as large, at once); an object member is charged its tree node; strings longer than
/// the small-string buffer are charged their bytes.
constexpr std::size_t kHeapBlockHeader = 16;
constexpr std::size_t kTreeNodeHeader = 32;  // std::map's node: color and three links
constexpr std::size_t kSmallStringBytes = 15;

std::size_t heap_block(std::size_t bytes) { return bytes + kHeapBlockHeader; }

std::size_t string_bytes(std::size_t length) {
  return length <= kSmallStringBytes ? 0 : heap_block(length + 1);
}

std::size_t value_cost(const Json& value) {
  std::size_t cost = 3 * sizeof(Json);
  switch (value.type()) {
    case Json::value_t::object:
      return cost + heap_block(sizeof(Json::object_t));
    case Json::value_t::array:
      return cost + heap_block(sizeof(Json::array_t));
    case Json::value_t::string:
      return cost + heap_block(sizeof(Json::string_t)) +
             string_bytes(value.get_ref<const Json::string_t&>().size());
    default:
      return cost;
  }
}

std::size_t member_cost(std::string_view key) {
  return heap_block(kTreeNodeHeader + sizeof(Json::object_t::value_type)) +
         string_bytes(key.size());
}

/// Literal text of floating-point numbers by JSON pointer. Valid EF JSON has none, so the map
/// stays empty for valid input; hostile input is bounded by kMaxRememberedFloats.
using FloatLiterals = std::map<std::string, std::string, std::less<>>;
constexpr std::size_t kMaxRememberedFloats = 2 * kMaxDiagnostics;

/// Builds the document like nlohmann's DOM parser does, but reports duplicate keys and
/// number overflow at their JSON pointers and never throws.
class DomBuilder final : public nlohmann::json_sax<Json> {
 public:
  DomBuilder(std::string_view text, const std::string& file, std::size_t memory_budget,
             Diagnostics& diagnostics)
      : text_(text), file_(file), budget_(memory_budget), diagnostics_(diagnostics) {}

  ~DomBuilder() override { release(root_); }

  Json& root() { return root_; }
  const FloatLiterals& float_literals() const { return float_literals_; }

  bool null() override { return add(Json(nullptr)); }
  bool boolean(bool value) override { return add(Json(value)); }
  bool number_integer(number_integer_t value) override { return add(Json(value)); }
  bool number_unsigned(number_unsigned_t value) override { return add(Json(value)); }
  bool number_float(number_float_t value, const string_t& literal) override {
    if (float_literals_.size() < kMaxRememberedFloats)
      float_literals_.emplace(pointer_of_next_value(), literal);
    return add(Json(value));
  }
  bool string(string_t& value) override { return add(Json(std::move(value))); }
  bool binary(binary_t&) override { return false; }  // JSON text has no binary values
  bool start_object(std::size_t) override { return add(Json::object(), /*opens=*/true); }
  bool start_array(std::size_t) override { return add(Json::array(), /*opens=*/true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& key) override {
    if (!charge(member_cost(key))) return false;
    Level& level = levels_.back();
    if (level.container->contains(key) && diagnostics_.size() < kMaxDiagnostics) {
      diagnostics_.push_back(
          {file_, pointer_of_container(), "syntax",
           "duplicate field " + in_quotes(key) + " (each field may appear once in an object)"});
    }
    level.key = std::move(key);
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& error) override {
    // nlohmann reports number overflow ("1e400") through the same path as syntax errors; it
    // is a value problem at a known place, so it gets a pointer.
    if (dynamic_cast<const nlohmann::detail::out_of_range*>(&error) != nullptr) {
      diagnostics_.push_back({file_, pointer_of_next_value(), "schema",
                              "expected an integer, found " + printable(last_token) +
                                  " (beyond the range of a 64-bit float)"});
      return false;
    }
    // position counts the characters read, the offending one included.
    const std::size_t offset = position > 0 ? position - 1 : 0;
    diagnostics_.push_back({file_, byte_location(text_, offset), "syntax",
                            printable(error_text(error), 200, Escaping::kProse)});
    return false;
  }

 private:
  /// An open array or object, and the key of the member being read (objects only).
  struct Level {
    Json* container;
    std::string key;
  };

  /// Empties `v` from the leaves up. nlohmann's destructor flattens a container into a
  /// vector it allocates, which terminates the process when memory has run out; emptied
  /// containers need no such vector, and the depth check bounds this recursion.
  static void release(Json& v) noexcept {
    if (v.is_array()) {
      auto& array = v.get_ref<Json::array_t&>();
      for (Json& element : array) release(element);
      array.clear();
    } else if (v.is_object()) {
      auto& object = v.get_ref<Json::object_t&>();
      for (auto& member : object) release(member.second);
      object.clear();
    }
  }

  bool add(Json&& value, bool opens = false) {
    if (!charge(value_cost(value))) return false;
    Json* slot = &root_;
    if (levels_.empty()) {
      root_ = std::move(value);
    } else if (Level& level = levels_.back(); level.container->is_array()) {
      level.container->push_back(std::move(value));
      slot = &level.container->back();
    } else {
      slot = &(*level.container)[level.key];  // a duplicate key (reported) keeps the last value
      *slot = std::move(value);
    }
    if (opens) levels_.push_back({slot, {}});
    return true;
  }

  bool close() {
    levels_.pop_back();
    return true;
  }

  /// Adds `bytes` to the document's estimated size; past the budget, reports where loading
  /// stopped and returns false (which ends the parse).
  bool charge(std::size_t bytes) {
    if (budget_.charge(bytes)) return true;
    diagnostics_.push_back(
        {file_, pointer_of_next_value(), "syntax", budget_.exceeded_message("value")});
    return false;
  }

  /// The reference token of the member or element being read inside `level`. The element an
  /// array is reading is its last one, except in the innermost level where it comes next.
  std::string token_of(const Level& level, bool innermost) const {
    if (level.container->is_object()) return pointer_token(level.key);
    const std::size_t size = level.container->size();
    return std::to_string(innermost || size == 0 ? size : size - 1);
  }

  std::string pointer_of_container() const {
    std::string pointer;
    for (std::size_t i = 0; i + 1 < levels_.size(); ++i)
      pointer += "/" + token_of(levels_[i], false);
    return pointer;
  }

  std::string pointer_of_next_value() const {
    if (levels_.empty()) return "";
    return pointer_of_container() + "/" + token_of(levels_.back(), true);
  }

  /// nlohmann's message without its "[json.exception.x.N] parse error at line L, column C: "
  /// prefix (we print our own location).
  static std::string_view error_text(const nlohmann::detail::exception& error) {
    std::string_view text = error.what();
    if (const auto bracket = text.find("] "); bracket != std::string_view::npos)
      text.remove_prefix(bracket + 2);
    if (text.starts_with("parse error")) {
      if (const auto colon = text.find(": "); colon != std::string_view::npos)
        text.remove_prefix(colon + 2);
    }
    return text;
  }

  std::string_view text_;
  const std::string& file_;
  MemoryBudget budget_;
  Diagnostics& diagnostics_;
  Json root_;
  std::vector<Level> levels_;
  FloatLiterals float_literals_;
};

// ---- Stage 3: structure ----

/// Whether a member must be present, and the value an absent optional member stands for.
struct Presence {
  bool required;
  int64_t fallback;
};
constexpr Presence kRequired{true, 0};
constexpr Presence optional_with(int64_t fallback) { return {false, fallback}; }

/// Reads the parsed document into a Program, reporting each structural problem (rule "schema")
/// at the JSON pointer of the offending value.
class StructureReader {
 public:
  StructureReader(const std::string& file, const FloatLiterals& float_literals,
                  Diagnostics& diagnostics)
      : file_(file), float_literals_(float_literals), diagnostics_(diagnostics) {}

  Program read(const Json& doc) {
    Program program;
    if (!object(doc, "", "an EF program object", kProgramFields)) return program;
    if (auto format = string_field(doc, "", "format")) {
      if (*format != kFormatName)
        report("/format", "expected \"efccl-ef\", found " + in_quotes(*format));
    }
    if (const Json* version = required_field(doc, "", "version")) {
      if (auto v =
              integer(*version, "/version",
                      {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
          v && *v != kFormatVersion) {
        report("/version", "unsupported format version " + std::to_string(*v) +
                               "; this loader reads version 1");
      }
    }
    if (doc.contains("name")) {
      if (auto name = string_field(doc, "", "name")) {
        if (name->size() > kMaxNameBytes) {
          report("/name", "expected at most 256 bytes, found " + std::to_string(name->size()));
        } else {
          program.name = *name;
        }
      }
    }
    if (auto c = enum_field<Collective, 9>(doc, "", "collective", parse_collective))
      program.collective = *c;
    if (auto p = enum_field<Protocol, 3>(doc, "", "protocol", parse_protocol))
      program.protocol = *p;
    program.nranks = int32_field(doc, "", "nranks", kNranksRange, kRequired);
    program.nchunksperloop = int_field(doc, "", "nchunksperloop", kNchunksperloopRange, kRequired);
    program.nchannels = int32_field(doc, "", "nchannels", kNchannelsRange, optional_with(1));
    program.root = int32_field(doc, "", "root", kRankRange, optional_with(0));
    program.inplace = bool_field(doc, "", "inplace", true);
    program.outofplace = bool_field(doc, "", "outofplace", true);
    program.min_bytes = unsigned_field(doc, "", "min_bytes").value_or(0);
    if (const auto max_bytes = doc.find("max_bytes");
        max_bytes != doc.end() && !max_bytes->is_null())
      program.max_bytes = unsigned_field(doc, "", "max_bytes");
    program.slot_devices = int32_field(doc, "", "slot_devices", kSlotDeviceRange, optional_with(0));
    if (const Json* connections = array_field(doc, "", "connections", /*required=*/false)) {
      for (std::size_t i = 0; i < connections->size() && !full(); ++i)
        program.placements.push_back(
            read_placement((*connections)[i], "/connections/" + std::to_string(i)));
    }
    if (const Json* ranks = array_field(doc, "", "ranks", /*required=*/true)) {
      program.ranks.reserve(ranks->size());
      for (std::size_t r = 0; r < ranks->size() && !full(); ++r)
        program.ranks.push_back(read_rank((*ranks)[r], "/ranks/" + std::to_string(r)));
    }
    if (const Json* postconditions = array_field(doc, "", "postconditions", /*required=*/false)) {
      for (std::size_t i = 0; i < postconditions->size() && !full(); ++i) {
        program.postconditions.push_back(
            read_postcondition((*postconditions)[i], "/postconditions/" + std::to_string(i)));
      }
    }
    return program;
  }

 private:
  /// {"sender", "receiver", "channel", "slots", "device"}: "device" exactly when slots is
  /// "device" (the other rules, against the program's connections, are validation's).
  ConnectionPlacement read_placement(const Json& v, const std::string& at) {
    ConnectionPlacement c;
    if (!object(v, at, "a connection object", kConnectionFields)) return c;
    c.sender = int32_field(v, at, "sender", kRankRange, kRequired);
    c.receiver = int32_field(v, at, "receiver", kRankRange, kRequired);
    c.channel = int32_field(v, at, "channel", kChannelRange, kRequired);
    const auto slots = enum_field<SlotLocation, 3>(v, at, "slots", parse_slot_location);
    if (!slots) return c;  // whether "device" belongs depends on it
    c.location = *slots;
    const bool has_device = v.contains("device");
    if (c.location == SlotLocation::kDevice) {
      c.device = int32_field(v, at, "device", kSlotDeviceRange, kRequired);
    } else if (has_device) {
      report(at + "/device",
             "\"device\" is allowed only with \"slots\": \"device\" (found \"slots\": " +
                 in_quotes(to_string(c.location)) + ")");
    }
    return c;
  }

  Rank read_rank(const Json& v, const std::string& at) {
    Rank rank;
    if (!object(v, at, "a rank object", kRankFields)) return rank;
    rank.input_chunks = int_field(v, at, "input_chunks", kChunksRange, kRequired);
    rank.output_chunks = int_field(v, at, "output_chunks", kChunksRange, kRequired);
    rank.scratch_chunks = int_field(v, at, "scratch_chunks", kChunksRange, optional_with(0));
    if (const Json* tbs = array_field(v, at, "threadblocks", /*required=*/true)) {
      rank.threadblocks.reserve(tbs->size());
      for (std::size_t t = 0; t < tbs->size() && !full(); ++t) {
        rank.threadblocks.push_back(
            read_threadblock((*tbs)[t], at + "/threadblocks/" + std::to_string(t)));
      }
    }
    return rank;
  }

  Threadblock read_threadblock(const Json& v, const std::string& at) {
    Threadblock tb;
    if (!object(v, at, "a threadblock object", kThreadblockFields)) return tb;
    tb.send_peer = int32_field(v, at, "send", kPeerRange, kRequired);
    tb.recv_peer = int32_field(v, at, "recv", kPeerRange, kRequired);
    tb.channel = int32_field(v, at, "channel", kChannelRange, kRequired);
    if (const Json* ops = array_field(v, at, "ops", /*required=*/true)) {
      tb.ops.reserve(ops->size());
      for (std::size_t i = 0; i < ops->size() && !full(); ++i)
        tb.ops.push_back(read_op((*ops)[i], at + "/ops/" + std::to_string(i)));
    }
    return tb;
  }

  Op read_op(const Json& v, const std::string& at) {
    Op op;
    if (!object(v, at, "an op object", kOpFields)) return op;
    if (auto code = enum_field<OpCode, 10>(v, at, "op", parse_op_code)) op.code = *code;
    if (v.contains("src")) op.src = read_buffer_ref(v["src"], at + "/src");
    if (v.contains("dst")) op.dst = read_buffer_ref(v["dst"], at + "/dst");
    op.count = int_field(v, at, "count", kChunksRange, kRequired);
    if (const Json* deps = array_field(v, at, "deps", /*required=*/false)) {
      op.deps.reserve(deps->size());
      for (std::size_t i = 0; i < deps->size() && !full(); ++i) {
        const std::string dep_at = at + "/deps/" + std::to_string(i);
        const Json& dep = (*deps)[i];
        if (!object(dep, dep_at, "a dependency object", kDependencyFields)) continue;
        op.deps.push_back({int32_field(dep, dep_at, "tb", kIndexRange, kRequired),
                           int32_field(dep, dep_at, "op", kIndexRange, kRequired)});
      }
    }
    read_rank_buffer_refs(v, at, "sources", op.sources);
    read_rank_buffer_refs(v, at, "targets", op.targets);
    return op;
  }

  /// mrc's operand lists: [{"rank", "buf", "off"}, ...] (which ops take them is validation's).
  void read_rank_buffer_refs(const Json& v, const std::string& at, const char* key,
                             std::vector<RankBufferRef>& out) {
    const Json* list = array_field(v, at, key, /*required=*/false);
    if (list == nullptr) return;
    out.reserve(std::min<std::size_t>(list->size(), kMaxMultiOperands + 1));
    for (std::size_t i = 0; i < list->size() && !full(); ++i) {
      const std::string ref_at = at + "/" + key + "/" + std::to_string(i);
      const Json& item = (*list)[i];
      if (!object(item, ref_at, "a rank buffer reference object", kRankBufferRefFields)) continue;
      RankBufferRef ref;
      ref.rank = int32_field(item, ref_at, "rank", kRankRange, kRequired);
      if (auto buffer = enum_field<BufferKind, 3>(item, ref_at, "buf", parse_buffer_kind))
        ref.buffer = *buffer;
      ref.offset = int_field(item, ref_at, "off", kChunksRange, kRequired);
      out.push_back(ref);
    }
  }

  BufferRef read_buffer_ref(const Json& v, const std::string& at) {
    BufferRef ref;
    if (!object(v, at, "a buffer reference object", kBufferRefFields)) return ref;
    if (auto buffer = enum_field<BufferKind, 3>(v, at, "buf", parse_buffer_kind))
      ref.buffer = *buffer;
    ref.offset = int_field(v, at, "off", kChunksRange, kRequired);
    return ref;
  }

  Postcondition read_postcondition(const Json& v, const std::string& at) {
    Postcondition post;
    if (!object(v, at, "a postcondition object", kPostconditionFields)) return post;
    post.rank = int32_field(v, at, "rank", kRankRange, kRequired);
    post.index = int_field(v, at, "index", kChunksRange, kRequired);
    if (const Json* sources = array_field(v, at, "sources", /*required=*/true)) {
      for (std::size_t i = 0; i < sources->size() && !full(); ++i) {
        const std::string source_at = at + "/sources/" + std::to_string(i);
        const Json& source = (*sources)[i];
        if (!object(source, source_at, "a chunk source object", kChunkSourceFields)) continue;
        post.sources.push_back({int32_field(source, source_at, "rank", kRankRange, kRequired),
                                int_field(source, source_at, "index", kChunksRange, kRequired)});
      }
    }
    return post;
  }

  // -- Field access. `at` is the pointer of the object; members are at + "/" + key. Pointers
  // of members are built only when a problem is reported.

  /// Checks that `v` is an object whose fields are all in `known`.
  bool object(const Json& v, const std::string& at, std::string_view what,
              std::span<const std::string_view> known) {
    if (!v.is_object()) {
      report(at, "expected " + std::string(what) + ", found " + describe(v, at));
      return false;
    }
    for (const auto& [key, value] : v.items()) {
      bool is_known = false;
      for (std::string_view k : known) is_known = is_known || k == key;
      if (is_known) continue;
      std::string expected;
      for (std::string_view k : known) expected += (expected.empty() ? "" : ", ") + std::string(k);
      // The pointer names the unknown member itself (shortened: keys can be megabytes).
      report(at + "/" + pointer_token(printable(key)),
             "unknown field " + in_quotes(key) + "; expected one of: " + expected);
    }
    return true;
  }

  const Json* required_field(const Json& obj, const std::string& at, std::string_view key) {
    const auto it = obj.find(key);
    if (it != obj.end()) return &*it;
    report(at + "/" + std::string(key), "missing required field " + in_quotes(key));
    return nullptr;
  }

  /// An integer member. Returns the default (0 for required members) after reporting a
  /// problem, so that reading can go on and find more.
  int64_t int_field(const Json& obj, const std::string& at, std::string_view key, Range range,
                    Presence presence) {
    const auto it = obj.find(key);
    if (it == obj.end()) {
      if (presence.required)
        report(at + "/" + std::string(key), "missing required field " + in_quotes(key));
      return presence.fallback;
    }
    return integer(*it, at + "/" + std::string(key), range).value_or(presence.fallback);
  }

  int32_t int32_field(const Json& obj, const std::string& at, std::string_view key, Range range,
                      Presence presence) {
    // Every int32 field's range lies inside int32_t, so the narrowing is exact.
    return static_cast<int32_t>(int_field(obj, at, key, range, presence));
  }

  /// An optional non-negative 64-bit member (min_bytes, max_bytes); nullopt when absent or bad.
  std::optional<uint64_t> unsigned_field(const Json& obj, const std::string& at,
                                         std::string_view key) {
    const auto it = obj.find(key);
    if (it == obj.end()) return std::nullopt;
    const std::string member_at = at + "/" + std::string(key);
    if (it->is_number_unsigned()) return it->get<uint64_t>();
    if (it->is_number_integer()) {  // only negative values are stored as signed
      report(member_at, "expected an integer from 0 to 18446744073709551615, found " +
                            std::to_string(it->get<int64_t>()));
      return std::nullopt;
    }
    report(member_at, std::string("expected an integer") + (key == "max_bytes" ? " or null" : "") +
                          ", found " + describe(*it, member_at));
    return std::nullopt;
  }

  std::optional<int64_t> integer(const Json& v, const std::string& at, Range range) {
    std::optional<int64_t> value;
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        value = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    }
    if (value && *value >= range.min && *value <= range.max) return value;
    std::string expected = "expected an integer";
    if (range.min != std::numeric_limits<int64_t>::min())
      expected += " from " + std::to_string(range.min) + " to " + std::to_string(range.max);
    report(at, expected + ", found " + describe(v, at));
    return std::nullopt;
  }

  bool bool_field(const Json& obj, const std::string& at, std::string_view key, bool fallback) {
    const auto it = obj.find(key);
    if (it == obj.end()) return fallback;
    if (it->is_boolean()) return it->get<bool>();
    const std::string member_at = at + "/" + std::string(key);
    report(member_at, "expected true or false, found " + describe(*it, member_at));
    return fallback;
  }

  std::optional<std::string> string_field(const Json& obj, const std::string& at,
                                          std::string_view key) {
    const Json* v = required_field(obj, at, key);
    if (v == nullptr) return std::nullopt;
    if (v->is_string()) return v->get<std::string>();
    const std::string member_at = at + "/" + std::string(key);
    report(member_at, "expected a string, found " + describe(*v, member_at));
    return std::nullopt;
  }

  /// A name from a fixed set; E's values are 0 .. N-1 and to_string(E) spells them.
  template <typename E, int N>
  std::optional<E> enum_field(const Json& obj, const std::string& at, std::string_view key,
                              std::optional<E> (*parse)(std::string_view)) {
    const Json* v = required_field(obj, at, key);
    if (v == nullptr) return std::nullopt;
    if (v->is_string()) {
      if (auto e = parse(v->get_ref<const std::string&>())) return e;
    }
    std::string names;
    for (int i = 0; i < N; ++i)
      names += (i == 0 ? "\"" : ", \"") + std::string(to_string(static_cast<E>(i))) + "\"";
    const std::string member_at = at + "/" + std::string(key);
    report(member_at, "expected one of " + names + ", found " + describe(*v, member_at));
    return std::nullopt;
  }

  const Json* array_field(const Json& obj, const std::string& at, std::string_view key,
                          bool required) {
    const auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) report(at + "/" + std::string(key), "missing required field " + in_quotes(key));
      return nullptr;
    }
    if (it->is_array()) return &*it;
    const std::string member_at = at + "/" + std::string(key);
    report(member_at, "expected an array, found " + describe(*it, member_at));
    return nullptr;
  }

  /// What a value is, for "expected X, found Y" messages.
  std::string describe(const Json& v, const std::string& at) const {
    switch (v.type()) {
      case Json::value_t::null:
        return "null";
      case Json::value_t::boolean:
        return v.get<bool>() ? "true" : "false";
      case Json::value_t::string:
        return "the string " + in_quotes(v.get_ref<const std::string&>());
      case Json::value_t::object:
        return "an object";
      case Json::value_t::array:
        return "an array";
      case Json::value_t::number_integer:
        return std::to_string(v.get<int64_t>());
      case Json::value_t::number_unsigned:
        return std::to_string(v.get<uint64_t>());
      case Json::value_t::number_float: {
        const auto it = float_literals_.find(at);
        const std::string literal = it != float_literals_.end() ? printable(it->second) : v.dump();
        if (literal.find_first_of(".eE") == std::string::npos) return literal + " (beyond 64 bits)";
        return literal + " (integers are written without fraction or exponent)";
      }
      default:
        return "a value of an unexpected kind";
    }
  }

  void report(std::string location, std::string message) {
    if (full()) return;
    diagnostics_.push_back({file_, std::move(location), "schema", std::move(message)});
  }

  bool full() const { return diagnostics_.size() >= kMaxDiagnostics; }

  const std::string& file_;
  const FloatLiterals& float_literals_;
  Diagnostics& diagnostics_;
};

// ---- Saving ----

void append_string(std::string& out, std::string_view s) {
  out += '"';
  append_escaped(out, s);
  out += '"';
}

void append_buffer_ref(std::string& out, const BufferRef& ref) {
  out += "{\"buf\": ";
  append_string(out, to_string(ref.buffer));
  out += ", \"off\": " + std::to_string(ref.offset) + "}";
}

/// One op on one line: {"op": ..., "src": ..., "dst": ..., "count": ..., "deps": [...]}.
void append_op(std::string& out, const Op& op) {
  out += "{\"op\": ";
  append_string(out, to_string(op.code));
  if (op.src) {
    out += ", \"src\": ";
    append_buffer_ref(out, *op.src);
  }
  if (op.dst) {
    out += ", \"dst\": ";
    append_buffer_ref(out, *op.dst);
  }
  out += ", \"count\": " + std::to_string(op.count);
  const auto append_refs = [&](const char* key, const std::vector<RankBufferRef>& refs) {
    if (refs.empty()) return;
    out += std::string(", \"") + key + "\": [";
    for (std::size_t i = 0; i < refs.size(); ++i) {
      if (i > 0) out += ", ";
      out += "{\"rank\": " + std::to_string(refs[i].rank) + ", \"buf\": ";
      append_string(out, to_string(refs[i].buffer));
      out += ", \"off\": " + std::to_string(refs[i].offset) + "}";
    }
    out += "]";
  };
  append_refs("sources", op.sources);
  append_refs("targets", op.targets);
  if (!op.deps.empty()) {
    out += ", \"deps\": [";
    for (std::size_t i = 0; i < op.deps.size(); ++i) {
      if (i > 0) out += ", ";
      out += "{\"tb\": " + std::to_string(op.deps[i].tb) +
             ", \"op\": " + std::to_string(op.deps[i].op) + "}";
    }
    out += "]";
  }
  out += "}";
}

void append_postcondition(std::string& out, const Postcondition& post) {
  out += "{\"rank\": " + std::to_string(post.rank) + ", \"index\": " + std::to_string(post.index) +
         ", \"sources\": [";
  for (std::size_t i = 0; i < post.sources.size(); ++i) {
    if (i > 0) out += ", ";
    out += "{\"rank\": " + std::to_string(post.sources[i].rank) +
           ", \"index\": " + std::to_string(post.sources[i].index) + "}";
  }
  out += "]}";
}

void append_threadblock(std::string& out, const Threadblock& tb) {
  out += "        {\n";
  out += "          \"send\": " + std::to_string(tb.send_peer) + ",\n";
  out += "          \"recv\": " + std::to_string(tb.recv_peer) + ",\n";
  out += "          \"channel\": " + std::to_string(tb.channel) + ",\n";
  if (tb.ops.empty()) {
    out += "          \"ops\": []\n";
  } else {
    out += "          \"ops\": [\n";
    for (std::size_t i = 0; i < tb.ops.size(); ++i) {
      out += "            ";
      append_op(out, tb.ops[i]);
      out += i + 1 < tb.ops.size() ? ",\n" : "\n";
    }
    out += "          ]\n";
  }
  out += "        }";
}

void append_rank(std::string& out, const Rank& rank) {
  out += "    {\n";
  out += "      \"input_chunks\": " + std::to_string(rank.input_chunks) + ",\n";
  out += "      \"output_chunks\": " + std::to_string(rank.output_chunks) + ",\n";
  out += "      \"scratch_chunks\": " + std::to_string(rank.scratch_chunks) + ",\n";
  if (rank.threadblocks.empty()) {
    out += "      \"threadblocks\": []\n";
  } else {
    out += "      \"threadblocks\": [\n";
    for (std::size_t t = 0; t < rank.threadblocks.size(); ++t) {
      append_threadblock(out, rank.threadblocks[t]);
      out += t + 1 < rank.threadblocks.size() ? ",\n" : "\n";
    }
    out += "      ]\n";
  }
  out += "    }";
}

}  // namespace

JsonLoadResult load_json(std::string_view text, const std::string& file_name,
                         const JsonLimits& limits) {
  JsonLoadResult result;
  try {
    if (auto problem = check_limits(text, file_name, limits)) {
      result.diagnostics.push_back(std::move(*problem));
      return result;
    }
    DomBuilder builder(text, file_name, limits.max_memory_bytes, result.diagnostics);
    const bool parsed = Json::sax_parse(text, &builder, Json::input_format_t::json,
                                        /*strict=*/true, /*ignore_comments=*/false);
    if (!parsed || !result.diagnostics.empty()) return result;
    Program program = StructureReader(file_name, builder.float_literals(), result.diagnostics)
                          .read(builder.root());
    if (!result.diagnostics.empty()) return result;
    program.source.format = SourceMap::Format::kJson;
    program.source.file = file_name;
    result.program = std::move(program);
  } catch (const std::exception& e) {  // only allocation failure can get here
    result.program.reset();
    result.diagnostics.push_back(
        {file_name, "", "syntax", std::string("cannot load the document: ") + e.what()});
  }
  return result;
}

std::string save_json(const Program& program) {
  std::string out;
  out += "{\n";
  out += "  \"format\": \"efccl-ef\",\n";
  out += "  \"version\": 1,\n";
  out += "  \"name\": ";
  append_string(out, program.name);
  out += ",\n  \"collective\": ";
  append_string(out, to_string(program.collective));
  out += ",\n  \"protocol\": ";
  append_string(out, to_string(program.protocol));
  out += ",\n";
  out += "  \"nranks\": " + std::to_string(program.nranks) + ",\n";
  out += "  \"nchunksperloop\": " + std::to_string(program.nchunksperloop) + ",\n";
  out += "  \"nchannels\": " + std::to_string(program.nchannels) + ",\n";
  out += "  \"root\": " + std::to_string(program.root) + ",\n";
  out += std::string("  \"inplace\": ") + (program.inplace ? "true" : "false") + ",\n";
  out += std::string("  \"outofplace\": ") + (program.outofplace ? "true" : "false") + ",\n";
  out += "  \"min_bytes\": " + std::to_string(program.min_bytes) + ",\n";
  out += "  \"max_bytes\": " +
         (program.max_bytes ? std::to_string(*program.max_bytes) : std::string("null")) + ",\n";
  // Placement fields only where a program has them, so programs without stay as they were.
  if (program.slot_devices != 0)
    out += "  \"slot_devices\": " + std::to_string(program.slot_devices) + ",\n";
  if (!program.placements.empty()) {
    out += "  \"connections\": [\n";
    for (std::size_t i = 0; i < program.placements.size(); ++i) {
      const ConnectionPlacement& c = program.placements[i];
      out += "    {\"sender\": " + std::to_string(c.sender) +
             ", \"receiver\": " + std::to_string(c.receiver) +
             ", \"channel\": " + std::to_string(c.channel) + ", \"slots\": ";
      append_string(out, to_string(c.location));
      if (c.location == SlotLocation::kDevice) out += ", \"device\": " + std::to_string(c.device);
      out += i + 1 < program.placements.size() ? "},\n" : "}\n";
    }
    out += "  ],\n";
  }
  if (program.ranks.empty()) {
    out += "  \"ranks\": [],\n";
  } else {
    out += "  \"ranks\": [\n";
    for (std::size_t r = 0; r < program.ranks.size(); ++r) {
      append_rank(out, program.ranks[r]);
      out += r + 1 < program.ranks.size() ? ",\n" : "\n";
    }
    out += "  ],\n";
  }
  if (program.postconditions.empty()) {
    out += "  \"postconditions\": []\n";
  } else {
    out += "  \"postconditions\": [\n";
    for (std::size_t i = 0; i < program.postconditions.size(); ++i) {
      out += "    ";
      append_postcondition(out, program.postconditions[i]);
      out += i + 1 < program.postconditions.size() ? ",\n" : "\n";
    }
    out += "  ]\n";
  }
  out += "}\n";
  return out;
}

}  // namespace efccl::ef
