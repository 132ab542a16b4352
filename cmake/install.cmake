# `cmake --install` (and the Debian package, which packs the same files):
#   bin/      ddprun, ddprun-store, train (not the bench programs of src/bench)
#   lib/      ddprun_common, ddprun_store, ddprun_runtime and the CMake package
#             config, so a user's own trainer can find_package(ddprun) and link
#             ddprun::runtime
#   include/  the public headers of those three libraries and version.h only;
#             the agent, cli, rendezvous and train headers belong to libraries
#             that are not installed. runtime/cuda_check.h is not installed
#             either: it is the CUDA error check of ddprun's own .cu files and
#             needs the toolkit's headers, while the runtime's API (cuda.h) does not.
# tests/install/run_install_test.sh checks the header set and compiles each
# installed header on its own.
include(CMakePackageConfigHelpers)

install(TARGETS ddprun ddprun-store train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# train's and the runtime's CUDA parts (plugins, loaded at run time from
# <bin>/../lib/ddprun: common/plugin.h), on the system's CUDA libraries.
if(DDPRUN_HAVE_CUDA)
  install(TARGETS ddprun_runtime_cuda ddprun_train_cuda LIBRARY DESTINATION lib/ddprun)
endif()

install(FILES ${PROJECT_BINARY_DIR}/include/ddprun/version.h  # generated: cmake/version.cmake
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ddprun/common
                  ${PROJECT_SOURCE_DIR}/include/ddprun/store
                  ${PROJECT_SOURCE_DIR}/include/ddprun/runtime
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun
  FILES_MATCHING PATTERN "*.h" PATTERN "cuda_check.h" EXCLUDE)

# The runtime for users' own trainers: find_package(ddprun) + ddprun::runtime.
set_target_properties(ddprun_common PROPERTIES EXPORT_NAME common)
set_target_properties(ddprun_store PROPERTIES EXPORT_NAME store)
set_target_properties(ddprun_runtime PROPERTIES EXPORT_NAME runtime)
install(TARGETS ddprun_common ddprun_store ddprun_runtime EXPORT ddprunTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT ddprunTargets NAMESPACE ddprun:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ddprunConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ddprunConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddprunConfig.cmake ${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/ddprun)
