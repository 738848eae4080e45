// Static validation of a Program (docs/ef-format.md §8). Every rule except `syntax` and
// `schema`, which the loaders own. The program may be arbitrary: every index is checked
// before use, arithmetic on counts and offsets cannot overflow, and the graph algorithms are
// iterative. Rules that need an earlier rule's guarantees (deadlock needs well-formed
// connections, capacity needs a deadlock-free graph) are skipped when that rule failed.
#include "efccl/ef/validate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "inplace_shift.h"
#include "wait_for_graph.h"

namespace efccl::ef {
namespace {

using detail::ConnectionEnds;
using detail::WaitForGraph;

constexpr int32_t kMaxRanks = 4096;
constexpr int32_t kMaxChannels = 1024;
/// Cycle members and blocked threadblocks listed in one message; the rest are counted.
constexpr std::size_t kMaxListedItems = 12;
/// Threadblock visits the capacity simulation may spend before giving up (about a second).
constexpr uint64_t kCapacityVisitBudget = uint64_t{1} << 27;
/// Sweeps remembered for detecting a periodic streaming regime (see CapacitySimulation).
constexpr std::size_t kMaxPeriod = 4;

bool is_known(OpCode code) {
  return static_cast<int>(code) <= static_cast<int>(OpCode::kMultiReduceCopy);
}
bool is_known(BufferKind b) { return static_cast<int>(b) <= static_cast<int>(BufferKind::kScratch); }
bool is_known(Collective c) { return static_cast<int>(c) <= static_cast<int>(Collective::kCustom); }

std::string op_name(OpCode code) {
  return is_known(code) ? std::string(to_string(code))
                        : "unknown op code " + std::to_string(static_cast<int>(code));
}

/// "1st", "2nd", "3rd", "4th", "11th", "22nd", ...
std::string ordinal(std::size_t k) {
  const char* suffix = "th";
  if (k % 100 < 11 || k % 100 > 13) {
    if (k % 10 == 1) suffix = "st";
    if (k % 10 == 2) suffix = "nd";
    if (k % 10 == 3) suffix = "rd";
  }
  return std::to_string(k) + suffix;
}

/// "chunk 7", "chunks 250..257", or the first index and the count when the last one is not
/// representable.
std::string describe_chunks(int64_t offset, int64_t count) {
  if (count == 1) return "chunk " + std::to_string(offset);
  int64_t last = 0;
  if (__builtin_add_overflow(offset, count - 1, &last))
    return "chunks from " + std::to_string(offset) + " (count " + std::to_string(count) + ")";
  return "chunks " + std::to_string(offset) + ".." + std::to_string(last);
}

/// MSCCL's attribute for one of our field names (docs/ef-format.md §9).
std::string_view msccl_attribute(std::string_view field) {
  static constexpr std::pair<std::string_view, std::string_view> kNames[] = {
      {"op", "type"},
      {"src", "srcoff"},
      {"dst", "dstoff"},
      {"count", "cnt"},
      {"deps", "depid"},
      {"channel", "chan"},
      {"input_chunks", "i_chunks"},
      {"output_chunks", "o_chunks"},
      {"scratch_chunks", "s_chunks"},
      {"nranks", "ngpus"},
      {"collective", "coll"},
      {"protocol", "proto"},
      {"min_bytes", "minBytes"},
      {"max_bytes", "maxBytes"},
  };
  for (const auto& [ours, theirs] : kNames)
    if (field == ours) return theirs;
  return field;  // send, recv, hasdep, name, nchannels, nchunksperloop, inplace, ... agree
}

template <typename T>
int line_at(const std::vector<T>& lines, int index) {
  return index >= 0 && static_cast<std::size_t>(index) < lines.size()
             ? static_cast<int>(lines[static_cast<std::size_t>(index)])
             : 0;
}

std::string xml_location(const SourceMap& map, int rank, int tb, int op, std::string_view field) {
  std::string out = "algo";
  int line = 0;
  if (rank >= 0) {
    out += "/gpu[id=" + std::to_string(rank) + "]";
    line = line_at(map.rank_lines, rank);
    if (tb >= 0) {
      out += "/tb[id=" + std::to_string(tb) + "]";
      const bool have_rank = static_cast<std::size_t>(rank) < map.tb_lines.size();
      line = have_rank ? line_at(map.tb_lines[static_cast<std::size_t>(rank)], tb) : 0;
      if (op >= 0) {
        out += "/step[s=" + std::to_string(op) + "]";
        const bool have_tb =
            static_cast<std::size_t>(rank) < map.op_lines.size() &&
            static_cast<std::size_t>(tb) < map.op_lines[static_cast<std::size_t>(rank)].size();
        line = have_tb ? line_at(map.op_lines[static_cast<std::size_t>(rank)]
                                             [static_cast<std::size_t>(tb)],
                                 op)
                       : 0;
      }
    }
  }
  if (!field.empty()) out += "@" + std::string(msccl_attribute(field));
  if (line > 0) out += " (line " + std::to_string(line) + ")";
  return out;
}

/// Simulates one iteration of a program unit by unit with bounded connection slots (§5) and
/// reports whether every threadblock reaches its end. Requires the guarantees of the earlier
/// rules: usable peers, one threadblock per connection end, matched counts, existing
/// dependency targets, and no wait-for cycle.
///
/// Threadblocks are swept round-robin; a visit advances a threadblock as far as it can, so a
/// sweep costs O(threadblocks) and moves up to `slots` units per connection. An op that pops
/// and pushes (rcs, rrs, rrcs) moves a unit only when its input holds one and its output has
/// a free slot, as NCCL's primitives wait for both. Bounded FIFOs between deterministic
/// threadblocks make the outcome independent of the schedule, so the sweep order is free.
///
/// Huge counts stream for many sweeps without any op starting or finishing. When the slot
/// occupancies at the end of a sweep repeat those of one of the last kMaxPeriod sweeps, the
/// sweeps in between repeat exactly as long as no op runs out of units, so the simulation
/// skips ahead by as many whole periods as every moving op can afford.
class CapacitySimulation {
 public:
  CapacitySimulation(const Program& program, const std::vector<ConnectionEnds>& connections,
                     int slots)
      : slots_(std::max(slots, 0)), connections_(connections), occupancy_(connections.size(), 0) {
    for (std::size_t r = 0; r < program.ranks.size(); ++r) {
      rank_first_tb_.push_back(tbs_.size());
      const auto& tbs = program.ranks[r].threadblocks;
      for (std::size_t t = 0; t < tbs.size(); ++t) {
        ThreadblockState s;
        s.rank = static_cast<int32_t>(r);
        s.tb = static_cast<int32_t>(t);
        s.ops = &tbs[t].ops;
        tbs_.push_back(s);
      }
    }
    for (std::size_t c = 0; c < connections.size(); ++c) {
      const ConnectionEnds& ends = connections[c];
      tbs_[rank_first_tb_[ends.sender] + ends.send_tb].out = static_cast<int64_t>(c);
      tbs_[rank_first_tb_[ends.receiver] + ends.recv_tb].in = static_cast<int64_t>(c);
    }
  }

