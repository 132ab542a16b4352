// Private to the Reporter: the line assembly of a raw console channel, as
// pure logic (no descriptors, no clock of its own: callers pass the time).
//
// Several workers write to one console. Relaying each worker's bytes as they
// are read glues lines together: a read ends wherever the worker's write(2)
// ended (Python's block-buffered stdout writes 8 KiB pieces that end inside
// a line), and another worker's line lands right after the piece. So a raw
// channel hands the console whole lines only: everything up to the last
// '\n' goes out at once, the unfinished rest is held, and a held partial
// line goes out when it grows to `maxHeldBytes` or when it has waited
// `delay` (a prompt, a `\r` progress bar: shown late by at most `delay`).
//
// Threading: none (one owner). Memory: at most maxHeldBytes held between
// calls; `out` receives what is ready.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::agent::detail {

class LineAssembler {
 public:
  using Clock = std::chrono::steady_clock;
  // Preconditions: maxHeldBytes > 0, delay >= 0 (0: a partial line goes
  // out at the next flushDue, i.e. at the end of the read batch).
  LineAssembler(size_t maxHeldBytes, Clock::duration delay)
      : max_(maxHeldBytes), delay_(delay) {}

  // Takes `data`, read at `now`. Appends to `out` every byte up to and
  // including the last '\n' (held bytes first); the rest is held. When the
  // held part reaches maxHeldBytes it is appended too (a line that long is
  // relayed in pieces).
  void feed(std::string_view data, Clock::time_point now, std::string& out);
  // Appends the held partial line to `out` if its deadline is not after
  // `now`; returns whether it did.
  bool flushDue(Clock::time_point now, std::string& out);
  // Appends whatever is held (end of the stream).
  void flushAll(std::string& out);
  // When the held partial line must go out; nothing when none is held.
  std::optional<Clock::time_point> deadline() const;
  size_t heldBytes() const { return held_.size(); }

 private:
  size_t max_;
  Clock::duration delay_;
  std::string held_;
  Clock::time_point heldSince_{};  // arrival of held_'s first byte
};

}  // namespace ddprun::agent::detail
