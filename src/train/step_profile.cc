#include "step_profile.h"

#include <algorithm>

#include "ddprun/common/error.h"

namespace ddprun::train {

StepProfile::StepProfile(Backend& backend, std::vector<std::string> layerNames)
    : be_(backend), layers_(std::move(layerNames)) {}

void StepProfile::setBuckets(const runtime::Reducer& reducer) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> bytes;
  for (size_t b = 0; b < reducer.numBuckets(); ++b) {
    buckets.push_back(reducer.bucketParams(b));
    size_t n = 0;
    for (size_t i : buckets.back()) n += reducer.param(i).count * sizeof(float);
    bytes.push_back(n);
  }
  setBuckets(buckets, bytes);
}

nlohmann::json commProfile(const runtime::DeviceTimings& t) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const auto& b : t.buckets)
    buckets.push_back({{"bytes", b.bytes}, {"wire_bytes", b.wireBytes},
                       {"ready_ms", b.readyMs}, {"start_ms", b.startMs}, {"end_ms", b.endMs}});
  return {{"hidden_fraction", t.hiddenFraction},
          {"backward_end_ms", t.backwardEndMs},
          {"comm_ms", t.commMs},
          {"hidden_ms", t.hiddenMs},
          {"buckets", std::move(buckets)}};
}

void StepProfile::setBuckets(const std::vector<std::vector<size_t>>& bucketParams,
                             const std::vector<size_t>& bucketBytes) {
  DDPRUN_CHECK(bucketParams.size() == bucketBytes.size(), "profile: ", bucketParams.size(),
               " buckets but ", bucketBytes.size(), " sizes");
  bucketOf_.clear();
  bucketSize_.clear();
  for (size_t b = 0; b < bucketParams.size(); ++b) {
    for (size_t p : bucketParams[b]) {
      if (p >= bucketOf_.size()) bucketOf_.resize(p + 1, kNone);
      bucketOf_[p] = b;
    }
    bucketSize_.push_back(bucketParams[b].size());
  }
  bucketBytes_ = bucketBytes;
}

void StepProfile::point(Point p) {
  if (p == Point::kStepStart) {
    Step s;
    std::fill(std::begin(s.points), std::end(s.points), kNone);
    s.fwdStart.assign(layers_.size(), kNone);
    s.fwdEnd = s.bwdStart = s.bwdEnd = s.fwdStart;
    s.bucketReady.assign(bucketSize_.size(), kNone);
    s.wallStart = std::chrono::steady_clock::now();
    steps_.push_back(std::move(s));
    pending_ = bucketSize_;
  }
  DDPRUN_CHECK(!steps_.empty(), "profile: a point before the step's start");
  Step& s = steps_.back();
  s.points[static_cast<size_t>(p)] = be_.mark();
  if (p == Point::kStepEnd) s.wallEnd = std::chrono::steady_clock::now();
}

void StepProfile::layer(size_t index, bool backward, bool end) {
  if (steps_.empty() || index >= layers_.size()) return;
  Step& s = steps_.back();
  std::vector<size_t>& v = backward ? (end ? s.bwdEnd : s.bwdStart) : (end ? s.fwdEnd : s.fwdStart);
  v[index] = be_.mark();
}

void StepProfile::paramReady(size_t param) {
  if (steps_.empty() || param >= bucketOf_.size() || bucketOf_[param] == kNone) return;
  const size_t b = bucketOf_[param];
  if (pending_[b] == 0) return;
  if (--pending_[b] == 0) steps_.back().bucketReady[b] = be_.mark();
}

namespace {

// Mean over steps of t[end] - t[start] for the steps where both exist.
struct Mean {
  double sum = 0;
  int n = 0;
  void add(const std::vector<double>& t, size_t a, size_t b) {
    if (a >= t.size() || b >= t.size()) return;
    sum += t[b] - t[a];
    ++n;
  }
  nlohmann::json value() const { return n ? nlohmann::json(sum / n) : nlohmann::json(nullptr); }
};

}  // namespace

nlohmann::json StepProfile::finish() {
  if (steps_.empty()) return nlohmann::json::object();
  const std::vector<double> t = be_.markTimesMs();
  auto at = [](const Step& s, Point p) { return s.points[static_cast<size_t>(p)]; };
  Mean step, data, loss, reducer, optim, fwd, bwd, bwdEnd;
  std::vector<Mean> lf(layers_.size()), lb(layers_.size()), ready(bucketBytes_.size());
  double wall = 0;
  nlohmann::json each = nlohmann::json::array();  // each step's device time: the jitter
  for (const Step& s : steps_) {
    const size_t start = at(s, Point::kStepStart);
    step.add(t, start, at(s, Point::kStepEnd));
    if (start < t.size() && at(s, Point::kStepEnd) < t.size())
      each.push_back(t[at(s, Point::kStepEnd)] - t[start]);
    data.add(t, start, at(s, Point::kDataEnd));
    loss.add(t, at(s, Point::kLossStart), at(s, Point::kLossEnd));
    reducer.add(t, at(s, Point::kReducerStart), at(s, Point::kReducerEnd));
    optim.add(t, at(s, Point::kOptimizerStart), at(s, Point::kOptimizerEnd));
    if (!layers_.empty()) {
      fwd.add(t, s.fwdStart.front(), s.fwdEnd.back());
      bwd.add(t, s.bwdStart.back(), s.bwdEnd.front());
      bwdEnd.add(t, start, s.bwdEnd.front());
    }
    for (size_t i = 0; i < layers_.size(); ++i) {
      lf[i].add(t, s.fwdStart[i], s.fwdEnd[i]);
      lb[i].add(t, s.bwdStart[i], s.bwdEnd[i]);
    }
    for (size_t b = 0; b < ready.size(); ++b) ready[b].add(t, start, s.bucketReady[b]);
    wall += std::chrono::duration<double, std::milli>(s.wallEnd - s.wallStart).count();
  }
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < layers_.size(); ++i)
    layers.push_back({{"name", layers_[i]}, {"forward_ms", lf[i].value()},
                      {"backward_ms", lb[i].value()}});
  nlohmann::json buckets = nlohmann::json::array();
  for (size_t b = 0; b < ready.size(); ++b)
    buckets.push_back({{"bytes", bucketBytes_[b]}, {"params", bucketSize_[b]},
                       {"ready_ms", ready[b].value()}});
  nlohmann::json j = {{"steps", steps_.size()},
                      {"step_ms", step.value()},
                      {"step_ms_each", std::move(each)},
                      {"wall_step_ms", wall / static_cast<double>(steps_.size())},
                      {"data_ms", data.value()},
                      {"forward_ms", fwd.value()},
                      {"loss_ms", loss.value()},
                      {"backward_ms", bwd.value()},
                      {"backward_end_ms", bwdEnd.value()},
                      {"reducer_ms", reducer.value()},
                      {"optimizer_ms", optim.value()},
                      {"layers", std::move(layers)},
                      {"buckets", std::move(buckets)},
                      {"comm", nullptr}};
  steps_.clear();
  be_.clearMarks();
  return j;
}

}  // namespace ddprun::train