  enum class Outcome { kFinished, kBlocked, kGaveUp };

  Outcome run() {
    std::vector<std::size_t> active;
    for (std::size_t g = 0; g < tbs_.size(); ++g) active.push_back(g);
    uint64_t visits = 0;
    std::vector<Snapshot> history;
    while (true) {
      bool progressed = false;
      bool event = false;
      for (std::size_t g : active) progressed |= visit(tbs_[g], event);
      // A threadblock that finished leaves `active`: snapshots taken before no longer line up
      // with it (their `remaining` lists are in the old `active` order).
      if (std::erase_if(active, [&](std::size_t g) { return tbs_[g].finished(); }) > 0)
        event = true;
      if (active.empty()) return Outcome::kFinished;
      if (!progressed) {
        blocked_ = std::move(active);
        return Outcome::kBlocked;
      }
      visits += active.size();
      if (visits > kCapacityVisitBudget) return Outcome::kGaveUp;
      if (event) {
        history.clear();
      } else {
        skip_periods(active, history);
      }
    }
  }

  uint64_t visit_budget() const { return kCapacityVisitBudget; }

  /// One line per blocked threadblock (after run() returned kBlocked), capped.
  std::string describe_blocked() const {
    std::string out;
    for (std::size_t i = 0; i < blocked_.size() && i < kMaxListedItems; ++i) {
      if (i > 0) out += "; ";
      out += describe_wait(tbs_[blocked_[i]]);
    }
    if (blocked_.size() > kMaxListedItems)
      out += "; and " + std::to_string(blocked_.size() - kMaxListedItems) + " more";
    return out;
  }
  std::size_t blocked_count() const { return blocked_.size(); }
  /// (rank, tb, op) of the first blocked threadblock.
  std::tuple<int, int, int> first_blocked() const {
    const ThreadblockState& s = tbs_[blocked_.front()];
    return {s.rank, s.tb, static_cast<int>(s.pc)};
  }

 private:
  struct ThreadblockState {
    int32_t rank = 0;
    int32_t tb = 0;
    const std::vector<Op>* ops = nullptr;
    std::size_t pc = 0;       ///< current op
    bool started = false;     ///< the current op's dependencies were met
    /// Dependencies of the current op known completed: completion is monotone, so each is
    /// checked until met and never again (a rescan per visit is quadratic in huge dep lists).
    std::size_t deps_met = 0;
    int64_t remaining = 0;    ///< units of the current op not yet moved (once started)
    int64_t in = -1, out = -1;  ///< connection indices
    bool finished() const { return pc == ops->size(); }
  };
  struct Snapshot {
    std::vector<int64_t> occupancy;
    std::vector<int64_t> remaining;  ///< per active threadblock, in `active` order
  };

  bool completed(int32_t rank, const Dependency& d) const {
    return tbs_[rank_first_tb_[rank] + d.tb].pc > static_cast<std::size_t>(d.op);
  }

  /// Advances `s` as far as it can; sets `event` when an op starts or completes.
  bool visit(ThreadblockState& s, bool& event) {
    bool progressed = false;
    while (!s.finished()) {
      const Op& op = (*s.ops)[s.pc];
      if (!s.started) {
        for (; s.deps_met < op.deps.size(); ++s.deps_met)
          if (!completed(s.rank, op.deps[s.deps_met])) return progressed;
        s.started = true;
        s.remaining = op.count;
        event = progressed = true;
      }
      int64_t units = s.remaining;
      if (op_receives(op.code)) units = std::min(units, occupancy_[s.in]);
      if (op_sends(op.code)) units = std::min(units, slots_ - occupancy_[s.out]);
      if (units > 0) {
        if (op_receives(op.code)) occupancy_[s.in] -= units;
        if (op_sends(op.code)) occupancy_[s.out] += units;
        s.remaining -= units;
        progressed = true;
      }
      if (s.remaining > 0) return progressed;
      ++s.pc;
      s.started = false;
      s.deps_met = 0;
    }
    return progressed;
  }

  /// Detects a repeating sweep pattern and jumps over its repetitions (see the class comment).
  void skip_periods(const std::vector<std::size_t>& active, std::vector<Snapshot>& history) {
    Snapshot now{occupancy_, {}};
    now.remaining.reserve(active.size());
    for (std::size_t g : active) now.remaining.push_back(tbs_[g].remaining);
    for (auto past = history.rbegin(); past != history.rend(); ++past) {
      if (past->occupancy != now.occupancy) continue;
      // Every period start needs more units left than one period moves: k * moved <= left - 1.
      int64_t periods = std::numeric_limits<int64_t>::max();
      for (std::size_t i = 0; i < active.size(); ++i) {
        const int64_t moved = past->remaining[i] - now.remaining[i];
        if (moved > 0) periods = std::min(periods, (now.remaining[i] - 1) / moved);
      }
      if (periods == std::numeric_limits<int64_t>::max() || periods == 0) break;
      for (std::size_t i = 0; i < active.size(); ++i)
        tbs_[active[i]].remaining -= periods * (past->remaining[i] - now.remaining[i]);
      history.clear();
      return;
    }
    history.push_back(std::move(now));
    if (history.size() > kMaxPeriod) history.erase(history.begin());
  }

  std::string describe_wait(const ThreadblockState& s) const {
    const Op& op = (*s.ops)[s.pc];
    std::string out = "rank " + std::to_string(s.rank) + " tb " + std::to_string(s.tb) + " op " +
                      std::to_string(s.pc) + " (" + op_name(op.code) + ") waits for ";
    if (!s.started) {
      for (std::size_t k = s.deps_met; k < op.deps.size(); ++k)
        if (const Dependency& d = op.deps[k]; !completed(s.rank, d))
          return out + "its dependency tb " + std::to_string(d.tb) + " op " +
                 std::to_string(d.op);
      return out + "its dependencies";
    }
    const std::string left = ", " + std::to_string(s.remaining) + " of " +
                             std::to_string(op.count) + " units left";
    if (op_receives(op.code) && occupancy_[s.in] == 0) {
      const ConnectionEnds& c = connections_[s.in];
      return out + "data on connection rank " + std::to_string(c.sender) + " -> rank " +
             std::to_string(c.receiver) + " channel " + std::to_string(c.channel) +
             " (empty)" + left;
    }
    if (!op_sends(op.code)) return out + "nothing (it can run)" + left;  // local ops never block
    const ConnectionEnds& c = connections_[s.out];
    return out + "a free slot on connection rank " + std::to_string(c.sender) + " -> rank " +
           std::to_string(c.receiver) + " channel " + std::to_string(c.channel) + " (" +
           std::to_string(occupancy_[s.out]) + " of " + std::to_string(slots_) +
           " slots full)" + left;
  }

