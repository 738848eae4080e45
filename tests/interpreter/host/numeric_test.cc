// Conversions and reductions against an independent oracle: each narrow format's values are
// computed from the textbook formula, and rounding picks the nearest of all representable values
// (ties to the even encoding), so the tests share no code with the implementation.
#include "efccl/host/numeric.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace efccl::host {
namespace {

using ef::DataType;
using ef::RedOp;

/// A narrow floating format as the oracle sees it.
struct Format {
  const char* name;
  DataType type;
  int exponent_bits;
  int mantissa_bits;
  bool has_infinity;  ///< IEEE-like: all-ones exponent is inf/NaN
  bool saturates;     ///< fp8: overflow and infinities become the largest finite value
  uint32_t canonical_nan;
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);

  int bits() const { return 1 + exponent_bits + mantissa_bits; }
  uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  int bias() const { return (1 << (exponent_bits - 1)) - 1; }
};

const Format kHalf{"half",
                   DataType::kFloat16,
                   5,
                   10,
                   true,
                   false,
                   0x7FFF,
                   [](float f) -> uint32_t { return float_to_half(f); },
                   [](uint32_t v) { return half_to_float(static_cast<uint16_t>(v)); }};
const Format kBf16{"bfloat16",
                   DataType::kBFloat16,
                   8,
                   7,
                   true,
                   false,
                   0x7FFF,
                   [](float f) -> uint32_t { return float_to_bfloat16(f); },
                   [](uint32_t v) { return bfloat16_to_float(static_cast<uint16_t>(v)); }};
const Format kE4M3{"f8e4m3",
                   DataType::kFp8E4M3,
                   4,
                   3,
                   false,
                   true,
                   0x7F,
                   [](float f) -> uint32_t { return float_to_fp8_e4m3(f); },
                   [](uint32_t v) { return fp8_e4m3_to_float(static_cast<uint8_t>(v)); }};
const Format kE5M2{"f8e5m2",
                   DataType::kFp8E5M2,
                   5,
                   2,
                   true,
                   true,
                   0x7F,
                   [](float f) -> uint32_t { return float_to_fp8_e5m2(f); },
                   [](uint32_t v) { return fp8_e5m2_to_float(static_cast<uint8_t>(v)); }};

/// Value of an encoding from the formula (-1)^s * 2^(e - bias) * (1.m), subnormals 2^(1-bias) *
/// 0.m.
double reference_value(const Format& f, uint32_t code) {
  const bool negative = (code & f.sign_bit()) != 0;
  const uint32_t e = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1);
  const uint32_t m = code & ((1u << f.mantissa_bits) - 1);
  const uint32_t e_max = (1u << f.exponent_bits) - 1;
  double v;
  if (f.has_infinity && e == e_max) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  } else if (!f.has_infinity && e == e_max && m == (1u << f.mantissa_bits) - 1) {
    v = std::nan("");
  } else {
    const double fraction = static_cast<double>(m) / std::pow(2.0, f.mantissa_bits);
    v = e == 0 ? std::pow(2.0, 1 - f.bias()) * fraction
               : std::pow(2.0, static_cast<int>(e) - f.bias()) * (1.0 + fraction);
  }
  return negative ? -v : v;
}

/// All positive finite values in encoding order (which is value order).
std::vector<double> positive_finite_values(const Format& f) {
  std::vector<double> values;
  for (uint32_t code = 0; code < f.sign_bit(); ++code) {
    const double v = reference_value(f, code);
    if (!std::isfinite(v)) break;
    values.push_back(v);
  }
  return values;
}

