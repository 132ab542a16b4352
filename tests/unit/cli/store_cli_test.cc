#include "ddprun/cli/store_cli.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "ddprun/common/error.h"
#include "ddprun/store/auth.h"

namespace ddprun::cli {
namespace {

int parse(std::vector<const char*> args, StoreCliConfig& cfg) {
  args.insert(args.begin(), "ddprun-store");
  return parseStoreCli(static_cast<int>(args.size()), args.data(), cfg);
}

TEST(StoreCli, ParsesByteSizes) {
  EXPECT_EQ(parseByteSize("1024", "--x"), 1024u);
  EXPECT_EQ(parseByteSize("64K", "--x"), 64u << 10);
  EXPECT_EQ(parseByteSize("8M", "--x"), 8u << 20);
  EXPECT_EQ(parseByteSize("2G", "--x"), 2ull << 30);
  EXPECT_THROW(parseByteSize("", "--x"), InvalidArgument);
  EXPECT_THROW(parseByteSize("0", "--x"), InvalidArgument);
  EXPECT_THROW(parseByteSize("-5", "--x"), InvalidArgument);
  EXPECT_THROW(parseByteSize("12X", "--x"), InvalidArgument);
  EXPECT_THROW(parseByteSize("lots", "--x"), InvalidArgument);
  // Overflow is refused, not wrapped (17179869184G is 2^64 bytes).
  EXPECT_THROW(parseByteSize("17179869184G", "--x"), InvalidArgument);
  EXPECT_THROW(parseByteSize("99999999999999999999", "--x"), InvalidArgument);
  EXPECT_EQ(parseByteSize("17179869183G", "--x"), 17179869183ull << 30);
  // Issue 40: read as input::parseNumber reads numbers; the value escaped.
  for (const char* bad :
       {"18446744073709551616", " 5", "5 ", "-1", "nan", "inf", "1e3", "0x10", "1.5K"})
    EXPECT_THROW(parseByteSize(bad, "--x"), InvalidArgument) << bad;
  try {
    parseByteSize("-1", "--max-memory");
    ADD_FAILURE() << "-1 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(
        e.message(),
        "--max-memory: invalid size '-1': out of range; expected a number of bytes > 0, "
        "optionally with K, M or G");
  }
}

// Issue 40: every number of ddprun-store is read by input::parseNumber
// (CLI11 alone took nan for --idle-timeout/--auth-timeout, an undefined
// float->int cast, and saturated numbers beyond 64 bits), and a host name or
// token path with a control character is refused; all exit 2 naming the flag.
TEST(StoreCli, NumbersBeyondTheirRangeAndControlCharactersExitTwo) {
  const std::vector<const char*> numeric = {
      "--idle-timeout",         "--auth-timeout",      "--max-connections",
      "--max-keys-per-request", "--max-wait-keys",     "--max-watch-keys",
      "--busy-poll-us",         "--max-memory",        "--max-key-bytes",
      "--max-value-bytes",      "--max-request-bytes", "--max-unsent-bytes",
      "--max-reply-bytes"};
  const std::vector<const char*> values = {
      "nan", "inf", "-inf", "1e400", "18446744073709551616",
      "-5",  "5x",  "",     " 5",    "99999999999999999999"};
  for (const char* flag : numeric)
    for (const char* value : values) {
      StoreCliConfig cfg;
      testing::internal::CaptureStderr();
      int rc = parse({flag, value}, cfg);
      std::string err = testing::internal::GetCapturedStderr();
      EXPECT_EQ(rc, kExitUsage) << flag << " '" << value << "'";
      EXPECT_NE(err.find(flag), std::string::npos) << err;
    }
  for (auto [flag, value, shown] :
       std::vector<std::tuple<const char*, const char*, const char*>>{
           {"--host", "evil\nhost", "'evil\\x0ahost'"},
           {"--host", "\x1b[31mred", "'\\x1b[31mred'"},
           {"--token-file", "/tmp/a\tb", "'/tmp/a\\x09b'"}}) {
    StoreCliConfig cfg;
    testing::internal::CaptureStderr();
    int rc = parse({flag, value}, cfg);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, kExitUsage) << flag;
    EXPECT_NE(err.find(std::string(flag) + ": " + shown + " holds a control character"),
              std::string::npos)
        << err;
    EXPECT_EQ(err.find('\x1b'), std::string::npos) << "printed raw: " << err;
  }
}

TEST(StoreCli, TimeoutsAboveZeroNeverRoundToOff) {
  StoreCliConfig cfg;
  EXPECT_EQ(parse({"--idle-timeout", "0.0001", "--auth-timeout", "0.001"}, cfg), -1);
  EXPECT_EQ(cfg.server.idleTimeout.count(), 1);  // not 0, which means never
  EXPECT_EQ(cfg.server.authTimeout.count(), 1);
  StoreCliConfig defaults;
  EXPECT_EQ(parse({}, defaults), -1);
  EXPECT_EQ(defaults.server.authTimeout.count(), 30000);
  EXPECT_EQ(defaults.server.idleTimeout.count(), 0);
  StoreCliConfig max;
  EXPECT_EQ(
      parse({"--max-connections", "18446744073709551615", "--busy-poll-us", "1000000"},
            max),
      -1);
  EXPECT_EQ(max.server.limits.maxConnections, SIZE_MAX);
}

