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
