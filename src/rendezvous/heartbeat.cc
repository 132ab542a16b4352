#include "heartbeat.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

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
  std::vector<std::string> order;
  std::vector<Seen> seen;
  std::unordered_set<std::string_view> listed;  // views into `nodes`
  order.reserve(nodes.size());
  seen.reserve(nodes.size());
  for (const auto& node : nodes) {
    if (!listed.insert(node).second) continue;  // listed twice: watched once
    auto it = index_.find(node);
    seen.push_back(it != index_.end() ? seen_[it->second] : Seen{-1, nowMs});
    order.push_back(node);
  }
  order_ = std::move(order);
  seen_ = std::move(seen);
  reindex();
}

void LivenessTracker::reindex() {
  index_.clear();
  index_.reserve(order_.size());
  for (size_t i = 0; i < order_.size(); ++i) index_.emplace(order_[i], i);
}

void LivenessTracker::observe(const std::string& node, const std::string& value,
                              int64_t nowMs) {
  auto it = index_.find(node);
  if (it != index_.end()) observeAt(it->second, value, nowMs);
}

// A new seq renews the node. The beat's own time is trusted only when it is
// plausible on the watcher's clock (not in the future, at most one interval
// old): a sender whose clock is skewed is renewed as of now instead, which
// can only make the watcher more patient. The renewal never goes backwards,
// so a stale beat seen for the first time cannot cut a node's first timeout.
void LivenessTracker::observeAt(size_t i, const std::string& value, int64_t nowMs) {
  int64_t seq = 0, wallMs = 0;
  if (!decodeBeat(value, seq, wallMs)) return;
  Seen& s = seen_[i];
  if (seq == s.seq) return;
  s.seq = seq;
  const int64_t age = nowMs - wallMs;
  const bool plausible = age >= 0 && age <= opts_.interval.count();
  s.lastBeatMs = std::max(s.lastBeatMs, plausible ? wallMs : nowMs);
}

std::vector<std::string> LivenessTracker::expired(int64_t nowMs) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < order_.size(); ++i)
    if (nowMs >= expiresAt(i)) out.push_back(order_[i]);
  return out;
}

// One pass: the expired move out, the others move down in order.
std::vector<LivenessTracker::Silent> LivenessTracker::takeExpired(int64_t nowMs) {
  std::vector<Silent> out;
  size_t kept = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    if (nowMs >= expiresAt(i)) {
      out.push_back(
          {std::move(order_[i]), std::max<int64_t>(0, nowMs - seen_[i].lastBeatMs)});
      continue;
    }
    if (kept != i) {
      order_[kept] = std::move(order_[i]);
      seen_[kept] = seen_[i];
    }
    ++kept;
  }
  if (out.empty()) return out;
  order_.resize(kept);
  seen_.resize(kept);
  reindex();
  return out;
}

int64_t LivenessTracker::nextExpiry() const {
  int64_t earliest = INT64_MAX;
  for (size_t i = 0; i < seen_.size(); ++i) earliest = std::min(earliest, expiresAt(i));
  return earliest;
}

int64_t LivenessTracker::silentFor(const std::string& node, int64_t nowMs) const {
  auto it = index_.find(node);
  if (it == index_.end()) return 0;
  return std::max<int64_t>(0, nowMs - seen_[it->second].lastBeatMs);
}

// ---------------------------------------------------------------------------
// Heartbeat

namespace {

// Reads the watched nodes' beat keys for the watcher thread. Keys seen once
// exist for good (the last beat stays), so they go into one MULTI_GET, which
// would block on an absent key. Keys never seen are probed (probe()) with a
// bounded number of CHECKs per wake-up. The read plan (keys, and which
// watched node each is) is kept between wake-ups and rebuilt only when the
// watched list changes or a key is first seen: a steady wake-up builds
// nothing but the values it reads. Not thread-safe.
class BeatReader {
 public:
  BeatReader(std::string prefix, const std::atomic<bool>& stopping)
      : prefix_(std::move(prefix)), stopping_(stopping) {}

