#include "ddprun/agent/interpreter.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "ddprun/common/strings.h"

namespace ddprun::agent {

namespace fs = std::filesystem;

namespace {
// The launcher's lookup of a bare name (launcher.cc findExecutable): the
// first executable <dir>/<name> on PATH, /usr/bin:/bin when PATH is unset.
void lookUp(Interpreter& in, const Env& env, const FileProbe& probe) {
  if (in.command.find('/') != std::string::npos) {
    in.file = in.command;
    return;
  }
  auto it = env.find("PATH");
  in.searchedPath = it != env.end() ? it->second : "/usr/bin:/bin";
  for (const auto& dir : str::split(in.searchedPath, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + in.command;
    if (probe.isExecutable(candidate)) {
      in.file = candidate;
      return;
    }
  }
}

// <env>/bin/python3 (else python) when `selfExe` is <env>/bin/<name> and
// <env> is a venv or a conda environment; "" otherwise.
std::string environmentPython(const std::string& selfExe, const FileProbe& probe) {
  if (selfExe.empty()) return "";
  const fs::path bin = fs::path(selfExe).lexically_normal().parent_path();
  if (bin.filename() != "bin") return "";
  const fs::path root = bin.parent_path();
  if (!probe.isFile((root / "pyvenv.cfg").string()) &&
      !probe.isDirectory((root / "conda-meta").string()))
    return "";
  for (const char* name : {"python3", "python"}) {
    std::string candidate = (bin / name).string();
    if (probe.isExecutable(candidate)) return candidate;
  }
  return "";
}
}  // namespace

std::string Interpreter::describe() const {
  switch (source) {
    case InterpreterSource::kPythonExec:
      if (command.find('/') != std::string::npos) return command + " (PYTHON_EXEC)";
      if (file.empty())
        return command + " (PYTHON_EXEC; not found on PATH: " +
               (searchedPath.empty() ? "empty" : searchedPath) + ")";
      return file + " (PYTHON_EXEC=" + command + ", found on PATH)";
    case InterpreterSource::kEnvironment:
      return command + " (the environment ddprun is installed in)";
    case InterpreterSource::kPath:
      break;
  }
  if (file.empty())
    return command +
           " (not found on PATH: " + (searchedPath.empty() ? "empty" : searchedPath) +
           ")";
  return file + " (" + command + " on PATH)";
}

FileProbe FileProbe::real() {
  FileProbe p;
  p.isFile = [](const std::string& path) {
    std::error_code ec;
    return fs::is_regular_file(path, ec);
  };
  p.isDirectory = [](const std::string& path) {
    std::error_code ec;
    return fs::is_directory(path, ec);
  };
  p.isExecutable = [](const std::string& path) {
    std::error_code ec;
    return fs::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
  };
  return p;
}

Interpreter chooseInterpreter(const Env& env, const std::string& selfExe,
                              const FileProbe& probe) {
  Interpreter in;
  auto it = env.find("PYTHON_EXEC");
  if (it != env.end() && !it->second.empty()) {
    in.command = it->second;
    in.source = InterpreterSource::kPythonExec;
  } else if (std::string own = environmentPython(selfExe, probe); !own.empty()) {
    in.command = own;
    in.source = InterpreterSource::kEnvironment;
  } else {
    in.command = "python3";
    in.source = InterpreterSource::kPath;
  }
  lookUp(in, env, probe);
  return in;
}

std::string selfExecutable() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.string();
}

}  // namespace ddprun::agent
