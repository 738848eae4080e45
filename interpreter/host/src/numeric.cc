#include "efccl/host/numeric.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace efccl::host {
namespace {

/// A binary floating-point format narrower than float, described by its fields. One encoder and
/// one decoder serve half, bfloat16 and both fp8 formats, so that rounding is written once.
struct MiniFloat {
  int mantissa_bits;
  int exponent_bits;
  int min_normal_exponent;  ///< 1 - bias
  bool has_infinity;        ///< false: the all-ones magnitude is the only NaN (e4m3)
  uint32_t max_finite;      ///< magnitude encoding of the largest finite value
  uint32_t on_overflow;     ///< magnitude encoding for finite overflow and for infinite inputs
  uint32_t canonical_nan;   ///< what every NaN input becomes (the GPU's cvt instructions' NaN)

  int sign_shift() const { return exponent_bits + mantissa_bits; }
  uint32_t magnitude_mask() const { return (1u << sign_shift()) - 1; }
  uint32_t exponent_all_ones() const { return (1u << exponent_bits) - 1; }
};

// IEEE binary16: overflow rounds to infinity.
constexpr MiniFloat kHalf{10, 5, -14, true, 0x7BFF, 0x7C00, 0x7FFF};
// bfloat16 shares float's exponent, so only the mantissa is rounded.
constexpr MiniFloat kBFloat16{7, 8, -126, true, 0x7F7F, 0x7F80, 0x7FFF};
// OCP fp8 E4M3 (CUDA __nv_fp8_e4m3): no infinities, S.1111.111 is NaN, max 448; the interpreter
// converts with saturation (__NV_SATFINITE), so overflow and infinities become +-448.
constexpr MiniFloat kFp8E4M3{3, 4, -6, false, 0x7E, 0x7E, 0x7F};
// OCP fp8 E5M2 (CUDA __nv_fp8_e5m2): IEEE-like with infinities; converting with __NV_SATFINITE
// maps finite overflow *and* infinite inputs to +-57344. Stored infinities still decode as inf.
constexpr MiniFloat kFp8E5M2{2, 5, -14, true, 0x7B, 0x7B, 0x7F};

/// Round-to-nearest-even of `f` into `fmt`, subnormals included.
uint32_t encode(float f, const MiniFloat& fmt) {
  if (std::isnan(f)) return fmt.canonical_nan;
  const auto bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 31) << fmt.sign_shift();
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits == 0x7F800000u) return sign | fmt.on_overflow;
  if (abs_bits == 0) return sign;

  // |f| = significand * 2^(exponent - 23), with the implicit bit for normal floats.
  const auto exponent_field = static_cast<int>(abs_bits >> 23);
  const int exponent = exponent_field == 0 ? -126 : exponent_field - 127;
  const uint64_t significand =
      exponent_field == 0 ? (abs_bits & 0x7FFFFFu) : ((abs_bits & 0x7FFFFFu) | 0x800000u);

  // The target's spacing of representable values around |f| (fixed below the normal range).
  const int quantum = std::max(exponent, fmt.min_normal_exponent) - fmt.mantissa_bits;
  const int shift = quantum - (exponent - 23);  // >= 23 - mantissa_bits >= 13
  uint64_t units = 0;
  // significand < 2^24, so beyond this shift it is below half a quantum and rounds to zero.
  if (shift <= 25) {
    units = significand >> shift;
    const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (remainder > half || (remainder == half && (units & 1) != 0)) ++units;
  }
  // Exponent field and mantissa laid out so that a mantissa carry moves into the exponent and a
  // subnormal that rounds up becomes the smallest normal.
  const int smallest_quantum = fmt.min_normal_exponent - fmt.mantissa_bits;
  const uint64_t magnitude =
      (static_cast<uint64_t>(quantum - smallest_quantum) << fmt.mantissa_bits) + units;
  if (magnitude > fmt.max_finite) return sign | fmt.on_overflow;
  return sign | static_cast<uint32_t>(magnitude);
}

/// Exact value of an encoding of `fmt`.
float decode(uint32_t v, const MiniFloat& fmt) {
  const bool negative = ((v >> fmt.sign_shift()) & 1u) != 0;
  const uint32_t magnitude = v & fmt.magnitude_mask();
  const uint32_t exponent_field = magnitude >> fmt.mantissa_bits;
  const uint32_t mantissa = magnitude & ((1u << fmt.mantissa_bits) - 1);
  float value;
  if (fmt.has_infinity && exponent_field == fmt.exponent_all_ones()) {
    value = mantissa == 0 ? std::numeric_limits<float>::infinity()
                          : std::numeric_limits<float>::quiet_NaN();
  } else if (!fmt.has_infinity && magnitude == fmt.magnitude_mask()) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent_field == 0) {
    value = std::ldexp(static_cast<float>(mantissa), fmt.min_normal_exponent - fmt.mantissa_bits);
  } else {
    const uint32_t significand = mantissa | (1u << fmt.mantissa_bits);
    const int exponent = static_cast<int>(exponent_field) - 1 + fmt.min_normal_exponent;
    value = std::ldexp(static_cast<float>(significand), exponent - fmt.mantissa_bits);
  }
  return negative ? -value : value;
}

