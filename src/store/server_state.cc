#include "ddprun/store/server_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace ddprun::store {

using wire::Command;

// Per-entry bookkeeping cost charged against maxMemoryBytes on top of the
// key and value bytes (hash node, string headers).
constexpr size_t kEntryOverhead = 64;

struct ServerState::Conn {
  ConnId id = 0;
  std::optional<wire::Dialect> dialect;
  std::string pending;  // bytes of an incomplete request
  int64_t awaited = 0;  // keys still missing for a pending WAIT/BARRIER
  std::vector<std::string> waitKeys;
  bool watching = false;
  wire::Request request;  // reused to keep its buffers' capacity
};

ServerState::ServerState(ServerLimits limits, Outbox& outbox)
    : limits_(limits), outbox_(outbox) {}

ServerState::~ServerState() = default;

void ServerState::open(ConnId id) {
  auto c = std::make_unique<Conn>();
  c->id = id;
  conns_[id] = std::move(c);
}

void ServerState::closed(ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  cancelWaits(*it->second);
  if (it->second->watching) {
    for (auto w = watchers_.begin(); w != watchers_.end();) {
      auto& v = w->second;
      v.erase(std::remove(v.begin(), v.end(), id), v.end());
      w = v.empty() ? watchers_.erase(w) : std::next(w);
    }
  }
  conns_.erase(it);
}

std::optional<wire::Dialect> ServerState::dialectOf(ConnId id) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return std::nullopt;
  return it->second->dialect;
}

ServerStats ServerState::stats() const {
  return {requests_, rejected_, kv_.size(), memory_};
}

std::string ServerState::receive(ConnId id, std::string_view bytes) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return "unknown connection";
  Conn& c = *it->second;
  // Parse straight from `bytes` when nothing is pending: the common case of
  // one whole request per read needs no copy.
  std::string_view data = bytes;
  if (!c.pending.empty()) {
    c.pending.append(bytes);
    data = c.pending;
  }
  size_t used = 0;
  std::string error;
  while (used < data.size()) {
    std::string_view rest = data.substr(used);
    if (!c.dialect) {
      c.dialect = wire::detectDialect(rest);
      if (!c.dialect) break;
    }
    auto res = wire::parseRequest(*c.dialect, limits_.wire, rest, c.request);
    if (res.status == wire::ParseStatus::kNeedMore) break;
    if (res.status == wire::ParseStatus::kBad) {
      error = res.error;
      break;
    }
    used += res.consumed;
    ++requests_;
    error = execute(c, c.request);
    if (!error.empty()) break;
  }
  if (!error.empty()) {
    ++rejected_;
    return error;
  }
  if (c.pending.empty()) {
    c.pending.assign(data.substr(used));
  } else {
    c.pending.erase(0, used);
  }
  return {};
}

bool ServerState::present(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool ServerState::reserve(size_t bytes, std::string& error) {
  if (memory_ + bytes > limits_.maxMemoryBytes) {
    error = "store memory limit of " + std::to_string(limits_.maxMemoryBytes) +
            " bytes reached (raise --max-memory)";
    return false;
  }
  memory_ += bytes;
  return true;
}

void ServerState::release(size_t bytes) { memory_ -= std::min(memory_, bytes); }

std::string ServerState::doSet(const std::string& key, std::string value) {
  std::string error;
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (!reserve(key.size() + value.size() + kEntryOverhead, error)) return error;
    auto& slot = kv_[key];
    slot = std::move(value);
    if (!watchers_.empty()) notifyWatchers(key, wire::kKeyCreated, "", slot);
  } else {
    if (value.size() > it->second.size()) {
      if (!reserve(value.size() - it->second.size(), error)) return error;
    } else {
      release(it->second.size() - value.size());
    }
    if (!watchers_.empty()) {
      std::string old = std::move(it->second);
      it->second = std::move(value);
      notifyWatchers(key, wire::kKeyUpdated, old, it->second);
    } else {
      it->second = std::move(value);
    }
  }
  wake(key);
  return {};
}

namespace {
// std::stoll semantics (PyTorch parses stored counters with it): optional
// whitespace and sign, at least one digit, trailing bytes ignored.
bool parseCounter(const std::string& text, int64_t& out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || errno == ERANGE) return false;
  out = v;
  return true;
}
}  // namespace

