// toml_check: the strict TOML reading shared by troupe's configuration files.
//
// Topology files and fault plans are both TOML that a person writes, and both must reject a
// typo with a message that points at it rather than ignore it. This header holds the pieces
// they share: the `checker`, which reads typed values (strings, integers, numbers, sizes,
// durations, choices from a fixed set) out of a parsed table and records a `diagnostic`
// (`file:line:col: key.path: what is wrong (hint)`) for every problem instead of stopping at
// the first, and the helpers behind its messages (case-insensitive did-you-mean, key paths,
// TOML type names). Nothing here knows what a topology or a fault is.
#pragma once

#include "cluster/diagnostic.hpp"
#include "runtime/units.hpp"

#include <caf/timespan.hpp>

#include <toml++/toml.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace troupe::cluster::toml_check {

/// `s` in lowercase (ASCII).
std::string lowercase(std::string_view s);

/// Case-insensitive Levenshtein distance.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The closest candidate to `word`, if it is close enough to be a plausible typo (one edit for
/// words of up to three letters, otherwise a third of the length, at least two).
std::optional<std::string_view> closest(std::string_view word,
                                        const std::vector<std::string_view>& candidates);

/// The items separated by ", ".
std::string join_list(const std::vector<std::string_view>& items);

/// "did you mean 'x'?" when a candidate is close, otherwise "expected one of: a, b, c".
std::string suggestion(std::string_view word, const std::vector<std::string_view>& candidates);

/// `path.key`, or `key` when the path is empty.
std::string join_path(std::string_view path, std::string_view key);

/// "a table", "an integer", ...: the TOML type of a node for a message.
std::string_view type_name(toml::node_type t);

/// True for a non-empty name of letters, digits, '-', '_' and '.'.
bool valid_name(std::string_view s);

/// Reads values out of a parsed TOML table and records a diagnostic for every problem: the
/// typed getters return nullopt (or nullptr) after an error, and also when an optional key is
/// absent; `take_errors` hands the diagnostics back in line order.
class checker {
public:
  explicit checker(std::string file) : file_(std::move(file)) {
  }

  std::vector<diagnostic> take_errors() {
    std::stable_sort(errors_.begin(), errors_.end(), [](const auto& a, const auto& b) {
      return std::tie(a.line, a.column) < std::tie(b.line, b.column);
    });
    return std::move(errors_);
  }

  /// The file name the diagnostics carry.
  const std::string& file() const noexcept {
    return file_;
  }

  bool failed() const noexcept {
    return !errors_.empty();
  }

  void error(const toml::source_region& where, std::string path, std::string message,
             std::string hint = {}) {
    diagnostic d;
    d.file = file_;
    d.line = where.begin.line == 0 ? 1 : where.begin.line;
    d.column = where.begin.column == 0 ? 1 : where.begin.column;
    d.path = std::move(path);
    d.message = std::move(message);
    d.hint = std::move(hint);
    errors_.push_back(std::move(d));
  }

  // Reports every key of `t` that is not in `allowed`.
  void check_keys(const toml::table& t, std::string_view path,
                  const std::vector<std::string_view>& allowed) {
    for (auto&& [k, v] : t) {
      if (std::find(allowed.begin(), allowed.end(), k.str()) != allowed.end())
        continue;
      error(k.source(), join_path(path, k.str()), "unknown key", suggestion(k.str(), allowed));
    }
  }

  void missing(const toml::table& parent, std::string_view path, std::string_view key,
               std::string hint) {
    error(parent.source(), join_path(path, key), "missing required key", std::move(hint));
  }

  /// The node under `key`, or nullptr when it is absent (reported if `required`).
  const toml::node* field(const toml::table& parent, std::string_view path,
                          std::string_view key, bool required, std::string hint_if_missing) {
    auto* n = parent.get(key);
    if (n == nullptr && required)
      missing(parent, path, key, std::move(hint_if_missing));
    return n;
  }

