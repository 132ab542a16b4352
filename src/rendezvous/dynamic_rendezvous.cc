#include "ddprun/rendezvous/dynamic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "ddprun/common/clock.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "dynamic_rendezvous_internal.h"
#include "job_keys.h"
#include "arrivals.h"
#include "dynamic_join.h"
#include "dynamic_state.h"
#include "node_lease.h"
#include "round_end.h"
#include "round_watcher.h"
#include "state_cell.h"
#include "task_thread.h"

namespace ddprun::rendezvous {
namespace {

using detail::JobKeys;
using detail::JoinOutcome;
using detail::NodeDesc;
using detail::State;
using detail::StateCell;
using detail::Tamper;
using Millis = std::chrono::milliseconds;

// A watcher waits this long per request for the round's end, then asks again:
// rounds last as long as training does.
constexpr Millis kWatchSlice{3'600'000};

// Keys: job_keys.h.
//
// Threads: the agent's thread calls the interface; a task thread runs joins,
// reports and the leave on `client_`, in order; a watcher thread per round
// waits for its end key; the heartbeat's watcher thread runs onDead on a
// connection of its own. cancel_ reaches every connection but the leave's.
class DynamicRendezvous final : public Rendezvous {
 public:
  DynamicRendezvous(DynamicOptions opts, Post post, detail::DynamicBackend backend)
      : opts_(std::move(opts)),
        post_(std::move(post)),
        backend_(std::move(backend)),
        lim_{opts_.minNodes, opts_.maxNodes, opts_.lastCallTimeout.count(),
             opts_.keepAliveInterval.count() * opts_.keepAliveMaxAttempt},
        keys_(opts_.runId, lim_) {
    if (backend_.pid == 0) backend_.pid = ::getpid();
    if (backend_.watchDepartures)
      backend_.watchDepartures(
          [this](const std::string& node, store::ConnEnd how) { onDeparted(node, how); });
  }
  ~DynamicRendezvous() override { shutdown(); }

  void setEventHandler(EventHandler handler) override { handler_ = std::move(handler); }
  void setJoinProgressHandler(JoinProgressHandler handler) override {
    progressHandler_ = std::move(handler);
  }

  void join(int localWorldSize, JoinHandler done) override {
    if (stopping_ || cancel_->cancelled()) {
      post_([done = std::move(done), error = cancelledJoin()] { done(error, {}); });
      return;
    }
    joining_ = true;
    tasks_.push([this, localWorldSize, done = std::move(done)] {
      runJoin(localWorldSize, done);
    });
  }

  void reportSuccess(int round) override {
    succeededRound_ = round;
    tasks_.push([this, round] {
      report(round, "its workers succeeded", [&] {
        // First in the state (a newcomer must not end a round that is
        // finishing), by the first node to succeed only (the finishing
        // key), then the count. A state tampered with: an invalid one ends
        // the round at once, a deleted or changed one lets the workers'
        // outcome decide. Only the first nodes of the round read the state
        // here (O(nodes) bytes each); endRound() reads it in any case.
        const bool first =
            client_->compareSet(key(round, "finishing"), "", nodeId_) == nodeId_;
        auto tampered = first || groupRank_ < static_cast<int>(detail::kWatchers)
                            ? checkRound(round)
                            : std::nullopt;
        if (tampered && tampered->invalid)
          return bury(round, RoundEnd::kFinished, "", *tampered);
        if (!tampered && first) {
          try {
            cell_->update([&](State& st) { detail::markFinishing(st, round); });
          } catch (const ProtocolError&) {  // endRound() looks again
          }
        }
        if (!reportDone(round)) return;
        if (tampered) return bury(round, RoundEnd::kFinished, "", *tampered);
        endRound(round, RoundEnd::kFinished, "");
      });
    });
  }

  // A failure that follows a peer's death is that membership change, not a
  // failure (the workers died on the broken collective): if a peer of the
  // round is lost (its process closed its heartbeat connection and no
  // connection beats for it again: detail::lostForGood, node_lease.h), it is
  // dropped, which ends the round as kMembershipChanged, and the failure is
  // not reported. The store reads a closed connection's end before it
  // answers (store::LeaseRule), so a death that reached our workers has
  // reached it.
  void reportFailure(int round, const std::string& why, bool closeJob) override {
    tasks_.push([this, round, why, closeJob] {
      report(round, "the round failed", [&] {
        if (dropLostPeers(round, why)) return;
        if (closeJob) closedByMe_ = true;
        endRound(round, closeJob ? RoundEnd::kClosed : RoundEnd::kFailed, why);
      });
    });
  }

