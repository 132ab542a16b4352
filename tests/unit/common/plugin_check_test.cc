// Plugins are checked before any of their code is called (common/plugin.h):
// tiny plugins built for the test (plugins/test_plugin.cc) with a data symbol
// as entry point, another build's id, no build id marker, a marker that is not
// a build id, a table of another build; and the
// search skipping directories with the plugin's name, world-writable or
// relative directories, world-writable files.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddprun/common/plugin.h"
#include "temp_dir.h"

namespace ddprun::plugin {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFile = "libddprun_test_plugin.so";
constexpr const char* kEntry = "ddprun_test_plugin";
// Another build's id (plugins/test_plugin.cc has the same).
constexpr const char* kOtherBuild = "0123456789abcdef0123456789abcdef";

struct Table {
  const char* buildId;
  int (*answer)();
};

std::string built(const std::string& variant) {
  return std::string(DDPRUN_TEST_PLUGIN_DIR) + "/libddprun_test_plugin_" + variant +
         ".so";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
bool anyContains(const std::vector<std::string>& v, const std::string& part) {
  for (const auto& s : v)
    if (contains(s, part)) return true;
  return false;
}

class PluginCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"good", "data_entry", "wrong_id", "no_marker", "table_id", "bad_marker"})
      ASSERT_TRUE(fs::is_regular_file(built(v))) << built(v) << " was not built";
    marker_ = tmp_.file("constructor-ran");
    ::setenv("DDPRUN_TEST_PLUGIN_MARKER", marker_.c_str(), 1);
  }
  void TearDown() override { ::unsetenv("DDPRUN_TEST_PLUGIN_MARKER"); }

  // A new directory under the test's own, mode `mode`.
  std::string dir(const std::string& name, fs::perms mode = fs::perms(0755)) {
    const std::string d = tmp_.file(name);
    fs::create_directories(d);
    fs::permissions(d, mode);
    return d;
  }
  // `variant` copied into `d` under the plugin's name.
  std::string install(const std::string& variant, const std::string& d) {
    const std::string to = d + "/" + kFile;
    fs::copy_file(built(variant), to, fs::copy_options::overwrite_existing);
    return to;
  }
  bool constructorRan() const { return fs::exists(marker_); }

  testing::TempDir tmp_;
  std::string marker_;
};

TEST_F(PluginCheck, AGoodPluginLoadsAndItsConstructorRuns) {
  // The control for the refusals below: this marker is what they must not leave.
  const std::string d = dir("good");
  const std::string path = install("good", d);
  const Opened o = openFrom({d}, kFile, kEntry);
  ASSERT_NE(o.symbol, nullptr) << o.error;
  EXPECT_EQ(o.path, fs::canonical(path).string());
  EXPECT_TRUE(o.warnings.empty());
  const Table* t = reinterpret_cast<const Table* (*)()>(o.symbol)();
  EXPECT_STREQ(t->buildId, buildId());
  EXPECT_EQ(t->answer(), 42);
  EXPECT_TRUE(constructorRan());
  const Inspection i = inspect(path, kEntry);
  EXPECT_TRUE(i.ok) << i.error;
  EXPECT_EQ(i.buildId, buildId());
}

TEST_F(PluginCheck, TheBuildIdIsThirtyTwoHexDigitsFromTheBuild) {
  const std::string id = buildId();
  ASSERT_EQ(id.size(), kBuildIdSize - 1) << id;
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  EXPECT_NE(id, kOtherBuild);
}

TEST_F(PluginCheck, ADataSymbolAsEntryPointIsRefusedNotCalled) {
  const std::string d = dir("data");
  install("data_entry", d);
  const Opened o = openFrom({d}, kFile, kEntry);  // calling it would be SIGSEGV
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_TRUE(
      contains(o.error, "exports ddprun_test_plugin as a data object, not as a function"))
      << o.error;
  EXPECT_FALSE(constructorRan()) << "refused only after dlopen ran its constructor";
}

