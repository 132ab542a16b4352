#include "ddprun/status/handler.h"

#include <gtest/gtest.h>

#include <sstream>

#include "ddprun/common/error.h"
#include "ddprun/status/client.h"

namespace ddprun::status {
namespace {

namespace http = boost::beast::http;

Request request(http::verb verb, const std::string& target) {
  Request r{verb, target, 11};
  r.set(http::field::host, "localhost");
  return r;
}

Snapshot sample() {
  Snapshot s;
  s.runId = "job7";
  s.node = "host-a";
  s.agentState = "running";
  s.groupRank = 0;
  s.groupWorldSize = 1;
  s.round = 0;
  s.worldSize = 2;
  s.members = {{0, 2, 0}};
  for (int i = 0; i < 2; ++i) {
    WorkerStatus w;
    w.localRank = w.globalRank = i;
    w.pid = 100 + i;
    w.state = WorkerState::kRunning;
    w.started = "2024-05-01T12:00:00.000Z";
    s.workers.push_back(w);
  }
  return s;
}

TEST(StatusHandler, StatusIsJson) {
  const auto res = handle(request(http::verb::get, "/status"), sample());
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res[http::field::content_type], "application/json");
  EXPECT_FALSE(res.keep_alive());
  const auto j = nlohmann::json::parse(res.body());
  EXPECT_EQ(j["run_id"], "job7");
  EXPECT_EQ(j["workers"][1]["pid"], 101);
  EXPECT_EQ(res[http::field::content_length], std::to_string(res.body().size()));
}

TEST(StatusHandler, QueryStringIsIgnored) {
  EXPECT_EQ(handle(request(http::verb::get, "/status?x=1"), sample()).result(), http::status::ok);
}

TEST(StatusHandler, Healthz) {
  const auto res = handle(request(http::verb::get, "/healthz"), sample());
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res.body(), "ok\n");
}

TEST(StatusHandler, MetricsAreTextFormat) {
  const auto res = handle(request(http::verb::get, "/metrics"), sample());
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res.body(), toPrometheus(sample()));
}

TEST(StatusHandler, HeadHasTheHeadersOfGetAndNoBody) {
  const auto get = handle(request(http::verb::get, "/metrics"), sample());
  const auto head = handle(request(http::verb::head, "/metrics"), sample());
  EXPECT_EQ(head.result(), http::status::ok);
  EXPECT_TRUE(head.body().empty());
  EXPECT_EQ(head[http::field::content_length], std::to_string(get.body().size()));
  EXPECT_EQ(head[http::field::content_type], get[http::field::content_type]);
}

TEST(StatusHandler, UnknownPathIs404) {
  for (const char* t : {"/", "/statusx", "/status/", "/metrics/../status"})
    EXPECT_EQ(handle(request(http::verb::get, t), sample()).result(), http::status::not_found)
        << t;
}

TEST(StatusHandler, OtherMethodsAre405WithAllow) {
  for (auto verb : {http::verb::post, http::verb::put, http::verb::delete_, http::verb::options}) {
    const auto res = handle(request(verb, "/status"), sample());
    EXPECT_EQ(res.result(), http::status::method_not_allowed);
    EXPECT_EQ(res[http::field::allow], "GET, HEAD");
  }
}

TEST(StatusHandler, TargetThatIsNoPathIs400) {
  for (const char* t : {"*", "http://example.com/status", "status"})
    EXPECT_EQ(handle(request(http::verb::get, t), sample()).result(), http::status::bad_request)
        << t;
}

TEST(StatusHandler, Http10IsAnsweredIn10) {
  Request r{http::verb::get, "/healthz", 10};
  EXPECT_EQ(handle(r, sample()).version(), 10u);
}

TEST(StatusHandler, NonUtf8RunIdDoesNotThrow) {
  Snapshot s = sample();
  s.runId = "bad\xff";
  EXPECT_EQ(handle(request(http::verb::get, "/status"), s).result(), http::status::ok);
}

TEST(StatusTable, ShowsHeaderAndOneLinePerWorker) {
  const auto text = formatStatusTable(toJson(sample()));
  EXPECT_NE(text.find("job7"), std::string::npos) << text;
  EXPECT_NE(text.find("host-a"), std::string::npos);
  EXPECT_NE(text.find("node 0 ranks 0-1"), std::string::npos) << text;
  EXPECT_NE(text.find("100"), std::string::npos);
  EXPECT_NE(text.find("101"), std::string::npos);
  EXPECT_NE(text.find("LOCAL_RANK"), std::string::npos);
}

TEST(StatusTable, AJoiningAgentSaysWhereItsRoundStands) {
  Snapshot s = sample();
  EXPECT_EQ(formatStatusTable(toJson(s)).find("joining:"), std::string::npos);
  JoinWait w;
  w.text = "round 2: 3 of 4 nodes joined; expected but missing: node b (pid 7)";
  w.waitingSeconds = 75;
  s.join = w;
  const auto text = formatStatusTable(toJson(s));
  EXPECT_NE(text.find("joining: round 2: 3 of 4 nodes joined; expected but missing: node b "
                      "(pid 7) (waiting "),
            std::string::npos)
      << text;
  auto j = toJson(s);
  j["rendezvous"]["join"]["waiting_seconds"] = "junk";  // an odd agent: still prints
  EXPECT_NE(formatStatusTable(j).find("joining: round 2"), std::string::npos);
}

TEST(StatusTable, ExitShowsSignalName) {
  Snapshot s = sample();
  s.workers[1].state = WorkerState::kStopped;
  s.workers[1].exitCode = -9;
  s.workers[1].signal = "SIGKILL";
  EXPECT_NE(formatStatusTable(toJson(s)).find("SIGKILL"), std::string::npos);
}

TEST(StatusTable, ProgressColumnsAndEtaWhenReported) {
  Snapshot s = sample();
  EXPECT_EQ(formatStatusTable(toJson(s)).find("STEP"),
            std::string::npos);  // none reported
  ProgressReport r;
  r.step = 41;
  r.epoch = 2;
  r.loss = 0.53125;
  r.samplesPerSecond = 812.5;
  r.time = 1714564800;
  s.workers[0].progress = WorkerProgress{r, 2.5};
  s.etaSeconds = 3725;
  s.progressTimeout = 30;
  const auto text = formatStatusTable(toJson(s));
  for (const char* part :
       {"STEP", "EPOCH", "LOSS", "SAMPLES/S", "LAST STEP", "41", "0.5312", "812.5",
        "2.5 s ago", "eta:     1h 02m", "progress timeout: 30 s"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " in:\n" << text;
  // The worker without a report: dashes in its progress columns.
  std::istringstream in(text);
  std::string line, row1;
  while (std::getline(in, line))
    if (line.rfind("1 ", 0) == 0) row1 = line;
  std::istringstream cells(row1);
  int dashes = 0;
  for (std::string cell; cells >> cell;) dashes += cell == "-";
  EXPECT_EQ(dashes, 6) << text;  // its exit code and the five progress columns
}

TEST(StatusTable, AnAgentWithoutProgressFieldsStillPrints) {
  auto j = toJson(sample());
  j.erase("eta_seconds");
  j.erase("progress_timeout");
  for (auto& w : j["workers"]) w.erase("progress");
  EXPECT_NE(formatStatusTable(j).find("LOCAL_RANK"), std::string::npos);
}

TEST(StatusTable, MissingFieldIsNamed) {
  auto j = toJson(sample());
  j.erase("attempt");
  try {
    formatStatusTable(j);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("attempt"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace ddprun::status
