// Element types, reduction operators and devices understood by the runtime's
// collectives. Pure data; no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::runtime {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                       DType::kBFloat16, DType::kInt32,  DType::kInt64,
                                       DType::kUInt8};

// kAvg divides the sum by the number of ranks; for integer types the
// division truncates toward zero (as NCCL's ncclAvg does).
enum class ReduceOp : uint8_t { kSum, kAvg, kMin, kMax, kProduct };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                             ReduceOp::kMax, ReduceOp::kProduct};

enum class Device : uint8_t { kCpu, kCuda };

size_t dtypeSize(DType t);
bool isFloating(DType t);
// "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8".
const char* dtypeName(DType t);
// Also accepts the usual aliases: float, double, half, fp32, fp16, bf16, int,
// long, byte.
std::optional<DType> parseDType(std::string_view name);

// "sum", "avg", "min", "max", "prod".
const char* reduceOpName(ReduceOp op);
std::optional<ReduceOp> parseReduceOp(std::string_view name);

const char* deviceName(Device d);

// IEEE binary16 and bfloat16 conversions (round to nearest even).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
inline float bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t floatToBf16(float f);

}  // namespace ddprun::runtime
