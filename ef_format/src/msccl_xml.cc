// MSCCL XML import and export (docs/ef-format.md §9). Import maps every attribute onto the
// Program model and checks what only the file can tell (element structure, ids, attribute
// syntax); the semantic rules of §8 are validate()'s job.
#include "efccl/ef/msccl_xml.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <span>

#include "efccl/ef/datatype.h"
#include "efccl/ef/xml_reader.h"

namespace efccl::ef {
namespace {

constexpr std::size_t kMaxDiagnostics = 100;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxRanks = 4096;
constexpr int64_t kMaxChannels = 1024;
constexpr std::size_t kMaxNameBytes = 256;  ///< as EF JSON (json_io.cc)

constexpr std::array<std::string_view, 14> kAlgoAttributes = {
    "name",     "proto",    "nchannels", "nchunksperloop", "ngpus",         "coll",  "inplace",
    "outofplace", "minBytes", "maxBytes", "maxcount",       "nthreadblocks", "redop", "root"};
constexpr std::array<std::string_view, 4> kGpuAttributes = {"id", "i_chunks", "o_chunks",
                                                            "s_chunks"};
constexpr std::array<std::string_view, 4> kTbAttributes = {"id", "send", "recv", "chan"};
constexpr std::array<std::string_view, 10> kStepAttributes = {
    "s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"};

std::optional<BufferKind> parse_msccl_buffer(std::string_view s) {
  if (s == "i") return BufferKind::kInput;
  if (s == "o") return BufferKind::kOutput;
  if (s == "s") return BufferKind::kScratch;
  return std::nullopt;
}

char to_msccl_buffer(BufferKind b) {
  switch (b) {
    case BufferKind::kInput:
      return 'i';
    case BufferKind::kOutput:
      return 'o';
    case BufferKind::kScratch:
      return 's';
  }
  return 'i';
}

/// Where an element sits in the file, rendered lazily: "algo/gpu[id=3]/tb[id=5]/step[s=2]".
/// Before its id is known an element is named by its position among its siblings ("gpu[#2]").
struct ElementPath {
  std::string_view parent;  ///< the parent's rendered path; empty for the root
  std::string_view name;
  std::string_view id_attribute;  ///< "id" or "s"; empty for the root
  std::size_t position = 0;
  std::optional<int64_t> id;

  std::string render() const {
    std::string out(parent);
    if (!out.empty()) out += '/';
    out += name;
    if (id_attribute.empty()) return out;
    out += '[';
    if (id) {
      out += id_attribute;
      out += '=';
      out += std::to_string(*id);
    } else {
      out += '#';
      out += std::to_string(position);
    }
    out += ']';
    return out;
  }
};

class AttributeReader;

/// A rank's buffer that an in-place call places inside (or onto) its other buffer
/// (docs/ef-format.md §2), with the chunk count §2's table gives it.
struct ContainedBuffer {
  BufferKind kind;
  int64_t chunks;
};

std::optional<ContainedBuffer> contained_buffer(const Program& p, std::size_t rank) {
  const int64_t all = p.nchunksperloop;
  const bool root = static_cast<int64_t>(rank) == p.root;
  const std::optional<int64_t> block =
      all % p.nranks == 0 ? std::optional<int64_t>(all / p.nranks) : std::nullopt;
  switch (p.collective) {
    case Collective::kAllReduce:
    case Collective::kAllToAll:
      return ContainedBuffer{BufferKind::kInput, all};
    case Collective::kBroadcast:
    case Collective::kReduce:
      if (!root) return std::nullopt;
      return ContainedBuffer{BufferKind::kInput, all};
    case Collective::kAllGather:
      if (!block) return std::nullopt;
      return ContainedBuffer{BufferKind::kInput, *block};
    case Collective::kGather:
      if (!root || !block) return std::nullopt;
      return ContainedBuffer{BufferKind::kInput, *block};
    case Collective::kReduceScatter:
      if (!block) return std::nullopt;
      return ContainedBuffer{BufferKind::kOutput, *block};
    case Collective::kScatter:
      if (!root || !block) return std::nullopt;
      return ContainedBuffer{BufferKind::kOutput, *block};
    case Collective::kCustom:
      return std::nullopt;
  }
  return std::nullopt;
}

bool names_buffer(const Rank& rank, BufferKind kind) {
  for (const Threadblock& tb : rank.threadblocks)
    for (const Op& op : tb.ops)
      if ((op.src && op.src->buffer == kind) || (op.dst && op.dst->buffer == kind)) return true;
  return false;
}

/// MSCCL's in-place convention, which msccl-tools writes: in a program only for in-place calls,
/// the buffer an in-place call places inside the other one (allgather's input inside the
/// output, reducescatter's output inside the input, ...) may be declared with 0 chunks, every
/// step naming that region through the containing buffer. MSCCL runs such a file with the
/// aliasing of §2; its bounds check refuses steps that name the 0-chunk buffer. Here the
/// buffer gets §2's count when no step of the rank names it (so that nothing changes but the
/// shape check); a rank whose steps name it keeps 0 chunks, and validation's buffer-range rule
/// reports those steps, as MSCCL would refuse them.
void complete_contained_buffers(Program& program) {
  if (!program.inplace || program.outofplace || program.nranks < 1 || program.nchunksperloop < 1)
    return;
  for (std::size_t r = 0; r < program.ranks.size(); ++r) {
    Rank& rank = program.ranks[r];
    const std::optional<ContainedBuffer> contained = contained_buffer(program, r);
    if (!contained) continue;
    int64_t& chunks =
        contained->kind == BufferKind::kInput ? rank.input_chunks : rank.output_chunks;
    if (chunks == 0 && !names_buffer(rank, contained->kind)) chunks = contained->chunks;
  }
}

/// Builds a Program from a parsed document, collecting diagnostics.
class Importer {
 public:
  Importer(const XmlDocument& doc, const std::string& file) : doc_(doc), file_(file) {}