  // The tracker's watched() changed: the plan is rebuilt at the next read.
  void invalidate() { stale_ = true; }
  // Reads at `nowMs`: the values of watched()[at()[j]], j in order.
  std::vector<std::string> read(store::Store& store, const LivenessTracker& tracker,
                                int64_t nowMs) {
    if (stale_) plan(tracker.watched());
    if (!unseen_.empty()) probe(store, tracker, nowMs);
    if (keys_.empty()) return {};
    return store.multiGet(keys_);
  }
  const std::vector<size_t>& at() const { return at_; }

 private:
  void plan(const std::vector<std::string>& nodes);
  void forget(const std::vector<std::string>& nodes);
  void probe(store::Store& store, const LivenessTracker& tracker, int64_t nowMs);
  enum : char { kUnknown, kAbsent, kFound };
  std::vector<char> bisect(store::Store& store, const LivenessTracker& tracker);
  std::vector<std::string> keysOf(size_t begin, size_t end,
                                  const LivenessTracker& t) const;

  std::string prefix_;
  const std::atomic<bool>& stopping_;
  bool stale_ = true;
  std::unordered_set<std::string> present_;  // nodes whose key was seen
  std::unordered_set<std::string> probed_;   // probed, key not found (yet)
  std::vector<std::string> keys_;            // present keys, in watch order
  std::vector<size_t> at_;                   // keys_[j] is watched()[at_[j]]'s
  // Watched nodes not in present_: unseen_[0, fresh_) not in probed_ either.
  std::vector<size_t> unseen_;
  size_t fresh_ = 0;
};

void BeatReader::plan(const std::vector<std::string>& nodes) {
  keys_.clear();
  at_.clear();
  unseen_.clear();
  std::vector<size_t> known;  // in probed_
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (present_.count(nodes[i])) {
      keys_.push_back(prefix_ + nodes[i]);
      at_.push_back(i);
    } else {
      (probed_.count(nodes[i]) ? known : unseen_).push_back(i);
    }
  }
  fresh_ = unseen_.size();
  unseen_.insert(unseen_.end(), known.begin(), known.end());
  if (present_.size() + probed_.size() > 2 * nodes.size() + 64) forget(nodes);
  stale_ = false;
}

// Forgets the nodes no longer watched (once they outnumber the watched ones).
void BeatReader::forget(const std::vector<std::string>& nodes) {
  std::unordered_set<std::string> present, probed;
  for (size_t i : at_) present.insert(nodes[i]);
  for (size_t k = fresh_; k < unseen_.size(); ++k) probed.insert(nodes[unseen_[k]]);
  present_ = std::move(present);
  probed_ = std::move(probed);
}

std::vector<std::string> BeatReader::keysOf(size_t begin, size_t end,
                                            const LivenessTracker& t) const {
  std::vector<std::string> keys;
  keys.reserve(end - begin);
  for (size_t k = begin; k < end; ++k) keys.push_back(prefix_ + t.watched()[unseen_[k]]);
  return keys;
}

// Which never-seen keys exist now. Their first beats have usually landed:
// one CHECK of the nodes never probed says so. Otherwise halves of the
// failing groups are CHECKed, breadth first, up to kProbeChecks more (a few
// absent keys among many are found in about 2 log2(n) CHECKs). The nodes
// probed whose key was not found join probed_, which later wake-ups CHECK as
// one group (never bisecting the same absent keys again). A node
// due to expire now whose key is still unknown gets a CHECK of its own: it
// must not be declared dead while its key exists; this happens once per
// node (it is then dead, or seen), not per wake-up.
void BeatReader::probe(store::Store& store, const LivenessTracker& tracker,
                       int64_t nowMs) {
  std::vector<char> known = bisect(store, tracker);
  for (size_t k = 0; k < unseen_.size() && !stopping_; ++k) {
    if (known[k] != kUnknown || tracker.expiresAt(unseen_[k]) > nowMs) continue;
    if (store.check({prefix_ + tracker.watched()[unseen_[k]]})) known[k] = kFound;
  }
  bool found = false;
  for (size_t k = 0; k < unseen_.size(); ++k) {
    const std::string& node = tracker.watched()[unseen_[k]];
    if (k < fresh_ && known[k] != kFound) probed_.insert(node);
    if (known[k] != kFound) continue;
    probed_.erase(node);
    present_.insert(node);
    found = true;
  }
  if (found || fresh_ > 0) plan(tracker.watched());  // no node stays fresh
}

