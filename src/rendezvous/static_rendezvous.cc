#include "ddprun/rendezvous/static_rendezvous.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "ddprun/store/auth.h"
#include "heartbeat.h"
#include "hosted_stores.h"
#include "node_lease.h"
#include "round_end.h"
#include "round_watcher.h"
#include "task_thread.h"
#include "static_rendezvous_internal.h"

namespace ddprun::rendezvous {
namespace {

using detail::decodeEnd;
using detail::encodeEnd;
using detail::TaskThread;

using Millis = std::chrono::milliseconds;

// Keys of the protocol, under "ddprun/<run_id>/round/<r>/":
//   node/<i>      local world size of node i: the round's barrier
//   worker_store  port of the round's worker store, hosted by node 0: the
//                 agent store's own (the earlier workers' keys just erased),
//                 or with authentication a fresh store's
//   done/<i>      node i's workers all succeeded
//   end           how the round ended (see encodeEnd); the first writer wins
//   left/<i>      node i no longer needs the agent store for this round
//                 (node 0 waits for these, bounded, before stopping it)
//   restarts      failed rounds of the job before this one (the first
//                 writer wins; every node writes the same value)
// and "ddprun/<run_id>/hb/node<i>": node i's heartbeat (heartbeat.h).
//
// Threads: the agent's thread calls the interface; a task thread runs join
// and reports on `client_`, in order; a watcher thread per round waits for
// its end key on a connection of its own; the heartbeat's two threads beat
// and watch the peers during a round, each on a connection of its own; a
// peer declared dead becomes a report on the task thread. cancel_ reaches
// every connection but the heartbeat's, which stop at shutdown.
class StaticRendezvous final : public Rendezvous {
 public:
  StaticRendezvous(StaticOptions opts, Post post, detail::StaticBackend backend)
      : opts_(std::move(opts)), post_(std::move(post)), backend_(std::move(backend)) {
    if (backend_.watchDepartures)
      backend_.watchDepartures(
          [this](const std::string& beat, store::ConnEnd how) { onDeparted(beat, how); });
  }
  ~StaticRendezvous() override { shutdown(); }

  void setEventHandler(EventHandler handler) override { handler_ = std::move(handler); }
  void setJoinProgressHandler(JoinProgressHandler handler) override {
    progressHandler_ = std::move(handler);
  }

  void join(int localWorldSize, JoinHandler done) override {
    const int round = nextRound_++;
    if (stopping_ || cancel_->cancelled()) {
      post_([done = std::move(done), error = cancelledJoin(round)] { done(error, {}); });
      return;
    }
    joining_ = true;
    tasks_.push([this, round, localWorldSize, done = std::move(done)] {
      runJoin(round, localWorldSize, done);
    });
  }

  void reportSuccess(int round) override {
    succeededRound_ = round;
    tasks_.push([this, round] {
      // A key of this node's own, written by a compare_set (answered, unlike
      // a SET, and sent again after a lost reply, unlike a counter's ADD:
      // store::replayOf), then whether every node's is there: the last node
      // to write sees them all and ends the round (more than one may; the
      // first end wins).
      report(round, "its workers succeeded", [&] {
        client_->compareSet(key(round, "done/" + std::to_string(opts_.nodeRank)), "", "1");
        if (client_->check(nodeKeys(round, "done")))
          client_->compareSet(key(round, "end"), "", encodeEnd(RoundEnd::kFinished, -1, ""));
      });
    });
  }

  void reportFailure(int round, const std::string& why, bool closeJob) override {
    std::string value =
        encodeEnd(closeJob ? RoundEnd::kClosed : RoundEnd::kFailed, opts_.nodeRank, why);
    tasks_.push([this, round, value] {
      report(round, "the round failed",
             [&] { client_->compareSet(key(round, "end"), "", value); });
    });
  }

