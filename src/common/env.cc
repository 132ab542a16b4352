#include "ddprun/common/env.h"

#include <cstdlib>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

extern char** environ;

namespace ddprun::env {

Map snapshot() {
  Map out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string_view::npos) out[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  return out;
}

std::optional<std::string> get(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) {
  auto v = get(name);
  if (!v || v->empty()) return fallback;
  int64_t out = 0;
  if (!str::parseInt(*v, out, min, max))
    DDPRUN_THROW(InvalidArgument, name, "='", str::escape(*v, 40), "' is not an integer between ",
                 min, " and ", max);
  return out;
}

std::chrono::milliseconds seconds(const std::string& name, std::chrono::milliseconds fallback,
                                  double maxSeconds) {
  auto v = get(name);
  if (!v || v->empty()) return fallback;
  double s = 0;
  if (!str::parseDouble(*v, s) || !(s > 0) || s > maxSeconds)
    DDPRUN_THROW(InvalidArgument, name, "='", str::escape(*v, 40),
                 "' is not a number of seconds greater than 0 and at most ", maxSeconds);
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(s * 1000.0)));
}

std::optional<uint16_t> port(const std::string& name) {
  auto v = get(name);
  if (!v) return std::nullopt;
  int64_t p = 0;
  if (!str::parseInt(*v, p, 0, 65535))
    DDPRUN_THROW(InvalidArgument, name, "='", str::escape(*v, 40),
                 "' is not a TCP port (an integer from 0 to 65535)");
  return static_cast<uint16_t>(p);
}

}  // namespace ddprun::env