/// The correctly rounded encoding of x: nearest value, ties to the even encoding; beyond the
/// largest finite value IEEE formats round to inf at max + ulp/2, saturating formats clamp.
uint32_t reference_round(const Format& f, const std::vector<double>& table, double x) {
  if (std::isnan(x)) return f.canonical_nan;
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
  const double a = std::fabs(x);
  const auto max_code = static_cast<uint32_t>(table.size() - 1);
  const double max = table.back();
  if (a >= max) {
    const double ulp = max - table[table.size() - 2];
    if (!f.saturates && a >= max + ulp / 2) return sign | (max_code + 1);  // inf
    return sign | max_code;
  }
  const auto upper =
      static_cast<uint32_t>(std::upper_bound(table.begin(), table.end(), a) - table.begin());
  const uint32_t lower = upper - 1;
  const double below = a - table[lower];
  const double above = table[upper] - a;
  if (below < above) return sign | lower;
  if (above < below) return sign | upper;
  return sign | ((lower % 2 == 0) ? lower : upper);
}

class NarrowFormatTest : public ::testing::TestWithParam<const Format*> {};

TEST_P(NarrowFormatTest, EveryEncodingDecodesToItsValue) {
  const Format& f = *GetParam();
  for (uint32_t code = 0; code < (1u << f.bits()); ++code) {
    const double expected = reference_value(f, code);
    const float got = f.decode(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " code " << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << f.name << " code " << code;
      EXPECT_EQ(std::signbit(got), std::signbit(expected)) << f.name << " code " << code;
    }
  }
}

TEST_P(NarrowFormatTest, EveryFiniteEncodingRoundTripsThroughFloat) {
  const Format& f = *GetParam();
  for (uint32_t code = 0; code < (1u << f.bits()); ++code) {
    const float v = f.decode(code);
    if (std::isnan(v)) {
      EXPECT_EQ(f.encode(v), f.canonical_nan) << f.name << " NaN code " << code;
    } else if (std::isfinite(v)) {
      EXPECT_EQ(f.encode(v), code) << f.name << " code " << code;
    }
  }
}

TEST_P(NarrowFormatTest, MidpointsRoundToEvenAndNeighboursRoundToNearest) {
  const Format& f = *GetParam();
  const auto table = positive_finite_values(f);
  for (uint32_t code = 0; code + 1 < table.size(); ++code) {
    // The midpoint of two neighbours has one more significant bit: exact in float.
    const auto mid = static_cast<float>((table[code] + table[code + 1]) / 2);
    ASSERT_EQ(static_cast<double>(mid), (table[code] + table[code + 1]) / 2);
    const uint32_t even = code % 2 == 0 ? code : code + 1;
    for (const uint32_t sign : {0u, f.sign_bit()}) {
      const float s = sign != 0 ? -1.0f : 1.0f;
      EXPECT_EQ(f.encode(s * mid), sign | even) << f.name << " tie above code " << code;
      EXPECT_EQ(f.encode(s * std::nextafter(mid, 0.0f)), sign | code)
          << f.name << " just below the tie above code " << code;
      EXPECT_EQ(f.encode(s * std::nextafter(mid, INFINITY)), sign | (code + 1))
          << f.name << " just above the tie above code " << code;
    }
  }
}

TEST_P(NarrowFormatTest, RandomFloatsRoundCorrectly) {
  const Format& f = *GetParam();
  const auto table = positive_finite_values(f);
  std::mt19937_64 rng(42);
  for (int i = 0; i < 300000; ++i) {
    const auto bits = static_cast<uint32_t>(rng());
    // Half of the samples within the format's range, where rounding is interesting.
    const float x = (i % 2 == 0)
                        ? std::bit_cast<float>(bits)
                        : static_cast<float>(std::ldexp(static_cast<double>(bits) / 4294967296.0,
                                                        static_cast<int>(bits % 40) - 24));
    EXPECT_EQ(f.encode(x), reference_round(f, table, x))
        << f.name << " x=" << x << " bits=" << std::bit_cast<uint32_t>(x);
  }
}

