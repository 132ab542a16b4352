#include "ddprun/train/metrics.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"
#include "ddprun/train/files.h"

namespace ddprun::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  if (const std::string problem = appendTargetProblem(path); !problem.empty())
    DDPRUN_THROW(InvalidArgument, "--metrics ", path, " ", problem);
  // O_NONBLOCK for the open only: a FIFO without a reader fails (ENXIO)
  // instead of blocking the run; O_TRUNC leaves FIFOs and devices alone.
  const int flags =
      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | (append ? 0 : O_TRUNC);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0)
    DDPRUN_THROW(InvalidArgument, "cannot open the metrics file ", path, ": ",
                 errno == ENXIO ? "a FIFO with no reader" : std::strerror(errno));
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

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

void MetricsWriter::write(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string line = j.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = writeNoSigpipe(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      DDPRUN_THROW(IoError, "cannot write the metrics file ", path_, ": ",
                   w < 0 ? std::strerror(errno) : "nothing written");
    done += static_cast<size_t>(w);
  }
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
