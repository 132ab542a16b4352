// `train`: the bundled data-parallel trainer. Run it under ddprun
// (`ddprun --nproc_per_node=4 train`), under torchrun, or alone.
#include "ddprun/train/trainer.h"

int main(int argc, char** argv) { return ddprun::train::trainMain(argc, argv); }