TEST_P(NarrowFormatTest, InfinitiesAndNaN) {
  const Format& f = *GetParam();
  const auto table = positive_finite_values(f);
  const auto max_code = static_cast<uint32_t>(table.size() - 1);
  const uint32_t positive_overflow = f.saturates ? max_code : max_code + 1;
  EXPECT_EQ(f.encode(INFINITY), positive_overflow) << f.name;
  EXPECT_EQ(f.encode(-INFINITY), f.sign_bit() | positive_overflow) << f.name;
  EXPECT_EQ(f.encode(std::numeric_limits<float>::max()), positive_overflow) << f.name;
  EXPECT_EQ(f.encode(std::nanf("")), f.canonical_nan) << f.name;
  EXPECT_EQ(f.encode(-std::nanf("")), f.canonical_nan) << f.name;
  EXPECT_EQ(f.encode(-0.0f), f.sign_bit()) << f.name;
  EXPECT_EQ(f.encode(std::numeric_limits<float>::denorm_min()), 0u) << f.name;
}

INSTANTIATE_TEST_SUITE_P(Formats, NarrowFormatTest,
                         ::testing::Values(&kHalf, &kBf16, &kE4M3, &kE5M2),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(NarrowFormats, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65519.99f), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // the tie above the largest half rounds to inf
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24: even
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x7F7F8000u)), 0x7F80);  // tie -> inf
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
  EXPECT_EQ(float_to_fp8_e4m3(464.0f), 0x7E);  // would round to 480: saturates
  EXPECT_EQ(float_to_fp8_e4m3(-1e9f), 0xFE);
  EXPECT_EQ(fp8_e5m2_to_float(0x7B), 57344.0f);
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_float(0x7C)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7D)));
  EXPECT_EQ(float_to_fp8_e5m2(61440.0f), 0x7B);  // would round to inf: saturates
  EXPECT_EQ(float_to_fp8_e5m2(-INFINITY), 0xFB);
}

// ---- Reductions: every pair of 8-bit values ----

/// minNum/maxNum with -0 < +0 as the oracle: returns true when the left operand is the result.
bool left_wins(double x, double y, bool is_min) {
  if (std::isnan(y)) return true;
  if (std::isnan(x)) return false;
  if (x == y) return std::signbit(x) == is_min;  // only +-0 differ: min keeps -0, max keeps +0
  return is_min ? x < y : x > y;
}

class Fp8PairsTest : public ::testing::TestWithParam<const Format*> {};

TEST_P(Fp8PairsTest, EveryPairForEveryOperator) {
  const Format& f = *GetParam();
  const auto table = positive_finite_values(f);
  std::vector<uint8_t> left, right;
  for (uint32_t a = 0; a < 256; ++a)
    for (uint32_t b = 0; b < 256; ++b) {
      left.push_back(static_cast<uint8_t>(a));
      right.push_back(static_cast<uint8_t>(b));
    }
  for (const RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax}) {
    std::vector<uint8_t> result = left;
    reduce_elements(f.type, op, result.data(), right.data(), result.size());
    int mismatches = 0;
    for (std::size_t i = 0; i < result.size(); ++i) {
      const double x = reference_value(f, left[i]);
      const double y = reference_value(f, right[i]);
      uint32_t expected;
      if (op == RedOp::kSum) {
        expected = reference_round(f, table, x + y);  // exact in double
      } else if (op == RedOp::kProd) {
        expected = reference_round(f, table, x * y);  // exact in double
      } else {
        expected = left_wins(x, y, op == RedOp::kMin) ? left[i] : right[i];
      }
      if (result[i] != expected && ++mismatches <= 5)
        ADD_FAILURE() << f.name << " " << ef::to_string(op) << "(" << int{left[i]} << ", "
                      << int{right[i]} << "): expected " << expected << ", got " << int{result[i]};
    }
    EXPECT_EQ(mismatches, 0) << f.name << " " << ef::to_string(op);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8PairsTest, ::testing::Values(&kE4M3, &kE5M2),
                         [](const auto& info) { return std::string(info.param->name); });

// ---- Reductions: random pairs of 16-bit floats ----

class SixteenBitPairsTest : public ::testing::TestWithParam<const Format*> {};

