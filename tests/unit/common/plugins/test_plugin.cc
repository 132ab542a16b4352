// Tiny plugins for plugin_check_test.cc, one shared object per variant
// (TEST_PLUGIN_VARIANT, tests/CMakeLists.txt). Every variant's constructor
// creates the file $DDPRUN_TEST_PLUGIN_MARKER names: the tests see whether
// any of the plugin's code ran.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ddprun/common/plugin.h"

#define VARIANT_GOOD 1
#define VARIANT_DATA_ENTRY 2  // the entry point is a data object
#define VARIANT_WRONG_ABI 3   // the ABI marker says 8 (the tests want 7)
#define VARIANT_NO_MARKER 4   // no ABI marker at all
#define VARIANT_TABLE_ABI 5   // the marker says 7, the table 9

namespace {

struct Table {
  uint32_t abi;
  int (*answer)();
};

int answer() { return 42; }

__attribute__((constructor)) void markLoaded() {
  if (const char* path = std::getenv("DDPRUN_TEST_PLUGIN_MARKER"))
    if (std::FILE* f = std::fopen(path, "w")) std::fclose(f);
}

}  // namespace

#if TEST_PLUGIN_VARIANT == VARIANT_WRONG_ABI
DDPRUN_PLUGIN_ABI(ddprun_test_plugin, 8);
#elif TEST_PLUGIN_VARIANT != VARIANT_NO_MARKER
DDPRUN_PLUGIN_ABI(ddprun_test_plugin, 7);
#endif

#if TEST_PLUGIN_VARIANT == VARIANT_DATA_ENTRY
// Called as a function this would jump into data: SIGSEGV.
extern "C" __attribute__((visibility("default")))
const Table ddprun_test_plugin = {7, answer};
#else
extern "C" __attribute__((visibility("default"))) const Table* ddprun_test_plugin() {
  static const Table t{TEST_PLUGIN_VARIANT == VARIANT_TABLE_ABI ? 9u : 7u, answer};
  return &t;
}
#endif
