// Sizes and durations as people write them: parsing and formatting.
#include "runtime/units.hpp"

#include <array>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace troupe::runtime {

namespace {

using u128 = unsigned __int128;

constexpr std::string_view size_examples = "e.g. 512GiB, 1.5TB or 4096";
constexpr std::string_view size_units =
  "use B, KB/MB/GB/TB/PB/EB for powers of 1000 or KiB/MiB/GiB/TiB/PiB/EiB for powers of 1024";
constexpr std::string_view duration_units = "use ns, us, ms, s, m or min, h, d";

bool is_blank(char c) {
  return c == ' ' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back()))
    s.remove_suffix(1);
  return s;
}

std::string quoted(std::string_view s) {
  std::string out = "'";
  out += s;
  out += '\'';
  return out;
}

// A decimal number as written: whole part and fraction digits, both exact.
struct decimal {
  std::uint64_t whole = 0;
  std::uint64_t fraction = 0; // the digits after the point, as an integer
  int fraction_digits = 0;
  bool has_point = false;
};

enum class number_status { ok, no_digits, too_long };

// Reads a decimal number from the front of `s` and removes it from `s`.
number_status read_decimal(std::string_view& s, decimal& out) {
  std::size_t i = 0;
  bool any_digit = false;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    auto digit = static_cast<std::uint64_t>(s[i] - '0');
    if (out.whole > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
      return number_status::too_long;
    out.whole = out.whole * 10 + digit;
    any_digit = true;
    ++i;
  }
  if (i < s.size() && s[i] == '.') {
    out.has_point = true;
    ++i;
    bool any_fraction = false;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      if (out.fraction_digits == 18)
        return number_status::too_long;
      out.fraction = out.fraction * 10 + static_cast<std::uint64_t>(s[i] - '0');
      ++out.fraction_digits;
      any_fraction = true;
      ++i;
    }
    if (!any_fraction)
      return number_status::no_digits; // "5." or "."
  }
  if (!any_digit && !out.has_point)
    return number_status::no_digits;
  s.remove_prefix(i);
  return number_status::ok;
}

u128 pow10(int n) {
  u128 r = 1;
  for (int i = 0; i < n; ++i)
    r *= 10;
  return r;
}

