// Tracing: Ref's operations append TraceOps and keep, per chunk slot, whether it holds a value
// and when it was last written, so that misuse is reported where it happens.
#include "efccl/compiler/program_builder.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ir.h"

namespace efccl::compiler {

namespace detail {
StatusOr<ef::Program> compile(const Spec& spec, const std::vector<TraceOp>& trace);
}  // namespace detail

namespace {

constexpr int32_t kMaxRanks = 4096;
constexpr int32_t kMaxChannels = 1024;
/// Scratch chunk indices beyond this are certainly a bug (and would overflow the layout).
constexpr int64_t kMaxScratchChunks = int64_t{1} << 22;

}  // namespace

struct ProgramBuilder::State {
  struct Slot {
    bool initialized = false;
    uint64_t written_at = 0;  ///< trace time of the last write (0: initial contents)
  };
  detail::Spec spec;
  std::vector<TraceOp> trace;
  Status status;
  bool started = false;
  uint64_t now = 0;
  /// [rank][buffer id][chunk]; buffer id 0 input, 1 output, 2 scratch, 3 + named scratch id.
  std::vector<std::vector<std::vector<Slot>>> slots;

  static std::size_t buffer_id(Buffer b) {
    if (b.kind == ef::BufferKind::kScratch && b.scratch_id >= 0) {
      return 3 + static_cast<std::size_t>(b.scratch_id);
    }
    return static_cast<std::size_t>(b.kind);
  }

  /// The slot that holds chunk `index` of `buffer` on `rank` in the traced layout.
  Slot& slot(int32_t rank, Buffer buffer, int64_t index) {
    if (spec.inplace && buffer.kind != ef::BufferKind::kScratch) {
      const ef::BufferRef c =
          detail::canonical_inplace(spec.collective, spec.nranks, spec.nchunks, spec.options.root,
                                    rank, {buffer.kind, index});
      buffer = Buffer(c.buffer);
      index = c.offset;
    }
    auto& buf = slots[static_cast<std::size_t>(rank)][buffer_id(buffer)];
    if (static_cast<std::size_t>(index) >= buf.size())
      buf.resize(static_cast<std::size_t>(index) + 1);
    return buf[static_cast<std::size_t>(index)];
  }

  /// The slot for reading: nullptr where nothing was ever written (scratch grows on writes).
  const Slot* find(int32_t rank, Buffer buffer, int64_t index) const {
    const auto [id, i] = location(rank, buffer, index);
    const auto& buf = slots[static_cast<std::size_t>(rank)][id];
    return static_cast<std::size_t>(i) < buf.size() ? &buf[static_cast<std::size_t>(i)] : nullptr;
  }