  int64_t slots_;
  const std::vector<ConnectionEnds>& connections_;
  std::vector<int64_t> occupancy_;  ///< filled slots per connection
  std::vector<std::size_t> rank_first_tb_;
  std::vector<ThreadblockState> tbs_;
  std::vector<std::size_t> blocked_;
};

/// Runs the rules in order and collects diagnostics up to the limit.
class Validator {
 public:
  Validator(const Program& program, const ValidateOptions& options)
      : p_(program),
        options_(options),
        // A limit of 0 would make every program look valid; report at least one problem.
        limit_(std::max<std::size_t>(options.max_diagnostics, 1)) {}

  Diagnostics run() {
    check_program_shape();
    check_collective_shape();
    check_postconditions();
    check_placements();
    const bool declarations_ok = check_threadblocks();
    const bool graph_ok = check_ops();
    // Only on an otherwise valid op list: its sweep adds offsets the earlier rules bound.
    if (graph_ok && multi_ops_ && out_.empty()) check_multi_rank_exclusive();
    if (full() || !declarations_ok) return std::move(out_);
    const std::vector<ConnectionEnds> connections = detail::find_connections(p_);
    if (!check_connections(connections) || !graph_ok || full()) return std::move(out_);
    if (!check_deadlock() || !counts_ok_) return std::move(out_);
    check_capacity(connections);
    return std::move(out_);
  }

 private:
  bool full() const { return out_.size() >= limit_; }

  void report(std::string location, const char* rule, std::string message) {
    if (full()) return;
    out_.push_back({p_.source.file, std::move(location), rule, std::move(message)});
  }

  /// Location of a rank, threadblock or op (-1 stops at the outer level).
  std::string where(int rank, int tb = -1, int op = -1, std::string_view field = {}) const {
    return location_of(p_, rank, tb, op, field);
  }
  /// Location of a program-level field.
  std::string top(std::string_view field) const { return location_of(p_, -1, -1, -1, field); }

  std::string describe_op(const detail::OpPosition& at) const {
    const Op& op = p_.ranks[at.rank].threadblocks[at.tb].ops[at.op];
    return "rank " + std::to_string(at.rank) + " tb " + std::to_string(at.tb) + " op " +
           std::to_string(at.op) + " (" + op_name(op.code) + ")";
  }

  /// The largest valid rank index as text, for "expected 0..N" messages.
  std::string last_rank() const { return std::to_string(static_cast<int64_t>(p_.ranks.size()) - 1); }

  // ---- program-shape ----
  void check_program_shape() {
    const char* rule = "program-shape";
    if (!is_known(p_.collective))
      report(top("collective"), rule,
             "collective has unknown value " + std::to_string(static_cast<int>(p_.collective)));
    if (p_.nranks < 1 || p_.nranks > kMaxRanks)
      report(top("nranks"), rule,
             "nranks is " + std::to_string(p_.nranks) + "; expected 1.." +
                 std::to_string(kMaxRanks));
    else if (static_cast<std::size_t>(p_.nranks) != p_.ranks.size())
      report(top("nranks"), rule,
             "nranks is " + std::to_string(p_.nranks) + " but ranks lists " +
                 std::to_string(p_.ranks.size()) + " ranks");
    if (p_.nchunksperloop < 1 || p_.nchunksperloop > kMaxChunks)
      report(top("nchunksperloop"), rule,
             "nchunksperloop is " + std::to_string(p_.nchunksperloop) + "; expected 1.." +
                 std::to_string(kMaxChunks) + " (2^24, the limit of valid programs)");
    if (p_.nchannels < 1 || p_.nchannels > kMaxChannels)
      report(top("nchannels"), rule,
             "nchannels is " + std::to_string(p_.nchannels) + "; expected 1.." +
                 std::to_string(kMaxChannels));
    if (!p_.inplace && !p_.outofplace)
      report(top("inplace"), rule,
             "inplace and outofplace are both false; at least one call mode must be allowed");
    if (p_.max_bytes && p_.min_bytes > *p_.max_bytes)
      report(top("min_bytes"), rule,
             "min_bytes " + std::to_string(p_.min_bytes) + " is larger than max_bytes " +
                 std::to_string(*p_.max_bytes));
    const bool rooted = p_.collective == Collective::kBroadcast ||
                        p_.collective == Collective::kReduce ||
                        p_.collective == Collective::kGather || p_.collective == Collective::kScatter;
    if (is_known(p_.collective) && !rooted && p_.root != 0)
      report(top("root"), rule,
             "root is " + std::to_string(p_.root) + "; expected 0: " +
                 std::string(to_string(p_.collective)) + " has no root");
    else if (!p_.ranks.empty() &&
             (p_.root < 0 || static_cast<std::size_t>(p_.root) >= p_.ranks.size()))
      report(top("root"), rule,
             "root is " + std::to_string(p_.root) + "; expected a rank in 0.." + last_rank());
  }

  // ---- collective-shape ----
  void check_collective_shape() {
    const char* rule = "collective-shape";
    const int64_t n = p_.nranks;
    const int64_t chunks = p_.nchunksperloop;
    const bool shape_known = is_known(p_.collective) && n >= 1 &&
                             static_cast<std::size_t>(n) == p_.ranks.size() && chunks >= 1;
    for (std::size_t r = 0; r < p_.ranks.size(); ++r) {
      const Rank& rank = p_.ranks[r];
      if (rank.scratch_chunks < 0)
        report(where(r, -1, -1, "scratch_chunks"), rule,
               "scratch_chunks is " + std::to_string(rank.scratch_chunks) +
                   "; expected 0 or more");
      const std::pair<const char*, int64_t> sizes[] = {{"input_chunks", rank.input_chunks},
                                                       {"output_chunks", rank.output_chunks},
                                                       {"scratch_chunks", rank.scratch_chunks}};
      for (const auto& [field, chunks] : sizes)
        if (chunks > kMaxChunks)
          report(where(r, -1, -1, field), rule,
                 std::string(field) + " is " + std::to_string(chunks) + "; expected at most " +
                     std::to_string(kMaxChunks) + " (2^24, the limit of valid programs)");
    }
    if (!shape_known) return;

    const Collective c = p_.collective;
    const bool per_rank_blocks = c == Collective::kAllGather || c == Collective::kReduceScatter ||
                                 c == Collective::kGather || c == Collective::kScatter;
    if (per_rank_blocks && chunks % n != 0) {
      report(top("nchunksperloop"), rule,
             "nchunksperloop " + std::to_string(chunks) + " is not a multiple of nranks " +
                 std::to_string(n) + ", which " + std::string(to_string(c)) +
                 " requires (its per-rank buffers hold nchunksperloop/nranks chunks)");
      return;
    }
    const int64_t block = chunks / n;
    const bool inplace_only = p_.inplace && !p_.outofplace;
    // Output of 0 chunks is allowed for in-place-only programs of these shapes.
    const std::vector<int64_t> full_or_inplace =
        inplace_only ? std::vector<int64_t>{chunks, 0} : std::vector<int64_t>{chunks};
    for (std::size_t r = 0; r < p_.ranks.size(); ++r) {
      const bool root = static_cast<int64_t>(r) == p_.root;
      std::vector<int64_t> input, output;  // allowed sizes; empty = any size >= 0
      switch (c) {
        case Collective::kAllReduce:
        case Collective::kAllToAll:
          input = {chunks};
          output = full_or_inplace;
          break;
        case Collective::kAllGather:
          input = {block};
          output = {chunks};
          break;
        case Collective::kReduceScatter:
          input = {chunks};
          output = {block};
          break;
        case Collective::kBroadcast:
          input = root ? std::vector<int64_t>{chunks} : std::vector<int64_t>{chunks, 0};
          output = full_or_inplace;
          break;
        case Collective::kReduce:
          input = {chunks};
          output = root ? full_or_inplace : std::vector<int64_t>{chunks, 0};
          break;
        case Collective::kGather:
          input = {block};
          output = {root ? chunks : 0};
          break;
        case Collective::kScatter:
          input = {root ? chunks : 0};
          output = {block};
          break;
        case Collective::kCustom:
          break;
      }
      check_buffer_size(r, "input_chunks", p_.ranks[r].input_chunks, input, root);
      check_buffer_size(r, "output_chunks", p_.ranks[r].output_chunks, output, root);
    }
  }

