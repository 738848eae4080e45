// ProcessGroupEfccl: construction, communicators, splits, the common path of every call
// (run), coalescing blocks, shutdown. The operations themselves: collectives.cc.
#include "process_group_efccl.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "efccl_library.h"

namespace efccl::torch_backend {
namespace {

using Clock = std::chrono::steady_clock;

/// The same color on every member of a group: a 31-bit hash of its sorted global ranks.
int color_of(const std::vector<int64_t>& ranks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int64_t r : ranks) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(r >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int>(h & 0x7fffffff);
}

/// Marks a host call into efccl for the watchdog while it lasts.
class CallMarker {
 public:
  CallMarker(CallInProgress& call, uint64_t seq, const char* op, std::chrono::milliseconds timeout)
      : call_(call) {
    int64_t idle = 0;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
            .count();
    call_.seq.store(seq);
    call_.op.store(op);
    call_.timeout_ms.store(timeout.count());
    // Another thread's call in progress keeps its mark (the watchdog follows one at a time).
    owner_ = call_.started_ns.compare_exchange_strong(idle, now, std::memory_order_acq_rel);
  }
  ~CallMarker() {
    if (owner_) call_.started_ns.store(0, std::memory_order_release);
  }
  CallMarker(const CallMarker&) = delete;
  CallMarker& operator=(const CallMarker&) = delete;