  std::optional<Program> run();
  Diagnostics take_diagnostics() { return std::move(diagnostics_); }

  void report(const ElementPath& path, int line, std::string_view attribute,
              std::string message) {
    if (diagnostics_.size() >= kMaxDiagnostics) return;
    std::string location = path.render();
    if (!attribute.empty()) {
      location += '@';
      location += attribute;
    }
    location += " (line " + std::to_string(line) + ")";
    diagnostics_.push_back({file_, std::move(location), "schema", std::move(message)});
  }
  bool failed() const { return !diagnostics_.empty(); }

 private:
  /// Reads a <gpu>; sets path.id; fills the lines of its tbs and steps, indexed by tb id.
  std::optional<Rank> read_rank(const XmlElement& gpu, ElementPath& path,
                                std::vector<int>& tb_lines,
                                std::vector<std::vector<int>>& op_lines);
  /// Reads a <tb> whose id has been read already.
  void read_threadblock(const XmlElement& tb, AttributeReader& attributes,
                        const ElementPath& path, Threadblock& threadblock,
                        std::vector<int>& op_lines);
  std::optional<Op> read_step(const XmlElement& step, const ElementPath& path);
  /// Reports every child of `parent` not named `expected`; returns whether all were.
  bool check_children(const XmlElement& parent, const ElementPath& path,
                      std::string_view expected);

  const XmlDocument& doc_;
  const std::string& file_;
  Diagnostics diagnostics_;
};

/// The attributes of one element: looked up by name, parsed strictly, problems reported with
/// the element's path, the attribute and the line.
class AttributeReader {
 public:
  AttributeReader(Importer& importer, const XmlDocument& doc, const XmlElement& element,
                  const ElementPath& path, std::span<const std::string_view> known)
      : importer_(importer), doc_(doc), element_(element), path_(path), known_(known) {
    for (const XmlAttribute& a : doc.attributes(element)) {
      const std::size_t index = index_of(a.name);
      if (index < known.size()) values_[index] = a.value;
    }
  }

  /// Reports the attributes outside `known`; called once the element's id is in the path.
  void report_unknown() {
    for (const XmlAttribute& a : doc_.attributes(element_)) {
      if (index_of(a.name) < known_.size()) continue;
      std::string expected;
      for (std::string_view k : known_) {
        if (!expected.empty()) expected += ' ';
        expected += k;
      }
      report(a.name, "unknown attribute " + std::string(a.name) + " on <" +
                         std::string(element_.name) + ">; expected one of: " + expected);
    }
  }

  std::optional<std::string_view> text(std::string_view name, bool required) {
    const std::optional<std::string_view> value = values_[index_of(name)];
    if (!value && required)
      importer_.report(path_, element_.line, name,
                       "missing attribute " + std::string(name) + " on <" +
                           std::string(element_.name) + ">");
    return value;
  }