  void wrong_type(const toml::node& n, std::string_view path, std::string_view expected,
                  std::string hint = {}) {
    error(n.source(), std::string(path),
          fmt::format("expected {}, got {}", expected, type_name(n.type())), std::move(hint));
  }

  // A table-valued key. Missing and required: an error; missing and optional: nullptr.
  const toml::table* table(const toml::table& parent, std::string_view path, std::string_view key,
                           bool required, std::string hint_if_missing = {}) {
    auto* n = field(parent, path, key, required, std::move(hint_if_missing));
    auto p = join_path(path, key);
    if (n == nullptr)
      return nullptr;
    if (auto* t = n->as_table())
      return t;
    wrong_type(*n, p, "a table", fmt::format("write a [{}] section", p));
    return nullptr;
  }

  std::optional<std::string> string(const toml::table& parent, std::string_view path,
                                    std::string_view key, bool required,
                                    std::string hint_if_missing = {}) {
    auto* n = field(parent, path, key, required, std::move(hint_if_missing));
    auto p = join_path(path, key);
    if (n == nullptr)
      return std::nullopt;
    if (auto* s = n->as_string()) {
      if (s->get().empty()) {
        error(n->source(), p, "must not be empty");
        return std::nullopt;
      }
      return s->get();
    }
    wrong_type(*n, p, "a string");
    return std::nullopt;
  }

  // A boolean (`true` / `false`); nullopt after an error or when the key is absent.
  std::optional<bool> boolean(const toml::table& parent, std::string_view path,
                              std::string_view key) {
    auto* n = parent.get(key);
    if (n == nullptr)
      return std::nullopt;
    if (auto* b = n->as_boolean())
      return b->get();
    std::string hint = "write true or false";
    if (auto* s = n->as_string(); s != nullptr && (s->get() == "true" || s->get() == "false"))
      hint = fmt::format("write {} without quotes", s->get());
    wrong_type(*n, join_path(path, key), "a boolean", std::move(hint));
    return std::nullopt;
  }