  // A pending join is cancelled at once. Otherwise queued reports go out
  // first (they may close the job for the peers), then this node says it has
  // left and node 0 gives its peers a moment to read the round's end before
  // its store goes; both bounded by leaveTimeout.
  void shutdown() override {
    if (stopping_.exchange(true)) return;
    if (joining_) cancel_->cancel();
    tasks_.push([this] { leave(); });
    if (!tasks_.drain(opts_.leaveTimeout))
      DDPRUN_DEBUG("rendezvous: leaving after ", formatDuration(opts_.leaveTimeout),
                   " without every report delivered");
    cancel_->cancel();
    tasks_.stop();
    departCancel_->cancel();
    departures_.stop();
    stopWatcher();
    // Beats until here, after this node said it left: its peers must not
    // take a clean exit for a death.
    if (heartbeat_) heartbeat_->stop();
    if (backend_.stopHosted) backend_.stopHosted();
  }

  void cancel() override { cancel_->cancel(); }

  std::string describe() const override {
    return "static, node " + std::to_string(opts_.nodeRank) + " of " +
           std::to_string(opts_.nnodes) + ", store " + backend_.storeAddress;
  }
  uint64_t heartbeatsMissed() const override { return missedBeats_.load(); }

 private:
  std::string key(int round, const std::string& name) const {
    return "ddprun/" + opts_.runId + "/round/" + std::to_string(round) + "/" + name;
  }
  std::vector<std::string> nodeKeys(int round, const char* kind) const {
    std::vector<std::string> keys;
    for (int i = 0; i < opts_.nnodes; ++i)
      keys.push_back(key(round, std::string(kind) + "/" + std::to_string(i)));
    return keys;
  }
  std::exception_ptr cancelledJoin(int round) const {
    return std::make_exception_ptr(CancelledError(
        "joining rendezvous round " + std::to_string(round) + " was cancelled"));
  }

  // On the task thread. The result is posted even during shutdown: a
  // pending join always ends. The round's watcher starts only after the
  // result is posted, so the agent never hears of a round's end before it
  // has heard of the round.
  void runJoin(int round, int localWorldSize, const JoinHandler& done) {
    std::exception_ptr error;
    RoundInfo info;
    try {
      info = joinRound(round, localWorldSize);
    } catch (...) {
      error = std::current_exception();
    }
    if (!error && cancel_->cancelled()) error = cancelledJoin(round);
    if (!error) lastJoined_ = round;
    joining_ = false;
    const bool joined = !error;
    // Moved, not copied: this thread keeps no share of what the agent reads.
    post_(
        [done, error = std::move(error), info = std::move(info)] { done(error, info); });
    if (joined) startWatcher(round);
  }

  RoundInfo joinRound(int round, int localWorldSize) {
    DDPRUN_CHECK(localWorldSize > 0, "a node needs at least one worker, got ",
                 localWorldSize);
    const Deadline deadline(opts_.timeout);
    if (!client_) client_ = backend_.connect(cancel_, deadline.remaining());
    if (!heartbeat_) startHeartbeat();
    const int restarts = restartCount(round);
    // A compare_set, not a SET: it is answered, so a request lost to a
    // reset connection is sent again (a SET has no reply: its loss would
    // show only as this node missing from the barrier).
    client_->compareSet(key(round, "node/" + std::to_string(opts_.nodeRank)), "",
                        std::to_string(localWorldSize));
    auto keys = nodeKeys(round, "node");
    waitForPeers(round, keys, deadline);
    auto sizes = parseSizes(keys, client_->multiGet(keys));
    RankLayout layout = assignRanks(sizes);
    RoundInfo info;
    info.round = round;
    info.groupRank = opts_.nodeRank;
    info.groupWorldSize = opts_.nnodes;
    info.baseRank = layout.baseRanks[opts_.nodeRank];
    info.worldSize = layout.worldSize;
    info.localWorldSizes = std::move(sizes);
    info.workerStoreHost = opts_.masterAddr;
    info.workerStorePort = workerStorePort(round);
    info.restartCount = restarts;
    return info;
  }

