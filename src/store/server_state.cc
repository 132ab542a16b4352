#include "ddprun/store/server_state.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "ddprun/common/strings.h"
#include "ddprun/store/auth.h"
#include "server_conn.h"

namespace ddprun::store {

using wire::Command;


// What one WAIT/WATCH_KEY registration costs: the key is held twice (the
// server's waiter/watcher map and the connection's list) plus a hash node,
// a vector and allocator headers.
static size_t registrationCost(const std::string& key) { return 2 * key.size() + 160; }

ServerState::ServerState(ServerLimits limits, Outbox& outbox, ServerAuth auth)
    : limits_(limits), outbox_(outbox), auth_(std::move(auth)) {}

ServerState::~ServerState() = default;

void ServerState::open(ConnId id) {
  auto c = std::make_unique<Conn>();
  c->id = id;
  c->authed = auth_.secret.empty();
  conns_[id] = std::move(c);
}

void ServerState::releaseInFlight(size_t bytes) { release(bytes); }

void ServerState::closed(ConnId id, size_t inFlight, ConnEnd how) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  cancelWaits(c);
  endLeases(c, how);
  for (const auto& k : c.watchKeys) {
    auto w = watchers_.find(k);
    if (w != watchers_.end()) {
      auto& v = w->second;
      v.erase(std::remove(v.begin(), v.end(), id), v.end());
      if (v.empty()) watchers_.erase(w);
    }
    release(registrationCost(k));
  }
  release(c.unsent - std::min(inFlight, c.unsent) + c.held.size());
  if (c.parser) release(c.parser->declaredBytes());
  conns_.erase(it);
}

std::optional<wire::Dialect> ServerState::dialectOf(ConnId id) const {
  auto it = conns_.find(id);
  if (it == conns_.end() || !it->second->parser) return std::nullopt;
  return it->second->parser->dialect();
}

size_t ServerState::eraseKeysOutside(std::string_view keep) {
  return eraseIf(
      [&](const std::string& k) { return k.compare(0, keep.size(), keep) != 0; });
}

size_t ServerState::eraseKeysUnder(const std::vector<std::string>& prefixes) {
  return eraseIf([&](const std::string& k) {
    for (const auto& p : prefixes)
      if (k.compare(0, p.size(), p) == 0) return true;
    return false;
  });
}

size_t ServerState::eraseIf(const std::function<bool(const std::string&)>& outside) {
  size_t erased = 0;
  for (auto it = kv_.begin(); it != kv_.end();) {
    if (!outside(it->first)) {
      ++it;
      continue;
    }
    release(it->first.size() + it->second.size() + kEntryOverhead);
    if (!watchers_.empty()) notifyWatchers(it->first, wire::kKeyDeleted, it->second, "");
    it = kv_.erase(it);
    ++erased;
  }
  for (auto it = queues_.begin(); it != queues_.end();) {
    if (!outside(it->first)) {
      ++it;
      continue;
    }
    for (const auto& entry : it->second) release(entry.size() + kEntryOverhead);
    it = queues_.erase(it);
    ++erased;
  }
  return erased;
}

ServerStats ServerState::stats() const {
  // O(1): the io thread refreshes the stats after every batch of work.
  return {requests_, rejected_, kv_.size(), memory_, parsed_};
}

bool ServerState::paused(ConnId id) const {
  auto it = conns_.find(id);
  return it != conns_.end() && it->second->unsent > limits_.maxUnsentBytes;
}

bool ServerState::partial(ConnId id) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return false;
  const Conn& c = *it->second;
  return !c.detect.empty() || (c.parser && c.parser->partial());
}

void ServerState::sent(ConnId id, size_t bytes) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  size_t n = std::min(bytes, it->second->unsent);
  it->second->unsent -= n;
  release(n);
}

std::string ServerState::receive(ConnId id, std::string_view bytes) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return "unknown connection";
  Conn& c = *it->second;
  std::string error;
  if (!c.held.empty()) {
    error = hold(c, bytes);  // still paused: queue behind what is held
  } else {
    size_t used = 0;
    error = process(c, bytes, used);
    if (error.empty() && used < bytes.size()) error = hold(c, bytes.substr(used));
  }
  if (!error.empty()) ++rejected_;
  return error;
}

