#include "batch_feed.h"

#include <cmath>

#include "ddprun/common/error.h"

namespace ddprun::train {

BatchFeed::BatchFeed(Backend& be, Shape input, int dataThreads)
    : be_(be), input_(std::move(input)), pool_(std::make_unique<WorkPool>(dataThreads)) {}

BatchFeed::~BatchFeed() = default;

BatchFeed::Batch BatchFeed::take(const Dataset& d, const int64_t* idx, int64_t n) {
  HostBatch& b = batches_[cur_];
  if (b.idx != idx || b.n != n) assemble(b, d, idx, n, transform_);
  return {toInput(b, d), b.y.data()};
}

void BatchFeed::prepareNext(const Dataset& d, const int64_t* idx, int64_t n) {
  cur_ ^= 1;
  HostBatch& b = batches_[cur_];
  if (!idx) {
    b.idx = nullptr;
    return;
  }
  assemble(b, d, idx, n, transform_);
  upload(b, d);  // copied while the device runs backward
}

BatchFeed::Batch BatchFeed::once(const Dataset& d, const int64_t* idx, int64_t n) {
  HostBatch& b = batches_[cur_];
  assemble(b, d, idx, n, SampleTransform{});
  const Tensor x = toInput(b, d);
  b.idx = nullptr;  // never mistaken for a training step's samples
  return {x, b.y.data()};
}

void BatchFeed::assemble(HostBatch& b, const Dataset& d, const int64_t* idx, int64_t n,
                         const SampleTransform& t) {
  b.x.resize(static_cast<size_t>(n * d.sampleElems()));
  b.y.resize(static_cast<size_t>(n));
  gatherBatch(d, idx, static_cast<size_t>(n), b.x.data(), b.y.data(), t, pool_.get());
  b.idx = idx;
  b.n = n;
  b.dev = Tensor();
}

// Square images of input_[0] channels at the data's own size.
Shape BatchFeed::nativeShape(const Dataset& d, int64_t n) const {
  Shape xs = {n};
  if (numelOf(input_) == d.sampleElems()) {
    for (int64_t s : input_) xs.push_back(s);
    return xs;
  }
  const int64_t side = static_cast<int64_t>(
      std::lround(std::sqrt(static_cast<double>(d.sampleElems() / input_[0]))));
  DDPRUN_CHECK(input_.size() == 3 && side * side * input_[0] == d.sampleElems(),
               "the data's samples (", d.sampleElems(), " values) do not fit the model's input ",
               shapeString(input_));
  return {n, input_[0], side, side};
}

void BatchFeed::upload(HostBatch& b, const Dataset& d) {
  if (be_.device() == Device::kCpu || b.dev.data()) return;
  b.dev = be_.uploadInput(b.x.data(), nativeShape(d, b.n));
}

Tensor BatchFeed::toInput(HostBatch& b, const Dataset& d) {
  Shape xs = {b.n};
  for (int64_t s : input_) xs.push_back(s);
  const Shape native = nativeShape(d, b.n);
  Tensor src;
  if (be_.device() == Device::kCpu) {
    src = Tensor::view(b.x.data(), native);
  } else {
    upload(b, d);
    src = b.dev;
  }
  if (native == xs) return be_.modelInput(src);
  xin_.ensure(xs, be_.allocator());
  be_.resizeBilinear(src, input_[1], input_[2], xin_);
  return be_.modelInput(xin_);
}

}  // namespace ddprun::train