  // Round r's count is round r-1's, plus one if r-1 ended failed. This node
  // joined r-1 and its end exists (this node saw it, or its own report made
  // it, before this join), so every node computes the same value; the store
  // keeps the first one written all the same.
  int restartCount(int round) {
    int count = 0;
    if (round > 0) {
      const auto prevKey = key(round - 1, "restarts"), endKey = key(round - 1, "end");
      auto values = client_->multiGet({prevKey, endKey});
      count = parseRestarts(prevKey, values[0]);
      if (decodeEnd(round - 1, endKey, values[1]).kind == RoundEnd::kFailed) ++count;
    }
    const auto k = key(round, "restarts");
    return parseRestarts(k, client_->compareSet(k, "", std::to_string(count)));
  }
  int parseRestarts(const std::string& k, const std::string& value) const {
    int count = 0;
    if (!str::parseInt(value, count, 0))
      DDPRUN_THROW(ProtocolError, "the agent store holds '", str::escape(value),
                   "' under ", k, ", not a number of restarts; is another job using ",
                   "--rdzv-id ", opts_.runId, " on this store?");
    return count;
  }

  // ------------------------------------------------------------ liveness
  // On the task thread, at the first join once connected: this node beats
  // from now until shutdown, and watches nobody until a round starts.
  void startHeartbeat() {
    detail::HeartbeatOptions o{opts_.keepAliveInterval, opts_.keepAliveMaxAttempt,
                               &missedBeats_};
    heartbeat_ = std::make_unique<detail::Heartbeat>(
        o,
        [this](std::shared_ptr<store::CancelToken> cancel) {
          return backend_.connect(std::move(cancel), opts_.timeout);
        },
        "ddprun/" + opts_.runId + "/hb/", beatName(opts_.nodeRank));
  }
  static constexpr std::string_view kBeatName = "node";  // + the node's rank
  static std::string beatName(int node) {
    return std::string(kBeatName) + std::to_string(node);
  }

  // During `round`, every other node is watched; one that goes silent is
  // reported on the task thread (its store connection), in order with the
  // reports of this node's workers.
  void watchPeers(int round) {
    std::vector<std::string> peers;
    for (int i = 0; i < opts_.nnodes; ++i)
      if (i != opts_.nodeRank) peers.push_back(beatName(i));
    heartbeat_->setPeers(
        std::move(peers), [this, round](const std::string& node, int64_t silentMs) {
          int i = -1;
          str::parseInt(std::string_view(node).substr(kBeatName.size()), i, 0);
          tasks_.push(
              [this, round, i, silentMs] { declareDead(round, i, Millis(silentMs)); });
        });
  }

  // On the task thread: ends the round as failed by node `i`, unless it
  // said it left (a clean exit, or the round has ended anyway). The winner
  // of the end also says goodbye for the dead node, so that node 0 does not
  // wait for it at shutdown.
  void declareDead(int round, int i, Millis silent) {
    const std::string why = "node " + std::to_string(i) +
                            "'s agent missed heartbeats for " + formatDuration(silent);
    const auto left = key(round, "left/" + std::to_string(i));
    report(round, "node " + std::to_string(i) + " is dead", [&] {
      if (client_->check({left})) return;
      DDPRUN_WARN("rendezvous round ", round, ": ", why, "; ending the round");
      const auto end = encodeEnd(RoundEnd::kFailed, i, why);
      if (client_->compareSet(key(round, "end"), "", end) == end) client_->set(left, "");
    });
  }

  // On node 0's store thread: node `beat`'s heartbeat connection ended
  // (`how`). Queued for the departures thread; never blocks.
  void onDeparted(const std::string& beat, store::ConnEnd how) {
    int i = -1;
    if (beat.rfind(kBeatName, 0) != 0 ||
        !str::parseInt(std::string_view(beat).substr(kBeatName.size()), i, 0) ||
        i == opts_.nodeRank || i < 0 || i >= opts_.nnodes)
      return;
    // A reset connection may be replaced: node i gets the heartbeat timeout
    // from now to beat again. One its process closed gets none.
    const auto beatAgainBy =
        std::chrono::steady_clock::now() +
        (how == store::ConnEnd::kReset ? opts_.keepAliveInterval * opts_.keepAliveMaxAttempt
                                       : Millis(0));
    departures_.push([this, i, beatAgainBy] { departed(i, beatAgainBy); });
  }

