// Runs our TcpStore client through every Store method against a server given
// on the command line (PyTorch's own, in the interop tests). Exits non-zero,
// naming the failed check, on any mismatch.
//
//   store_probe HOST PORT [--expect-dialect v2|legacy] [--skip queues,listkeys]
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "ddprun/common/error.h"
#include "ddprun/store/tcp_store.h"

using ddprun::store::TcpStore;
using namespace std::chrono_literals;

namespace {
int failures = 0;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "store_probe: FAILED %s (line %d)\n", #cond, __LINE__); \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

template <typename E, typename F>
bool throws(F&& f) {
  try {
    f();
  } catch (const E&) {
    return true;
  }
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: store_probe HOST PORT [--expect-dialect v2|legacy] "
                         "[--skip queues,listkeys]\n");
    return 2;
  }
  std::string expect = "v2";
  std::set<std::string> skip;
  for (int i = 3; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--expect-dialect") expect = value;
    if (flag == "--skip") {
      std::stringstream ss(value);
      for (std::string s; std::getline(ss, s, ',');) skip.insert(s);
    }
  }
  ddprun::store::TcpStoreOptions o;
  o.host = argv[1];
  o.port = static_cast<uint16_t>(std::atoi(argv[2]));
  o.timeout = 20s;
  o.connectTimeout = 20s;
  try {
    auto s = TcpStore::connect(o);
    bool v2 = s->dialect() == ddprun::store::wire::Dialect::kV2;
    std::printf("store_probe: connected to %s, dialect %s\n", s->address().c_str(),
                ddprun::store::wire::dialectName(s->dialect()));
    EXPECT(v2 == (expect == "v2"));
    // Written by the PyTorch side before we started.
    EXPECT(s->get("from_torch") == std::string("\0torch", 6));
    std::string bin("\0\x01\xff", 3);
    s->set("bin", bin);
    EXPECT(s->get("bin") == bin);
    s->set("empty", "");
    EXPECT(s->get("empty").empty());
    EXPECT(s->add("counter", 7) == 7);
    EXPECT(s->add("counter", -10) == -3);
    EXPECT(s->add("counter", 0) == -3);
    EXPECT(s->get("counter") == "-3");
    EXPECT(s->compareSet("cas", "absent", "x") == "absent");
    EXPECT(!s->check({"cas"}));
    EXPECT(s->compareSet("cas", "", "first") == "first");
    EXPECT(s->compareSet("cas", "wrong", "second") == "first");
    EXPECT(s->compareSet("cas", "first", "second") == "second");
    EXPECT(s->check({"bin", "cas"}));
    EXPECT(throws<ddprun::TimeoutError>([&] { s->wait({"never_set"}, 300ms); }));
    s->set("after_timeout", "still usable");
    EXPECT(s->get("after_timeout") == "still usable");
    EXPECT(s->deleteKey("empty"));
    EXPECT(!s->deleteKey("empty"));
    int64_t n = s->numKeys();
    EXPECT(n >= 5);
    s->multiSet({"m1", "m2"}, {"one", "two"});
    EXPECT(s->multiGet({"m2", "m1"}) == (std::vector<std::string>{"two", "one"}));
    if (v2) {
      s->append("log", "ab");
      s->append("log", "c");
      EXPECT(s->get("log") == "abc");
      EXPECT(s->ping(12345) == 12345u);
      if (!skip.count("queues")) {
        s->queuePush("q", "x1");
        s->queuePush("q", "x2");
        EXPECT(s->queueLen("q") == 2);
        EXPECT(s->queuePop("q", 5s) == "x1");
        EXPECT(s->queuePop("q", 5s) == "x2");
      }
      if (!skip.count("listkeys")) {
        auto keys = s->listKeys();
        std::set<std::string> ks(keys.begin(), keys.end());
        EXPECT(ks.count("bin") && ks.count("counter") && ks.count("m1"));
      }
    } else {
      EXPECT(throws<ddprun::InvalidArgument>([&] { s->append("log", "x"); }));
    }
    s->set("from_ddprun", "hello from ddprun");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_probe: error: %s\n", e.what());
    return 1;
  }
  if (failures) return 1;
  std::printf("store_probe: all checks passed\n");
  return 0;
}
