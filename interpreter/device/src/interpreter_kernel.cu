// The GPU interpreter of EF programs (docs/ef-format.md §4-5): one CTA per threadblock of every
// rank on this device. Each CTA walks iterations j = 0 .. iterations-1 and, in each, its op
// list; an op with count c processes tile j of its chunks k .. k+c-1, one unit at a time.
//
// Per unit, thread 0 waits (dependencies on the op's first unit, a filled slot for ops that
// pop, a free slot for ops that push), a barrier releases the CTA, all threads move the tile
// (16-byte vectors when every pointer allows, elements otherwise), a second barrier, and
// thread 0 publishes (tail to the receiver, head to the sender). After an op's last unit of an
// iteration thread 0 publishes the op's dependency flag when another op waits for it.
//
// Registers: 75-123 per thread depending on the element type (no local memory); the CTA size
// is chosen per (type, operator) by the executor so that the whole grid is co-resident.
//
// Protocols: every program runs over the Simple FIFO (slot payload = the executor's slot
// size). LL and LL128 programs compute the same result by definition (§5); their flag-based
// wire formats are not implemented yet.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "interpreter_kernel.h"
#include "reduction.cuh"
#include "sync_primitives.cuh"

namespace efccl::device {
namespace {

/// The operands of one unit (one tile of one chunk). Null pointers are absent operands.
struct Unit {
  const char* left = nullptr;  ///< the popped slot, dst (`reduce`) or src (send, copy)
  const char* right = nullptr; ///< src for reducing ops
  char* dst = nullptr;         ///< local destination
  char* slot = nullptr;        ///< remote slot for pushing ops
  bool scale_left = false;     ///< premul: left is a pristine read of the rank's input
  bool scale_right = false;
};

/// How a unit combines its operands; chosen per unit so that the common cases (plain copies
/// and plain reductions) run loops without per-element branches.
enum class UnitKind { kCopy, kReduce, kGeneral };

/// out = scale?(left) [op scale?(right)] for one element.
template <typename E, Reduction R, UnitKind K>
__device__ __forceinline__ typename E::Storage combine(const Unit& u, const Scalar<E>& scalar,
                                                      typename E::Storage left,
                                                      typename E::Storage right) {
  if constexpr (K == UnitKind::kCopy) {
    return left;
  } else if constexpr (K == UnitKind::kReduce) {
    return reduce_element<E, R>(left, right);
  } else {
    if (u.scale_left) left = scalar.apply(left);
    if (u.right == nullptr) return left;
    if (u.scale_right) right = scalar.apply(right);
    return reduce_element<E, R>(left, right);
  }
}

/// Moves (and reduces) `n` elements of a unit with all threads of the CTA: 16-byte vectors
/// when every operand is 16-byte aligned, then (or otherwise) one element per thread and step.
template <typename E, Reduction R, UnitKind K>
__device__ __forceinline__ void process_unit_as(const Unit& u, uint64_t n,
                                                const Scalar<E>& scalar) {
  using S = typename E::Storage;
  constexpr int kPack = 16 / sizeof(S);
  union Pack {
    uint4 raw;
    S element[kPack];
  };
  const auto address_bits = reinterpret_cast<uintptr_t>(u.left) |
                            reinterpret_cast<uintptr_t>(u.right) |
                            reinterpret_cast<uintptr_t>(u.dst) | reinterpret_cast<uintptr_t>(u.slot);
  uint64_t scalar_begin = 0;
  if ((address_bits & 15) == 0) {
    const uint64_t npacks = n / kPack;
    const auto* left = reinterpret_cast<const uint4*>(u.left);
    const auto* right = reinterpret_cast<const uint4*>(u.right);
    auto* dst = reinterpret_cast<uint4*>(u.dst);
    auto* slot = reinterpret_cast<uint4*>(u.slot);
    // Each thread keeps kUnroll independent 16-byte loads in flight before it stores: one load
    // at a time leaves a CTA latency-bound (about 6 GB/s measured on H200 NVLink). Narrow
    // types reduce 8 or 16 lanes per pack, so they unroll less to stay in registers.
    constexpr int kUnroll = K == UnitKind::kCopy ? 8 : sizeof(S) == 1 ? 2 : sizeof(S) == 2 ? 4 : 8;
    const uint64_t stride = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < npacks; i += kUnroll * stride) {
      Pack v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) v[k].raw = __ldcg(left + i + k * stride);
      if constexpr (K != UnitKind::kCopy) {
        Pack w[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
          w[k].raw = right != nullptr ? __ldcg(right + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
#pragma unroll
          for (int e = 0; e < kPack; ++e)
            v[k].element[e] = combine<E, R, K>(u, scalar, v[k].element[e], w[k].element[e]);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (dst != nullptr) __stcg(dst + i + k * stride, v[k].raw);
        if (slot != nullptr) __stcg(slot + i + k * stride, v[k].raw);
      }
    }
    for (; i < npacks; i += stride) {  // fewer than kUnroll packs left for this thread
      Pack v;
      v.raw = __ldcg(left + i);
      if constexpr (K != UnitKind::kCopy) {
        Pack w;
        w.raw = right != nullptr ? __ldcg(right + i) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int e = 0; e < kPack; ++e)
          v.element[e] = combine<E, R, K>(u, scalar, v.element[e], w.element[e]);
      }
      if (dst != nullptr) __stcg(dst + i, v.raw);
      if (slot != nullptr) __stcg(slot + i, v.raw);
    }
    scalar_begin = npacks * kPack;
  }
  // Unaligned operands (e.g. a user buffer offset by one element) and the vector tail.
  const S* left = reinterpret_cast<const S*>(u.left);
  const S* right = reinterpret_cast<const S*>(u.right);
  for (uint64_t i = scalar_begin + threadIdx.x; i < n; i += blockDim.x) {
    const S out = combine<E, R, K>(u, scalar, left[i], right != nullptr ? right[i] : S{});
    if (u.dst != nullptr) reinterpret_cast<S*>(u.dst)[i] = out;
    if (u.slot != nullptr) reinterpret_cast<S*>(u.slot)[i] = out;
  }
}

template <typename E, Reduction R>
__device__ __forceinline__ void process_unit(const Unit& u, uint64_t n, const Scalar<E>& scalar) {
  if (u.scale_left || u.scale_right) {
    process_unit_as<E, R, UnitKind::kGeneral>(u, n, scalar);
  } else if (u.right != nullptr) {
    process_unit_as<E, R, UnitKind::kReduce>(u, n, scalar);
  } else {
    process_unit_as<E, R, UnitKind::kCopy>(u, n, scalar);
  }
}

__device__ __forceinline__ bool op_pops(uint8_t code) {
  return code == kOpRecv || code == kOpRecvCopySend || code == kOpRecvReduceCopy ||
         code == kOpRecvReduceSend || code == kOpRecvReduceCopySend;
}
__device__ __forceinline__ bool op_pushes(uint8_t code) {
  return code == kOpSend || code == kOpRecvCopySend || code == kOpRecvReduceSend ||
         code == kOpRecvReduceCopySend;
}

/// Thread 0: waits until every dependency of `op` has completed iteration `site.iteration`.
__device__ __forceinline__ bool wait_dependencies(const KernelParams& p, const OpDesc& op,
                                                  uint64_t epoch, WaitSite site) {
  const uint64_t target = flag_value(epoch, site.iteration);
  for (uint32_t d = op.dep_begin; d < op.dep_begin + op.dep_count; ++d) {
    const DepDesc dep = p.deps[d];
    site.wait = kWaitDependency;
    site.peer = dep.tb;
    site.channel = dep.op;
    uint64_t* flag = p.flags + dep.flag;
    if (!spin_until(p, site, [&] { return flag_reached(load_acquire_device(flag), target); }))
      return false;
  }
  return true;
}

template <typename E, Reduction R>
__global__ void __launch_bounds__(kMaxThreadsPerBlock, 1)
    interpreter_kernel(const __grid_constant__ KernelParams p) {
  using S = typename E::Storage;
  const ThreadblockDesc tb = p.threadblocks[blockIdx.x];
  const RankCallArgs& rank = p.ranks[tb.local_rank];
  const SendConnection* send = tb.send >= 0 ? p.sends + tb.send : nullptr;
  const RecvConnection* recv = tb.recv >= 0 ? p.recvs + tb.recv : nullptr;
  const Scalar<E> scalar(rank);
  const bool leader = threadIdx.x == 0;
  // Written by the previous launch (stream order makes it visible); only thread 0 uses it.
  const uint64_t epoch = leader ? p.state->epoch : 0;
  // Every thread tracks the FIFO positions (they advance in lockstep); thread 0 persists them.
  uint64_t send_position = send != nullptr ? *send->position : 0;
  uint64_t recv_position = recv != nullptr ? *recv->position : 0;

  bool stopped = false;
  for (uint64_t j = 0; j < p.iterations && !stopped; ++j) {
    const uint64_t tile_begin = j * p.tile_elements;
    const uint64_t tile = min(p.tile_elements, p.chunk_elements - tile_begin);
    for (uint32_t i = 0; i < tb.op_count && !stopped; ++i) {
      const OpDesc op = p.ops[tb.op_begin + i];
      const bool pops = op_pops(op.code);
      const bool pushes = op_pushes(op.code);
      const int pristine = p.premul != 0 ? (op.premul >> p.premul_shift) & 3 : 0;
      const WaitSite site{tb.rank, tb.tb, static_cast<int32_t>(i), j, kWaitNone, -1, -1};
      const int64_t units = op.count > 0 ? op.count : 1;  // a nop waits once, moves nothing
      for (int64_t u = 0; u < units; ++u) {
        bool ready = true;
        if (leader) {
          ready = (u != 0 || wait_dependencies(p, op, epoch, site)) &&
                  (!pops || wait_filled_slot(p, *recv, recv_position, site)) &&
                  (!pushes || wait_free_slot(p, *send, send_position, site));
        }
        if (__syncthreads_or(!ready)) {
          stopped = true;
          break;
        }
        if (op.code == kOpNop) break;

        const uint64_t element_bytes = sizeof(S);
        auto local = [&](uint8_t buffer, int64_t chunk) {
          return rank.buffers[buffer] +
                 (static_cast<uint64_t>(chunk + u) * p.chunk_elements + tile_begin) * element_bytes;
        };
        Unit unit;
        const char* popped = pops ? slot_of(*recv, recv_position) : nullptr;
        unit.slot = pushes ? slot_of(*send, send_position) : nullptr;
        switch (op.code) {
          case kOpSend:
          case kOpCopy:
            unit.left = local(op.src_buffer, op.src_chunk);
            unit.scale_left = (pristine & kPremulSrc) != 0;
            if (op.code == kOpCopy) unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
          case kOpReduce:
            unit.left = unit.dst = local(op.dst_buffer, op.dst_chunk);
            unit.scale_left = (pristine & kPremulDst) != 0;
            unit.right = local(op.src_buffer, op.src_chunk);
            unit.scale_right = (pristine & kPremulSrc) != 0;
            break;
          case kOpRecv:
          case kOpRecvCopySend:
            unit.left = popped;
            unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
          default:  // rrc, rrs, rrcs: pop() op src
            unit.left = popped;
            unit.right = local(op.src_buffer, op.src_chunk);
            unit.scale_right = (pristine & kPremulSrc) != 0;
            if (op.code != kOpRecvReduceSend) unit.dst = local(op.dst_buffer, op.dst_chunk);
            break;
        }
        process_unit<E, R>(unit, tile, scalar);
        __syncthreads();
        if (leader) {
          if (pushes) post_filled_slot(*send, send_position);
          if (pops) post_free_slot(*recv, recv_position);
        }
        send_position += pushes ? 1 : 0;
        recv_position += pops ? 1 : 0;
      }
      if (!stopped && leader && op.publishes != 0)
        store_release_device(p.flags + tb.flag_begin + i, flag_value(epoch, j));
    }
  }

  if (leader) {
    if (send != nullptr) *send->position = send_position;
    if (recv != nullptr) *recv->position = recv_position;
    // The last CTA of the launch to finish opens the next epoch.
    __threadfence();
    if (atomicAdd(&p.state->arrived, 1u) == gridDim.x - 1) {
      p.state->arrived = 0;
      p.state->epoch = epoch + 1;
    }
  }
}

template <typename E>
__global__ void divide_kernel(const __grid_constant__ DivideParams p) {
  using S = typename E::Storage;
  for (uint32_t k = blockIdx.y; k < p.nsegments; k += gridDim.y) {
    const DivideSegment seg = p.segments[k];
    S* data = reinterpret_cast<S*>(p.outputs[seg.local_rank]) +
              static_cast<uint64_t>(seg.first_chunk) * p.chunk_elements;
    const uint64_t n = static_cast<uint64_t>(seg.chunks) * p.chunk_elements;
    for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
      data[i] = divide_element<E>(data[i], p.divisor);
  }
}

// ---- Run-time selection of the (element type, operator) instantiation ----

template <typename E>
struct ElementTag {
  using Type = E;
};

/// Calls fn(ElementTag<E>{}) for the ef::DataType value `dtype`.
template <typename Fn>
cudaError_t with_element(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0: return fn(ElementTag<IntegerElement<int8_t>>{});
    case 1: return fn(ElementTag<IntegerElement<uint8_t>>{});
    case 2: return fn(ElementTag<IntegerElement<int32_t>>{});
    case 3: return fn(ElementTag<IntegerElement<uint32_t>>{});
    case 4: return fn(ElementTag<IntegerElement<int64_t>>{});
    case 5: return fn(ElementTag<IntegerElement<uint64_t>>{});
    case 6: return fn(ElementTag<HalfElement>{});
    case 7: return fn(ElementTag<NativeFloatElement<float>>{});
    case 8: return fn(ElementTag<NativeFloatElement<double>>{});
    case 9: return fn(ElementTag<BFloat16Element>{});
    case 10: return fn(ElementTag<Fp8E4M3Element>{});
    case 11: return fn(ElementTag<Fp8E5M2Element>{});
    default: return cudaErrorInvalidValue;
  }
}