  // On the departures thread (node 0), on a connection of its own: node i's
  // heartbeat connection ended. If it did not say goodbye and no new
  // connection beats for it by `beatAgainBy` (at once for a connection its
  // process closed; a reset one reconnects at its next beat:
  // store::ReconnectPolicy), it died: its running round ends as failed by it
  // (first end wins), as declareDead would. Either way it no longer needs the
  // store, so node 0's shutdown never waits for it (leave()). On this thread,
  // not the task thread: that one may be in leave() already.
  void departed(int i, std::chrono::steady_clock::time_point beatAgainBy) {
    const int round = lastJoined_;
    if (round < 0) return;
    const auto left = key(round, "left/" + std::to_string(i));
    try {
      if (!departClient_) departClient_ = backend_.connect(departCancel_, opts_.timeout);
      if (departClient_->check({left})) return;  // a clean exit
      if (beatsAgainBy(i, beatAgainBy)) return;  // a reset connection, not a death
      if (departClient_->check({left})) return;  // it left meanwhile
      const std::string why = "node " + std::to_string(i) +
                              "'s agent is gone: its connection to the agent store closed";
      const auto end = encodeEnd(RoundEnd::kFailed, i, why);
      if (lastEnded_ < round && !stopping_ &&
          departClient_->compareSet(key(round, "end"), "", end) == end)
        DDPRUN_WARN("rendezvous round ", round, ": ", why, "; ending the round");
      departClient_->set(left, "");
    } catch (const CancelledError&) {
    } catch (const Error& e) {
      DDPRUN_DEBUG("rendezvous: after node ", i, " went: ", e.message());
    }
  }

  // Whether node i beats on a connection again (its heartbeat key, a lease
  // that went with the closed connection, is back) by `deadline`.
  bool beatsAgainBy(int i, std::chrono::steady_clock::time_point deadline) {
    return detail::beatsWithin(
        *departClient_, "ddprun/" + opts_.runId + "/hb/" + beatName(i),
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now()));
  }

  // The barrier: every node's key. While it waits, says every
  // joinProgressInterval which nodes are absent; on timeout, names them.
  void waitForPeers(int round, const std::vector<std::string>& keys,
                    const Deadline& deadline) {
    const auto started = std::chrono::steady_clock::now();
    std::vector<int> absent;
    for (;;) {
      const auto slice = std::min<Millis>(deadline.remaining(),
                                          std::max(Millis(1), opts_.joinProgressInterval));
      if (slice.count() > 0) {
        try {
          client_->wait(keys, slice);
          return;
        } catch (const TimeoutError&) {
        }
      }
      absent.clear();
      for (int i = 0; i < opts_.nnodes; ++i)
        if (!client_->check({keys[i]})) absent.push_back(i);
      if (absent.empty()) return;  // the last one arrived just now
      if (deadline.expired()) break;
      tellProgress(round, absent, started);
    }
    std::vector<std::string> nodes, absentKeys;
    for (int i : absent) {
      nodes.push_back(std::to_string(i));
      absentKeys.push_back(keys[i]);
    }
    const bool one = absent.size() == 1;
    DDPRUN_THROW(
        TimeoutError, "rendezvous round ", round, ": node", one ? " " : "s ",
        str::join(nodes, ", "), " of ", opts_.nnodes, " did not join within ",
        formatDuration(opts_.timeout), " (", one ? "key " : "keys ",
        str::join(absentKeys, ", "), one ? " is" : " are", " absent from the agent store at ",
        backend_.storeAddress, "); start every node with --nnodes ", opts_.nnodes,
        ", its own --node-rank and the same --master-addr, --master-port and --rdzv-id");
  }

  // A barrier still waiting: the log line and the agent's status.
  void tellProgress(int round, const std::vector<int>& absent,
                    std::chrono::steady_clock::time_point started) {
    JoinProgress p;
    p.round = round;
    p.minNodes = p.maxNodes = p.expected = opts_.nnodes;
    p.joined = opts_.nnodes - static_cast<int>(absent.size());
    p.missingCount = static_cast<int>(absent.size());
    for (size_t i = 0; i < absent.size() && i < JoinProgress::kListed; ++i)
      p.missing.push_back("node rank " + std::to_string(absent[i]));
    const auto waited =
        std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - started);
    p.waitingSeconds = static_cast<double>(waited.count()) / 1000.0;
    DDPRUN_NOTICE("rendezvous: job ", opts_.runId, " waiting ", formatDuration(waited),
                " to join ", rendezvous::describe(p));
    if (progressHandler_) post_([h = progressHandler_, p] { h(p); });
  }

