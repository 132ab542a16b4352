// Liveness of the nodes of a job through the agent store, shared by the
// static and the dynamic rendezvous.
//
// Every node beats: every `interval` it writes its key
// "<prefix><node id>" = "<seq> <wall ms>" (encodeBeat). Every node watches
// its peers' keys (one MULTI_GET per wake-up) and declares a peer dead once
// its beat is older than interval * maxAttempts. Timing is precise without
// polling fast: the watcher sleeps until the earliest moment a peer could
// expire (or the next interval), and a beat's age is measured from the
// sender's wall clock when the two clocks agree within one interval, else
// from when the watcher first saw it (skewed clocks cost at most one more
// interval, never a false death).
//
// LivenessTracker is that decision as a pure value (fake clock in tests);
// Heartbeat runs it on two threads of its own.
//
// Cost (issue 16: a state of 700,000 participants): a wake-up is linear in
// the watched nodes and makes a bounded number of store requests (see
// Heartbeat); its reads and decisions run under no lock that stop() or a
// setter waits on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ddprun/store/store.h"
#include "ddprun/store/tcp_store.h"

namespace ddprun::rendezvous::detail {

using WallClock = std::function<int64_t()>;  // ms since the epoch
int64_t systemWallMs();

struct HeartbeatOptions {
  std::chrono::milliseconds interval{5'000};
  int maxAttempts = 3;
  // Counts this node's beats that failed (the status endpoint's heartbeats
  // missed); null: not counted. Not owned: it must outlive the Heartbeat.
  std::atomic<uint64_t>* missed = nullptr;
  std::chrono::milliseconds timeout() const { return interval * maxAttempts; }
};

std::string encodeBeat(int64_t seq, int64_t wallMs);
// False for anything that is not "<seq> <wall ms>".
bool decodeBeat(const std::string& value, int64_t& seq, int64_t& wallMs);

// Which watched nodes went silent. Not thread-safe; a plain value. Every
// call is O(1) (hash lookups) or O(watched nodes): no nested scans.
class LivenessTracker {
 public:
  struct Silent {
    std::string node;
    int64_t silentMs = 0;
  };

  explicit LivenessTracker(HeartbeatOptions opts) : opts_(opts) {}

  // The nodes to watch from now on; nodes not listed are forgotten, nodes
  // still listed keep their state, new ones count as alive at `nowMs` (a node
  // gets a full timeout to send its first beat). A node listed twice is
  // watched once.
  void watch(const std::vector<std::string>& nodes, int64_t nowMs);
  // What was read under a node's key at `nowMs` ("" when absent). A beat
  // with a new seq (any other than the last seen) renews the node as of its
  // wall time if that is at most one interval before `nowMs`, else as of
  // `nowMs`; never backwards. The same seq, junk, "" or an unwatched node
  // change nothing.
  void observe(const std::string& node, const std::string& value, int64_t nowMs);
  // observe() for watched()[i]. Precondition: i < watched().size().
  void observeAt(size_t i, const std::string& value, int64_t nowMs);
  // Watched nodes silent for at least the timeout at `nowMs`, in the order
  // given to watch().
  std::vector<std::string> expired(int64_t nowMs) const;
  // expired(), with how long each was silent, and forgets them (watched()
  // keeps the others, in order).
  std::vector<Silent> takeExpired(int64_t nowMs);
  // When watched()[i] is expired() if nothing new is read.
  int64_t expiresAt(size_t i) const {
    return seen_[i].lastBeatMs + opts_.timeout().count();
  }
  // The earliest time at which a watched node is expired() if nothing new is
  // read; INT64_MAX when none is watched.
  int64_t nextExpiry() const;
  // How long `node` has been silent at `nowMs` (0 if not watched).
  int64_t silentFor(const std::string& node, int64_t nowMs) const;
  const std::vector<std::string>& watched() const { return order_; }

 private:
  struct Seen {
    int64_t seq = -1;
    int64_t lastBeatMs = 0;  // on the watcher's clock
  };
  void reindex();

  HeartbeatOptions opts_;
  std::vector<std::string> order_;  // watched, in watch() order
  std::vector<Seen> seen_;          // seen_[i] is order_[i]'s
  // order_[i] -> i; the views point into order_, rebuilt whenever it changes.
  std::unordered_map<std::string_view, size_t> index_;
};

// Beats for `self` and watches the peers, each on a thread of its own with a
// store connection of its own (from `connect`, called on that thread, with a
// token that stop() cancels). Thread-safe. onDead runs on the watcher's
// thread, once per node per setPeers() (the node is then no longer
// watched); it must not block for long (it may make store requests, and may
// call setPeers, but not stop). Store errors while beating or watching are
// retried at the next interval and logged at debug level: losing the store
// is the rendezvous's concern, not this class's. The watcher never polls
// faster than the interval, except to wake at a peer's expiry.
//
// A wake-up's cost, for n watched nodes: one MULTI_GET of the keys seen so
// far and O(n) decisions. While some watched keys were never seen: one
// CHECK of those not probed yet and at most kProbeChecks more to find which
// exist (once per node), one CHECK of those probed before, and, for each
// such node about to be declared dead, one CHECK (once per node per
// setPeers: it is then dead, or seen). A node probed without a key whose key
// appears later, while other probed keys are still absent, is seen at its
// expiry's CHECK and renewed as of that read (a death within its first
// timeout is then noticed up to a timeout late; never a false death). The
// reads and decisions hold no lock that stop(), setPeers() or setOnLost()
// take: stop() waits for at most one store request or one onDead call in
// flight (and cancels the request), and setPeers() for at most one onDead
// call.
class Heartbeat {
 public:
  using Connect =
      std::function<std::unique_ptr<store::Store>(std::shared_ptr<store::CancelToken>)>;
  using OnDead = std::function<void(const std::string& node, int64_t silentMs)>;
  using OnLost = std::function<void(int64_t silentMs)>;
  // CHECKs per wake-up spent finding which of the never-seen keys exist.
  static constexpr int kProbeChecks = 32;

  // Starts beating at once under keyPrefix + self. Watches nobody yet.
  Heartbeat(HeartbeatOptions opts, Connect connect, std::string keyPrefix,
            std::string self, WallClock clock = systemWallMs);
  ~Heartbeat();  // stop()
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Watches these nodes (self is ignored if listed) from now on, replacing
  // the previous set and callback (LivenessTracker::watch: nodes still
  // listed keep their silence so far, new ones get a full timeout). An empty
  // list watches nobody. Called from another thread than onDead's, it
  // returns once the previous callback is not running and never will.
  void setPeers(std::vector<std::string> peers, OnDead onDead);
  // Called once on the beating thread when this node has not written a beat
  // for the timeout (its link or the store is gone: its peers drop it now),
  // and again after a beat went through and another such silence. Give the
  // beats' connections a request timeout of about one interval, or a
  // blocked write delays this. Thread-safe; empty: nothing is called.
  void setOnLost(OnLost onLost);
  // Stops both threads (their blocking calls are cancelled) and joins them.
  // Idempotent; not from onDead. The last beat stays in the store.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous::detail
