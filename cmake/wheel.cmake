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
set(ddprun_programs ddprun ddprun-store train)
set_target_properties(${ddprun_programs} PROPERTIES
  INSTALL_RPATH "$ORIGIN/../lib/ddprun"
  BUILD_WITH_INSTALL_RPATH ON)
foreach(t IN LISTS ddprun_programs)
  target_link_options(${t} PRIVATE "LINKER:--disable-new-dtags")
endforeach()

install(TARGETS ${ddprun_programs} RUNTIME DESTINATION "${SKBUILD_SCRIPTS_DIR}")

# CUDA libraries are never bundled (gigabytes; the driver's libcuda must be the
# system's): a wheel built with -C cmake.define.DDPRUN_CUDA=ON uses cuDNN,
# cuBLASLt and NCCL from the system.
install(CODE "
  set(DDPRUN_BUNDLE_EXECUTABLES \"$<TARGET_FILE:ddprun>;$<TARGET_FILE:ddprun-store>;$<TARGET_FILE:train>\")
  set(DDPRUN_BUNDLE_DESTINATION \"${SKBUILD_DATA_DIR}/lib/ddprun\")
  include(\"${PROJECT_SOURCE_DIR}/cmake/bundle_runtime_deps.cmake\")
")