// Per position in unseen_: kFound, kAbsent (CHECKed alone) or kUnknown.
std::vector<char> BeatReader::bisect(store::Store& store,
                                     const LivenessTracker& tracker) {
  std::vector<char> known(unseen_.size(), kUnknown);
  if (fresh_ < unseen_.size() && !stopping_ &&
      store.check(keysOf(fresh_, unseen_.size(), tracker)))
    std::fill(known.begin() + fresh_, known.end(), kFound);
  std::deque<std::pair<size_t, size_t>> groups;
  if (fresh_ > 0) groups.emplace_back(0, fresh_);
  for (int checks = 0; !groups.empty() && checks <= Heartbeat::kProbeChecks && !stopping_;
       ++checks) {
    auto [begin, end] = groups.front();
    groups.pop_front();
    if (store.check(keysOf(begin, end, tracker))) {
      std::fill(known.begin() + begin, known.begin() + end, kFound);
    } else if (end - begin == 1) {
      known[begin] = kAbsent;
    } else {
      groups.emplace_back(begin, begin + (end - begin) / 2);
      groups.emplace_back(begin + (end - begin) / 2, end);
    }
  }
  return known;
}

}  // namespace

// Threads: the beater writes on its own connection every interval; the
// watcher reads the peers' keys on another and owns the tracker and the
// reader, so its reads and decisions need no lock. mu_ guards only what
// other threads hand over (peers_, onLost_) and the sleep; cbMu_ is held
// while one onDead call runs, so that setPeers() (from any other thread)
// returns only once the previous callback is not running and never will.
struct Heartbeat::Impl {
  // What setPeers() hands the watcher: immutable, shared, never copied.
  struct Peers {
    std::vector<std::string> nodes;
    int64_t sinceMs = 0;  // new nodes count as alive from here
    OnDead onDead;
    uint64_t generation = 0;
  };

  HeartbeatOptions opts_;
  Connect connect_;
  std::string prefix_;
  std::string self_;
  WallClock clock_;

  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};  // written under mu_ (for the sleep)
  std::shared_ptr<const Peers> peers_ = std::make_shared<Peers>();  // guarded by mu_
  OnLost onLost_;                                                   // guarded by mu_
  std::atomic<uint64_t> generation_{0};  // bumped by setPeers under cbMu_ and mu_
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
        clock_(std::move(w)) {}

  // The watcher thread's own state.
  struct Watch {
    LivenessTracker tracker;
    BeatReader reader;
    std::shared_ptr<const Peers> peers;  // applied to the tracker
    std::unique_ptr<store::Store> store;
  };

  void beat();
  void tellLost(int64_t silentMs);
  void watch();
  std::shared_ptr<const Peers> currentPeers();
  enum class Read { kDone, kFailed, kCancelled };
  Read readAndObserve(Watch& w, int64_t nowMs);
  void report(const std::vector<LivenessTracker::Silent>& dead, const Peers& peers);
  bool sleep(bool fullInterval, int64_t nextExpiry);
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
      if (opts_.missed) ++*opts_.missed;
    }
    const int64_t silent = clock_() - lastOk;
    if (!lostTold && silent >= opts_.timeout().count()) {
      lostTold = true;
      tellLost(silent);
    }
    if (beatCancel_->sleepFor(opts_.interval)) return;
  }
}

void Heartbeat::Impl::tellLost(int64_t silentMs) {
  OnLost onLost;
  {
    std::lock_guard lock(mu_);
    onLost = onLost_;
  }
  if (onLost) onLost(silentMs);
}

std::shared_ptr<const Heartbeat::Impl::Peers> Heartbeat::Impl::currentPeers() {
  std::lock_guard lock(mu_);
  return peers_;
}

