#pragma once
// Regular expressions (the ECMAScript subset JSON Schema `pattern` uses) compiled to automata.
//
// A pattern is parsed into a small syntax tree over Unicode code points and emitted into an
// nfa_builder as UTF-8 byte sequences, either raw (a regex constraint on the whole output) or as
// the inside of a JSON string (characters JSON must escape are emitted in their canonical
// escaped spelling, docs/structured-output.md). Supported: literals, `.`, classes `[...]` /
// `[^...]` with ranges, `\d \D \w \W \s \S`, escapes `\n \r \t \f \v \0 \xHH \uHHHH \u{H...}`
// and escaped punctuation, groups `(...)` `(?:...)` `(?<name>...)`, alternation, quantifiers
// `* + ? {m} {m,} {m,n}` (lazy forms match the same strings), `^` / `$` at the ends of a
// top-level alternative. Anything else (lookaround, backreferences, `\b`, `\p{...}`, flags) is
// an error that names the construct and its offset, never an approximation.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

struct regex_error {
  std::string message;
  std::size_t offset = 0;  // byte offset in the pattern
};

// Inclusive code point ranges, sorted and disjoint, surrogates excluded.
using code_point_ranges = std::vector<std::pair<std::uint32_t, std::uint32_t>>;

// How a Lark terminal's /pattern/flags is read (lark.hpp): Python's `re` where it differs from
// ECMAScript within the subset (`.` excludes only "\n", `{,n}` is {0,n}, a `]` first in a class is
// a literal), the flags `i` and `s`, and what a terminal cannot mean refused (anchors, lazy
// quantifiers: Lark's lexer stops a lazy match early, which a set of strings cannot express).
struct lark_regex {
  bool ignore_case = false;  // `i`: ASCII letters match either case; other letters are refused
  bool dot_all = false;      // `s`: `.` matches "\n" too
};

class regex {
 public:
  // Parses `pattern`. With `search` the pattern may match anywhere in the string unless anchored
  // (JSON Schema `pattern`); without it the whole string must match (a regex constraint).
  static std::variant<regex, regex_error> parse(std::string_view pattern, bool search, const limits& lim = {});
  // A Lark terminal's pattern (the whole lexeme matches it).
  static std::variant<regex, regex_error> parse_lark(std::string_view pattern, const lark_regex& flags,
                                                     const limits& lim = {});

  // Emits the language into `b` from `from` to `to`; with `json_string` the characters are
  // spelled as in a canonical JSON string body (without the quotes). Throws build_error when
  // the NFA grows past the limits.
  void emit(nfa_builder& b, std::uint32_t from, std::uint32_t to, bool json_string) const;

  struct node;
  regex(regex&&) noexcept;
  regex& operator=(regex&&) noexcept;
  ~regex();

 private:
  explicit regex(std::unique_ptr<node> root);
  std::unique_ptr<node> root_;
};

// A grammar of one rule: the whole output matches `pattern`.
std::variant<grammar, regex_error> compile_regex(std::string_view pattern, const limits& lim = {});

// Emits the code points of `set` (raw UTF-8, or as a JSON string body's characters).
void emit_code_points(nfa_builder& b, std::uint32_t from, std::uint32_t to, const code_point_ranges& set,
                      bool json_string);

// Sorted, merged ranges without surrogates; the code points not in `r` (surrogates excluded).
code_point_ranges normalize_code_points(code_point_ranges r);
code_point_ranges complement_code_points(const code_point_ranges& r);

// All code points (surrogates excluded).
code_point_ranges any_code_point();

}  // namespace troupe::recipe::grammar
