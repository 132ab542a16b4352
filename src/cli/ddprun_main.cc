// ddprun: the launcher. All logic lives in ddprun_cli and ddprun_agent.
#include "ddprun/agent/agent.h"
#include "ddprun/cli/launch_cli.h"
#include "ddprun/common/main_guard.h"

int main(int argc, char** argv) {
  // runMain ignores SIGPIPE: a closed console (`ddprun ... | head`) never kills
  // the agent; the worker keeper gives the workers the default back.
  return ddprun::runMain("ddprun", ddprun::agent::kExitSetup,
                         [&] { return ddprun::cli::runLaunchCli(argc, argv); });
}
