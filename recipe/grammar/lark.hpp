#pragma once
// Lark grammars (as Python's lark and llguidance take them) compiled to the grammar
// representation (grammar.hpp), through the syntax tree and compiler shared with GBNF
// (ebnf_syntax.hpp): every rule and terminal is a rule of the tree, a reference a call or an
// inlined copy.
//
// Accepted (docs/structured-output.md, "Lark grammars"):
//   name: alternatives        a rule (lowercase; `?name`, `!name`, `_name` are plain names here)
//   NAME: alternatives        a terminal (uppercase); it may reference terminals, not rules
//   name.2: ...               a priority: read and ignored
//   "..." '...' "..."i        literals (escapes \n \r \t \f \xHH \uHHHH \UHHHHHHHH \\ \" \');
//                             `i`: ASCII letters in either case
//   /regex/flags              a terminal pattern (regex.hpp, lark_regex); flags i s (m u: no effect)
//   "a".."z"                  a range of code points
//   ( ) [x] x? x* x+ x~n x~n..m   grouping, optional, repetition
//   a | b, -> alias           alternatives (a line starting with `|` continues the definition);
//                             an alias is read and ignored
//   // ... and # ...          comments
//   %import common.NAME [-> ALIAS], %import common (A, B)   the common terminals (lark.cpp)
//   %ignore TERMINAL (or any terminal expansion)
// `%ignore`d terminals may appear between any two elements of a rule (and repetitions of one),
// and before and after the whole output; not inside a terminal. The text is matched as a
// concatenation of lexemes: there is no maximal-munch lexer (docs/structured-output.md).
// Refused with line and column: other directives (%declare, %override, %extend), imports other
// than `common`, templates, llguidance's `<token>` references, regex lookaround, anchors and lazy
// quantifiers, recursive terminals, and left-recursive rules (`expr: expr "+" term`) with the
// rewrite to use.

#include <string_view>
#include <variant>

#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

std::variant<grammar, ebnf_error> compile_lark(std::string_view text, std::string_view start_rule = "start",
                                               const limits& lim = {});

// Whether a grammar without a stated syntax is Lark: it is GBNF when some line holds `::=` outside
// a string literal and a comment (`#`, `//`), and Lark otherwise.
bool looks_like_lark(std::string_view text);

}  // namespace troupe::recipe::grammar
