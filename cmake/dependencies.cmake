# Third-party dependencies, all from Debian packages (scripts/install-deps.sh).

# What the libraries link publicly (shared with the installed troupeConfig.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/troupeDependencies.cmake)

# Build-only: the CLI's argument parser and the test framework.
find_package(CLI11 REQUIRED)
find_package(doctest REQUIRED)
