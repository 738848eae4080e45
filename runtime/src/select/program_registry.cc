#include "select/program_registry.h"

#include <algorithm>
#include <mutex>

#include "efccl/algorithms/algorithm_library.h"
#include "efccl/common/log.h"
#include "select/selection_observer.h"
#include "select/tuning.h"
#include "select/user_programs.h"

namespace efccl::runtime {
namespace {

bool is_rooted(ef::Collective c) {
  return c == ef::Collective::kBroadcast || c == ef::Collective::kReduce ||
         c == ef::Collective::kGather || c == ef::Collective::kScatter;
}

/// Bytes the tuning table sees: the whole call's data.
uint64_t call_bytes(const CallShape& call) {
  const uint64_t per_rank = call.count * ef::size_of(call.dtype);
  return ef::count_is_per_block(call.collective) ? per_rank * static_cast<uint64_t>(call.nranks)
                                                 : per_rank;
}

/// Why user program `p` cannot run `call` (empty: it can).
std::string unusable_reason(const ef::Program& p, const CallShape& call, const ProtocolFilter& f) {
  if (p.nranks != call.nranks)
    return "the program has " + std::to_string(p.nranks) + " ranks, the communicator " +
           std::to_string(call.nranks);
  if (is_rooted(call.collective) && p.root != call.root)
    return "the program's root is " + std::to_string(p.root) + ", the call's " +
           std::to_string(call.root);
  if (call.inplace && !p.inplace) return "the program is not valid in place";
  if (!call.inplace && !p.outofplace) return "the program is valid in place only";
  if (!ef::chunk_elements(p, call.count))
    return "count " + std::to_string(call.count) +
           " is not a multiple of the program's granularity " +
           std::to_string(ef::count_granularity(p));
  if (!f.allows(p.protocol))
    return "protocol " + std::string(ef::to_string(p.protocol)) +
           " is excluded by NCCL_PROTO=" + f.spec;
  return {};
}

}  // namespace

std::unique_ptr<ProgramRegistry> ProgramRegistry::from_environment() {
  return std::make_unique<ProgramRegistry>(load_user_programs(), ProtocolFilter::from_environment(),
                                           builtins_from_environment());
}

ProgramRegistry::ProgramRegistry(std::vector<std::pair<ef::Program, std::string>> user_programs,
                                 ProtocolFilter filter, bool builtins)
    : filter_(std::move(filter)), use_builtins_(builtins) {
  for (auto& [program, file] : user_programs)
    user_.push_back({std::move(program), std::move(file)});
  // Built-ins run in the protocol the tuning table prefers for their size (results never
  // depend on it); where NCCL_PROTO excludes that one, in the first allowed of these.
  for (ef::Protocol p : {ef::Protocol::kSimple, ef::Protocol::kLL128, ef::Protocol::kLL}) {
    if (filter_.allows(p)) {
      fallback_protocol_ = p;
      break;
    }
  }
  if (!filter_.allows(fallback_protocol_))
    EFCCL_WARN(-1, "NCCL_PROTO=" + filter_.spec + " excludes every protocol; using Simple");
}

ef::Protocol ProgramRegistry::allowed_protocol(ef::Protocol preferred) const {
  return filter_.allows(preferred) ? preferred : fallback_protocol_;
}

ef::Protocol ProgramRegistry::p2p_protocol(uint64_t bytes) const {
  return allowed_protocol(runtime::p2p_protocol(bytes));
}

StatusOr<const ef::Program*> ProgramRegistry::builtin(const std::string& algorithm,
                                                      const CallShape& call,
                                                      const BuiltinShape& shape,
                                                      bool inplace_variant, ef::Protocol protocol) {
  const int32_t root = is_rooted(call.collective) ? call.root : 0;
  auto key = std::make_tuple(algorithm, call.nranks, root, shape.instances, shape.channels,
                             shape.nodes, inplace_variant, protocol);
  if (auto it = builtins_.find(key); it != builtins_.end()) return it->second.get();

  algorithms::AlgorithmParams params;
  params.ranks = call.nranks;
  params.instances = shape.instances;
  params.channels = shape.channels;
  params.nodes = shape.nodes;
  params.root = root;
  params.protocol = protocol;
  params.inplace = inplace_variant;
  // The runtime decides sizes through the tuning table; the program claims every size.
  params.min_bytes = 0;
  params.max_bytes = std::nullopt;
  StatusOr<ef::Program> generated = algorithms::generate_algorithm(algorithm, params);
  if (!generated)
    return Status::error("generating built-in " + algorithm + " for " +
                         std::to_string(call.nranks) + " ranks: " + generated.status().message());
  auto program = std::make_unique<ef::Program>(std::move(generated.value()));
  const ef::Program* raw = program.get();
  builtins_.emplace(key, std::move(program));
  return raw;
}

StatusOr<Plan> ProgramRegistry::select(const CallShape& call) {
  constexpr std::size_t kMaxCachedShapes = 4096;
  const ShapeKey key{static_cast<int>(call.collective), call.nranks, call.root, call.count,
                     static_cast<int>(call.dtype),      call.inplace};
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      if (selection_observed())
        for (const SelectionRecord& r : it->second.records) notify_selection(r);
      return it->second.plan;
    }
  }
  std::vector<SelectionRecord> records;
  StatusOr<Plan> plan = select_uncached(call, &records);
  for (const SelectionRecord& r : records) notify_selection(r);
  if (plan) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCachedShapes) cache_.clear();
    cache_[key] = CachedPlan{*plan, std::move(records)};
  }
  return plan;
}

