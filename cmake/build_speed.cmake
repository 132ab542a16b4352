# Build speed (issue 28): unity builds and precompiled headers for the
# program libraries, so that `pip install .` and scripts/demo.sh compile
# fewer, larger translation units and parse Boost.Asio/Beast, nlohmann/json
# and CLI11 once per library instead of once per file. Neither changes a
# compile flag: per-file flags (the -O3 of the hot loops) keep those files
# out of the unity sources (CMake leaves any file with COMPILE_OPTIONS out).
# DDPRUN_FAST_BUILD=OFF builds file by file, as before (for A/B timing).
option(DDPRUN_FAST_BUILD "Unity builds and precompiled headers for the ddprun libraries" ON)
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
