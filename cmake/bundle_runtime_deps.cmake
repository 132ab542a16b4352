# Install-time script (cmake/wheel.cmake): copies the shared libraries that
# DDPRUN_BUNDLE_EXECUTABLES need, transitively, into DDPRUN_BUNDLE_DESTINATION,
# each under the name the executables ask for (its soname: libopenblas.so.0,
# not the file Debian's alternatives point at). Left out, as auditwheel leaves
# them out: glibc's libraries and the loader, libstdc++ and libgcc_s (every
# system that runs g++-built programs has them), and the CUDA libraries.
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${DDPRUN_BUNDLE_EXECUTABLES}
  RESOLVED_DEPENDENCIES_VAR ddprun_deps
  UNRESOLVED_DEPENDENCIES_VAR ddprun_missing
  CONFLICTING_DEPENDENCIES_PREFIX ddprun_conflict
  PRE_EXCLUDE_REGEXES
    "^ld-linux" "^linux-vdso"
    "^lib(c|m|dl|rt|pthread|util|resolv|nsl|anl|mvec|crypt)\\.so"
    "^libstdc\\+\\+\\.so" "^libgcc_s\\.so"
    "^lib(cuda|cudart|cublas|cublasLt|cudnn.*|nccl|nvrtc.*|nvJitLink|cufft|curand|cusparse|cusolver)\\.so")
if(ddprun_missing)
  message(FATAL_ERROR "ddprun wheel: shared libraries not found: ${ddprun_missing}")
endif()
# The same library found twice (/lib and /usr/lib on a merged-/usr system) is one
# library; two different files under one name is an error.
foreach(name IN LISTS ddprun_conflict_FILENAMES)
  set(real "")
  foreach(path IN LISTS ddprun_conflict_${name})
    file(REAL_PATH "${path}" r)
    list(APPEND real "${r}")
  endforeach()
  list(REMOVE_DUPLICATES real)
  list(LENGTH real n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "ddprun wheel: ${name} resolves to different files: ${real}")
  endif()
  list(GET ddprun_conflict_${name} 0 first)
  list(APPEND ddprun_deps "${first}")
endforeach()

file(MAKE_DIRECTORY "${DDPRUN_BUNDLE_DESTINATION}")
foreach(dep IN LISTS ddprun_deps)
  get_filename_component(name "${dep}" NAME)
  file(REAL_PATH "${dep}" real)
  message(STATUS "Bundling: ${DDPRUN_BUNDLE_DESTINATION}/${name} (${real})")
  file(COPY_FILE "${real}" "${DDPRUN_BUNDLE_DESTINATION}/${name}" ONLY_IF_DIFFERENT)
  file(CHMOD "${DDPRUN_BUNDLE_DESTINATION}/${name}"
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endforeach()
