// Where plugins are looked for (pure), and that a missing one is a reason,
// not a crash.
#include "ddprun/common/plugin.h"

#include <gtest/gtest.h>

namespace ddprun::plugin {
namespace {

TEST(PluginSearch, EnvironmentFirstThenBesideTheProgram) {
  const auto dirs = searchDirs("/venv/bin", "/a:/b::", {"python3.12", "python3.11"});
  const std::vector<std::string> want = {
      "/a",
      "/b",
      "/venv/bin/../lib/ddprun",
      "/venv/bin/../lib/python3.12/site-packages/ddprun/lib",
      "/venv/bin/../lib/python3.12/dist-packages/ddprun/lib",
      "/venv/bin/../lib/python3.11/site-packages/ddprun/lib",
      "/venv/bin/../lib/python3.11/dist-packages/ddprun/lib",
  };
  EXPECT_EQ(dirs, want);
}

TEST(PluginSearch, NoProgramDirectoryLeavesTheEnvironmentOnly) {
  EXPECT_EQ(searchDirs("", "/x", {"python3.11"}), std::vector<std::string>{"/x"});
  EXPECT_TRUE(searchDirs("", "", {}).empty());
}

TEST(PluginOpen, AMissingPluginSaysWhereItWasLookedFor) {
  const Opened o = open("libddprun_no_such_plugin.so", "entry");
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_EQ(o.path, "");
  EXPECT_NE(o.error.find("libddprun_no_such_plugin.so is not installed"), std::string::npos)
      << o.error;
  EXPECT_NE(o.error.find("/lib/ddprun"), std::string::npos) << o.error;
  EXPECT_TRUE(notInstalled(o.error));
  EXPECT_FALSE(notInstalled("libcudnn.so.9: cannot open shared object file"));
}

TEST(PluginOpen, AMissingPluginTableIsNullWithTheSameReason) {
  struct Table {
    const char* buildId;
  };
  const Loaded<Table> l = openTable<Table>("libddprun_no_such_plugin.so", "entry");
  EXPECT_EQ(l.table, nullptr);
  EXPECT_TRUE(notInstalled(l.error)) << l.error;
  EXPECT_EQ(buildIdMismatch("/x.so", "aa", "bb"),
            "/x.so is from another ddprun build (plugin build id aa, this program's is bb): "
            "install the program and its plugins from the same build (reinstall ddprun)");
  EXPECT_NE(buildIdMismatch("/x.so", "", "bb").find("(plugin build id none,"),
            std::string::npos);
  EXPECT_EQ(tableBuildId(nullptr), "");
  EXPECT_EQ(tableBuildId("0123456789abcdef0123456789abcdef and more"),
            "0123456789abcdef0123456789abcdef");
}

}  // namespace
}  // namespace ddprun::plugin
