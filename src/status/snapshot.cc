#include "ddprun/status/snapshot.h"

#include <time.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace ddprun::status {

const char* toString(WorkerState state) {
  switch (state) {
    case WorkerState::kStarting: return "starting";
    case WorkerState::kRunning: return "running";
    case WorkerState::kSucceeded: return "succeeded";
    case WorkerState::kFailed: return "failed";
    case WorkerState::kStopped: return "stopped";
  }
  return "unknown";
}

Histogram::Histogram(std::vector<double> upperBounds)
    : bounds(std::move(upperBounds)), counts(bounds.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto at = std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin();
  ++counts[static_cast<size_t>(at)];
  sum += value;
  ++count;
}

std::vector<double> roundDurationBuckets() {
  return {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
}

std::string isoUtc(std::chrono::system_clock::time_point t) {
  using namespace std::chrono;
  const auto ms = duration_cast<milliseconds>(t.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(ms / 1000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

namespace {
template <typename T>
nlohmann::json orNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json progressJson(const std::optional<WorkerProgress>& p) {
  if (!p) return nullptr;
  const ProgressReport& r = p->report;
  return {{"step", r.step},
          {"epoch", orNull(r.epoch)},
          {"loss", orNull(r.loss)},
          {"samples_per_second", orNull(r.samplesPerSecond)},
          {"total_steps", orNull(r.totalSteps)},
          {"time", r.time},
          {"seconds_since_progress", p->secondsSinceProgress}};
}
}  // namespace

nlohmann::json toJson(const Snapshot& s) {
  nlohmann::json members = nlohmann::json::array();
  for (const auto& m : s.members)
    members.push_back({{"group_rank", m.groupRank},
                       {"local_world_size", m.localWorldSize},
                       {"base_rank", m.baseRank}});
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : s.workers) {
    nlohmann::json j = {{"local_rank", w.localRank}, {"global_rank", w.globalRank},
                        {"pid", w.pid},              {"state", toString(w.state)},
                        {"started", w.started},      {"exit_code", nullptr},
                        {"signal", nullptr}};
    if (w.exitCode) j["exit_code"] = *w.exitCode;
    if (!w.signal.empty()) j["signal"] = w.signal;
    j["progress"] = progressJson(w.progress);
    workers.push_back(std::move(j));
  }
  nlohmann::json join = nullptr;
  if (s.join)
    join = {{"round", s.join->round},
            {"joined", s.join->joined},
            {"min_nodes", s.join->minNodes},
            {"max_nodes", s.join->maxNodes},
            {"missing_count", s.join->missingCount},
            {"missing", s.join->missing},
            {"last_call_seconds", s.join->lastCallSeconds >= 0
                                       ? nlohmann::json(s.join->lastCallSeconds)
                                       : nlohmann::json(nullptr)},
            {"waiting_seconds", s.join->waitingSeconds},
            {"waiting_for", s.join->waitingFor},
            {"text", s.join->text}};
  return {{"run_id", s.runId},
          {"node", s.node},
          {"state", s.agentState},
          {"group_rank", s.groupRank},
          {"group_world_size", s.groupWorldSize},
          {"attempt", s.attempt},
          {"max_restarts", s.maxRestarts},
          {"restarts_left", s.restartsLeft},
          {"rendezvous",
           {{"round", s.round},
            {"world_size", s.worldSize},
            {"backend", s.backend},
            {"worker_store", s.workerStore},
            {"members", std::move(members)},
            {"join", std::move(join)}}},
          {"workers", std::move(workers)},
          {"eta_seconds", orNull(s.etaSeconds)},
          {"progress_timeout", orNull(s.progressTimeout)},
          {"updated", s.updated}};
}

std::string escapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {
// A sample value in the shortest form that reads back the same double;
// +Inf as the format spells it.
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // the shortest exact form
  return std::string(buf, r.ptr);
}

void header(std::ostringstream& o, const std::string& name, const char* type,
            const char* help) {
  o << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

void histogram(std::ostringstream& o, const std::string& name, const Histogram& h,
               const std::string& labels) {
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : labels + ",";
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    o << name << "_bucket{" << sep << "le=\"" << number(h.bounds[i]) << "\"} " << cumulative
      << '\n';
  }
  o << name << "_bucket{" << sep << "le=\"+Inf\"} " << h.count << '\n';
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  o << name << "_sum" << plain << ' ' << number(h.sum) << '\n';
  o << name << "_count" << plain << ' ' << h.count << '\n';
}

// The per-rank progress gauges: one sample per worker that reported the
// field, labelled by its ranks.
void progressGauges(std::ostringstream& o, const Snapshot& s, const std::string& run) {
  struct Gauge {
    const char* name;
    const char* help;
    std::optional<double> (*value)(const WorkerProgress&);
  };
  static const Gauge kGauges[] = {
      {"ddprun_worker_step", "The last training step a worker reported.",
       [](const WorkerProgress& p) -> std::optional<double> {
         return static_cast<double>(p.report.step);
       }},
      {"ddprun_worker_epoch", "The epoch a worker last reported.",
       [](const WorkerProgress& p) -> std::optional<double> {
         if (!p.report.epoch) return std::nullopt;
         return static_cast<double>(*p.report.epoch);
       }},
      {"ddprun_worker_total_steps",
       "The steps of the whole run, as a worker reported them.",
       [](const WorkerProgress& p) -> std::optional<double> {
         if (!p.report.totalSteps) return std::nullopt;
         return static_cast<double>(*p.report.totalSteps);
       }},
      {"ddprun_worker_loss", "The loss a worker last reported.",
       [](const WorkerProgress& p) { return p.report.loss; }},
      {"ddprun_worker_samples_per_second", "A worker's throughput, as it reported it.",
       [](const WorkerProgress& p) { return p.report.samplesPerSecond; }},
      {"ddprun_worker_last_progress_timestamp_seconds",
       "When a worker's last reported step ended (unix seconds, the worker's clock).",
       [](const WorkerProgress& p) -> std::optional<double> { return p.report.time; }},
      {"ddprun_worker_seconds_since_progress",
       "Seconds since the agent saw a worker's progress report change.",
       [](const WorkerProgress& p) -> std::optional<double> {
         return p.secondsSinceProgress;
       }},
  };
  // A family with no sample (nobody reported that field) is left out whole.
  for (const Gauge& g : kGauges) {
    std::ostringstream samples;
    for (const auto& w : s.workers) {
      if (!w.progress) continue;
      const auto v = g.value(*w.progress);
      if (!v) continue;
      samples << g.name << '{' << run << ",rank=\"" << w.globalRank << "\",local_rank=\""
              << w.localRank << "\"} " << number(*v) << '\n';
    }
    if (samples.tellp() == 0) continue;
    header(o, g.name, "gauge", g.help);
    o << samples.str();
  }
  if (!s.etaSeconds) return;
  header(o, "ddprun_job_eta_seconds", "gauge",
         "Seconds to the job's last step at the slowest local rank's rate.");
  o << "ddprun_job_eta_seconds{" << run << "} " << number(*s.etaSeconds) << '\n';
}
}  // namespace

std::string toPrometheus(const Snapshot& s) {
  std::ostringstream o;
  const std::string run = "run_id=\"" + escapeLabelValue(s.runId) + "\"";
  header(o, "ddprun_info", "gauge", "The agent: run id, node and state (always 1).");
  o << "ddprun_info{" << run << ",node=\"" << escapeLabelValue(s.node) << "\",state=\""
    << escapeLabelValue(s.agentState) << "\"} 1\n";
  header(o, "ddprun_attempt", "gauge", "Restarts of the worker group so far (the attempt).");
  o << "ddprun_attempt{" << run << "} " << s.attempt << '\n';
  header(o, "ddprun_restarts_left", "gauge", "Restarts left before the job fails.");
  o << "ddprun_restarts_left{" << run << "} " << s.restartsLeft << '\n';
  header(o, "ddprun_rendezvous_round", "gauge", "The last rendezvous round joined (-1: none).");
  o << "ddprun_rendezvous_round{" << run << "} " << s.round << '\n';
  header(o, "ddprun_workers_running", "gauge", "Local workers running now.");
  const auto running = std::count_if(s.workers.begin(), s.workers.end(), [](const auto& w) {
    return w.state == WorkerState::kRunning;
  });
  o << "ddprun_workers_running{" << run << "} " << running << '\n';
  header(o, "ddprun_restarts_total", "counter", "Worker group restarts by this agent, any cause.");
  o << "ddprun_restarts_total{" << run << "} " << s.restartsTotal << '\n';
  header(o, "ddprun_worker_exits_total", "counter",
         "Local worker exits by exit code (or signal name).");
  for (const auto& [code, n] : s.workerExits)
    o << "ddprun_worker_exits_total{" << run << ",code=\"" << escapeLabelValue(code) << "\"} "
      << n << '\n';
  header(o, "ddprun_rendezvous_round_duration_seconds", "histogram",
         "Time from joining a rendezvous round to its completion, as this agent saw it.");
  histogram(o, "ddprun_rendezvous_round_duration_seconds", s.roundDurations, run);
  header(o, "ddprun_heartbeats_missed_total", "counter",
         "This node's heartbeats that did not reach the rendezvous store.");
  o << "ddprun_heartbeats_missed_total{" << run << "} " << s.heartbeatsMissed << '\n';
  progressGauges(o, s, run);
  return o.str();
}

}  // namespace ddprun::status
