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

#include "bn_path.h"
#include "context.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/train/layers.h"

namespace ddprun::train::cuda {

// cuDNN convolution (weights OIHW, optional bias), algorithms found once per
// input shape and cached (conv.cc; the search: conv_search.h).
std::unique_ptr<Layer> makeConv2d(std::shared_ptr<Context> ctx, std::string name,
                                  const Conv2dSpec& spec);
// Max pooling: cuDNN's (CUDNN_POOLING_MAX_DETERMINISTIC, padding never
// wins), or on NHWC our kernels (Context::ownPool, or where cuDNN refuses the
// configuration); global average pooling + flatten: our kernels (pooling.cc).
std::unique_ptr<Layer> makeMaxPool2d(std::shared_ptr<Context> ctx, std::string name,
                                     const Pool2dSpec& spec);
std::unique_ptr<Layer> makeGlobalAvgPool(std::shared_ptr<Context> ctx, std::string name);
// Batch norm on the path `path` (bn_path.h: chooseBnPath below), with `sync`
// SyncBatchNorm over that group (batch_norm.h).
std::unique_ptr<Layer> makeBatchNorm2d(std::shared_ptr<Context> ctx, std::string name,
                                       int64_t channels, runtime::ProcessGroup* sync,
                                       BnPath path);
// Batch norm with the ReLU after it and, with `residual`, the residual add
// before that (BatchNormAct), for a fused path (path.fused: kOursNhwc or
// kCudnnNhwcFused); other paths compose the layers (Backend::batchNormAct).
std::unique_ptr<BatchNormAct> makeBatchNormAct(std::shared_ptr<Context> ctx, std::string name,
                                               int64_t channels, runtime::ProcessGroup* sync,
                                               bool residual, BnPath path);
// Batch norm + ReLU + max pooling as one layer (ResNet's stem,
// Backend::batchNormActPool) on path `path` (kOursNhwc, fused), the pooling
// a window up to 16 with pad <= kernel / 2 (batch_norm.cc).
std::unique_ptr<Layer> makeBatchNormActPool(std::shared_ptr<Context> ctx,
                                            const std::string& bnName,
                                            const std::string& poolName, int64_t channels,
                                            runtime::ProcessGroup* sync, const Pool2dSpec& pool,
                                            BnPath path);
// The path of a batch norm on this context (bn_path.h's table).
BnPath chooseBnPath(const Context& ctx, bool sync, BnFusedWith fusedWith);
// cuBLASLt linear layer: y = x W^T + b.
std::unique_ptr<Layer> makeLinear(std::shared_ptr<Context> ctx, std::string name, int64_t in,
                                  int64_t out);
// ReLU (our kernels), and the flatten of NHWC activations into PyTorch's
// (c, h, w) order around `view` (Backend::flatten), which it runs where the
// orders agree (elementwise_layers.cc).
std::unique_ptr<Layer> makeRelu(std::shared_ptr<Context> ctx, std::string name);
std::unique_ptr<Layer> makeFlattenNhwc(std::shared_ptr<Context> ctx, std::unique_ptr<Layer> view);

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
