// Command line of `ddprun-store`: the store server on its own, for a
// rendezvous endpoint that outlives any node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/store/tcp_store_server.h"

namespace ddprun::cli {

// Documented exit codes of ddprun-store.
constexpr int kExitOk = 0;
constexpr int kExitInternal = 1;
constexpr int kExitUsage = 2;
constexpr int kExitListen = 3;

struct StoreCliConfig {
  store::TcpStoreServerOptions server;
  std::string logLevel = "info";
  // Where server.authToken came from (--token-file PATH or the environment
  // variable), for the startup line; empty when the store is open.
  std::string tokenSource;
};

// Parses "1048576", "64K", "8M", "1G" (binary units): a decimal > 0 as
// input::parseNumber reads it, never wrapped past 64 bits. Throws
// InvalidArgument naming `flag`, the text shown escaped.
uint64_t parseByteSize(const std::string& text, const std::string& flag);

// Parses argv. On --help/--version or a usage error it prints and returns
// the exit code to use; otherwise returns -1 and fills `out`. Every number is
// read by input::parseNumber (NaN, infinities, junk, values beyond the
// flag's range or 64 bits: exit 2), and --host and --token-file with a
// control character are refused (exit 2).
int parseStoreCli(int argc, const char* const* argv, StoreCliConfig& out);

// The whole program: parse, listen, serve until SIGINT/SIGTERM/SIGHUP.
int runStoreCli(int argc, const char* const* argv);

}  // namespace ddprun::cli
