#include "ddprun/common/progress_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "ddprun/common/fd.h"

namespace ddprun {

namespace {
using nlohmann::json;

double unixNow() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool fail(std::string* why, std::string text) {
  if (why) *why = std::move(text);
  return false;
}

// An integer field in [min, INT64_MAX]; absent or null leaves `out` unset
// unless `required`.
bool integerField(const json& j, const char* name, bool required, int64_t min,
                  std::optional<int64_t>& out, std::string* why) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null())
    return required ? fail(why, std::string("no '") + name + "'") : true;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return fail(why, std::string("'") + name + "' is out of range");
    out = static_cast<int64_t>(it->get<uint64_t>());
  } else if (it->is_number_integer()) {
    out = it->get<int64_t>();
  } else {
    return fail(why, std::string("'") + name + "' is not an integer");
  }
  if (*out < min)
    return fail(why, std::string("'") + name + "' is below " + std::to_string(min));
  return true;
}

// A finite number field >= min (any finite number when min is -inf).
bool numberField(const json& j, const char* name, bool required, double min,
                 std::optional<double>& out, std::string* why) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null())
    return required ? fail(why, std::string("no '") + name + "'") : true;
  if (!it->is_number()) return fail(why, std::string("'") + name + "' is not a number");
  const double v = it->get<double>();
  if (!std::isfinite(v))
    return fail(why, std::string("'") + name + "' is not a finite number");
  if (v < min) return fail(why, std::string("'") + name + "' is negative");
  out = v;
  return true;
}

// The rate limit of writeProgressFile: the last path written and when. One
// path per process is the usual case; another path simply writes.
struct WriteClock {
  std::mutex mu;
  std::string path;
  std::chrono::steady_clock::time_point last;
  bool any = false;

  bool due(const std::string& p, std::chrono::steady_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu);
    return !any || p != path || now - last >= kProgressWriteInterval;
  }
  void wrote(const std::string& p, std::chrono::steady_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu);
    path = p;
    last = now;
    any = true;
  }
};

WriteClock& writeClock() {
  static WriteClock clock;
  return clock;
}
}  // namespace

std::string formatProgressReport(const ProgressReport& r) {
  json j = json::object();
  j["step"] = r.step;
  if (r.epoch) j["epoch"] = *r.epoch;
  if (r.loss && std::isfinite(*r.loss)) j["loss"] = *r.loss;
  if (r.samplesPerSecond && std::isfinite(*r.samplesPerSecond))
    j["samples_per_second"] = *r.samplesPerSecond;
  if (r.totalSteps) j["total_steps"] = *r.totalSteps;
  j["time"] = r.time > 0 && std::isfinite(r.time) ? r.time : unixNow();
  return j.dump();
}

std::optional<ProgressReport> parseProgressReport(std::string_view text,
                                                  std::string* why) {
  const json j =
      json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(why, "not JSON"), std::nullopt;
  if (!j.is_object()) return fail(why, "not a JSON object"), std::nullopt;
  ProgressReport r;
  std::optional<int64_t> step;
  std::optional<double> time;
  constexpr double kAny = -std::numeric_limits<double>::infinity();
  if (!integerField(j, "step", true, 0, step, why) ||
      !integerField(j, "epoch", false, 0, r.epoch, why) ||
      !integerField(j, "total_steps", false, 1, r.totalSteps, why) ||
      !numberField(j, "loss", false, kAny, r.loss, why) ||
      !numberField(j, "samples_per_second", false, 0, r.samplesPerSecond, why) ||
      !numberField(j, "time", true, 0, time, why))
    return std::nullopt;
  r.step = *step;
  r.time = *time;
  return r;
}

bool writeProgressFile(const std::string& path, const ProgressReport& report,
                       bool force) {
  if (path.empty()) {
    errno = ENOENT;
    return false;
  }
  const auto now = std::chrono::steady_clock::now();
  if (!force && !writeClock().due(path, now)) return true;
  try {
    const std::string text = formatProgressReport(report) + "\n";
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    UniqueFd fd(
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (fd.get() < 0) return false;
    bool ok = writeAll(fd.get(), text) && fd.close() &&
              ::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) {
      const int err = errno;
      ::unlink(tmp.c_str());
      errno = err;
      return false;
    }
  } catch (const std::exception&) {  // std::bad_alloc: the caller's step goes on
    errno = ENOMEM;
    return false;
  }
  writeClock().wrote(path, now);
  return true;
}

std::optional<ProgressReport> readProgressFile(const std::string& path,
                                               std::string* why) {
  if (why) why->clear();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno != ENOENT)
      fail(why, std::string("cannot open it: ") + std::strerror(errno));
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return fail(why, std::string("cannot stat it: ") + std::strerror(errno)),
           std::nullopt;
  if (!S_ISREG(st.st_mode))
    return fail(why, std::string("it is ") + fileTypeName(st.st_mode) +
                         ", not a regular file"),
           std::nullopt;
  const std::string tooBig =
      "larger than " + std::to_string(kMaxProgressFileBytes) + " bytes";
  if (st.st_size > static_cast<off_t>(kMaxProgressFileBytes))
    return fail(why, tooBig), std::nullopt;
  // One byte more than the cap: a file that grew since fstat is caught too.
  char buf[kMaxProgressFileBytes + 1];
  size_t got = 0;
  while (got < sizeof buf) {
    const ssize_t n = ::read(fd.get(), buf + got, sizeof buf - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return fail(why, std::string("cannot read it: ") + std::strerror(errno)),
             std::nullopt;
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxProgressFileBytes) return fail(why, tooBig), std::nullopt;
  try {
    return parseProgressReport(std::string_view(buf, got), why);
  } catch (const std::exception& e) {  // std::bad_alloc while parsing
    return fail(why, e.what()), std::nullopt;
  }
}

}  // namespace ddprun
