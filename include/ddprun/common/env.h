// Reading configuration from environment variables. Every parser names the
// variable and the accepted values in its error, so `DDPRUN_X=abc` never
// surfaces as "stoi". Thread-safe (reads only; nobody here calls setenv).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace ddprun::env {

using Map = std::map<std::string, std::string>;

// Every variable of this process (environ), as a map.
Map snapshot();

// The value, or nullopt when unset. An empty value is returned as "".
std::optional<std::string> get(const std::string& name);

// An integer in [min, max]; `fallback` when unset or empty. Throws
// InvalidArgument: "NAME='abc' is not an integer between MIN and MAX".
int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max);

// A duration in seconds (decimal, > 0, finite, at most `maxSeconds`);
// `fallback` when unset or empty. "inf", "nan", "-5" and "1e30" are errors
// naming the variable.
std::chrono::milliseconds seconds(const std::string& name, std::chrono::milliseconds fallback,
                                  double maxSeconds = 365.0 * 24 * 3600);

// A TCP port 0..65535 (MASTER_PORT=70000 is an error, not port 4464).
std::optional<uint16_t> port(const std::string& name);

}  // namespace ddprun::env
