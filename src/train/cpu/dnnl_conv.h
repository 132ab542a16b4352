// Convolution on oneDNN (internal to the CPU backend).
//
// Measured in docs/conv_backend.md: for LeNet at batch 64 on one thread,
// oneDNN's jit convolutions with NHWC activations take 9.1 ms per training
// step against 12.4 ms for the best OpenBLAS im2col + GEMM form, so the CPU
// backend's conv2d layer runs here. Tensors stay NCHW (weights OIHW) at the
// layer boundary, as everywhere in the trainer; reorders to and from NHWC
// (and oneDNN's preferred weight layout) happen inside, and cost about 8 % of
// the step.
#pragma once

#include <memory>
#include <string>

#include "ddprun/train/layers.h"

namespace ddprun::train {

// Square kernel, stride and zero padding as in `spec` (PyTorch's Conv2d:
// output side floor((in + 2 pad - kernel) / stride) + 1), with or without a
// bias. Primitives are created once per input shape (the last batch of an
// epoch is smaller) and kept. Parameter gradients accumulate (+=) like every
// layer's, or are overwritten where Param::overwriteGrad is set (an empty
// batch then zeroes them). Throws InvalidArgument for a spec that cannot work
// (sizes < 1, padding < 0).
std::unique_ptr<Layer> makeDnnlConv2d(std::string name, const Conv2dSpec& spec);
// Fixes oneDNN's (OpenMP) thread count for this process.
void setDnnlThreads(int threads);

}  // namespace ddprun::train