  /// A decimal integer in [min, max]: optional '-', digits, nothing else.
  std::optional<int64_t> integer(std::string_view name, int64_t min, int64_t max,
                                 bool required = true) {
    const std::optional<std::string_view> value = text(name, required);
    if (!value) return std::nullopt;
    int64_t parsed = 0;
    const char* end = value->data() + value->size();
    const auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
    if (value->empty() || ec != std::errc() || ptr != end || parsed < min || parsed > max) {
      report(name, "expected an integer in " + std::to_string(min) + " ... " +
                       std::to_string(max) + ", found " + quoted_for_message(*value));
      return std::nullopt;
    }
    return parsed;
  }

  /// A byte count: a decimal integer in 0 ... 2^64-1.
  std::optional<uint64_t> byte_count(std::string_view name) {
    const std::optional<std::string_view> value = text(name, false);
    if (!value) return std::nullopt;
    uint64_t parsed = 0;
    const char* end = value->data() + value->size();
    const auto [ptr, ec] = std::from_chars(value->data(), end, parsed);
    if (value->empty() || value->front() == '-' || ec != std::errc() || ptr != end) {
      report(name, "expected a byte count in 0 ... 18446744073709551615, found " +
                       quoted_for_message(*value));
      return std::nullopt;
    }
    return parsed;
  }

  /// "0" or "1".
  std::optional<bool> flag(std::string_view name, bool required) {
    const std::optional<std::string_view> value = text(name, required);
    if (!value) return std::nullopt;
    if (*value == "0" || *value == "1") return *value == "1";
    report(name, "expected \"0\" or \"1\", found " + quoted_for_message(*value));
    return std::nullopt;
  }

  void report(std::string_view attribute, std::string message) {
    importer_.report(path_, element_.line, attribute, std::move(message));
  }

 private:
  std::size_t index_of(std::string_view name) const {
    return static_cast<std::size_t>(std::find(known_.begin(), known_.end(), name) -
                                    known_.begin());
  }