  bool absorbsFailuresOfLostPeers() const override { return true; }
  // A signalled node leaves (shutdown() removes it): the others re-form.
  bool closesJobOnSignal() const override { return false; }

  // A pending join is cancelled at once. Otherwise queued reports go out
  // first, then the leave (see leave()); all bounded by closeTimeout.
  void shutdown() override {
    if (stopping_.exchange(true)) return;
    if (joining_) cancel_->cancel();
    tasks_.push([this] { leave(); });
    if (!tasks_.drain(opts_.closeTimeout))
      DDPRUN_DEBUG("rendezvous: leaving after ",
                   formatDuration(opts_.closeTimeout),
                   " without every report delivered");
    cancel_->cancel();
    leaveCancel_->cancel();
    tasks_.stop();
    departCancel_->cancel();
    departures_.stop();
    stopWatcher();
    if (liveness_) liveness_->stop();  // the task thread, its creator, has ended
    {
      std::lock_guard lock(deadMu_);
      deadCell_.reset();
      deadClient_.reset();
    }
    if (backend_.stopHosted) backend_.stopHosted();
  }

  void cancel() override { cancel_->cancel(); }

  std::string describe() const override {
    return "c10d, nodes " + std::to_string(opts_.minNodes) + ":" +
           std::to_string(opts_.maxNodes) + ", run " + opts_.runId + ", store " +
           backend_.storeAddress + (backend_.hosting ? ", hosted here" : "");
  }
  uint64_t heartbeatsMissed() const override {
    return backend_.missedBeats ? backend_.missedBeats->load() : 0;
  }

 private:
  std::string stateKey() const { return keys_.stateKey(); }
  std::string key(int round, const std::string& name) const { return keys_.key(round, name); }
  int64_t now() const { return backend_.clock(); }
  std::exception_ptr cancelledJoin() const {
    return std::make_exception_ptr(
        CancelledError("joining the rendezvous was cancelled"));
  }
  std::string storeGone(const std::string& why) const {
    return "the rendezvous store at " + backend_.storeAddress +
           " is gone or unreachable (" + why + "); its host (the agent started on " +
           opts_.endpointHost + ", or a ddprun-store) is a single point of failure";
  }

  // On the task thread. The result is posted even during shutdown: a
  // pending join always ends. The round's watcher starts only after the
  // result is posted, so the agent never hears of a round's end before it
  // has heard of the round.
  void runJoin(int localWorldSize, const JoinHandler& done) {
    std::exception_ptr error;
    RoundInfo info;
    try {
      info = joinRound(localWorldSize);
    } catch (const IoError& e) {
      storeLost_ = true;
      error =
          std::make_exception_ptr(IoError(storeGone(e.message()), e.file(), e.line()));
    } catch (const TimeoutError& e) {
      if (ownTimeout_) {  // peers are missing, not the store
        error = std::current_exception();
      } else {  // a store request that got no answer in time
        storeLost_ = true;
        error =
            std::make_exception_ptr(IoError(storeGone(e.message()), e.file(), e.line()));
      }
    } catch (...) {
      error = std::current_exception();
    }
    if (!error && cancel_->cancelled()) error = cancelledJoin();
    if (!error) lastJoined_ = info.round;
    joining_ = false;
    const bool joined = !error;
    post_([done, error = std::move(error), info] { done(error, info); });
    if (joined) startWatcher(info.round);
  }

