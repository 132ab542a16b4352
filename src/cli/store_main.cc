// ddprun-store: the store server alone. All logic lives in ddprun_cli.
#include "ddprun/cli/store_cli.h"
#include "ddprun/common/main_guard.h"

int main(int argc, char** argv) {
  return ddprun::runMain("ddprun-store", ddprun::cli::kExitInternal,
                         [&] { return ddprun::cli::runStoreCli(argc, argv); });
}
