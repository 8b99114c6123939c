// Internal to recipe/grammar/: the repetition bounds of the regex and EBNF parsers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::recipe::grammar::detail {

/// The decimal digits of `text` from `pos` on, as a number saturated at 2^30 (far above any
/// bound a parser accepts, so a huge bound is refused by its limit check, never wrapped);
/// `pos` moves past them. Nullopt, `pos` unchanged, when no digit is there.
inline std::optional<std::uint32_t> read_decimal(std::string_view text, std::size_t& pos) {
  const std::size_t start = pos;
  std::uint64_t v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    v = std::min<std::uint64_t>(v * 10 + static_cast<std::uint64_t>(text[pos] - '0'), 1u << 30);
    ++pos;
  }
  if (pos == start) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

}  // namespace troupe::recipe::grammar::detail
