#include "ddprun/train/model_state.h"

#include <cmath>
#include <cstring>

#include "ddprun/train/metrics.h"

namespace ddprun::train {
namespace {

// Second moments and variances are never negative.
bool mustBeNonNegative(const std::string& name) {
  auto endsWith = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  return endsWith(".exp_avg_sq") || endsWith("running_var");
}

// Every float finite (and >= 0 where it must be), every count >= 0.
bool valuesUsable(const LoadedTensor& t, const std::string& path, std::string* why) {
  const size_t n = t.numel();
  if (t.dtype == "I64") {
    for (size_t i = 0; i < n; ++i) {
      int64_t v = 0;
      std::memcpy(&v, t.bytes.data() + 8 * i, 8);
      if (v < 0) {
        *why = path + ": tensor '" + t.name + "' holds the negative count " +
               std::to_string(v);
        return false;
      }
    }
    return true;
  }
  if (t.dtype != "F32") return true;
  const bool nonNegative = mustBeNonNegative(t.name);
  for (size_t i = 0; i < n; ++i) {
    float v = 0;
    std::memcpy(&v, t.bytes.data() + 4 * i, 4);
    if (!std::isfinite(v) || (nonNegative && v < 0)) {
      *why = path + ": tensor '" + t.name + "' holds " +
             (std::isfinite(v) ? "a negative value"
                               : "a non-finite value (NaN or infinity)") +
             " at element " + std::to_string(i) + ": the checkpoint is damaged";
      return false;
    }
  }
  return true;
}

}  // namespace

const float* HostSnapshot::read(const Tensor& t) {
  if (t.device() == Device::kCpu) return t.data();
  const float*& copy = read_[{t.data(), t.numel()}];
  if (copy) return copy;
  std::vector<float>& c = copies_.emplace_back(static_cast<size_t>(t.numel()));
  be_.download(t.data(), c.data(), c.size());
  copy = c.data();
  return copy;
}

std::vector<TensorView> modelTensors(Model& model, Optimizer* optim, HostSnapshot& snap,
                                     std::vector<std::vector<int64_t>>& counts) {
  std::vector<TensorView> out;
  for (Param* p : model.params())
    out.push_back({p->name, "F32", p->value.shape(), snap.read(p->value)});
  counts.reserve(model.buffers().size());
  for (Buffer* b : model.buffers()) {
    if (b->isCount) {
      counts.push_back({static_cast<int64_t>(snap.read(b->value)[0])});
      out.push_back({b->name, "I64", {}, counts.back().data()});
    } else {
      out.push_back({b->name, "F32", b->value.shape(), snap.read(b->value)});
    }
  }
  if (optim)
    for (auto& [name, t] : optim->state())
      out.push_back({name, "F32", t->shape(), snap.read(*t)});
  return out;
}

std::string modelSha256(const Model& model, HostSnapshot& snap) {
  std::vector<std::pair<const void*, size_t>> spans;
  for (const Param* p : model.params()) spans.emplace_back(snap.read(p->value), p->value.bytes());
  for (const Buffer* b : model.buffers()) spans.emplace_back(snap.read(b->value), b->value.bytes());
  return sha256Hex(spans);
}

std::string saveAndHashModel(Model& model, Backend& be, const std::string& savePath,
                             const std::map<std::string, std::string>& metadata) {
  HostSnapshot snap(be);
  if (!savePath.empty()) {
    std::vector<std::vector<int64_t>> counts;
    saveSafetensors(savePath, modelTensors(model, nullptr, snap, counts), metadata);
  }
  return modelSha256(model, snap);
}

bool copyInto(const SafeTensors& st, const std::string& path, Model& model,
              Optimizer* optim, Backend& be, std::string* why) {
  auto fits = [&](const std::string& name, const Shape& shape, const std::string& dtype) {
    const LoadedTensor* t = st.find(name);
    if (!t) {
      *why = path + " has no tensor '" + name + "': it was not written for this model";
      return false;
    }
    if (t->shape != shape || t->dtype != dtype) {
      *why = path + ": tensor '" + name + "' is " + t->dtype + shapeString(t->shape) +
             ", this model needs " + dtype + shapeString(shape) +
             " (written for another model)";
      return false;
    }
    return true;
  };
  for (Param* p : model.params())
    if (!fits(p->name, p->value.shape(), "F32")) return false;
  for (Buffer* b : model.buffers())
    if (!fits(b->name, b->isCount ? Shape{} : b->value.shape(),
              b->isCount ? "I64" : "F32"))
      return false;
  std::vector<std::pair<std::string, Tensor*>> state;
  if (optim) state = optim->state();
  for (auto& [name, t] : state)
    if (!fits(name, t->shape(), "F32")) return false;
  for (const LoadedTensor& t : st.tensors)
    if (!valuesUsable(t, path, why)) return false;
  // The loaded bytes are F32 little-endian, allocated by operator new (aligned
  // for float): uploaded as they are.
  auto put = [&](Tensor& dst, const LoadedTensor& src) {
    be.upload(reinterpret_cast<const float*>(src.bytes.data()), dst.data(),
              static_cast<size_t>(dst.numel()));
  };
  for (Param* p : model.params()) put(p->value, *st.find(p->name));
  for (Buffer* b : model.buffers()) {
    const LoadedTensor* t = st.find(b->name);
    if (b->isCount) {
      int64_t n = 0;
      std::memcpy(&n, t->bytes.data(), 8);
      const float f = static_cast<float>(n);
      be.upload(&f, b->value.data(), 1);
    } else {
      put(b->value, *t);
    }
  }
  for (auto& [name, t] : state) put(*t, *st.find(name));
  return true;
}

}  // namespace ddprun::train
