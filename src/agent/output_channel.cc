#include "output_channel.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"

namespace ddprun::agent::detail {

namespace {
// One read(2) at most this much; a wakeup reads at most kBatchBytes before
// yielding to other channels (fairness), and closing a channel reads at
// most kDrainBytes: far more than a pipe or pty can hold when its worker
// exits, so only a runaway descendant still writing can hit the bound.
constexpr size_t kReadBytes = 64 * 1024;
constexpr size_t kBatchBytes = 16 * kReadBytes;
constexpr size_t kDrainBytes = 64 * 1024 * 1024;
}  // namespace

void Console::write(std::string_view data, const void* writer) {
  if (closed_ || data.empty()) return;
  bool ok;
  if (midLine_ && writer != lastWriter_) {
    // Rare (a partial line went out on its deadline): one write all the same.
    std::string ended;
    ended.reserve(data.size() + 1);
    ended.append("\n").append(data);
    ok = writeAll(fd_, ended);
  } else {
    ok = writeAll(fd_, data);
  }
  midLine_ = data.back() != '\n';
  lastWriter_ = writer;
  if (ok) return;
  int err = errno;
  closed_ = true;
  DDPRUN_DEBUG("console fd ", fd_, " closed (", std::strerror(err),
               "): workers' console output is dropped from now on; log files go on");
}

FileSink::FileSink(const std::string& path)
    : path_(path),
      fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
  if (fd_.get() < 0)
    DDPRUN_THROW(IoError, "cannot create ", path, ": ", std::strerror(errno),
                 "; pass a writable --log-dir");
}

FileSink::~FileSink() { flush(); }

void FileSink::append(std::string_view data) {
  if (failed_) return;
  if (buffer_.size() + data.size() > kBufferBytes) flush();
  if (data.size() >= kBufferBytes) {
    // A big chunk goes out at once rather than through the buffer.
    if (!writeAll(fd_.get(), data)) {
      failed_ = true;
      DDPRUN_WARN("cannot write ", path_, ": ", std::strerror(errno),
                  "; its output is dropped");
    }
    return;
  }
  buffer_.append(data);
}

void FileSink::flush() {
  if (buffer_.empty() || failed_) return;
  if (!writeAll(fd_.get(), buffer_)) {
    failed_ = true;
    DDPRUN_WARN("cannot write ", path_, ": ", std::strerror(errno),
                "; its output is dropped");
  }
  buffer_.clear();
  if (buffer_.capacity() > kBufferBytes) buffer_.shrink_to_fit();
}

std::shared_ptr<Channel> Channel::start(boost::asio::io_context& io, UniqueFd readFd,
                                        bool pty, ChannelSinks sinks) {
  int flags = ::fcntl(readFd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(readFd.get(), F_SETFL, flags | O_NONBLOCK) < 0)
    DDPRUN_THROW(IoError,
                 "cannot set up a worker output channel: ", std::strerror(errno));
  std::shared_ptr<Channel> ch(new Channel(io, std::move(readFd), pty, std::move(sinks)));
  ch->waitReadable();
  return ch;
}

Channel::Channel(boost::asio::io_context& io, UniqueFd readFd, bool pty,
                 ChannelSinks sinks)
    : io_(io),
      descriptor_(io),
      pty_(pty),
      sinks_(std::move(sinks)),
      needLines_((sinks_.console && sinks_.consoleLines) || sinks_.duplicates ||
                 sinks_.tailLines > 0),
      splitter_(sinks_.maxLineBytes),
      rawConsole_(sinks_.console && !sinks_.consoleLines),
      assembler_(sinks_.maxLineBytes, sinks_.partialLineDelay),
      timer_(io) {
  boost::system::error_code ec;
  descriptor_.assign(readFd.get(), ec);
  if (ec) DDPRUN_THROW(IoError, "cannot watch a worker output channel: ", ec.message());
  readFd.release();
}

Channel::~Channel() {
  boost::system::error_code ec;
  descriptor_.close(ec);
}

// Waits only right after a read found the channel empty (EAGAIN): the
// reactor is edge-triggered, so data that arrives from then on wakes us,
// while data left unread would not.
void Channel::waitReadable() {
  descriptor_.async_wait(
      boost::asio::posix::descriptor_base::wait_read,
      [self = shared_from_this()](const boost::system::error_code& ec) {
        if (!self->open_) return;
        if (ec) {
          self->close();
          return;
        }
        self->onReadable();
      });
}

