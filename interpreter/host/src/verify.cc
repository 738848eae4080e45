// run_and_verify: seeded inputs, one execution, and a comparison with the collective's definition
// (docs/ef-format.md §6) computed independently of the program: exact integer arithmetic, and
// for floating reductions inputs chosen so that the result is one exact value whatever the
// reduction order (a rounding bound only for sources the generator cannot shape, and a bound
// as large as the result is a failure, never a pass).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>

#include "efccl/host/executor.h"
#include "efccl/host/numeric.h"

namespace efccl::host {
namespace {

using ef::Collective;
using ef::DataType;
using ef::RedOp;

/// What the rounding bound and the input generator need to know about a floating type.
struct FloatFormat {
  int precision;               ///< significand bits, implicit bit included
  int min_subnormal_exponent;  ///< the smallest positive value is 2^this
  double max_finite;
  /// |e| such that products of nranks values +-2^e, |e| <= budget / nranks, stay normal.
  int product_exponent_budget;
};

FloatFormat float_format(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return {11, -24, 65504.0, 14};
    case DataType::kBFloat16:
      return {8, -133, 3.3895313892515355e38, 126};
    case DataType::kFp8E4M3:
      return {4, -9, 448.0, 6};
    case DataType::kFp8E5M2:
      return {3, -16, 57344.0, 14};
    case DataType::kFloat32:
      return {24, -149, 3.4028234663852886e38, 126};
    default:
      return {53, -1074, 1.7976931348623157e308, 1022};
  }
}

// ---- Elements as bytes (little-endian, like every platform efccl runs on) ----

uint64_t read_bits(const uint8_t* p, std::size_t size) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < size; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void write_bits(uint64_t v, uint8_t* p, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

bool is_signed_integer(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
}

/// Sign-extends a `size`-byte two's complement value.
int64_t as_signed(uint64_t bits, std::size_t size) {
  const unsigned shift = 64 - 8 * static_cast<unsigned>(size);
  return static_cast<int64_t>(bits << shift) >> shift;
}

uint64_t truncate_bits(uint64_t v, std::size_t size) {
  return size == 8 ? v : v & ((uint64_t{1} << (8 * size)) - 1);
}

std::string format_element(DataType t, const uint8_t* p) {
  const std::size_t size = ef::size_of(t);
  const uint64_t bits = read_bits(p, size);
  char text[64];
  if (!ef::is_floating(t)) {
    if (is_signed_integer(t)) return std::to_string(as_signed(bits, size));
    return std::to_string(bits);
  }
  std::snprintf(text, sizeof text, "%.*g (0x%0*llx)", t == DataType::kFloat64 ? 17 : 9,
                element_to_double(t, p), static_cast<int>(2 * size),
                static_cast<unsigned long long>(bits));
  return text;
}

// ---- The collective's definition ----

/// One input element that contributes to an output element.
struct Source {
  int rank;
  uint64_t index;  ///< element of that rank's API input
};

/// Calls fn(rank, output index, sources) for every output element the collective defines, in
/// rank then index order. Sources are listed in rank order.
template <typename Fn>
void for_each_defined_output(const ef::Program& p, uint64_t count, uint64_t chunk_elements,
                             Fn&& fn) {
  const int n = p.nranks;
  std::vector<Source> sources;
  const auto all_ranks = [&](uint64_t index) {
    sources.clear();
    for (int q = 0; q < n; ++q) sources.push_back({q, index});
  };
  const auto one = [&](int rank, uint64_t index) { sources.assign(1, Source{rank, index}); };
  for (int r = 0; r < n; ++r) {
    const auto r64 = static_cast<uint64_t>(r);
    switch (p.collective) {
      case Collective::kAllReduce:
        for (uint64_t k = 0; k < count; ++k) {
          all_ranks(k);
          fn(r, k, sources);
        }
        break;
      case Collective::kReduceScatter:
        for (uint64_t k = 0; k < count; ++k) {
          all_ranks(r64 * count + k);
          fn(r, k, sources);
        }
        break;
      case Collective::kReduce:
        for (uint64_t k = 0; r == p.root && k < count; ++k) {
          all_ranks(k);
          fn(r, k, sources);
        }
        break;
      case Collective::kAllGather:
      case Collective::kGather:
        if (p.collective == Collective::kGather && r != p.root) break;
        for (int q = 0; q < n; ++q)
          for (uint64_t k = 0; k < count; ++k) {
            one(q, k);
            fn(r, static_cast<uint64_t>(q) * count + k, sources);
          }
        break;
      case Collective::kAllToAll:
        for (int q = 0; q < n; ++q)
          for (uint64_t k = 0; k < count; ++k) {
            one(q, r64 * count + k);
            fn(r, static_cast<uint64_t>(q) * count + k, sources);
          }
        break;
      case Collective::kBroadcast:
        for (uint64_t k = 0; k < count; ++k) {
          one(p.root, k);
          fn(r, k, sources);
        }
        break;
      case Collective::kScatter:
        for (uint64_t k = 0; k < count; ++k) {
          one(p.root, r64 * count + k);
          fn(r, k, sources);
        }
        break;
      case Collective::kCustom:
        for (const ef::Postcondition& pc : p.postconditions) {
          if (pc.rank != r) continue;
          for (uint64_t e = 0; e < chunk_elements; ++e) {
            sources.clear();
            for (const ef::ChunkSource& s : pc.sources)
              sources.push_back({s.rank, static_cast<uint64_t>(s.index) * chunk_elements + e});
            fn(r, static_cast<uint64_t>(pc.index) * chunk_elements + e, sources);
          }
        }
        break;
    }
  }
}

// ---- Inputs ----

/// splitmix64: a per-element hash, so that values every rank agrees on (an element's sign, its
/// contributing ranks) need no shared state between the ranks' fills.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Fills each rank's input so that the expected result can be computed exactly, for any number
/// of ranks and any reduction order:
/// * no reduction, or integers: random bits (copies must be bit-exact; integer arithmetic wraps
///   exactly whatever the values);
/// * floating min/max: random finite encodings (subnormals and signed zeros included);
/// * floating sum/avg/premulsum and prod: per element only `active` ranks contribute a value
///   that changes the result (the others hold 0 for sums, +-1 for products), all of the same
///   sign (sums) or exponent direction (products), so that
///   - sum: at most `active` terms of magnitude <= L with active * L <= 2^precision: every
///     partial sum in every order is an exactly representable integer;
///   - avg/premulsum: at most 2 nonzero terms: each term is rounded once and the one addition
///     is commutative, so the result is one correctly rounded value whatever the order;
///   - prod: +-2^e with e of one direction and sum of |e| within the normal range: exact.
///   Because the contributions share one sign, a result is never a cancellation: dropping or
///   duplicating a contribution always changes it, and a rank's own input alone (a "copy")
///   never equals the reduction of two or more.
/// An element's key (its index in the API input; for custom programs its position inside its
/// chunk, which is what a postcondition's sources share) selects the contributing ranks by
/// rotation, so every run of ceil(n / active) consecutive keys covers every rank.
class InputGenerator {
 public:
  InputGenerator(DataType t, RedOp op, bool reduces, int nranks, uint64_t seed,
                 uint64_t key_modulus)
      : type_(t),
        op_(op),
        reduces_(reduces),
        n_(static_cast<uint64_t>(std::max(nranks, 1))),
        key_modulus_(key_modulus),
        seed_(mix(seed)),
        rng_(seed) {
    const FloatFormat f = float_format(t);
    const uint64_t exact_integers = uint64_t{1} << std::min(f.precision, 62);
    if (op == RedOp::kProd) {
      const auto budget = static_cast<uint64_t>(f.product_exponent_budget);
      active_ = std::min<uint64_t>(n_, std::max<uint64_t>(2, budget / 3));
      limit_ = std::min<uint64_t>(3, budget / active_);  // >= 1: every budget is >= 6
    } else if (op == RedOp::kSum) {
      limit_ = f.precision <= 4 ? 4 : 8;
      active_ = std::min<uint64_t>(n_, std::max<uint64_t>(2, exact_integers / limit_));
    } else {  // avg, premulsum
      limit_ = f.precision <= 4 ? 4 : 8;
      active_ = std::min<uint64_t>(n_, 2);
    }
    offset_ = seed_ % n_;
  }

  void fill(int rank, uint8_t* data, uint64_t elements) {
    const std::size_t size = ef::size_of(type_);
    if (!reduces_ || !ef::is_floating(type_)) {
      for (uint64_t i = 0; i < elements; ++i) write_bits(rng_(), data + i * size, size);
      return;
    }
    for (uint64_t i = 0; i < elements; ++i) {
      uint8_t* element = data + i * size;
      if (op_ == RedOp::kMin || op_ == RedOp::kMax) {
        do {
          write_bits(rng_(), element, size);
        } while (!std::isfinite(element_to_double(type_, element)));
        continue;
      }
      const uint64_t key = key_modulus_ != 0 ? i % key_modulus_ : i;
      const uint64_t shared = mix(seed_ ^ key);  // the same on every rank
      const bool negative = (shared & 1) != 0;
      const bool active = is_active(rank, key);
      if (op_ == RedOp::kProd) {
        const double sign = (rng_() & 1) != 0 ? -1.0 : 1.0;
        int exponent = 0;
        if (active) {
          exponent = 1 + static_cast<int>(rng_() % limit_);
          if (negative) exponent = -exponent;
        }
        double_to_element(type_, sign * std::ldexp(1.0, exponent), element);
      } else {
        double value = 0.0;
        if (active) value = static_cast<double>(1 + rng_() % limit_) * (negative ? -1.0 : 1.0);
        double_to_element(type_, value, element);
      }
    }
  }

 private:
  /// Whether `rank` contributes at `key`: ranks offset + key * active + j (mod n), j < active.
  bool is_active(int rank, uint64_t key) const {
    const uint64_t first = (offset_ + (key % n_) * active_) % n_;
    const uint64_t distance = (static_cast<uint64_t>(rank) % n_ + n_ - first) % n_;
    return distance < active_;
  }

  DataType type_;
  RedOp op_;
  bool reduces_;
  uint64_t n_;
  uint64_t key_modulus_;  ///< 0: an element's key is its index
  uint64_t seed_;
  std::mt19937_64 rng_;
  uint64_t active_ = 1;  ///< ranks contributing per element
  uint64_t limit_ = 1;   ///< largest magnitude (sums) or exponent (products)
  uint64_t offset_ = 0;
};

// ---- Comparison ----

/// The exponent of the lowest set bit of a nonzero finite double.
int lowest_bit_exponent(double v) {
  int exponent = 0;
  const double mantissa = std::frexp(std::fabs(v), &exponent);  // in [0.5, 1)
  const auto significand = static_cast<uint64_t>(std::ldexp(mantissa, 53));
  return exponent - 53 + std::countr_zero(significand);
}

/// Collects mismatches; keeps the first one's description.
class Mismatches {
 public:
  void add(int rank, uint64_t index, const std::string& expected, const std::string& got) {
    if (count_++ == 0)
      first_ = "rank " + std::to_string(rank) + " output[" + std::to_string(index) +
               "]: expected " + expected + ", got " + got;
  }
  uint64_t count() const { return count_; }
  std::string message() const {
    std::string m = "FAIL: " + first_;
    if (count_ > 1) m += " (and " + std::to_string(count_ - 1) + " more mismatches)";
    return m;
  }

 private:
  uint64_t count_ = 0;
  std::string first_;
};

class Verifier {
 public:
  Verifier(const ef::Program& p, const ExecOptions& o, uint64_t chunk_elements)
      : program_(p),
        options_(o),
        chunk_elements_(chunk_elements),
        size_(ef::size_of(o.dtype)),
        reduces_(collective_reduces(p.collective)) {
    const bool premul = reduces_ && (o.op == RedOp::kPreMulSum ||
                                     (o.op == RedOp::kAvg && ef::is_floating(o.dtype)));
    // The per-rank scalar as the type holds it: scaling 1 by it rounds it exactly as execute().
    for (int r = 0; r < p.nranks; ++r) {
      double s = 1.0;
      if (premul && o.op == RedOp::kAvg) s = 1.0 / p.nranks;
      if (premul && o.op == RedOp::kPreMulSum && !o.premul_scalars.empty())
        s = o.premul_scalars[static_cast<std::size_t>(r)];
      std::vector<uint8_t> one(size_), scaled(size_);
      if (ef::is_floating(o.dtype)) {
        double_to_element(o.dtype, 1.0, one.data());
      } else {
        write_bits(1, one.data(), size_);
      }
      scale_elements(o.dtype, s, scaled.data(), one.data(), 1);
      scalar_bits_.push_back(read_bits(scaled.data(), size_));
      scalar_values_.push_back(ef::is_floating(o.dtype) ? element_to_double(o.dtype, scaled.data()) : s);
    }
  }

  /// Compares every defined output element of `buffers` with the definition over `inputs`.
  Mismatches compare(const std::vector<std::vector<uint8_t>>& inputs,
                     const std::vector<RankBuffers>& buffers) const {
    Mismatches mismatches;
    std::vector<uint8_t> expected(size_);
    std::vector<ApiLayout> layouts;
    for (int r = 0; r < program_.nranks; ++r)
      layouts.push_back(api_layout(program_, r, options_.count, options_.inplace));
    for_each_defined_output(
        program_, options_.count, chunk_elements_,
        [&](int r, uint64_t index, const std::vector<Source>& sources) {
          const ApiLayout& l = layouts[static_cast<std::size_t>(r)];
          if (index >= l.output_elements) {
            mismatches.add(r, index, "an element inside the API output", "none (out of range)");
            return;
          }
          const uint8_t* got = buffers[static_cast<std::size_t>(r)].output.data() +
                               ((l.shared ? l.output_offset : 0) + index) * size_;
          for (const Source& s : sources) {
            if (s.rank < 0 || s.rank >= program_.nranks ||
                (s.index + 1) * size_ > inputs[static_cast<std::size_t>(s.rank)].size()) {
              mismatches.add(
                  r, index, "sources inside the API inputs",
                  "rank " + std::to_string(s.rank) + " input[" + std::to_string(s.index) + "]");
              return;
            }
          }
          compare_element(inputs, r, index, sources, got, expected.data(), mismatches);
        });
    return mismatches;
  }

 private:
  const uint8_t* input(const std::vector<std::vector<uint8_t>>& inputs, const Source& s) const {
    return inputs[static_cast<std::size_t>(s.rank)].data() + s.index * size_;
  }

  void compare_element(const std::vector<std::vector<uint8_t>>& inputs, int r, uint64_t index,
                       const std::vector<Source>& sources, const uint8_t* got, uint8_t* expected,
                       Mismatches& mismatches) const {
    const DataType t = options_.dtype;
    const RedOp op = options_.op;
    const bool bitwise = !reduces_ || !ef::is_floating(t) || op == RedOp::kMin || op == RedOp::kMax;
    if (bitwise) {
      if (!reduces_) {
        std::memcpy(expected, input(inputs, sources[0]), size_);
      } else if (ef::is_floating(t)) {
        select_min_max(inputs, sources, expected);
      } else {
        write_bits(integer_result(inputs, sources), expected, size_);
      }
      if (std::memcmp(expected, got, size_) != 0)
        mismatches.add(r, index, format_element(t, expected), format_element(t, got));
      return;
    }
    const double value = element_to_double(t, got);
    const auto [exact, tolerance] = floating_result(inputs, sources);
    // A bound as large as the result would accept a result missing contributions (or a plain
    // copy of one input): the element cannot be verified, which is a failure, never a pass.
    if (tolerance > 0 && tolerance >= std::fabs(exact)) {
      char text[160];
      std::snprintf(text, sizeof text,
                    "%.17g +- %.3g (unverifiable: the rounding bound is not smaller than the "
                    "result)",
                    exact, tolerance);
      mismatches.add(r, index, text, format_element(t, got));
      return;
    }
    if (std::isnan(value) || std::fabs(value - exact) > tolerance) {
      char text[96];
      std::snprintf(text, sizeof text, "%.17g", exact);
      std::string expectation = text;
      if (tolerance > 0) {
        std::snprintf(text, sizeof text, " +- %.3g", tolerance);
        expectation += text;
      }
      mismatches.add(r, index, expectation, format_element(t, got));
    }
  }

  /// minNum/maxNum with -0 < +0 over finite inputs: the result is one of the inputs' encodings.
  void select_min_max(const std::vector<std::vector<uint8_t>>& inputs,
                      const std::vector<Source>& sources, uint8_t* expected) const {
    const bool is_min = options_.op == RedOp::kMin;
    const uint8_t* best = input(inputs, sources[0]);
    for (std::size_t i = 1; i < sources.size(); ++i) {
      const uint8_t* candidate = input(inputs, sources[i]);
      const double b = element_to_double(options_.dtype, best);
      const double c = element_to_double(options_.dtype, candidate);
      const bool better = b == c ? std::signbit(c) == is_min && std::signbit(b) != is_min
                                 : (is_min ? c < b : c > b);
      if (better) best = candidate;
    }
    std::memcpy(expected, best, size_);
  }

  /// Wrapping integer reduction, computed in 64 bits and truncated (exact modulo 2^width).
  uint64_t integer_result(const std::vector<std::vector<uint8_t>>& inputs,
                          const std::vector<Source>& sources) const {
    const bool is_signed = is_signed_integer(options_.dtype);
    const auto value = [&](const Source& s) { return read_bits(input(inputs, s), size_); };
    const auto less = [&](uint64_t a, uint64_t b) {
      return is_signed ? as_signed(a, size_) < as_signed(b, size_) : a < b;
    };
    uint64_t acc = 0;
    switch (options_.op) {
      case RedOp::kProd:
        acc = 1;
        for (const Source& s : sources) acc *= value(s);
        break;
      case RedOp::kMin:
      case RedOp::kMax:
        acc = value(sources[0]);
        for (const Source& s : sources)
          if (options_.op == RedOp::kMin ? less(value(s), acc) : less(acc, value(s)))
            acc = value(s);
        break;
      case RedOp::kSum:
      case RedOp::kAvg:
        for (const Source& s : sources) acc += value(s);
        break;
      case RedOp::kPreMulSum:
        for (const Source& s : sources)
          acc += value(s) * scalar_bits_[static_cast<std::size_t>(s.rank)];
        break;
    }
    acc = truncate_bits(acc, size_);
    if (options_.op == RedOp::kAvg) {
      const auto n = static_cast<uint64_t>(program_.nranks);
      acc = is_signed ? static_cast<uint64_t>(as_signed(acc, size_) / static_cast<int64_t>(n))
                      : acc / n;
    }
    return truncate_bits(acc, size_);
  }

  /// The exact result in double and how far a correct execution may be from it.
  std::pair<double, double> floating_result(const std::vector<std::vector<uint8_t>>& inputs,
                                            const std::vector<Source>& sources) const {
    const DataType t = options_.dtype;
    if (options_.op == RedOp::kProd) {
      // The generator's +-2^e inputs make every partial product exact in any order.
      double product = 1.0;
      for (const Source& s : sources) product *= element_to_double(t, input(inputs, s));
      return {product, 0.0};
    }
    // sum, avg and premulsum: each term is x_q * s_q (s_q the scalar as the type holds it)
    // rounded once to the type, exactly as a pristine read under a pre-multiplying operator;
    // with s_q = 1 the term is x_q. The terms are exact values of the type.
    const FloatFormat f = float_format(t);
    std::vector<double> terms;
    double sum = 0.0, magnitude = 0.0;
    int grain = std::numeric_limits<int>::max();  // exponent of the coarsest common power of two
    for (const Source& s : sources) {
      const double x = element_to_double(t, input(inputs, s));
      const double scalar = scalar_values_[static_cast<std::size_t>(s.rank)];
      // x * scalar is exact in double for every type but double, whose product is the
      // type's own rounding.
      const double term = scalar == 1.0 ? x : round_to_type(t, x * scalar, 0.0);
      if (term == 0.0) continue;  // adding a zero to anything nonzero is exact
      terms.push_back(term);
      sum += term;
      magnitude += std::fabs(term);
      grain = std::min(grain, lowest_bit_exponent(term));
    }
    if (terms.empty()) return {0.0, 0.0};
    // Exact case: all terms are multiples of 2^grain (representable: grain is no finer than the
    // smallest subnormal) and the sum of magnitudes is at most 2^precision of them, so every
    // partial sum, in any order, is representable: no rounding happens.
    if (grain >= f.min_subnormal_exponent && magnitude <= std::ldexp(1.0, f.precision + grain) &&
        magnitude <= f.max_finite)
      return {sum, 0.0};
    // One or two terms: whatever the order, the result is the one correctly rounded sum.
    if (terms.size() == 1) return {terms[0], 0.0};
    if (terms.size() == 2) {
      const double a = terms[0], b = terms[1];
      const double s = a + b;  // TwoSum: s + error == a + b exactly
      const double bb = s - a;
      const double error = (a - (s - bb)) + (b - bb);
      return {round_to_type(t, s, error), 0.0};
    }
    // Otherwise (only for inputs the generator does not make, e.g. custom postconditions naming
    // one rank's chunks several times) the standard bound for m exact terms and u =
    // 2^-precision: the m-1 additions in any order each err by at most u times a partial sum,
    // and every partial sum is at most (1+u)^(m-1) * sum of |terms| (additions never underflow
    // inexactly). The double reference adds at most m * 2^-52 * sum of |terms|.
    const auto m = static_cast<double>(terms.size());
    const double u = std::ldexp(1.0, -f.precision);
    const double bound = (m - 1) * u * std::pow(1.0 + u, m - 1) * magnitude +
                         m * std::ldexp(1.0, -52) * magnitude;
    return {sum, bound};
  }

  /// The value of type t nearest (ties to even) to v + error, where v is the double nearest to
  /// the exact value v + error (|error| <= half an ulp of v). Narrow types go through
  /// round-to-odd at 53 and 24 bits, which keeps the final rounding free of double rounding.
  static double round_to_type(DataType t, double v, double error) {
    if (t == DataType::kFloat64 || !std::isfinite(v)) return v;
    if (error != 0.0) {
      // Round to odd at 53 bits: of v and its neighbour towards the exact value, the odd one.
      int exponent = 0;
      const double mantissa = std::frexp(std::fabs(v), &exponent);
      if ((static_cast<uint64_t>(std::ldexp(mantissa, 53)) & 1) == 0)
        v = std::nextafter(v, error > 0 ? std::numeric_limits<double>::infinity()
                                         : -std::numeric_limits<double>::infinity());
    }
    if (t == DataType::kFloat32) return static_cast<float>(v);
    // Round to odd at float's 24 bits (far more than p + 2 for every narrow type, subnormals
    // included), then once to the type.
    float odd = static_cast<float>(v);
    if (std::isfinite(odd) && static_cast<double>(odd) != v) {
      if (std::fabs(static_cast<double>(odd)) > std::fabs(v)) odd = std::nextafter(odd, 0.0f);
      odd = std::bit_cast<float>(std::bit_cast<uint32_t>(odd) | 1u);
    }
    uint8_t bytes[8] = {};
    double_to_element(t, odd, bytes);
    return element_to_double(t, bytes);
  }

  const ef::Program& program_;
  const ExecOptions& options_;
  uint64_t chunk_elements_;
  std::size_t size_;
  bool reduces_;
  std::vector<uint64_t> scalar_bits_;  ///< per rank, integer types
  std::vector<double> scalar_values_;  ///< per rank, floating types (1 unless pre-multiplying)
};

}  // namespace

VerifyResult run_and_verify(const ef::Program& program, const ExecOptions& options, uint64_t seed) {
  VerifyResult result;
  auto buffers = make_buffers(program, options);
  if (!buffers) {
    result.exec.status = buffers.status();
    result.message = "FAIL: " + buffers.status().message();
    return result;
  }
  const std::size_t size = ef::size_of(options.dtype);
  const bool reduces = collective_reduces(program.collective);
  // Custom postconditions combine chunks at different indices; what their sources share is
  // the position inside the chunk.
  const uint64_t chunk_elements = *ef::chunk_elements(program, options.count);
  InputGenerator generator(options.dtype, options.op, reduces, program.nranks, seed,
                           program.collective == Collective::kCustom ? chunk_elements : 0);
  // The API inputs as they were before the call (in-place calls overwrite them).
  std::vector<std::vector<uint8_t>> inputs(static_cast<std::size_t>(program.nranks));
  for (int r = 0; r < program.nranks; ++r) {
    RankBuffers& b = (*buffers)[static_cast<std::size_t>(r)];
    const ApiLayout l = api_layout(program, r, options.count, options.inplace);
    std::fill(b.output.begin(), b.output.end(), kPoisonByte);
    uint8_t* in = l.shared ? b.output.data() + l.input_offset * size : b.input.data();
    generator.fill(r, in, l.input_elements);
    inputs[static_cast<std::size_t>(r)].assign(in, in + l.input_elements * size);
  }

  result.exec = execute(program, options, *buffers);
  if (!result.exec.status) {
    result.message = "FAIL: " + result.exec.status.message();
    return result;
  }
  const Verifier verifier(program, options, chunk_elements);
  const Mismatches mismatches = verifier.compare(inputs, *buffers);
  if (mismatches.count() > 0) {
    result.message = mismatches.message();
    return result;
  }
  result.pass = true;
  std::ostringstream m;
  m << "PASS " << ef::to_string(program.collective) << ' ' << ef::to_string(options.dtype) << ' '
    << ef::to_string(options.op) << ' ' << (options.inplace ? "inplace" : "outofplace")
    << " count=" << options.count << " ranks=" << program.nranks
    << " iterations=" << result.exec.iterations;
  result.message = m.str();
  return result;
}

}  // namespace efccl::host
