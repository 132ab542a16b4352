#include "ddprun/store/reconnect.h"

#include <algorithm>

namespace ddprun::store {

using wire::Command;

Replay replayOf(Command c) {
  switch (c) {
    case Command::kGet:
    case Command::kCheck:
    case Command::kWait:
    case Command::kMultiGet:
    case Command::kGetNumKeys:
    case Command::kListKeys:
    case Command::kPing:
    case Command::kQueueLen:
    case Command::kSet:
    case Command::kMultiSet:
    case Command::kDeleteKey:
    case Command::kCancelWait:
    case Command::kCompareSet:
      return Replay::kAlways;
    default:
      return Replay::kIfUnsent;
  }
}

ReconnectPolicy::ReconnectPolicy(ReconnectOptions opts, uint64_t seed)
    : opts_(opts), backoff_(opts.backoff, seed) {}

ReconnectPolicy::Verdict ReconnectPolicy::onBroken(Replay replay, bool sent,
                                                   Clock::time_point now) {
  if (!since_) since_ = now;
  if (opts_.budget.count() <= 0) return Verdict::kOutOfTime;
  if (replay == Replay::kIfUnsent && sent) return Verdict::kNotReplayable;
  if (now >= outageEnd()) return Verdict::kOutOfTime;
  return Verdict::kRetry;
}

Millis ReconnectPolicy::pause(Clock::time_point now) {
  const auto left = std::chrono::duration_cast<Millis>(outageEnd() - now);
  return std::clamp(backoff_.next(), Millis{0}, std::max(left, Millis{0}));
}

void ReconnectPolicy::onSuccess() {
  since_.reset();
  backoff_.reset();
}

}  // namespace ddprun::store