std::string ServerState::resume(ConnId id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return {};
  Conn& c = *it->second;
  if (c.held.empty() || c.unsent > limits_.maxUnsentBytes) return {};
  std::string input = std::move(c.held);
  c.held.clear();
  release(input.size());
  size_t used = 0;
  std::string error = process(c, input, used);
  if (error.empty() && used < input.size())
    error = hold(c, std::string_view(input).substr(used));
  if (!error.empty()) ++rejected_;
  return error;
}

std::string ServerState::hold(Conn& c, std::string_view rest) {
  std::string error;
  if (!reserve(rest.size(), error)) return error;
  c.held.append(rest);
  return {};
}

// Feeds `data` from `used` on, request by request, stopping at a request
// boundary when the connection's unsent output is over its cap. The first
// one (legacy) or five (v2 VALIDATE) bytes pick the dialect; they never span
// two requests, because a stream starting with 00 is a VALIDATE (5 bytes) or
// a legacy SET (more than 5).
std::string ServerState::process(Conn& c, std::string_view data, size_t& used) {
  if (!c.parser) {
    while (used < data.size() && !c.parser) {
      size_t want = c.detect.empty() ? 1 : 5 - c.detect.size();
      size_t take = std::min(want, data.size() - used);
      c.detect.append(data.substr(used, take));
      used += take;
      auto d = wire::detectDialect(c.detect);
      if (!d) continue;
      c.parser.emplace(*d, wireLimits(c), [this](size_t n) {
        std::string err;
        reserve(n, err);
        return err;
      });
    }
    if (!c.parser) return {};
    std::string first = std::move(c.detect);
    c.detect.clear();
    size_t firstUsed = 0;
    std::string err = feed(c, first, firstUsed);
    if (!err.empty()) return err;
  }
  return feed(c, data, used);
}

std::string ServerState::feed(Conn& c, std::string_view data, size_t& used) {
  while (used < data.size() && c.unsent <= limits_.maxUnsentBytes) {
    const uint64_t parsedBefore = c.parser->bytesParsed();
    auto res = c.parser->feed(data.substr(used));
    parsed_ += c.parser->bytesParsed() - parsedBefore;
    if (res.status == wire::ParseStatus::kBad) return res.error;
    used += res.consumed;
    if (res.status == wire::ParseStatus::kNeedMore) break;
    ++requests_;
    // The request's bytes are now the execution's to account for: what it
    // stores it reserves again, the rest is freed with the request.
    release(c.parser->takeDeclared());
    std::string error = execute(c, c.parser->request());
    c.parser->next();
    if (!error.empty()) return error;
  }
  return {};
}

bool ServerState::present(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool ServerState::reserve(size_t bytes, std::string& error) {
  if (bytes > limits_.maxMemoryBytes - std::min(memory_, limits_.maxMemoryBytes)) {
    error = "store memory limit of " + std::to_string(limits_.maxMemoryBytes) +
            " bytes reached (raise --max-memory)";
    return false;
  }
  memory_ += bytes;
  return true;
}

void ServerState::release(size_t bytes) { memory_ -= std::min(memory_, bytes); }

// Charges a reply of `bytes` to the requesting connection and returns its
// output buffer, or nullptr with `error` set when the reply is over the
// per-reply cap or the budget.
std::string* ServerState::reply(Conn& c, size_t bytes, std::string& error) {
  if (bytes > limits_.maxReplyBytes) {
    error = "reply of " + std::to_string(bytes) + " bytes exceeds the limit of " +
            std::to_string(limits_.maxReplyBytes) + " (raise --max-reply-bytes)";
    return nullptr;
  }
  if (!reserve(bytes, error)) return nullptr;
  c.unsent += bytes;
  return &outbox_.bufferFor(c.id);
}

// Charges output for a connection other than the requester (a woken waiter,
// a watcher). One that is over its hard cap or the budget is closed instead,
// so a client that does not read cannot make others' requests fail.
bool ServerState::pushTo(Conn& w, size_t bytes) {
  if (w.doomed) return false;
  std::string error;
  if (w.unsent + bytes > limits_.maxUnsentBytes + limits_.maxReplyBytes) {
    doom(w, "it does not read its notifications: " + std::to_string(w.unsent + bytes) +
                " bytes would wait for it (limit " +
                std::to_string(limits_.maxUnsentBytes + limits_.maxReplyBytes) + ")");
    return false;
  }
  if (!reserve(bytes, error)) {
    doom(w, error);
    return false;
  }
  w.unsent += bytes;
  return true;
}

void ServerState::doom(Conn& w, const std::string& why) {
  w.doomed = true;
  ++rejected_;
  outbox_.closeLater(w.id, why);
}

bool ServerState::eraseKey(const std::string& key) {
  auto it = kv_.find(key);
  if (it == kv_.end()) return false;
  release(key.size() + it->second.size() + kEntryOverhead);
  if (!watchers_.empty()) notifyWatchers(key, wire::kKeyDeleted, it->second, "");
  kv_.erase(it);
  return true;
}

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
    return "ADD on key '" + str::escape(key) + "' whose value is not a decimal integer";
  if (__builtin_add_overflow(current, delta, &out))
    return "ADD on key '" + str::escape(key) + "' overflows a 64-bit integer";
  return doSet(key, std::to_string(out));
}