  std::vector<int> parseSizes(const std::vector<std::string>& keys,
                              const std::vector<std::string>& values) const {
    std::vector<int> sizes(values.size());
    for (size_t i = 0; i < values.size(); ++i)
      if (!str::parseInt(values[i], sizes[i], 1))
        DDPRUN_THROW(ProtocolError, "the agent store holds '", str::escape(values[i]),
                     "' under ", keys[i],
                     ", not a number of workers; is another job using --rdzv-id ",
                     opts_.runId, " on this store?");
    return sizes;
  }

  // Node 0 readies the round's worker store and publishes its port; the
  // others read it and only then start their workers.
  //
  // As in torchrun, the workers share the agent store on --master-port, and
  // each round must still find it clean: PyTorch's init keys of a failed
  // attempt would otherwise be read by the restarted workers (PyTorch >= 2.6
  // uses no per-attempt prefix). Node 0 erases what the workers wrote
  // (workerKeyPrefixes(); nothing else: the store may have other tenants,
  // and torchrun erases nothing) here, after the barrier: every node has joined this round, and an
  // agent joins only once its workers of the previous round have all exited
  // (agent.cc: the next join follows the group's stop, which waits for each
  // worker's keeper, i.e. for the worker and its descendants), so no worker
  // of an earlier round writes after the clear. One window is left, which the
  // barrier cannot see: a request a worker sent just before it died that is
  // still in flight in the network then (a lost segment, retransmitted
  // later). torchrun, which never clears, has every stale key instead.
  uint16_t workerStorePort(int round) {
    const auto k = key(round, "worker_store");
    if (opts_.nodeRank == 0) {
      uint16_t port = backend_.readyWorkerStore(detail::workerKeyPrefixes());
      client_->compareSet(k, "", std::to_string(port));  // answered: see joinRound
      return port;
    }
    int port = 0;
    try {
      client_->wait({k}, opts_.timeout);
    } catch (const TimeoutError&) {
      DDPRUN_THROW(TimeoutError, "rendezvous round ", round,
                   ": node 0 did not publish the ", "worker store's port (", k,
                   ") within ", formatDuration(opts_.timeout));
    }
    std::string value = client_->get(k);
    if (!str::parseInt(value, port, 1, 65535))
      DDPRUN_THROW(ProtocolError, "the agent store holds '", str::escape(value),
                   "' under ", k, ", not a port number");
    return static_cast<uint16_t>(port);
  }

  // On the watcher thread, every heartbeat timeout of its wait: once this
  // node's workers succeeded, it looks again (on the task thread) whether
  // every node's are done. The report after the last success writes the
  // end; this bounds the wait should that report have failed after every
  // retry (a store out of reach for the whole reconnect budget).
  void finishIfEveryoneIsDone(int round) {
    if (succeededRound_ != round || stopping_) return;
    tasks_.push([this, round] {
      report(round, "every node's workers succeeded", [&] {
        if (client_->check(nodeKeys(round, "done")))
          client_->compareSet(key(round, "end"), "", encodeEnd(RoundEnd::kFinished, -1, ""));
      });
    });
  }

  // On the task thread. Reports on a round that already ended change
  // nothing (the first report won) and are skipped: the store may be gone.
  void report(int round, const std::string& what, const std::function<void()>& request) {
    if (round != lastJoined_ || lastEnded_ >= round) return;
    detail::sendReport(what, request);
  }

  // On the task thread, at shutdown (see there).
  void leave() {
    const int round = lastJoined_;
    if (round < 0 || !client_) return;
    try {
      if (lastEnded_ < round)
        client_->set(key(round, "left/" + std::to_string(opts_.nodeRank)), "");
      if (opts_.nodeRank == 0 && client_->check({key(round, "end")}))
        client_->wait(nodeKeys(round, "left"), opts_.leaveTimeout);
    } catch (const Error& e) {
      DDPRUN_DEBUG("rendezvous: leaving without every node's goodbye: ", e.message());
    }
  }

