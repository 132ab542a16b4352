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

}  // namespace
}  // namespace ddprun::cli