std::string ServerState::doWait(Conn& c, const std::vector<std::string>& keys) {
  std::string error;
  std::vector<const std::string*> missing;
  for (const auto& k : keys)
    if (!present(k)) missing.push_back(&k);
  if (c.waitKeys.size() + missing.size() > limits_.maxWaitKeys)
    return "WAIT on " + std::to_string(c.waitKeys.size() + missing.size()) +
           " keys at once exceeds the limit of " + std::to_string(limits_.maxWaitKeys) +
           " (raise --max-wait-keys)";
  size_t cost = 0;
  for (const auto* k : missing) cost += registrationCost(*k);
  if (!reserve(cost, error)) return error;
  for (const auto* k : missing) {
    waiters_[*k].push_back(c.id);
    c.waitKeys.push_back(*k);
  }
  c.awaited = static_cast<int64_t>(missing.size());
  if (missing.empty()) {
    std::string* out = reply(c, 1, error);
    if (!out) return error;
    wire::Writer(*out).u8(wire::kStopWaiting);
  }
  return {};
}

std::string ServerState::doWatch(Conn& c, const std::string& key) {
  std::string error;
  // A second registration of the same key replaces the first (one
  // notification per change), so repeating WATCH_KEY costs nothing.
  bool known =
      std::find(c.watchKeys.begin(), c.watchKeys.end(), key) != c.watchKeys.end();
  if (!known) {
    if (c.watchKeys.size() >= limits_.maxWatchKeys)
      return "WATCH_KEY on more than " + std::to_string(limits_.maxWatchKeys) +
             " keys (raise --max-watch-keys)";
    if (!reserve(registrationCost(key), error)) return error;
    c.watchKeys.push_back(key);
    watchers_[key].push_back(c.id);
  }
  std::string* out = reply(c, 1, error);
  if (!out) return error;
  wire::Writer(*out).u8(wire::kKeyCallbackRegistered);
  return {};
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
    if (pos != w.waitKeys.end()) {
      release(registrationCost(*pos));
      w.waitKeys.erase(pos);
    }
    if (--w.awaited == 0) {
      cancelWaits(w);  // drops duplicate registrations, if any are left
      if (pushTo(w, 1)) wire::Writer(outbox_.bufferFor(id)).u8(wire::kStopWaiting);
    }
  }
}

void ServerState::cancelWaits(Conn& c) {
  for (const auto& k : c.waitKeys) {
    release(registrationCost(k));
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
  size_t bytes = 1 + 24 + key.size() + oldValue.size() + newValue.size();
  for (ConnId id : std::vector<ConnId>(it->second)) {
    auto ci = conns_.find(id);
    if (ci == conns_.end() || !pushTo(*ci->second, bytes)) continue;
    wire::Writer(outbox_.bufferFor(id))
        .u8(type)
        .bytes(key)
        .bytes(oldValue)
        .bytes(newValue);
  }
}

std::string ServerState::doCompareSet(Conn& c, wire::Request& r) {
  const std::string& key = r.keys[0];
  std::string& expected = r.values[0];
  std::string& desired = r.values[1];
  std::string error;
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    // PyTorch's rule: a missing key is created only when expected is empty;
    // otherwise the reply is `expected` itself, unchanged.
    if (!expected.empty()) {
      std::string* out = reply(c, 8 + expected.size(), error);
      if (!out) return error;
      wire::Writer(*out).bytes(expected);
      return {};
    }
    std::string copy = desired;
    std::string err = doSet(key, std::move(copy));
    std::string* out = reply(c, 8 + (err.empty() ? desired.size() : 0), error);
    if (!out) return error;
    wire::Writer(*out).bytes(err.empty() ? desired : "");
    return {};
  }
  if (it->second == expected) {
    std::string copy = desired;
    doSet(key, std::move(copy));
    it = kv_.find(key);
  }
  std::string* out = reply(c, 8 + it->second.size(), error);
  if (!out) return error;
  wire::Writer(*out).bytes(it->second);
  return {};
}