  /// The canonical (buffer id, index) of a chunk, to compare locations.
  std::pair<std::size_t, int64_t> location(int32_t rank, Buffer buffer, int64_t index) const {
    if (spec.inplace && buffer.kind != ef::BufferKind::kScratch) {
      const ef::BufferRef c =
          detail::canonical_inplace(spec.collective, spec.nranks, spec.nchunks, spec.options.root,
                                    rank, {buffer.kind, index});
      return {static_cast<std::size_t>(c.buffer), c.offset};
    }
    return {buffer_id(buffer), index};
  }
};

ProgramBuilder::ProgramBuilder(std::string name, ef::Collective collective, int32_t nranks,
                               int64_t chunk_factor, bool inplace, ef::Protocol protocol,
                               int32_t instances, CompileOptions options)
    : state_(std::make_unique<State>()) {
  auto& spec = state_->spec;
  spec.name = std::move(name);
  spec.collective = collective;
  spec.nranks = nranks;
  spec.chunk_factor = chunk_factor;
  spec.inplace = inplace;
  spec.protocol = protocol;
  spec.instances = instances;
  spec.options = std::move(options);
  if (nranks < 1 || nranks > kMaxRanks) {
    fail("nranks must be 1.." + std::to_string(kMaxRanks) + ", got " + std::to_string(nranks));
    return;
  }
  if (chunk_factor < 1 || chunk_factor > (int64_t{1} << 24)) {
    fail("chunk_factor must be 1..2^24, got " + std::to_string(chunk_factor));
    return;
  }
  if (instances < 1 || instances > 1024) {
    fail("instances must be 1..1024, got " + std::to_string(instances));
    return;
  }
  if (spec.options.root < 0 || spec.options.root >= nranks) {
    fail("root " + std::to_string(spec.options.root) + " is not a rank of " +
         std::to_string(nranks));
    return;
  }
  spec.nchunks = ef::count_is_per_block(collective) ? chunk_factor * nranks : chunk_factor;
  if (spec.nchunks * instances > std::numeric_limits<int32_t>::max()) {
    fail("nchunksperloop " + std::to_string(spec.nchunks) + " x " + std::to_string(instances) +
         " instances exceeds 2^31-1");
    return;
  }
  for (int32_t r = 0; r < nranks; ++r) {
    spec.input_chunks.push_back(
        detail::standard_input_chunks(collective, nranks, spec.nchunks, spec.options.root, r));
    spec.output_chunks.push_back(
        detail::standard_output_chunks(collective, nranks, spec.nchunks, spec.options.root, r));
  }
}

ProgramBuilder::~ProgramBuilder() = default;

bool ProgramBuilder::fail(std::string message) {
  if (state_->status.is_ok()) state_->status = Status::error(std::move(message));
  return false;
}

const Status& ProgramBuilder::status() const { return state_->status; }
const std::vector<TraceOp>& ProgramBuilder::trace() const { return state_->trace; }
int32_t ProgramBuilder::nranks() const { return state_->spec.nranks; }
int64_t ProgramBuilder::chunk_factor() const { return state_->spec.chunk_factor; }

void ProgramBuilder::set_buffer_sizes(int32_t rank, int64_t input_chunks, int64_t output_chunks) {
  auto& spec = state_->spec;
  if (!state_->status) return;
  if (spec.collective != ef::Collective::kCustom) {
    fail("set_buffer_sizes: buffer sizes of " + std::string(ef::to_string(spec.collective)) +
         " are fixed by the collective; only custom collectives set them");
    return;
  }
  if (state_->started) {
    fail("set_buffer_sizes: must be called before the first chunk()");
    return;
  }
  if (rank < 0 || rank >= spec.nranks) {
    fail("set_buffer_sizes: rank " + std::to_string(rank) + " out of range 0.." +
         std::to_string(spec.nranks - 1));
    return;
  }
  const int64_t limit = spec.nchunks;
  if (input_chunks < 0 || output_chunks < 0 || input_chunks > limit || output_chunks > limit) {
    fail("set_buffer_sizes: rank " + std::to_string(rank) + ": chunk counts must be 0.." +
         std::to_string(limit) + " (chunk_factor), got input " + std::to_string(input_chunks) +
         ", output " + std::to_string(output_chunks));
    return;
  }
  spec.input_chunks[static_cast<std::size_t>(rank)] = input_chunks;
  spec.output_chunks[static_cast<std::size_t>(rank)] = output_chunks;
}

void ProgramBuilder::set_postconditions(std::vector<ef::Postcondition> postconditions) {
  if (!state_->status) return;
  if (state_->spec.collective != ef::Collective::kCustom) {
    fail("set_postconditions: only custom collectives take postconditions; " +
         std::string(ef::to_string(state_->spec.collective)) + " has its own");
    return;
  }
  state_->spec.custom_postconditions = std::move(postconditions);
}

Buffer ProgramBuilder::scratch_buffer(const std::string& name) {
  auto& names = state_->spec.scratch_names;
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) {
    names.push_back(name);
    it = names.end() - 1;
    for (auto& rank : state_->slots) rank.resize(3 + names.size());
  }
  return Buffer(ef::BufferKind::kScratch, static_cast<int32_t>(it - names.begin()));
}