  // An integer in [lo, hi]; nullopt (after an error, or when optional and missing) otherwise.
  std::optional<std::int64_t> integer_node(const toml::node& n, std::string_view path,
                                           std::int64_t lo, std::int64_t hi) {
    auto* i = n.as_integer();
    if (i == nullptr) {
      std::string hint;
      if (auto* s = n.as_string(); s != nullptr && !s->get().empty()
                                   && std::all_of(s->get().begin(), s->get().end(),
                                               [](char ch) { return ch >= '0' && ch <= '9'; }))
        hint = fmt::format("write {} without quotes", s->get());
      else if (n.is_floating_point())
        hint = "a count is a whole number";
      wrong_type(n, path, "an integer", std::move(hint));
      return std::nullopt;
    }
    auto v = i->get();
    if (v < lo) {
      error(n.source(), std::string(path), fmt::format("must be at least {}, got {}", lo, v));
      return std::nullopt;
    }
    if (v > hi) {
      error(n.source(), std::string(path), fmt::format("must be at most {}, got {}", hi, v));
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::int64_t> integer(const toml::table& parent, std::string_view path,
                                      std::string_view key, std::int64_t lo, std::int64_t hi,
                                      bool required, std::string hint_if_missing = {}) {
    auto* n = field(parent, path, key, required, std::move(hint_if_missing));
    if (n == nullptr)
      return std::nullopt;
    return integer_node(*n, join_path(path, key), lo, hi);
  }

  // A number (integer or float) in [lo, hi], or in (lo, hi] when `lo_open`.
  std::optional<double> number(const toml::table& parent, std::string_view path,
                               std::string_view key, double lo, double hi, bool lo_open,
                               std::string range_hint) {
    auto* n = parent.get(key);
    if (n == nullptr)
      return std::nullopt;
    auto p = join_path(path, key);
    double v = 0;
    if (auto* f = n->as_floating_point())
      v = f->get();
    else if (auto* i = n->as_integer())
      v = static_cast<double>(i->get());
    else {
      wrong_type(*n, p, "a number", std::move(range_hint));
      return std::nullopt;
    }
    bool below = lo_open ? !(v > lo) : !(v >= lo);
    if (below || !(v <= hi)) {
      error(n->source(), p,
            fmt::format("must be {} {} and at most {}, got {}", lo_open ? "above" : "at least", lo,
                        hi, v),
            std::move(range_hint));
      return std::nullopt;
    }
    return v;
  }

  std::optional<std::uint64_t> size(const toml::table& parent, std::string_view path,
                                    std::string_view key, bool required,
                                    std::string hint_if_missing = {}) {
    auto* n = field(parent, path, key, required, std::move(hint_if_missing));
    auto p = join_path(path, key);
    if (n == nullptr)
      return std::nullopt;
    if (auto* i = n->as_integer()) {
      if (i->get() < 0) {
        error(n->source(), p, "a size cannot be negative");
        return std::nullopt;
      }
      return static_cast<std::uint64_t>(i->get());
    }
    if (auto* s = n->as_string()) {
      auto r = runtime::parse_size(s->get());
      if (!r) {
        error(n->source(), p, r.error);
        return std::nullopt;
      }
      return r.value;
    }
    wrong_type(*n, p, "a size", "write a string such as \"512GiB\" or an integer byte count");
    return std::nullopt;
  }

  // A duration string; zero is an error unless `allow_zero` (a time since the start, say).
  std::optional<caf::timespan> duration_node(const toml::node& n, std::string_view path,
                                             bool allow_zero = false) {
    if (auto* s = n.as_string()) {
      auto r = runtime::parse_duration(s->get());
      if (!r) {
        error(n.source(), std::string(path), r.error);
        return std::nullopt;
      }
      if (r.value.count() == 0 && !allow_zero) {
        error(n.source(), std::string(path), "must be longer than zero");
        return std::nullopt;
      }
      return r.value;
    }
    std::string hint = "write a string such as \"60s\", \"250ms\" or \"1h30m\"";
    if (auto* i = n.as_integer())
      hint = fmt::format("a duration needs a unit: write \"{}s\" or \"{}ms\"", i->get(), i->get());
    wrong_type(n, path, "a duration", std::move(hint));
    return std::nullopt;
  }

  std::optional<caf::timespan> duration(const toml::table& parent, std::string_view path,
                                        std::string_view key, bool allow_zero = false) {
    auto* n = parent.get(key);
    if (n == nullptr)
      return std::nullopt;
    return duration_node(*n, join_path(path, key), allow_zero);
  }

  // A string from a fixed set, matched case-insensitively; returns the canonical spelling.
  std::optional<std::string_view> choice(const toml::table& parent, std::string_view path,
                                         std::string_view key,
                                         const std::vector<std::string_view>& candidates,
                                         std::string_view what, bool required,
                                         std::string hint_if_missing = {}) {
    auto* n = field(parent, path, key, required, std::move(hint_if_missing));
    auto p = join_path(path, key);
    if (n == nullptr)
      return std::nullopt;
    return choice_node(*n, p, candidates, what);
  }

  std::optional<std::string_view> choice_node(const toml::node& n, std::string_view path,
                                              const std::vector<std::string_view>& candidates,
                                              std::string_view what) {
    auto* s = n.as_string();
    if (s == nullptr) {
      wrong_type(n, path, "a string", "expected one of: " + join_list(candidates));
      return std::nullopt;
    }
    auto lower = lowercase(s->get());
    for (auto c : candidates)
      if (lowercase(c) == lower)
        return c;
    error(n.source(), std::string(path), fmt::format("unknown {} '{}'", what, s->get()),
          suggestion(s->get(), candidates));
    return std::nullopt;
  }

private:
  std::string file_;
  std::vector<diagnostic> errors_;
};

} // namespace troupe::cluster::toml_check