std::string ServerState::doQueuePop(Conn& c, const std::string& key) {
  std::string error;
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) {
    std::string* out = reply(c, 8, error);
    if (!out) return error;
    wire::Writer(*out).i64(0);
    return {};
  }
  std::string* out = reply(c, 16 + it->second.front().size(), error);
  if (!out) return error;
  wire::Writer(*out)
      .i64(static_cast<int64_t>(it->second.size()))
      .bytes(it->second.front());
  release(it->second.front().size() + kEntryOverhead);
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return {};
}

std::string ServerState::doMultiGet(Conn& c, const std::vector<std::string>& keys) {
  // Size first: a reply is charged whole before any of it is written.
  size_t bytes = 0;
  for (const auto& k : keys) {
    auto it = kv_.find(k);
    bytes += 8 + (it == kv_.end() ? 0 : it->second.size());
    if (bytes > limits_.maxReplyBytes)
      return "MULTI_GET of " + std::to_string(keys.size()) +
             " keys: reply of more than " + std::to_string(limits_.maxReplyBytes) +
             " bytes (raise --max-reply-bytes)";
  }
  std::string error;
  std::string* out = reply(c, bytes, error);
  if (!out) return "MULTI_GET: " + error;
  wire::Writer w(*out);
  for (const auto& k : keys) {
    auto it = kv_.find(k);
    w.bytes(it == kv_.end() ? std::string_view() : it->second);
  }
  return {};
}

std::string ServerState::doListKeys(Conn& c) {
  size_t bytes = 8;
  for (const auto& kvp : kv_) bytes += 8 + kvp.first.size();
  std::string error;
  std::string* out = reply(c, bytes, error);
  if (!out) return "LIST_KEYS: " + error;
  wire::Writer w(*out);
  w.i64(static_cast<int64_t>(kv_.size()));
  for (const auto& kvp : kv_) w.bytes(kvp.first);
  return {};
}

std::string ServerState::doBarrier(Conn& c, const std::string& key, int64_t worldSize) {
  int64_t count = 0;
  auto it = kv_.find(key);
  if (it != kv_.end()) parseCounter(it->second, count);
  ++count;
  // Store the new count without waking: earlier arrivals must sleep until
  // the last one comes.
  std::string text = std::to_string(count);
  std::string err;
  if (it == kv_.end()) {
    if (!reserve(key.size() + text.size() + kEntryOverhead, err)) return err;
    kv_[key] = text;
  } else {
    if (text.size() > it->second.size() && !reserve(text.size() - it->second.size(), err))
      return err;
    it->second = text;
  }
  if (count >= worldSize) {
    std::string* out = reply(c, 1, err);
    if (!out) return err;
    wire::Writer(*out).u8(wire::kStopWaiting);
    wake(key);
    return {};
  }
  if (c.waitKeys.size() >= limits_.maxWaitKeys)
    return "BARRIER: too many keys waited on (raise --max-wait-keys)";
  if (!reserve(registrationCost(key), err)) return err;
  waiters_[key].push_back(c.id);
  c.waitKeys.push_back(key);
  c.awaited = 1;
  return {};
}

// A reply of a known size: charged (reply cap, budget), then written.
template <typename Write>
std::string ServerState::put(Conn& c, size_t bytes, Write&& write) {
  std::string error;
  std::string* out = reply(c, bytes, error);
  if (!out) return error;
  wire::Writer w(*out);
  write(w);
  return {};
}

