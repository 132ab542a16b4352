// The values of `ddprun`'s flags: one parser per form of value (N|MIN:MAX,
// N|cpu|gpu|auto, 0-3|RANK:0-3,..., KEY=VALUE,..., signal names, filter
// lists, integers, seconds, an IP address), each turning the text of one
// flag (from the command line, its PET_ variable or a cluster manager) into
// the typed field of agent::LaunchConfig. Rules across flags are
// agent::finalizeConfig's.
//
// Internal to ddprun_cli (launch_cli.cc applies them). Each throws
// InvalidArgument whose message names the flag and the accepted forms; the
// CLI prints it and exits 2. Pure functions, thread-safe.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"

namespace ddprun::cli {

// --nnodes: N or MIN:MAX with 0 < MIN <= MAX.
void parseNnodes(const std::string& text, int& minNodes, int& maxNodes);
// --nproc-per-node: a positive count, or cpu, gpu, auto (resolved by the agent).
void parseNprocPerNode(const std::string& text, agent::NprocKind& kind, int& count);
// --redirects / --tee (`flag` names which in messages): 0-3 for every rank,
// or a per-local-rank map such as 0:1,1:3.
agent::StdSpec parseStdSpec(const std::string& text, const std::string& flag);
// --local-ranks-filter: comma-separated local ranks; empty: every rank.
std::set<int> parseLocalRanksFilter(const std::string& text);
// --rdzv-conf: KEY=VALUE pairs separated by commas, keys and values trimmed;
// the keys' meaning is checked by finalizeConfig.
std::map<std::string, std::string> parseRdzvConf(const std::string& text);
// --signals-to-handle: signal names with or without "SIG"; never SIGKILL or
// SIGSTOP.
std::vector<int> parseSignals(const std::string& text);
// Splits a comma list where ",," stands for a literal comma.
std::vector<std::string> parseFilterList(const std::string& text);
// An integer in [min, INT_MAX] (--node-rank, --max-restarts,
// --shutdown-timeout); `flag` is named in the message. Numbers are read as
// input::parseNumber reads them (no NaN, no overflow, no junk).
int parseInteger(const std::string& text, const char* flag, int min);
// A number of seconds > 0 and at most a year (--monitor-interval).
double parseSeconds(const std::string& text, const char* flag);
// A host name or address (--master-addr, --rdzv-endpoint, --local-addr), as
// given: refused when it holds a control character (the message shows it
// escaped). Resolving and the HOST:PORT form are checked later.
std::string parseHost(const std::string& text, const char* flag);
// A path (--log-dir), as given: refused when it holds a control character.
std::string parsePath(const std::string& text, const char* flag);
// --status-addr: an IP address, brackets around IPv6 removed; never a name.
std::string parseStatusAddr(const std::string& text);

}  // namespace ddprun::cli