Ref ProgramBuilder::make_ref(int32_t rank, Buffer buffer, int64_t index, int64_t size) {
  auto& st = *state_;
  if (!st.status) return Ref();
  if (!st.started) {
    st.started = true;
    st.slots.assign(static_cast<std::size_t>(st.spec.nranks),
                    std::vector<std::vector<State::Slot>>(3 + st.spec.scratch_names.size()));
    for (int32_t r = 0; r < st.spec.nranks; ++r) {
      const int64_t in = st.spec.input_chunks[static_cast<std::size_t>(r)];
      for (int64_t i = 0; i < in; ++i) st.slot(r, kInput, i).initialized = true;
    }
  }
  const auto& spec = st.spec;
  if (rank < 0 || rank >= spec.nranks) {
    fail("rank " + std::to_string(rank) + " out of range 0.." + std::to_string(spec.nranks - 1));
    return Ref();
  }
  if (buffer.kind == ef::BufferKind::kScratch && buffer.scratch_id >= 0 &&
      static_cast<std::size_t>(buffer.scratch_id) >= spec.scratch_names.size()) {
    fail("scratch buffer id " + std::to_string(buffer.scratch_id) +
         " was not made by scratch_buffer()");
    return Ref();
  }
  if (buffer.kind != ef::BufferKind::kScratch && buffer.scratch_id >= 0) {
    fail("a named buffer must be a scratch buffer");
    return Ref();
  }
  if (size < 1) {
    fail(detail::describe(spec, rank, buffer, index, 1) + ": size must be >= 1, got " +
         std::to_string(size));
    return Ref();
  }
  int64_t limit = kMaxScratchChunks;
  if (buffer.kind == ef::BufferKind::kInput)
    limit = spec.input_chunks[static_cast<std::size_t>(rank)];
  if (buffer.kind == ef::BufferKind::kOutput)
    limit = spec.output_chunks[static_cast<std::size_t>(rank)];
  if (index < 0 || index > limit || size > limit - index) {
    fail(detail::describe(spec, rank, buffer, index, size) + " is outside the buffer (" +
         std::to_string(limit) + " chunks)");
    return Ref();
  }
  Ref ref;
  ref.builder_ = this;
  ref.rank_ = rank;
  ref.buffer_ = buffer;
  ref.index_ = index;
  ref.size_ = size;
  ref.stamp_ = st.now;
  return ref;
}

Ref ProgramBuilder::chunk(int32_t rank, Buffer buffer, int64_t index, int64_t size) {
  return make_ref(rank, buffer, index, size);
}

Ref ProgramBuilder::record(TraceOp op, const Ref& a, const Ref* b) {
  auto& st = *state_;
  const auto& spec = st.spec;
  if (!st.status) return Ref();
  const std::string what = detail::describe(op, spec, st.trace.size());
  if (a.builder_ != this || (b != nullptr && b->builder_ != this)) {
    fail(what + ": a reference from another ProgramBuilder");
    return Ref();
  }
  // The destination must be addressable; make_ref checks rank and range.
  const Ref dst = make_ref(op.dst_rank, op.dst_buffer, op.dst_index, op.count);
  if (!dst.valid()) {
    fail(what + ": invalid destination");  // keeps the first (more precise) message
    return Ref();
  }
  if (op.channel < -1 || op.channel >= kMaxChannels) {
    fail(what + ": channel " + std::to_string(op.channel) + " out of range -1.." +
         std::to_string(kMaxChannels - 1));
    return Ref();
  }
  if (op.sendtb < -1 || op.recvtb < -1 || op.sendtb > (1 << 20) || op.recvtb > (1 << 20)) {
    fail(what + ": threadblock labels must be -1 (automatic) or 0..2^20");
    return Ref();
  }
  // Reads: initialized, and not overwritten since the reference was taken.
  auto check_read = [&](const Ref& r) {
    for (int64_t i = 0; i < r.size_; ++i) {
      const State::Slot* found = st.find(r.rank_, r.buffer_, r.index_ + i);
      const State::Slot s = found != nullptr ? *found : State::Slot{};
      const std::string chunk = detail::describe(spec, r.rank_, r.buffer_, r.index_ + i, 1);
      if (!s.initialized) {
        return fail(what + ": reads " + chunk + ", which was never written");
      }
      if (s.written_at > r.stamp_) {
        return fail(what + ": " + chunk + " was overwritten by trace op " +
                    std::to_string(s.written_at - 1) + " after this reference to it was taken");
      }
    }
    return true;
  };
  if (!check_read(a) || (b != nullptr && !check_read(*b))) return Ref();

  // Locations, to reject partial overlaps and to drop copies onto themselves.
  auto overlap = [&](int32_t ra, Buffer ba, int64_t ia, int32_t rb, Buffer bb, int64_t ib) {
    if (ra != rb) return 0;  // 0: disjoint, 1: identical, 2: partial
    const auto la = st.location(ra, ba, ia);
    const auto lb = st.location(rb, bb, ib);
    if (la.first != lb.first) return 0;
    if (la.second == lb.second) return 1;
    const int64_t lo = std::max(la.second, lb.second);
    const int64_t hi = std::min(la.second, lb.second) + op.count;
    return lo < hi ? 2 : 0;
  };
  if (op.kind == TraceOp::Kind::kCopy) {
    const int o =
        overlap(op.a_rank, op.a_buffer, op.a_index, op.dst_rank, op.dst_buffer, op.dst_index);
    if (o == 2) {
      fail(what + ": source and destination overlap");
      return Ref();
    }
    if (o == 1) return dst;  // a copy onto itself (e.g. under in-place aliasing): nothing to do
  } else {
    if (overlap(op.a_rank, op.a_buffer, op.a_index, op.b_rank, op.b_buffer, op.b_index) != 0) {
      fail(what + ": the two operands overlap (a chunk cannot be reduced with itself)");
      return Ref();
    }
    const int od_a =
        overlap(op.dst_rank, op.dst_buffer, op.dst_index, op.a_rank, op.a_buffer, op.a_index);
    const int od_b =
        overlap(op.dst_rank, op.dst_buffer, op.dst_index, op.b_rank, op.b_buffer, op.b_index);
    if (od_a == 2 || od_b == 2) {
      fail(what + ": the destination partially overlaps an operand");
      return Ref();
    }
  }
  const uint64_t seq = ++st.now;
  for (int64_t i = 0; i < op.count; ++i) {
    auto& s = st.slot(op.dst_rank, op.dst_buffer, op.dst_index + i);
    s.initialized = true;
    s.written_at = seq;
  }
  st.trace.push_back(op);
  Ref out = dst;
  out.stamp_ = seq;
  return out;
}