  // Connects once per rendezvous and fixes this node's id.
  void ensureConnected() {
    if (client_) return;
    try {
      client_ = backend_.connect(cancel_, opts_.joinTimeout);
    } catch (const TimeoutError& e) {
      DDPRUN_THROW(IoError, e.message());
    }
    cell_.emplace(*client_, stateKey(), lim_, cancel_);
    addr_ = !opts_.localAddr.empty() ? opts_.localAddr
            : backend_.hosting       ? opts_.endpointHost
                                     : backend_.localAddress(*client_);
    if (addr_.empty()) addr_ = net::hostName();
    me_.id = detail::makeNodeId(addr_, backend_.pid,
                                backend_.nonce.empty()
                                    ? str::randomToken(detail::kNodeNonceChars)
                                    : backend_.nonce);
    if (!detail::isValidNodeId(me_.id))
      DDPRUN_THROW(InvalidArgument, "this node's address '", str::escape(addr_, 80),
                   "' cannot name it in the rendezvous (at most 230 characters of "
                   "letters, digits and ._-:%[]); pass another --local-addr");
    claimKey_ = keys_.claimNodeId(*client_, me_.id);  // refuses a duplicate id
    me_.host = backend_.hosting;
    nodeId_ = me_.id;
    liveness_ = backend_.startLiveness(me_.id);
    joiner_.emplace(*client_, *cell_, keys_, lim_, opts_, me_.id, backend_.storeAddress,
                    joinHooks());
    liveness_->setOnLost([this](int64_t silentMs) { onLost(silentMs); });
  }


  // On the heartbeat's beating thread: no beat of this node reached the
  // store for the heartbeat timeout (its link or the store is gone), so the
  // other nodes have dropped it by now; the round is over for it. A join or
  // a watcher blocked on the same dead link ends on its own timeouts.
  void onLost(int64_t silentMs) {
    storeLost_ = true;
    const int round = lastJoined_;
    if (stopping_ || round < 0 || lastEnded_ >= round || !handler_) return;
    RoundEvent event{round, RoundEnd::kStoreLost, -1,
                     storeGone("no heartbeat of this node reached it for " +
                               formatDuration(Millis(silentMs)) +
                               ", so the other nodes have dropped it")};
    post_([handler = handler_, event] { handler(event); });
  }

  // The join (dynamic_join.h): until this node takes part in a complete
  // round, the job is closed, or the join deadline passes.
  RoundInfo joinRound(int localWorldSize) {
    ownTimeout_ = false;
    if (storeLost_) DDPRUN_THROW(IoError, "it was lost before this join");
    DDPRUN_CHECK(localWorldSize > 0 && localWorldSize <= detail::kMaxNproc,
                 "a node of an elastic job runs 1 to ", detail::kMaxNproc,
                 " workers, got ", localWorldSize);
    ensureConnected();
    joinStarted_ = now();
    nextSay_ = joinStarted_ + sayEvery();
    const int64_t deadline = joinStarted_ + opts_.joinTimeout.count();
    me_.nproc = localWorldSize;
    try {
      for (;;) {
        const detail::Placement p = joiner_->join(me_, deadline);
        if (auto info = roundInfo(p)) return *info;
        // The round ended before it started: join the next.
      }
    } catch (...) {
      joiner_->releaseLease();  // best effort: it expires anyway
      throw;
    }
  }

  detail::JoinHooks joinHooks() {
    detail::JoinHooks h;
    h.now = [this] { return now(); };
    h.waitUntil = [this](const std::vector<std::string>& keys, int64_t untilMs) {
      return waitUntil(keys, untilMs);
    };
    h.afterState = [this](store::Store& store, const State& s) { ensureMarkers(store, s); };
    h.watch = [this](std::vector<std::string> peers) { setWatch(std::move(peers)); };
    h.progress = [this](const JoinProgress& p) { tellProgress(p); };
    h.timingOut = [this] { ownTimeout_ = true; };
    return h;
  }

  int64_t sayEvery() const { return std::max<int64_t>(1, opts_.joinProgressInterval.count()); }

  // A join that waits says where it stands: to the agent at every look,
  // and in the log once per joinProgressInterval.
  void tellProgress(JoinProgress p) {
    const int64_t t = now();
    p.waitingSeconds = static_cast<double>(t - joinStarted_) / 1000.0;
    if (t >= nextSay_) {
      DDPRUN_NOTICE("rendezvous: job ", opts_.runId, " waiting ",
                    formatDuration(Millis(t - joinStarted_)), " to join ",
                    rendezvous::describe(p));
      nextSay_ = t + sayEvery();
    }
    if (progressHandler_) post_([h = progressHandler_, p] { h(p); });
  }

