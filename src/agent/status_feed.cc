// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "status_feed.h"

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"

namespace ddprun::agent {

namespace {
status::WorkerStatus workerStatus(const WorkerRecord& w) {
  status::WorkerStatus s;
  s.localRank = w.localRank;
  s.globalRank = w.globalRank;
  s.pid = w.pid;
  s.started = status::isoUtc(w.startedWall);
  if (w.running) {
    s.state = status::WorkerState::kRunning;
    return s;
  }
  s.exitCode = w.exitCode;
  if (w.exitCode < 0) s.signal = signalName(-w.exitCode);
  s.state = w.exitCode == 0      ? status::WorkerState::kSucceeded
            : w.stoppedByAgent ? status::WorkerState::kStopped
                               : status::WorkerState::kFailed;
  return s;
}

// The worker's latest progress report, when it made one this attempt.
void addProgress(status::WorkerStatus& s, const StatusFeed::View& v) {
  const ProgressWatch::Rank* r = v.progress ? v.progress->rank(s.localRank) : nullptr;
  if (r == nullptr) return;
  s.progress = status::WorkerProgress{
      r->report, v.progress->secondsSinceProgress(s.localRank, v.now).value_or(0)};
}

}  // namespace

StatusFeed::StatusFeed(const LaunchConfig& cfg, std::string node, int nproc) : cfg_(cfg) {
  counters_.node = std::move(node);
  counters_.runId = cfg.rdzvId;
  if (!cfg.statusPort) return;
  status::ServerOptions opts;
  opts.address = cfg.statusAddr;
  opts.port = *cfg.statusPort;
  opts.localWorkers = nproc;
  opts.nodes = cfg.maxNodes;
  try {
    server_ = std::make_unique<status::StatusServer>(opts, publisher_);
  } catch (const Error& e) {
    DDPRUN_THROW(IoError, "--status-port ", *cfg.statusPort, " (--status-addr ",
                 cfg.statusAddr, "): ", e.message(),
                 "; give another port, or 0 for a free one");
  }
}

std::string StatusFeed::url() const { return server_ ? server_->url() : ""; }

void StatusFeed::roundJoined(double seconds) {
  joined_ = true;
  counters_.roundDurations.observe(seconds);
}

void StatusFeed::workerExited(int exitCode) {
  ++counters_.workerExits[exitCode < 0 ? signalName(-exitCode) : std::to_string(exitCode)];
}

void StatusFeed::restarted() { ++counters_.restartsTotal; }

void StatusFeed::publish(const View& v) {
  if (!server_) return;
  status::Snapshot s = counters_;
  s.agentState = v.state;
  s.attempt = v.attempt;
  s.maxRestarts = cfg_.maxRestarts;
  s.restartsLeft = v.restartsLeft;
  s.backend = v.backend;
  s.heartbeatsMissed = v.heartbeatsMissed;
  s.updated = status::isoUtc(std::chrono::system_clock::now());
  if (joined_ && v.round) {
    const auto& r = *v.round;
    s.groupRank = r.groupRank;
    s.groupWorldSize = r.groupWorldSize;
    s.round = r.round;
    s.worldSize = r.worldSize;
    s.workerStore = net::formatHostPort(r.workerStoreHost, r.workerStorePort);
    const auto layout = rendezvous::assignRanks(r.localWorldSizes);
    for (size_t i = 0; i < r.localWorldSizes.size(); ++i)
      s.members.push_back({static_cast<int>(i), r.localWorldSizes[i], layout.baseRanks[i]});
  }
  if (v.join) {
    const auto& j = *v.join;
    status::JoinWait jw;
    jw.round = j.round;
    jw.joined = j.joined;
    jw.minNodes = j.minNodes;
    jw.maxNodes = j.maxNodes;
    jw.missingCount = j.missingCount;
    jw.missing = j.missing;
    jw.lastCallSeconds = j.lastCallSeconds;
    jw.waitingSeconds = j.waitingSeconds;
    jw.waitingFor = j.waitingFor;
    jw.text = rendezvous::describe(j);
    s.join = std::move(jw);
  }
  if (v.workers)
    for (const auto& w : *v.workers) {
      s.workers.push_back(workerStatus(w));
      addProgress(s.workers.back(), v);
    }
  if (v.progress) s.etaSeconds = v.progress->etaSeconds();
  if (cfg_.progressTimeout)
    s.progressTimeout = std::chrono::duration<double>(*cfg_.progressTimeout).count();
  publisher_->publish(std::move(s));
}

}  // namespace ddprun::agent
