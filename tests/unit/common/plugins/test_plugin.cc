// Tiny plugins for plugin_check_test.cc, one shared object per variant
// (TEST_PLUGIN_VARIANT, tests/CMakeLists.txt). Every variant's constructor
// creates the file $DDPRUN_TEST_PLUGIN_MARKER names: the tests see whether
// any of the plugin's code ran.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "ddprun/build_id.h"  // generated: cmake/build_id.cmake
#include "ddprun/common/plugin.h"

#define VARIANT_GOOD 1
#define VARIANT_DATA_ENTRY 2  // the entry point is a data object
#define VARIANT_WRONG_ID 3    // the marker has another build's id (kOtherBuild)
#define VARIANT_NO_MARKER 4   // no build id marker at all
#define VARIANT_TABLE_ID 5    // the marker has this build's id, the table another's
#define VARIANT_BAD_MARKER 6  // the marker is the right size but not 32 hex digits

// Another build's id (plugin_check_test.cc has the same).
#define OTHER_BUILD_ID "0123456789abcdef0123456789abcdef"

namespace {

struct Table {
  const char* buildId;
  int (*answer)();
};

int answer() { return 42; }

__attribute__((constructor)) void markLoaded() {
  if (const char* path = std::getenv("DDPRUN_TEST_PLUGIN_MARKER"))
    if (std::FILE* f = std::fopen(path, "w")) std::fclose(f);
}

}  // namespace

#if TEST_PLUGIN_VARIANT == VARIANT_WRONG_ID
DDPRUN_PLUGIN_BUILD_ID(ddprun_test_plugin, OTHER_BUILD_ID);
#elif TEST_PLUGIN_VARIANT == VARIANT_BAD_MARKER
DDPRUN_PLUGIN_BUILD_ID(ddprun_test_plugin, "not a build id: 32 characters...");
#elif TEST_PLUGIN_VARIANT != VARIANT_NO_MARKER
DDPRUN_PLUGIN_BUILD_ID(ddprun_test_plugin, DDPRUN_BUILD_ID);
#endif

#if TEST_PLUGIN_VARIANT == VARIANT_DATA_ENTRY
// Called as a function this would jump into data: SIGSEGV.
extern "C" __attribute__((visibility("default")))
const Table ddprun_test_plugin = {DDPRUN_BUILD_ID, answer};
#else
extern "C" __attribute__((visibility("default"))) const Table* ddprun_test_plugin() {
  static const Table t{TEST_PLUGIN_VARIANT == VARIANT_TABLE_ID ? OTHER_BUILD_ID : DDPRUN_BUILD_ID,
                       answer};
  return &t;
}
#endif