TEST_F(PluginCheck, APluginOfAnotherBuildIsRefusedBeforeAnyOfItsCodeRuns) {
  const std::string d = dir("wrong");
  const std::string path = fs::canonical(install("wrong_id", d)).string();
  const Opened o = openFrom({d}, kFile, kEntry);
  EXPECT_EQ(o.symbol, nullptr);
  // Both ids named, and what to do.
  EXPECT_EQ(o.error, path + " is from another ddprun build (plugin build id " +
                         kOtherBuild + ", this program's is " + buildId() +
                         "): install the program and its plugins from the same build "
                         "(reinstall ddprun)");
  EXPECT_EQ(o.error, buildIdMismatch(path, kOtherBuild, buildId()));
  EXPECT_FALSE(constructorRan())
      << "the plugin's constructor ran before its build id was refused";
  // And the other way round: a program of that other build refuses this build's plugin.
  const std::string g = dir("good");
  const std::string good = fs::canonical(install("good", g)).string();
  const Opened other = openFrom({g}, kFile, kEntry, kOtherBuild);
  EXPECT_EQ(other.symbol, nullptr);
  EXPECT_EQ(other.error, buildIdMismatch(good, buildId(), kOtherBuild));
  EXPECT_FALSE(constructorRan());
}

TEST_F(PluginCheck, APluginWithoutBuildIdMarkerIsRefusedBeforeItRuns) {
  const std::string d = dir("nomarker");
  install("no_marker", d);
  const Opened o = openFrom({d}, kFile, kEntry);
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_TRUE(contains(o.error, "has no build id marker ddprun_test_plugin_build_id"))
      << o.error;
  EXPECT_FALSE(constructorRan());
}

TEST_F(PluginCheck, AMarkerThatIsNotABuildIdIsRefusedBeforeItRuns) {
  const std::string d = dir("badmarker");
  install("bad_marker", d);
  const Opened o = openFrom({d}, kFile, kEntry);
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_TRUE(contains(o.error, "ddprun_test_plugin_build_id is not a build id")) << o.error;
  EXPECT_FALSE(constructorRan());
}

TEST_F(PluginCheck, TheTablesOwnBuildIdIsCheckedTooThroughThePluginPath) {
  const std::string d = dir("table");
  const std::string path = fs::canonical(install("table_id", d)).string();
  ::setenv("DDPRUN_PLUGIN_PATH", d.c_str(), 1);
  const Loaded<Table> l = openTable<Table>(kFile, kEntry);
  ::unsetenv("DDPRUN_PLUGIN_PATH");
  EXPECT_EQ(l.table, nullptr);
  EXPECT_EQ(l.path, path);
  EXPECT_EQ(l.error, buildIdMismatch(path, kOtherBuild, buildId()));
}

TEST_F(PluginCheck, AFileThatIsNotElfIsRefusedWithItsName) {
  const std::string d = dir("text");
  std::ofstream(d + "/" + kFile) << "#!/bin/sh\necho not a plugin\n";
  const Opened o = openFrom({d}, kFile, kEntry);
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_TRUE(contains(o.error, d + "/" + std::string(kFile) + " is not an ELF file"))
      << o.error;
}

TEST_F(PluginCheck, ADirectoryWithThePluginsNameIsSkippedAndTheSearchGoesOn) {
  const std::string first = dir("first");
  fs::create_directory(first + "/" + kFile);
  const std::string second = dir("second");
  const std::string path = install("good", second);
  const Opened o = openFrom({first, second}, kFile, kEntry);
  ASSERT_NE(o.symbol, nullptr) << o.error;
  EXPECT_EQ(o.path, fs::canonical(path).string());
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_EQ(o.warnings[0],
            first + "/" + kFile + " is a directory, not a plugin file: skipped");
}

TEST_F(PluginCheck, AFifoWithThePluginsNameIsSkipped) {
  const std::string first = dir("fifo");
  ASSERT_EQ(::mkfifo((first + "/" + kFile).c_str(), 0644), 0);
  const Found f = find({first}, kFile);
  EXPECT_EQ(f.path, "");
  EXPECT_TRUE(notInstalled(f.error)) << f.error;
  EXPECT_TRUE(contains(f.error, first + "/" + kFile + " is a FIFO")) << f.error;
}

