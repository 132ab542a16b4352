#include "ddprun/common/log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace ddprun {
namespace {
std::atomic<LogLevel> gLevel{LogLevel::kInfo};
std::mutex gMutex;
std::string gTag = "ddprun";
std::atomic<LogStyle> gStyle{LogStyle::kTimestamped};

const char* levelWord(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug: ";
    case LogLevel::kInfo: return "";
    case LogLevel::kWarning: return "warning: ";
    default: return "error: ";
  }
}

char levelChar(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarning: return 'W';
    default: return 'E';
  }
}
}  // namespace

void setLogLevel(LogLevel level) { gLevel = level; }
LogLevel logLevel() { return gLevel; }

void setLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(gMutex);
  gTag = tag;
}

LogLevel parseLogLevel(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), ::tolower);
  if (n == "debug") return LogLevel::kDebug;
  if (n == "info") return LogLevel::kInfo;
  if (n == "warning" || n == "warn") return LogLevel::kWarning;
  if (n == "error") return LogLevel::kError;
  if (n == "off") return LogLevel::kOff;
  DDPRUN_THROW(InvalidArgument, "unknown log level '", name,
               "' (expected debug, info, warning, error or off)");
}

void setLogStyle(LogStyle style) { gStyle = style; }

void logLine(LogLevel level, const std::string& msg, bool labelled) {
  using namespace std::chrono;
  if (gStyle == LogStyle::kConsole) {
    std::lock_guard<std::mutex> lock(gMutex);
    std::string line = gTag + ": " + (labelled ? levelWord(level) : "") + msg + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
    return;
  }
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  int ms = static_cast<int>(
      duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(gMutex);
  std::fprintf(stderr, "[%s %c %s.%03dZ] %s\n", gTag.c_str(), levelChar(level),
               ts, ms, msg.c_str());
  std::fflush(stderr);
}

}  // namespace ddprun
