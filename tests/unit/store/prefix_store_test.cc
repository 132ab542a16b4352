#include "ddprun/store/prefix_store.h"

#include <gtest/gtest.h>

#include <map>

#include "ddprun/common/error.h"

namespace ddprun::store {
namespace {

// In-memory store recording the keys it sees.
class MapStore : public Store {
 public:
  void set(const std::string& k, std::string_view v) override { kv[k] = std::string(v); }
  std::string get(const std::string& k) override {
    if (!kv.count(k)) DDPRUN_THROW(TimeoutError, "missing ", k);
    return kv[k];
  }
  int64_t add(const std::string& k, int64_t d) override {
    int64_t v = kv.count(k) ? std::stoll(kv[k]) + d : d;
    kv[k] = std::to_string(v);
    return v;
  }
  std::string compareSet(const std::string& k, std::string_view e,
                         std::string_view d) override {
    if (kv.count(k) && kv[k] == e) kv[k] = std::string(d);
    return kv.count(k) ? kv[k] : std::string(e);
  }
  bool check(const std::vector<std::string>& keys) override {
    for (auto& k : keys)
      if (!kv.count(k)) return false;
    return true;
  }
  void wait(const std::vector<std::string>& keys, Millis) override { lastWait = keys; }
  bool deleteKey(const std::string& k) override { return kv.erase(k) > 0; }
  int64_t numKeys() override { return static_cast<int64_t>(kv.size()); }
  void append(const std::string& k, std::string_view v) override { kv[k] += v; }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    std::vector<std::string> out;
    for (auto& k : keys) out.push_back(get(k));
    return out;
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
  }
  std::map<std::string, std::string> kv;
  std::vector<std::string> lastWait;
};

TEST(PrefixStore, JoinsWithSlashLikePyTorch) {
  auto base = std::make_shared<MapStore>();
  PrefixStore p("/worker/attempt_0", base);
  p.set("x", "1");
  EXPECT_EQ(base->kv.count("/worker/attempt_0/x"), 1u);
  EXPECT_EQ(p.get("x"), "1");
  EXPECT_EQ(p.add("n", 3), 3);
  EXPECT_EQ(base->kv["/worker/attempt_0/n"], "3");
}

TEST(PrefixStore, NestedPrefixesComposeAndTrailingSlashDoubles) {
  auto base = std::make_shared<MapStore>();
  auto outer = std::make_shared<PrefixStore>("default_pg", base);
  PrefixStore inner("0/", outer);
  inner.set("k", "v");
  EXPECT_EQ(base->kv.count("default_pg/0//k"), 1u);
}

TEST(PrefixStore, ListOperationsArePrefixed) {
  auto base = std::make_shared<MapStore>();
  PrefixStore p("p", base);
  p.multiSet({"a", "b"}, {"1", "2"});
  EXPECT_EQ(p.multiGet({"b", "a"}), (std::vector<std::string>{"2", "1"}));
  EXPECT_TRUE(p.check({"a", "b"}));
  EXPECT_FALSE(p.check({"a", "c"}));
  p.wait({"a", "b"});
  EXPECT_EQ(base->lastWait, (std::vector<std::string>{"p/a", "p/b"}));
  EXPECT_EQ(p.compareSet("a", "1", "9"), "9");
  EXPECT_TRUE(p.deleteKey("a"));
  EXPECT_FALSE(p.deleteKey("a"));
  p.append("b", "3");
  EXPECT_EQ(base->kv["p/b"], "23");
  base->kv["unprefixed"] = "x";
  EXPECT_EQ(p.numKeys(), 2);  // counts the whole store, as PyTorch does
}

}  // namespace
}  // namespace ddprun::store