  Importer& importer_;
  const XmlDocument& doc_;
  const XmlElement& element_;
  const ElementPath& path_;
  std::span<const std::string_view> known_;
  std::array<std::optional<std::string_view>, kAlgoAttributes.size()> values_{};
};

bool Importer::check_children(const XmlElement& parent, const ElementPath& path,
                              std::string_view expected) {
  bool ok = true;
  for (uint32_t index : doc_.children(parent)) {
    const XmlElement& child = doc_.element(index);
    if (child.name == expected) continue;
    ok = false;
    std::string message = "unexpected element <" + std::string(child.name) + "> inside <" +
                          std::string(parent.name) + ">; ";
    message += expected.empty() ? "it has no children"
                                : "expected <" + std::string(expected) + ">";
    report(path, child.line, {}, std::move(message));
  }
  return ok;
}

std::optional<Program> Importer::run() {
  const XmlElement& algo = doc_.root();
  const ElementPath algo_path{{}, algo.name, {}, 0, std::nullopt};
  if (algo.name != "algo") {
    report(algo_path, algo.line, {},
           "expected the root element <algo>, found <" + std::string(algo.name) + ">");
    return std::nullopt;
  }
  Program program;
  AttributeReader attributes(*this, doc_, algo, algo_path, kAlgoAttributes);
  attributes.report_unknown();
  // EF JSON's limit (docs/ef-format.md §1): an imported name must survive export to JSON.
  if (const auto name = attributes.text("name", false); name && name->size() > kMaxNameBytes) {
    attributes.report("name", "expected at most " + std::to_string(kMaxNameBytes) +
                                  " bytes, found " + std::to_string(name->size()));
  } else {
    program.name = std::string(name.value_or(""));
  }
  if (const auto proto = attributes.text("proto", true)) {
    if (const auto parsed = parse_protocol(*proto)) {
      program.protocol = *parsed;
    } else {
      attributes.report("proto", "unknown protocol " + quoted_for_message(*proto) +
                                     "; expected Simple, LL or LL128");
    }
  }
  if (const auto coll = attributes.text("coll", true)) {
    // "reduce_scatter": msccl-tools' and the original MSCCL runtime's spelling.
    if (const auto parsed = parse_collective(*coll == "reduce_scatter" ? "reducescatter" : *coll)) {
      program.collective = *parsed;
    } else {
      attributes.report("coll", "unknown collective " + quoted_for_message(*coll) +
                                    "; expected allreduce, allgather, reducescatter (or "
                                    "reduce_scatter), alltoall, broadcast, reduce, gather, "
                                    "scatter or custom");
    }
  }
  program.nchannels =
      static_cast<int32_t>(attributes.integer("nchannels", 1, kMaxChannels).value_or(1));
  program.nchunksperloop = attributes.integer("nchunksperloop", 1, kInt32Max).value_or(1);
  const std::optional<int64_t> ngpus = attributes.integer("ngpus", 1, kMaxRanks);
  const std::optional<bool> inplace = attributes.flag("inplace", true);
  program.inplace = inplace.value_or(true);
  // Without `outofplace` (msccl-tools never writes it) the program is for the one mode
  // `inplace` names, as in the original MSCCL runtime, which reads only `inplace` and selects
  // a program for calls whose mode equals it (microsoft/msccl src/graph/tuning.cc).
  program.outofplace = attributes.text("outofplace", false)
                           ? attributes.flag("outofplace", true).value_or(true)
                           : !inplace.value_or(false);
  program.root = static_cast<int32_t>(
      attributes.integer("root", kInt32Min, kInt32Max, false).value_or(0));
  program.min_bytes = attributes.byte_count("minBytes").value_or(0);
  const std::optional<uint64_t> max_bytes = attributes.byte_count("maxBytes");
  // RCCL's convention: maxBytes="0" above a nonzero minBytes means "no upper bound".
  if (max_bytes && !(*max_bytes == 0 && program.min_bytes > 0)) program.max_bytes = max_bytes;
  attributes.integer("maxcount", 0, kInt64Max, false);  // a sizing hint; nothing to store
  const std::optional<int64_t> nthreadblocks =
      attributes.integer("nthreadblocks", 0, kInt32Max, false);
  if (const auto redop = attributes.text("redop", false); redop && !parse_red_op(*redop))
    attributes.report("redop", "unknown reduction " + quoted_for_message(*redop) +
                                   "; expected sum, prod, max, min, avg or premulsum");
  if (!check_children(algo, algo_path, "gpu")) return std::nullopt;

  // Ranks are placed by gpu id; without a valid ngpus they are still read for diagnostics.
  const auto nranks = static_cast<std::size_t>(ngpus.value_or(0));
  program.nranks = static_cast<int32_t>(nranks);
  program.ranks.resize(nranks);
  SourceMap& source = program.source;
  source.format = SourceMap::Format::kMscclXml;
  source.file = file_;
  source.rank_lines.assign(nranks, 0);
  source.tb_lines.resize(nranks);
  source.op_lines.resize(nranks);
  const std::string root_path = algo_path.render();
  const auto gpus = doc_.children(algo);
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    const XmlElement& gpu = doc_.element(gpus[k]);
    ElementPath path{root_path, gpu.name, "id", k, std::nullopt};
    std::vector<int> tb_lines;
    std::vector<std::vector<int>> op_lines;
    std::optional<Rank> rank = read_rank(gpu, path, tb_lines, op_lines);
    if (!rank || !path.id || !ngpus) continue;
    const auto id = static_cast<std::size_t>(*path.id);
    if (id >= nranks) {
      report(path, gpu.line, "id",
             "gpu id " + std::to_string(id) + " is outside 0 ... " +
                 std::to_string(nranks - 1) + " (ngpus=" + std::to_string(nranks) + ")");
    } else if (source.rank_lines[id] != 0) {
      report(path, gpu.line, "id",
             "duplicate gpu id " + std::to_string(id) + " (first on line " +
                 std::to_string(source.rank_lines[id]) + ")");
    } else {
      program.ranks[id] = std::move(*rank);
      source.rank_lines[id] = gpu.line;
      source.tb_lines[id] = std::move(tb_lines);
      source.op_lines[id] = std::move(op_lines);
    }
  }
  const auto missing = std::count(source.rank_lines.begin(), source.rank_lines.end(), 0);
  if (missing > 0 && !failed()) {
    const auto first = std::find(source.rank_lines.begin(), source.rank_lines.end(), 0) -
                       source.rank_lines.begin();
    attributes.report("ngpus", "ngpus=" + std::to_string(nranks) +
                                   " but there is no <gpu> with id " + std::to_string(first) +
                                   " (" + std::to_string(missing) + " of ids 0 ... " +
                                   std::to_string(nranks - 1) + " missing)");
  }
  if (nthreadblocks) {
    for (std::size_t r = 0; r < program.ranks.size(); ++r) {
      const std::size_t count = program.ranks[r].threadblocks.size();
      if (count > static_cast<std::size_t>(*nthreadblocks)) {
        attributes.report("nthreadblocks",
                          "nthreadblocks=" + std::to_string(*nthreadblocks) + " but gpu id " +
                              std::to_string(r) + " has " + std::to_string(count) + " <tb>");
        break;
      }
    }
  }
  if (failed()) return std::nullopt;
  complete_contained_buffers(program);
  return program;
}

std::optional<Rank> Importer::read_rank(const XmlElement& gpu, ElementPath& path,
                                        std::vector<int>& tb_lines,
                                        std::vector<std::vector<int>>& op_lines) {
  AttributeReader attributes(*this, doc_, gpu, path, kGpuAttributes);
  path.id = attributes.integer("id", 0, kInt32Max);
  attributes.report_unknown();
  Rank rank;
  rank.input_chunks = attributes.integer("i_chunks", 0, kInt64Max).value_or(0);
  rank.output_chunks = attributes.integer("o_chunks", 0, kInt64Max).value_or(0);
  rank.scratch_chunks = attributes.integer("s_chunks", 0, kInt64Max).value_or(0);
  if (!check_children(gpu, path, "tb")) return std::nullopt;

  const std::string gpu_path = path.render();
  const auto tbs = doc_.children(gpu);
  rank.threadblocks.resize(tbs.size());
  tb_lines.assign(tbs.size(), 0);
  op_lines.resize(tbs.size());
  for (std::size_t k = 0; k < tbs.size(); ++k) {
    const XmlElement& tb = doc_.element(tbs[k]);
    ElementPath tb_path{gpu_path, tb.name, "id", k, std::nullopt};
    AttributeReader tb_attributes(*this, doc_, tb, tb_path, kTbAttributes);
    tb_path.id = tb_attributes.integer("id", 0, kInt32Max);
    tb_attributes.report_unknown();
    if (!tb_path.id) continue;
    const auto id = static_cast<std::size_t>(*tb_path.id);
    if (id >= tbs.size()) {
      tb_attributes.report("id", "tb id " + std::to_string(id) + " is outside 0 ... " +
                                     std::to_string(tbs.size() - 1) + ": the " +
                                     std::to_string(tbs.size()) +
                                     " <tb> of a <gpu> are numbered from 0");
      continue;
    }
    if (tb_lines[id] != 0) {
      tb_attributes.report("id", "duplicate tb id " + std::to_string(id) + " (first on line " +
                                     std::to_string(tb_lines[id]) + ")");
      continue;
    }
    tb_lines[id] = tb.line;
    read_threadblock(tb, tb_attributes, tb_path, rank.threadblocks[id], op_lines[id]);
  }
  if (failed()) return std::nullopt;
  return rank;
}

void Importer::read_threadblock(const XmlElement& tb, AttributeReader& attributes,
                                const ElementPath& path, Threadblock& threadblock,
                                std::vector<int>& op_lines) {
  threadblock.send_peer =
      static_cast<int32_t>(attributes.integer("send", kInt32Min, kInt32Max).value_or(-1));
  threadblock.recv_peer =
      static_cast<int32_t>(attributes.integer("recv", kInt32Min, kInt32Max).value_or(-1));
  threadblock.channel =
      static_cast<int32_t>(attributes.integer("chan", kInt32Min, kInt32Max).value_or(0));
  if (!check_children(tb, path, "step")) return;
  const std::string rendered = path.render();
  const auto steps = doc_.children(tb);
  threadblock.ops.reserve(steps.size());
  op_lines.reserve(steps.size());
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const XmlElement& step = doc_.element(steps[s]);
    std::optional<Op> op = read_step(step, ElementPath{rendered, step.name, "s", s, std::nullopt});
    if (!op) continue;
    threadblock.ops.push_back(std::move(*op));
    op_lines.push_back(step.line);
  }
}

