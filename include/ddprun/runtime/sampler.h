// Which dataset indices each rank reads in an epoch: PyTorch's
// torch.utils.data.DistributedSampler, rule for rule, for C++ training loops.
//
// Mode::kPadded (PyTorch's behaviour, for training). N samples, R replicas:
//   numSamples = dropLast && N % R != 0 ? ceil((N - R) / R) : ceil(N / R)
//   totalSize  = numSamples * R
//   order      = a permutation of 0..N-1 seeded by seed + epoch (shuffle),
//                else 0..N-1; the same on every rank
//   without dropLast the order is padded to totalSize by repeating it from
//   its start; with dropLast it is cut to totalSize
//   rank r reads order[r], order[r + R], ... (strided, numSamples of them)
// Every rank reads the same number of samples, so every rank runs the same
// number of steps (a collective per step cannot hang on a rank with fewer).
// Example N=10, R=3: rank 0 {0,3,6,9}, rank 1 {1,4,7,0}, rank 2 {2,5,8,1};
// with dropLast {0,3,6}, {1,4,7}, {2,5,8}.
//
// Mode::kExact (for evaluation): no padding, no dropping; rank r reads
// order[r], order[r + R], ... of the unpadded order, so every sample is read
// exactly once across ranks and ranks may read different counts (do not run
// a collective per sample batch then; reduce the totals once at the end).
//
// The permutation is not torch.randperm's: it is our own generator
// (std::mt19937_64 seeded with seed + epoch, Fisher-Yates with rejection
// sampling written out here), so it is the same on every platform and
// standard library, but differs from PyTorch's shuffled order. The
// unshuffled orders match PyTorch exactly.
//
// Thread-safety: const members may be called concurrently; setEpoch() must
// not run concurrently with anything else on the same sampler.
#pragma once

#include <cstdint>
#include <vector>

namespace ddprun::runtime {

struct SamplerOptions {
  enum class Mode {
    kPadded,  // PyTorch: pad (or with dropLast, cut) to a multiple of numReplicas
    kExact,   // every sample once across ranks, no padding; dropLast must be false
  };
  int64_t datasetSize = 0;  // N >= 0
  int numReplicas = 1;      // R >= 1 (the world size)
  int rank = 0;             // 0 <= rank < R
  bool shuffle = true;
  uint64_t seed = 0;        // must be the same on every rank
  bool dropLast = false;
  Mode mode = Mode::kPadded;
};

class DistributedSampler {
 public:
  // Computes epoch 0. Throws InvalidArgument naming the bad value: R < 1,
  // rank outside [0, R), N < 0, dropLast with Mode::kExact.
  explicit DistributedSampler(SamplerOptions o);

  // Recomputes indices() for `epoch` (PyTorch's set_epoch; call it before
  // each epoch, or every epoch has the same order).
  void setEpoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This rank's sample count (len(sampler)); indices().size().
  int64_t numSamples() const { return static_cast<int64_t>(indices_.size()); }
  // Samples read by all ranks together: numSamples * R (kPadded), N (kExact).
  int64_t totalSize() const { return totalSize_; }
  // This rank's dataset indices for the current epoch, in reading order.
  const std::vector<int64_t>& indices() const { return indices_; }
  // How many of this rank's indices are repeats added by padding; they are
  // always its last ones. 0 with dropLast and in kExact. Summed over ranks:
  // totalSize() - N.
  int64_t paddedCount() const { return paddedCount_; }
  const SamplerOptions& options() const { return opts_; }

 private:
  SamplerOptions opts_;
  int64_t epoch_ = 0;
  int64_t totalSize_ = 0;
  int64_t paddedCount_ = 0;
  std::vector<int64_t> indices_;
};

// The order every rank derives for an epoch: 0..n-1 permuted by a
// Fisher-Yates shuffle driven by std::mt19937_64(seed). Exposed for tests
// and for anyone who needs the same order without a sampler.
std::vector<int64_t> samplerPermutation(int64_t n, uint64_t seed);

}  // namespace ddprun::runtime