TEST(StoreCli, DefaultsAndFlags) {
  StoreCliConfig cfg;
  EXPECT_EQ(parse({}, cfg), -1);
  EXPECT_EQ(cfg.server.port, 29500);
  EXPECT_EQ(cfg.server.host, "");
  StoreCliConfig cfg2;
  EXPECT_EQ(parse({"--host", "127.0.0.1", "--port", "0", "--max-value-bytes", "8M",
                   "--max-key-bytes", "8K", "--max-connections", "10", "--max-memory",
                   "1G", "--max-keys-per-request", "99", "--log-level", "debug", "--busy-poll-us", "0"},
                  cfg2),
            -1);
  EXPECT_EQ(cfg2.server.host, "127.0.0.1");
  EXPECT_EQ(cfg2.server.port, 0);
  EXPECT_EQ(cfg2.server.limits.wire.maxValueBytes, 8u << 20);
  EXPECT_EQ(cfg2.server.limits.wire.maxKeyBytes, 8u << 10);
  EXPECT_EQ(cfg2.server.limits.maxConnections, 10u);
  EXPECT_EQ(cfg2.server.limits.maxMemoryBytes, 1ull << 30);
  EXPECT_EQ(cfg2.server.limits.wire.maxKeysPerRequest, 99u);
  EXPECT_EQ(cfg2.logLevel, "debug");
  EXPECT_EQ(cfg2.server.busyPoll.count(), 0);
  EXPECT_EQ(cfg.server.busyPoll.count(), 100);
  EXPECT_EQ(cfg.server.idleTimeout.count(), 0);  // off by default
}

TEST(StoreCli, ClientCapFlags) {
  StoreCliConfig cfg;
  EXPECT_EQ(
      parse({"--max-unsent-bytes", "1M", "--max-reply-bytes", "16M", "--max-wait-keys",
             "7", "--max-watch-keys", "3", "--idle-timeout", "2.5"},
            cfg),
      -1);
  EXPECT_EQ(cfg.server.limits.maxUnsentBytes, 1u << 20);
  EXPECT_EQ(cfg.server.limits.maxReplyBytes, 16u << 20);
  EXPECT_EQ(cfg.server.limits.maxWaitKeys, 7u);
  EXPECT_EQ(cfg.server.limits.maxWatchKeys, 3u);
  EXPECT_EQ(cfg.server.idleTimeout.count(), 2500);
}

TEST(StoreCli, UsageErrorsExitTwo) {
  const std::vector<std::vector<const char*>> bad = {
      {"--port", "99999"},
      {"--port", "abc"},
      {"--bogus"},
      {"--max-value-bytes", "0"},
      {"--max-memory", "1T"},
      {"--max-connections", "0"},
      {"--log-level", "chatty"},
      {"--max-keys-per-request", "-3"},
      {"stray-positional"},
      {"--busy-poll-us", "-1"},
      {"--max-memory", "17179869184G"},
      {"--max-reply-bytes", "0"},
      {"--max-unsent-bytes", "x"},
      {"--idle-timeout", "-1"},
      {"--max-wait-keys", "0"},
      {"--max-watch-keys", "0"},
  };
  for (const auto& args : bad) {
    StoreCliConfig cfg;
    testing::internal::CaptureStderr();
    int rc = parse(args, cfg);
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, kExitUsage) << args[0];
    EXPECT_NE(err.find("--help"), std::string::npos) << err;
  }
}

TEST(StoreCli, TokenFileThenEnvironmentThenOpen) {
  char tmpl[] = "/tmp/ddprun_store_cli_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/token";
  std::ofstream(path) << "from-file\n";
  chmod(path.c_str(), 0600);
  setenv(store::auth::kTokenEnv, "from-env", 1);
  StoreCliConfig withFile, withEnv, open;
  EXPECT_EQ(parse({"--token-file", path.c_str()}, withFile), -1);
  EXPECT_EQ(withFile.server.authToken, "from-file");
  EXPECT_EQ(withFile.tokenSource, "--token-file " + path);
  EXPECT_EQ(parse({}, withEnv), -1);
  EXPECT_EQ(withEnv.server.authToken, "from-env");
  unsetenv(store::auth::kTokenEnv);
  EXPECT_EQ(parse({}, open), -1);
  EXPECT_EQ(open.server.authToken, "");
  chmod(path.c_str(), 0644);
  StoreCliConfig unsafe;
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"--token-file", path.c_str()}, unsafe), kExitUsage);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  EXPECT_EQ(err.find("from-file"), std::string::npos) << err;
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace ddprun::cli