std::optional<Op> Importer::read_step(const XmlElement& step, const ElementPath& given_path) {
  ElementPath path = given_path;
  AttributeReader attributes(*this, doc_, step, path, kStepAttributes);
  path.id = attributes.integer("s", 0, kInt32Max);
  attributes.report_unknown();
  check_children(step, path, {});
  if (path.id && static_cast<std::size_t>(*path.id) != path.position)
    attributes.report("s", "step s=" + std::to_string(*path.id) + " is at position " +
                               std::to_string(path.position) +
                               " of its <tb>; steps must be numbered 0, 1, 2, ... in order");

  Op op;
  const std::optional<std::string_view> type = attributes.text("type", true);
  if (!type) return std::nullopt;
  const std::optional<OpCode> code = parse_msccl_op_code(*type);
  if (!code) {
    attributes.report("type", "unknown step type " + quoted_for_message(*type) +
                                  "; expected s, r, cpy, re, rcs, rrc, rrs, rrcs or nop");
    return std::nullopt;
  }
  op.code = *code;
  // Operands the type does not use (§4's table) are not stored, but must still be well-formed
  // when present: a buffer name, and an offset of -1 (MSCCL's "none") or more.
  const auto check_unused_ref = [&](std::string_view buf_name, std::string_view off_name) {
    if (const auto buf = attributes.text(buf_name, false); buf && !parse_msccl_buffer(*buf))
      attributes.report(buf_name, "unknown buffer " + quoted_for_message(*buf) +
                                      "; expected i, o or s (also where the step type does "
                                      "not use it)");
    attributes.integer(off_name, -1, kInt64Max, false);
  };
  const auto read_ref = [&](std::string_view buf_name,
                            std::string_view off_name) -> std::optional<BufferRef> {
    const std::optional<std::string_view> buf = attributes.text(buf_name, true);
    const std::optional<int64_t> off = attributes.integer(off_name, 0, kInt64Max);
    if (!buf || !off) return std::nullopt;
    const std::optional<BufferKind> kind = parse_msccl_buffer(*buf);
    if (!kind) {
      attributes.report(buf_name, "unknown buffer " + quoted_for_message(*buf) +
                                      "; expected i, o or s");
      return std::nullopt;
    }
    return BufferRef{*kind, *off};
  };
  if (op_reads_src(op.code)) {
    op.src = read_ref("srcbuf", "srcoff");
  } else {
    check_unused_ref("srcbuf", "srcoff");
  }
  if (op_writes_dst(op.code)) {
    op.dst = read_ref("dstbuf", "dstoff");
  } else {
    check_unused_ref("dstbuf", "dstoff");
  }
  op.count = attributes.integer("cnt", 0, kInt64Max).value_or(0);

  const std::optional<int64_t> depid = attributes.integer("depid", -1, kInt32Max, false);
  const std::optional<int64_t> deps = attributes.integer("deps", -1, kInt32Max, false);
  const bool has_depid = attributes.text("depid", false).has_value();
  const bool has_deps = attributes.text("deps", false).has_value();
  if ((has_depid && !depid) || (has_deps && !deps)) return std::nullopt;
  const int64_t tb = depid.value_or(-1);
  const int64_t index = deps.value_or(-1);
  if (tb >= 0 && index >= 0) {
    op.deps.push_back(Dependency{static_cast<int32_t>(tb), static_cast<int32_t>(index)});
  } else if (tb != index) {
    attributes.report(has_deps ? "deps" : "depid",
                      "depid=" + std::to_string(tb) + " and deps=" + std::to_string(index) +
                          ": a dependency needs both >= 0, no dependency needs both -1");
  }
  op.declared_hasdep = attributes.flag("hasdep", false);
  if (failed()) return std::nullopt;
  return op;
}

