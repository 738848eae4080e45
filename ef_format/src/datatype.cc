#include "efccl/ef/datatype.h"

#include <array>
#include <string>

namespace efccl::ef {
namespace {

struct TypeInfo {
  DataType type;
  std::size_t size;
  bool floating;
  std::string_view name;
};

constexpr std::array<TypeInfo, kNumDataTypes> kTypes = {{
    {DataType::kInt8, 1, false, "int8"},
    {DataType::kUint8, 1, false, "uint8"},
    {DataType::kInt32, 4, false, "int32"},
    {DataType::kUint32, 4, false, "uint32"},
    {DataType::kInt64, 8, false, "int64"},
    {DataType::kUint64, 8, false, "uint64"},
    {DataType::kFloat16, 2, true, "half"},
    {DataType::kFloat32, 4, true, "float"},
    {DataType::kFloat64, 8, true, "double"},
    {DataType::kBFloat16, 2, true, "bfloat16"},
    {DataType::kFp8E4M3, 1, true, "f8e4m3"},
    {DataType::kFp8E5M2, 1, true, "f8e5m2"},
}};

struct Alias {
  std::string_view name;
  DataType type;
};
constexpr std::array<Alias, 16> kTypeAliases = {{
    {"char", DataType::kInt8},       {"uchar", DataType::kUint8},
    {"int", DataType::kInt32},       {"uint", DataType::kUint32},
    {"float16", DataType::kFloat16}, {"fp16", DataType::kFloat16},
    {"float32", DataType::kFloat32}, {"fp32", DataType::kFloat32},
    {"float64", DataType::kFloat64}, {"fp64", DataType::kFloat64},
    {"bf16", DataType::kBFloat16},   {"fp8_e4m3", DataType::kFp8E4M3},
    {"e4m3", DataType::kFp8E4M3},    {"fp8_e5m2", DataType::kFp8E5M2},
    {"e5m2", DataType::kFp8E5M2},    {"fp8", DataType::kFp8E4M3},
}};

constexpr std::array<std::string_view, kNumRedOps> kOpNames = {"sum", "prod", "max",
                                                               "min", "avg", "premulsum"};

const TypeInfo& info(DataType t) { return kTypes.at(static_cast<std::size_t>(t)); }

}  // namespace

std::size_t size_of(DataType t) { return info(t).size; }
bool is_floating(DataType t) { return info(t).floating; }
std::string_view to_string(DataType t) { return info(t).name; }
std::string_view to_string(RedOp op) { return kOpNames.at(static_cast<std::size_t>(op)); }

std::optional<DataType> parse_data_type(std::string_view s) {
  for (const auto& t : kTypes)
    if (t.name == s) return t.type;
  for (const auto& a : kTypeAliases)
    if (a.name == s) return a.type;
  return std::nullopt;
}

std::optional<RedOp> parse_red_op(std::string_view s) {
  for (std::size_t i = 0; i < kOpNames.size(); ++i)
    if (kOpNames[i] == s) return static_cast<RedOp>(i);
  return std::nullopt;
}

}  // namespace efccl::ef