  void check_buffer_size(std::size_t rank, const char* field, int64_t actual,
                         const std::vector<int64_t>& allowed, bool root) {
    if (allowed.empty() ? actual >= 0
                        : std::find(allowed.begin(), allowed.end(), actual) != allowed.end())
      return;
    std::string expected;
    for (std::size_t i = 0; i < allowed.size(); ++i)
      expected += (i > 0 ? " or " : "") + std::to_string(allowed[i]);
    if (allowed.empty()) {
      expected = "0 or more";
    } else {
      const bool rooted = p_.collective == Collective::kBroadcast ||
                          p_.collective == Collective::kReduce ||
                          p_.collective == Collective::kGather ||
                          p_.collective == Collective::kScatter;
      expected += " for " + std::string(to_string(p_.collective)) +
                  (rooted ? (root ? " on the root" : " on a non-root rank") : "") +
                  " (nchunksperloop " +
                  std::to_string(p_.nchunksperloop) + ", nranks " + std::to_string(p_.nranks);
      const bool zero_if_inplace_only =
          std::string_view(field) == "output_chunks" && allowed.size() == 1 &&
          (p_.collective == Collective::kAllReduce || p_.collective == Collective::kAllToAll ||
           p_.collective == Collective::kBroadcast ||
           (p_.collective == Collective::kReduce && root));
      expected += zero_if_inplace_only ? "; 0 is allowed only in an in-place-only program)" : ")";
    }
    report(where(rank, -1, -1, field), "collective-shape",
           std::string(field) + " is " + std::to_string(actual) + "; expected " + expected);
  }

  // ---- postcondition ----
  /// JSON pointer into the postconditions (XML cannot carry them: its collectives are fixed).
  std::string postcondition_location(std::size_t index, int source = -1) const {
    if (p_.source.format == SourceMap::Format::kMscclXml) return "algo";
    std::string out = "/postconditions/" + std::to_string(index);
    if (source >= 0) out += "/sources/" + std::to_string(source);
    return out;
  }

  void check_postconditions() {
    const char* rule = "postcondition";
    if (p_.collective != Collective::kCustom) {
      if (!p_.postconditions.empty())
        report(top("postconditions"), rule,
               "a " + std::string(is_known(p_.collective) ? to_string(p_.collective) : "non-custom") +
                   " program has " + std::to_string(p_.postconditions.size()) +
                   " postconditions; only custom programs may have them");
      return;
    }
    if (p_.postconditions.empty())
      report(top(p_.source.format == SourceMap::Format::kMscclXml ? "collective"
                                                                    : "postconditions"),
             rule,
             "a custom program has no postconditions; expected at least one (without them "
             "nothing defines its result and every run would verify)");
    const auto rank_ok = [&](int32_t rank) {
      return rank >= 0 && static_cast<std::size_t>(rank) < p_.ranks.size();
    };
    std::map<std::pair<int32_t, int64_t>, std::size_t> first_for_chunk;
    for (std::size_t i = 0; i < p_.postconditions.size() && !full(); ++i) {
      const Postcondition& pc = p_.postconditions[i];
      if (!rank_ok(pc.rank)) {
        report(postcondition_location(i), rule,
               "rank is " + std::to_string(pc.rank) + "; expected 0.." + last_rank());
        continue;
      }
      const int64_t outputs = p_.ranks[pc.rank].output_chunks;
      if (pc.index < 0 || pc.index >= outputs)
        report(postcondition_location(i), rule,
               "output chunk " + std::to_string(pc.index) + " outside the output buffer of " +
                   std::to_string(outputs) + " chunks of rank " + std::to_string(pc.rank));
      const auto [it, added] = first_for_chunk.try_emplace({pc.rank, pc.index}, i);
      if (!added)
        report(postcondition_location(i), rule,
               "output chunk " + std::to_string(pc.index) + " of rank " + std::to_string(pc.rank) +
                   " already has a postcondition (postconditions/" + std::to_string(it->second) +
                   "); expected one per chunk");
      if (pc.sources.empty())
        report(postcondition_location(i), rule,
               "no sources; expected at least one input chunk");
      for (std::size_t j = 0; j < pc.sources.size(); ++j) {
        const ChunkSource& s = pc.sources[j];
        const auto at = postcondition_location(i, static_cast<int>(j));
        if (!rank_ok(s.rank)) {
          report(at, rule, "source rank is " + std::to_string(s.rank) + "; expected 0.." + last_rank());
        } else if (s.index < 0 || s.index >= p_.ranks[s.rank].input_chunks) {
          report(at, rule,
                 "input chunk " + std::to_string(s.index) + " outside the input buffer of " +
                     std::to_string(p_.ranks[s.rank].input_chunks) + " chunks of rank " +
                     std::to_string(s.rank));
        }
      }
    }
  }

