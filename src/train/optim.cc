#include "ddprun/train/optim.h"

#include <algorithm>
#include <cstdint>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

// Each bucket starts 256 bytes into the flat buffers' alignment, as the
// reducer's buckets (separate allocations) start aligned: a parameter's value
// is then as aligned as its gradient.
constexpr size_t kBucketAlign = 64;  // elements
// The most padding (elements) taken for alignment between two gradients of a
// bucket; a larger distance means the gradients are not one bucket's memory.
constexpr size_t kMaxPad = 256;
// refreshWeights16's zero gradient, reused by every chunk (elements).
constexpr size_t kRefreshSpan = size_t{1} << 18;

size_t numelOf(const Param& p) { return static_cast<size_t>(p.value.numel()); }
size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, Backend& be, std::vector<Param*> p) : Optimizer(o, be, std::move(p)) {
    if (opts_.momentum != 0.0f)
      for (size_t i = 0; i < params_.size(); ++i) slot(i, "momentum_buffer");
  }
  void step() override {
    be_.sgdStep(chunks(), opts_.lr, opts_.momentum, opts_.weightDecay, steps_ == 0,
                opts_.nesterov);
    ++steps_;
  }
  void stageStep() override { be_.stageOptimizerStep(opts_.lr, steps_ == 0, 0, 0.0f, 0.0f); }
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& o, Backend& be, std::vector<Param*> p)
      : Optimizer(o, be, std::move(p)) {
    for (size_t i = 0; i < params_.size(); ++i) {
      slot(i, "exp_avg");
      slot(i, "exp_avg_sq");
    }
  }
  void step() override {
    ++steps_;
    be_.adamStep(chunks(), opts_.lr, opts_.beta1, opts_.beta2, opts_.eps, opts_.weightDecay,
                 steps_);
  }
  void stageStep() override {
    be_.stageOptimizerStep(opts_.lr, false, steps_ + 1, opts_.beta1, opts_.beta2);
  }
};

}  // namespace

const std::vector<std::string>& Optimizer::kinds() {
  static const std::vector<std::string> k = {"sgd", "adam"};
  return k;
}

std::string optimizerOptionsProblem(const OptimizerOptions& o) {
  if (o.kind != "sgd" && o.kind != "adam")
    return "unknown optimizer '" + o.kind + "': choose one of sgd, adam";
  if (o.nesterov && o.kind != "sgd")
    return "nesterov is SGD's option; optimizer '" + o.kind + "' has none";
  if (o.nesterov && o.momentum == 0.0f)
    return "nesterov needs a momentum: momentum is 0 (as PyTorch: Nesterov momentum requires "
           "a momentum and zero dampening)";
  return "";
}

std::unique_ptr<Optimizer> Optimizer::create(const OptimizerOptions& o, Backend& be,
                                             std::vector<Param*> params) {
  if (o.kind == "sgd" || o.kind == "adam") {
    const std::string problem = optimizerOptionsProblem(o);
    if (!problem.empty()) DDPRUN_THROW(InvalidArgument, problem);
  }
  if (o.kind == "sgd") return std::make_unique<Sgd>(o, be, std::move(params));
  if (o.kind == "adam") return std::make_unique<Adam>(o, be, std::move(params));
  DDPRUN_THROW(InvalidArgument, "unknown optimizer '", o.kind, "': choose one of sgd, adam");
}

Optimizer::~Optimizer() {
  try {
    giveValuesBack();
  } catch (...) {  // a destructor must not throw; the values are lost with the model's use
  }
}

Tensor& Optimizer::slot(size_t param, const std::string& suffix) {
  state_.emplace_back("optim." + params_[param]->name + "." + suffix,
                      Tensor(params_[param]->value.shape(), be_.allocator()));
  return state_.back().second;
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& [name, t] : state_) out.emplace_back(name, &t);
  return out;
}

// ------------------------------------------------------------ flat layout

