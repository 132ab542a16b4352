#include "ddprun/runtime/types.h"

#include <algorithm>
#include <cstring>

#include "ddprun/runtime/process_group.h"
#include "ddprun/common/error.h"

namespace ddprun::runtime {

size_t dtypeSize(DType t) {
  switch (t) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kUInt8: return 1;
  }
  return 1;
}

bool isFloating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}

const char* dtypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
  }
  return "?";
}

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}
}  // namespace

std::optional<DType> parseDType(std::string_view name) {
  const std::string n = lower(name);
  for (DType t : kAllDTypes)
    if (n == dtypeName(t)) return t;
  if (n == "float" || n == "fp32" || n == "f32") return DType::kFloat32;
  if (n == "double" || n == "fp64" || n == "f64") return DType::kFloat64;
  if (n == "half" || n == "fp16" || n == "f16") return DType::kFloat16;
  if (n == "bf16") return DType::kBFloat16;
  if (n == "int") return DType::kInt32;
  if (n == "long") return DType::kInt64;
  if (n == "byte" || n == "u8") return DType::kUInt8;
  return std::nullopt;
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "prod";
  }
  return "?";
}

std::optional<ReduceOp> parseReduceOp(std::string_view name) {
  const std::string n = lower(name);
  for (ReduceOp op : kAllReduceOps)
    if (n == reduceOpName(op)) return op;
  if (n == "product" || n == "mul") return ReduceOp::kProduct;
  if (n == "mean" || n == "average") return ReduceOp::kAvg;
  return std::nullopt;
}

const char* deviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

const char* transportName(Transport t) {
  switch (t) {
    case Transport::kAuto: return "auto";
    case Transport::kShm: return "shm";
    case Transport::kTcp: return "tcp";
    case Transport::kHierarchical: return "hier";
  }
  return "?";
}

Transport parseTransport(const std::string& name) {
  const std::string n = lower(name);
  if (n == "auto" || n.empty()) return Transport::kAuto;
  if (n == "shm") return Transport::kShm;
  if (n == "tcp") return Transport::kTcp;
  if (n == "hier" || n == "hierarchical") return Transport::kHierarchical;
  DDPRUN_THROW(InvalidArgument, "unknown transport '", name,
               "': expected auto, shm, tcp or hier");
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                         // below the smallest normal half
    if (absx < 0x33000000u) return sign;            // < 2^-25 rounds to zero
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace ddprun::runtime