  // ---- placement ----
  /// Slot devices within 0..kMaxSlotDevices; every placement names a connection of the
  /// program once, in (sender, receiver, channel) order, and a slot device it declares.
  void check_placements() {
    const char* rule = "placement";
    if (p_.slot_devices < 0 || p_.slot_devices > kMaxSlotDevices)
      report(top("slot_devices"), rule,
             "slot_devices is " + std::to_string(p_.slot_devices) + "; expected 0.." +
                 std::to_string(kMaxSlotDevices));
    if (p_.placements.empty()) return;
    // Connections by either end: a one-sided one is connection-mismatch's to report.
    std::set<std::tuple<int32_t, int32_t, int32_t>> connections;
    for (std::size_t r = 0; r < p_.ranks.size(); ++r)
      for (const Threadblock& tb : p_.ranks[r].threadblocks) {
        const auto rank = static_cast<int32_t>(r);
        if (tb.send_peer >= 0) connections.emplace(rank, tb.send_peer, tb.channel);
        if (tb.recv_peer >= 0) connections.emplace(tb.recv_peer, rank, tb.channel);
      }
    for (std::size_t i = 0; i < p_.placements.size() && !full(); ++i) {
      const ConnectionPlacement& c = p_.placements[i];
      const std::string at = top("connections/" + std::to_string(i));
      const std::string name = "connection rank " + std::to_string(c.sender) + " -> rank " +
                               std::to_string(c.receiver) + " channel " + std::to_string(c.channel);
      const int location = static_cast<int>(c.location);
      if (location > static_cast<int>(SlotLocation::kDevice)) {
        report(at + "/slots", rule, name + ": unknown slot location " + std::to_string(location));
      } else if (c.location == SlotLocation::kDevice) {
        if (c.device < 0 || c.device >= p_.slot_devices)
          report(at + "/device", rule,
                 name + ": slot device " + std::to_string(c.device) + "; expected 0.." +
                     std::to_string(p_.slot_devices - 1) + " (the program declares " +
                     std::to_string(p_.slot_devices) + " slot devices)");
      } else if (c.device != 0) {
        report(at + "/device", rule,
               name + ": device " + std::to_string(c.device) + " given with slots at the " +
                   std::string(to_string(c.location)) + "; only slots on a device name one");
      }
      if (!connections.contains({c.sender, c.receiver, c.channel}))
        report(at, rule,
               name + " does not exist: no threadblock of rank " + std::to_string(c.sender) +
                   " sends to rank " + std::to_string(c.receiver) + " on channel " +
                   std::to_string(c.channel) + ", none there receives from it");
      if (i == 0) continue;
      const ConnectionPlacement& prev = p_.placements[i - 1];
      const auto key = [](const ConnectionPlacement& x) {
        return std::make_tuple(x.sender, x.receiver, x.channel);
      };
      if (key(prev) == key(c))
        report(at, rule,
               name + " is placed twice (connections/" + std::to_string(i - 1) +
                   "); expected one entry per connection");
      else if (key(c) < key(prev))
        report(at, rule,
               name + " comes after connection rank " + std::to_string(prev.sender) + " -> rank " +
                   std::to_string(prev.receiver) + " channel " + std::to_string(prev.channel) +
                   "; expected entries sorted by (sender, receiver, channel)");
    }
  }

  // ---- peer-range, channel-range, duplicate-connection ----
  /// True when every threadblock's peers and channel are usable and no connection end is
  /// claimed twice: the prerequisites of the connection rules.
  bool check_threadblocks() {
    bool ok = true;
    for (std::size_t r = 0; r < p_.ranks.size() && !full(); ++r) {
      const auto& tbs = p_.ranks[r].threadblocks;
      std::map<std::pair<int32_t, int32_t>, std::size_t> senders, receivers;  // (peer, ch) -> tb
      for (std::size_t t = 0; t < tbs.size() && !full(); ++t) {
        const Threadblock& tb = tbs[t];
        bool tb_ok = check_peer(r, t, "send", tb.send_peer);
        tb_ok &= check_peer(r, t, "recv", tb.recv_peer);
        const int32_t channels = p_.nchannels >= 1 ? p_.nchannels : kMaxChannels;
        if (tb.channel < 0 || tb.channel >= channels) {
          report(where(r, t, -1, "channel"), "channel-range",
                 "channel is " + std::to_string(tb.channel) + "; expected 0.." +
                     std::to_string(channels - 1) + " (nchannels " + std::to_string(p_.nchannels) +
                     ")");
          tb_ok = false;
        }
        ok &= tb_ok;
        if (!tb_ok) continue;
        if (tb.send_peer >= 0) ok &= claim(senders, r, t, tb.send_peer, tb.channel, "send");
        if (tb.recv_peer >= 0) ok &= claim(receivers, r, t, tb.recv_peer, tb.channel, "recv");
      }
    }
    return ok;
  }

  bool check_peer(std::size_t rank, std::size_t tb, const char* field, int32_t peer) {
    if (peer == -1 || detail::is_usable_peer(p_, rank, peer)) return true;
    std::string message = std::string(field) + " peer is " + std::to_string(peer) + "; expected ";
    if (static_cast<std::size_t>(peer) == rank)
      message += "another rank than the threadblock's own (or -1 for none)";
    else
      message += "-1 or a rank in 0.." + last_rank();
    report(where(rank, tb, -1, field), "peer-range", std::move(message));
    return false;
  }

  bool claim(std::map<std::pair<int32_t, int32_t>, std::size_t>& owners, std::size_t rank,
             std::size_t tb, int32_t peer, int32_t channel, const char* field) {
    const auto [it, added] = owners.try_emplace({peer, channel}, tb);
    if (added) return true;
    const bool sends = std::string_view(field) == "send";
    report(where(rank, tb, -1, field), "duplicate-connection",
           "threadblocks " + std::to_string(it->second) + " and " + std::to_string(tb) +
               " both " + (sends ? "send to" : "receive from") + " rank " + std::to_string(peer) +
               " on channel " + std::to_string(channel) + "; expected at most one");
    return false;
  }

  // ---- op-peer, op-operands, buffer-range, dependency-target, hasdep ----
  /// True when the wait-for graph can trust every op: known codes, peers for pushes and pops,
  /// existing dependency targets. Sets counts_ok_, which the capacity simulation needs too.
  bool check_ops() {
    bool ok = true;
    for (std::size_t r = 0; r < p_.ranks.size() && !full(); ++r) {
      const auto& tbs = p_.ranks[r].threadblocks;
      std::vector<std::vector<char>> is_target(tbs.size());
      for (std::size_t t = 0; t < tbs.size(); ++t) is_target[t].assign(tbs[t].ops.size(), 0);
      for (std::size_t t = 0; t < tbs.size() && !full(); ++t)
        for (std::size_t i = 0; i < tbs[t].ops.size() && !full(); ++i)
          ok &= check_op(r, t, i, is_target);
      check_hasdep(r, is_target);
    }
    return ok;
  }

