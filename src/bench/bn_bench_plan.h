// What bn_kernel_bench (bn_kernel_bench.cc) measures, apart from CUDA so that
// it is tested without a GPU (tests/bench/bn_bench_plan_test.cc): the batch
// norm layers of ResNet-18 (ImageNet stem) at a batch and image size as the
// CUDA trainer runs them with its NHWC batch norm (src/train/cuda/bn_nhwc.h:
// rows = N*H*W, c channels), and the bytes each kernel must move.
//
// ResNet-18 has 20 batch norms a step, in three kinds:
//   kBnRelu     bn + ReLU (the stem's bn1, every block's bn1): the backward
//               sums read x, dy, y (the ReLU's mask); the data pass too.
//   kBnAddRelu  bn + residual add + ReLU (every block's bn2): the forward also
//               reads z; the sums write g (the masked dy, the residual's
//               gradient), which the data pass then reads instead of dy, y.
//   kBn         the plain bn of a downsampling shortcut (layer2-4).
// Spatial sizes: the stem's 7x7 stride-2 convolution (pad 3), the 3x3
// stride-2 max pool (pad 1), then each of layer2-4 halves with a 3x3
// stride-2 convolution (pad 1): 224 -> 112, 56, 28, 14, 7.
//
// Bytes per element (E = 2 for bf16/fp16, 4 for float), as bn_nhwc.cu's
// header counts them:
//   stats     x                                   E
//   forward   x (+ z), y                          2E (3E)
//   sums      x, dy (+ y) (+ g written)           2E .. 4E
//   data      x, g, dx   or   x, dy (+ y), dx     3E .. 4E
//
// Thread-safety: pure functions and constants.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun::bench {

enum class BnKind { kBnRelu, kBnAddRelu, kBn };
inline const char* bnKindName(BnKind k) {
  return k == BnKind::kBnRelu      ? "bn_relu"
         : k == BnKind::kBnAddRelu ? "bn_add_relu"
                                   : "bn";
}
inline bool bnKindRelu(BnKind k) { return k != BnKind::kBn; }
inline bool bnKindResidual(BnKind k) { return k == BnKind::kBnAddRelu; }

// One configuration of batch norm layers and how many of them a step runs.
struct BnLayerGroup {
  std::string where;  // "stem", "layer1" ...
  int64_t n = 0, h = 0, w = 0, c = 0;
  BnKind kind = BnKind::kBn;
  int count = 0;  // layers of this configuration a step
  int64_t rows() const { return n * h * w; }
  int64_t elements() const { return rows() * c; }
};

// The output size of a convolution or pooling window along one side.
inline int64_t windowOut(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  return (in + 2 * pad - kernel) / stride + 1;
}

// ResNet-18's batch norm layers at batch n and square image `image`
// (torchvision's layout, as src/train/models.cc builds it). Needs image >= 32
// so that layer4 keeps at least one pixel.
inline std::vector<BnLayerGroup> resnet18BnLayers(int64_t n, int64_t image) {
  std::vector<BnLayerGroup> out;
  int64_t s = windowOut(image, 7, 2, 3);  // the stem's convolution
  out.push_back({"stem", n, s, s, 64, BnKind::kBnRelu, 1});
  s = windowOut(s, 3, 2, 1);  // max pool
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    if (stage > 0) s = windowOut(s, 3, 2, 1);
    const std::string where = "layer" + std::to_string(stage + 1);
    const int64_t c = widths[stage];
    out.push_back({where, n, s, s, c, BnKind::kBnRelu, 2});             // two blocks' bn1
    out.push_back({where, n, s, s, c, BnKind::kBnAddRelu, 2});          // their bn2
    if (stage > 0) out.push_back({where, n, s, s, c, BnKind::kBn, 1});  // downsample
  }
  return out;
}

// The kernels of one layer, in the order a training step runs them.
enum class BnKernel { kStats, kForward, kBackwardSums, kBackwardData };
inline const char* bnKernelName(BnKernel k) {
  switch (k) {
    case BnKernel::kStats:
      return "stats";
    case BnKernel::kForward:
      return "forward";
    case BnKernel::kBackwardSums:
      return "backward_sums";
    default:
      return "backward_data";
  }
}
constexpr BnKernel kBnKernels[] = {BnKernel::kStats, BnKernel::kForward,
                                   BnKernel::kBackwardSums, BnKernel::kBackwardData};

// Activation-sized tensors a kernel reads plus writes (the per-channel
// vectors and partial sums are under 1% and not counted).
inline int bnKernelPasses(BnKernel k, BnKind kind) {
  const bool relu = bnKindRelu(kind), residual = bnKindResidual(kind);
  switch (k) {
    case BnKernel::kStats:
      return 1;
    case BnKernel::kForward:
      return residual ? 3 : 2;
    case BnKernel::kBackwardSums:
      return 2 + (relu ? 1 : 0) + (residual ? 1 : 0);
    default:
      return residual ? 3 : (relu ? 4 : 3);
  }
}
inline double bnKernelBytes(BnKernel k, const BnLayerGroup& g, int elementBytes) {
  return static_cast<double>(bnKernelPasses(k, g.kind)) *
         static_cast<double>(g.elements()) * elementBytes;
}

}  // namespace ddprun::bench