TEST_P(SixteenBitPairsTest, RandomPairsRoundOnce) {
  const Format& f = *GetParam();
  const auto table = positive_finite_values(f);
  std::mt19937_64 rng(7);
  constexpr std::size_t kPairs = 200000;
  std::vector<uint16_t> left(kPairs), right(kPairs);
  for (std::size_t i = 0; i < kPairs; ++i) {
    left[i] = static_cast<uint16_t>(rng());
    // Every fourth pair has close exponents, so that sums carry and cancel.
    right[i] = (i % 4 == 0) ? static_cast<uint16_t>((left[i] & 0xFF00) ^ (rng() & 0x80FF))
                            : static_cast<uint16_t>(rng());
  }
  for (const RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax}) {
    std::vector<uint16_t> result = left;
    reduce_elements(f.type, op, result.data(), right.data(), kPairs);
    int mismatches = 0;
    for (std::size_t i = 0; i < kPairs; ++i) {
      const double x = reference_value(f, left[i]);
      const double y = reference_value(f, right[i]);
      uint32_t expected;
      if (op == RedOp::kSum) {
        expected = reference_round(f, table, x + y);
      } else if (op == RedOp::kProd) {
        expected = reference_round(f, table, x * y);
      } else {
        expected = left_wins(x, y, op == RedOp::kMin) ? left[i] : right[i];
      }
      if (result[i] != expected && ++mismatches <= 5)
        ADD_FAILURE() << f.name << " " << ef::to_string(op) << "(" << left[i] << ", " << right[i]
                      << "): expected " << expected << ", got " << result[i];
    }
    EXPECT_EQ(mismatches, 0) << f.name << " " << ef::to_string(op);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, SixteenBitPairsTest, ::testing::Values(&kHalf, &kBf16),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(Reductions, AvgAndPreMulSumReduceWithSum) {
  for (const RedOp op : {RedOp::kAvg, RedOp::kPreMulSum}) {
    float dst[2] = {1.5f, -2.0f};
    const float src[2] = {2.25f, 0.5f};
    reduce_elements(DataType::kFloat32, op, dst, src, 2);
    EXPECT_EQ(dst[0], 3.75f);
    EXPECT_EQ(dst[1], -1.5f);
  }
}

// ---- Integers wrap ----

template <typename T>
void check_all_8bit_pairs(DataType type) {
  std::vector<T> left, right;
  for (int a = 0; a < 256; ++a)
    for (int b = 0; b < 256; ++b) {
      left.push_back(static_cast<T>(a));
      right.push_back(static_cast<T>(b));
    }
  for (const RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMin, RedOp::kMax}) {
    std::vector<T> result = left;
    reduce_elements(type, op, result.data(), right.data(), result.size());
    for (std::size_t i = 0; i < result.size(); ++i) {
      const int x = left[i], y = right[i];  // exact in int; the cast to T wraps modulo 256
      const int exact = op == RedOp::kSum    ? x + y
                        : op == RedOp::kProd ? x * y
                        : op == RedOp::kMin  ? std::min(x, y)
                                             : std::max(x, y);
      ASSERT_EQ(result[i], static_cast<T>(exact))
          << ef::to_string(type) << " " << ef::to_string(op) << "(" << x << ", " << y << ")";
    }
  }
}

TEST(Reductions, Int8AndUint8EveryPair) {
  check_all_8bit_pairs<int8_t>(DataType::kInt8);
  check_all_8bit_pairs<uint8_t>(DataType::kUint8);
}

template <typename T>
T reduce_one(DataType type, RedOp op, T x, T y) {
  reduce_elements(type, op, &x, &y, 1);
  return x;
}

