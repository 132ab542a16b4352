# Build speed (issue 28): unity builds for the program libraries, so that
# `pip install .` and scripts/demo.sh compile one source per library and parse
# the standard library, Boost.Asio/Beast, nlohmann/json and CLI11 once per
# library instead of once per file (-45% CPU time on 2 cores). No compile
# flag changes: files with their own flags (the -O3 of the hot loops) stay
# out of the unity sources (CMake leaves any file with COMPILE_OPTIONS out).
# Precompiled headers were measured not to pay on top of this (benchmarks.md).
# DDPRUN_FAST_BUILD=OFF builds file by file, as before (for A/B timing, or an
# edit-compile loop: with it ON an edit recompiles the whole library).
# Figures: docs/benchmarks.md, "Build time".
# On by default where a user waits for one clean build (the wheel, the demo,
# any Release build); off in the development builds (scripts/test.sh), where
# edits recompile file by file and ccache keeps per-file objects. The wheel's
# programs are exercised by install_wheel and install_cuda_wheel.
if(SKBUILD OR CMAKE_BUILD_TYPE STREQUAL "Release")
  set(ddprun_fast_default ON)
else()
  set(ddprun_fast_default OFF)
endif()
option(DDPRUN_FAST_BUILD "Unity builds of the ddprun libraries (faster clean builds)"
       ${ddprun_fast_default})
if(NOT DDPRUN_FAST_BUILD)
  return()
endif()

# Files whose file-local names (anonymous namespace) clash with another file
# of the same library: compiled on their own.
set_source_files_properties(
  ${PROJECT_SOURCE_DIR}/src/store/hash_store.cc     # parseCounter, joinKeys
  ${PROJECT_SOURCE_DIR}/src/train/data.cc           # Rng (train::Rng elsewhere), fail
  ${PROJECT_SOURCE_DIR}/src/train/checkpoint.cc     # fail
  DIRECTORY ${PROJECT_SOURCE_DIR}/src
  PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)

set(ddprun_unity_targets ddprun_common ddprun_cluster ddprun_store ddprun_rendezvous ddprun_status
    ddprun_agent ddprun_runtime ddprun_train ddprun_cli)
foreach(tgt IN LISTS ddprun_unity_targets)
  if(TARGET ${tgt})
    set_target_properties(${tgt} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 0)
    # GCC takes the included .cc files for headers and warns that a class
    # there uses a file-local type; in a unity source that is expected.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${tgt} PRIVATE -Wno-subobject-linkage)
    endif()
  endif()
endforeach()
