# The Debian package: `cpack -G DEB` in the build directory writes
# ddprun_<version>_<arch>.deb with what cmake/install.cmake installs, under /usr.
# It bundles no libraries: dpkg-shlibdeps (package dpkg-dev) computes Depends
# from the executables' shared libraries (libdnnl, libopenblas0, libssl3, ...),
# which Debian's own packages provide. Libraries that no package owns (CUDA's,
# cuDNN and NCCL from NVIDIA's tarballs in a CUDA build) are left out of Depends
# (CPack passes --ignore-missing-info). tests/install/run_deb_test.sh builds,
# inspects and runs it.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "drop-in replacement for torchrun, written in C++")
set(CPACK_PACKAGE_DESCRIPTION
  "ddprun starts and watches the workers of a data-parallel PyTorch job with the same flags and
worker environment as torchrun. The package has the programs ddprun, ddprun-store (a
c10d-compatible TCPStore server) and train (a bundled data-parallel trainer), and the
collective runtime for C++ workers (static libraries, headers, CMake package ddprun).")
set(DDPRUN_DEB_MAINTAINER "ddprun maintainers <ddprun-maintainers@users.noreply.github.com>"
  CACHE STRING "Maintainer field of the Debian package")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DDPRUN_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Building against the static runtime needs these (find_package(ddprun)).
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "cmake, g++, libssl-dev, libboost-dev")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
include(CPack)
