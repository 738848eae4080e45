// Element conversions and reductions with the GPU interpreter's rounding (docs/ef-format.md,
// "Datatypes and reductions"): half, bfloat16 and fp8 are computed in float and rounded once
// to nearest-even; fp8 saturates to the largest finite value; integers wrap.
#pragma once

#include <cstdint>

#include "efccl/ef/datatype.h"

namespace efccl::host {

uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(uint16_t b);
uint8_t float_to_fp8_e4m3(float f);  ///< round-to-nearest-even, saturating to +-448, NaN kept
float fp8_e4m3_to_float(uint8_t v);
uint8_t float_to_fp8_e5m2(float f);  ///< round-to-nearest-even, saturating to +-57344, NaN kept
float fp8_e5m2_to_float(uint8_t v);

/// dst[i] = dst[i] (op) src[i] for n elements of type t (op is sum, prod, min or max:
/// avg/premulsum reduce with sum after the pre-multiplication).
void reduce_elements(ef::DataType t, ef::RedOp op, void* dst, const void* src, std::size_t n);
/// dst[i] = src[i] * scalar, rounded to t (premulsum's pre-multiplication).
void scale_elements(ef::DataType t, double scalar, void* dst, const void* src, std::size_t n);
/// Integer avg: dst[i] /= divisor (truncating toward zero, as C++ integer division).
void divide_elements(ef::DataType t, uint64_t divisor, void* data, std::size_t n);

}  // namespace efccl::host