 private:
  CallInProgress& call_;
  bool owner_ = false;
};

bool capturing(c10::cuda::CUDAStream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

ProcessGroupEfccl::ProcessGroupEfccl(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                     std::vector<int64_t> global_ranks, std::string group_name,
                                     c10::intrusive_ptr<EfcclOptions> options,
                                     c10::intrusive_ptr<ProcessGroupEfccl> split_from)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      options_(options ? options->copy() : c10::make_intrusive<EfcclOptions>()),
      state_(std::make_shared<GroupState>(
          GroupIdentity{std::move(group_name), rank, size, std::move(global_ranks)})) {
  init();
  TORCH_CHECK(store_, "efccl: a process group needs a store");
  watchdog_ = std::make_shared<Watchdog>(state_, store_);
  watchdog_->start();
  if (split_from) {
    // Every member passes the same color; torch has the parent's other ranks call
    // performNocolorSplit at this point of their program.
    std::vector<int64_t> members = state_->identity().global_ranks;
    std::shared_ptr<Communicator> comm = split_from->split_communicator(
        color_of(members), rank, settings_of(*options_), std::nullopt);
    TORCH_CHECK(comm, "efccl: ", state_->identity().describe(),
                ": ncclCommSplit gave this member no communicator");
    adopt(std::move(comm));
  }
}

ProcessGroupEfccl::ProcessGroupEfccl(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                     std::vector<int64_t> global_ranks, std::string group_name,
                                     c10::intrusive_ptr<EfcclOptions> options,
                                     std::shared_ptr<Communicator> comm)
    : ProcessGroupEfccl(std::move(store), rank, size, std::move(global_ranks),
                        std::move(group_name), std::move(options)) {
  adopt(std::move(comm));
}

ProcessGroupEfccl::~ProcessGroupEfccl() {
  try {
    terminate(false, "the process group was destroyed");
  } catch (...) {  // a destructor cannot report; the communicator was aborted if it could be
  }
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupEfccl::getBackendOptions() {
  // A copy: torch's splitGroup writes the child's name and timeout into what it gets here.
  return c10::static_intrusive_pointer_cast<c10d::Backend::Options>(options_->copy());
}

c10::intrusive_ptr<EfcclOptions> ProcessGroupEfccl::options_copy() const {
  return options_->copy();
}

void ProcessGroupEfccl::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
}

CommunicatorSettings ProcessGroupEfccl::settings_of(const EfcclOptions& options) const {
  CommunicatorSettings s;
  s.timeout = options.timeout.count() > 0 ? options.timeout : std::chrono::minutes(30);
  s.algorithm_files = options.algorithm_files;
  s.high_priority_stream = options.high_priority_stream;
  return s;
}

std::chrono::milliseconds ProcessGroupEfccl::timeout_of(std::chrono::milliseconds requested) const {
  if (requested.count() > 0) return requested;
  return options_->timeout.count() > 0 ? options_->timeout : std::chrono::minutes(30);
}

at::Device ProcessGroupEfccl::default_device(std::optional<at::Device> hint) const {
  if (hint && hint->is_cuda() && hint->has_index()) return *hint;
  if (const Communicator* c = comm_ptr_.load(std::memory_order_acquire)) return c->device();
  if (std::optional<at::Device> bound = getBoundDeviceId(); bound && bound->is_cuda())
    return *bound;
  return at::Device(at::kCUDA, c10::cuda::current_device());
}

void ProcessGroupEfccl::adopt(std::shared_ptr<Communicator> comm) {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  events_ = EventPool::create(comm->device().index());
  watchdog_->add_communicator(comm);
  comm_ = std::move(comm);
  comm_ptr_.store(comm_.get(), std::memory_order_release);
}

Communicator& ProcessGroupEfccl::communicator(const at::Device& device) {
  Communicator* c = comm_ptr_.load(std::memory_order_acquire);
  if (c == nullptr) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    c = comm_.get();
    if (c == nullptr) {
      state_->throw_if_failed("communicator creation");
      c10::cuda::CUDAGuard guard(device);
      TORCH_CHECK(!capturing(c10::cuda::getCurrentCUDAStream(device.index())),
                  "efccl: ", state_->identity().describe(),
                  ": the group's communicator does not exist yet and cannot be created while a "
                  "CUDA graph is captured; run one collective of the group before the capture "
                  "(or pass device_id to init_process_group)");
      try {
        std::shared_ptr<Communicator> created = Communicator::create(
            *store_, "efccl/comm", state_->identity(), device, settings_of(*options_));
        events_ = EventPool::create(device.index());
        watchdog_->add_communicator(created);
        comm_ = std::move(created);
        comm_ptr_.store(comm_.get(), std::memory_order_release);
        c = comm_.get();
      } catch (const std::exception& e) {
        // The ranks create it at the same call; one that failed cannot catch up later.
        state_->fail(std::string("creating its communicator failed: ") + e.what());
        throw;
      }
    }
  }
  TORCH_CHECK(c->device() == device, "efccl: ", state_->identity().describe(), " runs on ",
              c->device(), "; a tensor on ", device,
              " cannot join it (one device per process and group)");
  return *c;
}

void ProcessGroupEfccl::eagerConnectSingleDevice(at::Device device) { (void)communicator(device); }

std::shared_ptr<Communicator> ProcessGroupEfccl::split_communicator(
    int color, int key, const CommunicatorSettings& settings, std::optional<at::Device> device) {
  state_->throw_if_failed("ncclCommSplit");
  Communicator& parent = communicator(default_device(device));
  const uint64_t n = split_count_.fetch_add(1);
  return parent.split(*store_, "efccl/split/" + std::to_string(n), state_->identity(), color, key,
                      settings);
}

void ProcessGroupEfccl::performNocolorSplit(at::Device device) {
  (void)split_communicator(NCCL_SPLIT_NOCOLOR, state_->identity().rank, settings_of(*options_),
                           device);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupEfccl::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  const GroupIdentity& id = state_->identity();
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  TORCH_CHECK(!sorted.empty() && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
              "efccl split of ", id.describe(), ": the ranks must be distinct and not empty");
  TORCH_CHECK(sorted.front() >= 0 && sorted.back() < id.size, "efccl split of ", id.describe(),
              ": rank ", sorted.back(), " is not a rank of the group");
  const auto at = std::find(sorted.begin(), sorted.end(), id.rank);
  const bool member = at != sorted.end();
  std::vector<int64_t> globals;
  for (int r : sorted)
    globals.push_back(id.global_ranks.empty() ? r : id.global_ranks[static_cast<size_t>(r)]);

  c10::intrusive_ptr<EfcclOptions> child_options;
  if (auto ours = c10::dynamic_intrusive_pointer_cast<EfcclOptions>(opts)) {
    child_options = ours->copy();
  } else {
    child_options = options_->copy();
    if (opts) {
      child_options->timeout = opts->timeout;
      child_options->group_name = opts->group_name;
      child_options->group_desc = opts->group_desc;
    }
  }
  std::shared_ptr<Communicator> child =
      split_communicator(member ? color_of(globals) : NCCL_SPLIT_NOCOLOR,
                         member ? static_cast<int>(at - sorted.begin()) : id.rank,
                         settings_of(*child_options), getBoundDeviceId());
  if (!member) return {};
  TORCH_CHECK(child, "efccl split of ", id.describe(),
              ": ncclCommSplit gave a member no communicator");
  auto group = c10::make_intrusive<ProcessGroupEfccl>(
      store, static_cast<int>(at - sorted.begin()), static_cast<int>(sorted.size()),
      std::move(globals), child_options->group_name, child_options, std::move(child));
  group->setBoundDeviceId(getBoundDeviceId());
  return group;
}

void ProcessGroupEfccl::record_on(const std::vector<at::Tensor>& tensors,
                                  c10::cuda::CUDAStream stream) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.has_storage())
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
}

