#include "progress_watch.h"

#include <algorithm>

namespace ddprun::agent {

bool ProgressWatch::observe(int localRank, const ProgressReport& report,
                            Clock::time_point now) {
  auto [it, fresh] = ranks_.try_emplace(localRank);
  Rank& r = it->second;
  if (fresh) {
    r.report = r.first = report;
    r.changed = now;
    return true;
  }
  const bool news = report.step != r.report.step || report.time != r.report.time;
  if (news) {
    r.changed = now;
    if (report.step < r.report.step || report.time < r.first.time) r.first = report;
  }
  r.report = report;  // loss and the rest may change without a step
  return news;
}

void ProgressWatch::exited(int localRank) {
  auto it = ranks_.find(localRank);
  if (it != ranks_.end()) it->second.watched = false;
}

const ProgressWatch::Rank* ProgressWatch::rank(int localRank) const {
  auto it = ranks_.find(localRank);
  return it == ranks_.end() ? nullptr : &it->second;
}

std::optional<double> ProgressWatch::secondsSinceProgress(int localRank,
                                                          Clock::time_point now) const {
  const Rank* r = rank(localRank);
  if (r == nullptr) return std::nullopt;
  return std::max(0.0, std::chrono::duration<double>(now - r->changed).count());
}

std::optional<ProgressWatch::Stall> ProgressWatch::stalled(Clock::time_point now) const {
  if (!timeout_) return std::nullopt;
  std::optional<Stall> worst;
  for (const auto& [localRank, r] : ranks_) {  // ascending: ties keep the lowest
    if (!r.watched) continue;
    const Clock::duration silent = now - r.changed;
    if (silent < *timeout_ || (worst && silent <= worst->silent)) continue;
    worst = Stall{localRank, r.report.step, silent};
  }
  return worst;
}

std::optional<double> ProgressWatch::stepsPerSecond(const Rank& r) {
  const double seconds = r.report.time - r.first.time;
  const int64_t steps = r.report.step - r.first.step;
  if (seconds <= 0 || steps <= 0) return std::nullopt;
  return static_cast<double>(steps) / seconds;
}

std::optional<double> ProgressWatch::etaSeconds() const {
  std::optional<double> eta;
  for (const auto& [localRank, r] : ranks_) {
    if (!r.watched || !r.report.totalSteps) continue;
    const auto rate = stepsPerSecond(r);
    if (!rate) continue;
    const double left =
        static_cast<double>(std::max<int64_t>(0, *r.report.totalSteps - r.report.step));
    eta = std::max(eta.value_or(0.0), left / *rate);
  }
  return eta;
}

}  // namespace ddprun::agent
