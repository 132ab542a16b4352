// The arithmetic and JSON of the CUPTI kernel tracer (src/bench/kernel_trace_summary.h),
// without CUPTI or a GPU.
#include "kernel_trace_summary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ddprun::bench {
namespace {

TEST(UnionLength, EmptyAndSingle) {
  EXPECT_EQ(unionLength({}), 0u);
  EXPECT_EQ(unionLength({{10, 25}}), 15u);
}

TEST(UnionLength, OverlapsCountOnce) {
  // [0,10) and [5,20) overlap: 20; [30,40) apart: +10; [32,35) inside it: +0.
  EXPECT_EQ(unionLength({{0, 10}, {5, 20}, {30, 40}, {32, 35}}), 30u);
}

TEST(UnionLength, OrderDoesNotMatter) {
  EXPECT_EQ(unionLength({{30, 40}, {5, 20}, {0, 10}}),
            unionLength({{0, 10}, {5, 20}, {30, 40}}));
}

TEST(UnionLength, TouchingRunsMergeAndNestedRunsAreSwallowed) {
  EXPECT_EQ(unionLength({{0, 10}, {10, 20}}), 20u);
  EXPECT_EQ(unionLength({{0, 100}, {10, 20}, {30, 40}, {99, 101}}), 101u);
}

TEST(UnionLength, EmptyOrReversedIntervalsCountNothing) {
  EXPECT_EQ(unionLength({{5, 5}, {9, 3}}), 0u);
  EXPECT_EQ(unionLength({{5, 5}, {0, 2}, {9, 3}}), 2u);
}

TEST(ExpandPid, ReplacesEveryPidAndKeepsTheRest) {
  EXPECT_EQ(expandPid("/tmp/t_%p.json", 42), "/tmp/t_42.json");
  EXPECT_EQ(expandPid("%p-%p", 7), "7-7");
  EXPECT_EQ(expandPid("100%%_%p", 3), "100%_3");
  EXPECT_EQ(expandPid("plain", 3), "plain");
  EXPECT_EQ(expandPid("trailing%", 3), "trailing%");
  EXPECT_EQ(expandPid("%d", 3), "%d");
}

TEST(Demangle, MangledPlainAndNull) {
  EXPECT_EQ(demangle("_Z3fooPf"), "foo(float*)");
  EXPECT_EQ(demangle("plain_c_kernel"), "plain_c_kernel");
  EXPECT_EQ(demangle(nullptr), "<unnamed>");
}

TEST(JsonString, EscapesQuotesBackslashesAndNonAscii) {
  EXPECT_EQ(jsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(jsonString(std::string("x\ny\x01") + "\xc3\xa9"),
            "\"x\\u000ay\\u0001\\u00c3\\u00a9\"");
}

TEST(TraceSummary, KernelTimesBusySpanAndCopies) {
  TraceSummary s;
  s.addKernel("_Z1av", 1000, 3000);    // 2 us
  s.addKernel("_Z1av", 2000, 4000);    // 2 us, overlaps the first
  s.addKernel("_Z1bv", 10000, 11000);  // 1 us
  s.addMemcpy(5000, 6000, 4096);
  s.addMemset(6000, 6500, 64);
  EXPECT_EQ(s.kernels(), 3u);
  EXPECT_EQ(s.kernelNs(), 5000u);
  EXPECT_EQ(s.busyNs(), 4000u);   // [1000,4000) + [10000,11000)
  EXPECT_EQ(s.spanNs(), 10000u);  // 1000 .. 11000
  EXPECT_EQ(s.records(), 5u);
  const auto top = s.topKernels(5);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].name, "a()");
  EXPECT_EQ(top[0].count, 2u);
  EXPECT_EQ(top[0].ns, 4000u);
  EXPECT_EQ(top[1].name, "b()");
}

TEST(TraceSummary, IncompleteRecordsAreCountedApart) {
  TraceSummary s;
  s.addKernel("k", 0, 500);    // never started (a forced flush)
  s.addKernel("k", 900, 100);  // end before start
  s.addMemcpy(0, 0, 8);
  s.addKernel("k", 100, 200);
  EXPECT_EQ(s.kernels(), 1u);
  EXPECT_EQ(s.incomplete(), 3u);
  EXPECT_EQ(s.records(), 4u);
  EXPECT_EQ(s.spanNs(), 100u);
}

TEST(TraceSummary, TopKernelsTieBreakAndLimit) {
  TraceSummary s;
  for (int i = 0; i < 30; ++i) {
    std::string name = "k";
    name += std::to_string(i);  // (not "k" + ...: GCC 12 warns falsely on it)
    s.addKernel(name, 100, 100 + 10 * (i % 3 + 1));
  }
  const auto top = s.topKernels(TraceSummary::kTopKernels);
  ASSERT_EQ(top.size(), TraceSummary::kTopKernels);
  EXPECT_EQ(top.front().ns, 30u);
  for (size_t i = 1; i < top.size(); ++i) EXPECT_GE(top[i - 1].ns, top[i].ns);
  EXPECT_EQ(top[0].name,
            "k11");  // among the 30-ns kernels: by name ("k11" < "k14" < "k2")
}

TEST(TraceSummary, JsonHasTheFieldsTheBenchmarkReads) {
  TraceSummary s;
  s.addKernel("_Z1av", 1000000, 3000000);
  s.addMemcpy(4000000, 4500000, 10);
  TraceMeta m;
  m.pid = 123;
  m.range = "stop";
  m.rangesStarted = 1;
  m.errors = {"cuptiSomething failed: \"x\""};
  const std::string j = s.toJson(m);
  for (const char* field :
       {"\"pid\": 123", "\"range\": \"stop\"", "\"kernels\": 1",
        "\"kernel_ms\": 2.000000", "\"busy_ms\": 2.000000", "\"span_ms\": 2.000000",
        "\"busy_with_copies_ms\": 2.500000", "\"memcpy_count\": 1",
        "\"memcpy_ms\": 0.500000", "\"memset_count\": 0",
        "\"top_kernels\": [{\"name\": \"a()\", \"count\": 1, \"ms\": 2.000000}]",
        "\"errors\": [\"cuptiSomething failed: \\\"x\\\"\"]", "\"ranges_started\": 1"})
    EXPECT_NE(j.find(field), std::string::npos) << field << " not in " << j;
  EXPECT_EQ(j.back(), '\n');
}

TEST(TraceSummary, LongNamesAreCut) {
  TraceSummary s;
  s.addKernel(std::string(1000, 'n'), 1, 2);
  const std::string j = s.toJson(TraceMeta{});
  EXPECT_NE(j.find(std::string(TraceSummary::kMaxNameChars, 'n') + "...\""),
            std::string::npos);
  EXPECT_EQ(j.find(std::string(TraceSummary::kMaxNameChars + 1, 'n')), std::string::npos);
}

}  // namespace
}  // namespace ddprun::bench
