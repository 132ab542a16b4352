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
void logLine(LogLevel level, const std::string& msg);

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