  bool waitUntil(const std::vector<std::string>& keys, int64_t untilMs) {
    if (backend_.waitUntil) return backend_.waitUntil(*client_, keys, untilMs);
    for (;;) {
      const int64_t left = untilMs == INT64_MAX ? kWatchSlice.count() : untilMs - now();
      if (left <= 0) return client_->check(keys);
      try {
        client_->wait(keys, Millis(std::min(left, kWatchSlice.count())));
        return true;
      } catch (const TimeoutError&) {  // a slice or the deadline: look again
      }
    }
  }

  // The nodes this node watches: its verdict's while the round forms, its
  // placement's once it is complete.
  void setWatch(std::vector<std::string> peers) {
    if (peers == peers_) return;
    peers_ = peers;
    liveness_->setPeers(
        std::move(peers),
        [this](const std::string& node, int64_t silentMs) { onDead(node, silentMs); });
  }

  // Writes round/<r>/complete and round/<r>/end as the state says, once per
  // round and node: the writer of the state change may have died before.
  void ensureMarkers(store::Store& store, const State& s) {
    std::lock_guard lock(markMu_);
    const int done = s.complete ? s.round : s.lastEndedRound;
    if (done > completeMarked_) {
      // A complete round's placements first: a node seeing the marker
      // without its own placement knows it is not in the round.
      if (s.complete && !store.check({key(done, "complete")})) keys_.publishRound(store, s);
      store.set(key(done, "complete"), "");
      completeMarked_ = done;
    }
    if (s.lastEndedRound > endMarked_) {
      keys_.writeEnd(store, s.lastEndedRound, s.lastEnd);
      endMarked_ = s.lastEndedRound;
    }
  }

  // The complete round's info from this node's placement, or nullopt if
  // the round ended before group rank 0 published its worker store.
  std::optional<RoundInfo> roundInfo(const detail::Placement& p) {
    const std::string sizesKey = key(p.round, "sizes");
    RoundInfo info = detail::roundInfoOf(p, client_->get(sizesKey), sizesKey);
    groupRank_ = info.groupRank;
    roundSize_ = info.groupWorldSize;
    rosterRound_ = -1;
    setWatch(p.watch);
    if (!workerStore(info)) return std::nullopt;
    return info;
  }

  // The other participants of the round this node last joined, read once
  // per round (only the paths that need every peer do: JobKeys::roster);
  // nullopt if nothing tells them any more.
  std::optional<std::vector<std::string>> roundPeers(store::Store& store) {
    const int round = lastJoined_;
    if (rosterRound_ == round) return roundPeers_;
    auto ids = keys_.roster(store, round, cancel_);
    if (!ids) return std::nullopt;
    roundPeers_.clear();
    for (auto& id : *ids)
      if (id != nodeId_) roundPeers_.push_back(std::move(id));
    rosterRound_ = round;
    return roundPeers_;
  }

  // Group rank 0 starts the round's fresh worker store and publishes it; the
  // others read it (published right after completion). False: the round
  // ended first (group rank 0 died or stalled, and was dropped: whoever
  // wrote the end also wrote detail::kNoWorkerStore there).
  bool workerStore(RoundInfo& info) {
    const auto k = key(info.round, "worker_store");
    if (info.groupRank == 0) {
      info.workerStoreHost = addr_;
      info.workerStorePort = backend_.startWorkerStore();
      // A compare_set, not a SET: it is answered, so one lost to a reset
      // connection is sent again (a lost SET would leave the others waiting
      // read_timeout for it). Should the round have ended first, the end's
      // kNoWorkerStore stays, as the others read it.
      client_->compareSet(k, "", net::formatHostPort(addr_, info.workerStorePort));
      keys_.forgetRound(*client_, info.round - 2);
      return true;
    }
    try {
      client_->wait({k}, opts_.readTimeout);
    } catch (const TimeoutError&) {
      ownTimeout_ = true;
      DDPRUN_THROW(TimeoutError, "rendezvous round ", info.round,
                   ": group rank 0 did not publish the round's worker store (", k,
                   ") within ", formatDuration(opts_.readTimeout));
    }
    const std::string value = client_->get(k);
    if (value == detail::kNoWorkerStore || client_->check({key(info.round, "end")})) {
      DDPRUN_INFO("rendezvous: round ", info.round,
                  " ended before it started; joining the next one");
      return false;
    }
    const net::HostPort hp = detail::parseWorkerStore(value, k, opts_.runId);
    info.workerStoreHost = hp.host;
    info.workerStorePort = hp.port;
    return true;
  }

