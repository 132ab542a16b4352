#include "ddprun/agent/failure.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddprun/agent/launch_config.h"
#include "ddprun/common/strings.h"

namespace ddprun::agent {

namespace {
std::time_t timestampOf(const nlohmann::json& j) {
  if (j.is_number()) return static_cast<std::time_t>(j.get<double>());
  double t = 0;
  if (j.is_string() && str::parseDouble(j.get<std::string>(), t) && t >= 0)
    return static_cast<std::time_t>(t);
  return 0;
}

std::string formatTime(std::time_t t) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

std::string indent(const std::string& text, const std::string& pad) {
  std::string out;
  std::istringstream in(text);
  bool first = true;
  for (std::string line; std::getline(in, line); first = false)
    out += (first ? "" : "\n" + pad) + line;
  return out;
}

std::string entry(size_t idx, const std::string& host, const WorkerFailure& f) {
  std::ostringstream os;
  os << "[" << idx << "]:\n"
     << "  time      : " << formatTime(f.time) << "\n"
     << "  host      : " << host << "\n"
     << "  rank      : " << f.globalRank << " (local_rank: " << f.localRank << ")\n"
     << "  exitcode  : " << describeExit(f.exitCode) << " (pid: " << f.pid << ")\n"
     << "  error_file: " << (f.errorFile.empty() ? "<N/A>" : f.errorFile) << "\n";
  std::string tb;
  if (!f.traceback.empty()) tb = f.traceback;
  else if (!f.message.empty()) tb = f.message;
  else if (f.exitCode < 0)
    tb = "Signal " + std::to_string(-f.exitCode) + " (" + signalName(-f.exitCode) +
         ") received by PID " + std::to_string(f.pid);
  else tb = std::string("<no error file; see the ") + (f.tailHasStdout ? "output" : "stderr") +
            " tail below>";
  if (f.victim) tb += " [stopped by ddprun after the root-cause failure]";
  os << "  traceback : " << indent(tb, "    ") << "\n";
  if (!f.victim && !f.stderrTail.empty()) {
    // A shared channel's tail holds stdout lines too: named for what it is.
    os << "  " << (f.tailHasStdout ? "output (stdout and stderr, last " : "stderr (last ")
       << f.stderrTail.size() << " lines):\n";
    for (const auto& l : f.stderrTail) os << "    " << l << "\n";
  }
  return os.str();
}
}  // namespace

// Failures ordered root cause first: real failures before victims, then by
// time, then by local rank.
std::vector<const WorkerFailure*> byCause(const std::vector<WorkerFailure>& failures) {
  std::vector<const WorkerFailure*> order;
  for (const auto& f : failures) order.push_back(&f);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    if (a->victim != b->victim) return !a->victim;
    if (a->time != b->time) return a->time < b->time;
    return a->localRank < b->localRank;
  });
  return order;
}

const WorkerFailure* rootCause(const std::vector<WorkerFailure>& failures) {
  auto order = byCause(failures);
  return order.empty() ? nullptr : order.front();
}

bool copyRootErrorFile(const std::vector<WorkerFailure>& failures, const std::string& dest) {
  const WorkerFailure* root = rootCause(failures);
  if (root == nullptr || root->errorFile.empty()) return false;
  std::ifstream in(root->errorFile);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.contains("message") && j["message"].is_object()) j["message"]["errorCode"] = root->exitCode;
  else j["errorCode"] = root->exitCode;
  std::ofstream out(dest);
  out << j.dump();
  return static_cast<bool>(out);
}

bool readErrorFile(const std::string& path, WorkerFailure& f) {
  std::ifstream in(path);
  if (!in) return false;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return false;
  f.errorFile = path;
  const auto& m = j["message"];
  if (m.is_object()) {
    f.message = m.value("message", "");
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& x = m["extraInfo"];
      f.traceback = x.value("py_callstack", "");
      if (x.contains("timestamp")) {
        auto t = timestampOf(x["timestamp"]);
        if (t) f.time = t;
      }
    }
  } else if (m.is_string()) {
    f.message = m.get<std::string>();
  }
  if (j.contains("timestamp")) {
    auto t = timestampOf(j["timestamp"]);
    if (t) f.time = t;
  }
  return true;
}

std::string describeExit(int exitCode) {
  if (exitCode >= 0) return std::to_string(exitCode);
  return std::to_string(exitCode) + " (" + signalName(-exitCode) + ")";
}

std::string formatFailureSummary(const std::string& name, const std::string& host,
                                 const std::vector<WorkerFailure>& failures,
                                 const std::string& note) {
  std::vector<const WorkerFailure*> order = byCause(failures);
  std::string title = name + " FAILED";
  if (!note.empty()) title += "\n" + note;
  std::string root = order.empty() ? "" : entry(0, host, *order.front());
  std::string others;
  for (size_t i = 1; i < order.size(); ++i) others += entry(i, host, *order[i]);
  if (others.empty()) others = "  <NO_OTHER_FAILURES>\n";
  size_t width = 0;
  for (const std::string* block : {&title, &root, &others}) {
    std::istringstream in(*block);
    for (std::string line; std::getline(in, line);) width = std::max(width, line.size());
  }
  width = std::min<size_t>(width, 60);
  std::string eq(width, '='), dash(width, '-');
  return eq + "\n" + title + "\n" + dash + "\nFailures:\n" + others + dash +
         "\nRoot Cause (first observed failure):\n" + root + eq + "\n";
}

}  // namespace ddprun::agent
