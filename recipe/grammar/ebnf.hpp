#pragma once
// EBNF grammars (the GBNF dialect of llama.cpp, as XGrammar and vLLM take it) compiled to the
// grammar representation (grammar.hpp): one grammar rule per EBNF rule, a rule reference is a
// call, so recursion is a call cycle.
//
// Accepted (docs/structured-output.md, "EBNF grammars"):
//   rule        name ::= alternatives       names [A-Za-z_][A-Za-z0-9_.-]*; a body runs until the
//                                          next `name ::=` or the end, across lines
//   "..."       a string literal (UTF-8), escapes \n \r \t \f \v \0 \xHH \uHHHH \UHHHHHHHH and a
//               backslash before any ASCII punctuation
//   [...]       a character class of code points: ranges a-z, negation [^...], the same escapes
//   .           any code point
//   ( )  |      grouping, alternatives (an empty alternative matches the empty string)
//   * + ?  {m} {m,} {m,n} {,n}   repetition (bounds <= limits::max_repeat)
//   # ...       a comment to the end of the line
// The start rule is `root` (or the name given). Lark syntax (`name: ...`, `/regex/`, `%import`)
// and XGrammar's lookahead assertions `(= ...)` are refused with a message saying so.
// Rules not reachable from the start rule are checked (syntax, references) but not compiled.
// Left recursion (a rule that can reach itself without consuming a byte) is refused naming the
// rule. Every error names a line and column (1-based; the column counts bytes) and what was
// expected.

#include <cstddef>
#include <string>
#include <string_view>
#include <variant>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

struct ebnf_error {
  std::string message;
  std::size_t line = 0, column = 0;  // 1-based; 0 when the error is about the grammar as a whole
  std::string to_string() const;     // "line L, column C: message" (or just the message)
};

std::variant<grammar, ebnf_error> compile_ebnf(std::string_view text, std::string_view root_rule = "root",
                                               const limits& lim = {});

}  // namespace troupe::recipe::grammar
