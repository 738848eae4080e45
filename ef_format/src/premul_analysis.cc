// Pristine-read analysis for pre-multiplying reductions (docs/ef-format.md §7, premulsum).
//
// A read of a rank's input chunk is pristine when no op of that rank writes the chunk before
// the read in happens-before order, which is reachability in the wait-for graph (threadblock
// order, dependencies, k-th push -> k-th pop, transitively across ranks). The analysis is a
// forward dataflow over a topological order of that graph: each op carries the set of input
// chunks written by the ops that happen before it.
//
// Keeping memory bounded:
//  * Only chunks that some op writes and some op reads matter, and ops touch contiguous
//    ranges, so each rank's input is cut at every range boundary into segments that every op
//    touches whole or not at all; the sets hold only segments that are both written and read.
//    Their number is at most twice the number of ops, whatever the buffer sizes.
//  * The sets are bitsets processed in column batches sized so that one batch over all ops
//    stays within kMaxBitsetWords; larger programs take more passes, not more memory.
//
// Granularity: flags are per operand, not per chunk. An operand of count c is pristine only
// when all c chunks are input chunks (through in-place aliasing, too) and none was written
// before. A range mixing pristine chunks with written (or non-input) ones is reported as
// mixed: one op would move a raw input chunk together with an already combined one, which
// scaling per operand cannot express, so pre-multiplying engines refuse such programs.
// Generated and MSCCL programs move each chunk's raw value and its partial results in
// separate ops.
#include "efccl/ef/premul_analysis.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "inplace_shift.h"
#include "wait_for_graph.h"

namespace efccl::ef {
namespace {

/// Words of bitset held at once across all ops (64 MiB).
constexpr std::size_t kMaxBitsetWords = std::size_t{8} << 20;

/// A half-open range [begin, end) of a rank's input chunks.
struct ChunkRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return begin >= end; }
};

/// The input chunks an operand touches, and whether every chunk it touches is one of them.
struct InputRange {
  ChunkRange range;
  bool all_input = false;
};

/// Maps operands of one rank onto its input buffer.
class InputMap {
 public:
  InputMap(const Program& p, std::size_t rank, bool inplace) : rank_(p.ranks[rank]) {
    if (inplace) shift_ = detail::output_to_input_shift(p, rank);
  }

  /// The input chunks that `ref` with `count` chunks touches; empty for operands outside
  /// their buffer (which validation rejects) and for buffers that do not alias the input.
  InputRange map(const BufferRef& ref, int64_t count) const {
    int64_t size = 0;
    int64_t shift = 0;
    if (ref.buffer == BufferKind::kInput) {
      size = rank_.input_chunks;
    } else if (ref.buffer == BufferKind::kOutput && shift_) {
      size = rank_.output_chunks;
      shift = *shift_;
    } else {
      return {};
    }
    if (count < 1 || ref.offset < 0 || count > size || ref.offset > size - count) return {};
    int64_t begin = 0;
    if (__builtin_add_overflow(ref.offset, shift, &begin)) return {};
    int64_t end = 0;
    if (__builtin_add_overflow(begin, count, &end)) return {};
    const ChunkRange clipped{std::max<int64_t>(begin, 0),
                             std::min<int64_t>(end, std::max<int64_t>(rank_.input_chunks, 0))};
    if (clipped.empty()) return {};
    return {clipped, clipped.begin == begin && clipped.end == end};
  }

 private:
  const Rank& rank_;
  std::optional<int64_t> shift_;
};

/// What one op reads and writes of its rank's input, before and after numbering segments.
struct OpAccess {
  InputRange src_read;   ///< src of ops that read it
  InputRange dst_read;   ///< dst of `reduce`
  ChunkRange written;    ///< dst of ops that write it
  bool reads_src = false;
  bool reads_dst = false;
};

/// Half-open ranges of tracked-segment ids (global over all ranks).
struct IdRange {
  std::size_t begin = 0;
  std::size_t end = 0;
};

/// Cuts one rank's input at every range boundary of its accesses and numbers the segments
/// that are both written and read, starting at `first_id`.
class SegmentNumbering {
 public:
  SegmentNumbering(const std::vector<OpAccess*>& accesses, std::size_t first_id)
      : first_id_(first_id) {
    const auto add_points = [&](const ChunkRange& r) {
      if (r.empty()) return;
      points_.push_back(r.begin);
      points_.push_back(r.end);
    };
    for (const OpAccess* a : accesses) {
      add_points(a->src_read.range);
      add_points(a->dst_read.range);
      add_points(a->written);
    }
    std::sort(points_.begin(), points_.end());
    points_.erase(std::unique(points_.begin(), points_.end()), points_.end());
    if (points_.empty()) return;
    // Coverage counts per segment by difference arrays.
    std::vector<int64_t> writes(points_.size(), 0), reads(points_.size(), 0);
    const auto cover = [&](std::vector<int64_t>& delta, const ChunkRange& r) {
      if (r.empty()) return;
      ++delta[index(r.begin)];
      --delta[index(r.end)];
    };
    for (const OpAccess* a : accesses) {
      cover(writes, a->written);
      cover(reads, a->src_read.range);
      cover(reads, a->dst_read.range);
    }
    tracked_before_.assign(points_.size(), 0);
    tracked_chunks_before_.assign(points_.size(), 0);
    int64_t w = 0, r = 0;
    for (std::size_t s = 0; s + 1 < points_.size(); ++s) {
      w += writes[s];
      r += reads[s];
      const bool tracked = w > 0 && r > 0;
      tracked_before_[s + 1] = tracked_before_[s] + (tracked ? 1 : 0);
      tracked_chunks_before_[s + 1] =
          tracked_chunks_before_[s] + (tracked ? points_[s + 1] - points_[s] : 0);
    }
  }