TEST(Reductions, WideIntegersWrapAndCompareAsTheirType) {
  constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();
  constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
  constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(reduce_one<int32_t>(DataType::kInt32, RedOp::kSum, kI32Max, 1), kI32Min);
  EXPECT_EQ(reduce_one<int32_t>(DataType::kInt32, RedOp::kProd, kI32Min, -1), kI32Min);
  EXPECT_EQ(reduce_one<int32_t>(DataType::kInt32, RedOp::kProd, 65536, 65536), 0);
  EXPECT_EQ(reduce_one<int32_t>(DataType::kInt32, RedOp::kMin, -1, 1), -1);
  EXPECT_EQ(reduce_one<uint32_t>(DataType::kUint32, RedOp::kMin, 0xFFFFFFFFu, 1u), 1u);
  EXPECT_EQ(reduce_one<uint32_t>(DataType::kUint32, RedOp::kSum, 0xFFFFFFFFu, 2u), 1u);
  EXPECT_EQ(reduce_one<int64_t>(DataType::kInt64, RedOp::kSum, kI64Max, kI64Max), -2);
  EXPECT_EQ(reduce_one<int64_t>(DataType::kInt64, RedOp::kProd, kI64Min, -1), kI64Min);
  EXPECT_EQ(reduce_one<int64_t>(DataType::kInt64, RedOp::kMax, -5, kI64Min), -5);
  EXPECT_EQ(reduce_one<uint64_t>(DataType::kUint64, RedOp::kProd, kU64Max, 2u), kU64Max - 1);
  EXPECT_EQ(reduce_one<uint64_t>(DataType::kUint64, RedOp::kMax, kU64Max, 0u), kU64Max);
}

// ---- float and double ----

template <typename F>
void check_native_min_max(DataType type) {
  const F nan = std::numeric_limits<F>::quiet_NaN();
  EXPECT_EQ(reduce_one<F>(type, RedOp::kMin, nan, F(2)), F(2));
  EXPECT_EQ(reduce_one<F>(type, RedOp::kMin, F(2), nan), F(2));
  EXPECT_EQ(reduce_one<F>(type, RedOp::kMax, nan, F(-3)), F(-3));
  EXPECT_TRUE(std::isnan(reduce_one<F>(type, RedOp::kMax, nan, nan)));
  EXPECT_TRUE(std::signbit(reduce_one<F>(type, RedOp::kMin, F(0), F(-0.0))));
  EXPECT_TRUE(std::signbit(reduce_one<F>(type, RedOp::kMin, F(-0.0), F(0))));
  EXPECT_FALSE(std::signbit(reduce_one<F>(type, RedOp::kMax, F(-0.0), F(0))));
  EXPECT_FALSE(std::signbit(reduce_one<F>(type, RedOp::kMax, F(0), F(-0.0))));
  EXPECT_EQ(reduce_one<F>(type, RedOp::kMax, -std::numeric_limits<F>::infinity(), F(-7)), F(-7));
  EXPECT_TRUE(std::isnan(reduce_one<F>(type, RedOp::kSum, std::numeric_limits<F>::infinity(),
                                       -std::numeric_limits<F>::infinity())));
}

TEST(Reductions, FloatAndDoubleMinMaxFollowMinNumWithSignedZeros) {
  check_native_min_max<float>(DataType::kFloat32);
  check_native_min_max<double>(DataType::kFloat64);
}

TEST(Reductions, NarrowMinMaxKeepSignedZerosAndIgnoreOneNaN) {
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, RedOp::kMin, 0x0000, 0x8000), 0x8000);
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, RedOp::kMax, 0x8000, 0x0000), 0x0000);
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kBFloat16, RedOp::kMin, 0x7FC0, 0x3F80), 0x3F80);
  EXPECT_EQ(reduce_one<uint8_t>(DataType::kFp8E4M3, RedOp::kMax, 0x38, 0x7F), 0x38);
  // Both NaN: the left operand is kept, payload included.
  EXPECT_EQ(reduce_one<uint16_t>(DataType::kFloat16, RedOp::kMax, 0x7E01, 0xFE02), 0x7E01);
}

TEST(Reductions, FloatSumIsRoundedPerOperation) {
  // 2^24 + 1 is not a float: each sum rounds (to even) before the next one.
  float acc = 16777216.0f;
  const float one = 1.0f;
  reduce_elements(DataType::kFloat32, RedOp::kSum, &acc, &one, 1);
  EXPECT_EQ(acc, 16777216.0f);
  double big = 1e308;
  const double ten = 10.0;
  reduce_elements(DataType::kFloat64, RedOp::kProd, &big, &ten, 1);
  EXPECT_TRUE(std::isinf(big));
}

