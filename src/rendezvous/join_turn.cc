#include "join_turn.h"

#include <utility>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"

namespace ddprun::rendezvous::detail {

Turn::Turn(Turn&& o) noexcept : store_(std::exchange(o.store_, nullptr)), key_(o.key_) {}

void Turn::release() {
  if (!store_) return;
  try {
    std::exchange(store_, nullptr)->set(key_, "");
  } catch (const Error& e) {  // the next one waits a moment longer
    DDPRUN_DEBUG("rendezvous: could not pass the turn on: ", e.message());
  }
}

Turn takeTurn(store::Store& store, const std::string& counterKey,
              const std::string& turnPrefix, std::chrono::milliseconds patience) {
  int64_t ticket = 0;
  try {
    ticket = store.add(counterKey, 1);
  } catch (const store::UnconfirmedError& e) {
    DDPRUN_INFO("rendezvous: joining without a turn (taking a ticket failed: ", e.message(),
                ")");
    return Turn{};
  }
  if (ticket > 1) {
    const std::string before = turnPrefix + std::to_string(ticket - 1);
    try {
      store.wait({before}, patience);
      store.deleteKey(before);  // nobody else waits for it
    } catch (const TimeoutError&) {
      DDPRUN_DEBUG("rendezvous: joining without the turn of ticket ", ticket - 1);
    }
  }
  return Turn(&store, turnPrefix + std::to_string(ticket));
}

}  // namespace ddprun::rendezvous::detail
