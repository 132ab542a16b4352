#include "heartbeat.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/strings.h"

namespace ddprun::rendezvous::detail {

int64_t systemWallMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string encodeBeat(int64_t seq, int64_t wallMs) {
  return std::to_string(seq) + " " + std::to_string(wallMs);
}

bool decodeBeat(const std::string& value, int64_t& seq, int64_t& wallMs) {
  auto parts = str::split(value, ' ');
  if (parts.size() != 2) return false;
  int64_t s = 0, w = 0;
  if (!str::parseInt(parts[0], s, int64_t{0}) || !str::parseInt(parts[1], w, int64_t{0}))
    return false;
  seq = s;
  wallMs = w;
  return true;
}

// ---------------------------------------------------------------------------
// LivenessTracker

void LivenessTracker::watch(const std::vector<std::string>& nodes, int64_t nowMs) {
  std::map<std::string, Seen> kept;
  order_.clear();
  for (const auto& node : nodes) {
    if (kept.count(node)) continue;  // listed twice: watched once
    auto it = seen_.find(node);
    kept[node] = it != seen_.end() ? it->second : Seen{-1, nowMs};
    order_.push_back(node);
  }
  seen_ = std::move(kept);
}

// A new seq renews the node. The beat's own time is trusted only when it is
// plausible on the watcher's clock (not in the future, at most one interval
// old): a sender whose clock is skewed is renewed as of now instead, which
// can only make the watcher more patient. The renewal never goes backwards,
// so a stale beat seen for the first time cannot cut a node's first timeout.
void LivenessTracker::observe(const std::string& node, const std::string& value,
                              int64_t nowMs) {
  auto it = seen_.find(node);
  int64_t seq = 0, wallMs = 0;
  if (it == seen_.end() || !decodeBeat(value, seq, wallMs)) return;
  Seen& s = it->second;
  if (seq == s.seq) return;
  s.seq = seq;
  const int64_t age = nowMs - wallMs;
  const bool plausible = age >= 0 && age <= opts_.interval.count();
  s.lastBeatMs = std::max(s.lastBeatMs, plausible ? wallMs : nowMs);
}

std::vector<std::string> LivenessTracker::expired(int64_t nowMs) const {
  std::vector<std::string> out;
  for (const auto& node : order_)
    if (nowMs >= seen_.at(node).lastBeatMs + opts_.timeout().count()) out.push_back(node);
  return out;
}

int64_t LivenessTracker::nextExpiry() const {
  int64_t earliest = INT64_MAX;
  for (const auto& [node, s] : seen_)
    earliest = std::min(earliest, s.lastBeatMs + opts_.timeout().count());
  return earliest;
}

int64_t LivenessTracker::silentFor(const std::string& node, int64_t nowMs) const {
  auto it = seen_.find(node);
  if (it == seen_.end()) return 0;
  return std::max<int64_t>(0, nowMs - it->second.lastBeatMs);
}

// ---------------------------------------------------------------------------
// Heartbeat

namespace {

// Reads the watched nodes' beat keys with as few requests as it can: keys
// seen once exist for good (the last beat stays), so they go into one
// MULTI_GET, which would block on an absent key; keys never seen yet are
// CHECKed one by one first. In steady state: one request per wake-up.
class BeatReader {
 public:
  explicit BeatReader(std::string prefix) : prefix_(std::move(prefix)) {}

  // Values in the order of `nodes`, "" for absent keys.
  std::vector<std::string> read(store::Store& store,
                                const std::vector<std::string>& nodes) {
    std::vector<std::string> keys;
    std::vector<size_t> at;
    for (size_t i = 0; i < nodes.size(); ++i) {
      std::string k = prefix_ + nodes[i];
      if (!present_.count(k) && store.check({k})) present_.insert(k);
      if (!present_.count(k)) continue;
      keys.push_back(std::move(k));
      at.push_back(i);
    }
    std::vector<std::string> values(nodes.size());
    if (keys.empty()) return values;
    auto got = store.multiGet(keys);
    for (size_t j = 0; j < at.size() && j < got.size(); ++j)
      values[at[j]] = std::move(got[j]);
    return values;
  }

