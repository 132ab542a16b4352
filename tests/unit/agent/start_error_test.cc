// Why a worker could not start, in words that name the resource (issue 40:
// out of descriptors was reported as "out of processes or memory?").
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ddprun/agent/launcher.h"

namespace ddprun::agent {
namespace {

TEST(StartErrorText, DescriptorsNameTheLimitAndHowToRaiseIt) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  const std::string limit =
      rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur);
  EXPECT_EQ(startErrorText(EMFILE), "out of file descriptors (RLIMIT_NOFILE " + limit +
                                        "); raise it with ulimit -n");
  const std::string system = startErrorText(ENFILE);
  EXPECT_NE(system.find("the system is out of file descriptors"), std::string::npos)
      << system;
  EXPECT_NE(system.find("fs.file-max"), std::string::npos) << system;
}

TEST(StartErrorText, ProcessesAndMemoryAreTheirOwnCauses) {
  const std::string procs = startErrorText(EAGAIN);
  EXPECT_NE(procs.find("out of processes (RLIMIT_NPROC "), std::string::npos) << procs;
  EXPECT_NE(procs.find("ulimit -u"), std::string::npos) << procs;
  EXPECT_EQ(startErrorText(ENOMEM), "out of memory");
  EXPECT_EQ(startErrorText(ENOEXEC), std::strerror(ENOEXEC));
  EXPECT_EQ(startErrorText(EMFILE).find("processes"), std::string::npos);
}

}  // namespace
}  // namespace ddprun::agent