/// Calls fn(std::integral_constant<Reduction, R>{}) for the Reduction value `reduction`.
template <typename Fn>
cudaError_t with_reduction(int reduction, Fn&& fn) {
  switch (reduction) {
    case kReduceSum: return fn(std::integral_constant<Reduction, kReduceSum>{});
    case kReduceProd: return fn(std::integral_constant<Reduction, kReduceProd>{});
    case kReduceMin: return fn(std::integral_constant<Reduction, kReduceMin>{});
    case kReduceMax: return fn(std::integral_constant<Reduction, kReduceMax>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename E, Reduction R>
cudaError_t launch_typed(const KernelParams& params, int nblocks, int threads,
                         cudaStream_t stream) {
  interpreter_kernel<E, R><<<nblocks, threads, 0, stream>>>(params);
  return cudaGetLastError();
}

template <typename E, Reduction R>
cudaError_t occupancy_typed(int threads, int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, interpreter_kernel<E, R>, threads,
                                                       0);
}

}  // namespace

cudaError_t launch_interpreter(const KernelParams& params, int dtype, int reduction, int nblocks,
                               int threads, cudaStream_t stream) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      return launch_typed<E, decltype(r)::value>(params, nblocks, threads, stream);
    });
  });
}

cudaError_t interpreter_blocks_per_sm(int dtype, int reduction, int threads, int* blocks) {
  return with_element(dtype, [&](auto element) {
    using E = typename decltype(element)::Type;
    return with_reduction(reduction, [&](auto r) {
      return occupancy_typed<E, decltype(r)::value>(threads, blocks);
    });
  });
}

cudaError_t launch_divide(const DivideParams& params, int dtype, cudaStream_t stream) {
  if (params.nsegments == 0 || params.largest_segment_elements == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  constexpr uint64_t kMaxBlocksPerSegment = 1024;
  const uint64_t wanted = (params.largest_segment_elements + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(std::min(wanted, kMaxBlocksPerSegment)),
                  std::min(params.nsegments, 65535u));
  return with_element(dtype, [&](auto element) -> cudaError_t {
    using E = typename decltype(element)::Type;
    if constexpr (kIsInteger<E>) {
      divide_kernel<E><<<grid, kThreads, 0, stream>>>(params);
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace efccl::device