  // Watchers: one per round (round_watcher.h); starting a round ends the
  // previous round's watcher.
  void startWatcher(int round) {
    watcher_.stop();
    watchPeers(round);
    watcher_.start(round);
  }
  void stopWatcher() { watcher_.stop(); }

  // On the watcher thread: waits for the round's end; a store that fails is
  // kStoreLost; cancelled: nothing.
  detail::RoundWatcher::Hooks watcherHooks() {
    detail::RoundWatcher::Hooks h;
    h.connect = [this](std::shared_ptr<store::CancelToken> token) {
      return backend_.connect(std::move(token), opts_.timeout);
    };
    h.awaitEnd = [this](store::Store& store, int round, const auto&) {
      const auto end = key(round, "end");
      return detail::decodeEndOrClose(
          round, end,
          detail::awaitEndValue(store, end, opts_.keepAliveInterval * opts_.keepAliveMaxAttempt,
                                [this, round] { finishIfEveryoneIsDone(round); }));
    };
    h.onEnded = [this](store::Store& store, int round, const RoundEvent&) {
      lastEnded_ = std::max(lastEnded_.load(), round);
      heartbeat_->setPeers({}, {});  // between rounds nobody is watched
      sayLeft(store, round);
    };
    h.storeLost = [this](const Error& e) {
      return "the agent store of node 0 at " + backend_.storeAddress + " is gone (" +
             e.message() + ")";
    };
    h.deliver = [this](const RoundEvent& event) {
      if (!stopping_ && handler_) post_([handler = handler_, event] { handler(event); });
    };
    return h;
  }

  // Best effort: node 0 may stop the store as soon as it has read the end.
  void sayLeft(store::Store& store, int round) {
    try {
      store.set(key(round, "left/" + std::to_string(opts_.nodeRank)), "");
    } catch (const Error& e) {
      DDPRUN_DEBUG("rendezvous: could not say goodbye for round ", round, ": ",
                   e.message());
    }
  }

  const StaticOptions opts_;
  const Post post_;
  detail::StaticBackend backend_;
  EventHandler handler_;  // set before the first join, read by watchers
  JoinProgressHandler progressHandler_;  // set before the first join
  const std::shared_ptr<store::CancelToken> cancel_ =
      std::make_shared<store::CancelToken>();
  int nextRound_ = 0;                     // agent's thread
  std::unique_ptr<store::Store> client_;  // task thread
  std::atomic<int> lastJoined_{-1};       // written by the task thread
  std::atomic<int> lastEnded_{-1};  // written by watchers: the last round seen ending
  std::atomic<int> succeededRound_{-1};  // the last round this node's workers succeeded
  std::atomic<bool> joining_{false};
  std::atomic<bool> stopping_{false};
  // Created by the task thread at the first join, before any watcher; used
  // by watchers, and by shutdown() once those have stopped.
  std::atomic<uint64_t> missedBeats_{0};  // before heartbeat_: it outlives it
  std::unique_ptr<detail::Heartbeat> heartbeat_;
  // The current watcher; touched by the task thread, and by shutdown() once
  // that thread has stopped.
  detail::RoundWatcher watcher_{cancel_, watcherHooks()};
  // Node 0's departures thread and its connection.
  const std::shared_ptr<store::CancelToken> departCancel_ =
      std::make_shared<store::CancelToken>();
  std::unique_ptr<store::Store> departClient_;
  TaskThread departures_;
  TaskThread tasks_;  // last: destroyed first, its thread uses the members above
};

