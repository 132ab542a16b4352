// The arithmetic and the JSON of the CUPTI kernel tracer (kernel_trace.cc),
// apart from CUPTI so that it builds and is tested without CUDA
// (tests/bench/kernel_trace_summary_test.cc).
//
// TraceSummary takes the activity records of one profiled range (kernels,
// memcpys, memsets: start and end in nanoseconds) and reports what
// scripts/bench/resnet_bench.py reads: how many kernels, the sum of their
// durations, the time the GPU ran at least one kernel (the union of the
// kernel intervals: concurrent kernels count once), the span from the first
// kernel's start to the last kernel's end, the copies and sets, and the
// kernels that took the most time in all.
//
// Not thread-safe: the tracer serialises every call under its own mutex.
#pragma once

#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddprun::bench {

struct Interval {
  uint64_t start = 0, end = 0;  // nanoseconds; an empty or reversed interval counts 0
};

// The total length of the union of the intervals (each point covered by at
// least one counts once): sort by start, merge overlapping or touching runs.
inline uint64_t unionLength(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  uint64_t total = 0, runStart = 0, runEnd = 0;
  bool open = false;
  for (const Interval& i : v) {
    if (i.end <= i.start) continue;
    if (open && i.start <= runEnd) {
      runEnd = std::max(runEnd, i.end);
      continue;
    }
    if (open) total += runEnd - runStart;
    runStart = i.start;
    runEnd = i.end;
    open = true;
  }
  if (open) total += runEnd - runStart;
  return total;
}

// A C++ symbol as source code ("void foo<float>(float*)"); a name that is
// not a mangled C++ symbol comes back as it is, a null one as "<unnamed>".
inline std::string demangle(const char* name) {
  if (name == nullptr) return "<unnamed>";
  int status = 0;
  char* out = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || out == nullptr) {
    std::free(out);
    return name;
  }
  std::string s(out);
  std::free(out);
  return s;
}

