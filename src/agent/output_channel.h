// Private to the Reporter: the pieces one relayed worker output channel is
// made of. A Channel reads the agent's end of a pipe or pseudo-terminal and
// copies what arrives to its sinks: a log file (raw bytes), the console
// (whole lines as they come, see LineAssembler, or lines with a prefix for
// --tee), the duplicate file (matching lines) and the tail (last lines, for
// the failure report).
//
// Threading: one thread, the io_context's. Channels are held by shared_ptr:
// a pending wait keeps its channel alive, so closing a channel (or the
// Reporter forgetting it) never leaves a handler pointing at freed memory.
#pragma once

// <utility> first: Boost 1.74 under C++20 with g++ 12.
#include <utility>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddprun/common/fd.h"
#include "line_assembler.h"

namespace ddprun::agent::detail {

// Cuts a byte stream into lines, in linear time and bounded memory: only
// the new bytes are scanned for '\n', and a line longer than `maxLineBytes`
// (not counting its '\n') is handed on in pieces of that size.
class LineSplitter {
 public:
  explicit LineSplitter(size_t maxLineBytes) : max_(maxLineBytes) {}
  // Calls onLine(line, complete) for every line ended in `data` (complete:
  // the view ends with its '\n') and every full piece of a long line
  // (complete false). The views are valid only during the call.
  template <class OnLine>
  void feed(std::string_view data, OnLine&& onLine);
  // Hands on the pending part of an unfinished line, if any (complete false).
  template <class OnLine>
  void finish(OnLine&& onLine);

 private:
  size_t max_;
  std::string partial_;  // never longer than max_
};

// The agent's stdout or stderr. A failed write (EPIPE when the reader went
// away, or EIO/EBADF) closes it for good: console output is dropped from
// then on and the job goes on. Needs SIGPIPE ignored (the agent does it).
//
// Lines of different writers never merge: when the last write left the
// console inside a line (a partial line flushed on its deadline) and another
// writer writes, a '\n' goes out first. `writer` names who writes (a
// channel; null: the agent itself).
class Console {
 public:
  explicit Console(int fd) : fd_(fd) {}
  void write(std::string_view data, const void* writer = nullptr);
  bool closed() const { return closed_; }
  int fd() const { return fd_; }

 private:
  int fd_;
  bool closed_ = false;
  bool midLine_ = false;  // the last byte written was not '\n'
  const void* lastWriter_ = nullptr;
};

// An output file written through a buffer (flushed when full, at flush()
// and at destruction), so that many short lines cost few system calls.
// A write error is logged once and the file's later output dropped.
class FileSink {
 public:
  // Creates or truncates `path` (close-on-exec). Throws IoError naming it.
  explicit FileSink(const std::string& path);
  ~FileSink();
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  void append(std::string_view data);
  void flush();

 private:
  static constexpr size_t kBufferBytes = 256 * 1024;
  std::string path_;
  UniqueFd fd_;
  std::string buffer_;
  bool failed_ = false;
};

// Where one channel's bytes go.
struct ChannelSinks {
  std::shared_ptr<Console> console;      // null: console output dropped
  bool consoleLines = false;             // --tee: prefixed lines, else raw lines
  // Raw console: how long an unfinished line is held (LineAssembler).
  std::chrono::milliseconds partialLineDelay{100};
  std::string prefix;                    // for tee'd and duplicated lines
  std::shared_ptr<FileSink> file;        // stdout.log / stderr.log, or null
  std::shared_ptr<FileSink> duplicates;  // duplicate_*.log, or null
  std::vector<std::string> filters;      // lines containing one are duplicated
  size_t tailLines = 0;                  // 0: keep no tail
  size_t maxLineBytes = 64 * 1024;
};

// One relayed channel: the agent's end of a worker's pipe or pty.
class Channel : public std::enable_shared_from_this<Channel> {
 public:
  // Takes `readFd` (made non-blocking) and starts relaying. `pty`: the fd is
  // a pty master, whose end of data is EIO rather than EOF.
  static std::shared_ptr<Channel> start(boost::asio::io_context& io, UniqueFd readFd,
                                        bool pty, ChannelSinks sinks);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Copies everything readable now, then the unfinished line, writes it all
  // out, and closes the channel (files closed, descriptor released). Idempotent.
  void close();
  bool isOpen() const { return open_; }
  // The last lines (without '\n'), oldest first.
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  Channel(boost::asio::io_context& io, UniqueFd readFd, bool pty, ChannelSinks sinks);
  enum class ReadEnd { kBudgetSpent, kDrained, kEnd };
  void waitReadable();
  void onReadable();
  ReadEnd readAvailable(size_t budgetBytes);
  void consume(std::string_view data);
  void onLine(std::string_view line, bool complete);
  void flushTee();
  void flushRaw(bool all);
  void flushOutput();
  void armTimer();
  void onTimer();

  boost::asio::io_context& io_;
  boost::asio::posix::stream_descriptor descriptor_;
  bool pty_;
  bool open_ = true;
  ChannelSinks sinks_;
  bool needLines_;
  LineSplitter splitter_;
  std::string teeBuffer_;  // prefixed lines of the current batch
  bool rawConsole_;        // whole lines to the console, unprefixed
  LineAssembler assembler_;
  std::string rawBuffer_;  // whole lines of the current batch
  boost::asio::steady_timer timer_;  // a held partial line's deadline
  bool timerArmed_ = false;
  std::deque<std::string> tail_;
};

template <class OnLine>
void LineSplitter::feed(std::string_view data, OnLine&& onLine) {
  // Each step looks at most one byte past the room left in the partial
  // line, so every byte is scanned at most twice: linear in the input.
  size_t pos = 0;
  while (pos < data.size()) {
    size_t room = max_ - partial_.size();
    size_t avail = data.size() - pos;
    const char* p = data.data() + pos;
    const void* nl = std::memchr(p, '\n', std::min(avail, room + 1));
    if (nl != nullptr) {
      size_t len = static_cast<const char*>(nl) - p + 1;
      if (partial_.empty()) {
        onLine(std::string_view(p, len), true);
      } else {
        partial_.append(p, len);
        onLine(std::string_view(partial_), true);
        partial_.clear();
      }
      pos += len;
      continue;
    }
    size_t take = std::min(avail, room);
    partial_.append(p, take);
    pos += take;
    if (partial_.size() == max_) {
      onLine(std::string_view(partial_), false);
      partial_.clear();
    }
  }
}

template <class OnLine>
void LineSplitter::finish(OnLine&& onLine) {
  if (partial_.empty()) return;
  onLine(std::string_view(partial_), false);
  partial_.clear();
}

}  // namespace ddprun::agent::detail
