#include "ddprun/agent/failure.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace ddprun::agent {
namespace {

std::string writeTemp(const std::string& text) {
  char path[] = "/tmp/ddprun_errfile_XXXXXX";
  int fd = mkstemp(path);
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(ErrorFile, ReadsNestedTorchrunFormat) {
  auto p = writeTemp(R"({"message": {"message": "ValueError: x", "extraInfo":
      {"py_callstack": "Traceback\n  line", "timestamp": "1700000000"}}})");
  WorkerFailure f;
  ASSERT_TRUE(readErrorFile(p, f));
  EXPECT_EQ(f.message, "ValueError: x");
  EXPECT_EQ(f.traceback, "Traceback\n  line");
  EXPECT_EQ(f.time, 1700000000);
  EXPECT_EQ(f.errorFile, p);
  std::remove(p.c_str());
}

TEST(ErrorFile, ReadsFlatFormatAndRejectsJunk) {
  auto p = writeTemp(R"({"message": "RuntimeError: y", "timestamp": 1700000001})");
  WorkerFailure f;
  ASSERT_TRUE(readErrorFile(p, f));
  EXPECT_EQ(f.message, "RuntimeError: y");
  EXPECT_EQ(f.time, 1700000001);
  std::remove(p.c_str());
  auto junk = writeTemp("not json {");
  WorkerFailure g;
  EXPECT_FALSE(readErrorFile(junk, g));
  EXPECT_FALSE(readErrorFile("/nonexistent/error.json", g));
  std::remove(junk.c_str());
}

TEST(FailureSummary, CulpritIsTheEarliestRealFailureNotAVictim) {
  WorkerFailure victim;
  victim.globalRank = 0;
  victim.localRank = 0;
  victim.exitCode = -15;
  victim.pid = 100;
  victim.time = 10;  // observed earlier than the culprit's timestamp, still a victim
  victim.victim = true;
  WorkerFailure culprit;
  culprit.globalRank = 3;
  culprit.localRank = 3;
  culprit.exitCode = 7;
  culprit.pid = 103;
  culprit.time = 20;
  culprit.stderrTail = {"boom"};
  std::string s = formatFailureSummary("train.py", "node1", {victim, culprit});
  auto root = s.substr(s.find("Root Cause (first observed failure):"));
  EXPECT_NE(root.find("rank      : 3 (local_rank: 3)"), std::string::npos) << s;
  EXPECT_NE(root.find("exitcode  : 7 (pid: 103)"), std::string::npos) << s;
  EXPECT_NE(root.find("boom"), std::string::npos) << s;
  auto others = s.substr(s.find("Failures:"), s.find("Root Cause") - s.find("Failures:"));
  EXPECT_NE(others.find("-15 (SIGTERM)"), std::string::npos) << s;
  EXPECT_NE(others.find("Signal 15 (SIGTERM) received by PID 100"), std::string::npos) << s;
  EXPECT_NE(s.find("train.py FAILED"), std::string::npos);
  EXPECT_NE(s.find("host      : node1"), std::string::npos);
  EXPECT_EQ(s.substr(0, 60), std::string(60, '='));
}

// A tail of a shared stdout+stderr channel holds stdout lines: it is
// called "output", never "stderr"; a tail of stderr alone keeps its name.
TEST(FailureSummary, TheTailIsNamedForWhatItHolds) {
  WorkerFailure f;
  f.exitCode = 1;
  f.stderrTail = {"a stdout line", "Traceback: boom"};
  f.tailHasStdout = true;
  std::string shared = formatFailureSummary("train.py", "node1", {f});
  EXPECT_NE(shared.find("  output (stdout and stderr, last 2 lines):\n    a stdout line\n"),
            std::string::npos)
      << shared;
  EXPECT_NE(shared.find("see the output tail below"), std::string::npos) << shared;
  EXPECT_EQ(shared.find("stderr (last"), std::string::npos) << shared;
  f.tailHasStdout = false;
  std::string apart = formatFailureSummary("train.py", "node1", {f});
  EXPECT_NE(apart.find("  stderr (last 2 lines):\n"), std::string::npos) << apart;
  EXPECT_NE(apart.find("see the stderr tail below"), std::string::npos) << apart;
}

TEST(FailureSummary, SingleFailureSaysNoOthers) {
  WorkerFailure f;
  f.exitCode = -11;
  std::string s = formatFailureSummary("prog", "h", {f});
  EXPECT_NE(s.find("<NO_OTHER_FAILURES>"), std::string::npos);
  EXPECT_NE(s.find("-11 (SIGSEGV)"), std::string::npos);
}

TEST(FailureSummary, TheInterpreterLineSitsUnderTheTitle) {
  WorkerFailure f;
  f.exitCode = 1;
  f.message = "E";  // short entry lines: the note is the widest
  const std::string note = "interpreter: /usr/bin/python3 (python3 on PATH)";
  std::string s = formatFailureSummary("x.py", "h", {f}, note);
  EXPECT_NE(s.find("x.py FAILED\n" + note + "\n---"), std::string::npos) << s;
  // The rules are as wide as the widest line (at most 60), the note included.
  EXPECT_EQ(s.substr(0, s.find('\n')), std::string(note.size(), '='));
  EXPECT_EQ(formatFailureSummary("x.py", "h", {f}).find("interpreter"), std::string::npos);
}

TEST(FailureSummary, RootErrorFileIsCopiedWithErrorCode) {
  auto src = writeTemp(R"({"message": {"message": "E", "extraInfo": {"timestamp": "5"}}})");
  WorkerFailure victim;
  victim.victim = true;
  victim.errorFile = "/nonexistent";
  WorkerFailure root;
  root.exitCode = 3;
  root.errorFile = src;
  EXPECT_EQ(rootCause({victim, root})->exitCode, 3);
  auto dest = writeTemp("");
  ASSERT_TRUE(copyRootErrorFile({victim, root}, dest));
  std::ifstream in(dest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"errorCode\":3"), std::string::npos) << text;
  EXPECT_NE(text.find("\"message\":\"E\""), std::string::npos) << text;
  EXPECT_FALSE(copyRootErrorFile({victim}, dest));  // a victim's missing file
  EXPECT_EQ(rootCause({}), nullptr);
  std::remove(src.c_str());
  std::remove(dest.c_str());
}

}  // namespace
}  // namespace ddprun::agent
