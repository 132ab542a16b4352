// RAII owners of the CUDA backend's handles: the cuDNN and cuBLASLt handles
// and their descriptors here; streams, events, device and pinned memory from
// the runtime's shared set (src/runtime/cuda/cuda_handles.h). Each owner is
// move-only, creates its object in the constructor (throwing CudaError naming
// the call and device) and destroys it in the destructor, ignoring errors
// there (a destructor must not throw, and a failed destroy leaks at worst).
//
// Thread-safety: as the underlying object (a stream may be used from any
// thread; a descriptor belongs to its layer's thread).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstdint>

#include "runtime/cuda/cuda_handles.h"  // src/ on the include path (src/CMakeLists.txt)
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"

namespace ddprun::train::cuda {

// The CUDA runtime owners the runtime shares (cuda_handles.h): streams,
// events (host waits counted: hostSyncCounts()), pinned memory and the
// device scope.
using runtime::cuda::DeviceScope;
using runtime::cuda::Event;
using runtime::cuda::HostSyncCounts;
using runtime::cuda::hostSyncCounts;
using runtime::cuda::Owned;
using runtime::cuda::PinnedBuffer;
using runtime::cuda::Stream;

// cuDNN and cuBLASLt objects.
template <typename T, auto Create, auto Destroy>
class CudnnOwned : public Owned<T, Destroy> {
 public:
  static CudnnOwned create() {
    T v{};
    DDPRUN_CUDNN_OK(Create(&v));
    return CudnnOwned(v);
  }
  CudnnOwned() = default;

 private:
  explicit CudnnOwned(T v) : Owned<T, Destroy>(v) {}
};
using CudnnHandle = CudnnOwned<cudnnHandle_t, cudnnCreate, cudnnDestroy>;
using TensorDesc =
    CudnnOwned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc =
    CudnnOwned<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc = CudnnOwned<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                            cudnnDestroyConvolutionDescriptor>;
using PoolDesc = CudnnOwned<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                            cudnnDestroyPoolingDescriptor>;
using ActivationDesc = CudnnOwned<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor,
                                  cudnnDestroyActivationDescriptor>;

// A cuDNN graph-API (backend) descriptor (cudnn_graph.h).
class BackendDesc : public Owned<cudnnBackendDescriptor_t, cudnnBackendDestroyDescriptor> {
 public:
  BackendDesc() = default;
  static BackendDesc create(cudnnBackendDescriptorType_t type) {
    cudnnBackendDescriptor_t d = nullptr;
    DDPRUN_CUDNN_OK(cudnnBackendCreateDescriptor(type, &d));
    return BackendDesc(d);
  }

 private:
  using Owned::Owned;
};

class LtHandle : public Owned<cublasLtHandle_t, cublasLtDestroy> {
 public:
  static LtHandle create() {
    cublasLtHandle_t h = nullptr;
    DDPRUN_CUBLAS_OK(cublasLtCreate(&h));
    return LtHandle(h);
  }
  LtHandle() = default;

 private:
  explicit LtHandle(cublasLtHandle_t h) : Owned(h) {}
};
using LtMatmulDesc = Owned<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtLayout = Owned<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtPreference = Owned<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// The blending factors cuDNN reads through pointers (alpha, beta: y = alpha *
// result + beta * y), float for every data type these layers use.
inline constexpr float kCudnnOne = 1.0f, kCudnnZero = 0.0f;

// cuDNN's data type of a tensor's element type (float32, bfloat16, float16).
inline cudnnDataType_t cudnnType(runtime::DType t) {
  switch (t) {
    case runtime::DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    case runtime::DType::kFloat16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

// 4-d descriptor of [n, c, h, w], NCHW in memory, or NHWC with `nhwc` (float
// unless `type` says otherwise).
inline void setTensor4d(cudnnTensorDescriptor_t d, int64_t n, int64_t c, int64_t h, int64_t w,
                        cudnnDataType_t type = CUDNN_DATA_FLOAT, bool nhwc = false) {
  DDPRUN_CUDNN_OK(cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, type,
                                             static_cast<int>(n), static_cast<int>(c),
                                             static_cast<int>(h), static_cast<int>(w)));
}

}  // namespace ddprun::train::cuda
