// Which Python interpreter runs script workers, and how to say so.
//
// torchrun runs its workers with its own interpreter (sys.executable), so a
// torchrun installed in a virtual environment runs them with that
// environment's Python. ddprun is no Python program; it follows the same idea
// with this rule, in this order:
//   1. $PYTHON_EXEC when set and not empty (a bare name is looked up on the
//      workers' PATH by the launcher);
//   2. else, when ddprun's own executable (/proc/self/exe) lies in <env>/bin/
//      of a Python environment (a venv: <env>/pyvenv.cfg exists; a conda
//      environment: <env>/conda-meta/ exists), that environment's
//      bin/python3, else bin/python, when executable. The path is used as it
//      is, never resolved: a venv's bin/python3 is a symbolic link to the base
//      interpreter, and only the venv path makes Python read pyvenv.cfg;
//   3. else "python3", looked up on the workers' PATH (/usr/bin:/bin when
//      PATH is unset), as today's shells would.
// Pure functions over an injected file probe; thread-safe.
#pragma once

#include <functional>
#include <string>

#include "ddprun/agent/worker_spec.h"

namespace ddprun::agent {

enum class InterpreterSource {
  kPythonExec,   // $PYTHON_EXEC
  kEnvironment,  // the Python environment ddprun is installed in
  kPath,         // python3 on PATH
};

struct Interpreter {
  // argv[0] of the Python workers: a path, or a bare name the launcher looks
  // up on the workers' PATH.
  std::string command;
  InterpreterSource source = InterpreterSource::kPath;
  // The file that runs: `command` when it holds a '/', else the PATH hit;
  // empty when a bare name is on no directory of PATH.
  std::string file;
  // Where the PATH lookup of a bare name looked (for messages).
  std::string searchedPath;

  // One phrase naming the interpreter and why it was chosen, e.g.
  // "/opt/venv/bin/python3 (the environment ddprun is installed in)",
  // "/usr/bin/python3 (python3 on PATH)", "/x/python (PYTHON_EXEC)".
  std::string describe() const;
};

// What the rule asks of the file system (tests pass fakes).
struct FileProbe {
  std::function<bool(const std::string&)> isFile;  // a regular file (links followed)
  std::function<bool(const std::string&)> isDirectory;
  std::function<bool(const std::string&)>
      isExecutable;  // a file this process may execute
  static FileProbe real();
};

// The rule above. `env` is the workers' environment (PYTHON_EXEC, PATH);
// `selfExe` the path of ddprun's own executable ("" when unknown: rule 2 is
// skipped).
Interpreter chooseInterpreter(const Env& env, const std::string& selfExe,
                              const FileProbe& probe);

// ddprun's own executable: the target of /proc/self/exe, "" when unreadable.
std::string selfExecutable();

}  // namespace ddprun::agent