void Optimizer::checkPartition(const std::vector<std::vector<size_t>>& buckets) const {
  std::vector<char> seen(params_.size(), 0);
  size_t count = 0;
  for (const auto& b : buckets)
    for (size_t i : b) {
      if (i >= params_.size())
        DDPRUN_THROW(InvalidArgument, "optimizer layout: parameter index ", i, " out of range (",
                     params_.size(), " parameters)");
      if (seen[i]++)
        DDPRUN_THROW(InvalidArgument, "optimizer layout: parameter '", params_[i]->name,
                     "' is in more than one bucket position");
      ++count;
    }
  if (count != params_.size())
    for (size_t i = 0; i < params_.size(); ++i)
      if (!seen[i])
        DDPRUN_THROW(InvalidArgument, "optimizer layout: parameter '", params_[i]->name,
                     "' is in no bucket (the buckets must list every parameter once, as "
                     "Reducer::bucketParams does)");
}

// The bucket's gradient offsets relative to its first gradient when they
// look like one bucket's memory (increasing, at most kMaxPad apart), else the
// packed offsets.
std::vector<size_t> Optimizer::relativeOffsets(const std::vector<size_t>& bucket) const {
  std::vector<size_t> rel(bucket.size()), packed(bucket.size());
  const auto base = reinterpret_cast<uintptr_t>(params_[bucket.front()]->grad.data());
  bool mirrored = base != 0;
  size_t end = 0;
  for (size_t k = 0; k < bucket.size(); ++k) {
    const Param& p = *params_[bucket[k]];
    packed[k] = k ? packed[k - 1] + numelOf(*params_[bucket[k - 1]]) : 0;
    const auto g = reinterpret_cast<uintptr_t>(p.grad.data());
    mirrored = mirrored && g >= base && (g - base) % sizeof(float) == 0 &&
               static_cast<size_t>(p.grad.numel()) == numelOf(p);
    if (mirrored) {
      rel[k] = (g - base) / sizeof(float);
      mirrored = rel[k] >= end && rel[k] - end <= kMaxPad;
      end = rel[k] + numelOf(p);
    }
  }
  return mirrored ? rel : packed;
}

