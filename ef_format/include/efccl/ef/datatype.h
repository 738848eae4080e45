// Element types and reduction operators a call can use. Numbering follows nccl.h (2.28) so that
// the runtime converts with a cast; names follow nccl-tests' spelling.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace efccl::ef {

/// ncclDataType_t, same values.
enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBFloat16 = 9,
  kFp8E4M3 = 10,
  kFp8E5M2 = 11,
};
inline constexpr int kNumDataTypes = 12;

/// ncclRedOp_t's built-in operators, same values; kPreMulSum stands for user-created ops.
enum class RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kPreMulSum = 5 };
inline constexpr int kNumRedOps = 6;

std::size_t size_of(DataType t);
bool is_floating(DataType t);
std::string_view to_string(DataType t);  ///< "int8", "float", "bfloat16", "f8e4m3", ...
std::string_view to_string(RedOp op);    ///< "sum", "prod", "max", "min", "avg", "premulsum"
/// Accepts our names and common aliases ("fp32", "half", "bf16", "fp8_e4m3", "e4m3", ...).
std::optional<DataType> parse_data_type(std::string_view s);
std::optional<RedOp> parse_red_op(std::string_view s);

}  // namespace efccl::ef
