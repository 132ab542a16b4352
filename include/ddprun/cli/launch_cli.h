// Command line of `ddprun`: every torchrun 2.x flag in both spellings
// (--nproc-per-node / --nproc_per_node), each falling back to PET_<NAME> from
// the environment as torchrun's do.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ddprun/agent/launch_config.h"

namespace ddprun::cli {

// Reads an environment variable (injectable for tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup processEnv();

// Parses argv into `out`. Returns -1 on success; otherwise the exit code to
// use (0 after --help/--version, 2 after a usage error, whose message names
// the flag and the accepted forms and has been written to stderr).
int parseLaunchCli(int argc, const char* const* argv, const EnvLookup& env,
                   agent::LaunchConfig& out);

// The whole `ddprun` program: parse, run the agent, return its exit code.
int runLaunchCli(int argc, const char* const* argv);

}  // namespace ddprun::cli