// ---- Export ----

/// Appends `value` in decimal.
void append_integer(std::string& out, int64_t value) {
  char buffer[24];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

void append_attribute(std::string& out, std::string_view name, int64_t value) {
  out += ' ';
  out += name;
  out += "=\"";
  append_integer(out, value);
  out += '"';
}

void append_attribute(std::string& out, std::string_view name, std::string_view value) {
  out += ' ';
  out += name;
  out += "=\"";
  out += value;
  out += '"';
}

/// `text` as an attribute value: markup characters as entities, tab/LF/CR as character
/// references (literal ones would be normalized to spaces on import). Other control characters
/// cannot appear in XML 1.0.
StatusOr<std::string> escape_attribute(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\t': out += "&#9;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          return Status::error("MSCCL XML cannot carry the control character " +
                               quoted_for_message(std::string_view(&c, 1)) + " in " +
                               quoted_for_message(text));
        out += c;
    }
  }
  return out;
}

std::string op_name(std::size_t rank, std::size_t tb, std::size_t op) {
  return "rank " + std::to_string(rank) + " tb " + std::to_string(tb) + " op " +
         std::to_string(op);
}

/// What export cannot write faithfully: the parts MSCCL XML has no form for, and dependency
/// targets that do not exist (their indices would change meaning once nops are inserted).
Status check_exportable(const Program& program) {
  if (!program.placements.empty() || program.slot_devices != 0)
    return Status::error(
        "the program places connections' slots (" + std::to_string(program.placements.size()) +
        " placements, " + std::to_string(program.slot_devices) +
        " slot devices); MSCCL XML cannot carry connection placement, so the XML would run "
        "every connection with its slots at the receiver");
  if (program.collective == Collective::kCustom)
    return Status::error("custom collectives cannot be written as MSCCL XML: it has no form "
                         "for postconditions");
  if (program.nranks < 0 || static_cast<std::size_t>(program.nranks) != program.ranks.size())
    return Status::error("nranks is " + std::to_string(program.nranks) + " but the program has " +
                         std::to_string(program.ranks.size()) + " ranks");
  if (program.max_bytes && *program.max_bytes == 0 && program.min_bytes > 0)
    return Status::error("max_bytes 0 with min_bytes > 0 reads back as unbounded in MSCCL XML");
  for (std::size_t r = 0; r < program.ranks.size(); ++r) {
    const auto& tbs = program.ranks[r].threadblocks;
    for (std::size_t t = 0; t < tbs.size(); ++t) {
      for (std::size_t i = 0; i < tbs[t].ops.size(); ++i) {
        const Op& op = tbs[t].ops[i];
        if (op.code == OpCode::kMultiReduceCopy || !op.sources.empty() || !op.targets.empty())
          return Status::error(op_name(r, t, i) +
                               " is a multi-rank op (mrc); MSCCL XML has no form for it");
        if (op.src.has_value() != op_reads_src(op.code) ||
            op.dst.has_value() != op_writes_dst(op.code))
          return Status::error(op_name(r, t, i) + " (" + std::string(to_string(op.code)) +
                               ") has src/dst operands its type does not take or lacks ones it "
                               "needs; MSCCL XML cannot carry that");
        for (const Dependency& d : op.deps) {
          if (d.tb < 0 || static_cast<std::size_t>(d.tb) >= tbs.size() || d.op < 0 ||
              static_cast<std::size_t>(d.op) >= tbs[static_cast<std::size_t>(d.tb)].ops.size())
            return Status::error(op_name(r, t, i) + " depends on tb " + std::to_string(d.tb) +
                                 " op " + std::to_string(d.op) + ", which does not exist");
        }
      }
    }
  }
  return Status::ok();
}