void Optimizer::adoptLayout(const std::vector<std::vector<size_t>>& buckets, bool weights16) {
  checkPartition(buckets);
  if (weights16 && be_.device() == Device::kCpu)
    DDPRUN_THROW(InvalidArgument, "16-bit weight copies need a device backend computing in bf16 "
                 "or fp16; the CPU backend computes in fp32");
  std::vector<Group> groups;
  size_t total = 0;
  for (const auto& b : buckets) {
    if (b.empty()) continue;
    Group g{alignUp(total, kBucketAlign), b, relativeOffsets(b)};
    total = g.start + g.rel.back() + numelOf(*params_[b.back()]);
    groups.push_back(std::move(g));
  }
  const auto size = static_cast<int64_t>(std::max<size_t>(total, 1));
  Tensor values({size}, be_.allocator());  // zero-filled: the padding stays 0
  // An empty chunk asking for a 16-bit copy: a backend that cannot write one
  // refuses it here, before anything changed.
  if (weights16) be_.sgdStep({{values.data(), values.data(), nullptr, nullptr, values.data(), 0}},
                             0.0f, 0.0f, 0.0f, false);
  std::vector<Tensor> state;
  for (size_t k = 0; k < stateKinds(); ++k) state.emplace_back(Shape{size}, be_.allocator());
  std::vector<size_t> offset(params_.size(), 0);
  for (const Group& g : groups)
    for (size_t k = 0; k < g.params.size(); ++k) offset[g.params[k]] = g.start + g.rel[k];
  // Copy everything first, then re-point (nothing that throws): a failed
  // copy leaves the old layout whole. The old buffers (a previous layout)
  // are released after every copy was issued (a device frees in stream order).
  const Device dev = be_.device();
  auto viewAt = [&](Tensor& flat, size_t i) {
    return Tensor::view(flat.data() + offset[i], params_[i]->value.shape(), dev);
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor v = viewAt(values, i);
    be_.copy(params_[i]->value, v);
    for (size_t s = 0; s < state.size(); ++s) {
      Tensor t = viewAt(state[s], i);
      be_.copy(stateOf(i, s), t);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->value = viewAt(values, i);
    for (size_t s = 0; s < state.size(); ++s) stateOf(i, s) = viewAt(state[s], i);
  }
  groups_ = std::move(groups);
  offset_ = std::move(offset);
  flatValues_ = values;
  flatState_ = std::move(state);
  has16_ = weights16;
  flat16_ = weights16 ? Tensor({(size + 1) / 2}, be_.allocator()) : Tensor();
  refreshWeights16();
}

// Parameter i's value and state are still the optimizer's views at its offset.
bool Optimizer::inFlat(size_t i) const {
  if (groups_.empty()) return false;
  const size_t off = offset_[i];
  if (params_[i]->value.data() != flatValues_.data() + off) return false;
  for (size_t s = 0; s < flatState_.size(); ++s)
    if (stateOf(i, s).data() != flatState_[s].data() + off) return false;
  return true;
}

Backend::OptimChunk Optimizer::ownChunk(size_t i) {
  Param& p = *params_[i];
  const size_t kinds = stateKinds();
  return {p.value.data(), p.grad.data(), kinds > 0 ? stateOf(i, 0).data() : nullptr,
          kinds > 1 ? stateOf(i, 1).data() : nullptr, nullptr, numelOf(p)};
}

// Appends parameter i (in layout order): it extends the last chunk when that
// is a run of the flat buffers (of this bucket) ending where i starts, in the
// values and in the gradients; else it starts a chunk.
void Optimizer::addMember(size_t i, bool runContinues) {
  const Param& p = *params_[i];
  const size_t n = numelOf(p);
  if (n == 0) return;
  if (!inFlat(i)) {
    chunks_.push_back(ownChunk(i));
    lastInFlat_ = false;
    return;
  }
  Backend::OptimChunk* last = lastInFlat_ && runContinues ? &chunks_.back() : nullptr;
  if (last && last->w + last->n == p.value.data() && last->g + last->n == p.grad.data()) {
    last->n += n;
    return;
  }
  Backend::OptimChunk c = ownChunk(i);
  if (has16_) c.w16 = static_cast<uint16_t*>(static_cast<void*>(flat16_.data())) + offset_[i];
  chunks_.push_back(c);
  lastInFlat_ = true;
}

const std::vector<Backend::OptimChunk>& Optimizer::chunks() {
  chunks_.clear();
  lastInFlat_ = false;
  if (groups_.empty()) {
    for (size_t i = 0; i < params_.size(); ++i)
      if (numelOf(*params_[i])) chunks_.push_back(ownChunk(i));
    return chunks_;
  }
  for (const Group& g : groups_)
    for (size_t k = 0; k < g.params.size(); ++k) addMember(g.params[k], k > 0);
  return chunks_;
}

const void* Optimizer::weights16(size_t i) const {
  if (!has16_ || i >= params_.size()) return nullptr;
  if (!inFlat(i)) return nullptr;
  return static_cast<const uint16_t*>(static_cast<const void*>(flat16_.data())) + offset_[i];
}

// An SGD step with learning rate 0, no momentum and no weight decay on a zero
// gradient leaves every value's bits as they are (w - 0*0) and writes the
// 16-bit copies.
void Optimizer::refreshWeights16() {
  if (!has16_) return;
  size_t longest = 0;
  for (Param* p : params_) longest = std::max(longest, numelOf(*p));
  const Tensor zeros({static_cast<int64_t>(std::clamp<size_t>(longest, 1, kRefreshSpan))},
                     be_.allocator());
  auto* base16 = static_cast<uint16_t*>(static_cast<void*>(flat16_.data()));
  std::vector<Backend::OptimChunk> cs;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!inFlat(i)) continue;
    float* w = params_[i]->value.data();
    for (size_t at = 0, n = numelOf(*params_[i]); at < n; at += kRefreshSpan)
      cs.push_back({w + at, zeros.data(), nullptr, nullptr, base16 + offset_[i] + at,
                    std::min(kRefreshSpan, n - at)});
  }
  be_.sgdStep(cs, 0.0f, 0.0f, 0.0f, false);
}

// Each parameter still viewing the flat buffer gets its own copy (the model
// outlives the optimizer in the trainer and may in any user's code).
void Optimizer::giveValuesBack() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!inFlat(i)) continue;
    Param& p = *params_[i];
    Tensor own(p.value.shape(), be_.allocator());
    be_.copy(p.value, own);
    p.value = own;
  }
}

}  // namespace ddprun::train
