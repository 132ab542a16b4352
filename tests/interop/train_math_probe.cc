// The CPU backend's label-smoothed cross-entropy and Nesterov SGD on numbers
// given on stdin, printed for a PyTorch comparison
// (tests/interop/test_train_math_vs_torch.py). Text in, text out:
//
//   train_math_probe ce N K EPS
//     stdin: N*K logits (row-major), N labels
//     stdout: the mean loss, then the N*K gradient values (dL/dlogits)
//   train_math_probe sgd N STEPS LR MOMENTUM WD NESTEROV(0|1)
//     stdin: N initial weights, then STEPS gradients of N values
//     stdout: the N weights after the steps, then the N momentum buffers
//
// Through the library's own entry points: Backend::setLabelSmoothing +
// crossEntropy, and Optimizer::create (kind sgd, the nesterov option) +
// step(). Exit 2 on bad input.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "ddprun/train/layers.h"
#include "ddprun/train/optim.h"

namespace {
using namespace ddprun::train;

bool readFloats(std::vector<float>& v) {
  for (float& x : v)
    if (!(std::cin >> x)) return false;
  return true;
}

int crossEntropyProbe(int64_t n, int64_t k, float eps) {
  Tensor z({n, k});
  std::vector<float> zs(static_cast<size_t>(n * k));
  std::vector<int32_t> labels(static_cast<size_t>(n));
  if (!readFloats(zs)) return 2;
  for (auto& y : labels)
    if (!(std::cin >> y)) return 2;
  std::copy(zs.begin(), zs.end(), z.data());
  auto be = makeCpuBackend(1);
  be->setLabelSmoothing(eps);
  Tensor dz;
  const double loss = be->crossEntropy(z, labels.data(), &dz, nullptr);
  std::printf("%.17g\n", loss);
  for (int64_t i = 0; i < dz.numel(); ++i) std::printf("%.9g\n", dz.data()[i]);
  return 0;
}

int sgdProbe(int64_t n, int steps, const OptimizerOptions& o) {
  Param p;
  p.name = "w";
  p.value = Tensor({n});
  p.grad = Tensor({n});
  std::vector<float> v(static_cast<size_t>(n));
  if (!readFloats(v)) return 2;
  std::copy(v.begin(), v.end(), p.value.data());
  auto be = makeCpuBackend(1);
  auto opt = Optimizer::create(o, *be, {&p});
  for (int s = 0; s < steps; ++s) {
    if (!readFloats(v)) return 2;
    std::copy(v.begin(), v.end(), p.grad.data());
    opt->step();
  }
  for (int64_t i = 0; i < n; ++i) std::printf("%.9g\n", p.value.data()[i]);
  const auto state = opt->state();
  for (int64_t i = 0; i < n; ++i)
    std::printf("%.9g\n", state.empty() ? 0.0f : state[0].second->data()[i]);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "ce" && argc == 5)
      return crossEntropyProbe(std::atoll(argv[2]), std::atoll(argv[3]),
                               std::strtof(argv[4], nullptr));
    if (mode == "sgd" && argc == 8) {
      OptimizerOptions o;
      o.kind = "sgd";
      o.lr = std::strtof(argv[4], nullptr);
      o.momentum = std::strtof(argv[5], nullptr);
      o.weightDecay = std::strtof(argv[6], nullptr);
      o.nesterov = std::string(argv[7]) == "1";
      return sgdProbe(std::atoll(argv[2]), std::atoi(argv[3]), o);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_math_probe: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: train_math_probe ce N K EPS | sgd N STEPS LR MOMENTUM WD NESTEROV\n");
  return 2;
}