// ---- Binary operators on native values ----

/// IEEE minNum/maxNum with -0 < +0; when both are NaN the left operand is kept.
template <typename F>
F float_min(F a, F b) {
  if (std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  if (a < b) return a;
  if (b < a) return b;
  return std::signbit(a) ? a : b;  // equal: only +-0 can differ
}
template <typename F>
F float_max(F a, F b) {
  if (std::isnan(b)) return a;
  if (std::isnan(a)) return b;
  if (a > b) return a;
  if (b > a) return b;
  return std::signbit(a) ? b : a;
}

/// Sum, prod, min or max (avg and premulsum reduce with sum).
enum class Binary { kSum, kProd, kMin, kMax };

Binary binary_of(ef::RedOp op) {
  switch (op) {
    case ef::RedOp::kProd:
      return Binary::kProd;
    case ef::RedOp::kMin:
      return Binary::kMin;
    case ef::RedOp::kMax:
      return Binary::kMax;
    case ef::RedOp::kSum:
    case ef::RedOp::kAvg:
    case ef::RedOp::kPreMulSum:
      return Binary::kSum;
  }
  return Binary::kSum;
}

/// Integers wrap: computed in uint64_t (never UB) and truncated to the type.
template <typename T>
T integer_apply(Binary b, T x, T y) {
  switch (b) {
    case Binary::kSum:
      return static_cast<T>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
    case Binary::kProd:
      return static_cast<T>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
    case Binary::kMin:
      return y < x ? y : x;
    case Binary::kMax:
      return y > x ? y : x;
  }
  return x;
}

template <typename F>
F float_apply(Binary b, F x, F y) {
  switch (b) {
    case Binary::kSum:
      return x + y;
    case Binary::kProd:
      return x * y;
    case Binary::kMin:
      return float_min(x, y);
    case Binary::kMax:
      return float_max(x, y);
  }
  return x;
}

// Elements are accessed through memcpy: buffers are byte arrays of any alignment.
template <typename T>
T load(const void* base, std::size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(void* base, std::size_t i, T v) {
  std::memcpy(static_cast<unsigned char*>(base) + i * sizeof(T), &v, sizeof(T));
}

template <typename T>
void reduce_native(Binary b, void* dst, const void* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const T x = load<T>(dst, i);
    const T y = load<T>(src, i);
    if constexpr (std::is_integral_v<T>) {
      store(dst, i, integer_apply(b, x, y));
    } else {
      store(dst, i, float_apply(b, x, y));
    }
  }
}

/// Narrow floats: decode exactly to float, operate once, round once. min/max return one of the
/// operands' encodings unchanged (no rounding, and -0/+0 and NaN payloads are kept).
template <typename Storage>
void reduce_narrow(const MiniFloat& fmt, Binary b, void* dst, const void* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const Storage xs = load<Storage>(dst, i);
    const Storage ys = load<Storage>(src, i);
    const float x = decode(xs, fmt);
    const float y = decode(ys, fmt);
    Storage result;
    if (b == Binary::kMin || b == Binary::kMax) {
      const float chosen = b == Binary::kMin ? float_min(x, y) : float_max(x, y);
      const bool same_as_x = std::isnan(chosen)
                                 ? std::isnan(x)
                                 : (std::bit_cast<uint32_t>(chosen) == std::bit_cast<uint32_t>(x));
      result = same_as_x ? xs : ys;
    } else {
      result = static_cast<Storage>(encode(float_apply(b, x, y), fmt));
    }
    store(dst, i, result);
  }
}

template <typename T>
void scale_native(double scalar, void* dst, const void* src, std::size_t n) {
  if constexpr (std::is_integral_v<T>) {
    const auto s = static_cast<T>(premulsum_integer_scalar(scalar));
    for (std::size_t i = 0; i < n; ++i)
      store(dst, i, integer_apply(Binary::kProd, load<T>(src, i), s));
  } else {
    const T s = static_cast<T>(scalar);
    for (std::size_t i = 0; i < n; ++i) store(dst, i, static_cast<T>(load<T>(src, i) * s));
  }
}

