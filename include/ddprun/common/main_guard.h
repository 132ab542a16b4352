// The outermost frame of every ddprun program's `main`: no program dies of an
// uncaught exception (std::terminate: SIGABRT, a core, no word of what went
// wrong). Each program documents the exit code it passes here.
//
// Thread-safe; call it from `main` only (it writes to stderr).
#pragma once

namespace ddprun {

// Ends the exception being handled (call it only inside a catch block): one
// line on stderr, "<program>: error: <what>" ("out of memory
// (std::bad_alloc)" for an allocation failure), written without allocating.
// Returns `exitCode`.
int reportEscapedException(const char* program, int exitCode) noexcept;

// Returns body(); an exception escaping it ends as reportEscapedException
// says, with `exitCode`.
template <typename Body>
int runGuarded(const char* program, int exitCode, Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return reportEscapedException(program, exitCode);
  }
}

}  // namespace ddprun