  std::size_t tracked() const { return points_.empty() ? 0 : tracked_before_.back(); }

  /// Ids of the tracked segments inside `r` (a range this numbering was built from).
  IdRange ids(const ChunkRange& r) const {
    if (r.empty()) return {};
    return {first_id_ + tracked_before_[index(r.begin)], first_id_ + tracked_before_[index(r.end)]};
  }

  /// Whether `r` (a range this numbering was built from) holds chunks no op writes: those
  /// are pristine for every reader.
  bool has_untracked(const ChunkRange& r) const {
    if (r.empty()) return false;
    return r.end - r.begin > tracked_chunks_before_[index(r.end)] - tracked_chunks_before_[index(r.begin)];
  }

 private:
  std::size_t index(int64_t point) const {
    return static_cast<std::size_t>(std::lower_bound(points_.begin(), points_.end(), point) -
                                    points_.begin());
  }

  std::size_t first_id_;
  std::vector<int64_t> points_;               ///< sorted segment boundaries
  std::vector<std::size_t> tracked_before_;   ///< tracked segments left of each boundary
  std::vector<int64_t> tracked_chunks_before_;  ///< chunks in those segments
};

/// How many bits of [begin, end) ∩ [base, base + 64 * words) are set in `row`.
std::size_t count_bits(const uint64_t* row, std::size_t words, std::size_t base, IdRange ids) {
  const std::size_t lo = std::max(ids.begin, base);
  const std::size_t hi = std::min(ids.end, base + 64 * words);
  std::size_t count = 0;
  for (std::size_t b = lo; b < hi;) {
    const std::size_t word = (b - base) / 64;
    const std::size_t bit = (b - base) % 64;
    const std::size_t n = std::min<std::size_t>(64 - bit, hi - b);
    const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << bit;
    count += static_cast<std::size_t>(__builtin_popcountll(row[word] & mask));
    b += n;
  }
  return count;
}

/// Sets the bits of [begin, end) ∩ [base, base + 64 * words) in `row`.
void set_bits(uint64_t* row, std::size_t words, std::size_t base, IdRange ids) {
  const std::size_t lo = std::max(ids.begin, base);
  const std::size_t hi = std::min(ids.end, base + 64 * words);
  for (std::size_t b = lo; b < hi;) {
    const std::size_t word = (b - base) / 64;
    const std::size_t bit = (b - base) % 64;
    const std::size_t n = std::min<std::size_t>(64 - bit, hi - b);
    row[word] |= (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << bit;
    b += n;
  }
}

}  // namespace

