// Which paths the trainer may replace, read or append to, and which
// leftovers of dead writers it removes at start.
#include "ddprun/train/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "temp_dir.h"

namespace ddprun::train {
namespace {

namespace fs = std::filesystem;
using ddprun::testing::TempDir;

void touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(FilesTest, OnlyRegularFilesOrNothingAreReplaced) {
  TempDir dir;
  touch(dir.file("f"));
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  fs::create_symlink(dir.file("f"), dir.file("link"));
  fs::create_directory(dir.file("d"));
  EXPECT_EQ(replaceTargetProblem(dir.file("f")), "");
  EXPECT_EQ(replaceTargetProblem(dir.file("absent")), "");
  EXPECT_NE(replaceTargetProblem(dir.file("fifo")).find("FIFO"), std::string::npos);
  EXPECT_NE(replaceTargetProblem(dir.file("link")).find("symbolic link"),
            std::string::npos);
  EXPECT_NE(replaceTargetProblem(dir.file("d")).find("directory"), std::string::npos);
  EXPECT_NE(replaceTargetProblem("/dev/null").find("character device"),
            std::string::npos);
  // Reading follows links but wants a regular file at the end.
  EXPECT_EQ(regularFileProblem(dir.file("link")), "");
  EXPECT_NE(regularFileProblem(dir.file("fifo")).find("FIFO"), std::string::npos);
  EXPECT_EQ(regularFileProblem(dir.file("absent")), "no such file");
  // Metrics may stream to a FIFO or a character device, never a directory.
  EXPECT_EQ(appendTargetProblem(dir.file("fifo")), "");
  EXPECT_EQ(appendTargetProblem("/dev/null"), "");
  EXPECT_EQ(appendTargetProblem(dir.file("new.jsonl")), "");
  EXPECT_NE(appendTargetProblem(dir.file("d")).find("directory"), std::string::npos);
  EXPECT_NE(appendTargetProblem(dir.file("missing/m.jsonl"))
                .find("directory that does not exist"),
            std::string::npos);
}

TEST(FilesTest, StaleTemporariesOfGoneWritersAreRemoved) {
  TempDir dir;
  // A pid above any pid_max names no process; ours counts as gone at start;
  // our parent is alive but runs another program.
  const std::string dead = "2147483646", self = std::to_string(::getpid()),
                    parent = std::to_string(::getppid());
  for (const std::string& n :
       {"ckpt-a.tmp." + dead, "ckpt-b.tmp." + self, "ckpt-c.tmp." + parent,
        "other.tmp." + dead, std::string("ckpt-d.tmp.x1"), std::string("ckpt-e")})
    touch(dir.file(n));
  fs::create_directory(dir.file("ckpt-dir.tmp." + dead));
  fs::create_symlink(dir.file("ckpt-e"), dir.file("ckpt-link.tmp." + dead));
  std::vector<std::string> removed = removeStaleTemporaries(
      dir.path(), [](const std::string& name) { return name.rfind("ckpt-", 0) == 0; });
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{"ckpt-a.tmp." + dead, "ckpt-b.tmp." + self,
                                               "ckpt-c.tmp." + parent}));
  for (const std::string& n :
       {"other.tmp." + dead, std::string("ckpt-d.tmp.x1"), std::string("ckpt-e"),
        "ckpt-dir.tmp." + dead, "ckpt-link.tmp." + dead})
    EXPECT_TRUE(fs::exists(fs::symlink_status(dir.file(n)))) << n;
  EXPECT_FALSE(writerMayBeAlive(2147483646));
  EXPECT_FALSE(writerMayBeAlive(::getpid()));
  EXPECT_TRUE(removeStaleTemporaries(dir.file("missing"), [](const std::string&) {
                return true;
              }).empty());
}

}  // namespace
}  // namespace ddprun::train
