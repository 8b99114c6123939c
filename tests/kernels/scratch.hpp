// scratch: where the kernels tests write their files. One directory per test process
// (TMPDIR/troupe-test-kernels-PID), removed with everything in it when the process exits, so
// that runs of the suite leave nothing behind.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace troupe::kernels::testing {

inline const std::filesystem::path& scratch_root() {
  struct root {
    std::filesystem::path path = std::filesystem::temp_directory_path()
                                 / ("troupe-test-kernels-" + std::to_string(::getpid()));
    root() { std::filesystem::create_directories(path); }
    ~root() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const root r;
  return r.path;
}

}  // namespace troupe::kernels::testing
