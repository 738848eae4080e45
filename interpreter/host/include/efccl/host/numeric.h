// Element conversions and reductions with the GPU interpreter's rounding (docs/ef-format.md,
// "Datatypes and reductions"): half, bfloat16 and fp8 are computed in float and rounded once
// to nearest-even; fp8 saturates to the largest finite value; integers wrap.
//
// Conversions from float are bit-exact round-to-nearest-even, subnormals included. A NaN input
// becomes the canonical NaN the GPU's cvt instructions produce (0x7FFF for half and bfloat16,
// 0x7F for both fp8 formats); its sign and payload are not kept.
#pragma once

#include <cstddef>
#include <cstdint>

#include "efccl/ef/datatype.h"

namespace efccl::host {

uint16_t float_to_half(float f);      ///< overflow rounds to +-inf (IEEE binary16)
float half_to_float(uint16_t h);      ///< exact
uint16_t float_to_bfloat16(float f);  ///< overflow rounds to +-inf
float bfloat16_to_float(uint16_t b);  ///< exact
/// Round-to-nearest-even, saturating to +-448 (finite overflow and +-inf alike), NaN kept.
uint8_t float_to_fp8_e4m3(float f);
float fp8_e4m3_to_float(uint8_t v);  ///< exact; S.1111.111 decodes as NaN
/// Round-to-nearest-even, saturating to +-57344 (finite overflow and +-inf alike, as CUDA's
/// __NV_SATFINITE conversion), NaN kept. Stored infinities (S.11111.00) still decode as inf.
uint8_t float_to_fp8_e5m2(float f);
float fp8_e5m2_to_float(uint8_t v);  ///< exact

/// The value of the element of type t at p (any alignment): exact for every type except 64-bit
/// integers beyond 2^53, which round to the nearest double. The one element-to-double conversion
/// of the library (premulsum scalars, verification).
double element_to_double(ef::DataType t, const void* p);
/// Stores v as an element of type t at p: float and double round to nearest-even; half,
/// bfloat16 and fp8 go through float first, as a scalar reaches the GPU interpreter, then round
/// as float_to_*; integer types take premulsum_integer_scalar(v), wrapped to the type.
void double_to_element(ef::DataType t, double v, void* p);
/// premulsum's scalar as an integer type sees it: truncated toward zero into int64_t,
/// saturating at its limits, NaN -> 0 (the type then wraps it, as C++ conversion does).
int64_t premulsum_integer_scalar(double scalar);

/// dst[i] = dst[i] (op) src[i] for n elements of type t: dst is the left operand. avg and
/// premulsum reduce with sum (their scaling is separate). min/max on floating types follow IEEE
/// minNum/maxNum (a NaN operand loses to a number) with -0 < +0, and return one operand's bits.
void reduce_elements(ef::DataType t, ef::RedOp op, void* dst, const void* src, std::size_t n);
/// dst[i] = src[i] * scalar (premulsum's pre-multiplication). Floating types: the scalar is
/// rounded to the type first and the product rounded once. Integer types: the scalar is
/// truncated toward zero (saturating to int64_t, NaN -> 0), wrapped to the type, and the product
/// wraps. dst may equal src.
void scale_elements(ef::DataType t, double scalar, void* dst, const void* src, std::size_t n);
/// data[i] /= divisor: integer avg's final step, truncating toward zero as C++ integer division;
/// floating types divide and round once. A divisor of 0 leaves data unchanged.
void divide_elements(ef::DataType t, uint64_t divisor, void* data, std::size_t n);

}  // namespace efccl::host
