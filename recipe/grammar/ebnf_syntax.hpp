#pragma once
// What the two grammar dialects (GBNF, ebnf.hpp; Lark, lark.hpp) share: the syntax tree their
// parsers build, a text scanner (positions, UTF-8, escapes, messages), and the compiler from a
// list of rule definitions to the grammar representation (reference checks, inlining of small
// non-recursive rules, emission into NFAs, the left-recursion check, pruning). Internal to
// recipe/grammar/.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/grammar.hpp"
#include "recipe/grammar/regex.hpp"

namespace troupe::recipe::grammar::syntax {

inline constexpr std::uint32_t unbounded = 0xffffffffu;
inline constexpr int max_nesting = 100;  // parentheses

struct node {
  enum class kind { literal, set, ref, seq, alt, repeat, pattern } k = kind::seq;
  std::string text;        // literal: UTF-8 bytes; ref: the rule name
  code_point_ranges set;   // set
  std::size_t at = 0;      // ref: offset of the name
  std::uint32_t min = 0, max = 0;  // repeat
  // repeat: kids[0] is repeated; a kids[1] is emitted between two repetitions (Lark's %ignore).
  std::vector<node> kids;
  std::shared_ptr<const regex> re;  // pattern: a regex (Lark's /.../ terminals)
};

struct rule_def {
  std::string name;
  std::size_t at = 0;  // offset of the name
  node body;
};

// A syntax error: the message and a byte offset (npos: the grammar as a whole).
struct failure {
  std::string message;
  std::size_t at;
};

// Reads a grammar text: the position, UTF-8 code points, escapes, and messages that describe
// what is at an offset. Failures are thrown as `failure`.
class scanner {
 public:
  explicit scanner(std::string_view t) : t_(t) {}
  std::pair<std::size_t, std::size_t> line_column(std::size_t at) const;  // 1-based; the column counts bytes
  ebnf_error error_at(std::string message, std::size_t at) const;        // npos: without a position

 protected:
  [[noreturn]] void fail(std::string msg, std::size_t at = std::string::npos) const {
    throw failure{std::move(msg), at == std::string::npos ? pos_ : at};
  }
  bool eof() const { return pos_ >= t_.size(); }
  char peek() const { return t_[pos_]; }
  std::string describe(std::size_t at) const;  // "'x'", "end of line", "byte 0x01", "end of the grammar"
  std::uint32_t code_point();                  // one validated UTF-8 code point
  std::uint32_t hex(std::size_t digits, std::size_t at);
  // At a backslash: `\n \r \t \f \xHH \uHHHH \UHHHHHHHH`, the letters in `more` (of `v0`), and a
  // backslash before any ASCII punctuation (`any_punct`) or before one of `punct`.
  std::uint32_t escape(std::string_view more, bool any_punct, std::string_view punct);

  std::string_view t_;
  std::size_t pos_ = 0;
};

// How messages name a rule of the dialect ("rule 'x'", or "terminal 'X'" in Lark).
using namer = std::function<std::string(std::string_view name)>;

// Compiles `defs` from the rule `root`: names must be unique and references defined; the rules
// reachable from `root` are emitted (small non-recursive ones inline); left recursion is refused
// with `left_recursion_hint` (how to rewrite it); a rule that matches nothing is refused.
std::variant<grammar, ebnf_error> compile_rules(const std::vector<rule_def>& defs, std::string_view root,
                                                const scanner& text, const limits& lim, const namer& name_of,
                                                std::string_view left_recursion_hint);

}  // namespace troupe::recipe::grammar::syntax
