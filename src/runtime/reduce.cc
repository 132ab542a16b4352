// Blocked n-way reduction: for each block of kBlock elements, load source 0
// into an accumulator in L1, combine the other sources into it, store once.
// Every source is read once and dst written once (the memory-traffic floor),
// the inner loops are plain array loops the compiler vectorises, and dst may
// alias a source because a block is fully read before it is written.
#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ddprun::runtime {
namespace {

constexpr size_t kBlock = 2048;

struct Half {
  static float load(uint16_t v) { return halfToFloat(v); }
  static uint16_t store(float v) { return floatToHalf(v); }
};
struct Bf16 {
  static float load(uint16_t v) { return bf16ToFloat(v); }
  static uint16_t store(float v) { return floatToBf16(v); }
};
template <typename T>
struct Plain {
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};

template <typename Acc, ReduceOp Op>
inline void combine(Acc* __restrict acc, const Acc* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) {
      if constexpr (std::is_same_v<Acc, uint8_t>)
        acc[i] = static_cast<uint8_t>(acc[i] + x[i]);
      else
        acc[i] += x[i];
    } else if constexpr (Op == ReduceOp::kMin) {
      acc[i] = x[i] < acc[i] ? x[i] : acc[i];
    } else if constexpr (Op == ReduceOp::kMax) {
      acc[i] = x[i] > acc[i] ? x[i] : acc[i];
    } else {
      if constexpr (std::is_same_v<Acc, uint8_t>)
        acc[i] = static_cast<uint8_t>(acc[i] * x[i]);
      else if constexpr (std::is_integral_v<Acc>)  // wrap like the hardware, no UB
        acc[i] = static_cast<Acc>(static_cast<std::make_unsigned_t<Acc>>(acc[i]) *
                                  static_cast<std::make_unsigned_t<Acc>>(x[i]));
      else
        acc[i] *= x[i];
    }
  }
}

// Sum of signed integers also wraps (two's complement) instead of UB.
template <>
inline void combine<int32_t, ReduceOp::kSum>(int32_t* __restrict acc,
                                             const int32_t* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    acc[i] = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(x[i]));
}
template <>
inline void combine<int64_t, ReduceOp::kSum>(int64_t* __restrict acc,
                                             const int64_t* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    acc[i] = static_cast<int64_t>(static_cast<uint64_t>(acc[i]) + static_cast<uint64_t>(x[i]));
}
template <>
inline void combine<int32_t, ReduceOp::kAvg>(int32_t* __restrict acc,
                                             const int32_t* __restrict x, size_t n) {
  combine<int32_t, ReduceOp::kSum>(acc, x, n);
}
template <>
inline void combine<int64_t, ReduceOp::kAvg>(int64_t* __restrict acc,
                                             const int64_t* __restrict x, size_t n) {
  combine<int64_t, ReduceOp::kSum>(acc, x, n);
}

