// The resident interpreter grid (docs/device-executor.md, "The resident interpreter"): a
// long-lived kernel whose CTAs take descriptors (resident_queue.h) that streams post with
// memory operations, and run each descriptor's threadblocks exactly as the fused kernel runs its
// CTA (op_decoder.cuh's run_threadblock: one interpreter, launched or resident).
//
// Roles. Every CTA loops: it runs the work in its inbox when there is some; else the one CTA
// that holds the dispatcher lock scans the doorbells (request[]), copies a posted slot's
// content from host-mapped memory when its device copy is older, and hands the descriptor's
// CTAs 0 .. nctas-1 to idle CTAs of the grid, all at once or not at all (a descriptor's CTAs
// wait on each other, as in a launch); the other idle CTAs poll their inbox, backing off with
// __nanosleep. The last CTA of a run fences and sets the doorbell back to idle, which releases
// the waiting stream.
//
// Leaving. The host raises stop_generation (idle grid, last communicator gone, process exit).
// The dispatcher notices it (host-mapped, read at most every kStopCheckNs), marks the grid
// `exiting` and dispatches nothing more; every CTA leaves once its inbox is idle (a CAS to
// absent, so that no work can be handed to a CTA that left). Work handed out before that runs
// to its end (its waits are bounded by its executor's WaitBound: deadline and abort).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cuda/atomic>

#include "op_decoder.cuh"
#include "resident_kernel.h"
#include "resident_queue.h"
#include "scoped_atomics.cuh"