// The output path: every "%p" becomes the process id, "%%" a '%'; any other
// character is kept.
inline std::string expandPid(std::string_view pattern, long pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() &&
        (pattern[i + 1] == 'p' || pattern[i + 1] == '%')) {
      out += pattern[i + 1] == 'p' ? std::to_string(pid) : std::string("%");
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// s as a JSON string literal. Bytes outside printable ASCII are written as
// \u00XX (each byte as the code point of that value), so the file is valid
// JSON and UTF-8 whatever the bytes of a kernel name are.
inline std::string jsonString(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Nanoseconds as milliseconds with 6 decimals (nanosecond resolution).
inline std::string jsonMs(uint64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6f", static_cast<double>(ns) / 1e6);
  return buf;
}

// What the tracer knows besides the records.
struct TraceMeta {
  long pid = 0;
  std::string range =
      "none";  // "stop": written at cudaProfilerStop; "exit": no stop came
  bool flushedAtExit = false;  // records that were still in flight at the stop were added
  int rangesStarted = 0, rangesIgnored = 0;  // only the first range is traced
  uint64_t droppedRecords = 0;  // CUPTI's count of records it had no room for
  uint32_t cuptiApiVersion = 0;
  std::vector<std::string> errors;  // every CUPTI failure, in order
};

class TraceSummary {
 public:
  static constexpr size_t kTopKernels = 20;
  static constexpr size_t kMaxNameChars = 400;

  // A record whose start is 0 or whose end precedes its start is incomplete
  // (a forced flush delivers kernels that had not finished): counted apart.
  void addKernel(std::string_view name, uint64_t start, uint64_t end) {
    if (!complete(start, end)) return;
    ++kernels_;
    kernelNs_ += end - start;
    firstStart_ = std::min(firstStart_, start);
    lastEnd_ = std::max(lastEnd_, end);
    kernelIntervals_.push_back({start, end});
    auto& st = byName_[std::string(name)];
    ++st.first;
    st.second += end - start;
  }
  void addMemcpy(uint64_t start, uint64_t end, uint64_t bytes) {
    if (!complete(start, end)) return;
    ++memcpys_;
    memcpyNs_ += end - start;
    memcpyBytes_ += bytes;
    copyIntervals_.push_back({start, end});
  }
  void addMemset(uint64_t start, uint64_t end, uint64_t bytes) {
    if (!complete(start, end)) return;
    ++memsets_;
    memsetNs_ += end - start;
    memsetBytes_ += bytes;
    copyIntervals_.push_back({start, end});
  }

  uint64_t kernels() const { return kernels_; }
  uint64_t kernelNs() const { return kernelNs_; }
  uint64_t busyNs() const { return unionLength(kernelIntervals_); }
  uint64_t spanNs() const { return kernels_ ? lastEnd_ - firstStart_ : 0; }
  uint64_t incomplete() const { return incomplete_; }
  // Every record the summary holds (to tell whether a later flush added any).
  uint64_t records() const { return kernels_ + memcpys_ + memsets_ + incomplete_; }

  struct KernelStat {
    std::string name;  // demangled
    uint64_t count = 0, ns = 0;
  };
  // The n kernels with the most time in all (ties: the more frequent, then by name).
  std::vector<KernelStat> topKernels(size_t n) const {
    std::vector<std::pair<const std::string*, std::pair<uint64_t, uint64_t>>> v;
    v.reserve(byName_.size());
    for (const auto& [name, st] : byName_) v.push_back({&name, st});
    auto better = [](const auto& a, const auto& b) {
      if (a.second.second != b.second.second) return a.second.second > b.second.second;
      if (a.second.first != b.second.first) return a.second.first > b.second.first;
      return *a.first < *b.first;
    };
    const size_t k = std::min(n, v.size());
    std::partial_sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end(),
                      better);
    std::vector<KernelStat> out;
    for (size_t i = 0; i < k; ++i)
      out.push_back(
          {demangle(v[i].first->c_str()), v[i].second.first, v[i].second.second});
    return out;
  }

  std::string toJson(const TraceMeta& m) const {
    std::vector<Interval> all = kernelIntervals_;
    all.insert(all.end(), copyIntervals_.begin(), copyIntervals_.end());
    std::string j = "{\"tool\": \"ddprun_kernel_trace\", \"format\": 1";
    j += ", \"pid\": " + std::to_string(m.pid) + ", \"range\": " + jsonString(m.range);
    j += ", \"flushed_at_exit\": " + std::string(m.flushedAtExit ? "true" : "false");
    j += ", \"ranges_started\": " + std::to_string(m.rangesStarted);
    j += ", \"ranges_ignored\": " + std::to_string(m.rangesIgnored);
    j += ", \"cupti_api_version\": " + std::to_string(m.cuptiApiVersion);
    j += ", \"kernels\": " + std::to_string(kernels_) +
         ", \"kernel_ms\": " + jsonMs(kernelNs_);
    j += ", \"busy_ms\": " + jsonMs(busyNs()) + ", \"span_ms\": " + jsonMs(spanNs());
    j += ", \"busy_with_copies_ms\": " + jsonMs(unionLength(std::move(all)));
    j += ", \"distinct_kernels\": " + std::to_string(byName_.size());
    j += ", \"memcpy_count\": " + std::to_string(memcpys_) +
         ", \"memcpy_ms\": " + jsonMs(memcpyNs_);
    j += ", \"memcpy_bytes\": " + std::to_string(memcpyBytes_);
    j += ", \"memset_count\": " + std::to_string(memsets_) +
         ", \"memset_ms\": " + jsonMs(memsetNs_);
    j += ", \"memset_bytes\": " + std::to_string(memsetBytes_);
    j += ", \"incomplete_records\": " + std::to_string(incomplete_);
    j += ", \"dropped_records\": " + std::to_string(m.droppedRecords);
    j += ", \"top_kernels\": [";
    const auto top = topKernels(kTopKernels);
    for (size_t i = 0; i < top.size(); ++i) {
      std::string name = top[i].name;
      if (name.size() > kMaxNameChars) name = name.substr(0, kMaxNameChars) + "...";
      j += (i ? ", " : "") + std::string("{\"name\": ") + jsonString(name) +
           ", \"count\": " + std::to_string(top[i].count) +
           ", \"ms\": " + jsonMs(top[i].ns) + "}";
    }
    j += "], \"errors\": [";
    for (size_t i = 0; i < m.errors.size(); ++i)
      j += (i ? ", " : "") + jsonString(m.errors[i]);
    return j + "]}\n";
  }

 private:
  bool complete(uint64_t start, uint64_t end) {
    if (start != 0 && end >= start) return true;
    ++incomplete_;
    return false;
  }

  uint64_t kernels_ = 0, kernelNs_ = 0, memcpys_ = 0, memcpyNs_ = 0, memcpyBytes_ = 0;
  uint64_t memsets_ = 0, memsetNs_ = 0, memsetBytes_ = 0, incomplete_ = 0;
  uint64_t firstStart_ = std::numeric_limits<uint64_t>::max(), lastEnd_ = 0;
  std::vector<Interval> kernelIntervals_, copyIntervals_;
  std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> byName_;  // count, ns
};

}  // namespace ddprun::bench
