#include "round_watcher.h"

namespace ddprun::rendezvous::detail {

void RoundWatcher::watch(int round, const std::shared_ptr<store::CancelToken>& token) {
  RoundEvent event;
  try {
    auto store = hooks_.connect(token);
    event = hooks_.awaitEnd(*store, round, token);
    hooks_.onEnded(*store, round, event);
  } catch (const CancelledError&) {
    return;
  } catch (const Error& e) {
    event = {round, RoundEnd::kStoreLost, -1, hooks_.storeLost(e)};
  }
  hooks_.deliver(event);
}

}  // namespace ddprun::rendezvous::detail
