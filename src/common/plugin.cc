#include "ddprun/common/plugin.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "ddprun/common/strings.h"

namespace ddprun::plugin {

namespace fs = std::filesystem;

namespace {
constexpr const char* kNotInstalled = " is not installed";
}  // namespace

bool notInstalled(const std::string& error) { return error.find(kNotInstalled) != std::string::npos; }

std::string abiMismatch(const std::string& path, uint32_t found, uint32_t wanted) {
  return path + " is from another ddprun build (plugin ABI " + std::to_string(found) +
         ", this program needs " + std::to_string(wanted) + ")";
}

std::vector<std::string> searchDirs(const std::string& binDir, const std::string& envPath,
                                    const std::vector<std::string>& pythonDirs) {
  std::vector<std::string> dirs;
  for (const auto& d : str::split(envPath, ':'))
    if (!d.empty()) dirs.push_back(d);
  if (binDir.empty()) return dirs;
  const std::string lib = binDir + "/../lib";
  dirs.push_back(lib + "/ddprun");
  for (const auto& py : pythonDirs)
    for (const char* pkgs : {"site-packages", "dist-packages"})
      dirs.push_back(lib + "/" + py + "/" + pkgs + "/ddprun/lib");
  return dirs;
}

namespace {

std::string programDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

// "python3.11", "python3.9", ...: newest first, so that a venv upgraded in
// place prefers its current interpreter's directory.
std::vector<std::string> pythonDirsUnder(const std::string& lib) {
  std::vector<std::pair<int, std::string>> found;
  if (DIR* d = ::opendir(lib.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      int minor = 0;
      if (name.rfind("python3.", 0) == 0 && str::parseInt(name.substr(8), minor, 0, 1000))
        found.emplace_back(minor, name);
    }
    ::closedir(d);
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> names;
  for (auto& f : found) names.push_back(std::move(f.second));
  return names;
}

}  // namespace

Opened open(const std::string& file, const std::string& entry) {
  Opened r;
  const std::string bin = programDir();
  const char* env = std::getenv("DDPRUN_PLUGIN_PATH");
  const auto dirs = searchDirs(bin, env ? env : "", pythonDirsUnder(bin + "/../lib"));
  for (const auto& d : dirs) {
    const std::string p = d + "/" + file;
    if (::access(p.c_str(), F_OK) == 0) {
      std::error_code ec;
      const fs::path canonical = fs::weakly_canonical(p, ec);
      r.path = ec ? p : canonical.string();
      break;
    }
  }
  if (r.path.empty()) {
    r.error = file + kNotInstalled + " (looked in " + str::join(dirs, ", ") + ")";
    return r;
  }
  void* h = ::dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    r.error = e ? e : "dlopen failed";
    return r;
  }
  r.symbol = ::dlsym(h, entry.c_str());
  if (!r.symbol) r.error = r.path + " has no entry point " + entry;
  return r;
}

}  // namespace ddprun::plugin