std::string ServerState::execute(Conn& c, wire::Request& r) {
  if (!c.authed) return authStep(c, r);
  const std::string& key = r.keys.empty() ? std::string() : r.keys[0];
  if (!auth_.secret.empty() && r.cmd == Command::kGet && key == auth::kVerdictKey) {
    std::string proof = auth::serverProof(auth_.secret, c.nonce);
    return put(c, 8 + proof.size(), [&](wire::Writer& w) { w.bytes(proof); });
  }
  if (!leaseRules_.empty()) {
    if (std::string refused = refuseTombstoneWrite(r); !refused.empty()) return refused;
    switch (r.cmd) {
      case Command::kGet:
      case Command::kCheck:
      case Command::kWait:
      case Command::kMultiGet: probeTombstones(c, r.keys); break;
      default: break;
    }
  }
  switch (r.cmd) {
    case Command::kValidate:
      if (r.u32 != wire::kValidationMagic) return "bad VALIDATE magic";
      return {};
    case Command::kPing:
      return put(c, 4, [&](wire::Writer& w) { w.u32(r.u32); });
    case Command::kSet: {
      std::string err = doSet(key, std::move(r.values[0]));
      if (err.empty() && !leaseRules_.empty()) err = bindLease(c, key);
      return err;
    }
    case Command::kCompareSet: {
      std::string desired = leaseRules_.empty() ? std::string() : r.values[1];
      std::string err = doCompareSet(c, r);
      if (err.empty() && !leaseRules_.empty()) {
        auto it = kv_.find(key);
        if (it != kv_.end() && it->second == desired) err = bindLease(c, key);
      }
      return err;
    }
    case Command::kGet: {
      auto it = kv_.find(key);
      std::string_view v = it == kv_.end() ? std::string_view() : it->second;
      return put(c, 8 + v.size(), [&](wire::Writer& w) { w.bytes(v); });
    }
    case Command::kAdd: {
      int64_t result = 0;
      std::string err = doAdd(c, key, r.number, result);
      if (!err.empty()) return err;
      return put(c, 8, [&](wire::Writer& w) { w.i64(result); });
    }
    case Command::kCheck: {
      bool all = std::all_of(r.keys.begin(), r.keys.end(),
                             [&](const std::string& k) { return present(k); });
      return put(c, 1, [&](wire::Writer& w) {
        w.u8(all ? wire::kCheckReady : wire::kCheckNotReady);
      });
    }
    case Command::kWait:
      return doWait(c, r.keys);
    case Command::kGetNumKeys:
      return put(c, 8, [&](wire::Writer& w) { w.i64(static_cast<int64_t>(kv_.size())); });
    case Command::kDeleteKey: {
      const int64_t erased = eraseKey(key) ? 1 : 0;
      if (erased && !leaseOwner_.empty()) forgetLease(key);
      return put(c, 8, [&](wire::Writer& w) { w.i64(erased); });
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
    case Command::kMultiGet:
      return doMultiGet(c, r.keys);
    case Command::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) {
        std::string err = doSet(r.keys[i], std::move(r.values[i]));
        if (err.empty() && !leaseRules_.empty()) err = bindLease(c, r.keys[i]);
        if (!err.empty()) return err;
      }
      return {};
    case Command::kCancelWait:
      cancelWaits(c);
      return put(c, 1, [&](wire::Writer& w) { w.u8(wire::kWaitCanceled); });
    case Command::kQueuePush: {
      std::string err;
      if (!reserve(r.values[0].size() + kEntryOverhead, err)) return err;
      queues_[key].push_back(std::move(r.values[0]));
      wake(key, /*onlyOne=*/true);
      return {};
    }
    case Command::kQueuePop:
      return doQueuePop(c, key);
    case Command::kQueueLen: {
      auto it = queues_.find(key);
      return put(c, 8, [&](wire::Writer& w) {
        w.i64(it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      });
    }
    case Command::kListKeys:
      return doListKeys(c);
    case Command::kBarrier:
      if (r.number <= 0) return "BARRIER with a world size of " + std::to_string(r.number);
      return doBarrier(c, key, r.number);
    case Command::kWatchKey:
      return doWatch(c, key);
  }
  return "unhandled command";
}

}  // namespace ddprun::store