void Channel::onReadable() {
  ReadEnd end = readAvailable(kBatchBytes);
  flushOutput();
  switch (end) {
    case ReadEnd::kDrained:
      waitReadable();
      break;
    case ReadEnd::kBudgetSpent:
      // Let other channels run, then go on reading (no new edge will come).
      boost::asio::post(io_, [self = shared_from_this()] {
        if (self->open_) self->onReadable();
      });
      break;
    case ReadEnd::kEnd:
      close();
      break;
  }
}

Channel::ReadEnd Channel::readAvailable(size_t budgetBytes) {
  std::array<char, kReadBytes> buf;
  for (size_t total = 0; total < budgetBytes;) {
    ssize_t n = ::read(descriptor_.native_handle(), buf.data(), buf.size());
    if (n > 0) {
      consume(std::string_view(buf.data(), static_cast<size_t>(n)));
      total += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return ReadEnd::kDrained;
    } else {
      // EOF of a pipe; EIO of a pty master once no slave is open; other
      // errors end the channel the same way.
      if (n < 0 && !(pty_ && errno == EIO))
        DDPRUN_DEBUG("worker output channel: read: ", std::strerror(errno));
      return ReadEnd::kEnd;
    }
  }
  return ReadEnd::kBudgetSpent;
}

void Channel::consume(std::string_view data) {
  if (sinks_.file) sinks_.file->append(data);
  if (rawConsole_ && !sinks_.console->closed())
    assembler_.feed(data, LineAssembler::Clock::now(), rawBuffer_);
  if (needLines_)
    splitter_.feed(
        data, [this](std::string_view line, bool complete) { onLine(line, complete); });
}

void Channel::onLine(std::string_view line, bool complete) {
  // A piece of a long line, or the unfinished end of the stream, is ended
  // with a newline of our own on the console and in the duplicate file.
  std::string_view eol = complete ? "" : "\n";
  if (sinks_.console && sinks_.consoleLines && !sinks_.console->closed()) {
    teeBuffer_.append(sinks_.prefix).append(line).append(eol);
    // Many short lines with a long prefix: write out before it grows large.
    if (teeBuffer_.size() >= kBatchBytes) flushTee();
  }
  if (sinks_.duplicates) {
    for (const auto& f : sinks_.filters) {
      if (line.find(f) == std::string_view::npos) continue;
      sinks_.duplicates->append(sinks_.prefix);
      sinks_.duplicates->append(line);
      sinks_.duplicates->append(eol);
      break;
    }
  }
  if (sinks_.tailLines > 0) {
    std::string_view text = line;
    if (complete) text.remove_suffix(1);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    tail_.emplace_back(text);
    if (tail_.size() > sinks_.tailLines) tail_.pop_front();
  }
}

void Channel::flushTee() {
  if (teeBuffer_.empty()) return;
  sinks_.console->write(teeBuffer_, this);
  teeBuffer_.clear();
  if (teeBuffer_.capacity() > 2 * kBatchBytes) teeBuffer_.shrink_to_fit();
}

// Whole lines out, and a held partial line once due (`all`: at close).
void Channel::flushRaw(bool all) {
  if (!rawConsole_) return;
  if (all) assembler_.flushAll(rawBuffer_);
  else assembler_.flushDue(LineAssembler::Clock::now(), rawBuffer_);
  if (!rawBuffer_.empty()) sinks_.console->write(rawBuffer_, this);
  rawBuffer_.clear();
  if (rawBuffer_.capacity() > 2 * kBatchBytes) rawBuffer_.shrink_to_fit();
  if (!all) armTimer();
}

// One pending wait at most, for the held partial line's deadline; a wait
// that finds a newer partial (the old one went out with its line) waits on.
void Channel::armTimer() {
  auto deadline = assembler_.deadline();
  if (!deadline || timerArmed_) return;
  timerArmed_ = true;
  timer_.expires_at(*deadline);
  timer_.async_wait([self = shared_from_this()](const boost::system::error_code&) {
    self->timerArmed_ = false;
    if (self->open_) self->onTimer();
  });
}

void Channel::onTimer() { flushRaw(false); }

void Channel::flushOutput() {
  flushRaw(false);
  flushTee();
  if (sinks_.file) sinks_.file->flush();
  if (sinks_.duplicates) sinks_.duplicates->flush();
}

void Channel::close() {
  if (!open_) return;
  readAvailable(kDrainBytes);
  if (needLines_)
    splitter_.finish(
        [this](std::string_view line, bool complete) { onLine(line, complete); });
  flushRaw(true);
  flushOutput();
  open_ = false;
  timer_.cancel();
  boost::system::error_code ec;
  descriptor_.close(ec);  // a pending wait completes as aborted and sees !open_
  sinks_.file.reset();
  sinks_.duplicates.reset();
  sinks_.console.reset();
}

}  // namespace ddprun::agent::detail
