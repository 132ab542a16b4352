#include "ddprun/train/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "ddprun/common/fd.h"
#include "ddprun/common/strings.h"

namespace ddprun::train {
namespace {

namespace fs = std::filesystem;

std::string statProblem(const std::string& path) {
  return errno == ENOENT ? "no such file"
                         : std::string("cannot stat: ") + std::strerror(errno);
}

std::string exeOf(long pid) {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return ec ? std::string() : p.string();
}

}  // namespace

std::string replaceTargetProblem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT ? "" : statProblem(path);
  if (S_ISREG(st.st_mode)) return "";
  return std::string("is ") + fileTypeName(st.st_mode) +
         ": refusing to replace it with a regular file (name a regular file or a new "
         "path)";
}

std::string regularFileProblem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return statProblem(path);
  if (S_ISREG(st.st_mode)) return "";
  return std::string("is ") + fileTypeName(st.st_mode) + ", not a regular file";
}

std::string appendTargetProblem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return statProblem(path);
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      return "is in a directory that does not exist (" + dir.string() + ")";
    return "";
  }
  if (S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) return "";
  return std::string("is ") + fileTypeName(st.st_mode) +
         ": metrics go to a regular file, a FIFO or a character device";
}

bool writerMayBeAlive(long pid) {
  if (pid <= 0 || pid == static_cast<long>(::getpid())) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  const std::string theirs = exeOf(pid), ours = exeOf(::getpid());
  // Unreadable (another user's process): it may be a writer, keep its file.
  if (theirs.empty() || ours.empty()) return true;
  return theirs == ours;
}

std::vector<std::string> removeStaleTemporaries(
    const std::string& dir, const std::function<bool(const std::string&)>& owned) {
  std::vector<std::string> removed;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(".tmp.");
    int64_t pid = 0;
    if (at == std::string::npos || !str::parseInt(name.substr(at + 5), pid, 1, INT32_MAX))
      continue;
    std::error_code typeEc;
    if (!it->is_regular_file(typeEc) || it->is_symlink(typeEc)) continue;
    if (!owned(name.substr(0, at)) || writerMayBeAlive(static_cast<long>(pid))) continue;
    std::error_code rmEc;
    if (fs::remove(it->path(), rmEc)) removed.push_back(name);
  }
  return removed;
}

}  // namespace ddprun::train
