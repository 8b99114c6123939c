// TROUPE_CHECK: the invariant guard of troupe.
//
// Expected failures are values (caf::error, caf::expected, status enums); a broken invariant
// is a bug, and continuing would corrupt state silently. TROUPE_CHECK stops the process with
// the condition, the message and the source location, so the bug is seen where it happens.
#pragma once

#include <string_view>

namespace troupe::runtime::detail {

/// Prints "file:line: invariant violated: cond: msg" to stderr and aborts. Never returns.
[[noreturn]] void check_failed(const char* cond, std::string_view msg, const char* file,
                               int line);

} // namespace troupe::runtime::detail

/// Aborts with a diagnostic when `cond` is false. `msg` is anything convertible to
/// std::string_view; it is evaluated only on failure.
#define TROUPE_CHECK(cond, msg)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::troupe::runtime::detail::check_failed(#cond, (msg), __FILE__, __LINE__);             \
  } while (false)