template <typename Storage>
void scale_narrow(const MiniFloat& fmt, double scalar, void* dst, const void* src, std::size_t n) {
  // The scalar reaches the interpreter as a float and is then rounded into the type.
  const float s = decode(encode(static_cast<float>(scalar), fmt), fmt);
  for (std::size_t i = 0; i < n; ++i)
    store(dst, i, static_cast<Storage>(encode(decode(load<Storage>(src, i), fmt) * s, fmt)));
}

template <typename T>
void divide_native(uint64_t divisor, void* data, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const T x = load<T>(data, i);
    if constexpr (std::is_floating_point_v<T>) {
      store(data, i, static_cast<T>(x / static_cast<T>(divisor)));
    } else if constexpr (std::is_signed_v<T>) {
      // |x| <= 2^63, so a divisor beyond INT64_MAX always truncates to 0.
      const int64_t d = divisor > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                            ? 0
                            : static_cast<int64_t>(divisor);
      store(data, i, static_cast<T>(d == 0 ? 0 : static_cast<int64_t>(x) / d));
    } else {
      store(data, i, static_cast<T>(static_cast<uint64_t>(x) / divisor));
    }
  }
}

template <typename Storage>
void divide_narrow(const MiniFloat& fmt, uint64_t divisor, void* data, std::size_t n) {
  const auto d = static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i)
    store(data, i, static_cast<Storage>(encode(decode(load<Storage>(data, i), fmt) / d, fmt)));
}

}  // namespace

int64_t premulsum_integer_scalar(double scalar) {
  if (std::isnan(scalar)) return 0;
  constexpr double kLimit = 9223372036854775808.0;  // 2^63
  if (scalar >= kLimit) return std::numeric_limits<int64_t>::max();
  if (scalar < -kLimit) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(scalar);
}

double element_to_double(ef::DataType t, const void* p) {
  switch (t) {
    case ef::DataType::kInt8:
      return load<int8_t>(p, 0);
    case ef::DataType::kUint8:
      return load<uint8_t>(p, 0);
    case ef::DataType::kInt32:
      return load<int32_t>(p, 0);
    case ef::DataType::kUint32:
      return load<uint32_t>(p, 0);
    case ef::DataType::kInt64:
      return static_cast<double>(load<int64_t>(p, 0));
    case ef::DataType::kUint64:
      return static_cast<double>(load<uint64_t>(p, 0));
    case ef::DataType::kFloat16:
      return decode(load<uint16_t>(p, 0), kHalf);
    case ef::DataType::kFloat32:
      return load<float>(p, 0);
    case ef::DataType::kFloat64:
      return load<double>(p, 0);
    case ef::DataType::kBFloat16:
      return decode(load<uint16_t>(p, 0), kBFloat16);
    case ef::DataType::kFp8E4M3:
      return decode(load<uint8_t>(p, 0), kFp8E4M3);
    case ef::DataType::kFp8E5M2:
      return decode(load<uint8_t>(p, 0), kFp8E5M2);
  }
  return 0;
}

void double_to_element(ef::DataType t, double v, void* p) {
  const int64_t integer = premulsum_integer_scalar(v);
  const auto f = static_cast<float>(v);
  switch (t) {
    case ef::DataType::kInt8:
      return store(p, 0, static_cast<int8_t>(integer));
    case ef::DataType::kUint8:
      return store(p, 0, static_cast<uint8_t>(integer));
    case ef::DataType::kInt32:
      return store(p, 0, static_cast<int32_t>(integer));
    case ef::DataType::kUint32:
      return store(p, 0, static_cast<uint32_t>(integer));
    case ef::DataType::kInt64:
      return store(p, 0, integer);
    case ef::DataType::kUint64:
      return store(p, 0, static_cast<uint64_t>(integer));
    case ef::DataType::kFloat16:
      return store(p, 0, static_cast<uint16_t>(encode(f, kHalf)));
    case ef::DataType::kFloat32:
      return store(p, 0, f);
    case ef::DataType::kFloat64:
      return store(p, 0, v);
    case ef::DataType::kBFloat16:
      return store(p, 0, static_cast<uint16_t>(encode(f, kBFloat16)));
    case ef::DataType::kFp8E4M3:
      return store(p, 0, static_cast<uint8_t>(encode(f, kFp8E4M3)));
    case ef::DataType::kFp8E5M2:
      return store(p, 0, static_cast<uint8_t>(encode(f, kFp8E5M2)));
  }
}

uint16_t float_to_half(float f) { return static_cast<uint16_t>(encode(f, kHalf)); }
float half_to_float(uint16_t h) { return decode(h, kHalf); }
uint16_t float_to_bfloat16(float f) { return static_cast<uint16_t>(encode(f, kBFloat16)); }
float bfloat16_to_float(uint16_t b) { return decode(b, kBFloat16); }
uint8_t float_to_fp8_e4m3(float f) { return static_cast<uint8_t>(encode(f, kFp8E4M3)); }
float fp8_e4m3_to_float(uint8_t v) { return decode(v, kFp8E4M3); }
uint8_t float_to_fp8_e5m2(float f) { return static_cast<uint8_t>(encode(f, kFp8E5M2)); }
float fp8_e5m2_to_float(uint8_t v) { return decode(v, kFp8E5M2); }

