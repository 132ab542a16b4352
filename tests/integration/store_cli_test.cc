// The ddprun-store binary as users run it: flags, exit codes, signals.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddprun/store/auth.h"
#include "ddprun/store/tcp_store.h"

namespace {

using namespace std::chrono_literals;
const std::string kStore = std::string(DDPRUN_BIN_DIR) + "/ddprun-store";

// A child process with stdout and stderr captured through pipes.
struct Child {
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string stdoutText, stderrText;

  explicit Child(std::vector<std::string> args) {
    int o[2], e[2];
    EXPECT_EQ(pipe2(o, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(e, O_CLOEXEC), 0);
    pid = fork();
    if (pid == 0) {
      dup2(o[1], 1);
      dup2(e[1], 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(o[1]);
    close(e[1]);
    out = o[0];
    err = e[0];
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    close(out);
    close(err);
  }
  // Reads stdout until `pattern` matches or the timeout passes.
  bool readUntil(const std::regex& pattern, std::smatch& m, std::chrono::milliseconds t) {
    auto end = std::chrono::steady_clock::now() + t;
    while (std::chrono::steady_clock::now() < end) {
      if (std::regex_search(stdoutText, m, pattern)) return true;
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        char buf[512];
        ssize_t n = read(out, buf, sizeof buf);
        if (n <= 0) break;
        stdoutText.append(buf, n);
      }
    }
    return std::regex_search(stdoutText, m, pattern);
  }
  // Waits for exit (killing after the timeout); returns the wait status.
  int wait(std::chrono::milliseconds t) {
    auto end = std::chrono::steady_clock::now() + t;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      usleep(10000);
    }
    pid = -1;
    char buf[4096];
    ssize_t n;
    while ((n = read(err, buf, sizeof buf)) > 0) stderrText.append(buf, n);
    while ((n = read(out, buf, sizeof buf)) > 0) stdoutText.append(buf, n);
    return status;
  }
};

uint16_t startAndGetPort(Child& c) {
  std::smatch m;
  EXPECT_TRUE(c.readUntil(std::regex("listening on .*:([0-9]+)\n"), m, 5s))
      << c.stdoutText;
  return static_cast<uint16_t>(std::stoi(m[1]));
}

TEST(StoreCliBinary, ServesAndStopsCleanlyOnSigtermAndSigint) {
  for (int sig : {SIGTERM, SIGINT}) {
    Child c({kStore, "--port", "0"});
    uint16_t port = startAndGetPort(c);
    ddprun::store::TcpStoreOptions o;
    o.port = port;
    auto s = ddprun::store::TcpStore::connect(o);
    s->set("k", "v");
    EXPECT_EQ(s->get("k"), "v");
    kill(c.pid, sig);
    int status = c.wait(5s);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_NE(c.stderrText.find("shutting down"), std::string::npos) << c.stderrText;
  }
}

// Issue 40: a store whose stderr reader has gone (a closed terminal, a log
// pipe whose reader died) lives on: SIGPIPE is ignored, a log line is an
// EPIPE. Before, the first warning killed it, and any client could provoke
// one: here an ADD on a value that is no number, which closes that client
// with a warning.
TEST(StoreCliBinary, AClosedStderrNeverStopsTheStore) {
  Child c({kStore, "--port", "0", "--log-level", "info"});
  ::close(c.err);  // the reader leaves: every later write to stderr is EPIPE
  c.err = -1;
  const uint16_t port = startAndGetPort(c);
  ddprun::store::TcpStoreOptions o;
  o.port = port;
  o.timeout = std::chrono::milliseconds(30000);
  {
    auto bad = ddprun::store::TcpStore::connect(o);
    bad->set("word", "not a number");
    EXPECT_THROW(bad->add("word", 1), ddprun::Error) << "ADD on a non-number was served";
  }
  // The warning has been written (the store's one io thread logs it before it
  // serves anyone else): the store still answers, and was not killed.
  auto s = ddprun::store::TcpStore::connect(o);
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
  EXPECT_EQ(s->add("n", 2), 2);
  ASSERT_EQ(waitpid(c.pid, nullptr, WNOHANG), 0) << "the store exited";
  kill(c.pid, SIGTERM);
  const int status = c.wait(10s);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Issue 40: every number is read one way (input::parseNumber): NaN,
// infinities, values beyond 64 bits or the flag's range, junk: exit 2, the
// flag named; so are a host name or a path with a control character, shown
// escaped (never the raw bytes on the terminal).
TEST(StoreCliBinary, BadNumbersAndControlCharactersExitTwoNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--idle-timeout", "nan"},
       "--idle-timeout: invalid value 'nan': not a finite number"},
      {{"--auth-timeout", "nan"},
       "--auth-timeout: invalid value 'nan': not a finite number"},
      {{"--auth-timeout", "-inf"}, "--auth-timeout: invalid value '-inf'"},
      {{"--idle-timeout", "1e400"},
       "--idle-timeout: invalid value '1e400': out of range"},
      {{"--max-connections", "18446744073709551616"},
       "--max-connections: invalid value '18446744073709551616': out of range"},
      {{"--max-keys-per-request", "99999999999999999999999"}, "--max-keys-per-request"},
      {{"--max-memory", "18446744073709551616"}, "--max-memory"},
      {{"--max-wait-keys", "-1"}, "--max-wait-keys: invalid value '-1': out of range"},
      {{"--busy-poll-us", "100us"},
       "--busy-poll-us: invalid value '100us': not a number"},
      {{"--host", "local\nhost"}, "--host: 'local\\x0ahost' holds a control character"},
      {{"--host", "evil\x1b[2Jhost"}, "--host: 'evil\\x1b[2Jhost'"},
      {{"--token-file", "/tmp/a\nb"},
       "--token-file: '/tmp/a\\x0ab' holds a control character"},
  };
  for (auto [args, expected] : cases) {
    args.insert(args.begin(), kStore);
    args.insert(args.end(), {"--port", "0"});  // were one accepted: no fixed port
    Child c(args);
    int status = c.wait(10s);
    ASSERT_TRUE(WIFEXITED(status)) << args[1];
    EXPECT_EQ(WEXITSTATUS(status), 2) << args[1] << " " << args[2];
    EXPECT_NE(c.stderrText.find(expected), std::string::npos) << c.stderrText;
    EXPECT_EQ(c.stderrText.find('\x1b'), std::string::npos) << "raw escape printed";
  }
}

TEST(StoreCliBinary, PortInUseExitsThreeNamingAddressAndHolder) {
  Child first({kStore, "--port", "0"});
  uint16_t port = startAndGetPort(first);
  Child second({kStore, "--port", std::to_string(port)});
  int status = second.wait(5s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_NE(second.stderrText.find(":" + std::to_string(port)), std::string::npos)
      << second.stderrText;
  EXPECT_NE(second.stderrText.find("pid " + std::to_string(first.pid)), std::string::npos)
      << second.stderrText;
  EXPECT_NE(second.stderrText.find("ddprun-store"), std::string::npos);
}

TEST(StoreCliBinary, InvalidFlagsExitTwoWithAHint) {
  const std::vector<std::vector<std::string>> bad = {
      {"--port", "70000"}, {"--nonsense"}, {"--max-value-bytes", "banana"}};
  for (auto args : bad) {
    args.insert(args.begin(), kStore);
    Child c(args);
    int status = c.wait(5s);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 2) << args[1];
    EXPECT_NE(c.stderrText.find("error"), std::string::npos) << c.stderrText;
    EXPECT_NE(c.stderrText.find("--help"), std::string::npos) << c.stderrText;
  }
}

TEST(StoreCliBinary, HelpListsTheLimits) {
  Child c({kStore, "--help"});
  int status = c.wait(5s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const char* flag : {"--host", "--port", "--max-key-bytes", "--max-value-bytes",
                           "--max-memory", "--max-connections"})
    EXPECT_NE(c.stdoutText.find(flag), std::string::npos) << flag;
}

TEST(StoreCliBinary, UnresolvableHostExitsThree) {
  Child c({kStore, "--host", "no-such-host.invalid", "--port", "0"});
  int status = c.wait(10s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_NE(c.stderrText.find("no-such-host.invalid"), std::string::npos) << c.stderrText;
}

// A temporary directory holding one token file, removed at the end.
struct TokenDir {
  std::string dir;
  TokenDir() {
    char tmpl[] = "/tmp/ddprun_store_token_XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  ~TokenDir() { std::filesystem::remove_all(dir); }
  std::string file(const std::string& content, mode_t mode) {
    std::string path = dir + "/token";
    std::ofstream(path, std::ios::trunc) << content;
    chmod(path.c_str(), mode);
    return path;
  }
};

const std::string kSecret = "s3cret-for-the-store-test";

ddprun::store::TcpStoreOptions clientOf(uint16_t port, std::string token) {
  ddprun::store::TcpStoreOptions o;
  o.port = port;
  o.timeout = std::chrono::milliseconds(30000);
  o.connectTimeout = std::chrono::milliseconds(30000);
  o.authToken = std::move(token);
  return o;
}

TEST(StoreCliBinary, TokenFileAdmitsOnlyClientsWithTheSecret) {
  TokenDir t;
  Child c({kStore, "--port", "0", "--token-file", t.file(kSecret + "\n", 0600)});
  uint16_t port = startAndGetPort(c);
  for (auto dialect :
       {ddprun::store::ClientDialect::kV2, ddprun::store::ClientDialect::kLegacy}) {
    auto o = clientOf(port, kSecret);
    o.dialect = dialect;
    auto s = ddprun::store::TcpStore::connect(o);
    EXPECT_TRUE(s->authenticated());
    s->set("k", "v");
    EXPECT_EQ(s->get("k"), "v");
  }
  try {
    ddprun::store::TcpStore::connect(clientOf(port, "not the secret"));
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const ddprun::store::auth::AuthError& e) {
    EXPECT_NE(e.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("same secret"), std::string::npos) << e.message();
  }
  // No token: the handshake is allowed, the first request closes it, and
  // the client is told that the store requires a token.
  auto anonymous = ddprun::store::TcpStore::connect(clientOf(port, ""));
  EXPECT_FALSE(anonymous->authenticated());
  try {
    anonymous->set("k", "overwritten");  // no reply: the refusal shows next
    anonymous->get("k");
    ADD_FAILURE() << "a client without a token was served";
  } catch (const ddprun::store::auth::AuthError& e) {
    EXPECT_NE(e.message().find("requires a token"), std::string::npos) << e.message();
  }
  auto owner = ddprun::store::TcpStore::connect(clientOf(port, kSecret));
  EXPECT_EQ(owner->get("k"), "v");
  kill(c.pid, SIGTERM);
  EXPECT_EQ(WEXITSTATUS(c.wait(10s)), 0);
  EXPECT_NE(c.stderrText.find("unauthenticated client"), std::string::npos)
      << c.stderrText;
  EXPECT_NE(c.stderrText.find("--token-file"), std::string::npos) << c.stderrText;
  EXPECT_EQ(c.stderrText.find(kSecret), std::string::npos) << "the secret was logged";
}

TEST(StoreCliBinary, TokenFromTheEnvironment) {
  setenv(ddprun::store::auth::kTokenEnv, kSecret.c_str(), 1);
  Child c({kStore, "--port", "0"});
  unsetenv(ddprun::store::auth::kTokenEnv);
  uint16_t port = startAndGetPort(c);
  auto s = ddprun::store::TcpStore::connect(clientOf(port, kSecret));
  EXPECT_TRUE(s->authenticated());
  EXPECT_THROW(ddprun::store::TcpStore::connect(clientOf(port, "wrong")),
               ddprun::store::auth::AuthError);
}

// A token must not allow a downgrade to a store that cannot prove it knows
// the secret: refused, unless the client opts in (allowOpenServer, which the
// agent sets from $DDPRUN_RDZV_ALLOW_OPEN_STORE=1).
TEST(StoreCliBinary, ATokenClientRefusesAnOpenStoreUnlessAllowed) {
  Child c({kStore, "--port", "0"});
  const uint16_t port = startAndGetPort(c);
  try {
    ddprun::store::TcpStore::connect(clientOf(port, kSecret));
    ADD_FAILURE() << "a token client used an open store";
  } catch (const ddprun::store::auth::AuthError& e) {
    EXPECT_NE(e.message().find("requires no token"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(ddprun::store::auth::kAllowOpenEnv), std::string::npos)
        << e.message();
  }
  auto o = clientOf(port, kSecret);
  o.allowOpenServer = true;
  auto s = ddprun::store::TcpStore::connect(o);
  EXPECT_FALSE(s->authenticated());
  s->set("k", "v");
  EXPECT_EQ(s->get("k"), "v");
}

TEST(StoreCliBinary, UnsafeOrEmptyTokenFilesExitTwo) {
  TokenDir t;
  std::string secret = "world-readable-secret";
  for (auto [content, mode, expected] :
       {std::tuple<std::string, mode_t, std::string>{secret, 0644, "chmod 600"},
        {"\n", 0600, "is empty"},
        {secret, 0600, "cannot open"}}) {
    std::string path = t.file(content, mode);
    if (expected == "cannot open") path += ".missing";
    Child c({kStore, "--port", "0", "--token-file", path});
    int status = c.wait(10s);
    ASSERT_TRUE(WIFEXITED(status)) << expected;
    EXPECT_EQ(WEXITSTATUS(status), 2) << expected;
    EXPECT_NE(c.stderrText.find(expected), std::string::npos) << c.stderrText;
    EXPECT_EQ(c.stderrText.find(secret), std::string::npos) << c.stderrText;
  }
}

}  // namespace
