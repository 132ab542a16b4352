// The dynamic rendezvous's view of its state key, for one thread: the text
// it last read, and compare_set against it (see dynamic_state.h). Every value
// read is checked (size before parsing, bounds, the job's settings:
// JobMismatchError, then validate(): ProtocolError) before it is used. Not
// thread-safe: one per thread, with that thread's store connection.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "ddprun/rendezvous/dynamic_rendezvous.h"
#include "ddprun/store/store.h"
#include "ddprun/store/tcp_store.h"
#include "dynamic_state.h"
#include "node_lease.h"

namespace ddprun::rendezvous::detail {

class StateCell {
 public:
  StateCell(store::Store& store, std::string key, const Limits& lim,
            std::shared_ptr<store::CancelToken> cancel)
      : store_(store), key_(std::move(key)), lim_(lim), cancel_(std::move(cancel)) {}

  // The store's current state in one request: a compare_set that can never
  // match returns the value, or (the server's "lie" for a missing key) the
  // expected sentinel itself. Throws as adopt().
  State refresh() {
    adopt(peekValue(store_, key_));
    return state_;
  }
  // Whether the store held a state at the last read.
  bool known() const { return !text_.empty(); }
  // The raw value last read ("" none), valid or not: what a compare_set
  // that replaces it must expect.
  const std::string& raw() const { return text_; }

  // Applies `change` to the latest state known and writes the result
  // against it; when the store holds something else, adopts that and applies
  // `change` again. Returns the state as written (or as found, when
  // `change` leaves it as it is). Only `mayCreate` writes where there is no
  // state (a join); otherwise a missing state is a StateGone.
  //
  // Many nodes arriving at once all miss but one per attempt: each miss
  // backs off a random, growing moment (1 ms to 32 ms) so that the store
  // serves a few attempts at a time rather than every node's (O(nodes^2)
  // states of O(nodes) bytes).
  State update(const std::function<void(State&)>& change, bool mayCreate = false) {
    if (!read_) refresh();  // a cell that never read starts from the store's
    Backoff backoff(kContention);
    for (;;) {
      if (!known() && !mayCreate)
        DDPRUN_THROW(StateGone, "the rendezvous state under ", key_, " was deleted");
      State s = state_;
      change(s);
      std::string next = toJson(s);
      if (next == text_) return s;
      std::string got = store_.compareSet(key_, text_, next);
      if (got == next) {
        text_ = std::move(next);
        state_ = s;
        return s;
      }
      // The expected value back (and not ours) means the key is missing.
      adopt(got == text_ ? "" : std::move(got));
      if (cancel_->sleepFor(backoff.next()))
        DDPRUN_THROW(CancelledError, "a rendezvous state update was cancelled");
    }
  }

  // A state that some other program deleted under a running job.
  class StateGone : public ProtocolError {
    using ProtocolError::ProtocolError;
  };

 private:
  void adopt(std::string text) {
    read_ = true;
    text_ = std::move(text);
    state_ = State{};
    if (text_.empty()) return;
    State s = fromJson(text_, key_, lim_);
    const std::string mismatch = jobMismatch(s, lim_);
    if (!mismatch.empty())
      DDPRUN_THROW(JobMismatchError, mismatch,
                   "; every node of a job needs the same --nnodes and --rdzv-conf "
                   "last_call_timeout, keep_alive_interval and keep_alive_max_attempt "
                   "(or another --rdzv-id for another job)");
    const std::string bad = validate(s, lim_);
    if (!bad.empty())
      DDPRUN_THROW(ProtocolError, "the rendezvous store holds '", str::escape(text_, 80),
                   "' under ", key_, ", which is not a valid state of this job (", bad,
                   "); is another job or program using this --rdzv-id on this store?");
    state_ = std::move(s);
  }

  using Millis = std::chrono::milliseconds;
  static constexpr Backoff::Options kContention{Millis(1), 2.0, Millis(32), 1.0};

  store::Store& store_;
  const std::string key_;
  const Limits lim_;
  const std::shared_ptr<store::CancelToken> cancel_;
  bool read_ = false;  // adopt() ran at least once
  std::string text_;  // "" = no state in the store
  State state_;       // text_ parsed (empty when it could not be)
};

}  // namespace ddprun::rendezvous::detail
