// Which exit codes `ddprun` ends with. By default ddprun's own, which tell
// outcomes apart (agent.h: 0 success, 1 workers failed, 2 usage, 3 setup or
// rendezvous, 128+S after a forwarded signal S). DDPRUN_EXIT_CODES=torchrun
// gives wrapper scripts written for torchrun 2.x its codes instead, with
// torchrun's command lines unchanged: 0 success, 2 a usage error, and 1 for
// every other failure (torchrun ends with an uncaught Python exception:
// ChildFailedError, RendezvousTimeoutError, SignalException after forwarding
// a signal). Pure functions; thread-safe.
#pragma once

#include <optional>
#include <string>

namespace ddprun::cli {

enum class ExitCodeStyle { kDdprun, kTorchrun };

inline constexpr const char* kExitCodesEnv = "DDPRUN_EXIT_CODES";

// DDPRUN_EXIT_CODES: unset or "" -> ddprun's, "ddprun", "torchrun". Throws
// InvalidArgument naming the variable and the accepted values otherwise.
ExitCodeStyle parseExitCodeStyle(const std::optional<std::string>& value);

// ddprun's exit code `code` in `style`.
int exitCodeIn(ExitCodeStyle style, int code);

}  // namespace ddprun::cli
