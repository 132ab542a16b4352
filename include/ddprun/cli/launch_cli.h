// Command line of `ddprun`: every torchrun 2.x flag in both spellings
// (--nproc-per-node / --nproc_per_node), each falling back to PET_<DEST> from
// the environment as torchrun's do, parsed with argparse's rules: `--flag=`
// is an empty value, `--` ends the flags, a repeated flag's last value wins,
// a unique prefix of a long flag names it (--nproc 2), the first word that
// is not a flag is the script and every word after it belongs to the script.
//
// One table, launchFlags(), is what the parser, --help, the shell completion
// scripts and the check of docs/cli.md are built from. Thread-safe (no state
// besides the constant table).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"

namespace ddprun::cli {

// One flag, as torchrun's argparse declares it.
struct FlagInfo {
  std::string dest;  // torchrun's name: "nproc_per_node"
  std::vector<std::string>
      names;                // every spelling: "--nproc-per-node", "--nproc_per_node"
  bool takesValue = true;   // false: a switch (argparse store_true)
  std::string metavar;      // the value's form in --help: "N|MIN:MAX"
  std::string defaultText;  // shown in --help and docs/cli.md; "" = none
  std::string envVar;       // PET_<DEST>; "" where torchrun reads none
  std::vector<std::string>
      choices;  // the only values accepted (argparse choices); empty = free
  std::string help;
};

// Every flag of `ddprun`, in --help order.
const std::vector<FlagInfo>& launchFlags();

// Reads an environment variable (injectable for tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup processEnv();

// Parses argv into `out` and runs agent::finalizeConfig on it. Returns -1 on
// success; otherwise the exit code to use (0 after --help, --version or
// --print-completion, whose output went to stdout; 2 after a usage error,
// whose message names the flag and the accepted forms and has been written
// to stderr as `ddprun: error: ...`).
int parseLaunchCli(int argc, const char* const* argv, const EnvLookup& env,
                   agent::LaunchConfig& out);

// The output of `ddprun --help`.
std::string launchHelp();

// A completion script for `shell` (bash, zsh or tcsh, as torchrun's
// --print-completion), made from launchFlags(). Throws InvalidArgument for
// another shell.
std::string completionScript(const std::string& shell);

// The whole `ddprun` program: parse, run the agent, return its exit code.
// Anything the agent throws ends it with `ddprun: error: <message>` and 3.
int runLaunchCli(int argc, const char* const* argv);

// `ddprun status [--json] [--timeout SECONDS] HOST:PORT` (argv[0] is
// "status"): prints an agent's /status as a table (or the raw JSON). Exit
// codes: 0 ok, 2 usage (bad HOST:PORT), 3 cannot connect or a bad answer.
int runStatusCli(int argc, const char* const* argv);

}  // namespace ddprun::cli
