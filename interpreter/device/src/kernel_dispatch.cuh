// Run-time selection of a kernel's (element type, operator) instantiation: the host passes the
// call's ef::DataType and Reduction as integers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "kernel_params.h"
#include "reduction.cuh"

namespace efccl::device {
namespace {

template <typename E>
struct ElementTag {
  using Type = E;
};

/// Calls fn(ElementTag<E>{}) for the ef::DataType value `dtype`.
template <typename Fn>
cudaError_t with_element(int dtype, Fn&& fn) {
  switch (dtype) {
    case 0:
      return fn(ElementTag<IntegerElement<int8_t>>{});
    case 1:
      return fn(ElementTag<IntegerElement<uint8_t>>{});
    case 2:
      return fn(ElementTag<IntegerElement<int32_t>>{});
    case 3:
      return fn(ElementTag<IntegerElement<uint32_t>>{});
    case 4:
      return fn(ElementTag<IntegerElement<int64_t>>{});
    case 5:
      return fn(ElementTag<IntegerElement<uint64_t>>{});
    case 6:
      return fn(ElementTag<HalfElement>{});
    case 7:
      return fn(ElementTag<NativeFloatElement<float>>{});
    case 8:
      return fn(ElementTag<NativeFloatElement<double>>{});
    case 9:
      return fn(ElementTag<BFloat16Element>{});
    case 10:
      return fn(ElementTag<Fp8E4M3Element>{});
    case 11:
      return fn(ElementTag<Fp8E5M2Element>{});
    default:
      return cudaErrorInvalidValue;
  }
}

/// Calls fn(std::integral_constant<Reduction, R>{}) for the Reduction value `reduction`.
template <typename Fn>
cudaError_t with_reduction(int reduction, Fn&& fn) {
  switch (reduction) {
    case kReduceSum:
      return fn(std::integral_constant<Reduction, kReduceSum>{});
    case kReduceProd:
      return fn(std::integral_constant<Reduction, kReduceProd>{});
    case kReduceMin:
      return fn(std::integral_constant<Reduction, kReduceMin>{});
    case kReduceMax:
      return fn(std::integral_constant<Reduction, kReduceMax>{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace
}  // namespace efccl::device
