// A user's own data-parallel training loop on ddprun's runtime: a tiny
// softmax-regression model written by hand, the DistributedSampler to split
// the data, and the Reducer to average gradients across ranks (overlapping
// the all-reduce with the rest of backward). No LibTorch, no ddprun trainer.
//
//   ddprun --nproc_per_node=2 --no-python ./my_trainer [epochs]
//
// Prints, on every rank, the first and last step's global mean loss and a checksum of the parameters:
// they are identical on all ranks (the reducer keeps the replicas in step).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ddprun/runtime/collectives.h"
#include "ddprun/runtime/process_group.h"
#include "ddprun/runtime/reducer.h"
#include "ddprun/runtime/sampler.h"

namespace rt = ddprun::runtime;

constexpr int kFeatures = 16, kClasses = 4, kSamples = 2048, kBatch = 32;

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 3;
  auto pg = rt::ProcessGroup::fromEnv();  // RANK, WORLD_SIZE, MASTER_ADDR... from ddprun

  // A learnable synthetic data set, the same on every rank: class c's points
  // scatter around a centre.
  std::mt19937 gen(42);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> centres(kClasses * kFeatures), x(kSamples * kFeatures);
  std::vector<int> y(kSamples);
  for (float& c : centres) c = 2.0f * noise(gen);
  for (int i = 0; i < kSamples; ++i) {
    y[i] = i % kClasses;
    for (int f = 0; f < kFeatures; ++f)
      x[i * kFeatures + f] = centres[y[i] * kFeatures + f] + noise(gen);
  }

  // Parameters in model order; their gradients live in the reducer's buckets.
  std::vector<float> w(kClasses * kFeatures), b(kClasses, 0.0f);
  for (float& v : w) v = 0.01f * noise(gen);
  rt::broadcastFromRank0(*pg, {{w.data(), w.size()}, {b.data(), b.size()}});
  rt::Reducer reducer(*pg, {{"linear.weight", w.size()}, {"linear.bias", b.size()}});

  rt::DistributedSampler sampler({.datasetSize = kSamples, .numReplicas = pg->size(),
                                  .rank = pg->rank(), .shuffle = true, .seed = 7});
  double loss = 0, firstLoss = -1;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.setEpoch(epoch);
    const std::vector<int64_t>& idx = sampler.indices();
    for (size_t at = 0; at < idx.size(); at += kBatch) {
      const size_t n = std::min<size_t>(kBatch, idx.size() - at);
      float* gw = reducer.grad(0);
      float* gb = reducer.grad(1);
      loss = 0;
      for (size_t s = 0; s < n; ++s) {  // forward + backward, sample by sample
        const float* xi = &x[idx[at + s] * kFeatures];
        float z[kClasses], mx = -1e30f, sum = 0;
        for (int c = 0; c < kClasses; ++c) {
          z[c] = b[c];
          for (int f = 0; f < kFeatures; ++f) z[c] += w[c * kFeatures + f] * xi[f];
          mx = std::max(mx, z[c]);
        }
        for (int c = 0; c < kClasses; ++c) sum += std::exp(z[c] - mx);
        const int label = y[idx[at + s]];
        loss += (std::log(sum) + mx - z[label]) / n;
        for (int c = 0; c < kClasses; ++c) {
          const float d = (std::exp(z[c] - mx) / sum - (c == label)) / n;
          gb[c] += d;
          for (int f = 0; f < kFeatures; ++f) gw[c * kFeatures + f] += d * xi[f];
        }
      }
      // Hand the gradients over as they are final (bias first: its all-reduce
      // can start while the weight gradient would still be computed in a
      // bigger model), then wait for the averages.
      if (firstLoss < 0) firstLoss = loss;
      reducer.markReady(1);
      reducer.markReady(0);
      reducer.finalize();
      gw = reducer.grad(0);  // buckets may move once, after the first step
      gb = reducer.grad(1);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.5f * gw[i];
      for (size_t i = 0; i < b.size(); ++i) b[i] -= 0.5f * gb[i];
      reducer.zeroGrad();
    }
  }
  // The global mean loss of the last step, and a checksum of the parameters.
  double losses[2] = {firstLoss, loss};
  rt::allReduce(*pg, {.output = losses, .count = 2, .dtype = rt::DType::kFloat64,
                      .op = rt::ReduceOp::kAvg});
  double checksum = 0;
  for (size_t i = 0; i < w.size(); ++i) checksum += w[i] * static_cast<double>(i + 1);
  for (float v : b) checksum += v;
  std::printf("rank %d of %d: first_loss %.4f loss %.4f checksum %.6f\n", pg->rank(), pg->size(),
              losses[0], losses[1], checksum);
  return 0;
}
