// The parsers of single flag values (src/cli/launch_values.h); the command
// line as a whole is in launch_cli_test.cc.
#include "cli/launch_values.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "ddprun/common/error.h"

namespace ddprun::cli {
namespace {

TEST(LaunchValues, ValueParsersNameTheFlag) {
  int lo = 0, hi = 0;
  parseNnodes("2", lo, hi);
  EXPECT_EQ(lo, 2);
  EXPECT_EQ(hi, 2);
  EXPECT_THROW(parseNnodes("", lo, hi), InvalidArgument);
  EXPECT_THROW(parseStdSpec("", "--tee"), InvalidArgument);
  EXPECT_THROW(parseSignals(""), InvalidArgument);
  EXPECT_EQ(parseSignals("TERM, SIGUSR2"), (std::vector<int>{SIGTERM, SIGUSR2}));
  EXPECT_EQ(parseRdzvConf(" a = 1 ,b=2 "),
            (std::map<std::string, std::string>{{"a", "1"}, {"b", "2"}}));
  EXPECT_EQ(parseFilterList("x,,y,z"), (std::vector<std::string>{"x,y", "z"}));
}

// The message of the InvalidArgument `fn` throws, or "accepted".
template <typename Fn>
std::string rejection(Fn&& fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "accepted";
}

TEST(LaunchValues, NumbersAndAddressesNameTheFlag) {
  EXPECT_EQ(parseInteger("3", "--max-restarts", 0), 3);
  EXPECT_EQ(
      rejection([] { parseInteger("-1", "--node-rank", 0); }),
      "--node-rank: invalid value '-1': out of range; expected an integer >= 0 (at most "
      "2147483647)");
  EXPECT_DOUBLE_EQ(parseSeconds("0.5", "--monitor-interval"), 0.5);
  EXPECT_EQ(
      rejection([] { parseSeconds("0", "--monitor-interval"); }),
      "--monitor-interval: invalid value '0': out of range; expected a number of seconds "
      "> 0 (at most 31536000)");
  EXPECT_EQ(parseStatusAddr(" [::1] "), "::1");
  EXPECT_EQ(parseStatusAddr("0.0.0.0"), "0.0.0.0");
  EXPECT_EQ(rejection([] { parseStatusAddr("localhost"); }),
            "--status-addr: 'localhost' is not an IP address; give one such as 127.0.0.1 "
            "(the default), 0.0.0.0 or ::1");
}

// Issue 40: the integer and seconds flags read numbers as input::parseNumber
// does: NaN, infinities, values beyond 64 bits or the flag's range, junk.
TEST(LaunchValues, NumbersRefuseNanInfinitiesOverflowAndJunk) {
  for (const char* bad : {"nan", "inf", "-inf", "1e400", "18446744073709551616",
                          "2147483648", "-1", "5x", " 5", "", "1.5", "0x10"})
    EXPECT_TRUE(rejection([&] {
                  parseInteger(bad, "--max-restarts", 0);
                }).starts_with("--max-restarts: invalid value '"))
        << bad;
  EXPECT_EQ(parseInteger("2147483647", "--max-restarts", 0), 2147483647);
  for (const char* bad :
       {"nan", "inf", "-inf", "1e400", "31536001", "-0.5", "0", "1s", ""})
    EXPECT_TRUE(rejection([&] {
                  parseSeconds(bad, "--monitor-interval");
                }).starts_with("--monitor-interval: invalid value '"))
        << bad;
  EXPECT_EQ(
      rejection([] { parseSeconds("nan", "--monitor-interval"); }),
      "--monitor-interval: invalid value 'nan': not a finite number; expected a number "
      "of seconds > 0 (at most 31536000)");
}

// Issue 40: host names and paths with a control character exit 2, shown
// escaped; anything else passes as given.
TEST(LaunchValues, HostsAndPathsRefuseControlCharacters) {
  EXPECT_EQ(parseHost("node-3.cluster", "--master-addr"), "node-3.cluster");
  EXPECT_EQ(parsePath("/data/my logs", "--log-dir"), "/data/my logs");
  const std::string host = rejection([] { parseHost("evil\nhost", "--master-addr"); });
  EXPECT_TRUE(
      host.starts_with("--master-addr: 'evil\\x0ahost' holds a control character "
                       "(\\x0a); a host name has none"))
      << host;
  for (const char* bad : {"a\x1b[2Jb", "a\rb", "a\tb", "a\x7f", "\x01"}) {
    std::string m = rejection([&] { parsePath(bad, "--log-dir"); });
    EXPECT_TRUE(m.starts_with("--log-dir: '")) << m;
    EXPECT_NE(m.find("a path has none"), std::string::npos) << m;
    for (char ch : m)
      EXPECT_FALSE(static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) << m;
  }
}

TEST(LaunchValues, NprocSignalsAndStreams) {
  agent::NprocKind kind = agent::NprocKind::kCount;
  int count = 1;
  parseNprocPerNode("gpu", kind, count);
  EXPECT_EQ(kind, agent::NprocKind::kGpu);
  parseNprocPerNode("4", kind, count);
  EXPECT_EQ(kind, agent::NprocKind::kCount);
  EXPECT_EQ(count, 4);
  EXPECT_EQ(rejection([&] { parseNprocPerNode("0", kind, count); }),
            "--nproc-per-node: invalid value '0': expected a positive integer, 'cpu', 'gpu' "
            "or 'auto'");
  EXPECT_NE(rejection([] { parseSignals("SIGKILL"); }).find("cannot handle 'SIGKILL'"),
            std::string::npos);
  EXPECT_NE(rejection([] { parseSignals("SIGNOPE"); }).find("cannot handle 'SIGNOPE'"),
            std::string::npos);
  auto spec = parseStdSpec("0:1,2:3", "--redirects");
  EXPECT_EQ(spec.forRank(0), agent::Std::kOut);
  EXPECT_EQ(spec.forRank(1), agent::Std::kNone);
  EXPECT_EQ(spec.forRank(2), agent::Std::kAll);
  EXPECT_EQ(parseLocalRanksFilter("0, 2"), (std::set<int>{0, 2}));
}

}  // namespace
}  // namespace ddprun::cli
