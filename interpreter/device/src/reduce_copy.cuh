// The data path of one unit over directly addressable memory (user buffers, scratch, Simple
// slots): out = scale?(left) [op scale?(right)] into a local destination and/or a remote slot,
// with every thread of the CTA. Simple programs move every unit this way; flagged programs their
// units without a connection (copy, reduce).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_params.h"
#include "reduction.cuh"

namespace efccl::device {
namespace {

/// The operands of one unit (one tile of one chunk). Null pointers are absent operands.
struct UnitOperands {
  const char* left = nullptr;   ///< the popped slot, dst (`reduce`) or src (send, copy)
  const char* right = nullptr;  ///< src for reducing ops
  char* dst = nullptr;          ///< local destination
  char* slot = nullptr;         ///< remote slot for pushing ops
  bool scale_left = false;      ///< premul: left is a pristine read of the rank's input
  bool scale_right = false;
};

/// How a unit combines its operands; chosen per unit so that the common cases (plain copies
/// and plain reductions) run loops without per-element branches.
enum class UnitKind { kCopy, kReduce, kGeneral };

/// out = scale?(left) [op scale?(right)] for one element.
template <typename E, Reduction R, UnitKind K>
__device__ __forceinline__ typename E::Storage combine(const UnitOperands& u,
                                                       const Scalar<E>& scalar,
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
__device__ __forceinline__ void reduce_copy_as(const UnitOperands& u, uint64_t n,
                                               const Scalar<E>& scalar) {
  using S = typename E::Storage;
  constexpr int kPack = 16 / sizeof(S);
  union Pack {
    uint4 raw;
    S element[kPack];
  };
  const auto address_bits =
      reinterpret_cast<uintptr_t>(u.left) | reinterpret_cast<uintptr_t>(u.right) |
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
    // Packs i, i + stride, ... i + (N - 1) * stride: N loads in flight, then N stores.
    const auto pass = [&](auto width, uint64_t i) {
      constexpr int N = decltype(width)::value;
      Pack v[N];
#pragma unroll
      for (int k = 0; k < N; ++k) v[k].raw = __ldcg(left + i + k * stride);
      if constexpr (K != UnitKind::kCopy) {
        Pack w[N];
#pragma unroll
        for (int k = 0; k < N; ++k)
          w[k].raw = right != nullptr ? __ldcg(right + i + k * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < N; ++k)
#pragma unroll
          for (int e = 0; e < kPack; ++e)
            v[k].element[e] = combine<E, R, K>(u, scalar, v[k].element[e], w[k].element[e]);
      }
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (dst != nullptr) __stcg(dst + i + k * stride, v[k].raw);
        if (slot != nullptr) __stcg(slot + i + k * stride, v[k].raw);
      }
    };
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < npacks; i += kUnroll * stride)
      pass(std::integral_constant<int, kUnroll>{}, i);
    // Fewer than kUnroll packs left for this thread (every pack of a unit under 32 KiB): in
    // passes of 4, 2 and 1, not one load-store round trip per pack (a store may alias the next
    // load, so the compiler cannot overlap them): a 16 KiB unit took 4 trips and ran slower
    // than a 32 KiB one (docs/performance.md, "Units under 32 KiB").
    if constexpr (kUnroll > 4) {
      if (i + 3 * stride < npacks) {
        pass(std::integral_constant<int, 4>{}, i);
        i += 4 * stride;
      }
    }
    if constexpr (kUnroll > 2) {
      if (i + stride < npacks) {
        pass(std::integral_constant<int, 2>{}, i);
        i += 2 * stride;
      }
    }
    if (i < npacks) pass(std::integral_constant<int, 1>{}, i);
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

/// Moves (and reduces) the `n` elements of a unit between memory the CTA can address directly
/// (user buffers, scratch, Simple slots), all threads of the CTA.
template <typename E, Reduction R>
__device__ __forceinline__ void reduce_copy(const UnitOperands& u, uint64_t n,
                                            const Scalar<E>& scalar) {
  if (u.scale_left || u.scale_right) {
    reduce_copy_as<E, R, UnitKind::kGeneral>(u, n, scalar);
  } else if (u.right != nullptr) {
    reduce_copy_as<E, R, UnitKind::kReduce>(u, n, scalar);
  } else {
    reduce_copy_as<E, R, UnitKind::kCopy>(u, n, scalar);
  }
}

/// mrc's unit: targets[*] = sources[0] (op) sources[1] (op) ... for `n` elements, with every
/// thread of the CTA. `ptrs` (shared memory): the nsrc sources, then the ndst targets;
/// when `scale` (premul calls) source s is scaled by the scalar of rank `ranks[source_local[s]]`
/// (shared memory too; the slow path, so the scalar is read where it is used). A target may be a
/// source too, at the same address only (validation), so each element is read before it is written
/// by the same thread. Sources are summed in order; every pointer 16-byte aligned takes the
/// vector loop.
template <typename E, Reduction R>
__device__ __forceinline__ void multi_reduce_copy(char* const* ptrs, int nsrc, int ndst, uint64_t n,
                                                  bool scale, const RankCallArgs* ranks,
                                                  const int32_t* source_local) {
  using S = typename E::Storage;
  constexpr int kPack = 16 / sizeof(S);
  union Pack {
    uint4 raw;
    S element[kPack];
  };
  const auto load_scaled = [&](int s, Pack v) {
    if (scale) {
      const Scalar<E> scalar(ranks[source_local[s]]);
#pragma unroll
      for (int e = 0; e < kPack; ++e) v.element[e] = scalar.apply(v.element[e]);
    }
    return v;
  };
  uintptr_t address_bits = 0;
  for (int k = 0; k < nsrc + ndst; ++k) address_bits |= reinterpret_cast<uintptr_t>(ptrs[k]);
  uint64_t scalar_begin = 0;
  if ((address_bits & 15) == 0) {
    const uint64_t npacks = n / kPack;
    constexpr int kUnroll = sizeof(S) == 1 ? 2 : sizeof(S) == 2 ? 4 : 8;
    const uint64_t stride = blockDim.x;
    const auto pass = [&](auto width, uint64_t i) {  // as in reduce_copy_as
      constexpr int N = decltype(width)::value;
      Pack acc[N];
      const auto* first = reinterpret_cast<const uint4*>(ptrs[0]);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k].raw = __ldcg(first + i + k * stride);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] = load_scaled(0, acc[k]);
      for (int s = 1; s < nsrc; ++s) {
        const auto* src = reinterpret_cast<const uint4*>(ptrs[s]);
        Pack w[N];
#pragma unroll
        for (int k = 0; k < N; ++k) w[k].raw = __ldcg(src + i + k * stride);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          w[k] = load_scaled(s, w[k]);
#pragma unroll
          for (int e = 0; e < kPack; ++e)
            acc[k].element[e] = reduce_element<E, R>(acc[k].element[e], w[k].element[e]);
        }
      }
      for (int d = 0; d < ndst; ++d) {
        auto* dst = reinterpret_cast<uint4*>(ptrs[nsrc + d]);
#pragma unroll
        for (int k = 0; k < N; ++k) __stcg(dst + i + k * stride, acc[k].raw);
      }
    };
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < npacks; i += kUnroll * stride)
      pass(std::integral_constant<int, kUnroll>{}, i);
    if constexpr (kUnroll > 4) {  // the packs left for this thread, as in reduce_copy_as
      if (i + 3 * stride < npacks) {
        pass(std::integral_constant<int, 4>{}, i);
        i += 4 * stride;
      }
    }
    if constexpr (kUnroll > 2) {
      if (i + stride < npacks) {
        pass(std::integral_constant<int, 2>{}, i);
        i += 2 * stride;
      }
    }
    if (i < npacks) pass(std::integral_constant<int, 1>{}, i);
    scalar_begin = npacks * kPack;
  }
  for (uint64_t i = scalar_begin + threadIdx.x; i < n; i += blockDim.x) {
    S acc = reinterpret_cast<const S*>(ptrs[0])[i];
    if (scale) acc = Scalar<E>(ranks[source_local[0]]).apply(acc);
    for (int s = 1; s < nsrc; ++s) {
      S w = reinterpret_cast<const S*>(ptrs[s])[i];
      if (scale) w = Scalar<E>(ranks[source_local[s]]).apply(w);
      acc = reduce_element<E, R>(acc, w);
    }
    for (int d = 0; d < ndst; ++d) reinterpret_cast<S*>(ptrs[nsrc + d])[i] = acc;
  }
}

}  // namespace
}  // namespace efccl::device
