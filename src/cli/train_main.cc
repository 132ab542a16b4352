// `train`: the bundled data-parallel trainer. Run it under ddprun
// (`ddprun --nproc_per_node=4 train`), under torchrun, or alone.
#include "ddprun/common/main_guard.h"
#include "ddprun/train/trainer.h"

int main(int argc, char** argv) {
  // 1: training failed (docs/train.md, "Exit codes").
  return ddprun::runMain("train", 1,
                         [&] { return ddprun::train::trainMain(argc, argv); });
}