void append_step(std::string& out, std::size_t s, const Op& op, const Dependency* dep,
                 bool hasdep) {
  out += "      <step";
  append_attribute(out, "s", static_cast<int64_t>(s));
  append_attribute(out, "type", to_msccl_string(op.code));
  // Unused operands are written as MSCCL writes a nop's: srcbuf="i" srcoff="-1", dstbuf="o"...
  const char src_buf = op.src ? to_msccl_buffer(op.src->buffer) : 'i';
  const char dst_buf = op.dst ? to_msccl_buffer(op.dst->buffer) : 'o';
  append_attribute(out, "srcbuf", std::string_view(&src_buf, 1));
  append_attribute(out, "srcoff", op.src ? op.src->offset : -1);
  append_attribute(out, "dstbuf", std::string_view(&dst_buf, 1));
  append_attribute(out, "dstoff", op.dst ? op.dst->offset : -1);
  append_attribute(out, "cnt", op.count);
  append_attribute(out, "depid", dep ? dep->tb : -1);
  append_attribute(out, "deps", dep ? dep->op : -1);
  append_attribute(out, "hasdep", hasdep ? 1 : 0);
  out += "/>\n";
}

void append_rank(std::string& out, std::size_t r, const Rank& rank) {
  const auto& tbs = rank.threadblocks;
  // Each op moves down by the nops inserted before it (one per dependency beyond the first);
  // has_dependents[t][i]: some op of this rank waits for op i of tb t (MSCCL's hasdep).
  std::vector<std::vector<int32_t>> step_of(tbs.size());
  std::vector<std::vector<bool>> has_dependents(tbs.size());
  for (std::size_t t = 0; t < tbs.size(); ++t) {
    int32_t step = 0;
    for (const Op& op : tbs[t].ops) {
      step += static_cast<int32_t>(std::max<std::size_t>(op.deps.size(), 1) - 1);
      step_of[t].push_back(step++);
    }
    has_dependents[t].assign(tbs[t].ops.size(), false);
  }
  for (const Threadblock& tb : tbs)
    for (const Op& op : tb.ops)
      for (const Dependency& d : op.deps)
        has_dependents[static_cast<std::size_t>(d.tb)][static_cast<std::size_t>(d.op)] = true;

  out += "  <gpu";
  append_attribute(out, "id", static_cast<int64_t>(r));
  append_attribute(out, "i_chunks", rank.input_chunks);
  append_attribute(out, "o_chunks", rank.output_chunks);
  append_attribute(out, "s_chunks", rank.scratch_chunks);
  out += ">\n";
  for (std::size_t t = 0; t < tbs.size(); ++t) {
    out += "    <tb";
    append_attribute(out, "id", static_cast<int64_t>(t));
    append_attribute(out, "send", tbs[t].send_peer);
    append_attribute(out, "recv", tbs[t].recv_peer);
    append_attribute(out, "chan", tbs[t].channel);
    out += ">\n";
    std::size_t s = 0;
    for (std::size_t i = 0; i < tbs[t].ops.size(); ++i) {
      const Op& op = tbs[t].ops[i];
      std::vector<Dependency> deps = op.deps;
      for (Dependency& d : deps)
        d.op = step_of[static_cast<std::size_t>(d.tb)][static_cast<std::size_t>(d.op)];
      Op nop;  // kNop, count 0, no operands
      nop.count = 0;
      for (std::size_t k = 0; k + 1 < deps.size(); ++k) append_step(out, s++, nop, &deps[k], false);
      append_step(out, s++, op, deps.empty() ? nullptr : &deps.back(), has_dependents[t][i]);
    }
    out += "    </tb>\n";
  }
  out += "  </gpu>\n";
}

}  // namespace

