// Sizes and durations as people write them ("100PiB", "1.5TB", "1h30m", "250ms").
//
// Topology files, fault plans and reports all speak of storage capacities and timeouts. Plain
// integers ("112589990684262400", "259200") are unreadable and invite unit mistakes, so troupe
// reads sizes and durations as short strings with a unit, parses them exactly (integer
// arithmetic, no floating-point rounding for decimal fractions), detects overflow, and prints
// them back in the same style. Parse failures are values carrying an error string that a
// person can act on; nothing here throws.
//
// Size syntax: `<number>[ ]<unit>` where number is digits with an optional `.fraction` and
// unit is one of (case-insensitive, so "gib", "GiB" and "GIB" are the same):
//   - none or `B`: bytes (a bare number must be whole: "4096");
//   - `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB`, `P`/`PB`, `E`/`EB`: powers of 1000;
//   - `Ki`/`KiB`, `Mi`/`MiB`, `Gi`/`GiB`, `Ti`/`TiB`, `Pi`/`PiB`, `Ei`/`EiB`: powers of 1024.
// Sizes are always bytes (never bits), which is why case does not matter. A fractional value
// is rounded to the nearest byte ("1.5KiB" is 1536, "0.3KiB" is 307). Leading and trailing
// blanks are ignored.
//
// Duration syntax: one or more `<number><unit>` components with units in strictly decreasing
// order ("1h30m", "2m30s", "1d12h"), each number digits with an optional `.fraction`
// ("2.5s"). Units are lowercase: `ns`, `us`, `ms`, `s`, `m` or `min`, `h`, `d` (24 h).
// A number without a unit is an error (is "60" seconds or milliseconds?). The total is
// rounded to the nearest nanosecond and must fit caf::timespan (about 292 years).
#pragma once

#include <caf/timespan.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::runtime {

/// The outcome of a parse: a value, or an error string saying what is wrong with the input.
template <class T>
struct parsed {
  T value{};
  std::string error; // empty when the parse succeeded

  /// True when the parse succeeded and `value` holds the result.
  bool ok() const noexcept { return error.empty(); }
  explicit operator bool() const noexcept { return ok(); }
};

/// Parses a size (see the header comment for the syntax) into bytes.
/// Returns the byte count, or an error naming the input and what is wrong with it: empty,
/// negative, malformed number, unknown unit (with the accepted units), a fractional byte count
/// without a unit, or a value above 2^64 - 1 bytes.
parsed<std::uint64_t> parse_size(std::string_view text);

/// Parses a duration (see the header comment for the syntax).
/// Returns the span, or an error naming the input and what is wrong with it: empty,
/// negative, missing or unknown unit, units out of order or repeated, or a value that does
/// not fit caf::timespan.
parsed<caf::timespan> parse_duration(std::string_view text);

/// Formats a byte count for people with the largest binary unit that keeps the number ≥ 1:
/// "4096" → "4 KiB", 1.5 × 2^30 → "1.5 GiB", 100 × 2^50 → "100 PiB", 17 → "17 B".
/// At most two decimals are printed (trailing zeros dropped), so the text is exact only
/// when the value is a round multiple; parse_size reads it back.
std::string format_bytes(std::uint64_t bytes);

/// Formats a duration for people, in a form parse_duration reads back exactly:
/// below one second as a decimal of the largest fitting unit ("250ms", "1.5us", "800ns");
/// otherwise as days, hours, minutes and seconds with zero components dropped and any
/// sub-second remainder as a decimal on the seconds ("3d", "1h30m", "2.5s", "1m0.25s").
/// Zero is "0s"; a negative span gets a leading '-' (which parse_duration rejects).
std::string format_duration(caf::timespan d);

} // namespace troupe::runtime