StatusOr<Plan> ProgramRegistry::select_uncached(const CallShape& call,
                                                std::vector<SelectionRecord>* records) {
  const uint64_t api_bytes = call.count * ef::size_of(call.dtype);
  const std::string collective(ef::to_string(call.collective));

  // 1. User programs that claim the call (collective and byte range) take precedence.
  std::string skipped;  // why claiming programs could not run it
  for (const UserProgram& u : user_) {
    const ef::Program& p = u.program;
    if (p.collective != call.collective || api_bytes < p.min_bytes ||
        (p.max_bytes && api_bytes > *p.max_bytes))
      continue;
    const std::string why_not = unusable_reason(p, call, filter_);
    SelectionRecord record{collective, p.name, u.file, "", false, call.count, call.nranks};
    if (!why_not.empty()) {
      record.skipped = true;
      record.reason = why_not;
      EFCCL_INFO(kLogTuning, -1,
                 "skipping user program '" + p.name + "' (" + u.file + ") for " + collective +
                     " count " + std::to_string(call.count) + ": " + why_not);
      records->push_back(record);
      skipped += "; user program '" + p.name + "' (" + u.file + ") claims it but " + why_not;
      continue;
    }
    Plan plan;
    plan.pieces.push_back({&p, 0, call.count});
    plan.reason = "user program '" + p.name + "' from " + u.file + " (claims " +
                  std::to_string(api_bytes) + " bytes)";
    record.reason = plan.reason;
    records->push_back(record);
    return plan;
  }

  // 2. The built-in library, through the tuning table.
  if (!use_builtins_)
    return Status::error(
        "no user program covers " + collective + " count " + std::to_string(call.count) + " " +
        std::string(ef::to_string(call.dtype)) + " (" + std::to_string(api_bytes) + " bytes, " +
        std::to_string(call.nranks) + " ranks, " + (call.inplace ? "in place" : "out of place") +
        ") and the built-in algorithms are disabled (EFCCL_BUILTINS=0)" + skipped);
  const BuiltinChoice choice = choose_builtin(call.collective, call.nranks, call_bytes(call),
                                              hosts_, shared_launch_, ranks_per_shared_gpu_);
  if (choice.algorithm.empty())
    return Status::error("no built-in algorithm for " + collective + " with " +
                         std::to_string(call.nranks) + " ranks");
  const std::string algorithm(choice.algorithm);
  const ef::Protocol protocol = allowed_protocol(choice.protocol);
  // The choice's lanes and hierarchy go with its algorithm (the tail piece is a flat one).
  int32_t channels = choice.channels;
  const auto get = [&](const std::string& name, int32_t instances) -> StatusOr<const ef::Program*> {
    BuiltinShape shape;
    shape.instances = instances;
    if (name == algorithm) {
      shape.channels = channels;
      shape.nodes = choice.nodes;
    }
    auto p = builtin(name, call, shape, false, protocol);
    if (!p) return p;
    if (call.inplace && !(*p)->inplace) return builtin(name, call, shape, true, protocol);
    return p;
  };

  Plan plan;
  plan.builtin = true;
  int32_t instances = choice.instances;
  auto program = get(algorithm, instances);
  if (!program) return program.status();
  const uint64_t granularity = ef::count_granularity(**program);
  plan.reason = "built-in " + algorithm + ", " + choice.why;
  if (protocol != choice.protocol)
    plan.reason += "; NCCL_PROTO=" + filter_.spec + " excludes " +
                   std::string(ef::to_string(choice.protocol)) + ": " +
                   std::string(ef::to_string(protocol));
  // Element-wise collectives cut the count into granularity chunks. The kernel moves a unit
  // in 16-byte packs only when its addresses are 16-byte aligned, else one element per thread
  // at a time, several times slower: a 64 MiB float allreduce of 3 ranks, chunks of 43688
  // bytes, ran at 58 GB/s busbw where 48 MiB (32 KiB chunks) ran at 324 (docs/performance.md).
  // So where chunks would reach kAlignedChunkBytes, the body takes a multiple of granularity x
  // pack elements and the tail the rest.
  constexpr uint64_t kAlignedChunkBytes = 16 * 1024;
  const uint64_t element_bytes = ef::size_of(call.dtype);
  const uint64_t pack = element_bytes < 16 && 16 % element_bytes == 0 ? 16 / element_bytes : 1;
  const bool per_block = ef::count_is_per_block(call.collective);
  const uint64_t step =
      !per_block && (call.count / granularity) * element_bytes >= kAlignedChunkBytes
          ? granularity * pack
          : granularity;
  if (call.count % step == 0) {
    plan.pieces.push_back({*program, 0, call.count});
  } else if (!per_block) {
    // Element-wise collectives: the largest multiple of the step through the chosen program,
    // the remaining elements through a program of granularity 1.
    const uint64_t body = call.count - call.count % step;
    // A program of mrc ops gives every rank at least one chunk: its tail is its one-threadblock
    // variant (shared_gpu_*_single: one pass, any count). Otherwise allreduce's tail is
    // all-pairs, the others' their own program with one instance.
    const std::string tail_algorithm =
        choice.shared_launch                                               ? algorithm + "_single"
        : call.collective == ef::Collective::kAllReduce && call.nranks > 1 ? "allpairs_allreduce"
                                                                           : algorithm;
    auto tail = get(tail_algorithm, 1);
    if (!tail) return tail.status();
    if (ef::count_granularity(**tail) != 1)
      return Status::error(tail_algorithm + " with one instance does not take every count");
    if (body > 0) plan.pieces.push_back({*program, 0, body});
    plan.pieces.push_back({*tail, body, call.count - body});
    plan.reason += "; count " + std::to_string(call.count) + " is not a multiple of " +
                   std::to_string(step) +
                   (step != granularity ? " (chunks of whole 16-byte packs)" : "") + ": the last " +
                   std::to_string(call.count - body) + " element(s) run through " + tail_algorithm;
  } else {
    // Per-block collectives cannot be split by offset: fewer instances until the count fits
    // (one instance takes every count).
    while (instances > 1 && call.count % ef::count_granularity(**program) != 0) {
      instances /= 2;
      program = get(algorithm, instances);
      if (!program) return program.status();
    }
    // Lanes (an mrc program's, or a ring's on a GPU shared between processes) multiply the
    // granularity too: one lane then takes every count.
    if (channels > 1 && call.count % ef::count_granularity(**program) != 0) {
      channels = 1;
      program = get(algorithm, instances);
      if (!program) return program.status();
    }
    if (call.count % ef::count_granularity(**program) != 0)
      return Status::error(algorithm + " cannot take count " + std::to_string(call.count));
    plan.pieces.push_back({*program, 0, call.count});
    if (instances != choice.instances || channels != choice.channels)
      plan.reason +=
          "; " + std::to_string(instances) + " instance(s)" +
          (channels != choice.channels ? " x " + std::to_string(channels) + " lane(s) per rank"
                                       : std::string()) +
          " so that count " + std::to_string(call.count) + " divides";
  }
  SelectionRecord record{collective, (*program)->name, "builtin",  plan.reason,
                         false,      call.count,       call.nranks};
  records->push_back(record);
  return plan;
}

}  // namespace efccl::runtime