namespace efccl::device {
namespace {

/// How often the dispatcher reads the host's stop word (a PCIe round trip).
constexpr uint64_t kStopCheckNs = 20000;
/// Idle CTAs (and the dispatcher) poll without sleeping this long after their last work, then
/// back off...
constexpr uint64_t kSpinWindowNs = 100000;
/// ... doubling the sleep between polls up to this (a descriptor that arrives after a long
/// idle period waits at most about this much longer to be seen).
constexpr uint32_t kMaxIdleSleepNs = 2000;

enum Action : uint32_t { kActionNone = 0, kActionRun = 1, kActionDispatch = 2, kActionExit = 3 };

/// A CTA's shared memory: run_threadblock's staging, the call it runs and its ranks, and the
/// dispatcher's scratch. One object at file scope, so that the per-type functions below (not
/// inlined into one another) address it as shared memory.
struct ResidentShared {
  Staging staging;
  FusedCall call;
  RankCallArgs ranks[kMaxFusedRanks];
  // The work being run.
  uint32_t ncalls, nranks, flags;
  int32_t dtype, reduction;
  // Thread 0's decision, broadcast.
  uint64_t work;
  uint32_t action;
  // Idle back-off (thread 0).
  uint32_t sleep_ns;
  uint64_t idle_since;
  uint64_t last_stop_check;
  // The dispatcher's scan.
  uint32_t ncandidates, nfree, mine, stop, found, copy;
  uint32_t candidates[kResidentSlots];
  uint32_t versions[kResidentSlots];
  uint32_t free_ctas[kResidentMaxCtas];
};

__shared__ ResidentShared resident_shared;

template <typename T>
__device__ __forceinline__ T load_relaxed_device(T* p) {
  return cuda::atomic_ref<T, cuda::thread_scope_device>(*p).load(cuda::memory_order_relaxed);
}
template <typename T>
__device__ __forceinline__ void store_relaxed_device(T* p, T v) {
  cuda::atomic_ref<T, cuda::thread_scope_device>(*p).store(v, cuda::memory_order_relaxed);
}

// ---- Running a descriptor's CTA ----

/// Threadblock `index` of the call in resident_shared.call, in the (E, R) instantiation. Not
/// inlined: one function per (type, operator), each holding both protocols' walks, called from
/// the grid's one loop (inlining all 96 walks into the kernel would make one huge function).
template <typename E, Reduction R>
__device__ __noinline__ bool resident_threadblock(uint32_t index) {
  ResidentShared& sh = resident_shared;
  const RankCallArgs* ranks = sh.ranks + sh.call.rank_begin;
  return sh.call.flagged != 0
             ? run_threadblock<E, R, ProtoFlagged>(sh.call, ranks, index, sh.staging)
             : run_threadblock<E, R, ProtoSimple>(sh.call, ranks, index, sh.staging);
}

template <typename E>
__device__ __forceinline__ bool run_with_reduction(int reduction, uint32_t index) {
  switch (reduction) {
    case kReduceProd:
      return resident_threadblock<E, kReduceProd>(index);
    case kReduceMin:
      return resident_threadblock<E, kReduceMin>(index);
    case kReduceMax:
      return resident_threadblock<E, kReduceMax>(index);
    default:
      return resident_threadblock<E, kReduceSum>(index);
  }
}

/// The (datatype, operator) selection of kernel_dispatch.cuh's with_element / with_reduction,
/// made on the GPU: ef::DataType values in the same order.
__device__ bool run_resident_threadblock(int dtype, int reduction, uint32_t index) {
  switch (dtype) {
    case 0:
      return run_with_reduction<IntegerElement<int8_t>>(reduction, index);
    case 1:
      return run_with_reduction<IntegerElement<uint8_t>>(reduction, index);
    case 2:
      return run_with_reduction<IntegerElement<int32_t>>(reduction, index);
    case 3:
      return run_with_reduction<IntegerElement<uint32_t>>(reduction, index);
    case 4:
      return run_with_reduction<IntegerElement<int64_t>>(reduction, index);
    case 5:
      return run_with_reduction<IntegerElement<uint64_t>>(reduction, index);
    case 6:
      return run_with_reduction<HalfElement>(reduction, index);
    case 7:
      return run_with_reduction<NativeFloatElement<float>>(reduction, index);
    case 8:
      return run_with_reduction<NativeFloatElement<double>>(reduction, index);
    case 9:
      return run_with_reduction<BFloat16Element>(reduction, index);
    case 10:
      return run_with_reduction<Fp8E4M3Element>(reduction, index);
    case 11:
      return run_with_reduction<Fp8E5M2Element>(reduction, index);
    default:
      return false;  // the host posts only the types above
  }
}

/// Every thread: runs CTA `logical` of the descriptor in `slot`, as fused_kernel.cu runs its CTA:
/// the calls' threadblocks that fall on it, in call order; after a failure the later ones are
/// skipped and marked failed (kErrorSkipped), so that their peers stop at once.
__device__ void run_work(const ResidentGridParams& g, uint32_t slot, uint32_t logical) {
  ResidentShared& sh = resident_shared;
  const ResidentDescriptor& d = g.device->descriptors[slot];
  if (threadIdx.x == 0) {
    // Written by the dispatcher before it handed the work over (the inbox's acquire).
    sh.ncalls = min(d.ncalls, static_cast<uint32_t>(kMaxFusedCalls));
    sh.nranks = min(d.nranks, static_cast<uint32_t>(kMaxFusedRanks));
    sh.dtype = d.dtype;
    sh.reduction = d.reduction;
    sh.flags = d.flags;
  }
  __syncthreads();
  // Every thread, not only thread 0 (whose inbox load acquired): the tables' counters, epochs and
  // the user's buffers were last written by other CTAs, or before the doorbell by the stream's
  // earlier work, and this SM's L1 may hold older lines of them from an earlier run.
  cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
  stage<uint64_t>(sh.ranks, d.ranks, sh.nranks * static_cast<uint32_t>(sizeof(RankCallArgs)));
  const uint32_t ncalls = sh.ncalls;
  const int dtype = sh.dtype, reduction = sh.reduction;
  bool failed = false;  // CTA-uniform: run_threadblock's result comes from a barrier
  for (uint32_t c = 0; c < ncalls; ++c) {
    const FusedCall& call = d.calls[c];
    const uint32_t begin = call.cta_begin;
    if (logical < begin || logical - begin >= call.nthreadblocks) continue;
    const uint32_t index = logical - begin;
    if (failed) {
      if (threadIdx.x == 0) {
        const ThreadblockDesc tb = call.threadblocks[index];
        const WaitSite site{tb.rank, tb.tb, -1, 0, kWaitNone, -1, -1};
        call.bound.post_error(kErrorSkipped, site, global_timer_ns(), 0);
      }
      continue;
    }
    __syncthreads();  // the ranks staged, and the previous call done with sh.call and staging
    stage<uint64_t>(&sh.call, &call, static_cast<uint32_t>(sizeof(FusedCall)));
    __syncthreads();
    failed = !run_resident_threadblock(dtype, reduction, index);
    __syncthreads();
  }
}

/// Every thread, after run_work: this CTA is done with the slot's run. The last CTA of the run
/// makes every CTA's writes visible, then sets the doorbell idle (the waiting stream goes on),
/// then publishes the completion to the host (which may then rewrite the slot's content).
///
/// The fences' scopes (measured on H100 against a stream waiting on the doorbell,
/// docs/performance.md): a system-scope fence *before* the store the stream waits for costs
/// about 4 µs a run, one after it almost nothing. What the stream's later work reads is device
/// memory, ordered at device scope (the peers' writes into it were acquired at system scope by
/// the program's own waits); only buffers in host memory or on another GPU
/// (kDescriptorSystemFence) need the system-scope fence first, as a kernel's end would give them.
__device__ void finish_work(const ResidentGridParams& g, uint32_t slot, uint32_t me) {
  ResidentShared& sh = resident_shared;
  __syncthreads();
  if (threadIdx.x != 0) return;
  ResidentDeviceState* dev = g.device;
  __threadfence();  // this CTA's writes (the barrier gathered them) before its count
  if (atomicSub(&dev->remaining[slot], 1u) == 1u) {
    __threadfence();  // every CTA's writes (each fenced before its count) first
    if ((sh.flags & kDescriptorSystemFence) != 0) __threadfence_system();
    const uint32_t n = load_relaxed_device(&dev->completions[slot]) + 1;
    store_relaxed_device(&dev->completions[slot], n);
    store_relaxed_system(&dev->request[slot], kRequestIdle);
    // The doorbell is idle before the host can see the completion: the host rewrites a slot
    // only once every run of it is complete, and a later doorbell must not meet this store.
    __threadfence_system();
    store_relaxed_system(&g.host->completions[slot], n);
  }
  store_release_device(&dev->inbox[me], kInboxIdle);
}

// ---- Dispatching ----

/// Every thread: copies the slot's content from host-mapped memory into its device copy.
/// Uncached loads: the host rewrites the content between versions.
__device__ void copy_descriptor(const ResidentGridParams& g, uint32_t slot) {
  ResidentShared& sh = resident_shared;
  const auto* from = reinterpret_cast<const unsigned long long*>(&g.host->descriptors[slot]);
  auto* to = reinterpret_cast<unsigned long long*>(&g.device->descriptors[slot]);
  if (threadIdx.x == 0) {
    const ResidentDescriptor* h = &g.host->descriptors[slot];
    sh.ncalls = min(__ldcv(&h->ncalls), static_cast<uint32_t>(kMaxFusedCalls));
    sh.nranks = min(__ldcv(&h->nranks), static_cast<uint32_t>(kMaxFusedRanks));
  }
  __syncthreads();
  constexpr uint32_t kWord = sizeof(unsigned long long);
  constexpr uint32_t header = kResidentCallsOffset / kWord;
  const uint32_t calls = sh.ncalls * static_cast<uint32_t>(sizeof(FusedCall)) / kWord;
  const uint32_t ranks_at = kResidentRanksOffset / kWord;
  const uint32_t ranks = sh.nranks * static_cast<uint32_t>(sizeof(RankCallArgs)) / kWord;
  for (uint32_t i = threadIdx.x; i < header + calls; i += blockDim.x) to[i] = __ldcv(from + i);
  for (uint32_t i = threadIdx.x; i < ranks; i += blockDim.x)
    to[ranks_at + i] = __ldcv(from + ranks_at + i);
  __syncthreads();
}

/// Every thread, holding the dispatcher lock: one scan of the doorbells. Hands every posted
/// descriptor whose CTAs fit into the idle CTAs to them. Returns (CTA-uniform) whether it
/// handed work to this CTA; sh.found says whether any doorbell was posted.
__device__ bool dispatch_once(const ResidentGridParams& g, uint32_t me) {
  ResidentShared& sh = resident_shared;
  ResidentDeviceState* dev = g.device;
  if (threadIdx.x == 0) {
    sh.ncandidates = 0;
    sh.nfree = 0;
    sh.mine = 0;
  }
  __syncthreads();
  for (uint32_t s = threadIdx.x; s < kResidentSlots; s += blockDim.x) {
    const uint32_t r = load_relaxed_device(&dev->request[s]);
    if (r != kRequestIdle && r != kRequestTaken) {
      const uint32_t k = atomicAdd(&sh.ncandidates, 1u);
      sh.candidates[k] = s;
      sh.versions[k] = r;
    }
  }
  for (uint32_t c = threadIdx.x; c < g.nctas; c += blockDim.x)
    if (load_relaxed_device(&dev->inbox[c]) == kInboxIdle)
      sh.free_ctas[atomicAdd(&sh.nfree, 1u)] = c;
  __syncthreads();
  const uint32_t ncandidates = sh.ncandidates;
  if (threadIdx.x == 0) sh.found = ncandidates;
  if (ncandidates == 0) return false;
  for (uint32_t k = 0; k < ncandidates; ++k) {
    const uint32_t slot = sh.candidates[k];
    const uint32_t version = sh.versions[k];
    // Written only under the lock; other CTAs may have held it, so read past the L1.
    if (threadIdx.x == 0)
      sh.copy = load_relaxed_device(&dev->cached_version[slot]) != version ? 1 : 0;
    __syncthreads();
    if (sh.copy != 0) {
      // The content the host wrote before it enqueued the doorbell seen above (a repeated
      // content skips this system-scope fence as well as the copy).
      cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
      copy_descriptor(g, slot);
      if (threadIdx.x == 0) store_relaxed_device(&dev->cached_version[slot], version);
    }
    if (threadIdx.x == 0) {
      const uint32_t need = load_relaxed_device(&dev->descriptors[slot].nctas);
      // The host posts only descriptors with 1 .. g.nctas CTAs; one that waits for more CTAs
      // than are idle now is seen again at the next scan.
      if (need >= 1 && need <= sh.nfree) {
        store_relaxed_device(&dev->request[slot], kRequestTaken);
        store_relaxed_device(&dev->remaining[slot], need);
        __threadfence();  // the copy (the CTA's, gathered by the barriers) and the count first
        for (uint32_t i = 0; i < need; ++i) {
          const uint32_t cta = sh.free_ctas[--sh.nfree];
          if (cta == me) sh.mine = 1;
          store_relaxed_device(&dev->inbox[cta],
                               static_cast<uint64_t>(slot + 1) | (static_cast<uint64_t>(i) << 32));
        }
      }
    }
    __syncthreads();
  }
  return sh.mine != 0;
}

/// Every thread, holding the dispatcher lock: dispatches until it hands work to this CTA or the
/// host stops the grid; then releases the lock.
__device__ void dispatch(const ResidentGridParams& g, uint32_t me) {
  ResidentShared& sh = resident_shared;
  ResidentDeviceState* dev = g.device;
  uint32_t sleep_ns = 0;
  uint64_t last_found = 0;  // thread 0: when a scan last saw a posted doorbell
  if (threadIdx.x == 0) last_found = global_timer_ns();
  for (;;) {
    if (threadIdx.x == 0) {
      const uint64_t now = global_timer_ns();
      if (now - sh.last_stop_check >= kStopCheckNs) {
        sh.last_stop_check = now;
        const uint32_t stop = load_relaxed_system(&g.host->stop_generation);
        sh.stop = static_cast<int32_t>(stop - g.generation) >= 0 ? 1 : 0;
      }
    }
    __syncthreads();
    if (sh.stop != 0) break;
    if (dispatch_once(g, me)) break;
    if (threadIdx.x == 0) {
      // Back off only once nothing has been posted for the spin window (a posted descriptor
      // waiting for CTAs is seen again at once): a sleep of up to 2 µs between scans would
      // delay every call of a steady stream of calls by about half of it.
      const uint64_t now = global_timer_ns();
      if (sh.found != 0) last_found = now;
      sleep_ns = now - last_found <= kSpinWindowNs ? 0 : min(max(2 * sleep_ns, 32u), kMaxIdleSleepNs);
      if (sleep_ns > 0) __nanosleep(sleep_ns);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (sh.stop != 0) store_relaxed_device(&dev->exiting, g.generation);
    __threadfence();  // every inbox store and `exiting` before the lock is free
    store_release_device(&dev->lock, 0u);
  }
  __syncthreads();
}

/// Thread 0 of an idle CTA: what to do next.
__device__ uint32_t next_action(const ResidentGridParams& g, uint32_t me) {
  ResidentShared& sh = resident_shared;
  ResidentDeviceState* dev = g.device;
  const uint64_t w = load_acquire_device(&dev->inbox[me]);
  if (w != kInboxIdle) {
    sh.work = w;
    return kActionRun;
  }
  if (load_acquire_device(&dev->exiting) == g.generation) {
    // Leave, unless work was handed over meanwhile (then the next look runs it).
    auto* inbox = reinterpret_cast<unsigned long long*>(&dev->inbox[me]);
    return atomicCAS(inbox, kInboxIdle, kInboxAbsent) == kInboxIdle ? kActionExit : kActionNone;
  }
  // Test, then test-and-set: idle CTAs poll the lock while one holds it for long stretches.
  if (load_relaxed_device(&dev->lock) == 0u && atomicCAS(&dev->lock, 0u, 1u) == 0u) {
    // The lock's previous holder stored `exiting` before freeing it.
    cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
    if (load_relaxed_device(&dev->exiting) == g.generation) {
      store_release_device(&dev->lock, 0u);
      return kActionNone;
    }
    return kActionDispatch;
  }
  const uint64_t now = global_timer_ns();
  if (now - sh.idle_since > kSpinWindowNs) {
    sh.sleep_ns = min(max(2 * sh.sleep_ns, 32u), kMaxIdleSleepNs);
    __nanosleep(sh.sleep_ns);
  }
  return kActionNone;
}

__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    resident_kernel(const __grid_constant__ ResidentGridParams g) {
  ResidentShared& sh = resident_shared;
  const uint32_t me = blockIdx.x;
  if (threadIdx.x == 0) {
    sh.sleep_ns = 0;
    sh.idle_since = global_timer_ns();
    sh.last_stop_check = 0;
    sh.stop = 0;
    store_release_device(&g.device->inbox[me], kInboxIdle);  // present: work may come
  }
  for (;;) {
    if (threadIdx.x == 0) sh.action = next_action(g, me);
    __syncthreads();
    const uint32_t action = sh.action;
    const uint64_t work = sh.work;
    __syncthreads();  // thread 0 may write sh.action again only after everyone read it
    if (action == kActionExit) return;
    if (action == kActionDispatch) {
      dispatch(g, me);
    } else if (action == kActionRun) {
      const uint32_t slot = static_cast<uint32_t>(work & 0xffffffffu) - 1;
      run_work(g, slot, static_cast<uint32_t>(work >> 32));
      finish_work(g, slot, me);
      if (threadIdx.x == 0) {
        sh.sleep_ns = 0;
        sh.idle_since = global_timer_ns();
      }
    }
  }
}

}  // namespace

cudaError_t launch_resident_grid(const ResidentGridParams& params, cudaStream_t stream) {
  resident_kernel<<<params.nctas, kResidentThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t resident_blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, resident_kernel, kResidentThreads,
                                                       0);
}

}  // namespace efccl::device