// ---- scale_elements and divide_elements ----

TEST(Scale, FloatingScalarIsRoundedToTheTypeThenTheProductOnce) {
  // half(1/3) = 0x3555 = 0.333251953125; 3 * that = 0.999755859375 -> half 0.99951171875 or 1.0:
  // the exact product lies 0.000244140625 below 1, which is exactly the tie; even is 1.0 (0x3C00).
  const uint16_t three = float_to_half(3.0f);
  uint16_t out = 0;
  scale_elements(DataType::kFloat16, 1.0 / 3.0, &out, &three, 1);
  EXPECT_EQ(out, 0x3C00);
  const uint8_t big = float_to_fp8_e4m3(320.0f);
  uint8_t scaled = 0;
  scale_elements(DataType::kFp8E4M3, 2.0, &scaled, &big, 1);
  EXPECT_EQ(scaled, 0x7E);  // 640 saturates to 448
  double d = 3.0;
  scale_elements(DataType::kFloat64, 0.1, &d, &d, 1);
  EXPECT_EQ(d, 3.0 * 0.1);
  float f = 3.0f;
  scale_elements(DataType::kFloat32, 0.1, &f, &f, 1);
  EXPECT_EQ(f, 3.0f * 0.1f);
}

TEST(Scale, IntegerScalarTruncatesAndTheProductWraps) {
  const int8_t values[3] = {100, -7, 5};
  int8_t out[3] = {};
  scale_elements(DataType::kInt8, 3.9, out, values, 3);
  EXPECT_EQ(out[0], 44);  // 300 mod 256
  EXPECT_EQ(out[1], -21);
  EXPECT_EQ(out[2], 15);
  scale_elements(DataType::kInt8, -2.9, out, values, 3);
  EXPECT_EQ(out[2], -10);
  const uint64_t u = 5;
  uint64_t uo = 0;
  scale_elements(DataType::kUint64, std::nan(""), &uo, &u, 1);
  EXPECT_EQ(uo, 0u);
}