StatusOr<ef::Program> ProgramBuilder::compile() const {
  const auto& st = *state_;
  if (!st.status) return st.status;
  if (st.spec.collective == ef::Collective::kCustom && st.spec.custom_postconditions.empty()) {
    return Status::error("custom collective without postconditions: call set_postconditions()");
  }
  detail::Spec spec = st.spec;
  spec.scratch_used.assign(static_cast<std::size_t>(spec.nranks),
                           std::vector<int64_t>(1 + spec.scratch_names.size(), 0));
  for (std::size_t r = 0; r < st.slots.size(); ++r) {
    for (std::size_t id = 2; id < st.slots[r].size(); ++id) {
      spec.scratch_used[r][id - 2] = static_cast<int64_t>(st.slots[r][id].size());
    }
  }
  return detail::compile(spec, st.trace);
}

// ---- Ref ----

Ref Ref::copy(int32_t dst_rank, Buffer buffer, int64_t index, int sendtb, int recvtb,
              int ch) const {
  if (!valid()) return Ref();
  TraceOp op;
  op.kind = TraceOp::Kind::kCopy;
  op.a_rank = rank_;
  op.a_buffer = buffer_;
  op.a_index = index_;
  op.dst_rank = dst_rank;
  op.dst_buffer = buffer;
  op.dst_index = index;
  op.count = size_;
  op.sendtb = sendtb;
  op.recvtb = recvtb;
  op.channel = ch;
  return builder_->record(op, *this, nullptr);
}

Ref Ref::reduce(const Ref& other, int sendtb, int recvtb, int ch) const {
  return reduce_into(other, buffer_, index_, sendtb, recvtb, ch);
}

Ref Ref::reduce_into(const Ref& other, Buffer buffer, int64_t index, int sendtb, int recvtb,
                     int ch) const {
  if (!valid()) return Ref();
  if (!other.valid()) {
    builder_->fail("reduce: the other operand is an invalid reference");
    return Ref();
  }
  if (other.size_ != size_) {
    builder_->fail("reduce: operands differ in size: " +
                   detail::describe(builder_->state_->spec, rank_, buffer_, index_, size_) +
                   " and " +
                   detail::describe(builder_->state_->spec, other.rank_, other.buffer_,
                                    other.index_, other.size_));
    return Ref();
  }
  TraceOp op;
  op.kind = TraceOp::Kind::kReduce;
  op.a_rank = rank_;
  op.a_buffer = buffer_;
  op.a_index = index_;
  op.b_rank = other.rank_;
  op.b_buffer = other.buffer_;
  op.b_index = other.index_;
  op.dst_rank = rank_;
  op.dst_buffer = buffer;
  op.dst_index = index;
  op.count = size_;
  op.sendtb = sendtb;
  op.recvtb = recvtb;
  op.channel = ch;
  return builder_->record(op, *this, &other);
}

}  // namespace efccl::compiler