void ProcessGroupEfccl::order_after(c10::cuda::CUDAStream earlier, c10::cuda::CUDAStream later) {
  if (earlier == later) return;
  std::shared_ptr<cudaEvent_t> event = events_->acquire();
  C10_CUDA_CHECK(cudaEventRecord(*event, earlier.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(later.stream(), *event, 0));
}

void ProcessGroupEfccl::call_failed(const CallSpec& spec, uint64_t seq, const EfcclResult& r,
                                    std::chrono::nanoseconds elapsed,
                                    std::chrono::milliseconds timeout) {
  std::string message = "efccl " + std::string(spec.name) + " #" + std::to_string(seq) + " on " +
                        state_->identity().describe() + ": " +
                        describe_failure(r.function, r.result);
  // Arguments efccl refused leave the group usable; anything else (a timeout, a lost peer,
  // CUDA) leaves the ranks' calls out of step: the group fails, as at the watchdog.
  if (r.result != ncclInvalidArgument) {
    if (elapsed + std::chrono::seconds(3) >= timeout)
      message += watchdog_->report_for(seq, spec.name);
    watchdog_->fail_group(message);
  }
  C10_THROW_ERROR(DistBackendError, message);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::run(
    CallSpec& spec, c10::function_ref<EfcclResult(ncclComm_t, cudaStream_t)> enqueue) {
  state_->throw_if_failed(spec.name);
  Communicator& comm = communicator(spec.device);
  const std::chrono::milliseconds timeout = timeout_of(spec.timeout);
  const uint64_t seq = seq_.fetch_add(1) + 1;
  c10::cuda::CUDAGuard device_guard(spec.device);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(spec.device.index());
  const bool captured = capturing(current);
  const EfcclLibrary& lib = efccl_library();
  const Clock::time_point started = Clock::now();

  if (coalescing_.active) {
    // Inside startCoalescing/endCoalescing: one efccl group, on the internal stream.
    // Every call of the block comes after what the caller's stream held when it was made.
    order_after(current, comm.stream());
    if (!coalescing_.group_open) {
      if (ncclResult_t g = lib.GroupStart(); g != ncclSuccess) {
        coalescing_ = Coalescing{};
        call_failed(spec, seq, {g, "ncclGroupStart"}, Clock::now() - started, timeout);
      }
      coalescing_.group_open = true;
      coalescing_.comm = &comm;
      coalescing_.stream = comm.stream();
      coalescing_.work = c10::make_intrusive<WorkEfccl>(
          state_, std::weak_ptr<Communicator>(comm_), watchdog_, c10d::OpType::COALESCED,
          "coalesced", seq, spec.device, comm.stream(), timeout, captured, options_->blocking_wait);
    }
    TORCH_CHECK(coalescing_.comm == &comm, "efccl: a coalescing block spans two communicators");
    EfcclResult r;
    try {
      c10::cuda::CUDAStreamGuard guard(*coalescing_.stream);
      CallMarker marker(watchdog_->call(), seq, spec.name, timeout);
      SelectionScope scope(state_.get());
      std::lock_guard<std::mutex> lock(comm.call_mutex());
      r = enqueue(comm.handle(), coalescing_.stream->stream());
    } catch (...) {
      (void)lib.GroupEnd();  // the block is over: later calls must not join an open group
      coalescing_ = Coalescing{};
      throw;
    }
    if (r.result != ncclSuccess) {
      (void)lib.GroupEnd();
      coalescing_ = Coalescing{};
      call_failed(spec, seq, r, Clock::now() - started, timeout);
    }
    for (const at::Tensor& t : spec.inputs) coalescing_.inputs.push_back(t);
    for (const at::Tensor& t : spec.outputs) coalescing_.outputs.push_back(t);
    state_->record_call(spec.name, spec.bytes, captured);
    return coalescing_.work;
  }

  // async_op=False runs on the caller's stream, as ProcessGroupNCCL does (nothing to order or
  // record); otherwise on the communicator's stream after what the caller's stream holds.
  const bool on_current = !spec.async_op;
  c10::cuda::CUDAStream stream = on_current ? current : comm.stream();
  order_after(current, stream);
  EfcclResult r;
  {
    c10::cuda::CUDAStreamGuard guard(stream);
    CallMarker marker(watchdog_->call(), seq, spec.name, timeout);
    SelectionScope scope(state_.get());
    std::lock_guard<std::mutex> lock(comm.call_mutex());
    r = enqueue(comm.handle(), stream.stream());
  }
  if (r.result != ncclSuccess) call_failed(spec, seq, r, Clock::now() - started, timeout);
  if (!on_current) {
    // The caller may drop the tensors at once: the allocator must not reuse their memory
    // before the communicator's stream is done with it.
    record_on(spec.inputs, stream);
    record_on(spec.outputs, stream);
  }
  auto work = c10::make_intrusive<WorkEfccl>(state_, std::weak_ptr<Communicator>(comm_), watchdog_,
                                             spec.type, spec.name, seq, spec.device, stream,
                                             timeout, captured, options_->blocking_wait);
  std::shared_ptr<cudaEvent_t> end = events_->acquire();
  C10_CUDA_CHECK(cudaEventRecord(*end, stream.stream()));
  work->set_end_event(std::move(end));
  work->set_outputs(spec.outputs);
  for (const at::Tensor& t : spec.inputs) work->stash(t);
  if (spec.barrier) work->set_barrier();
  if (!captured) watchdog_->track(work);
  state_->record_call(spec.name, spec.bytes, captured);
  return work;
}

void ProcessGroupEfccl::startCoalescing() {
  TORCH_CHECK(!coalescing_.active, "efccl: startCoalescing inside a coalescing block of ",
              state_->identity().describe());
  coalescing_ = Coalescing{};
  coalescing_.active = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupEfccl::endCoalescing() {
  TORCH_CHECK(coalescing_.active, "efccl: endCoalescing without startCoalescing on ",
              state_->identity().describe());
  Coalescing block = std::move(coalescing_);
  coalescing_ = Coalescing{};
  if (!block.group_open) {  // nothing was called: a work that has finished
    const at::Device device = default_device(std::nullopt);
    auto work = c10::make_intrusive<WorkEfccl>(
        state_, std::weak_ptr<Communicator>(comm_), watchdog_, c10d::OpType::COALESCED, "coalesced",
        seq_.load(), device, c10::cuda::getCurrentCUDAStream(device.index()),
        timeout_of(c10d::kUnsetTimeout), false, false);
    work->mark_finished();
    return work;
  }
  Communicator& comm = *block.comm;
  c10::cuda::CUDAStream stream = *block.stream;
  const uint64_t seq = block.work->getSequencenumber();
  const Clock::time_point started = Clock::now();
  ncclResult_t r;
  {
    c10::cuda::CUDAGuard device_guard(comm.device());
    c10::cuda::CUDAStreamGuard guard(stream);
    CallMarker marker(watchdog_->call(), seq, "coalesced", block.work->timeout());
    SelectionScope scope(state_.get());
    std::lock_guard<std::mutex> lock(comm.call_mutex());
    r = efccl_library().GroupEnd();
  }
  CallSpec spec;
  spec.name = "coalesced";
  if (r != ncclSuccess)
    call_failed(spec, seq, {r, "ncclGroupEnd"}, Clock::now() - started, block.work->timeout());
  record_on(block.inputs, stream);
  record_on(block.outputs, stream);
  std::shared_ptr<cudaEvent_t> end = events_->acquire();
  C10_CUDA_CHECK(cudaEventRecord(*end, stream.stream()));
  block.work->set_end_event(std::move(end));
  block.work->set_outputs(block.outputs);
  for (const at::Tensor& t : block.inputs) block.work->stash(t);
  if (!block.work->captured()) watchdog_->track(block.work);
  return block.work;
}

void ProcessGroupEfccl::terminate(bool abort, const std::string& why) {
  std::lock_guard<std::mutex> lock(lifecycle_mutex_);
  if (terminated_) return;
  terminated_ = true;
  std::shared_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> comm_lock(comm_mutex_);
    comm = comm_;
  }
  bool clean = !abort && !state_->failed();
  if (clean && comm)
    clean = watchdog_->drain(std::min<std::chrono::milliseconds>(timeout_of(c10d::kUnsetTimeout),
                                                                 std::chrono::seconds(60)));
  if (!clean) watchdog_->fail_group(why);  // unfinished works fail; kernels give up
  state_->fail(why);
  watchdog_->stop();
  if (comm) comm->destroy(!clean);
}

void ProcessGroupEfccl::shutdown() { terminate(false, "the process group was shut down"); }

void ProcessGroupEfccl::abort() { terminate(true, "the process group was aborted"); }

c10d::ErrorType ProcessGroupEfccl::getError() {
  if (!state_->failed()) return c10d::ErrorType::SUCCESS;
  return state_->failure().find("did not finish within") != std::string::npos
             ? c10d::ErrorType::TIMEOUT
             : c10d::ErrorType::COMM_ERROR;
}

std::string ProcessGroupEfccl::stats_json() const {
  std::string device, origin;
  if (const Communicator* c = comm_ptr_.load(std::memory_order_acquire)) {
    device = c->device().str();
    origin = c->origin();
  }
  return state_->stats_json(device, origin, watchdog_->pending());
}

}  // namespace efccl::torch_backend