  bool check_op(std::size_t r, std::size_t t, std::size_t i,
                std::vector<std::vector<char>>& is_target) {
    const Threadblock& tb = p_.ranks[r].threadblocks[t];
    const Op& op = tb.ops[i];
    if (!is_known(op.code)) {
      report(where(r, t, i, "op"), "op-operands", op_name(op.code) + "; expected send, recv, copy, reduce, rcs, rrc, rrs, rrcs, nop or mrc");
      return false;
    }
    const std::string name(to_string(op.code));
    bool ok = true;
    if (op_sends(op.code) && tb.send_peer == -1) {
      report(where(r, t, i, "op"), "op-peer",
             name + " pushes to a connection, but its threadblock has no send peer (send = -1)");
      ok = false;
    }
    if (op_receives(op.code) && tb.recv_peer == -1) {
      report(where(r, t, i, "op"), "op-peer",
             name + " pops from a connection, but its threadblock has no recv peer (recv = -1)");
      ok = false;
    }
    bool operands_ok = check_operand(r, t, i, "src", op.src, op_reads_src(op.code));
    operands_ok &= check_operand(r, t, i, "dst", op.dst, op_writes_dst(op.code));
    const bool nop = op.code == OpCode::kNop;
    if (nop ? op.count != 0 : op.count < 1) {
      report(where(r, t, i, "count"), "op-operands",
             name + " has count " + std::to_string(op.count) + "; expected " +
                 (nop ? "0" : "at least 1"));
      operands_ok = counts_ok_ = false;
    }
    operands_ok &= check_multi_operands(r, t, i);
    if (operands_ok) {
      if (op.src) check_range(r, t, i, "src", *op.src, op.count);
      if (op.dst) check_range(r, t, i, "dst", *op.dst, op.count);
    }

    const auto& tbs = p_.ranks[r].threadblocks;
    for (const Dependency& d : op.deps) {
      if (d.tb < 0 || static_cast<std::size_t>(d.tb) >= tbs.size()) {
        report(where(r, t, i, "deps"), "dependency-target",
               "dependency on threadblock " + std::to_string(d.tb) + ", but rank " +
                   std::to_string(r) + " has threadblocks 0.." +
                   std::to_string(static_cast<int64_t>(tbs.size()) - 1));
        ok = false;
      } else if (d.op < 0 || static_cast<std::size_t>(d.op) >= tbs[d.tb].ops.size()) {
        report(where(r, t, i, "deps"), "dependency-target",
               "dependency on op " + std::to_string(d.op) + " of threadblock " +
                   std::to_string(d.tb) + ", which has ops 0.." +
                   std::to_string(static_cast<int64_t>(tbs[d.tb].ops.size()) - 1));
        ok = false;
      } else {
        is_target[d.tb][d.op] = 1;
      }
    }
    return ok;
  }

  bool check_operand(std::size_t r, std::size_t t, std::size_t i, const char* field,
                     const std::optional<BufferRef>& ref, bool required) {
    const std::string name(to_string(p_.ranks[r].threadblocks[t].ops[i].code));
    if (required && !ref) {
      report(where(r, t, i), "op-operands", name + " requires " + field + ", which is missing");
      return false;
    }
    if (!required && ref) {
      report(where(r, t, i, field), "op-operands",
             name + " takes no " + field + ", but one is given");
      return false;
    }
    if (ref && !is_known(ref->buffer)) {
      report(where(r, t, i, field), "op-operands",
             std::string(field) + " names unknown buffer " +
                 std::to_string(static_cast<int>(ref->buffer)) +
                 "; expected input, output or scratch");
      return false;
    }
    return true;
  }

  /// buffer-range: chunks off..off+count-1 (count >= 1) must lie in the buffer.
  void check_range(std::size_t r, std::size_t t, std::size_t i, const char* field,
                   const BufferRef& ref, int64_t count) {
    const Rank& rank = p_.ranks[r];
    const int64_t size = ref.buffer == BufferKind::kInput    ? rank.input_chunks
                         : ref.buffer == BufferKind::kOutput ? rank.output_chunks
                                                             : rank.scratch_chunks;
    if (ref.offset >= 0 && count <= size && ref.offset <= size - count) return;
    report(where(r, t, i, field), "buffer-range",
           std::string(field) + " " + describe_chunks(ref.offset, count) + " outside " +
               std::string(to_string(ref.buffer)) + " buffer of " + std::to_string(size) +
               " chunks");
  }

  /// mrc: 1..kMaxMultiOperands sources in input buffers and targets in output buffers, each
  /// `count` chunks inside its rank's buffer; a source may meet a target of the same op only
  /// exactly (each element is read before the same thread writes it), targets not at all. Other
  /// ops take no sources or targets. False when the op's operands are unusable.
  bool check_multi_operands(std::size_t r, std::size_t t, std::size_t i) {
    const Op& op = p_.ranks[r].threadblocks[t].ops[i];
    if (op.code != OpCode::kMultiReduceCopy) {
      if (op.sources.empty() && op.targets.empty()) return true;
      report(where(r, t, i, op.sources.empty() ? "targets" : "sources"), "op-operands",
             op_name(op.code) + " takes no sources or targets (only mrc does)");
      return false;
    }
    multi_ops_ = true;
    bool ok = true;
    const auto check_list = [&](const char* field, const std::vector<RankBufferRef>& refs,
                                BufferKind expected) {
      if (refs.empty() || refs.size() > static_cast<std::size_t>(kMaxMultiOperands)) {
        report(where(r, t, i, field), "op-operands",
               "mrc has " + std::to_string(refs.size()) + " " + field + "; expected 1.." +
                   std::to_string(kMaxMultiOperands));
        ok = false;
        return;
      }
      for (std::size_t k = 0; k < refs.size(); ++k) {
        const RankBufferRef& ref = refs[k];
        const std::string at = std::string(field) + "[" + std::to_string(k) + "]";
        if (ref.rank < 0 || ref.rank >= static_cast<int32_t>(p_.ranks.size())) {
          report(where(r, t, i, field), "op-operands",
                 at + " names rank " + std::to_string(ref.rank) + "; expected 0.." + last_rank());
          ok = false;
        } else if (ref.buffer != expected) {
          report(where(r, t, i, field), "op-operands",
                 at + " is in the " +
                     (is_known(ref.buffer) ? std::string(to_string(ref.buffer))
                                           : std::string("unknown")) +
                     " buffer; mrc reads input buffers and writes output buffers");
          ok = false;
        } else if (op.count >= 1) {
          const Rank& rank = p_.ranks[static_cast<std::size_t>(ref.rank)];
          const int64_t size =
              expected == BufferKind::kInput ? rank.input_chunks : rank.output_chunks;
          if (ref.offset < 0 || op.count > size || ref.offset > size - op.count) {
            report(where(r, t, i, field), "buffer-range",
                   at + " " + describe_chunks(ref.offset, op.count) + " outside rank " +
                       std::to_string(ref.rank) + "'s " + std::string(to_string(ref.buffer)) +
                       " buffer of " + std::to_string(size) + " chunks");
            ok = false;
          }
        }
      }
    };
    check_list("sources", op.sources, BufferKind::kInput);
    check_list("targets", op.targets, BufferKind::kOutput);
    return ok;
  }