  // On the task thread: this node's "done" for `round`, a key of its own
  // written by a compare_set (answered, unlike a SET, and sent again after
  // a lost reply, unlike a counter's ADD: store::replayOf), then one ADD to
  // the round's count of successes, once per node and round: the node
  // that brings it to the round's size knows every participant's workers
  // succeeded (O(1) requests, whatever the round's size). An ADD whose
  // reply was lost (it may or may not count) makes this node read every
  // participant's key instead, now and at every later look; a report sent
  // again does too. True: every participant's workers succeeded.
  bool reportDone(int round) {
    client_->compareSet(key(round, "done/" + nodeId_), "", "1");
    if (countedRound_ == round) return everyoneDone(round);
    countedRound_ = round;
    try {
      return client_->add(key(round, "succeeded"), 1) >= roundSize_;
    } catch (const store::UnconfirmedError&) {
      uncountedRound_ = round;
      return everyoneDone(round);
    } catch (...) {  // not sent: the report is sent again
      countedRound_ = -1;
      throw;
    }
  }
  // Every participant's done/<id> of `round` is there (false when the
  // round's roster cannot be read).
  bool everyoneDone(int round) {
    const auto peers = roundPeers(*client_);
    if (!peers) return false;
    std::vector<std::string> keys{key(round, "done/" + nodeId_)};
    for (const auto& id : *peers) keys.push_back(key(round, "done/" + id));
    return client_->check(keys);
  }

  // On a watcher thread, every slice of its wait: once this node's workers
  // succeeded, it looks again whether every participant's are done (on the
  // task thread, which owns the state's cell). The report after the last
  // success writes the end; this bounds the wait should that report have
  // failed after every retry (a store out of reach for the whole reconnect
  // budget), by the heartbeat timeout.
  void finishIfEveryoneIsDone(int round) {
    if (succeededRound_ != round || stopping_) return;
    tasks_.push([this, round] {
      report(round, "every node's workers succeeded", [&] {
        const bool done = uncountedRound_ == round
                              ? everyoneDone(round)
                              : client_->add(key(round, "succeeded"), 0) >= roundSize_;
        if (done && !checkRound(round))
          endRound(round, RoundEnd::kFinished, "");
      });
    });
  }

  // On the task thread: the state change that ends `round`, then its key;
  // bury() if the state no longer describes the round.
  void endRound(int round, RoundEnd kind, const std::string& why) {
    auto tampered = checkRound(round);
    if (!tampered) {
      try {
        State s = cell_->update(
            [&](State& st) { detail::endRound(st, round, kind, groupRank_, why); });
        if (s.lastEndedRound >= round) {
          ensureMarkers(*client_, s);
          // Rounds after it ended too: its key was written then (a no-op),
          // unless the state was rewritten past it; its watchers must wake.
          if (s.lastEndedRound > round)
            client_->compareSet(key(round, "end"), "",
                                detail::encodeEnd(RoundEnd::kMembershipChanged, -1,
                                                  "the state says later rounds ran"));
          return;
        }
        tampered =
            Tamper{keys_.describeTamper(round, detail::roundTampered(s, round, me_.id)), false};
      } catch (const StateCell::StateGone&) {
        tampered = Tamper{keys_.describeTamper(round, "the state was deleted"), false};
      } catch (const ProtocolError& e) {
        tampered = Tamper{e.message(), true};
      }
    }
    bury(round, kind, why, *tampered);
  }

  // What is wrong with the state for the running round `round`, or nullopt
  // (it runs, or ended legitimately).
  std::optional<Tamper> checkRound(int round) {
    try {
      State s = cell_->refresh();
      const std::string why = detail::roundTampered(
          cell_->known() ? std::optional<State>(s) : std::nullopt, round, me_.id);
      if (why.empty()) return std::nullopt;
      return Tamper{keys_.describeTamper(round, why), false};
    } catch (const ProtocolError& e) {  // JobMismatchError too: not what this job wrote
      return Tamper{e.message(), true};
    }
  }

