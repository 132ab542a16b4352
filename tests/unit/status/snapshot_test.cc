#include "ddprun/status/snapshot.h"

#include <gtest/gtest.h>

#include <sstream>

namespace ddprun::status {
namespace {

Snapshot sample() {
  Snapshot s;
  s.runId = "job7";
  s.node = "host-a";
  s.agentState = "running";
  s.groupRank = 1;
  s.groupWorldSize = 2;
  s.attempt = 1;
  s.maxRestarts = 3;
  s.restartsLeft = 2;
  s.round = 4;
  s.worldSize = 3;
  s.backend = "static, node 1 of 2";
  s.workerStore = "10.0.0.1:29500";
  s.members = {{0, 1, 0}, {1, 2, 1}};
  WorkerStatus running;
  running.localRank = 0;
  running.globalRank = 1;
  running.pid = 4242;
  running.state = WorkerState::kRunning;
  running.started = "2024-05-01T12:00:00.000Z";
  WorkerStatus killed = running;
  killed.localRank = 1;
  killed.globalRank = 2;
  killed.pid = 4243;
  killed.state = WorkerState::kStopped;
  killed.exitCode = -15;
  killed.signal = "SIGTERM";
  s.workers = {running, killed};
  return s;
}

// The lines of `text` that start with `prefix`.
std::vector<std::string> linesStarting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

TEST(StatusSnapshot, JsonHasEveryField) {
  const auto j = toJson(sample());
  EXPECT_EQ(j["run_id"], "job7");
  EXPECT_EQ(j["node"], "host-a");
  EXPECT_EQ(j["state"], "running");
  EXPECT_EQ(j["group_rank"], 1);
  EXPECT_EQ(j["group_world_size"], 2);
  EXPECT_EQ(j["attempt"], 1);
  EXPECT_EQ(j["max_restarts"], 3);
  EXPECT_EQ(j["restarts_left"], 2);
  EXPECT_EQ(j["rendezvous"]["round"], 4);
  EXPECT_EQ(j["rendezvous"]["world_size"], 3);
  EXPECT_EQ(j["rendezvous"]["worker_store"], "10.0.0.1:29500");
  ASSERT_EQ(j["rendezvous"]["members"].size(), 2u);
  EXPECT_EQ(j["rendezvous"]["members"][1]["local_world_size"], 2);
  EXPECT_EQ(j["rendezvous"]["members"][1]["base_rank"], 1);
  ASSERT_EQ(j["workers"].size(), 2u);
  const auto& w0 = j["workers"][0];
  EXPECT_EQ(w0["local_rank"], 0);
  EXPECT_EQ(w0["global_rank"], 1);
  EXPECT_EQ(w0["pid"], 4242);
  EXPECT_EQ(w0["state"], "running");
  EXPECT_EQ(w0["started"], "2024-05-01T12:00:00.000Z");
  EXPECT_TRUE(w0["exit_code"].is_null());
  EXPECT_TRUE(w0["signal"].is_null());
  const auto& w1 = j["workers"][1];
  EXPECT_EQ(w1["state"], "stopped");
  EXPECT_EQ(w1["exit_code"], -15);
  EXPECT_EQ(w1["signal"], "SIGTERM");
}

TEST(StatusSnapshot, JoinIsNullUnlessJoiningAndSaysWhereTheRoundStands) {
  Snapshot s = sample();
  EXPECT_TRUE(toJson(s)["rendezvous"]["join"].is_null());
  JoinWait w;
  w.round = 2;
  w.joined = 3;
  w.minNodes = 2;
  w.maxNodes = 4;
  w.missingCount = 1;
  w.missing = {"node b (pid 7)"};
  w.waitingSeconds = 12.5;
  w.text = "round 2: 3 of 4 nodes joined";
  s.join = w;
  auto j = toJson(s)["rendezvous"]["join"];
  EXPECT_EQ(j["round"], 2);
  EXPECT_EQ(j["joined"], 3);
  EXPECT_EQ(j["min_nodes"], 2);
  EXPECT_EQ(j["max_nodes"], 4);
  EXPECT_EQ(j["missing_count"], 1);
  EXPECT_EQ(j["missing"][0], "node b (pid 7)");
  EXPECT_TRUE(j["last_call_seconds"].is_null());
  EXPECT_EQ(j["waiting_seconds"], 12.5);
  EXPECT_EQ(j["text"], "round 2: 3 of 4 nodes joined");
  s.join->lastCallSeconds = 4.0;
  EXPECT_EQ(toJson(s)["rendezvous"]["join"]["last_call_seconds"], 4.0);
}

TEST(StatusSnapshot, IsoUtcHasMilliseconds) {
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(1714564800123));
  EXPECT_EQ(isoUtc(t), "2024-05-01T12:00:00.123Z");
}

TEST(StatusSnapshot, LabelValuesAreEscaped) {
  EXPECT_EQ(escapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Snapshot s;
  s.runId = "x\"y";
  const auto text = toPrometheus(s);
  EXPECT_NE(text.find("ddprun_attempt{run_id=\"x\\\"y\"} 0\n"), std::string::npos) << text;
}

TEST(StatusSnapshot, EveryMetricHasHelpAndType) {
  Snapshot s = sample();
  s.workerExits = {{"1", 2}, {"SIGKILL", 1}};
  const auto text = toPrometheus(s);
  const auto types = linesStarting(text, "# TYPE ");
  const auto helps = linesStarting(text, "# HELP ");
  ASSERT_EQ(types.size(), helps.size());
  for (const auto& t : types) {
    std::istringstream in(t);
    std::string hash, kw, name, type;
    in >> hash >> kw >> name >> type;
    EXPECT_EQ(name.rfind("ddprun_", 0), 0u) << t;
    // Samples follow their TYPE line and are named after it.
    EXPECT_FALSE(linesStarting(text, name).empty()) << t;
  }
  EXPECT_NE(text.find("# TYPE ddprun_restarts_total counter"), std::string::npos);
  EXPECT_NE(text.find("ddprun_worker_exits_total{run_id=\"job7\",code=\"1\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ddprun_worker_exits_total{run_id=\"job7\",code=\"SIGKILL\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("ddprun_workers_running{run_id=\"job7\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("ddprun_restarts_left{run_id=\"job7\"} 2\n"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

// Worker 0 of sample() with a full progress report, worker 1 with only the
// required fields; an ETA and --progress-timeout.
Snapshot withProgress() {
  Snapshot s = sample();
  ProgressReport r;
  r.step = 41;
  r.epoch = 2;
  r.loss = 0.5;
  r.samplesPerSecond = 812.5;
  r.totalSteps = 1000;
  r.time = 1714564800.25;
  s.workers[0].progress = WorkerProgress{r, 1.5};
  ProgressReport bare;
  bare.step = 7;
  bare.time = 1714564700;
  s.workers[1].progress = WorkerProgress{bare, 100};
  s.etaSeconds = 3600;
  s.progressTimeout = 30;
  return s;
}

TEST(StatusSnapshot, JsonShowsProgressPerWorkerAndTheEta) {
  const auto plain = toJson(sample());
  EXPECT_TRUE(plain["workers"][0]["progress"].is_null());
  EXPECT_TRUE(plain["eta_seconds"].is_null());
  EXPECT_TRUE(plain["progress_timeout"].is_null());
  const auto j = toJson(withProgress());
  const auto& p0 = j["workers"][0]["progress"];
  EXPECT_EQ(p0["step"], 41);
  EXPECT_EQ(p0["epoch"], 2);
  EXPECT_EQ(p0["loss"], 0.5);
  EXPECT_EQ(p0["samples_per_second"], 812.5);
  EXPECT_EQ(p0["total_steps"], 1000);
  EXPECT_EQ(p0["time"], 1714564800.25);
  EXPECT_EQ(p0["seconds_since_progress"], 1.5);
  const auto& p1 = j["workers"][1]["progress"];
  EXPECT_EQ(p1["step"], 7);
  EXPECT_TRUE(p1["loss"].is_null());
  EXPECT_TRUE(p1["epoch"].is_null());
  EXPECT_TRUE(p1["samples_per_second"].is_null());
  EXPECT_TRUE(p1["total_steps"].is_null());
  EXPECT_EQ(j["eta_seconds"], 3600);
  EXPECT_EQ(j["progress_timeout"], 30);
}

TEST(StatusSnapshot, ProgressGaugesPerRankAndTheJobsEta) {
  const auto text = toPrometheus(withProgress());
  for (const char* line :
       {"ddprun_worker_step{run_id=\"job7\",rank=\"1\",local_rank=\"0\"} 41\n",
        "ddprun_worker_step{run_id=\"job7\",rank=\"2\",local_rank=\"1\"} 7\n",
        "ddprun_worker_epoch{run_id=\"job7\",rank=\"1\",local_rank=\"0\"} 2\n",
        "ddprun_worker_loss{run_id=\"job7\",rank=\"1\",local_rank=\"0\"} 0.5\n",
        "ddprun_worker_samples_per_second{run_id=\"job7\",rank=\"1\",local_rank=\"0\"} "
        "812.5\n",
        "ddprun_worker_total_steps{run_id=\"job7\",rank=\"1\",local_rank=\"0\"} 1000\n",
        "ddprun_worker_last_progress_timestamp_seconds{run_id=\"job7\",rank=\"1\","
        "local_rank=\"0\"} 1714564800.25\n",
        "ddprun_worker_seconds_since_progress{run_id=\"job7\",rank=\"2\",local_rank="
        "\"1\"} "
        "100\n",
        "ddprun_job_eta_seconds{run_id=\"job7\"} 3600\n",
        "# TYPE ddprun_worker_loss gauge\n", "# TYPE ddprun_job_eta_seconds gauge\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\nin:\n" << text;
  // Only worker 0 reported a loss: no sample for worker 1.
  EXPECT_EQ(text.find("ddprun_worker_loss{run_id=\"job7\",rank=\"2\""),
            std::string::npos);
  // Nobody reported: no progress family at all (no TYPE without a sample).
  const auto none = toPrometheus(sample());
  EXPECT_EQ(none.find("ddprun_worker_step"), std::string::npos);
  EXPECT_EQ(none.find("ddprun_job_eta_seconds"), std::string::npos);
}

TEST(StatusSnapshot, EveryProgressMetricHasHelpAndType) {
  const auto text = toPrometheus(withProgress());
  const auto types = linesStarting(text, "# TYPE ");
  EXPECT_EQ(types.size(), linesStarting(text, "# HELP ").size());
  for (const auto& t : types) {
    std::istringstream in(t);
    std::string hash, kw, name;
    in >> hash >> kw >> name;
    if (name == "ddprun_worker_exits_total") continue;  // none in sample(): TYPE alone
    EXPECT_FALSE(linesStarting(text, name).empty()) << t;
  }
}

TEST(StatusSnapshot, HistogramBucketsAreCumulative) {
  Snapshot s;
  s.runId = "r";
  s.roundDurations = Histogram({1, 10});
  for (double v : {0.5, 1.0, 3.0, 20.0, 30.0}) s.roundDurations.observe(v);
  const auto text = toPrometheus(s);
  const std::string n = "ddprun_rendezvous_round_duration_seconds";
  const auto buckets = linesStarting(text, n + "_bucket");
  ASSERT_EQ(buckets.size(), 3u) << text;
  EXPECT_EQ(buckets[0], n + "_bucket{run_id=\"r\",le=\"1\"} 2");  // le is inclusive
  EXPECT_EQ(buckets[1], n + "_bucket{run_id=\"r\",le=\"10\"} 3");
  EXPECT_EQ(buckets[2], n + "_bucket{run_id=\"r\",le=\"+Inf\"} 5");
  EXPECT_EQ(linesStarting(text, n + "_sum")[0], n + "_sum{run_id=\"r\"} 54.5");
  EXPECT_EQ(linesStarting(text, n + "_count")[0], n + "_count{run_id=\"r\"} 5");
}

TEST(StatusSnapshot, DefaultBucketsAscend) {
  const auto b = roundDurationBuckets();
  ASSERT_FALSE(b.empty());
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  EXPECT_NE(toPrometheus(Snapshot{}).find("le=\"0.1\""), std::string::npos);
}

}  // namespace
}  // namespace ddprun::status
