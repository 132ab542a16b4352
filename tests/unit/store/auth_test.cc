// Where the store's shared secret comes from: auth::loadSecret and
// auth::secretFromEnv (temporary files, no sockets).
#include "ddprun/store/auth.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace ddprun::store {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddprun_auth_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    fs::remove_all(dir_);
    unsetenv(auth::kTokenEnv);
  }
  std::string file(const std::string& content, mode_t mode) {
    std::string path = dir_ + "/token";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    chmod(path.c_str(), mode);
    return path;
  }
  // The InvalidArgument message of `f`, or "" if it did not throw one.
  template <typename F>
  std::string errorOf(F&& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.message();
    }
    return "";
  }
  std::string dir_;
};

TEST_F(TokenFileTest, ReadsAPrivateFileWithoutItsTrailingNewline) {
  EXPECT_EQ(auth::loadSecret(file("s3cret value\n", 0600)), "s3cret value");
  EXPECT_EQ(auth::loadSecret(file("s3cret\r\n\n", 0400)), "s3cret");
}

TEST_F(TokenFileTest, RefusesAWorldReadableFileWithoutShowingTheSecret) {
  std::string path = file("hunter2-secret", 0644);
  std::string err = errorOf([&] { auth::loadSecret(path); });
  EXPECT_NE(err.find("mode 0644, open to every user"), std::string::npos) << err;
  EXPECT_NE(err.find("chmod 600"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_EQ(err.find("hunter2"), std::string::npos) << err;
}

// docs/rendezvous.md says "0600 or stricter": any group or other bit is refused.
TEST_F(TokenFileTest, RefusesAGroupReadableFileNamingTheModeAndTheFix) {
  for (mode_t mode : {0640, 0620, 0660, 0602}) {
    std::string path = file("hunter2-secret", mode);
    std::string err = errorOf([&] { auth::loadSecret(path); });
    char text[8];
    std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode));
    EXPECT_NE(err.find(std::string("mode ") + text), std::string::npos) << err;
    EXPECT_NE(err.find("0600 or stricter: chmod 600 '" + path + "'"), std::string::npos) << err;
    EXPECT_EQ(err.find("hunter2"), std::string::npos) << err;
  }
  EXPECT_NE(errorOf([&] { auth::loadSecret(file("x", 0640)); }).find("the file's group"),
            std::string::npos);
}

// A FIFO would block open(2) until a writer came (forever): refused at once.
TEST_F(TokenFileTest, RefusesAFifoWithoutWaitingForAWriter) {
  std::string fifo = dir_ + "/token.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string err = errorOf([&] { auth::loadSecret(fifo); });
  EXPECT_NE(err.find("is not a regular file (a FIFO)"), std::string::npos) << err;
  EXPECT_NE(err.find(fifo), std::string::npos) << err;
}

TEST_F(TokenFileTest, RefusesEmptyMissingAndOversizedFiles) {
  EXPECT_NE(errorOf([&] { auth::loadSecret(file("\n", 0600)); }).find("is empty"),
            std::string::npos);
  std::string missing = errorOf([&] { auth::loadSecret(dir_ + "/nope"); });
  EXPECT_NE(missing.find("cannot open"), std::string::npos) << missing;
  std::string big = file(std::string(auth::kMaxSecretBytes + 1, 'x'), 0600);
  EXPECT_NE(errorOf([&] { auth::loadSecret(big); }).find("more than"), std::string::npos);
  EXPECT_NE(errorOf([&] { auth::loadSecret(dir_); }), "");  // a directory
}

TEST_F(TokenFileTest, TheEnvironmentVariableIsTheAlternative) {
  unsetenv(auth::kTokenEnv);
  EXPECT_FALSE(auth::secretFromEnv().has_value());
  setenv(auth::kTokenEnv, "from-env\n", 1);
  EXPECT_EQ(auth::secretFromEnv().value_or(""), "from-env");
  setenv(auth::kTokenEnv, "", 1);
  std::string err = errorOf([] { auth::secretFromEnv(); });
  EXPECT_NE(err.find(auth::kTokenEnv), std::string::npos) << err;
}

}  // namespace
}  // namespace ddprun::store