  // Ends `round` without its state (JobKeys::bury), on the task thread.
  void bury(int round, RoundEnd kind, const std::string& why, const Tamper& t) {
    keys_.bury(*client_, cell_->raw(), round, kind, groupRank_, why, t, nodeId_);
  }

  // On the task thread. Reports on a round that already ended change
  // nothing (the first end won) and are skipped: the store may be gone.
  void report(int round, const char* what, const std::function<void()>& request) {
    if (round != lastJoined_ || lastEnded_ >= round || cancel_->cancelled()) return;
    detail::sendReport(what, request);
  }

  // On the heartbeat's thread: drops a silent node from the state (ending
  // the running round it took part in), on a connection of its own.
  void onDead(const std::string& node, int64_t silentMs) {
    std::lock_guard lock(deadMu_);
    if (stopping_) return;
    const std::string why =
        detail::describeNode(node) + " missed heartbeats for " + formatDuration(Millis(silentMs));
    try {
      if (!deadClient_) {
        deadClient_ = backend_.connect(cancel_, opts_.readTimeout);
        deadCell_.emplace(*deadClient_, stateKey(), lim_, cancel_);
      }
      deadCell_->refresh();
      State s = deadCell_->update(
          [&](State& st) { detail::removeNode(st, node, why, lim_, now()); });
      ensureMarkers(*deadClient_, s);
      DDPRUN_INFO("rendezvous: ", why, "; dropped from the job");
    } catch (const CancelledError&) {
    } catch (const Error& e) {
      DDPRUN_WARN("rendezvous: could not drop ", detail::describeNode(node), ": ",
                  e.message());
    }
  }

  // On the task thread (a report): drops the round's peers whose heartbeat
  // connection closed. True if one was, which ended the round.
  bool dropLostPeers(int round, const std::string& why) {
    std::vector<std::string> lost;
    const auto peers = roundPeers(*client_);  // none: nobody known to be lost
    for (const auto& id : peers ? *peers : std::vector<std::string>{})
      if (detail::lostForGood(*client_, keys_.leaseKeys(id))) lost.push_back(id);
    if (lost.empty()) return false;
    State s = cell_->update([&](State& st) {
      for (const auto& id : lost) detail::removeNode(st, id, detail::departedWhy(id), lim_, now());
    });
    ensureMarkers(*client_, s);
    DDPRUN_INFO("rendezvous: this node's workers failed (", why, ") after ",
                detail::describeNode(lost.front()),
                lost.size() > 1 ? " and others" : "", " left the job; round ", round,
                " ends as a change of membership");
    return s.lastEndedRound >= round;
  }

  // Whether `node` owns its heartbeat key again (a new connection beats for
  // it, or no tombstone says its connection ended) by `deadlineMs`, on the
  // departures connection. Cancelled at shutdown.
  bool beatsAgainBy(const std::string& node, int64_t deadlineMs) {
    const detail::NodeLeaseKeys k = keys_.leaseKeys(node);
    return !detail::leaseEnded(*departClient_, k) ||
           detail::beatsWithin(*departClient_, k.beat, Millis(deadlineMs - now()));
  }


  // On the store's thread (the host only): a node's heartbeat connection
  // closed. Queued for the departures thread; never blocks.
  void onDeparted(const std::string& node, store::ConnEnd how) {
    if (node == nodeId_) return;
    // A reset connection may be replaced: its node gets the heartbeat
    // timeout from now to beat again. One its process closed gets none.
    const int64_t beatAgainBy =
        how == store::ConnEnd::kReset ? now() + heartbeatTimeout().count() : 0;
    departures_.push([this, node, beatAgainBy] { dropDeparted(node, beatAgainBy); });
  }

