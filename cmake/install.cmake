# `cmake --install` (and the Debian package, which packs the same files):
#   bin/      ddprun, ddprun-store, train (not the bench programs of src/bench)
#   lib/      ddprun_common, ddprun_store, ddprun_runtime and the CMake package
#             config, so a user's own trainer can find_package(ddprun) and link
#             ddprun::runtime
#   include/  the public API only (ddprun_public_headers below): the runtime's
#             headers, the store's (ProcessGroup::create takes a store::Store;
#             TcpStore, the server, PrefixStore, HashStore, the secret), the
#             two common headers they include (error.h: the exception types
#             every API throws; clock.h: TcpStore's deadlines), and version.h.
#             Not the internal helpers of include/ddprun/common (plugin.h, fd.h,
#             env.h, log.h, net.h, strings.h, ...: ddprun's own plumbing, which
#             no public header includes), nor store/log_limiter.h (the server's
#             log rate limit), nor runtime/cuda_check.h (the CUDA error check of
#             ddprun's own .cu files; it needs the toolkit's headers, while the
#             runtime's API, cuda.h, does not), nor the generated
#             ddprun/build_id.h (the plugins' build id: this build's, internal).
#             The agent, cli, rendezvous and train headers belong to libraries
#             that are not installed.
# tests/install/run_install_test.sh checks the header set (exactly this list)
# and compiles each installed header on its own.
include(CMakePackageConfigHelpers)

install(TARGETS ddprun ddprun-store train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# train's and the runtime's CUDA parts (plugins, loaded at run time from
# <bin>/../lib/ddprun: common/plugin.h), on the system's CUDA libraries.
if(DDPRUN_HAVE_CUDA)
  install(TARGETS ddprun_runtime_cuda ddprun_train_cuda LIBRARY DESTINATION lib/ddprun)
endif()

install(FILES ${PROJECT_BINARY_DIR}/include/ddprun/version.h  # generated: cmake/version.cmake
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun)
set(ddprun_public_headers
  common/clock.h common/error.h
  store/auth.h store/hash_store.h store/prefix_store.h store/reconnect.h store/server_state.h
  store/store.h store/tcp_store.h store/tcp_store_server.h store/wire.h
  runtime/collectives.h runtime/cuda.h runtime/process_group.h runtime/reducer.h
  runtime/sampler.h runtime/types.h)
foreach(h IN LISTS ddprun_public_headers)
  get_filename_component(dir ${h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/include/ddprun/${h}
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ddprun/${dir})
endforeach()

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
