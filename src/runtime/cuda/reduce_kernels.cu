// The CUDA transports' reduction kernels (reduce_kernels.h): the IPC
// transport's reductions and the NCCL transport's kAvg division.
#include "reduce_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "ddprun/runtime/cuda_check.h"

namespace ddprun::runtime {

namespace {
template <typename T>
struct Conv {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc v) { return v; }
};
template <>
struct Conv<__half> {
  using Acc = float;
  __device__ static float load(__half v) { return __half2float(v); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Conv<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename Acc, ReduceOp Op>
__device__ inline Acc combine(Acc a, Acc b) {
  if constexpr (Op == ReduceOp::kMin) return b < a ? b : a;
  if constexpr (Op == ReduceOp::kMax) return b > a ? b : a;
  if constexpr (Op == ReduceOp::kProduct) {
    if constexpr (sizeof(Acc) == 1) return static_cast<Acc>(a * b);
    return a * b;
  }
  if constexpr (sizeof(Acc) == 1) return static_cast<Acc>(a + b);
  return a + b;
}

// out_j[i] = op over k sources of src_k[i], for each of m destinations.
// Reads each source once, writes each destination once.
template <typename T, ReduceOp Op>
__global__ void reduceKernel(PtrSet srcs, int k, PtrSet dsts, int m, size_t count, int avgDiv) {
  using C = Conv<T>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    auto acc = C::load(reinterpret_cast<const T*>(srcs.p[0])[i]);
    for (int j = 1; j < k; ++j)
      acc = combine<typename C::Acc, Op>(acc, C::load(reinterpret_cast<const T*>(srcs.p[j])[i]));
    if (avgDiv > 1) acc = acc / static_cast<typename C::Acc>(avgDiv);
    const T v = C::store(acc);
    for (int j = 0; j < m; ++j) reinterpret_cast<T*>(dsts.p[j])[i] = v;
  }
}

template <typename T>
void launchTyped(ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m, size_t count,
                 int avgDiv, cudaStream_t st) {
  const int threads = 512;
  const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 132 * 8));
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      reduceKernel<T, ReduceOp::kSum><<<blocks, threads, 0, st>>>(s, k, d, m, count, avgDiv);
      break;
    case ReduceOp::kMin:
      reduceKernel<T, ReduceOp::kMin><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
    case ReduceOp::kMax:
      reduceKernel<T, ReduceOp::kMax><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
    case ReduceOp::kProduct:
      reduceKernel<T, ReduceOp::kProduct><<<blocks, threads, 0, st>>>(s, k, d, m, count, 1);
      break;
  }
}

}  // namespace

void launchReduce(DType t, ReduceOp op, const PtrSet& s, int k, const PtrSet& d, int m,
                  size_t count, int avgDiv, cudaStream_t st) {
  if (count == 0) return;
  switch (t) {
    case DType::kFloat32: launchTyped<float>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kFloat64: launchTyped<double>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kFloat16: launchTyped<__half>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kBFloat16: launchTyped<__nv_bfloat16>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kInt32: launchTyped<int32_t>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kInt64: launchTyped<long long>(op, s, k, d, m, count, avgDiv, st); break;
    case DType::kUInt8: launchTyped<uint8_t>(op, s, k, d, m, count, avgDiv, st); break;
  }
  DDPRUN_CUDA_OK(cudaGetLastError());
}

}  // namespace ddprun::runtime
