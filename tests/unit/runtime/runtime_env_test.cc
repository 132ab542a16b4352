// The runtime's environment variables: bad values are errors naming the
// variable and the accepted values, before any socket is opened.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>

#include "ddprun/common/error.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {
namespace {

using Vars = std::map<std::string, std::string>;

// Sets variables for one test and restores the previous values after it.
class ScopedEnv {
 public:
  explicit ScopedEnv(const Vars& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, old] : saved_) {
      if (old)
        ::setenv(name.c_str(), old->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// The message of the InvalidArgument `fn` throws, or "no error".
template <typename Fn>
std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "no error";
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

TEST(RuntimeEnv, CollectiveTimeoutIsAFinitePositiveNumberOfSeconds) {
  {
    ScopedEnv env(Vars{{"DDPRUN_COLLECTIVE_TIMEOUT", "0.25"}});
    EXPECT_EQ(optionsFromEnv().timeout.count(), 250);
  }
  {
    ScopedEnv env(Vars{{"DDPRUN_COLLECTIVE_TIMEOUT", ""}});  // empty: the default
    EXPECT_EQ(optionsFromEnv().timeout, ProcessGroupOptions().timeout);
  }
  // inf once overflowed to a negative timeout.
  for (const char* bad : {"inf", "nan", "-1", "0", "1e30", "soon", "5s"}) {
    ScopedEnv env(Vars{{"DDPRUN_COLLECTIVE_TIMEOUT", bad}});
    std::string msg = errorOf([] { optionsFromEnv(); });
    EXPECT_TRUE(contains(msg, std::string("DDPRUN_COLLECTIVE_TIMEOUT='") + bad + "'"))
        << bad << ": " << msg;
  }
}

TEST(RuntimeEnv, SharedHeapSizeNamesItsLimitAndTheFix) {
  {
    ScopedEnv env(Vars{{"DDPRUN_SHM_HEAP_MB", "64"}});
    EXPECT_EQ(optionsFromEnv().sharedHeapBytes, size_t{64} << 20);
  }
  {
    ScopedEnv env(
        Vars{{"DDPRUN_SHM_HEAP_MB", "0"}});  // 0: allocShared uses private memory
    EXPECT_EQ(optionsFromEnv().sharedHeapBytes, 0u);
  }
  for (const char* bad : {"99999999", "-1", "lots"}) {
    ScopedEnv env(Vars{{"DDPRUN_SHM_HEAP_MB", bad}});
    std::string msg = errorOf([] { optionsFromEnv(); });
    EXPECT_TRUE(contains(msg, std::string("DDPRUN_SHM_HEAP_MB='") + bad + "'")) << msg;
    EXPECT_TRUE(contains(msg, "1048576")) << "names the limit: " << msg;
    EXPECT_TRUE(contains(msg, "unset it")) << "says how to fix it: " << msg;
  }
}

TEST(RuntimeEnv, TransportAndHostOverrides) {
  ScopedEnv env(Vars{{"DDPRUN_TRANSPORT", "tcp"},
                     {"DDPRUN_HOST_ID", "hostA"},
                     {"DDPRUN_SOCKET_ADDR", "10.0.0.7"}});
  auto o = optionsFromEnv();
  EXPECT_EQ(o.transport, Transport::kTcp);
  EXPECT_EQ(o.hostId, "hostA");
  EXPECT_EQ(o.socketAddr, "10.0.0.7");
  ScopedEnv bad(Vars{{"DDPRUN_TRANSPORT", "rdma"}});
  EXPECT_TRUE(contains(errorOf([] { optionsFromEnv(); }), "DDPRUN_TRANSPORT"));
}

// MASTER_PORT=70000 once became port 4464 (70000 mod 65536).
TEST(RuntimeEnv, LaunchVariablesAreCheckedBeforeConnecting) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "70000"}},
       "MASTER_PORT='70000'"},
      {{{"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", "-1"}},
       "MASTER_PORT='-1'"},
      {{{"WORLD_SIZE", "two"}}, "WORLD_SIZE='two'"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "x"}}, "RANK='x'"},
      {{{"WORLD_SIZE", "2"}, {"RANK", ""}}, "RANK is not set"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "2"}}, "RANK=2 is not below WORLD_SIZE=2"},
      {{{"WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", ""}},
       "MASTER_PORT is not set"},
  };
  for (const auto& [vars, needle] : cases) {
    ScopedEnv env(vars);
    std::string msg = errorOf([] { ProcessGroup::fromEnv(); });
    EXPECT_TRUE(contains(msg, needle)) << needle << ": " << msg;
  }
}

}  // namespace
}  // namespace ddprun::runtime
