// Status checks for code compiled against the CUDA toolkit (.cu files built by
// nvcc, or host code built with the toolkit's include path): the one place
// where a CUDA, cuDNN, cuBLAS/cuBLASLt or NCCL status becomes an exception.
//
//   DDPRUN_CUDA_OK(cudaMalloc(&p, bytes));
//   DDPRUN_CUDNN_OK(cudnnConvolutionForward(handle, ...));
//   DDPRUN_CUBLAS_OK(cublasLtMatmul(lt, ...));
//   DDPRUN_NCCL_OK(ncclAllReduce(...));
//
// A failure throws CudaError (an IoError) whose message names the call and the
// device current on the calling thread, e.g.
//   "cudnnConvolutionForward failed on cuda:0: CUDNN_STATUS_BAD_PARAM"
// The source location travels in Error::file()/line() (what() appends it, as
// every ddprun error does); message() has none.
//
// The cuDNN, cuBLAS and NCCL checks exist when their headers are on the
// include path (__has_include); the library itself is needed only by code
// that uses the check. Thread-safety: the checks keep no state.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ddprun/common/error.h"

#if __has_include(<cudnn.h>)
#include <cudnn.h>
#define DDPRUN_HAVE_CUDNN_HEADER 1
#endif
#if __has_include(<cublasLt.h>)
#include <cublasLt.h>
#define DDPRUN_HAVE_CUBLAS_HEADER 1
#endif
#if __has_include(<nccl.h>)
#include <nccl.h>
#define DDPRUN_HAVE_NCCL_HEADER 1
#endif

namespace ddprun::runtime {

// A CUDA-family library call failed (runtime, cuDNN, cuBLAS, NCCL).
class CudaError : public IoError {
  using IoError::IoError;
};

namespace cuda_check {

// "cudnnConvolutionForward(h, ...)" -> "cudnnConvolutionForward".
inline std::string callName(const char* expr) {
  std::string s(expr);
  const size_t paren = s.find('(');
  if (paren != std::string::npos) s.resize(paren);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// "cuda:N" for the calling thread's current device ("cuda:?" when even that
// query fails, e.g. without a driver).
inline std::string currentDevice() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:?";
  }
  return "cuda:" + std::to_string(d);
}

[[noreturn]] inline void fail(const char* expr, const std::string& status, const char* file,
                              int line) {
  throw CudaError(callName(expr) + " failed on " + currentDevice() + ": " + status, file, line);
}

inline std::string statusName(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

#ifdef DDPRUN_HAVE_CUBLAS_HEADER
// Spelled out here: cublasGetStatusName lives in libcublas, which cuBLASLt
// users need not link.
inline std::string statusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "cublasStatus_t " + std::to_string(static_cast<int>(s));
}
#endif

}  // namespace cuda_check
}  // namespace ddprun::runtime

#define DDPRUN_CUDA_CHECK_IMPL_(type, ok, name, call)                                    \
  do {                                                                                  \
    const type status_ = (call);                                                        \
    if (status_ != (ok))                                                                \
      ::ddprun::runtime::cuda_check::fail(#call, name(status_), __FILE__, __LINE__);    \
  } while (0)

// CUDA runtime API (cudaError_t).
#define DDPRUN_CUDA_OK(call)                                  \
  DDPRUN_CUDA_CHECK_IMPL_(cudaError_t, cudaSuccess,           \
                          ::ddprun::runtime::cuda_check::statusName, call)

#ifdef DDPRUN_HAVE_CUDNN_HEADER
// cuDNN (cudnnStatus_t).
#define DDPRUN_CUDNN_OK(call) \
  DDPRUN_CUDA_CHECK_IMPL_(cudnnStatus_t, CUDNN_STATUS_SUCCESS, ::cudnnGetErrorString, call)
#endif

#ifdef DDPRUN_HAVE_CUBLAS_HEADER
// cuBLAS and cuBLASLt (cublasStatus_t).
#define DDPRUN_CUBLAS_OK(call)                                      \
  DDPRUN_CUDA_CHECK_IMPL_(cublasStatus_t, CUBLAS_STATUS_SUCCESS,    \
                          ::ddprun::runtime::cuda_check::statusName, call)
#endif

#ifdef DDPRUN_HAVE_NCCL_HEADER
// NCCL (ncclResult_t).
#define DDPRUN_NCCL_OK(call) \
  DDPRUN_CUDA_CHECK_IMPL_(ncclResult_t, ncclSuccess, ::ncclGetErrorString, call)
#endif
