// ddprun: the launcher. All logic lives in ddprun_cli and ddprun_agent.
#include "ddprun/cli/launch_cli.h"

int main(int argc, char** argv) { return ddprun::cli::runLaunchCli(argc, argv); }