 private:
  std::string prefix_;
  std::set<std::string> present_;
};

}  // namespace

// Threads: the beater writes on its own connection every interval; the
// watcher reads the peers' keys on another and keeps the tracker. mu_ guards
// the tracker, the callback and stopping_; cbMu_ is held while onDead runs,
// so that setPeers() (from any other thread) returns only once the previous
// callback is not running and never will.
struct Heartbeat::Impl {
  HeartbeatOptions opts_;
  Connect connect_;
  std::string prefix_;
  std::string self_;
  WallClock clock_;

  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  LivenessTracker tracker_;
  OnDead onDead_;
  OnLost onLost_;  // guarded by mu_
  uint64_t generation_ = 0;  // bumped by setPeers: a callback of an older one is dropped
  std::recursive_mutex cbMu_;

  std::shared_ptr<store::CancelToken> beatCancel_ =
      std::make_shared<store::CancelToken>();
  std::shared_ptr<store::CancelToken> watchCancel_ =
      std::make_shared<store::CancelToken>();
  std::thread beater_, watcher_;
  std::mutex stopMu_;  // stop() from two threads joins once

  Impl(HeartbeatOptions o, Connect c, std::string p, std::string s, WallClock w)
      : opts_(o),
        connect_(std::move(c)),
        prefix_(std::move(p)),
        self_(std::move(s)),
        clock_(std::move(w)),
        tracker_(o) {}