void reduce_elements(ef::DataType t, ef::RedOp op, void* dst, const void* src, std::size_t n) {
  const Binary b = binary_of(op);
  switch (t) {
    case ef::DataType::kInt8:
      return reduce_native<int8_t>(b, dst, src, n);
    case ef::DataType::kUint8:
      return reduce_native<uint8_t>(b, dst, src, n);
    case ef::DataType::kInt32:
      return reduce_native<int32_t>(b, dst, src, n);
    case ef::DataType::kUint32:
      return reduce_native<uint32_t>(b, dst, src, n);
    case ef::DataType::kInt64:
      return reduce_native<int64_t>(b, dst, src, n);
    case ef::DataType::kUint64:
      return reduce_native<uint64_t>(b, dst, src, n);
    case ef::DataType::kFloat16:
      return reduce_narrow<uint16_t>(kHalf, b, dst, src, n);
    case ef::DataType::kFloat32:
      return reduce_native<float>(b, dst, src, n);
    case ef::DataType::kFloat64:
      return reduce_native<double>(b, dst, src, n);
    case ef::DataType::kBFloat16:
      return reduce_narrow<uint16_t>(kBFloat16, b, dst, src, n);
    case ef::DataType::kFp8E4M3:
      return reduce_narrow<uint8_t>(kFp8E4M3, b, dst, src, n);
    case ef::DataType::kFp8E5M2:
      return reduce_narrow<uint8_t>(kFp8E5M2, b, dst, src, n);
  }
}

void scale_elements(ef::DataType t, double scalar, void* dst, const void* src, std::size_t n) {
  switch (t) {
    case ef::DataType::kInt8:
      return scale_native<int8_t>(scalar, dst, src, n);
    case ef::DataType::kUint8:
      return scale_native<uint8_t>(scalar, dst, src, n);
    case ef::DataType::kInt32:
      return scale_native<int32_t>(scalar, dst, src, n);
    case ef::DataType::kUint32:
      return scale_native<uint32_t>(scalar, dst, src, n);
    case ef::DataType::kInt64:
      return scale_native<int64_t>(scalar, dst, src, n);
    case ef::DataType::kUint64:
      return scale_native<uint64_t>(scalar, dst, src, n);
    case ef::DataType::kFloat16:
      return scale_narrow<uint16_t>(kHalf, scalar, dst, src, n);
    case ef::DataType::kFloat32:
      return scale_native<float>(scalar, dst, src, n);
    case ef::DataType::kFloat64:
      return scale_native<double>(scalar, dst, src, n);
    case ef::DataType::kBFloat16:
      return scale_narrow<uint16_t>(kBFloat16, scalar, dst, src, n);
    case ef::DataType::kFp8E4M3:
      return scale_narrow<uint8_t>(kFp8E4M3, scalar, dst, src, n);
    case ef::DataType::kFp8E5M2:
      return scale_narrow<uint8_t>(kFp8E5M2, scalar, dst, src, n);
  }
}

void divide_elements(ef::DataType t, uint64_t divisor, void* data, std::size_t n) {
  if (divisor == 0) return;
  switch (t) {
    case ef::DataType::kInt8:
      return divide_native<int8_t>(divisor, data, n);
    case ef::DataType::kUint8:
      return divide_native<uint8_t>(divisor, data, n);
    case ef::DataType::kInt32:
      return divide_native<int32_t>(divisor, data, n);
    case ef::DataType::kUint32:
      return divide_native<uint32_t>(divisor, data, n);
    case ef::DataType::kInt64:
      return divide_native<int64_t>(divisor, data, n);
    case ef::DataType::kUint64:
      return divide_native<uint64_t>(divisor, data, n);
    case ef::DataType::kFloat16:
      return divide_narrow<uint16_t>(kHalf, divisor, data, n);
    case ef::DataType::kFloat32:
      return divide_native<float>(divisor, data, n);
    case ef::DataType::kFloat64:
      return divide_native<double>(divisor, data, n);
    case ef::DataType::kBFloat16:
      return divide_narrow<uint16_t>(kBFloat16, divisor, data, n);
    case ef::DataType::kFp8E4M3:
      return divide_narrow<uint8_t>(kFp8E4M3, divisor, data, n);
    case ef::DataType::kFp8E5M2:
      return divide_narrow<uint8_t>(kFp8E5M2, divisor, data, n);
  }
}

}  // namespace efccl::host
