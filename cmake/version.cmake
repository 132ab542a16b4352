# The generated version header, <build>/include/ddprun/version.h, from
# include/ddprun/version.h.in: the version (project(ddprun VERSION ...), the one
# source of truth), the variant ("cpu", or "cu13" when the CUDA backend is
# built: the CUDA wheel's local version <x.y.z>+cu13) and the GPU code compiled
# (CMAKE_CUDA_ARCHITECTURES). `ddprun --version` prints them; cmake --install
# installs the header (cmake/install.cmake). Included after add_subdirectory(src).

# CMAKE_CUDA_ARCHITECTURES as a person reads it: "80 90" ->
# "sm_80 sm_90 + PTX compute_80 compute_90". An entry NN gives both machine code
# (sm_NN) and PTX (compute_NN), NN-real only the first, NN-virtual only the
# second; "all"/"all-major" are every (major) architecture of this nvcc as
# machine code plus PTX for the newest, "native" the GPUs found at configure time.
function(ddprun_describe_cuda_architectures out)
  set(archs ${CMAKE_CUDA_ARCHITECTURES})
  if(archs STREQUAL "all" OR archs STREQUAL "all-major")
    if(archs STREQUAL "all")
      set(archs ${CMAKE_CUDA_ARCHITECTURES_ALL})
    else()
      set(archs ${CMAKE_CUDA_ARCHITECTURES_ALL_MAJOR})
    endif()
    list(POP_BACK archs newest)
    list(TRANSFORM archs APPEND "-real")
    list(APPEND archs ${newest})
  elseif(archs STREQUAL "native")
    set(archs ${CMAKE_CUDA_ARCHITECTURES_NATIVE})
  endif()
  set(sass "")
  set(ptx "")
  foreach(a IN LISTS archs)
    if(a MATCHES "^([0-9]+[a-z]?)(-real|-virtual)?$")
      if(NOT CMAKE_MATCH_2 STREQUAL "-virtual")
        list(APPEND sass "sm_${CMAKE_MATCH_1}")
      endif()
      if(NOT CMAKE_MATCH_2 STREQUAL "-real")
        list(APPEND ptx "compute_${CMAKE_MATCH_1}")
      endif()
    else()
      list(APPEND sass "${a}")  # a spelling this function does not know: as given
    endif()
  endforeach()
  list(JOIN sass " " text)
  if(ptx)
    list(JOIN ptx " " ptx_text)
    string(APPEND text " + PTX ${ptx_text}")
  endif()
  string(STRIP "${text}" text)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

if(DDPRUN_HAVE_CUDA)
  set(DDPRUN_VARIANT "cu${CUDAToolkit_VERSION_MAJOR}")
  ddprun_describe_cuda_architectures(DDPRUN_CUDA_ARCHS_TEXT)
  string(CONCAT DDPRUN_VERSION_DESCRIPTION "${PROJECT_VERSION}+${DDPRUN_VARIANT} (CUDA "
         "${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}; GPU code: ${DDPRUN_CUDA_ARCHS_TEXT})")
else()
  set(DDPRUN_VARIANT "cpu")
  set(DDPRUN_CUDA_ARCHS_TEXT "")
  set(DDPRUN_VERSION_DESCRIPTION "${PROJECT_VERSION} (cpu)")
endif()
message(STATUS "ddprun: version ${DDPRUN_VERSION_DESCRIPTION}")

# configure_file rewrites the header only when its text changes, so a
# reconfigure with the same variant recompiles nothing.
set(DDPRUN_GENERATED_INCLUDE_DIR "${PROJECT_BINARY_DIR}/include")
configure_file("${PROJECT_SOURCE_DIR}/include/ddprun/version.h.in"
               "${DDPRUN_GENERATED_INCLUDE_DIR}/ddprun/version.h" @ONLY)
# BEFORE: ahead of the source tree's include/ (which no longer has a
# version.h, but an old checkout's stale copy must never win).
target_include_directories(ddprun_common BEFORE PUBLIC
  $<BUILD_INTERFACE:${DDPRUN_GENERATED_INCLUDE_DIR}>)