std::string ServerState::doAdd(Conn&, const std::string& key, int64_t delta,
                               int64_t& out) {
  int64_t current = 0;
  auto it = kv_.find(key);
  if (it != kv_.end() && !parseCounter(it->second, current))
    return "ADD on key '" + key + "' whose value is not a decimal integer";
  if (__builtin_add_overflow(current, delta, &out))
    return "ADD on key '" + key + "' overflows a 64-bit integer";
  return doSet(key, std::to_string(out));
}

void ServerState::doWait(Conn& c, const std::vector<std::string>& keys) {
  int64_t missing = 0;
  for (const auto& k : keys) {
    if (present(k)) continue;
    ++missing;
    waiters_[k].push_back(c.id);
    c.waitKeys.push_back(k);
  }
  c.awaited = missing;
  if (missing == 0) wire::Writer(outbox_.bufferFor(c.id)).u8(wire::kStopWaiting);
}

void ServerState::wake(const std::string& key, bool onlyOne) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<ConnId> woken;
  if (onlyOne) {
    woken.push_back(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) waiters_.erase(it);
  } else {
    woken = std::move(it->second);
    waiters_.erase(it);
  }
  for (ConnId id : woken) {
    auto ci = conns_.find(id);
    if (ci == conns_.end()) continue;
    Conn& w = *ci->second;
    auto pos = std::find(w.waitKeys.begin(), w.waitKeys.end(), key);
    if (pos != w.waitKeys.end()) w.waitKeys.erase(pos);
    if (--w.awaited == 0) {
      cancelWaits(w);  // drops duplicate registrations, if any are left
      wire::Writer(outbox_.bufferFor(id)).u8(wire::kStopWaiting);
    }
  }
}

void ServerState::cancelWaits(Conn& c) {
  for (const auto& k : c.waitKeys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), c.id), v.end());
    if (v.empty()) waiters_.erase(it);
  }
  c.waitKeys.clear();
  c.awaited = 0;
}

void ServerState::notifyWatchers(const std::string& key, uint8_t type,
                                 std::string_view oldValue,
                                 std::string_view newValue) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  for (ConnId id : it->second)
    wire::Writer(outbox_.bufferFor(id))
        .u8(type)
        .bytes(key)
        .bytes(oldValue)
        .bytes(newValue);
}

void ServerState::doCompareSet(Conn& c, wire::Request& r) {
  const std::string& key = r.keys[0];
  std::string& expected = r.values[0];
  std::string& desired = r.values[1];
  auto& out = outbox_.bufferFor(c.id);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    // PyTorch's rule: a missing key is created only when expected is empty;
    // otherwise the reply is `expected` itself, unchanged.
    if (!expected.empty()) {
      wire::Writer(out).bytes(expected);
      return;
    }
    std::string copy = desired;
    std::string err = doSet(key, std::move(copy));
    wire::Writer(outbox_.bufferFor(c.id)).bytes(err.empty() ? desired : "");
    return;
  }
  if (it->second == expected) {
    std::string copy = desired;
    doSet(key, std::move(copy));
    it = kv_.find(key);
  }
  wire::Writer(outbox_.bufferFor(c.id)).bytes(it->second);
}

void ServerState::doQueuePop(Conn& c, const std::string& key) {
  wire::Writer w(outbox_.bufferFor(c.id));
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) {
    w.i64(0);
    return;
  }
  w.i64(static_cast<int64_t>(it->second.size()));
  w.bytes(it->second.front());
  release(it->second.front().size() + kEntryOverhead);
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
}

void ServerState::doBarrier(Conn& c, const std::string& key, int64_t worldSize) {
  int64_t count = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) parseCounter(it->second, count);
  ++count;
  // Store the new count without waking: earlier arrivals must sleep until
  // the last one comes.
  std::string text = std::to_string(count);
  std::string err;
  if (it == kv_.end()) {
    if (reserve(key.size() + text.size() + kEntryOverhead, err)) kv_[key] = text;
  } else {
    it->second = text;
  }
  if (count >= worldSize) {
    wire::Writer(outbox_.bufferFor(c.id)).u8(wire::kStopWaiting);
    wake(key);
    return;
  }
  waiters_[key].push_back(c.id);
  c.waitKeys.push_back(key);
  c.awaited = 1;
}

