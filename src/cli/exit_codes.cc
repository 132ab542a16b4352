#include "ddprun/cli/exit_codes.h"

#include "ddprun/agent/agent.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::cli {

ExitCodeStyle parseExitCodeStyle(const std::optional<std::string>& value) {
  if (!value || value->empty() || *value == "ddprun") return ExitCodeStyle::kDdprun;
  if (*value == "torchrun") return ExitCodeStyle::kTorchrun;
  DDPRUN_THROW(
      InvalidArgument, kExitCodesEnv, "='", str::escape(*value),
      "' is not valid: expected ddprun (the default: 0 success, 1 workers failed, "
      "2 usage, 3 setup, 128+S after signal S) or torchrun (0, 2 usage, 1 for "
      "any other failure)");
}

int exitCodeIn(ExitCodeStyle style, int code) {
  if (style == ExitCodeStyle::kDdprun || code == agent::kExitSuccess ||
      code == agent::kExitUsage)
    return code;
  return agent::kExitWorkersFailed;  // torchrun: an uncaught exception, exit 1
}

}  // namespace ddprun::cli