PremulMap analyze_premul(const Program& program, bool inplace) {
  const detail::WaitForGraph graph(program);
  const std::size_t n_ops = graph.size();

  // What each op touches of its rank's input.
  std::vector<OpAccess> access(n_ops);
  std::vector<std::vector<OpAccess*>> by_rank(program.ranks.size());
  for (std::size_t x = 0; x < n_ops; ++x) {
    const detail::OpPosition& at = graph.position(x);
    const InputMap input(program, static_cast<std::size_t>(at.rank), inplace);
    const Op& op = graph.op(x);
    OpAccess& a = access[x];
    a.reads_src = op_reads_src(op.code) && op.src.has_value();
    a.reads_dst = op.code == OpCode::kReduce && op.dst.has_value();
    if (a.reads_src) a.src_read = input.map(*op.src, op.count);
    if (a.reads_dst) a.dst_read = input.map(*op.dst, op.count);
    if (op_writes_dst(op.code) && op.dst) a.written = input.map(*op.dst, op.count).range;
    by_rank[static_cast<std::size_t>(at.rank)].push_back(&a);
  }

  // Tracked segment ids per op (graph ids run rank by rank).
  struct OpIds {
    IdRange src, dst, written;
    bool src_untracked = false, dst_untracked = false;  ///< reads chunks no op writes
  };
  std::vector<OpIds> ids(n_ops);
  std::size_t n_ids = 0;
  for (std::size_t r = 0, x = 0; r < program.ranks.size(); ++r) {
    const SegmentNumbering segments(by_rank[r], n_ids);
    for (; x < n_ops && static_cast<std::size_t>(graph.position(x).rank) == r; ++x)
      ids[x] = {segments.ids(access[x].src_read.range), segments.ids(access[x].dst_read.range),
                segments.ids(access[x].written), segments.has_untracked(access[x].src_read.range),
                segments.has_untracked(access[x].dst_read.range)};
    n_ids += segments.tracked();
  }

  // Forward dataflow in column batches: row x holds the tracked segments written by x or by
  // any op that happens before x.
  const std::vector<std::size_t> order = graph.topological_order();
  // Tracked segments of each read operand written before it.
  std::vector<std::size_t> src_written(n_ops, 0), dst_written(n_ops, 0);
  const std::size_t total_words = (n_ids + 63) / 64;
  const std::size_t words =
      std::min(total_words, std::max<std::size_t>(1, kMaxBitsetWords / std::max<std::size_t>(n_ops, 1)));
  std::vector<uint64_t> rows;
  for (std::size_t base = 0; base < n_ids; base += 64 * words) {
    rows.assign(n_ops * words, 0);
    for (std::size_t x : order) {
      uint64_t* row = rows.data() + x * words;
      for (std::size_t p : graph.predecessors(x)) {
        const uint64_t* pred = rows.data() + p * words;
        for (std::size_t w = 0; w < words; ++w) row[w] |= pred[w];
      }
      src_written[x] += count_bits(row, words, base, ids[x].src);
      dst_written[x] += count_bits(row, words, base, ids[x].dst);
      set_bits(row, words, base, ids[x].written);
    }
  }

  // Ops that a cycle keeps out of `order` (invalid programs only) stay not pristine.
  std::vector<char> ordered(n_ops, 0);
  for (std::size_t x : order) ordered[x] = 1;
  PremulMap result(program.ranks.size());
  for (std::size_t r = 0; r < program.ranks.size(); ++r) {
    const auto& tbs = program.ranks[r].threadblocks;
    result[r].resize(tbs.size());
    for (std::size_t t = 0; t < tbs.size(); ++t) result[r][t].resize(tbs[t].ops.size());
  }
  for (std::size_t x = 0; x < n_ops; ++x) {
    if (!ordered[x]) continue;
    const detail::OpPosition& at = graph.position(x);
    PremulFlags& flags = result[at.rank][at.tb][at.op];
    const OpAccess& a = access[x];
    flags.src = a.reads_src && a.src_read.all_input && src_written[x] == 0;
    flags.dst = a.reads_dst && a.dst_read.all_input && dst_written[x] == 0;
    // Mixed: some chunk pristine (never written, or tracked but not yet written) and some not
    // (written before, or not an input chunk at all).
    const auto mixed = [](const InputRange& read, IdRange tracked, bool untracked,
                          std::size_t written) {
      if (read.range.empty()) return false;
      const bool some_pristine = untracked || written < tracked.end - tracked.begin;
      const bool some_not = !read.all_input || written > 0;
      return some_pristine && some_not;
    };
    flags.src_mixed =
        a.reads_src && mixed(a.src_read, ids[x].src, ids[x].src_untracked, src_written[x]);
    flags.dst_mixed =
        a.reads_dst && mixed(a.dst_read, ids[x].dst, ids[x].dst_untracked, dst_written[x]);
  }
  return result;
}

std::string describe_mixed_operand(const Program& program, const PremulMap& map, bool inplace) {
  for (std::size_t r = 0; r < map.size() && r < program.ranks.size(); ++r) {
    const auto& tbs = program.ranks[r].threadblocks;
    for (std::size_t t = 0; t < map[r].size() && t < tbs.size(); ++t) {
      for (std::size_t i = 0; i < map[r][t].size() && i < tbs[t].ops.size(); ++i) {
        const PremulFlags& f = map[r][t][i];
        if (!f.src_mixed && !f.dst_mixed) continue;
        const Op& op = tbs[t].ops[i];
        const bool src = f.src_mixed && op.src.has_value();
        const std::optional<BufferRef>& ref = src ? op.src : op.dst;
        std::string message = "rank " + std::to_string(r) + " tb " + std::to_string(t) + " op " +
                              std::to_string(i) + " (" + std::string(to_string(op.code)) +
                              "): " + (src ? "src" : "dst");
        const InputRange read =
            ref ? InputMap(program, r, inplace).map(*ref, op.count) : InputRange{};
        if (ref && ref->buffer != BufferKind::kInput)
          message += " (" + std::string(to_string(ref->buffer)) + " chunks " +
                     std::to_string(ref->offset) + ".." +
                     std::to_string(ref->offset + op.count - 1) + ", in place)";
        message += " reads input chunks " + std::to_string(read.range.begin) + ".." +
                   std::to_string(read.range.end - 1) +
                   (read.all_input ? " of which some are already written"
                                   : " together with chunks outside the input");
        return message + ": premulsum/avg cannot scale it; split the op";
      }
    }
  }
  return {};
}

}  // namespace efccl::ef