// Each wake-up takes up the latest setPeers(), reads the watched keys and
// decides, all on this thread's own state. A read that failed decides
// nothing (a store that cannot be read says nothing about the peers) and is
// retried after a full interval. Deaths are decided only while the peers
// read are still the current ones (else the next wake-up reads the new ones).
void Heartbeat::Impl::watch() {
  Watch w{LivenessTracker(opts_), BeatReader(prefix_, stopping_), nullptr, nullptr};
  while (!stopping_) {
    auto peers = currentPeers();
    if (peers != w.peers) {
      w.tracker.watch(peers->nodes, peers->sinceMs);
      w.reader.invalidate();
      w.peers = std::move(peers);
    }
    const int64_t now = clock_();
    const Read read = readAndObserve(w, now);
    if (read == Read::kCancelled) return;
    if (read == Read::kDone && w.peers->generation == generation_) {
      auto dead = w.tracker.takeExpired(now);
      if (!dead.empty()) w.reader.invalidate();
      report(dead, *w.peers);
    }
    if (!sleep(read == Read::kFailed, w.tracker.nextExpiry())) return;
  }
}

// The values read are observed as of `nowMs`, taken before the read: a beat
// written meanwhile is newer than that, which never shortens a silence.
Heartbeat::Impl::Read Heartbeat::Impl::readAndObserve(Watch& w, int64_t nowMs) {
  if (w.tracker.watched().empty()) return Read::kDone;
  try {
    if (!w.store) w.store = connect_(watchCancel_);
    auto values = w.reader.read(*w.store, w.tracker, nowMs);
    const auto& at = w.reader.at();
    for (size_t j = 0; j < values.size() && j < at.size(); ++j)
      w.tracker.observeAt(at[j], values[j], nowMs);
    return stopping_ ? Read::kCancelled : Read::kDone;
  } catch (const CancelledError&) {
    return Read::kCancelled;
  } catch (const Error& e) {
    DDPRUN_DEBUG("heartbeat: ", self_, " could not read its peers' beats: ", e.message());
    return Read::kFailed;
  }
}

// One callback at a time under cbMu_, each only while neither stop() nor
// setPeers() has come since: either waits for one callback at most, never
// for the rest of the list.
void Heartbeat::Impl::report(const std::vector<LivenessTracker::Silent>& dead,
                             const Peers& peers) {
  for (const auto& d : dead) {
    std::lock_guard cbLock(cbMu_);
    if (stopping_ || peers.generation != generation_) return;
    if (peers.onDead) peers.onDead(d.node, d.silentMs);
  }
}

// Until the next interval or the earliest expiry, whichever comes first (at
// least a millisecond, so a clock read just before an expiry cannot spin);
// a full interval after a failed read. False once stopping.
bool Heartbeat::Impl::sleep(bool fullInterval, int64_t nextExpiry) {
  int64_t ms = opts_.interval.count();
  if (!fullInterval && nextExpiry != INT64_MAX) ms = std::min(ms, nextExpiry - clock_());
  ms = std::max<int64_t>(ms, 1);
  std::unique_lock lock(mu_);
  return !wake_.wait_for(lock, std::chrono::milliseconds(ms),
                         [this] { return stopping_.load(); });
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

// The list is built here, on the caller's thread; the watcher takes it up at
// its next wake-up with the time of this call.
void Heartbeat::setPeers(std::vector<std::string> peers, OnDead onDead) {
  peers.erase(std::remove(peers.begin(), peers.end(), impl_->self_), peers.end());
  auto next = std::make_shared<Impl::Peers>();
  next->nodes = std::move(peers);
  next->sinceMs = impl_->clock_();
  next->onDead = std::move(onDead);
  // Taken first (recursive: onDead itself may call setPeers), so that the
  // old callback has returned before the new set is in place.
  std::lock_guard cbLock(impl_->cbMu_);
  std::lock_guard lock(impl_->mu_);
  next->generation = ++impl_->generation_;
  impl_->peers_ = std::move(next);
}

void Heartbeat::setOnLost(OnLost onLost) {
  std::lock_guard lock(impl_->mu_);
  impl_->onLost_ = std::move(onLost);
}

// stopping_ is set before the tokens are cancelled: a thread woken by the
// cancel (in a store call, or in onDead through its store) finds it set.
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
