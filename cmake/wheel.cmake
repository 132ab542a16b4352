# The wheel (pip install / pip wheel; scikit-build-core defines SKBUILD and the
# SKBUILD_*_DIR staging directories). Laid out for a Python environment <env>:
#   <env>/bin/ddprun, ddprun-store, train   (the wheel's scripts: real ELF
#       executables, no Python shim, so ddprun finds <env>/bin/python3 beside
#       itself and adds no interpreter start to a launch)
#   <env>/lib/ddprun/*.so.*                 (the wheel's data: the shared
#       libraries they need beyond glibc and the GCC runtime, bundled as
#       auditwheel does: oneDNN, OpenBLAS, libgomp, libgfortran, OpenSSL's
#       libcrypto, zlib, ...)
# The executables carry RPATH (not RUNPATH: --disable-new-dtags) $ORIGIN/../lib/ddprun,
# which the dynamic loader applies to the bundled libraries' own dependencies too
# (libdnnl -> libgomp, libopenblas -> libgfortran), so no library needs patching.
# No headers, static libraries or CMake package: those come with cmake --install.
# The wheel's metadata (version, dependencies) and its code must be one
# variant: pyproject.toml's backend (python/backend/ddprun_build.py) names the
# one the metadata says in DDPRUN_WHEEL_VARIANT, cmake/version.cmake the one
# this build is (cpu, or cu<CUDA major> when the CUDA backend is built).
if(DEFINED ENV{DDPRUN_WHEEL_VARIANT} AND NOT "$ENV{DDPRUN_WHEEL_VARIANT}" STREQUAL DDPRUN_VARIANT)
  message(FATAL_ERROR "the wheel's metadata is the $ENV{DDPRUN_WHEEL_VARIANT} variant but this "
                      "build is ${DDPRUN_VARIANT} (the CUDA variant is built with "
                      "-C ddprun.cuda=true, with the CUDA 13 toolkit)")
endif()

set(ddprun_programs ddprun ddprun-store train)
set_target_properties(${ddprun_programs} PROPERTIES
  INSTALL_RPATH "$ORIGIN/../lib/ddprun"
  BUILD_WITH_INSTALL_RPATH ON)
foreach(t IN LISTS ddprun_programs)
  target_link_options(${t} PRIVATE "LINKER:--disable-new-dtags")
endforeach()

install(TARGETS ${ddprun_programs} RUNTIME DESTINATION "${SKBUILD_SCRIPTS_DIR}")

# The CUDA variant (-C ddprun.cuda=true): the two plugins go into the Python
# package, <env>/lib/python3.X/site-packages/ddprun/lib (where the programs
# look: common/plugin.h), and find cudart, cuBLAS(Lt), cuDNN and NCCL in
# NVIDIA's PyPI packages beside it (site-packages/nvidia/*/lib, the wheel's
# dependencies) through RPATH (not RUNPATH: it also covers those libraries'
# own dependencies and wins over LD_LIBRARY_PATH), never through system
# paths. CUDA libraries are never bundled (gigabytes; libcuda must be the
# driver's own).
if(DDPRUN_HAVE_CUDA)
  set(ddprun_nvidia "$ORIGIN/../../nvidia")
  set_target_properties(ddprun_runtime_cuda ddprun_train_cuda PROPERTIES
    INSTALL_RPATH "${ddprun_nvidia}/cu13/lib:${ddprun_nvidia}/cudnn/lib:${ddprun_nvidia}/nccl/lib")
  install(TARGETS ddprun_runtime_cuda ddprun_train_cuda
    LIBRARY DESTINATION "${SKBUILD_PLATLIB_DIR}/ddprun/lib")
endif()
install(CODE "
  set(DDPRUN_BUNDLE_EXECUTABLES \"$<TARGET_FILE:ddprun>;$<TARGET_FILE:ddprun-store>;$<TARGET_FILE:train>\")
  set(DDPRUN_BUNDLE_DESTINATION \"${SKBUILD_DATA_DIR}/lib/ddprun\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/bundle_runtime_deps.cmake\")
")
