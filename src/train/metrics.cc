#include "ddprun/train/metrics.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"
#include "ddprun/train/files.h"

namespace ddprun::train {

namespace {

// write(2) with SIGPIPE blocked on this thread: a FIFO whose reader left
// gives EPIPE (a named failure) instead of killing the process. A SIGPIPE
// raised by this write is consumed before the mask is restored.
ssize_t writeNoSigpipe(int fd, const char* data, size_t n) {
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe, &old);
  const ssize_t w = ::write(fd, data, n);
  const int err = errno;
  if (w < 0 && err == EPIPE) {
    const timespec zero{0, 0};
    ::sigtimedwait(&pipe, nullptr, &zero);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return w;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append, Options options)
    : path_(path), options_(options), queue_(options.queue) {
  if (path.empty()) return;
  if (const std::string problem = appendTargetProblem(path); !problem.empty())
    DDPRUN_THROW(InvalidArgument, "--metrics ", path, " ", problem);
  // O_NONBLOCK: a FIFO without a reader fails (ENXIO) instead of blocking the
  // run in open(2); O_TRUNC leaves FIFOs and devices alone. The descriptor
  // stays non-blocking: the writer thread waits in poll(2), never in write(2).
  const int flags =
      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | (append ? 0 : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0)
    DDPRUN_THROW(InvalidArgument, "cannot open the metrics file ", path, ": ",
                 errno == ENXIO ? "a FIFO with no reader" : std::strerror(errno));
  wakeFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wakeFd_ < 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    DDPRUN_THROW(IoError, "eventfd for the metrics writer: ", std::strerror(err));
  }
  try {
    writer_ = std::thread([this] { writerLoop(); });
  } catch (...) {  // std::system_error: no thread, no descriptors left behind
    ::close(wakeFd_);
    ::close(fd_);
    wakeFd_ = fd_ = -1;
    throw;
  }
}

MetricsWriter::~MetricsWriter() {
  try {
    finish();
  } catch (const std::exception&) {
    // The failure was reported by write() or is moot: the run is ending.
  }
}

void MetricsWriter::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wakeFd_, &one, sizeof(one));
}

void MetricsWriter::writerLoop() {
  while (std::optional<std::string> line = queue_.pop()) {
    if (writeLine(*line)) continue;
    // Failed or gave up: nothing more reaches the target.
    ++gaveUp_;
    queue_.close();
    queue_.discard();
    return;
  }
}

// Writes all of `line`, waiting in poll(2) while the target is full: without
// a deadline during the run, until drainTimeout after finish() was called
// then. A partial line may stay behind when it gives up.
bool MetricsWriter::writeLine(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = writeNoSigpipe(fd_, line.data() + done, line.size() - done);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd fds[2] = {{fd_, POLLOUT, 0}, {wakeFd_, POLLIN, 0}};
      const bool stopping = stopping_.load();
      int timeout = -1;
      if (stopping) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            drainDeadline_ - std::chrono::steady_clock::now());
        timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
      }
      const int r = ::poll(fds, stopping ? 1 : 2, timeout);
      if (r == 0) return false;  // finishing, and the target is still full at the deadline
      if (r < 0 && errno != EINTR) return false;
      continue;  // writable, an error to collect from write(2), or woken to finish
    }
    failure_ = std::string("cannot write the metrics file ") + path_ + ": " +
               (w < 0 ? std::strerror(errno) : "nothing written");
    failed_.store(true);
    return false;
  }
  return true;
}

void MetricsWriter::rethrowFailure() {
  if (failed_.load()) DDPRUN_THROW(IoError, failure_);
}

void MetricsWriter::write(const nlohmann::json& j) {
  rethrowFailure();
  if (fd_ < 0) return;
  queue_.push(j.dump() + "\n");
}

MetricsWriter::Totals MetricsWriter::finish() {
  if (!totals_) {
    if (fd_ < 0) return {};
    drainDeadline_ = std::chrono::steady_clock::now() + options_.drainTimeout;
    stopping_.store(true);  // publishes drainDeadline_ to the writer thread
    queue_.close();
    wake();
    if (writer_.joinable()) writer_.join();
    ::close(fd_);
    ::close(wakeFd_);
    fd_ = wakeFd_ = -1;
    totals_ = Totals{queue_.pushed(), queue_.dropped() + gaveUp_};
  }
  rethrowFailure();
  return *totals_;
}

Progress::Progress(std::FILE* out, bool enabled)
    : out_(out), enabled_(enabled), tty_(enabled && ::isatty(::fileno(out))) {}

void Progress::update(const std::string& line) {
  if (!enabled_) return;
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    dirty_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (dirty_) std::fputc('\n', out_);
  dirty_ = false;
  std::fflush(out_);
}

std::string sha256Hex(const std::vector<std::pair<const void*, size_t>>& spans) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  DDPRUN_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "SHA-256 init");
  for (const auto& [p, n] : spans) EVP_DigestUpdate(ctx.get(), p, n);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", md[i]);
    hex += b;
  }
  return hex;
}

double peakRssMb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // kB on Linux
}

std::string formatSeconds(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const long t = std::lround(s);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof(b), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(b, sizeof(b), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof(b), "%lds", t);
  return b;
}

}  // namespace ddprun::train
