// diagnostic: one problem found in a file a person wrote (a topology, a fault plan).
//
// troupe's configuration files are validated strictly and every problem is reported at once,
// each pointing at the place to fix: `file:line:col: key.path: what is wrong (hint)`. This is
// that record, shared by every loader (see cluster/toml_check.hpp for the reading helpers).
#pragma once

#include <cstdint>
#include <string>

namespace troupe::cluster {

/// One problem found in a file. `line` and `column` are 1-based; `path` is the key path
/// (`pool[1].instances.min`), empty for syntax errors.
struct diagnostic {
  std::string file;
  std::uint32_t line = 0;
  std::uint32_t column = 0;
  std::string path;
  std::string message;
  std::string hint; // may be empty

  /// `file:line:col: path: message (hint)`, leaving out an empty path or hint.
  std::string to_string() const;
};

} // namespace troupe::cluster
