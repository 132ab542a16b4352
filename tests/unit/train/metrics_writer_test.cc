// The metrics path never makes training wait: the bounded record queue (drop
// when full, counted) and the writer in front of a FIFO whose reader stopped
// reading or left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/train/metrics.h"
#include "ddprun/train/record_queue.h"
#include "temp_dir.h"

namespace ddprun::train {
namespace {

using ddprun::testing::TempDir;

TEST(RecordQueueTest, DropsAndCountsWhenFullOfRecords) {
  RecordQueue q({.maxRecords = 2, .maxBytes = 1000});
  EXPECT_TRUE(q.push("a"));
  EXPECT_TRUE(q.push("b"));
  EXPECT_FALSE(q.push("c"));  // full: dropped at once, never waits
  EXPECT_EQ(q.pushed(), 3u);
  EXPECT_EQ(q.dropped(), 1u);
  EXPECT_EQ(q.tryPop(), "a");
  EXPECT_TRUE(q.push("d"));  // room again
  EXPECT_EQ(q.tryPop(), "b");
  EXPECT_EQ(q.tryPop(), "d");
  EXPECT_EQ(q.tryPop(), std::nullopt);
}

TEST(RecordQueueTest, DropsWhenFullOfBytesAndRefusesOversizedRecords) {
  RecordQueue q({.maxRecords = 100, .maxBytes = 10});
  EXPECT_FALSE(q.push(std::string(11, 'x')));  // can never fit
  EXPECT_TRUE(q.push(std::string(6, 'x')));
  EXPECT_FALSE(q.push(std::string(5, 'y')));  // 11 bytes queued would pass the limit
  EXPECT_TRUE(q.push(std::string(4, 'z')));   // exactly 10
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(q.dropped(), 2u);
}

TEST(RecordQueueTest, CloseLetsThePopperDrainThenStop) {
  RecordQueue q({.maxRecords = 4, .maxBytes = 100});
  q.push("1");
  q.push("2");
  q.close();
  EXPECT_FALSE(q.push("3"));  // closed: counted as dropped
  EXPECT_EQ(q.pop(), "1");
  EXPECT_EQ(q.pop(), "2");
  EXPECT_EQ(q.pop(), std::nullopt);  // closed and empty: no wait
  EXPECT_EQ(q.dropped(), 1u);
}

TEST(RecordQueueTest, DiscardCountsWhatWasQueued) {
  RecordQueue q({.maxRecords = 4, .maxBytes = 100});
  q.push("1");
  q.push("2");
  EXPECT_EQ(q.discard(), 2u);
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.dropped(), 2u);
  EXPECT_TRUE(q.push("3"));  // still open: bytes were given back too
}

TEST(RecordQueueTest, AConsumerThreadGetsEveryRecordInOrder) {
  RecordQueue q({.maxRecords = 1 << 16, .maxBytes = 1 << 24});
  std::vector<std::string> got;
  std::thread consumer([&] {
    while (auto r = q.pop()) got.push_back(*r);
  });
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(q.push(std::to_string(i)));
  q.close();
  consumer.join();
  ASSERT_EQ(got.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[static_cast<size_t>(i)], std::to_string(i));
}

nlohmann::json record(int i) {
  return {{"type", "step"}, {"global_step", i}, {"pad", std::string(100, 'p')}};
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(MetricsWriterTest, RegularFileGetsEveryRecordInOrder) {
  TempDir dir;
  const std::string path = dir.file("m.jsonl");
  {
    MetricsWriter w(path, false, {.queue = {.maxRecords = 1 << 16, .maxBytes = 1 << 24}});
    for (int i = 0; i < 3000; ++i) w.write(record(i));
    const MetricsWriter::Totals t = w.finish();
    EXPECT_EQ(t.records, 3000u);
    EXPECT_EQ(t.dropped, 0u);
    std::ifstream f(path);
    int i = 0;
    for (std::string line; std::getline(f, line); ++i)
      EXPECT_EQ(nlohmann::json::parse(line)["global_step"], i);
    EXPECT_EQ(i, 3000);
  }
  {
    MetricsWriter w(path, false);  // truncates
    w.write(record(7));
    EXPECT_EQ(w.finish().dropped, 0u);
  }
  EXPECT_EQ(nlohmann::json::parse(slurp(path))["global_step"], 7);
}

// A FIFO whose reader opened it and never reads: the pipe fills, then the
// queue; write() keeps returning, and finish() gives up on the rest.
TEST(MetricsWriterTest, StalledFifoReaderDropsRecordsInsteadOfBlocking) {
  TempDir dir;
  const std::string path = dir.file("m.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  MetricsWriter w(path, false,
                  {.queue = {.maxRecords = 8, .maxBytes = 1 << 20},
                   .drainTimeout = std::chrono::milliseconds(0)});
  constexpr int kRecords = 2000;  // ~240 KB: several times a pipe's 64 KiB
  for (int i = 0; i < kRecords; ++i) w.write(record(i));
  const MetricsWriter::Totals t = w.finish();
  EXPECT_EQ(t.records, static_cast<uint64_t>(kRecords));
  EXPECT_GT(t.dropped, 0u);
  EXPECT_LT(t.dropped, t.records);  // the pipe took some
  // What reached the pipe: the complete lines are exactly the records not
  // dropped (a record given up mid-write leaves a fragment without '\n').
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::read(reader, buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(reader);
  EXPECT_EQ(static_cast<uint64_t>(std::count(got.begin(), got.end(), '\n')),
            t.records - t.dropped);
  EXPECT_EQ(nlohmann::json::parse(got.substr(0, got.find('\n')))["global_step"], 0);
}

TEST(MetricsWriterTest, FifoWithoutReaderIsRefusedAtOnce) {
  TempDir dir;
  const std::string path = dir.file("m.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  try {
    MetricsWriter w(path, false);
    FAIL() << "opened a FIFO with no reader";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("a FIFO with no reader"), std::string::npos) << e.message();
  }
}

TEST(MetricsWriterTest, ReaderThatLeftIsAWriteFailureNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("m.fifo");
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  MetricsWriter w(path, false);
  ::close(reader);
  w.write(record(1));
  try {
    w.finish();
    FAIL() << "a write into a FIFO without reader succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("Broken pipe"), std::string::npos) << e.message();
  }
  EXPECT_THROW(w.write(record(2)), IoError);  // sticky
}

}  // namespace
}  // namespace ddprun::train
