#include "ddprun/common/hash.h"

#include <gtest/gtest.h>

#include <string>

namespace ddprun {
namespace {

// The published FNV-1a 64 test vectors.
TEST(Fnv1a, MatchesThePublishedVectors) {
  static_assert(fnv1a("") == 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a("foobar"), 0x85944171f73967e8ull);
}

TEST(Fnv1a, HashesBytesNotCharsAndChainsThroughTheSeed) {
  // Bytes above 0x7f hash as unsigned (char may be signed).
  const std::string high("\xff\x80", 2);
  uint64_t h = kFnv1aOffset;
  for (unsigned char c : high) h = (h ^ c) * kFnv1aPrime;
  EXPECT_EQ(fnv1a(high), h);
  EXPECT_EQ(fnv1a("bar", fnv1a("foo")), fnv1a("foobar"));
  EXPECT_EQ(fnv1a(std::string_view("a\0b", 3)),
            fnv1a("b", fnv1a(std::string_view("a\0", 2))));
}

// The values the two callers produced before they shared this function
// (computed with their old code): the checkpoint directory's tag names files
// on disk (also pinned in checkpoint_test.cc), and the reducer's parameter
// hash, seeded with its own constant (1469598103934665603, not the offset
// basis), is compared across ranks.
TEST(Fnv1a, KeepsTheCallersEarlierResults) {
  EXPECT_EQ(fnv1a("my job/with spaces"), 0xe26f403345d83b84ull);
  uint64_t h = 1469598103934665603ull;
  h = fnv1a("conv.weight#150", h);
  EXPECT_EQ(h, 7084523919169315460ull);
  h = fnv1a("conv.bias#6", h);
  EXPECT_EQ(h, 13136017695621684008ull);
}

}  // namespace
}  // namespace ddprun