TEST_F(PluginCheck, AWorldWritableDirectoryIsSkippedWithAWarningNamingIt) {
  // With or without the sticky bit: in /tmp anyone may create the plugin's name.
  for (const auto mode : {fs::perms(0777), fs::perms(01777)}) {
    const std::string shared =
        dir("shared" + std::to_string(static_cast<int>(mode)), mode);
    install("good", shared);
    const std::string safe = dir("safe");
    const std::string path = install("good", safe);
    const Found f = find({shared, safe}, kFile);
    EXPECT_EQ(f.path, fs::canonical(path).string());
    ASSERT_EQ(f.warnings.size(), 1u);
    EXPECT_TRUE(contains(f.warnings[0],
                         "plugin directory " + shared + " is writable by every user"))
        << f.warnings[0];
    EXPECT_TRUE(contains(f.warnings[0], "chmod o-w " + shared)) << f.warnings[0];
    // Alone, it is not found at all, and the error says what was skipped.
    const Found alone = find({shared}, kFile);
    EXPECT_EQ(alone.path, "");
    EXPECT_TRUE(notInstalled(alone.error));
    EXPECT_TRUE(contains(alone.error, "skipped: plugin directory " + shared))
        << alone.error;
  }
  // Group-writable is fine (Debian's user-private groups, umask 002).
  const std::string group = dir("group", fs::perms(0775));
  install("good", group);
  EXPECT_NE(find({group}, kFile).path, "");
}

TEST_F(PluginCheck, AWorldWritableFileOrALinkIntoAWorldWritableDirectoryIsSkipped) {
  const std::string d = dir("wwfile");
  const std::string path = install("good", d);
  fs::permissions(path, fs::perms(0666));
  Found f = find({d}, kFile);
  EXPECT_EQ(f.path, "");
  EXPECT_TRUE(anyContains(f.warnings, "plugin " + path + " is writable by every user"))
      << f.error;
  const std::string shared = dir("target", fs::perms(0777));
  const std::string target = install("good", shared);
  const std::string linked = dir("linked");
  fs::create_symlink(target, linked + "/" + kFile);
  f = find({linked}, kFile);
  EXPECT_EQ(f.path, "");
  EXPECT_TRUE(
      anyContains(f.warnings, "links to " + target + ", and plugin directory " + shared))
      << f.error;
}

TEST_F(PluginCheck, ARelativeDirectoryIsSkippedEvenWhereItHasThePlugin) {
  const std::string cwd = fs::current_path().string();
  fs::current_path(tmp_.path());
  dir("rel");
  install("good", tmp_.file("rel"));
  ::setenv("DDPRUN_PLUGIN_PATH", "rel", 1);
  const Opened o = open(kFile, kEntry);
  ::unsetenv("DDPRUN_PLUGIN_PATH");
  fs::current_path(cwd);
  EXPECT_EQ(o.symbol, nullptr);
  EXPECT_TRUE(notInstalled(o.error)) << o.error;
  ASSERT_FALSE(o.warnings.empty());
  EXPECT_EQ(o.warnings[0],
            "plugin directory \"rel\" is relative (it would depend on the working "
            "directory): not "
            "searched; give DDPRUN_PLUGIN_PATH absolute directories");
  EXPECT_FALSE(constructorRan());
}

TEST_F(PluginCheck, InspectNamesWhatIsMissing) {
  const std::string d = dir("inspect");
  const std::string path = install("good", d);
  const Inspection none = inspect(path, "no_such_entry");
  EXPECT_FALSE(none.ok);
  EXPECT_TRUE(contains(none.error, "does not export the entry point no_such_entry"))
      << none.error;
  const Inspection dirIns = inspect(d, kEntry);
  EXPECT_FALSE(dirIns.ok);
  EXPECT_TRUE(contains(dirIns.error, "is a directory")) << dirIns.error;
  EXPECT_EQ(buildIdSymbol("x"), "x_build_id");
}

}  // namespace
}  // namespace ddprun::plugin
