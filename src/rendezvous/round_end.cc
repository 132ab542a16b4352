#include "round_end.h"

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/strings.h"

namespace ddprun::rendezvous::detail {
namespace {

const char* tagOf(RoundEnd kind) {
  switch (kind) {
    case RoundEnd::kFailed: return "failed";
    case RoundEnd::kClosed: return "closed";
    case RoundEnd::kMembershipChanged: return "membership";
    case RoundEnd::kFinished:
    case RoundEnd::kStoreLost: break;
  }
  return nullptr;
}

}  // namespace

std::string encodeEnd(RoundEnd kind, int node, const std::string& why) {
  if (kind == RoundEnd::kFinished) return "finished";
  const char* tag = tagOf(kind);
  DDPRUN_CHECK(tag != nullptr, "a round's end cannot be stored as '", toString(kind), "'");
  return std::string(tag) + ":" + std::to_string(node) + ":" + why;
}

RoundEvent decodeEnd(int round, const std::string& key, const std::string& value) {
  RoundEvent event;
  event.round = round;
  if (value == "finished") return event;
  auto fields = str::split(value, ':');
  bool ok = fields.size() >= 3 && str::parseInt(fields[1], event.node, -1);
  if (ok && fields[0] == "failed")
    event.kind = RoundEnd::kFailed;
  else if (ok && fields[0] == "closed")
    event.kind = RoundEnd::kClosed;
  else if (ok && fields[0] == "membership")
    event.kind = RoundEnd::kMembershipChanged;
  else
    DDPRUN_THROW(ProtocolError, "the agent store holds '", str::escape(value), "' under ",
                 key,
                 ", which is not finished or <failed|closed|membership>:<node>:<why>");
  event.reason = str::join({fields.begin() + 2, fields.end()}, ":");
  return event;
}

std::string awaitEndValue(store::Store& store, const std::string& endKey,
                          std::chrono::milliseconds slice,
                          const std::function<void()>& onSlice) {
  // Read with a compare_set that never matches (it returns the value, or
  // the sentinel itself when the key is missing): another node may delete
  // a forged value between the wait and the read, and a GET would fail.
  static const std::string kSentinel = "\x01";
  for (;;) {
    try {
      store.wait({endKey}, slice);
      std::string value = store.compareSet(endKey, kSentinel, kSentinel);
      if (value != kSentinel) return value;
    } catch (const TimeoutError&) {  // a long round: wait on
      if (onSlice) onSlice();
    }
  }
}

RoundEvent decodeEndOrClose(int round, const std::string& endKey,
                            const std::string& value) {
  try {
    return decodeEnd(round, endKey, value);
  } catch (const ProtocolError& e) {  // junk where the end should be: stop the job
    return {round, RoundEnd::kClosed, -1, e.message()};
  }
}

void sendReport(const std::string& what, const std::function<void()>& request) {
  try {
    request();
  } catch (const CancelledError&) {
    DDPRUN_DEBUG("rendezvous: not reporting that ", what, ": cancelled");
  } catch (const Error& e) {
    DDPRUN_WARN("could not tell the other nodes that ", what, ": ", e.message());
  }
}

}  // namespace ddprun::rendezvous::detail