  // On the departures thread, on a connection of its own: a node whose
  // heartbeat connection its process closed (it died: FIN) is dropped from
  // the job at once; one whose connection was reset is dropped only if it
  // does not beat again on a new one by `beatAgainByMs` (a reset connection
  // reconnects at its next beat: store::ReconnectPolicy). One that left is
  // in no list by now, and dropping it changes nothing. Either way it no
  // longer needs the store: its goodbye is written for it, so that the host
  // never waits for a node that is gone (leave()).
  void dropDeparted(const std::string& node, int64_t beatAgainByMs) {
    try {
      if (!departClient_) {
        departClient_ = backend_.connect(departCancel_, opts_.readTimeout);
        departCell_.emplace(*departClient_, stateKey(), lim_, departCancel_);
      }
      if (!stopping_) {
        const State listed = departCell_->refresh();
        if (departCell_->known() && detail::isListed(listed, node) &&
            beatsAgainBy(node, beatAgainByMs))
          return;  // a reset connection, not a death
        if (departCell_->known()) {
          bool dropped = false;
          State s = departCell_->update([&](State& st) {
            dropped = detail::removeNode(st, node, detail::departedWhy(node), lim_, now());
          });
          ensureMarkers(*departClient_, s);
          if (dropped) DDPRUN_INFO("rendezvous: ", detail::departedWhy(node), "; dropped from the job");
        }
      }
      const int round = lastJoined_;
      if (round >= 0) departClient_->set(key(round, "left/" + node), "");
    } catch (const CancelledError&) {
    } catch (const Error& e) {
      DDPRUN_DEBUG("rendezvous: after ", detail::describeNode(node), " went: ", e.message());
    }
  }

  // On the task thread, at shutdown, on a connection of its own (cancel()
  // may have ended client_'s): a job that finished, or that this node
  // closed, stays closed; otherwise this node leaves and the others re-form
  // without it. The host then gives the round's other nodes a moment to read
  // its end before its store goes.
  //
  // A node that saw the job's end (finished or closed: the state is closed
  // already, by the end itself) and does not host the store has nothing to
  // tell: it must not reconnect, for the host may be gone by now (it stops
  // once every node has read the end).
  void leave() {
    if (!client_ || storeLost_) return;  // never joined, or nothing to tell
    if (jobEndSeen_ && !backend_.hosting) return;
    try {
      auto store = backend_.connect(leaveCancel_, opts_.closeTimeout);
      if (joiner_) joiner_->withdraw(*store);
      StateCell cell(*store, stateKey(), lim_, leaveCancel_);
      cell.refresh();
      State s = cell.update([&](State& st) {
        if (closedByMe_ || finished_)
          detail::close(st, "it finished");
        else
          detail::removeNode(st, me_.id, detail::describeNode(me_.id) + " left", lim_,
                             now());
      });
      ensureMarkers(*store, s);
      if (lastJoined_ >= 0 && !backend_.hosting)  // the host need not wait for this node
        store->set(key(lastJoined_, "left/" + nodeId_), "");
      if (!claimKey_.empty()) store->deleteKey(claimKey_);
      if (backend_.hosting) awaitGoodbyes(*store);
    } catch (const Error& e) {
      DDPRUN_DEBUG("rendezvous: leaving without every goodbye: ", e.message());
    }
  }

  void awaitGoodbyes(store::Store& store) {
    const int round = lastJoined_;
    if (round < 0 || !store.check({key(round, "end")})) return;
    std::vector<std::string> keys;
    const auto peers = roundPeers(store);
    if (!peers) return;
    for (const auto& id : *peers) keys.push_back(key(round, "left/" + id));
    if (!keys.empty()) store.wait(keys, opts_.closeTimeout);
  }

  // Watchers: one per round (round_watcher.h); starting a round ends the
  // previous round's watcher.
  void startWatcher(int round) { watcher_.start(round); }
  void stopWatcher() { watcher_.stop(); }

  // On the watcher thread: waits for the round's end as the state backs it;
  // a store that fails is kStoreLost; cancelled: nothing.
  detail::RoundWatcher::Hooks watcherHooks() {
    detail::RoundWatcher::Hooks h;
    h.connect = [this](std::shared_ptr<store::CancelToken> token) {
      return backend_.connect(std::move(token), opts_.readTimeout);
    };
    h.awaitEnd = [this](store::Store& store, int round,
                        const std::shared_ptr<store::CancelToken>& token) {
      return keys_.awaitTrustedEnd(store, round, token, heartbeatTimeout(), nodeId_,
                                   groupRank_ < static_cast<int>(detail::kWatchers),
                                   [this, round] { finishIfEveryoneIsDone(round); });
    };
    h.onEnded = [this](store::Store& store, int round, const RoundEvent& event) {
      if (event.kind == RoundEnd::kFinished) finished_ = true;
      if (event.kind == RoundEnd::kFinished || event.kind == RoundEnd::kClosed)
        jobEndSeen_ = true;
      lastEnded_ = std::max(lastEnded_.load(), round);
      keys_.sayLeft(store, round, nodeId_);
    };
    h.storeLost = [this](const Error& e) {
      storeLost_ = true;
      return storeGone(e.message());
    };
    h.deliver = [this](const RoundEvent& event) {
      if (!stopping_ && handler_) post_([handler = handler_, event] { handler(event); });
    };
    return h;
  }

