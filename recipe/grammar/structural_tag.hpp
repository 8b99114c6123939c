#pragma once
// Structural tags (XGrammar's format, as vLLM and SGLang take it) compiled to a grammar: free text
// in which a trigger string switches to a constrained region — a tool call's JSON between its
// begin and end strings — and other compositions of constrained chunks.
//
// Two shapes are accepted:
//   {"type": "structural_tag", "format": FORMAT}
//   {"type": "structural_tag", "structures": [{"begin", "schema", "end"}], "triggers": [...]}
// the second (the original one) meaning a `triggered_tags` format of those tags. FORMAT is one of
//   const_string {value}            json_schema {json_schema, any_order, style ("json", "deepseek_xml"),
//                                                max_whitespace_cnt (0: the compact form)}
//   grammar {grammar} (GBNF, or Lark as vLLM detects it)         regex {pattern}
//   any_text {excludes, max_tokens, max_chars}                   sequence / or {elements}
//   optional / plus / star {content}
//   repeat {min, max (-1: no bound), content}                    tag {begin, content, end (one or a list)}
//   triggered_tags {triggers, tags, at_least_one, stop_after_first, excludes}
//   tags_with_separator {tags, separator, at_least_one, stop_after_first}
//   dispatch {rules: [[pattern, FORMAT]...], loop, excludes}
//   token {token}                   exclude_token {exclude_tokens}
//   any_tokens {exclude_tokens, max_tokens}                      tag {begin / end: {"type": "token", ...}}
//   token_triggered_tags {trigger_tokens, tags, exclude_tokens, at_least_one, stop_after_first}
//   token_dispatch {rules: [[token, FORMAT]...], loop, exclude_tokens}
// Free text is any bytes but the DSML control token's (grammar.hpp). It ends where its enclosing
// tag's end string first appears when it is that tag's content (or the last element of a sequence
// that is), else anywhere; it never holds an exclude, and a trigger or dispatch pattern in it
// always starts its region. The token-level formats read whole tokens (a token id, or its string:
// an added token's content or a text token's text), through the grammar's token symbols: "any
// token" is any text token, never a control token the tag does not name; an enclosing tag's end
// token is excluded from the token-level formats inside it, and a trigger or dispatch token from
// its own region. `any_text`'s and `any_tokens`' budgets are counted by the matcher (a rule of
// their own; docs/structured-output.md#budgets). A member a format does not define is refused,
// as is what cannot be compiled, naming the member and its JSON pointer.

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

struct structural_tag_error {
  std::string pointer;  // JSON pointer of the member at fault in the structural tag ("" is the whole)
  std::string message;
  std::string to_string() const;  // "<message> (at '#<pointer>')"
};

// A pruned grammar of the outputs `tag` allows. Without `tokens`, a token-level format is refused.
std::variant<grammar, structural_tag_error> compile_structural_tag(const nlohmann::ordered_json& tag,
                                                                   const limits& lim = {},
                                                                   const token_names* tokens = nullptr);
// Parses the text first (a parse error, or nesting past 128 levels, is an error).
std::variant<grammar, structural_tag_error> compile_structural_tag(std::string_view text, const limits& lim = {},
                                                                   const token_names* tokens = nullptr);

}  // namespace troupe::recipe::grammar
