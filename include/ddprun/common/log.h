// Minimal thread-safe logging to stderr.
//
// Lines look like `[ddprun-store I 2026-11-22T09:30:01.123Z] message`. The
// level threshold and the program tag are process-wide; set them once at start
// (setLogLevel / setLogTag) before other threads log.
#pragma once

#include <string>

#include "ddprun/common/error.h"

namespace ddprun {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

void setLogLevel(LogLevel level);
LogLevel logLevel();
void setLogTag(const std::string& tag);
// Parses debug|info|warning|error|off (case-insensitive). Throws InvalidArgument.
LogLevel parseLogLevel(const std::string& name);
// Timestamped `[tag L time] msg` (servers, debug logs) or the console style
// of a command-line tool: `tag: warning: msg`, `tag: error: msg`, `tag: msg`.
enum class LogStyle { kTimestamped, kConsole };
void setLogStyle(LogStyle style);
// `labelled` false drops the level word in the console style (for the one
// line a tool prints by default, shown at warning level).
void logLine(LogLevel level, const std::string& msg, bool labelled = true);

}  // namespace ddprun

#define DDPRUN_LOG(level, ...)                                          \
  do {                                                                  \
    if (::ddprun::LogLevel::level >= ::ddprun::logLevel())              \
      ::ddprun::logLine(::ddprun::LogLevel::level,                      \
                        ::ddprun::detail::concat(__VA_ARGS__));         \
  } while (0)
#define DDPRUN_DEBUG(...) DDPRUN_LOG(kDebug, __VA_ARGS__)
#define DDPRUN_INFO(...) DDPRUN_LOG(kInfo, __VA_ARGS__)
#define DDPRUN_WARN(...) DDPRUN_LOG(kWarning, __VA_ARGS__)
#define DDPRUN_ERROR(...) DDPRUN_LOG(kError, __VA_ARGS__)
// A message shown by default (at warning level) without a "warning:" label.
#define DDPRUN_NOTICE(...)                                              \
  do {                                                                  \
    if (::ddprun::LogLevel::kWarning >= ::ddprun::logLevel())           \
      ::ddprun::logLine(::ddprun::LogLevel::kWarning,                   \
                        ::ddprun::detail::concat(__VA_ARGS__), false);  \
  } while (0)