  // ---- multi-rank-exclusive ----
  /// An mrc op reads and writes other ranks' buffers with no connection ordering it against
  /// their ops, so in every call mode the program allows (in place with NCCL's aliasing) no
  /// other op may write the chunks an mrc reads or touch the chunks it writes (reads of the
  /// same chunks are fine), and within one mrc no two targets overlap and a source meets a
  /// target only exactly. Sorted sweeps over each rank's memory keep it O(n log n) in the
  /// number of operands.
  void check_multi_rank_exclusive() {
    if (p_.outofplace) check_multi_rank_exclusive_in(/*inplace=*/false);
    if (p_.inplace && !full()) check_multi_rank_exclusive_in(/*inplace=*/true);
  }

  struct Access {
    int32_t rank = 0;
    int32_t space = 0;  ///< BufferKind, or kInput for an output aliasing the input in place
    int64_t begin = 0, end = 0;
    int64_t group = -1;  ///< the mrc op's number, -1 for other ops
    bool write = false;
    detail::OpPosition at;
    std::string field;
  };

  void check_multi_rank_exclusive_in(bool inplace) {
    std::vector<Access> accesses;
    std::vector<std::optional<int64_t>> shift(p_.ranks.size());
    if (inplace)
      for (std::size_t q = 0; q < p_.ranks.size(); ++q)
        shift[q] = detail::output_to_input_shift(p_, q);
    const auto add = [&](int32_t rank, BufferKind buffer, int64_t offset, int64_t count,
                         int64_t group, bool write, const detail::OpPosition& at,
                         std::string field) {
      Access a;
      a.rank = rank;
      a.space = static_cast<int32_t>(buffer);
      a.begin = offset;
      if (buffer == BufferKind::kOutput && shift[static_cast<std::size_t>(rank)]) {
        a.space = static_cast<int32_t>(BufferKind::kInput);
        a.begin += *shift[static_cast<std::size_t>(rank)];
      }
      a.end = a.begin + count;
      a.group = group;
      a.write = write;
      a.at = at;
      a.field = std::move(field);
      accesses.push_back(std::move(a));
    };
    int64_t groups = 0;
    for (std::size_t r = 0; r < p_.ranks.size(); ++r) {
      const auto& tbs = p_.ranks[r].threadblocks;
      for (std::size_t t = 0; t < tbs.size(); ++t) {
        for (std::size_t i = 0; i < tbs[t].ops.size(); ++i) {
          const Op& op = tbs[t].ops[i];
          const detail::OpPosition at{static_cast<int32_t>(r), static_cast<int32_t>(t),
                                      static_cast<int32_t>(i)};
          const auto rank = static_cast<int32_t>(r);
          if (op.code != OpCode::kMultiReduceCopy) {
            if (op.src) add(rank, op.src->buffer, op.src->offset, op.count, -1, false, at, "src");
            if (op.dst) add(rank, op.dst->buffer, op.dst->offset, op.count, -1, true, at, "dst");
            continue;
          }
          const std::size_t first = accesses.size();
          for (std::size_t k = 0; k < op.sources.size(); ++k)
            add(op.sources[k].rank, op.sources[k].buffer, op.sources[k].offset, op.count, groups,
                false, at, "sources[" + std::to_string(k) + "]");
          for (std::size_t k = 0; k < op.targets.size(); ++k)
            add(op.targets[k].rank, op.targets[k].buffer, op.targets[k].offset, op.count, groups,
                true, at, "targets[" + std::to_string(k) + "]");
          ++groups;
          // Within the op (at most 2 * kMaxMultiOperands operands).
          for (std::size_t a = first; a < accesses.size() && !full(); ++a)
            for (std::size_t b = a + 1; b < accesses.size(); ++b) {
              const Access& x = accesses[a];
              const Access& y = accesses[b];
              if (x.rank != y.rank || x.space != y.space || x.end <= y.begin || y.end <= x.begin ||
                  (!x.write && !y.write))
                continue;
              if (x.write != y.write && x.begin == y.begin) continue;  // read, then written
              report(where(at.rank, at.tb, at.op, y.write ? "targets" : "sources"),
                     "multi-rank-exclusive",
                     x.field + " and " + y.field + " overlap in rank " + std::to_string(x.rank) +
                         "'s memory" + mode_text(inplace) +
                         "; expected targets apart from each other, and a source meeting a "
                         "target only exactly");
              break;
            }
        }
      }
    }
    std::sort(accesses.begin(), accesses.end(), [](const Access& a, const Access& b) {
      return std::tie(a.rank, a.space, a.begin) < std::tie(b.rank, b.space, b.begin);
    });
    // Per (rank, space), over the accesses before x: how far other ops' accesses reach (all,
    // and writes only), and how far mrc accesses reach from the two mrc ops reaching furthest
    // (so that an op's own operands, checked above, do not count), again all and writes only.
    // Two reads never clash.
    struct Reach {
      int64_t end = std::numeric_limits<int64_t>::min();
      const Access* by = nullptr;
    };
    struct TopTwo {
      Reach first, second;  // distinct mrc ops
      void add(const Access& a) {
        if (first.by != nullptr && first.by->group == a.group) {
          if (a.end > first.end) first = {a.end, &a};
        } else if (a.end > first.end) {
          second = first;
          first = {a.end, &a};
        } else if (a.end > second.end) {
          second = {a.end, &a};
        }
      }
      /// An access of another mrc op than `group` reaching past `begin`, or null.
      const Access* past(int64_t begin, int64_t group) const {
        const Reach& r = first.by != nullptr && first.by->group != group ? first : second;
        return r.end > begin ? r.by : nullptr;
      }
    };
    Reach other_any, other_write;
    TopTwo mrc_any, mrc_write;
    for (std::size_t k = 0; k < accesses.size() && !full(); ++k) {
      const Access& x = accesses[k];
      if (k == 0 || x.rank != accesses[k - 1].rank || x.space != accesses[k - 1].space) {
        other_any = other_write = Reach{};
        mrc_any = mrc_write = TopTwo{};
      }
      const Access* clash = nullptr;
      if (x.group < 0) {
        clash = (x.write ? mrc_any : mrc_write).past(x.begin, -1);
      } else {
        const Reach& other = x.write ? other_any : other_write;
        if (other.end > x.begin) clash = other.by;
        if (clash == nullptr) clash = (x.write ? mrc_any : mrc_write).past(x.begin, x.group);
      }
      if (clash != nullptr) {
        const Access& m = x.group >= 0 ? x : *clash;
        const Access& o = x.group >= 0 ? *clash : x;
        report(where(m.at.rank, m.at.tb, m.at.op, m.write ? "targets" : "sources"),
               "multi-rank-exclusive",
               "mrc's " + m.field + " overlaps " + describe_op(o.at) + "'s " + o.field +
                   " in rank " + std::to_string(x.rank) + "'s memory" + mode_text(inplace) +
                   "; nothing orders an mrc against other ops, so no other op may write its "
                   "chunks or touch the chunks it writes");
      }
      if (x.group < 0) {
        if (x.end > other_any.end) other_any = {x.end, &x};
        if (x.write && x.end > other_write.end) other_write = {x.end, &x};
      } else {
        mrc_any.add(x);
        if (x.write) mrc_write.add(x);
      }
    }
  }