  void beat();
  void watch();
  enum class Read { kDone, kFailed, kCancelled };
  Read readBeats(std::unique_ptr<store::Store>& store, BeatReader& reader,
                 const std::vector<std::string>& nodes, std::vector<std::string>& values);
  void decide(const std::vector<std::string>& nodes,
              const std::vector<std::string>& values);
  bool sleep(bool fullInterval);
};

// First beat at once, then one per interval. A failed write is retried at the
// next interval (TcpStore reconnects by itself; a failed connect is retried).
// A node whose writes have failed for the timeout has been dropped by its
// peers by now: onLost tells the rendezvous, once per such silence.
void Heartbeat::Impl::beat() {
  std::unique_ptr<store::Store> store;
  const std::string key = prefix_ + self_;
  int64_t lastOk = clock_();
  bool lostTold = false;
  for (int64_t seq = 0;; ++seq) {
    try {
      if (!store) store = connect_(beatCancel_);
      store->set(key, encodeBeat(seq, clock_()));
      // SET has no reply in the protocol: the CHECK's reply (same connection,
      // in order) says the beat arrived, not just that the kernel took it.
      store->check({key});
      lastOk = clock_();
      lostTold = false;
    } catch (const CancelledError&) {
      return;
    } catch (const Error& e) {
      DDPRUN_DEBUG("heartbeat: ", self_, " could not beat: ", e.message());
    }
    const int64_t silent = clock_() - lastOk;
    if (!lostTold && silent >= opts_.timeout().count()) {
      lostTold = true;
      OnLost onLost;
      {
        std::lock_guard lock(mu_);
        onLost = onLost_;
      }
      if (onLost) onLost(silent);
    }
    if (beatCancel_->sleepFor(opts_.interval)) return;
  }
}

// Each wake-up reads the watched keys and decides. A read that failed
// decides nothing (a store that cannot be read says nothing about the peers)
// and is retried after a full interval.
void Heartbeat::Impl::watch() {
  std::unique_ptr<store::Store> store;
  BeatReader reader(prefix_);
  for (;;) {
    std::vector<std::string> nodes, values;
    {
      std::lock_guard lock(mu_);
      nodes = tracker_.watched();
    }
    Read read = nodes.empty() ? Read::kDone : readBeats(store, reader, nodes, values);
    if (read == Read::kCancelled) return;
    if (read == Read::kDone) decide(nodes, values);
    if (!sleep(read == Read::kFailed)) return;
  }
}

Heartbeat::Impl::Read Heartbeat::Impl::readBeats(std::unique_ptr<store::Store>& store,
                                                 BeatReader& reader,
                                                 const std::vector<std::string>& nodes,
                                                 std::vector<std::string>& values) {
  try {
    if (!store) store = connect_(watchCancel_);
    values = reader.read(*store, nodes);
    return Read::kDone;
  } catch (const CancelledError&) {
    return Read::kCancelled;
  } catch (const Error& e) {
    DDPRUN_DEBUG("heartbeat: ", self_, " could not read its peers' beats: ", e.message());
    return Read::kFailed;
  }
}

// Feeds the tracker, then reports and forgets the nodes that expired (so
// each is reported once per setPeers). The callbacks run outside mu_ but
// under cbMu_, and only while no setPeers has replaced them.
void Heartbeat::Impl::decide(const std::vector<std::string>& nodes,
                             const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, int64_t>> dead;
  OnDead onDead;
  uint64_t generation = 0;
  {
    std::lock_guard lock(mu_);
    const int64_t now = clock_();
    for (size_t i = 0; i < values.size(); ++i) tracker_.observe(nodes[i], values[i], now);
    auto gone = tracker_.expired(now);
    if (gone.empty()) return;
    std::vector<std::string> alive;
    for (const auto& node : tracker_.watched())
      if (std::find(gone.begin(), gone.end(), node) == gone.end()) alive.push_back(node);
    for (const auto& node : gone) dead.emplace_back(node, tracker_.silentFor(node, now));
    tracker_.watch(alive, now);
    onDead = onDead_;
    generation = generation_;
  }
  std::lock_guard cbLock(cbMu_);
  for (const auto& [node, silent] : dead) {
    {
      std::lock_guard lock(mu_);
      if (generation != generation_) return;  // setPeers replaced them meanwhile
    }
    if (onDead) onDead(node, silent);
  }
}

// Until the next interval or the earliest expiry, whichever comes first (at
// least a millisecond, so a clock read just before an expiry cannot spin);
// a full interval after a failed read. False once stopping.
bool Heartbeat::Impl::sleep(bool fullInterval) {
  std::unique_lock lock(mu_);
  const int64_t expiry = tracker_.nextExpiry();
  int64_t ms = opts_.interval.count();
  if (!fullInterval && expiry != INT64_MAX) ms = std::min(ms, expiry - clock_());
  ms = std::max<int64_t>(ms, 1);
  return !wake_.wait_for(lock, std::chrono::milliseconds(ms),
                         [this] { return stopping_; });
}

Heartbeat::Heartbeat(HeartbeatOptions opts, Connect connect, std::string keyPrefix,
                     std::string self, WallClock clock) {
  DDPRUN_CHECK(opts.interval.count() > 0 && opts.maxAttempts > 0,
               "a heartbeat needs a positive interval and number of attempts, got ",
               opts.interval.count(), " ms and ", opts.maxAttempts);
  DDPRUN_CHECK(connect && clock, "a heartbeat needs a store and a clock");
  impl_ = std::make_unique<Impl>(opts, std::move(connect), std::move(keyPrefix),
                                 std::move(self), std::move(clock));
  impl_->beater_ = std::thread([impl = impl_.get()] { impl->beat(); });
  impl_->watcher_ = std::thread([impl = impl_.get()] { impl->watch(); });
}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::setPeers(std::vector<std::string> peers, OnDead onDead) {
  peers.erase(std::remove(peers.begin(), peers.end(), impl_->self_), peers.end());
  // Taken first (recursive: onDead itself may call setPeers), so that the
  // old callback has returned before the new set is in place.
  std::lock_guard cbLock(impl_->cbMu_);
  std::lock_guard lock(impl_->mu_);
  impl_->tracker_.watch(peers, impl_->clock_());
  impl_->onDead_ = std::move(onDead);
  ++impl_->generation_;
}

void Heartbeat::setOnLost(OnLost onLost) {
  std::lock_guard lock(impl_->mu_);
  impl_->onLost_ = std::move(onLost);
}

void Heartbeat::stop() {
  std::lock_guard stopLock(impl_->stopMu_);
  {
    std::lock_guard lock(impl_->mu_);
    impl_->stopping_ = true;
  }
  impl_->wake_.notify_all();
  impl_->beatCancel_->cancel();
  impl_->watchCancel_->cancel();
  if (impl_->beater_.joinable()) impl_->beater_.join();
  if (impl_->watcher_.joinable()) impl_->watcher_.join();
}

}  // namespace ddprun::rendezvous::detail
