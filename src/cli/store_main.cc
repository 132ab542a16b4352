// ddprun-store: the store server alone. All logic lives in ddprun_cli.
#include "ddprun/cli/store_cli.h"

int main(int argc, char** argv) { return ddprun::cli::runStoreCli(argc, argv); }