// number × multiplier, the fractional part rounded to the nearest unit (half up).
u128 scale(const decimal& d, std::uint64_t multiplier) {
  u128 whole = static_cast<u128>(d.whole) * multiplier;
  if (d.fraction_digits == 0)
    return whole;
  u128 denom = pow10(d.fraction_digits);
  u128 frac = static_cast<u128>(d.fraction) * multiplier;
  return whole + (frac + denom / 2) / denom;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The multiplier of a size unit (already lowercased), or 0 when the unit is unknown.
std::uint64_t size_multiplier(std::string_view unit) {
  if (unit.empty() || unit == "b")
    return 1;
  constexpr std::string_view prefixes = "kmgtpe";
  auto pos = prefixes.find(unit[0]);
  if (pos == std::string_view::npos)
    return 0;
  auto rest = unit.substr(1);
  std::uint64_t m = 1;
  if (rest.empty() || rest == "b") {
    for (std::size_t i = 0; i <= pos; ++i)
      m *= 1000;
    return m;
  }
  if (rest == "i" || rest == "ib")
    return std::uint64_t{1} << (10 * (pos + 1));
  return 0;
}

struct duration_unit {
  std::string_view name;
  std::int64_t nanoseconds;
  int rank; // larger units have larger ranks; m and min share one
};

constexpr std::array<duration_unit, 8> duration_table{{
  {"ns", 1, 0},
  {"us", 1'000, 1},
  {"ms", 1'000'000, 2},
  {"s", 1'000'000'000, 3},
  {"m", 60'000'000'000, 4},
  {"min", 60'000'000'000, 4},
  {"h", 3'600'000'000'000, 5},
  {"d", 86'400'000'000'000, 6},
}};

const duration_unit* find_duration_unit(std::string_view name) {
  for (const auto& u : duration_table)
    if (u.name == name)
      return &u;
  return nullptr;
}

// Appends the digits of `fraction` (of `width` digits, zero-padded) without trailing zeros.
void append_fraction(std::string& out, std::uint64_t fraction, int width) {
  if (fraction == 0)
    return;
  std::string digits = std::to_string(fraction);
  digits.insert(0, static_cast<std::size_t>(width) - digits.size(), '0');
  while (!digits.empty() && digits.back() == '0')
    digits.pop_back();
  out += '.';
  out += digits;
}

} // namespace

parsed<std::uint64_t> parse_size(std::string_view text) {
  parsed<std::uint64_t> result;
  auto s = trim(text);
  if (s.empty()) {
    result.error = "empty size: expected a number with an optional unit, ";
    result.error += size_examples;
    return result;
  }
  if (s.front() == '-') {
    result.error = quoted(text) + " is negative: a size cannot be negative";
    return result;
  }
  if (s.front() == '+')
    s.remove_prefix(1);
  decimal number;
  auto rest = s;
  switch (read_decimal(rest, number)) {
    case number_status::no_digits:
      result.error = quoted(text) + " is not a size: expected a number with an optional unit, ";
      result.error += size_examples;
      return result;
    case number_status::too_long:
      result.error = quoted(text) + " is too large or has too many digits";
      return result;
    case number_status::ok:
      break;
  }
  auto unit = trim(rest);
  auto multiplier = size_multiplier(lowercase(unit));
  if (multiplier == 0) {
    result.error = quoted(text) + " has an unknown size unit " + quoted(unit) + " (";
    result.error += size_units;
    result.error += ')';
    return result;
  }
  if (multiplier == 1 && number.fraction != 0) {
    result.error = quoted(text)
                   + " is a fractional number of bytes: use a whole number or a larger unit "
                     "(e.g. 4.5KiB)";
    return result;
  }
  auto bytes = scale(number, multiplier);
  if (bytes > std::numeric_limits<std::uint64_t>::max()) {
    result.error = quoted(text) + " is too large: the largest size is 16EiB (2^64 - 1 bytes)";
    return result;
  }
  result.value = static_cast<std::uint64_t>(bytes);
  return result;
}

parsed<caf::timespan> parse_duration(std::string_view text) {
  parsed<caf::timespan> result;
  auto s = trim(text);
  if (s.empty()) {
    result.error = "empty duration: expected a number with a unit, e.g. 60s, 250ms or 1h30m";
    return result;
  }
  if (s.front() == '-') {
    result.error = quoted(text) + " is negative: a duration cannot be negative";
    return result;
  }
  u128 total = 0;
  int last_rank = 7; // above every unit
  while (!s.empty()) {
    decimal number;
    switch (read_decimal(s, number)) {
      case number_status::no_digits:
        result.error = quoted(text)
                       + " is not a duration: expected numbers with units, e.g. 60s, 250ms or "
                         "1h30m";
        return result;
      case number_status::too_long:
        result.error = quoted(text) + " is too large or has too many digits";
        return result;
      case number_status::ok:
        break;
    }
    std::size_t n = 0;
    while (n < s.size() && std::isalpha(static_cast<unsigned char>(s[n])))
      ++n;
    auto unit_name = s.substr(0, n);
    s.remove_prefix(n);
    s = trim(s);
    if (unit_name.empty()) {
      result.error = quoted(text) + " has a number without a unit: write e.g. ";
      auto digits = std::to_string(number.whole);
      result.error += digits + "s or " + digits + "ms";
      return result;
    }
    const auto* unit = find_duration_unit(unit_name);
    if (unit == nullptr) {
      result.error = quoted(text) + " has an unknown duration unit " + quoted(unit_name) + " (";
      auto lower = lowercase(unit_name);
      if (lower != unit_name && find_duration_unit(lower) != nullptr)
        result.error += "units are lowercase: did you mean " + quoted(lower) + "?";
      else
        result.error += duration_units;
      result.error += ')';
      return result;
    }
    if (unit->rank >= last_rank) {
      result.error = quoted(text)
                     + " has units out of order: write each unit once, larger units first "
                       "(e.g. 1h30m)";
      return result;
    }
    last_rank = unit->rank;
    total += scale(number, static_cast<std::uint64_t>(unit->nanoseconds));
    if (total > static_cast<u128>(std::numeric_limits<caf::timespan::rep>::max())) {
      result.error = quoted(text) + " is too large: the longest duration is about 292 years";
      return result;
    }
  }
  result.value = caf::timespan{static_cast<caf::timespan::rep>(total)};
  return result;
}

std::string format_bytes(std::uint64_t bytes) {
  constexpr std::array<std::string_view, 7> names{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t k = 0;
  while (k + 1 < names.size() && bytes >= (std::uint64_t{1} << (10 * (k + 1))))
    ++k;
  if (k == 0)
    return std::to_string(bytes) + " B";
  auto unit = static_cast<u128>(std::uint64_t{1} << (10 * k));
  // Hundredths of the unit, rounded half up; a value that rounds up to 1024 moves one unit on.
  auto hundredths = (static_cast<u128>(bytes) * 100 + unit / 2) / unit;
  if (hundredths >= 1024 * 100 && k + 1 < names.size()) {
    ++k;
    unit <<= 10;
    hundredths = (static_cast<u128>(bytes) * 100 + unit / 2) / unit;
  }
  auto whole = static_cast<std::uint64_t>(hundredths / 100);
  auto fraction = static_cast<std::uint64_t>(hundredths % 100);
  std::string out = std::to_string(whole);
  append_fraction(out, fraction, 2);
  out += ' ';
  out += names[k];
  return out;
}

std::string format_duration(caf::timespan d) {
  auto n = d.count();
  if (n < 0) {
    if (n == std::numeric_limits<caf::timespan::rep>::min())
      n += 1; // -(min) does not fit; one nanosecond less is as good for people
    return "-" + format_duration(caf::timespan{-n});
  }
  auto u = static_cast<std::uint64_t>(n);
  if (u == 0)
    return "0s";
  std::string out;
  if (u < 1'000)
    return std::to_string(u) + "ns";
  if (u < 1'000'000) {
    out = std::to_string(u / 1'000);
    append_fraction(out, u % 1'000, 3);
    return out + "us";
  }
  if (u < 1'000'000'000) {
    out = std::to_string(u / 1'000'000);
    append_fraction(out, u % 1'000'000, 6);
    return out + "ms";
  }
  constexpr std::uint64_t second = 1'000'000'000;
  auto days = u / (86'400 * second);
  u %= 86'400 * second;
  auto hours = u / (3'600 * second);
  u %= 3'600 * second;
  auto minutes = u / (60 * second);
  u %= 60 * second;
  if (days != 0)
    out += std::to_string(days) + "d";
  if (hours != 0)
    out += std::to_string(hours) + "h";
  if (minutes != 0)
    out += std::to_string(minutes) + "m";
  if (u != 0) {
    out += std::to_string(u / second);
    append_fraction(out, u % second, 9);
    out += "s";
  }
  return out;
}

} // namespace troupe::runtime
