// Slurm host-list expansion against the forms Slurm documents and emits.
#include "ddprun/cluster/hostlist.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"

namespace ddprun::cluster {
namespace {

using V = std::vector<std::string>;

std::string errorOf(const std::string& list) {
  try {
    expandHostList(list);
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(HostList, PlainNamesKeepTheirOrder) {
  EXPECT_EQ(expandHostList("n1"), V({"n1"}));
  EXPECT_EQ(expandHostList("c,b,a"), V({"c", "b", "a"}));
  EXPECT_EQ(expandHostList("node-1.cluster.example"), V({"node-1.cluster.example"}));
}

TEST(HostList, TheIssueExample) {
  EXPECT_EQ(expandHostList("gpu[01-03,7],cpu5"), V({"gpu01", "gpu02", "gpu03", "gpu7", "cpu5"}));
}

TEST(HostList, ZeroPaddingFollowsTheLowerBound) {
  EXPECT_EQ(expandHostList("n[08-11]"), V({"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expandHostList("n[8-11]"), V({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expandHostList("n[0098-0100]"), V({"n0098", "n0099", "n0100"}));
  EXPECT_EQ(expandHostList("n[009-10]"), V({"n009", "n010"}));
  EXPECT_EQ(expandHostList("n[0]"), V({"n0"}));
}

TEST(HostList, SingleNumbersAndRangesMixInOneBracket) {
  EXPECT_EQ(expandHostList("gnode[10,20]"), V({"gnode10", "gnode20"}));
  EXPECT_EQ(expandHostList("a[1,3-4,9]"), V({"a1", "a3", "a4", "a9"}));
  EXPECT_EQ(expandHostList("a[5]"), V({"a5"}));
}

TEST(HostList, TextAfterABracket) {
  EXPECT_EQ(expandHostList("n[1-2]-ib"), V({"n1-ib", "n2-ib"}));
  EXPECT_EQ(expandHostList("[1-2]x"), V({"1x", "2x"}));
}

TEST(HostList, SeveralBracketsMakeEveryCombinationFirstSlowest) {
  EXPECT_EQ(expandHostList("r[1-2]n[01-02]"), V({"r1n01", "r1n02", "r2n01", "r2n02"}));
  EXPECT_EQ(expandHostList("r[1,3]-n[7]"), V({"r1-n7", "r3-n7"}));
}

TEST(HostList, SeveralEntriesWithCommasInsideAndOutsideBrackets) {
  EXPECT_EQ(expandHostList("a[1-2,4],b[09-10],c"),
            V({"a1", "a2", "a4", "b09", "b10", "c"}));
  // Slurm skips empty entries; surrounding spaces are not part of a name.
  EXPECT_EQ(expandHostList("a1,,a2, a3 "), V({"a1", "a2", "a3"}));
}

TEST(HostList, MalformedListsNameWhatIsWrong) {
  EXPECT_NE(errorOf("n[1-3").find("'[' without ']'"), std::string::npos);
  EXPECT_NE(errorOf("n1-3]").find("']' without '['"), std::string::npos);
  EXPECT_NE(errorOf("n[1-[2]]").find("brackets inside brackets"), std::string::npos);
  EXPECT_NE(errorOf("n[]").find("empty brackets"), std::string::npos);
  EXPECT_NE(errorOf("n[1,,2]").find("empty range"), std::string::npos);
  EXPECT_NE(errorOf("n[a-b]").find("is not a number"), std::string::npos);
  EXPECT_NE(errorOf("n[1-]").find("is not a number"), std::string::npos);
  EXPECT_NE(errorOf("n[-1]").find("is not a number"), std::string::npos);
  EXPECT_NE(errorOf("n[5-3]").find("goes down"), std::string::npos);
  EXPECT_NE(errorOf("n[1-3").find("n[1-3"), std::string::npos);  // names the entry
  EXPECT_NE(errorOf("").find("names no host"), std::string::npos);
  EXPECT_NE(errorOf(" , ,").find("names no host"), std::string::npos);
  EXPECT_NE(errorOf("a b").find("space"), std::string::npos);
}

TEST(HostList, HugeListsAreRejectedBeforeAllocation) {
  EXPECT_NE(errorOf("n[0-999999999999]").find("more than"), std::string::npos);
  EXPECT_NE(errorOf("a[0-999],b[0-999][0-99]").find("more than"), std::string::npos);
  EXPECT_NE(errorOf("n[1-999999999999999999999]").find("is not a number"), std::string::npos);
  EXPECT_EQ(expandHostList("n[1-65536]").size(), kMaxHosts);
  EXPECT_NE(errorOf("n[1-65536],x").find("more than"), std::string::npos);
}

TEST(HostList, LongNamesAreRejectedFromThePatternBeforeExpansion) {
  // The issue's list: a 120,000-byte name times 65,536 would be 7.8 GB.
  const std::string huge = std::string(120'000, 'a') + "[0-65535]";
  EXPECT_NE(errorOf(huge).find("a host name of 120005 bytes"), std::string::npos);
  EXPECT_NE(errorOf(huge).find("at most 255"), std::string::npos);
  EXPECT_LT(errorOf(huge).size(), 600u);  // the entry is named, abbreviated
  // 255 bytes is a name; 256 is not, counting the bracket's widest number.
  EXPECT_EQ(expandHostList(std::string(255, 'n')), V({std::string(255, 'n')}));
  EXPECT_NE(errorOf(std::string(256, 'n')).find("256 bytes"), std::string::npos);
  EXPECT_EQ(expandHostList(std::string(253, 'n') + "[8-9]").size(), 2u);
  EXPECT_EQ(expandHostList(std::string(253, 'n') + "[9-10]").size(), 2u);
  EXPECT_NE(errorOf(std::string(254, 'n') + "[9-10]").find("256 bytes"), std::string::npos);
  EXPECT_NE(errorOf(std::string(250, 'n') + "[000001-2]").find("256 bytes"),
            std::string::npos);
  EXPECT_NE(errorOf("r[1-2]" + std::string(250, 'n') + "[1-9999]").find("256 bytes"),
            std::string::npos);
}

TEST(HostList, TheTotalBytesOfNamesAreBoundedBeforeExpansion) {
  // 65,536 names of 128 bytes is the limit; one byte more per name is not.
  const std::string at = std::string(123, 'n') + "[00000-65535]";
  EXPECT_EQ(expandHostList(at).size(), kMaxHosts);
  const std::string over = std::string(124, 'n') + "[00000-65535]";
  EXPECT_NE(errorOf(over).find("more than 8388608 bytes of host names"), std::string::npos);
  // Summed across entries too.
  const std::string half = std::string(123, 'x') + "[00000-32767]";
  EXPECT_EQ(expandHostList(half + "," + half).size(), kMaxHosts);
  EXPECT_NE(errorOf(half + "," + half + "x").find("bytes of host names"), std::string::npos);
}

}  // namespace
}  // namespace ddprun::cluster