  Millis heartbeatTimeout() const {
    return opts_.keepAliveInterval * opts_.keepAliveMaxAttempt;
  }

  const DynamicOptions opts_;
  const Post post_;
  detail::DynamicBackend backend_;
  const detail::Limits lim_;
  const JobKeys keys_;
  EventHandler handler_;  // set before the first join, read by watchers
  JoinProgressHandler progressHandler_;  // set before the first join
  const std::shared_ptr<store::CancelToken> cancel_ =
      std::make_shared<store::CancelToken>();
  const std::shared_ptr<store::CancelToken> leaveCancel_ =
      std::make_shared<store::CancelToken>();
  const std::shared_ptr<store::CancelToken> departCancel_ =
      std::make_shared<store::CancelToken>();
  // The task thread's (set by the first join, read by watchers after it).
  std::unique_ptr<store::Store> client_;
  std::optional<StateCell> cell_;
  std::string addr_;
  NodeDesc me_;
  std::string nodeId_;  // me_.id, for the watchers (set before the first)
  std::string claimKey_;  // id/<me_.id>, once claimed
  std::unique_ptr<detail::Liveness> liveness_;
  std::vector<std::string> peers_;       // watched by liveness_
  std::vector<std::string> roundPeers_;  // roundPeers(): of round rosterRound_
  int rosterRound_ = -1;
  // reportDone()'s: the round this node added its success to, and the
  // round whose ADD's reply was lost.
  int countedRound_ = -1;
  int uncountedRound_ = -1;
  std::atomic<int> groupRank_{-1};  // set by the task thread, read by watchers
  int roundSize_ = 0;
  // The task thread's: the join (set by the first join), the join's start
  // and next progress line.
  std::optional<detail::Joiner> joiner_;
  int64_t joinStarted_ = 0;
  int64_t nextSay_ = 0;
  // The markers this node made sure of (any thread).
  std::mutex markMu_;
  int completeMarked_ = -1;
  int endMarked_ = -1;
  // onDead's connection (the heartbeat's thread).
  std::mutex deadMu_;
  std::unique_ptr<store::Store> deadClient_;
  std::optional<StateCell> deadCell_;
  std::atomic<int> lastJoined_{-1};
  std::atomic<int> lastEnded_{-1};  // written by watchers: the last round seen ending
  std::atomic<int> succeededRound_{-1};  // the last round this node's workers succeeded
  std::atomic<bool> finished_{false};
  std::atomic<bool> jobEndSeen_{false};  // a watcher read "finished" or "closed"
  std::atomic<bool> storeLost_{false};  // a join or a watcher found the store gone
  // The task thread's: the TimeoutError is the join's own (peers missing),
  // not a store request's.
  bool ownTimeout_ = false;
  std::atomic<bool> closedByMe_{false};
  std::atomic<bool> joining_{false};
  std::atomic<bool> stopping_{false};
  // The departures thread's (the host only).
  std::unique_ptr<store::Store> departClient_;
  std::optional<StateCell> departCell_;
  detail::RoundWatcher watcher_{cancel_, watcherHooks()};
  detail::TaskThread departures_;
  detail::TaskThread tasks_;  // last: destroyed first, its thread uses the members above
};

}  // namespace

namespace detail {

std::unique_ptr<Rendezvous> makeDynamicRendezvous(const DynamicOptions& opts,
                                                  Rendezvous::Post post,
                                                  DynamicBackend backend) {
  validate(opts);
  DDPRUN_CHECK(backend.connect && backend.startWorkerStore && backend.startLiveness,
               "a dynamic rendezvous needs a store");
  return std::make_unique<DynamicRendezvous>(opts, std::move(post), std::move(backend));
}

}  // namespace detail
}  // namespace ddprun::rendezvous