  static std::string mode_text(bool inplace) {
    return inplace ? " (in-place calls)" : " (out-of-place calls)";
  }

  void check_hasdep(std::size_t r, const std::vector<std::vector<char>>& is_target) {
    const auto& tbs = p_.ranks[r].threadblocks;
    for (std::size_t t = 0; t < tbs.size() && !full(); ++t)
      for (std::size_t i = 0; i < tbs[t].ops.size() && !full(); ++i)
        if (is_target[t][i] && tbs[t].ops[i].declared_hasdep == false)
          report(where(r, t, i, "hasdep"), "hasdep",
                 "other steps depend on this step, but it declares hasdep=\"0\"; MSCCL would "
                 "never signal their dependency (expected hasdep=\"1\")");
  }

  // ---- connection-mismatch ----
  bool check_connections(const std::vector<ConnectionEnds>& connections) {
    const char* rule = "connection-mismatch";
    bool ok = true;
    for (const ConnectionEnds& c : connections) {
      if (full()) return false;
      const std::string name = "connection rank " + std::to_string(c.sender) + " -> rank " +
                               std::to_string(c.receiver) + " channel " +
                               std::to_string(c.channel);
      if (c.send_tb < 0 || c.recv_tb < 0) {
        ok = false;
        if (c.send_tb < 0)
          report(where(c.receiver, c.recv_tb, -1, "recv"), rule,
                 name + ": threadblock " + std::to_string(c.recv_tb) + " of rank " +
                     std::to_string(c.receiver) + " receives, but no threadblock of rank " +
                     std::to_string(c.sender) + " sends to rank " + std::to_string(c.receiver) +
                     " on channel " + std::to_string(c.channel));
        else
          report(where(c.sender, c.send_tb, -1, "send"), rule,
                 name + ": threadblock " + std::to_string(c.send_tb) + " of rank " +
                     std::to_string(c.sender) + " sends, but no threadblock of rank " +
                     std::to_string(c.receiver) + " receives from rank " +
                     std::to_string(c.sender) + " on channel " + std::to_string(c.channel));
        continue;
      }
      const auto& push_ops = p_.ranks[c.sender].threadblocks[c.send_tb].ops;
      const auto& pop_ops = p_.ranks[c.receiver].threadblocks[c.recv_tb].ops;
      std::vector<std::size_t> pushes, pops;
      for (std::size_t i = 0; i < push_ops.size(); ++i)
        if (op_sends(push_ops[i].code)) pushes.push_back(i);
      for (std::size_t i = 0; i < pop_ops.size(); ++i)
        if (op_receives(pop_ops[i].code)) pops.push_back(i);
      if (pushes.size() != pops.size()) {
        ok = false;
        report(where(c.sender, c.send_tb, -1, "send"), rule,
               name + ": " + std::to_string(pushes.size()) + " sends but " +
                   std::to_string(pops.size()) + " receives; expected the same number");
      }
      for (std::size_t k = 0; k < std::min(pushes.size(), pops.size()); ++k) {
        const Op& push = push_ops[pushes[k]];
        const Op& pop = pop_ops[pops[k]];
        if (push.count == pop.count) continue;
        ok = false;
        report(where(c.sender, c.send_tb, pushes[k], "count"), rule,
               name + ": " + ordinal(k + 1) + " send (" + op_name(push.code) + ") has count " +
                   std::to_string(push.count) + " but the matching receive (" +
                   op_name(pop.code) + ") has count " + std::to_string(pop.count) + " (" +
                   where(c.receiver, c.recv_tb, pops[k]) + ")");
        break;  // later pairs of this connection are likely shifted; one report is enough
      }
    }
    return ok;
  }

  // ---- deadlock ----
  /// True when the wait-for graph is acyclic.
  bool check_deadlock() {
    const WaitForGraph graph(p_);
    const std::vector<std::size_t> order = graph.topological_order();
    if (order.size() == graph.size()) return true;
    const std::vector<std::size_t> cycle = graph.find_cycle(order);
    std::string listed;
    for (std::size_t i = 0; i < cycle.size() && i < kMaxListedItems; ++i)
      listed += describe_op(graph.position(cycle[i])) + " -> ";
    if (cycle.size() > kMaxListedItems)
      listed += "... (" + std::to_string(cycle.size()) + " ops in the cycle) -> ";
    const detail::OpPosition& first = graph.position(cycle.front());
    listed += "back to " + describe_op(first);
    report(where(first.rank, first.tb, first.op), "deadlock",
           "ops wait for each other in a cycle (each must complete before the next can): " +
               listed);
    return false;
  }

  // ---- capacity ----
  void check_capacity(const std::vector<ConnectionEnds>& connections) {
    CapacitySimulation simulation(p_, connections, options_.connection_slots);
    switch (simulation.run()) {
      case CapacitySimulation::Outcome::kFinished:
        return;
      case CapacitySimulation::Outcome::kGaveUp:
        report(top({}), "capacity",
               "the slot simulation did not finish within " +
                   std::to_string(simulation.visit_budget()) +
                   " threadblock steps; expected a program small enough to check");
        return;
      case CapacitySimulation::Outcome::kBlocked: {
        const auto [rank, tb, op] = simulation.first_blocked();
        report(where(rank, tb, op), "capacity",
               "with " + std::to_string(options_.connection_slots) + " slots per connection, " +
                   std::to_string(simulation.blocked_count()) +
                   " threadblocks block forever: " + simulation.describe_blocked());
        return;
      }
    }
  }

  const Program& p_;
  const ValidateOptions& options_;
  std::size_t limit_;
  bool counts_ok_ = true;   ///< every op's count is valid (capacity simulates them)
  bool multi_ops_ = false;  ///< the program has an mrc op (multi-rank-exclusive applies)
  Diagnostics out_;
};

}  // namespace

Diagnostics validate(const Program& program, const ValidateOptions& options) {
  return Validator(program, options).run();
}

std::string location_of(const Program& program, int rank, int tb, int op, std::string_view field) {
  if (program.source.format == SourceMap::Format::kMscclXml)
    return xml_location(program.source, rank, tb, op, field);
  std::string out;
  if (rank >= 0) {
    out += "/ranks/" + std::to_string(rank);
    if (tb >= 0) {
      out += "/threadblocks/" + std::to_string(tb);
      if (op >= 0) out += "/ops/" + std::to_string(op);
    }
  }
  if (!field.empty()) out += "/" + std::string(field);
  return out;
}

}  // namespace efccl::ef
