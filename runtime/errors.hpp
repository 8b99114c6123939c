// The error codes of troupe's runtime, as a CAF error category.
//
// Expected failures travel as caf::error values: in replies, in exit reasons that a parent
// supervisor sees, and in reports. This category gives them stable codes and readable text
// (`actor_system::render(err)` prints "troupe: restart_intensity_exceeded (...)").
#pragma once

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>

#include <cstdint>
#include <string>

namespace troupe::runtime {

/// The category atom of troupe runtime errors.
constexpr caf::atom_value error_category = caf::atom("troupe");

enum class errc : std::uint8_t {
  /// A supervisor's children restarted more often than its intensity allows in its period.
  restart_intensity_exceeded = 1,
  /// A child's start function returned no actor.
  child_start_failed,
  /// A child id is already in use by the supervisor.
  duplicate_child,
  /// No child with that id.
  unknown_child,
  /// A store has no room for the object.
  store_full,
  /// The store has no object under that key.
  not_found,
  /// The argument of a request is invalid (its context says why).
  invalid_argument,
  /// No instance (or other resource) can take the request now.
  unavailable,
  /// A stored object failed its integrity check (header or payload checksum, size, key); the
  /// store dropped it and will not serve it again.
  store_corrupt,
};

/// The name of an error code, e.g. "store_full".
std::string to_string(errc code);

/// Makes an error of troupe's category; `context` is shown in parentheses when rendered.
caf::error make_error(errc code);
caf::error make_error(errc code, std::string context);

/// True when `err` is of troupe's category with code `code`.
bool is(const caf::error& err, errc code);

} // namespace troupe::runtime