std::string ServerState::execute(Conn& c, wire::Request& r) {
  const std::string& key = r.keys.empty() ? std::string() : r.keys[0];
  switch (r.cmd) {
    case Command::kValidate:
      if (r.u32 != wire::kValidationMagic) return "bad VALIDATE magic";
      return {};
    case Command::kPing:
      wire::Writer(outbox_.bufferFor(c.id)).u32(r.u32);
      return {};
    case Command::kSet:
      return doSet(key, std::move(r.values[0]));
    case Command::kCompareSet:
      doCompareSet(c, r);
      return {};
    case Command::kGet: {
      auto it = kv_.find(key);
      wire::Writer(outbox_.bufferFor(c.id))
          .bytes(it == kv_.end() ? std::string_view() : it->second);
      return {};
    }
    case Command::kAdd: {
      int64_t result = 0;
      std::string err = doAdd(c, key, r.number, result);
      if (err.empty()) wire::Writer(outbox_.bufferFor(c.id)).i64(result);
      return err;
    }
    case Command::kCheck: {
      bool all = std::all_of(r.keys.begin(), r.keys.end(),
                             [&](const std::string& k) { return present(k); });
      wire::Writer(outbox_.bufferFor(c.id))
          .u8(all ? wire::kCheckReady : wire::kCheckNotReady);
      return {};
    }
    case Command::kWait:
      doWait(c, r.keys);
      return {};
    case Command::kGetNumKeys:
      wire::Writer(outbox_.bufferFor(c.id)).i64(static_cast<int64_t>(kv_.size()));
      return {};
    case Command::kDeleteKey: {
      auto it = kv_.find(key);
      int64_t erased = it != kv_.end() ? 1 : 0;
      if (erased) {
        release(key.size() + it->second.size() + kEntryOverhead);
        if (!watchers_.empty())
          notifyWatchers(key, wire::kKeyDeleted, it->second, "");
        kv_.erase(it);
      }
      wire::Writer(outbox_.bufferFor(c.id)).i64(erased);
      return {};
    }
    case Command::kAppend: {
      auto it = kv_.find(key);
      if (it == kv_.end()) return doSet(key, std::move(r.values[0]));
      std::string err;
      if (!reserve(r.values[0].size(), err)) return err;
      it->second.append(r.values[0]);
      wake(key);
      return {};
    }
    case Command::kMultiGet: {
      wire::Writer w(outbox_.bufferFor(c.id));
      for (const auto& k : r.keys) {
        auto it = kv_.find(k);
        w.bytes(it == kv_.end() ? std::string_view() : it->second);
      }
      return {};
    }
    case Command::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) {
        std::string err = doSet(r.keys[i], std::move(r.values[i]));
        if (!err.empty()) return err;
      }
      return {};
    case Command::kCancelWait:
      cancelWaits(c);
      wire::Writer(outbox_.bufferFor(c.id)).u8(wire::kWaitCanceled);
      return {};
    case Command::kQueuePush: {
      std::string err;
      if (!reserve(r.values[0].size() + kEntryOverhead, err)) return err;
      queues_[key].push_back(std::move(r.values[0]));
      wake(key, /*onlyOne=*/true);
      return {};
    }
    case Command::kQueuePop:
      doQueuePop(c, key);
      return {};
    case Command::kQueueLen: {
      auto it = queues_.find(key);
      wire::Writer(outbox_.bufferFor(c.id))
          .i64(it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      return {};
    }
    case Command::kListKeys: {
      wire::Writer w(outbox_.bufferFor(c.id));
      w.i64(static_cast<int64_t>(kv_.size()));
      for (const auto& kvp : kv_) w.bytes(kvp.first);
      return {};
    }
    case Command::kBarrier:
      if (r.number <= 0) return "BARRIER with a world size of " + std::to_string(r.number);
      doBarrier(c, key, r.number);
      return {};
    case Command::kWatchKey:
      watchers_[key].push_back(c.id);
      c.watching = true;
      wire::Writer(outbox_.bufferFor(c.id)).u8(wire::kKeyCallbackRegistered);
      return {};
  }
  return "unhandled command";
}

}  // namespace ddprun::store
