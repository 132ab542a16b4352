// The CUDA backend's layers and gradient memory, made by cuda_backend.cc.
// Internal header of src/train/cuda/.
//
// Every layer computes on its context's stream and allocates from its
// context's allocator; tensors at the layer boundary are NCHW or NHWC
// (Context::nhwc; or [N, F]) device memory, float32, or 16-bit where the
// context keeps activations so (Context::activations16): a layer takes
// either type, makes its output of the type it computes in, and gives dx
// its input's type (a gradient has its activation's type). Parameters are created zero (the model initialises
// them); gradients accumulate (+=) into Param::grad, read at each backward
// (it usually points into the reducer's bucket memory), or overwrite it when
// Param::overwriteGrad is set (the first writer of a step; layers.h).
// Thread-safety: one training thread per layer, as every Layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "context.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

// cuDNN convolution (weights OIHW, optional bias), algorithms found once per
// input shape (cudnnFind*) and cached: with Context::deterministic() the
// deterministic direct-sum choice, else the fastest that passes an accuracy
// check against a float64 reference (cudnn_conv.cc, conv_check.h).
std::unique_ptr<Layer> makeConv2d(std::shared_ptr<Context> ctx, std::string name,
                                  const Conv2dSpec& spec);
// cuDNN max pooling (CUDNN_POOLING_MAX_DETERMINISTIC, padding never wins).
std::unique_ptr<Layer> makeMaxPool2d(std::shared_ptr<Context> ctx, std::string name,
                                     const Pool2dSpec& spec);
// Batch norm: cuDNN (spatial) without `sync`; with `sync`, SyncBatchNorm from
// our own kernels plus all-reduces of the sums over `sync` on device buffers.
std::unique_ptr<Layer> makeBatchNorm2d(std::shared_ptr<Context> ctx, std::string name,
                                       int64_t channels, runtime::ProcessGroup* sync);
// Batch norm with the ReLU after it and, with `residual`, the residual add
// before that (BatchNormAct), for NHWC contexts: on 16-bit activations our
// fused NHWC kernels (bn_nhwc.h; `sync` non-null: SyncBatchNorm over it);
// on float ones cuDNN's fused Ex kernels where cuDNN accepts the
// configuration (not with `sync`), else the layers apart (our add and ReLU).
std::unique_ptr<BatchNormAct> makeBatchNormAct(std::shared_ptr<Context> ctx, std::string name,
                                               int64_t channels, runtime::ProcessGroup* sync,
                                               bool residual);
// cuBLASLt linear layer: y = x W^T + b.
std::unique_ptr<Layer> makeLinear(std::shared_ptr<Context> ctx, std::string name, int64_t in,
                                  int64_t out);
// ReLU, flatten (a view) and global average pooling: our kernels.
std::unique_ptr<Layer> makeRelu(std::shared_ptr<Context> ctx, std::string name);
std::unique_ptr<Layer> makeFlatten(std::string name);
std::unique_ptr<Layer> makeGlobalAvgPool(std::shared_ptr<Context> ctx, std::string name);

// Gradient buckets in device memory, ordered after the context's stream.
std::unique_ptr<runtime::GradientMemory> makeGradientMemory(std::shared_ptr<Context> ctx);

// A parameter of `shape` in the context's memory, value and gradient zero.
Param makeDeviceParam(Context& ctx, const std::string& name, const Shape& shape);

// Autocast: the context's 16-bit type (bf16 or fp16) copy of the n floats at
// `src` into `dst` (grown as needed, on the context's stream); returns it.
void* castTo16(Context& ctx, const float* src, size_t n, DeviceArray<uint16_t>& dst);

// InvalidArgument naming `what` unless a and b have the same element type.
void checkType(const Tensor& a, const Tensor& b, const char* what);

}  // namespace ddprun::train::cuda