template <typename T, typename Acc, typename Conv, ReduceOp Op>
void reduceTyped(void* const* dstsv, int m, const void* const* srcsv, int k, size_t count,
                 int divisor) {
  if (k == 1 && m == 1 && divisor == 1) {
    if (dstsv[0] != srcsv[0]) std::memmove(dstsv[0], srcsv[0], count * sizeof(T));
    return;
  }
  alignas(64) Acc acc[kBlock];
  alignas(64) Acc tmp[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const T* s0 = static_cast<const T*>(srcsv[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Conv::load(s0[i]);
    for (int j = 1; j < k; ++j) {
      const T* s = static_cast<const T*>(srcsv[j]) + base;
      if constexpr (std::is_same_v<T, Acc>) {
        combine<Acc, Op>(acc, s, n);
      } else {
        for (size_t i = 0; i < n; ++i) tmp[i] = Conv::load(s[i]);
        combine<Acc, Op>(acc, tmp, n);
      }
    }
    if (divisor != 1) {
      const Acc d = static_cast<Acc>(divisor);
      for (size_t i = 0; i < n; ++i) acc[i] = static_cast<Acc>(acc[i] / d);
    }
    for (int j = 0; j < m; ++j) {
      T* d = static_cast<T*>(dstsv[j]) + base;
      if constexpr (std::is_same_v<T, Acc>)
        std::memcpy(d, acc, n * sizeof(T));
      else
        for (size_t i = 0; i < n; ++i) d[i] = Conv::store(acc[i]);
    }
  }
}

template <typename T, typename Acc, typename Conv>
void reduceOp(ReduceOp op, void* const* dsts, int m, const void* const* srcs, int k, size_t count,
              int divisor) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduceTyped<T, Acc, Conv, ReduceOp::kSum>(dsts, m, srcs, k, count, divisor);
    case ReduceOp::kMin:
      return reduceTyped<T, Acc, Conv, ReduceOp::kMin>(dsts, m, srcs, k, count, divisor);
    case ReduceOp::kMax:
      return reduceTyped<T, Acc, Conv, ReduceOp::kMax>(dsts, m, srcs, k, count, divisor);
    case ReduceOp::kProduct:
      return reduceTyped<T, Acc, Conv, ReduceOp::kProduct>(dsts, m, srcs, k, count, divisor);
  }
}

template <typename T, typename Conv, typename Acc>
void divideTyped(void* dstv, size_t count, int divisor) {
  T* d = static_cast<T*>(dstv);
  for (size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<Acc>)
      d[i] = Conv::store(Conv::load(d[i]) / static_cast<Acc>(divisor));
    else
      d[i] = static_cast<T>(d[i] / static_cast<T>(divisor));
  }
}

}  // namespace

void reduceNTo(DType t, ReduceOp op, void* const* d, int m, const void* const* s, int k,
               size_t c, int div) {
  if (c == 0 || k <= 0 || m <= 0) return;
  switch (t) {
    case DType::kFloat32: return reduceOp<float, float, Plain<float>>(op, d, m, s, k, c, div);
    case DType::kFloat64: return reduceOp<double, double, Plain<double>>(op, d, m, s, k, c, div);
    case DType::kFloat16: return reduceOp<uint16_t, float, Half>(op, d, m, s, k, c, div);
    case DType::kBFloat16: return reduceOp<uint16_t, float, Bf16>(op, d, m, s, k, c, div);
    case DType::kInt32: return reduceOp<int32_t, int32_t, Plain<int32_t>>(op, d, m, s, k, c, div);
    case DType::kInt64: return reduceOp<int64_t, int64_t, Plain<int64_t>>(op, d, m, s, k, c, div);
    case DType::kUInt8: return reduceOp<uint8_t, uint8_t, Plain<uint8_t>>(op, d, m, s, k, c, div);
  }
}

void reduceN(DType t, ReduceOp op, void* dst, const void* const* srcs, int k, size_t count) {
  void* dsts[1] = {dst};
  reduceNTo(t, op, dsts, 1, srcs, k, count, 1);
}

void divideBy(DType t, void* dst, size_t count, int divisor) {
  if (divisor == 1 || count == 0) return;
  switch (t) {
    case DType::kFloat32: return divideTyped<float, Plain<float>, float>(dst, count, divisor);
    case DType::kFloat64: return divideTyped<double, Plain<double>, double>(dst, count, divisor);
    case DType::kFloat16: return divideTyped<uint16_t, Half, float>(dst, count, divisor);
    case DType::kBFloat16: return divideTyped<uint16_t, Bf16, float>(dst, count, divisor);
    case DType::kInt32: return divideTyped<int32_t, Plain<int32_t>, int32_t>(dst, count, divisor);
    case DType::kInt64: return divideTyped<int64_t, Plain<int64_t>, int64_t>(dst, count, divisor);
    case DType::kUInt8: return divideTyped<uint8_t, Plain<uint8_t>, uint8_t>(dst, count, divisor);
  }
}

}  // namespace ddprun::runtime
