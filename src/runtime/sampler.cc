#include "ddprun/runtime/sampler.h"

#include <numeric>
#include <random>

#include "ddprun/common/error.h"

namespace ddprun::runtime {

namespace {
// Uniform in [0, bound) without std::uniform_int_distribution, whose
// algorithm differs between standard libraries: reject the lowest
// 2^64 mod bound values, so that the rest is a whole number of periods.
uint64_t uniformBelow(std::mt19937_64& g, uint64_t bound) {
  const uint64_t reject = (0 - bound) % bound;  // == 2^64 mod bound
  uint64_t x;
  do x = g();
  while (x < reject);
  return x % bound;
}
}  // namespace

std::vector<int64_t> samplerPermutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  std::mt19937_64 g(seed);
  // Fisher-Yates: position i takes a uniformly chosen element of v[0..i].
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniformBelow(g, static_cast<uint64_t>(i) + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
  return v;
}

DistributedSampler::DistributedSampler(SamplerOptions o) : opts_(o) {
  if (o.numReplicas < 1)
    DDPRUN_THROW(InvalidArgument, "DistributedSampler: numReplicas=", o.numReplicas,
                 " must be at least 1");
  if (o.rank < 0 || o.rank >= o.numReplicas)
    DDPRUN_THROW(InvalidArgument, "DistributedSampler: rank=", o.rank,
                 " is outside [0, numReplicas=", o.numReplicas, ")");
  if (o.datasetSize < 0)
    DDPRUN_THROW(InvalidArgument, "DistributedSampler: datasetSize=", o.datasetSize,
                 " is negative");
  if (o.dropLast && o.mode == SamplerOptions::Mode::kExact)
    DDPRUN_THROW(InvalidArgument,
                 "DistributedSampler: dropLast=true with Mode::kExact (exact mode never "
                 "drops samples)");
  setEpoch(0);
}

// Position i of the (padded) order is base[i % N]: PyTorch's
// `indices += indices[:pad]`, or whole repeats when pad > N, is exactly that.
void DistributedSampler::setEpoch(int64_t epoch) {
  epoch_ = epoch;
  const int64_t n = opts_.datasetSize, r = opts_.numReplicas, me = opts_.rank;
  std::vector<int64_t> base;
  if (opts_.shuffle) {
    base = samplerPermutation(n, opts_.seed + static_cast<uint64_t>(epoch));
  } else {
    base.resize(static_cast<size_t>(n));
    std::iota(base.begin(), base.end(), int64_t{0});
  }
  int64_t count;  // this rank's
  if (opts_.mode == SamplerOptions::Mode::kExact) {
    totalSize_ = n;
    count = me < n ? (n - me + r - 1) / r : 0;
  } else {
    // ceil((N - R) / R) == floor(N / R) when N % R != 0 (and N >= 0).
    count = opts_.dropLast ? n / r : (n + r - 1) / r;
    totalSize_ = count * r;
  }
  indices_.resize(static_cast<size_t>(count));
  paddedCount_ = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t pos = me + k * r;
    if (pos >= n) ++paddedCount_;
    indices_[static_cast<size_t>(k)] = base[static_cast<size_t>(pos % n)];
  }
}

}  // namespace ddprun::runtime
