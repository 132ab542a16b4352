// ResNet's residual block (internal to the models).
//
// BasicBlock is torchvision's resnet18/34 block as one Layer:
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
// conv1 3x3/stride, conv2 3x3/1, both padding 1 without bias; shortcut(x) is
// x, or downsample = 1x1/stride conv (no bias) + batch norm when the stride is
// not 1 or the channel count changes. Parameters and buffers carry
// torchvision's state_dict names under the block's name ("layer2.0.conv1.weight",
// "layer2.0.bn1.running_mean", "layer2.0.downsample.0.weight",
// "layer2.0.downsample.1.bias", ...), in torchvision's order.
//
// The block is made of the Backend's layers and element-wise operations only
// (its intermediates come from backend.allocator()), so it runs unchanged on
// any backend; it never reads or writes tensor memory itself.
//
// Thread-safety: a block belongs to one training thread, like every layer.
// Preconditions: backward follows this block's forward of the same x (the
// block keeps the intermediates), as for every layer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ddprun/train/layers.h"

namespace ddprun::train {

// `sync` non-null: the block's batch norms are SyncBatchNorm over that group.
std::unique_ptr<Layer> makeBasicBlock(Backend& backend, std::string name, int64_t inC,
                                      int64_t outC, int stride, runtime::ProcessGroup* sync);

}  // namespace ddprun::train
