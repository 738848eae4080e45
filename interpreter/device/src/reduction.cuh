// Element types and reductions on the GPU, with exactly the host executor's rounding
// (docs/ef-format.md §7; interpreter/host/src/numeric.cc is the reference):
//  * integers wrap (computed in unsigned arithmetic, never UB);
//  * float and double operate natively with explicit round-to-nearest intrinsics, so that the
//    compiler cannot contract a premultiply and a sum into an FMA;
//  * half, bfloat16 and fp8 decode exactly to float, operate once, round once to nearest-even;
//    fp8 saturates to the largest finite value (__NV_SATFINITE), NaN stays NaN;
//  * min/max return one operand unchanged: if exactly one is NaN the other, -0 < +0, and on a
//    tie (or two NaNs) the left operand.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernel_params.h"

namespace efccl::device {

// ---- Element types: storage, and (narrow floats) exact conversion to and from float ----

template <typename T>
struct IntegerElement {
  using Storage = T;
};
template <typename T>
struct NativeFloatElement {
  using Storage = T;
};

struct HalfElement {
  using Storage = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint16_t from_float(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
};

struct BFloat16Element {
  using Storage = uint16_t;
  static __device__ __forceinline__ float to_float(uint16_t v) {
    return __bfloat162float(__ushort_as_bfloat16(v));
  }
  static __device__ __forceinline__ uint16_t from_float(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};

/// OCP fp8; decoding goes through half, which holds every fp8 value exactly.
template <__nv_fp8_interpretation_t kFormat>
struct Fp8Element {
  using Storage = uint8_t;
  static __device__ __forceinline__ float to_float(uint8_t v) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), kFormat)));
  }
  static __device__ __forceinline__ uint8_t from_float(float f) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, kFormat));
  }
};
using Fp8E4M3Element = Fp8Element<__NV_E4M3>;
using Fp8E5M2Element = Fp8Element<__NV_E5M2>;

template <typename E>
inline constexpr bool kIsInteger = false;
template <typename T>
inline constexpr bool kIsInteger<IntegerElement<T>> = true;
template <typename E>
inline constexpr bool kIsNativeFloat = false;
template <typename T>
inline constexpr bool kIsNativeFloat<NativeFloatElement<T>> = true;

// ---- Floating-point min/max: which operand to keep ----

/// True when IEEE minNum with -0 < +0 selects the right operand (ties and two NaNs: left).
template <typename F>
__device__ __forceinline__ bool min_picks_right(F x, F y) {
  if (isnan(y)) return false;
  if (isnan(x)) return true;
  if (y < x) return true;
  return y == x && signbit(y) && !signbit(x);
}
/// True when IEEE maxNum with -0 < +0 selects the right operand (ties and two NaNs: left).
template <typename F>
__device__ __forceinline__ bool max_picks_right(F x, F y) {
  if (isnan(y)) return false;
  if (isnan(x)) return true;
  if (y > x) return true;
  return y == x && signbit(x) && !signbit(y);
}

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// ---- The binary operator: left (received value, or dst for `reduce`) op right (src) ----

template <typename E, Reduction R>
__device__ __forceinline__ typename E::Storage reduce_element(typename E::Storage x,
                                                              typename E::Storage y) {
  using S = typename E::Storage;
  if constexpr (kIsInteger<E>) {
    // Wrap-around arithmetic in an unsigned type at least as wide as int.
    using Wide = std::conditional_t<sizeof(S) == 8, uint64_t, uint32_t>;
    if constexpr (R == kReduceSum) return static_cast<S>(static_cast<Wide>(x) + static_cast<Wide>(y));
    if constexpr (R == kReduceProd) return static_cast<S>(static_cast<Wide>(x) * static_cast<Wide>(y));
    if constexpr (R == kReduceMin) return y < x ? y : x;
    if constexpr (R == kReduceMax) return y > x ? y : x;
  } else if constexpr (kIsNativeFloat<E>) {
    if constexpr (R == kReduceSum) return add_rn(x, y);
    if constexpr (R == kReduceProd) return mul_rn(x, y);
    if constexpr (R == kReduceMin) return min_picks_right(x, y) ? y : x;
    if constexpr (R == kReduceMax) return max_picks_right(x, y) ? y : x;
  } else {
    const float a = E::to_float(x);
    const float b = E::to_float(y);
    if constexpr (R == kReduceSum) return E::from_float(__fadd_rn(a, b));
    if constexpr (R == kReduceProd) return E::from_float(__fmul_rn(a, b));
    // min/max keep an operand's encoding: no rounding, signed zeros and NaN payloads intact.
    if constexpr (R == kReduceMin) return min_picks_right(a, b) ? y : x;
    if constexpr (R == kReduceMax) return max_picks_right(a, b) ? y : x;
  }
}

// ---- premulsum's pre-multiplication: x * s, s already rounded into the type ----

/// The rank's scalar in the element type's arithmetic (as host::scale_elements rounds it).
template <typename E>
struct Scalar {
  using Value = std::conditional_t<
      kIsInteger<E>, typename E::Storage,
      std::conditional_t<std::is_same_v<typename E::Storage, double> && kIsNativeFloat<E>, double,
                         float>>;
  Value value;

  __device__ __forceinline__ explicit Scalar(const RankCallArgs& rank) {
    if constexpr (kIsInteger<E>) {
      value = static_cast<Value>(rank.scalar_i64);  // host: truncated to int64, then wrapped
    } else if constexpr (kIsNativeFloat<E>) {
      if constexpr (std::is_same_v<Value, double>) {
        value = rank.scalar_f64;
      } else {
        value = rank.scalar_f32;
      }
    } else {
      value = E::to_float(E::from_float(rank.scalar_f32));  // the scalar as the type holds it
    }
  }

  __device__ __forceinline__ typename E::Storage apply(typename E::Storage x) const {
    using S = typename E::Storage;
    if constexpr (kIsInteger<E>) {
      using Wide = std::conditional_t<sizeof(S) == 8, uint64_t, uint32_t>;
      return static_cast<S>(static_cast<Wide>(x) * static_cast<Wide>(value));
    } else if constexpr (kIsNativeFloat<E>) {
      return mul_rn(x, value);
    } else {
      return E::from_float(__fmul_rn(E::to_float(x), value));
    }
  }
};

// ---- Integer avg's final division (truncation toward zero) ----

template <typename E>
__device__ __forceinline__ typename E::Storage divide_element(typename E::Storage x,
                                                              uint64_t divisor) {
  using S = typename E::Storage;
  static_assert(kIsInteger<E>, "only integer avg divides after the reduction");
  if constexpr (std::is_signed_v<S>) {
    // |x| <= 2^63, so a divisor beyond INT64_MAX always truncates to 0 (host rule).
    if (divisor > static_cast<uint64_t>(INT64_MAX)) return 0;
    return static_cast<S>(static_cast<int64_t>(x) / static_cast<int64_t>(divisor));
  } else {
    return static_cast<S>(static_cast<uint64_t>(x) / divisor);
  }
}

}  // namespace efccl::device
