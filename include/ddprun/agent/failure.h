// Failure reports in torchrun's layout, with the culprit (the first real
// failure) set apart from the victims (workers the agent stopped).
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

struct WorkerFailure {
  int globalRank = 0;
  int localRank = 0;
  int pid = 0;
  int exitCode = 0;      // > 0 exit status, < 0 minus the terminating signal
  std::time_t time = 0;  // when the failure was observed (or the error file says)
  bool victim = false;   // stopped by the agent after another worker failed
  std::string errorFile;         // path, empty if none was written
  std::string message;           // from the error file
  std::string traceback;         // from the error file
  std::vector<std::string> stderrTail;  // last lines the worker wrote to stderr
  // The tail is of the worker's one channel for stdout and stderr (the
  // console's two streams are one file): it holds both, and says so.
  bool tailHasStdout = false;
};

// Reads a TORCHELASTIC_ERROR_FILE in either torchrun format:
//   {"message": {"message": "...", "extraInfo": {"py_callstack": "...",
//    "timestamp": "..."}}}   or   {"message": "...", "timestamp": ...}.
// Fills message/traceback/time when present. Returns false if the file is
// missing or unreadable (the failure is then reported without it).
bool readErrorFile(const std::string& path, WorkerFailure& f);

// The root cause: the earliest failure that is not a victim (ties: lowest
// local rank); a victim only if there is nothing else. Null if empty.
const WorkerFailure* rootCause(const std::vector<WorkerFailure>& failures);

// Copies the root cause's error file to `dest` with message.errorCode set to
// its exit code, as torchrun does for its own TORCHELASTIC_ERROR_FILE.
// Returns false when the root cause wrote no (readable) error file.
bool copyRootErrorFile(const std::vector<WorkerFailure>& failures, const std::string& dest);

// The exit code text: "1" or "-9 (SIGKILL)".
std::string describeExit(int exitCode);

// The report printed when the restart budget is spent:
//   ====...  <name> FAILED ... Root Cause (first observed failure): ...
// `name` is the script/program; `host` is this node's name. `note`, when
// not empty, is a line under the title (the Python workers' interpreter:
// "interpreter: /usr/bin/python3 (python3 on PATH)").
std::string formatFailureSummary(const std::string& name, const std::string& host,
                                 const std::vector<WorkerFailure>& failures,
                                 const std::string& note = "");

}  // namespace ddprun::agent