TEST(ElementConversion, PremulsumIntegerScalarTruncatesAndSaturates) {
  EXPECT_EQ(premulsum_integer_scalar(3.9), 3);
  EXPECT_EQ(premulsum_integer_scalar(-2.9), -2);
  EXPECT_EQ(premulsum_integer_scalar(std::nan("")), 0);
  EXPECT_EQ(premulsum_integer_scalar(1e30), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(premulsum_integer_scalar(-1e30), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(premulsum_integer_scalar(9223372036854775808.0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(premulsum_integer_scalar(-9223372036854775808.0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(premulsum_integer_scalar(std::numeric_limits<double>::infinity()),
            std::numeric_limits<int64_t>::max());
}

TEST(ElementConversion, EveryTypeReadsItsValue) {
  const int8_t i8 = -100;
  const uint8_t u8 = 200;
  const int32_t i32 = -2000000000;
  const uint32_t u32 = 4000000000u;
  const int64_t i64 = -(int64_t{1} << 60);
  const uint64_t u64 = (uint64_t{1} << 63) + 1;  // rounds to 2^63
  const uint16_t half = 0x3C00 | 0x8000;          // -1.0
  const float f = 0.1f;
  const double d = 0.1;
  const uint16_t bf = 0x4049;  // 3.140625
  const uint8_t e4m3 = 0x7E;   // 448
  const uint8_t e5m2 = 0x7B;   // 57344
  EXPECT_EQ(element_to_double(DataType::kInt8, &i8), -100.0);
  EXPECT_EQ(element_to_double(DataType::kUint8, &u8), 200.0);
  EXPECT_EQ(element_to_double(DataType::kInt32, &i32), -2000000000.0);
  EXPECT_EQ(element_to_double(DataType::kUint32, &u32), 4000000000.0);
  EXPECT_EQ(element_to_double(DataType::kInt64, &i64), -std::ldexp(1.0, 60));
  EXPECT_EQ(element_to_double(DataType::kUint64, &u64), std::ldexp(1.0, 63));
  EXPECT_EQ(element_to_double(DataType::kFloat16, &half), -1.0);
  EXPECT_EQ(element_to_double(DataType::kFloat32, &f), static_cast<double>(0.1f));
  EXPECT_EQ(element_to_double(DataType::kFloat64, &d), 0.1);
  EXPECT_EQ(element_to_double(DataType::kBFloat16, &bf), 3.140625);
  EXPECT_EQ(element_to_double(DataType::kFp8E4M3, &e4m3), 448.0);
  EXPECT_EQ(element_to_double(DataType::kFp8E5M2, &e5m2), 57344.0);
  // Any alignment.
  unsigned char bytes[9] = {};
  std::memcpy(bytes + 1, &d, sizeof d);
  EXPECT_EQ(element_to_double(DataType::kFloat64, bytes + 1), 0.1);
}

TEST(ElementConversion, StoringRoundsAsTheGpuReceivesAScalar) {
  const auto stored = [](DataType t, double v) {
    unsigned char bytes[8] = {};
    double_to_element(t, v, bytes);
    return element_to_double(t, bytes);
  };
  // Exact values survive every type.
  for (int t = 0; t < ef::kNumDataTypes; ++t)
    for (double v : {0.0, 1.0, 2.0, 96.0})
      EXPECT_EQ(stored(static_cast<DataType>(t), v), v) << ef::to_string(static_cast<DataType>(t));
  // Integers: truncation toward zero, then the type wraps.
  EXPECT_EQ(stored(DataType::kInt8, -2.9), -2.0);
  EXPECT_EQ(stored(DataType::kInt8, 300.5), 44.0);
  EXPECT_EQ(stored(DataType::kUint32, -1.0), 4294967295.0);
  EXPECT_EQ(stored(DataType::kInt64, std::nan("")), 0.0);
  // Floating types round to nearest-even; the narrow ones through float, saturating fp8.
  EXPECT_EQ(stored(DataType::kFloat32, 0.1), static_cast<double>(0.1f));
  EXPECT_EQ(stored(DataType::kFloat64, 0.1), 0.1);
  EXPECT_EQ(stored(DataType::kFloat16, 1.0 + std::ldexp(1.0, -11)), 1.0);  // tie to even
  EXPECT_EQ(stored(DataType::kBFloat16, 3.14159), 3.140625);
  EXPECT_EQ(stored(DataType::kFp8E4M3, 1000.0), 448.0);
  EXPECT_EQ(stored(DataType::kFp8E5M2, 1e9), 57344.0);
  EXPECT_TRUE(std::isinf(stored(DataType::kFloat16, 1e9)));
}

TEST(Divide, IntegersTruncateTowardZero) {
  int8_t i8[4] = {-7, 7, -128, 127};
  divide_elements(DataType::kInt8, 2, i8, 4);
  EXPECT_EQ(i8[0], -3);
  EXPECT_EQ(i8[1], 3);
  EXPECT_EQ(i8[2], -64);
  EXPECT_EQ(i8[3], 63);
  int64_t i64 = std::numeric_limits<int64_t>::min();
  divide_elements(DataType::kInt64, 3, &i64, 1);
  EXPECT_EQ(i64, std::numeric_limits<int64_t>::min() / 3);
  uint32_t u32 = 0xFFFFFFFFu;
  divide_elements(DataType::kUint32, 16, &u32, 1);
  EXPECT_EQ(u32, 0x0FFFFFFFu);
  int32_t unchanged = 9;
  divide_elements(DataType::kInt32, 0, &unchanged, 1);
  EXPECT_EQ(unchanged, 9);
}

TEST(Divide, FloatingTypesRoundOnce) {
  uint16_t h = float_to_half(1.0f);
  divide_elements(DataType::kFloat16, 3, &h, 1);
  EXPECT_EQ(h, float_to_half(1.0f / 3.0f));
  float f = 1.0f;
  divide_elements(DataType::kFloat32, 3, &f, 1);
  EXPECT_EQ(f, 1.0f / 3.0f);
}

}  // namespace
}  // namespace efccl::host
