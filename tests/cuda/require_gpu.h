// The CUDA tests' skip: without a visible GPU a test reports itself skipped,
// saying why, instead of passing (ctest shows it through
// SKIP_REGULAR_EXPRESSION). `what` names the test's subject.
#pragma once

#include <gtest/gtest.h>

#include "ddprun/runtime/cuda.h"

#define DDPRUN_REQUIRE_GPU(what)                                                    \
  do {                                                                              \
    if (::ddprun::runtime::cudaDeviceCount() == 0)                                  \
      GTEST_SKIP() << "no CUDA GPU on this machine: " what " test skipped (the code " \
                      "compiled and linked)";                                       \
  } while (0)
