// toml_check: the shared helpers of strict TOML reading, and how a diagnostic prints.
#include "cluster/toml_check.hpp"

#include <cctype>
#include <limits>
#include <numeric>

namespace troupe::cluster {

std::string diagnostic::to_string() const {
  std::string out = fmt::format("{}:{}:{}: ", file, line, column);
  if (!path.empty())
    out += path + ": ";
  out += message;
  if (!hint.empty())
    out += " (" + hint + ")";
  return out;
}

namespace toml_check {

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (auto& c : out)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Case-insensitive Levenshtein distance.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  auto x = lowercase(a);
  auto y = lowercase(b);
  std::vector<std::size_t> row(y.size() + 1);
  std::iota(row.begin(), row.end(), std::size_t{0});
  for (std::size_t i = 1; i <= x.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= y.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (x[i - 1] == y[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[y.size()];
}

// The closest candidate to `word`, if it is close enough to be a plausible typo.
std::optional<std::string_view> closest(std::string_view word,
                                        const std::vector<std::string_view>& candidates) {
  std::optional<std::string_view> best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (auto c : candidates) {
    auto d = edit_distance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // Short words are only "close" to a word one edit away; longer ones allow a third of their
  // length (at least two edits).
  auto length = std::max(word.size(), best ? best->size() : 0);
  auto limit = word.size() <= 3 ? std::size_t{1} : std::max<std::size_t>(2, length / 3);
  if (best && best_distance <= limit)
    return best;
  return std::nullopt;
}

std::string join_list(const std::vector<std::string_view>& items) {
  std::string out;
  for (auto item : items) {
    if (!out.empty())
      out += ", ";
    out += item;
  }
  return out;
}

// "did you mean 'x'?" when a candidate is close, otherwise "expected one of: a, b, c".
std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates) {
  if (auto c = closest(word, candidates))
    return fmt::format("did you mean '{}'?", *c);
  return "expected one of: " + join_list(candidates);
}

std::string join_path(std::string_view path, std::string_view key) {
  if (path.empty())
    return std::string(key);
  return fmt::format("{}.{}", path, key);
}

std::string_view type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

bool valid_name(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

} // namespace toml_check

} // namespace troupe::cluster
