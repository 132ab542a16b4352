// ddprun: the launcher. All logic lives in ddprun_cli and ddprun_agent.
#include "ddprun/agent/agent.h"
#include "ddprun/cli/launch_cli.h"
#include "ddprun/common/main_guard.h"

int main(int argc, char** argv) {
  return ddprun::runGuarded("ddprun", ddprun::agent::kExitSetup,
                            [&] { return ddprun::cli::runLaunchCli(argc, argv); });
}
