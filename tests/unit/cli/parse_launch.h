// parseLaunchCli with an injected environment (no process variable is read)
// and its stdout/stderr captured; for the CLI's unit tests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ddprun/cli/launch_cli.h"

namespace ddprun::cli::test {

struct Parsed {
  int rc;
  agent::LaunchConfig cfg;
  std::string err;
  std::string out;
};

inline Parsed parse(std::vector<const char*> args,
                    std::map<std::string, std::string> env = {}) {
  args.insert(args.begin(), "ddprun");
  Parsed p;
  EnvLookup lookup = [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  p.rc = parseLaunchCli(static_cast<int>(args.size()), args.data(), lookup, p.cfg);
  p.err = ::testing::internal::GetCapturedStderr();
  p.out = ::testing::internal::GetCapturedStdout();
  return p;
}

}  // namespace ddprun::cli::test
