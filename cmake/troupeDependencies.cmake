# The third-party packages troupe's libraries link publicly, found the same way by troupe's own
# build (cmake/dependencies.cmake includes this file) and by an installed troupe's
# troupeConfig.cmake (which installs this file beside itself). Every target named in the
# exported link interfaces is (re)created here: caf::core, caf::io, caf::openssl,
# OpenSSL::SSL, OpenSSL::Crypto, CapnProto::capnp, fmt::fmt,
# spdlog::spdlog, PkgConfig::XXHASH, tomlplusplus::tomlplusplus, nlohmann_json::nlohmann_json,
# ZLIB::ZLIB, PkgConfig::OPENBLAS, PkgConfig::LIBFABRIC, PkgConfig::LIBNL_ROUTE, Threads::Threads,
# Boost::headers.
#
# Inside find_package(troupe) a missing dependency makes troupe not found (troupe_FOUND FALSE
# with a message naming it) instead of stopping the consumer's configure; in troupe's own build
# it is a fatal error.

if(CMAKE_FIND_PACKAGE_NAME)
  include(CMakeFindDependencyMacro)
  macro(_troupe_dependency)
    find_dependency(${ARGN})
  endmacro()
  macro(_troupe_missing what)
    set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${what}")
    set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
    return()
  endmacro()
else()
  macro(_troupe_dependency)
    find_package(${ARGN} REQUIRED)
  endmacro()
  macro(_troupe_missing what)
    message(FATAL_ERROR "${what}")
  endmacro()
endif()

# CAF 0.17.6 ships neither a CMake package config nor pkg-config.
# The inter-process transport's TLS (runtime/transport.hpp): CAF's OpenSSL module and OpenSSL
# itself (certificate checks, and `troupe certs` makes keys and certificates with its C API).
_troupe_dependency(OpenSSL)
if(NOT TARGET caf::core)
  find_path(CAF_INCLUDE_DIR caf/all.hpp)
  find_library(CAF_CORE_LIBRARY caf_core)
  find_library(CAF_IO_LIBRARY caf_io)
  find_library(CAF_OPENSSL_LIBRARY caf_openssl)
  if(NOT CAF_INCLUDE_DIR OR NOT CAF_CORE_LIBRARY OR NOT CAF_IO_LIBRARY OR NOT CAF_OPENSSL_LIBRARY)
    _troupe_missing("CAF 0.17 not found (caf/all.hpp, libcaf_core, libcaf_io, libcaf_openssl; Debian: libcaf-dev)")
  endif()
  add_library(caf::core UNKNOWN IMPORTED)
  set_target_properties(caf::core PROPERTIES
    IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
  add_library(caf::io UNKNOWN IMPORTED)
  set_target_properties(caf::io PROPERTIES
    IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
    INTERFACE_LINK_LIBRARIES caf::core)
  add_library(caf::openssl UNKNOWN IMPORTED)
  set_target_properties(caf::openssl PROPERTIES
    IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
    INTERFACE_LINK_LIBRARIES "caf::io;OpenSSL::SSL;OpenSSL::Crypto")
endif()

_troupe_dependency(Threads)
# Debian's CapnProtoConfig probes libatomic with check_library_exists, which only works when C
# is enabled (as a C++ probe the declaration of __atomic_load_8 clashes with the builtin).
get_property(_troupe_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
if(NOT "C" IN_LIST _troupe_languages)
  enable_language(C)
endif()
_troupe_dependency(CapnProto)
_troupe_dependency(fmt)
_troupe_dependency(spdlog)
_troupe_dependency(nlohmann_json)
_troupe_dependency(tomlplusplus)
# The recipe's tokenizer: gzip-compressed tokenizer.json.
_troupe_dependency(ZLIB)
# The HTTP entrypoint: Boost.Beast and Boost.Asio, header-only (Boost.System is header-only
# since 1.69).
_troupe_dependency(Boost 1.74)

# xxHash: pkg-config only.
_troupe_dependency(PkgConfig)
if(NOT TARGET PkgConfig::XXHASH)
  pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
  if(NOT XXHASH_FOUND)
    _troupe_missing("xxHash not found through pkg-config (libxxhash; Debian: libxxhash-dev)")
  endif()
endif()

# OpenBLAS (the CPU model's GEMMs): pkg-config only.
if(NOT TARGET PkgConfig::OPENBLAS)
  pkg_check_modules(OPENBLAS QUIET IMPORTED_TARGET openblas)
  if(NOT OPENBLAS_FOUND)
    _troupe_missing("OpenBLAS not found through pkg-config (openblas; Debian: libopenblas-dev)")
  endif()
endif()

# libfabric (the fabric link between processes, ports/fabric_link): pkg-config only.
if(NOT TARGET PkgConfig::LIBFABRIC)
  pkg_check_modules(LIBFABRIC QUIET IMPORTED_TARGET libfabric)
  if(NOT LIBFABRIC_FOUND)
    _troupe_missing("libfabric not found through pkg-config (libfabric; Debian: libfabric-dev)")
  endif()
endif()

# libnl-route (troupe launch's link slowdowns, cluster/launch/net_shape): pkg-config only.
if(NOT TARGET PkgConfig::LIBNL_ROUTE)
  pkg_check_modules(LIBNL_ROUTE QUIET IMPORTED_TARGET libnl-route-3.0)
  if(NOT LIBNL_ROUTE_FOUND)
    _troupe_missing("libnl-route not found through pkg-config (libnl-route-3.0; Debian: libnl-route-3-dev)")
  endif()
endif()