std::unique_ptr<store::Store> connectAgentStore(
    const StaticOptions& opts, std::shared_ptr<store::CancelToken> cancel,
    Millis timeout) {
  store::TcpStoreOptions o;
  o.host = opts.masterAddr;
  o.port = opts.masterPort;
  o.timeout = opts.timeout;
  o.connectTimeout = timeout;
  o.cancel = std::move(cancel);
  o.authToken = opts.authSecret;
  o.allowOpenServer = store::auth::openStoreAllowed();
  // A broken connection is replaced while the store is back within the
  // heartbeat timeout; the heartbeat's connection owns the node's beat key.
  o.name = "agent store";
  o.reconnect.budget = opts.keepAliveInterval * opts.keepAliveMaxAttempt;
  o.ownedPrefix = "ddprun/" + opts.runId + "/hb/";
  try {
    return store::TcpStore::connect(o);
  } catch (const TimeoutError& e) {
    DDPRUN_THROW(IoError, "node ", opts.nodeRank,
                 " cannot reach the agent store of node 0: ", e.message(),
                 " (node 0, started with --node-rank 0, hosts it; give every node "
                 "the same --master-addr and --master-port)");
  }
}

void validate(const StaticOptions& opts) {
  DDPRUN_CHECK(opts.nnodes >= 1, "--nnodes must be at least 1, got ", opts.nnodes);
  DDPRUN_CHECK(opts.nodeRank >= 0 && opts.nodeRank < opts.nnodes, "--node-rank ",
               opts.nodeRank, " must be between 0 and --nnodes - 1 = ", opts.nnodes - 1);
  DDPRUN_CHECK(opts.keepAliveInterval.count() > 0 && opts.keepAliveMaxAttempt > 0,
               "--rdzv-conf keep_alive_interval and keep_alive_max_attempt must be "
               "positive, got ",
               opts.keepAliveInterval.count(), " ms and ", opts.keepAliveMaxAttempt);
}

}  // namespace

namespace detail {

std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions& opts,
                                                 Rendezvous::Post post,
                                                 StaticBackend backend) {
  validate(opts);
  DDPRUN_CHECK(backend.connect && backend.readyWorkerStore,
               "a static rendezvous needs a store");
  return std::make_unique<StaticRendezvous>(opts, std::move(post), std::move(backend));
}

StaticBackend makeTcpBackend(StaticOptions& opts) {
  // Node 0 hosts the agent store for the rendezvous's whole life, and with
  // authentication each round's worker store; both stop at shutdown.
  auto hosted = std::make_shared<HostedStores>();
  if (opts.nodeRank == 0)
    opts.masterPort = hosted->hostRendezvousStore(
        "", opts.masterPort, "node 0's agent store",
        "pass another --master-port (the same to every node), or stop that process",
        opts.authSecret, opts.runId);
  StaticBackend b;
  b.storeAddress = net::formatHostPort(opts.masterAddr, opts.masterPort);
  b.connect = [opts](std::shared_ptr<store::CancelToken> cancel, Millis timeout) {
    return connectAgentStore(opts, std::move(cancel), timeout);
  };
  if (opts.authSecret.empty()) {
    // torchrun's layout: MASTER_PORT is the master port, the workers are
    // clients of the agent store (see workerStorePort for the clear).
    b.readyWorkerStore = [hosted](const std::vector<std::string>& workerPrefixes) {
      // On the wire (so in the server) every key has a leading '/': TcpStore
      // sends them as PyTorch's client does.
      std::vector<std::string> wire;
      for (const auto& p : workerPrefixes) wire.push_back("/" + p);
      const size_t erased = hosted->rendezvousStore().eraseKeysUnder(wire);
      DDPRUN_DEBUG("rendezvous: erased ", erased, " keys of earlier rounds' workers");
      return hosted->rendezvousStore().port();
    };
  } else {
    // The agent store admits only agents, and PyTorch's clients know no
    // token: the workers get a store of their own, fresh every round.
    b.readyWorkerStore = [hosted](const std::vector<std::string>&) {
      return hosted->startWorkerStore();
    };
  }
  bindHostedStores(b, hosted);
  return b;
}

}  // namespace detail

std::unique_ptr<Rendezvous> makeStaticRendezvous(const StaticOptions& opts,
                                                 Rendezvous::Post post) {
  validate(opts);  // before binding anything
  StaticOptions resolved = opts;
  auto backend = detail::makeTcpBackend(resolved);
  return detail::makeStaticRendezvous(resolved, std::move(post), std::move(backend));
}

}  // namespace ddprun::rendezvous
