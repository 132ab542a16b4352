// When a store client whose connection broke (reset, aborted, closed by the
// peer) reconnects and sends its request again: the policy of TcpStore's
// reconnects, kept apart from the sockets so that every rule is unit-tested
// with a fake clock (every call takes `now`).
//
// An outage starts at the first broken request and ends at the next request
// that gets through. Within it the client reconnects (re-authenticating) with
// exponential backoff for at most `budget` in all; a store unreachable for
// longer ends the call with the last error, as without reconnects. A request
// is sent again only if that cannot apply it twice (replayOf): idempotent
// requests always, the others (ADD, APPEND, QUEUE_PUSH, QUEUE_POP, BARRIER)
// only when no byte of them left this host.
//
// Not thread-safe: one per client, used under the client's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <random>

#include "ddprun/common/clock.h"
#include "ddprun/store/wire.h"

namespace ddprun::store {

// Whether a request may be sent again on a new connection after the one it
// went out on broke before its reply came.
enum class Replay {
  kAlways,    // same effect (and reply) if the server applied it twice
  kIfUnsent,  // applied twice, it counts twice: only if it was never sent
};

// GET, CHECK, WAIT, MULTI_GET, GETNUMKEYS, LIST_KEYS, PING, QUEUE_LEN, SET and
// MULTI_SET (of whole values), DELETE_KEY (its effect; a retry of one that
// was applied replies that the key did not exist), CANCEL_WAIT and
// COMPARE_SET (its reply is the value now: a retry of one that was applied
// returns `desired`, as the first would have) are kAlways; ADD, APPEND, QUEUE_PUSH,
// QUEUE_POP, BARRIER and anything unknown are kIfUnsent.
Replay replayOf(wire::Command c);

struct ReconnectOptions {
  // How long one outage may last. Zero: a broken request fails at once (the
  // next call then connects again), as before reconnects existed.
  Millis budget{0};
  Backoff::Options backoff{Millis{20}, 2.0, Millis{1000}, 0.5};
};

class ReconnectPolicy {
 public:
  enum class Verdict {
    kRetry,          // reconnect (after pause()) and send the request again
    kNotReplayable,  // kIfUnsent and (maybe) sent: fail, it may have applied
    kOutOfTime,      // the outage has lasted the budget (or there is none)
  };

  explicit ReconnectPolicy(ReconnectOptions opts, uint64_t seed = std::random_device{}());

  // A request whose replay class is `replay` broke; `sent`: some of its
  // bytes (or of an earlier kIfUnsent request of the same call) left this
  // host. Starts the outage if none is running.
  Verdict onBroken(Replay replay, bool sent, Clock::time_point now);
  // The pause before the next connect attempt: the backoff's next delay,
  // never past the outage's end. Precondition: in an outage.
  Millis pause(Clock::time_point now);
  // The end of the outage's budget, which bounds the reconnects.
  // Precondition: in an outage.
  Clock::time_point outageEnd() const { return *since_ + opts_.budget; }
  bool inOutage() const { return since_.has_value(); }
  // A request got through: the outage (if any) is over, the backoff starts
  // again from its first delay.
  void onSuccess();
  const ReconnectOptions& options() const { return opts_; }

 private:
  ReconnectOptions opts_;
  Backoff backoff_;
  std::optional<Clock::time_point> since_;
};

}  // namespace ddprun::store