XmlLoadResult load_msccl_xml(std::string_view text, const std::string& file_name,
                             const XmlLimits& limits) {
  XmlLoadResult result;
  try {
    XmlParseResult parsed = parse_xml(text, limits);
    if (!parsed.document) {
      result.diagnostics.push_back({file_name,
                                    "byte " + std::to_string(parsed.error.offset) + " (line " +
                                        std::to_string(parsed.error.line) + ")",
                                    "syntax", std::move(parsed.error.message)});
      return result;
    }
    Importer importer(*parsed.document, file_name);
    result.program = importer.run();
    result.diagnostics = importer.take_diagnostics();
  } catch (const std::exception& e) {  // only allocation failure can get here
    result.program.reset();
    result.diagnostics.push_back(
        {file_name, "", "syntax", std::string("cannot load the document: ") + e.what()});
  }
  return result;
}

StatusOr<std::string> save_msccl_xml(const Program& program) {
  if (Status status = check_exportable(program); !status) return status;
  StatusOr<std::string> name = escape_attribute(program.name);
  if (!name) return name.status();

  std::size_t nops = 0;
  for (const Rank& rank : program.ranks)
    for (const Threadblock& tb : rank.threadblocks) nops += tb.ops.size();
  constexpr std::size_t kBytesPerStep = 140;
  std::string out;
  out.reserve(256 + nops * kBytesPerStep);
  out += "<algo";
  append_attribute(out, "name", *name);
  append_attribute(out, "proto", to_string(program.protocol));
  append_attribute(out, "nchannels", program.nchannels);
  append_attribute(out, "nchunksperloop", program.nchunksperloop);
  append_attribute(out, "ngpus", program.nranks);
  append_attribute(out, "coll", to_string(program.collective));
  // efccl's extension: MSCCL files have no root; written only when it is not the default 0.
  if (program.root != 0) append_attribute(out, "root", program.root);
  append_attribute(out, "inplace", program.inplace ? 1 : 0);
  append_attribute(out, "outofplace", program.outofplace ? 1 : 0);
  append_attribute(out, "minBytes", std::to_string(program.min_bytes));
  // Unbounded: RCCL's maxBytes="0" above a nonzero minBytes, else no maxBytes at all.
  if (program.max_bytes) {
    append_attribute(out, "maxBytes", std::to_string(*program.max_bytes));
  } else if (program.min_bytes > 0) {
    append_attribute(out, "maxBytes", int64_t{0});
  }
  out += ">\n";
  for (std::size_t r = 0; r < program.ranks.size(); ++r) append_rank(out, r, program.ranks[r]);
  out += "</algo>\n";
  return out;
}

}  // namespace efccl::ef
