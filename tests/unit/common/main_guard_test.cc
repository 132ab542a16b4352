// runGuarded: what escapes a program's main becomes one line and an exit
// code, never std::terminate.
#include "ddprun/common/main_guard.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <new>
#include <stdexcept>
#include <string>

#include "ddprun/common/error.h"

namespace ddprun {
namespace {

std::string stderrOf(int& rc, int (*body)()) {
  ::testing::internal::CaptureStderr();
  rc = runGuarded("prog", 7, body);
  return ::testing::internal::GetCapturedStderr();
}

TEST(MainGuard, TheBodysCodeWhenNothingEscapes) {
  int rc = -1;
  EXPECT_EQ(stderrOf(rc, [] { return 4; }), "");
  EXPECT_EQ(rc, 4);
}

TEST(MainGuard, AnyEscapingExceptionIsOneLineAndTheProgramsCode) {
  int rc = -1;
  EXPECT_EQ(stderrOf(rc, []() -> int { throw std::bad_alloc(); }),
            "prog: error: out of memory (std::bad_alloc)\n");
  EXPECT_EQ(rc, 7);
  EXPECT_EQ(stderrOf(rc, []() -> int { throw std::runtime_error("boom"); }),
            "prog: error: boom\n");
  EXPECT_EQ(stderrOf(rc, []() -> int { DDPRUN_THROW(IoError, "disk gone"); }),
            "prog: error: disk gone\n");  // the message, without file:line
  EXPECT_EQ(stderrOf(rc, []() -> int { throw 42; }), "prog: error: an unknown exception\n");
  EXPECT_EQ(rc, 7);
}

TEST(MainGuard, AVeryLongMessageIsCutToOneLine) {
  int rc = -1;
  std::string err =
      stderrOf(rc, []() -> int { throw std::runtime_error(std::string(5000, 'x')); });
  EXPECT_EQ(rc, 7);
  EXPECT_LE(err.size(), 1023u);
  EXPECT_EQ(err.back(), '\n');
  EXPECT_EQ(err.find('\n'), err.size() - 1);
}

// Issue 40: every program ignores SIGPIPE (runMain), so a closed pipe or
// socket is an EPIPE its writer handles, never the program's death.
TEST(MainGuard, RunMainIgnoresSigpipeBeforeTheBody) {
  struct sigaction before {
  }, now{};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &before), 0);
  ::signal(SIGPIPE, SIG_DFL);
  int rc = runMain("prog", 7, [&] {
    sigaction(SIGPIPE, nullptr, &now);
    return 3;
  });
  EXPECT_EQ(rc, 3);
  EXPECT_EQ(now.sa_handler, SIG_IGN) << "SIGPIPE not ignored while the program runs";
  ::signal(SIGPIPE, SIG_DFL);
  testing::internal::CaptureStderr();
  EXPECT_EQ(runMain("prog", 7, []() -> int { throw std::runtime_error("boom"); }), 7);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "prog: error: boom\n");
  sigaction(SIGPIPE, &before, nullptr);
}

}  // namespace
}  // namespace ddprun
