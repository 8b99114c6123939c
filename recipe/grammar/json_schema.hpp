#pragma once
// JSON Schema (draft 2020-12, the subset OpenAI / Anthropic strict mode uses and more) compiled
// to a grammar whose sentences are the canonical JSON texts of the valid instances.
//
// Canonical JSON (docs/structured-output.md): Python json.dumps(ensure_ascii=False) spacing —
// `", "` between items and members, `": "` after keys, no other whitespace; strings with
// `\" \\ \b \f \n \r \t` and `\u00xx` for other control characters, everything else raw UTF-8;
// object members in the order of the schema's `properties`, then `required` names missing from
// `properties`, then additional members; integral numbers without a fraction. A keyword the compiler
// cannot enforce exactly is an error naming the keyword and the JSON pointer of its schema — the
// output is never silently less constrained than the schema says.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

// How a compiled grammar spaces JSON text: canonical (`", "` and `": "`, above), compact (`","`
// and `":"`, no whitespace at all: vLLM's `disable_any_whitespace`), or a whitespace pattern's
// (vLLM's `whitespace_pattern`): one text of the pattern between every two tokens of which one is
// `{ } [ ] , :` (between the brackets of an empty object or array too), none elsewhere.
struct json_style {
  bool compact = false;
  // XGrammar's any_order: an object's members in any order. Each is a permitted key with a value
  // of its schema, but which keys appear is not tracked (a required one may be missing, a key may
  // repeat); only their number is bounded below, by the number of required properties. Every
  // object of the schema, nested ones too.
  bool any_order = false;
  // A call-free automaton over JSON whitespace (whitespace_style); when set, `compact` is ignored.
  std::shared_ptr<const rule> whitespace;
  std::string_view item() const { return compact ? "," : ", "; }
  std::string_view key() const { return compact ? ":" : ": "; }
};

// The style whose whitespace is the text of `pattern` (a regex, regex.hpp), or why it cannot be:
// the pattern does not compile within small limits (64 automaton states, repetition bounds up to
// 64), or matches something other than JSON whitespace (space, tab, line feed, carriage return).
std::variant<json_style, std::string> whitespace_style(std::string_view pattern);

struct schema_error {
  std::string keyword;  // the keyword at fault ("" for the schema as a whole)
  std::string pointer;  // JSON pointer of the schema holding it ("" is the root)
  std::string message;
  std::string to_string() const;  // "<message> (keyword 'k' at '#/p')"
};

// `schema` keeps its key order: `properties` order is the members' order.
std::variant<grammar, schema_error> compile_json_schema(const nlohmann::ordered_json& schema, const limits& lim = {},
                                                        json_style style = {});
// Parses the text first (at most 128 levels deep; a parse error is a schema_error).
std::variant<grammar, schema_error> compile_json_schema(std::string_view schema_text, const limits& lim = {},
                                                        json_style style = {});

// Rules for (sub)schemas of one root schema, appended to a grammar under construction: for
// grammars that embed JSON Schema values, such as tool calls (tool_calls.hpp). `node` is a
// schema inside `root` and `pointer` its JSON pointer (how `$ref`s, rule names and errors name
// it); the same pointer gives the same rule. The grammar is neither checked for left recursion
// nor pruned here: its builder does that when it is whole.
class schema_rules {
 public:
  // `root` and `g` must outlive this object.
  schema_rules(const nlohmann::ordered_json& root, grammar& g, const limits& lim = {}, json_style style = {});
  ~schema_rules();
  // A rule whose sentences are the canonical JSON texts of `node`'s instances.
  std::variant<std::uint32_t, schema_error> value(const nlohmann::ordered_json& node, const std::string& pointer);
  // `node`'s string instances as raw text (their characters, without quotes or escapes), then
  // the text `then`, emitted into `b` from `from` to `to` (nothing when `node` admits no string).
  // Raw text may end after any character, so what follows it must be in the same automaton as
  // it: a mask then never walks the vocabulary through a return after each character. Emitted
  // into the caller's rule, or for a string with only length bounds a rule of its own holding
  // `then`.
  std::optional<schema_error> emit_raw_string(nfa_builder& b, std::uint32_t from, std::uint32_t to,
                                              const nlohmann::ordered_json& node, const std::string& pointer,
                                              const std::string& then);

  class compiler;

 private:
  std::unique_ptr<compiler> c_;
};

// The nesting depth of a JSON text, outside strings: deep texts are refused before parsing.
std::size_t json_nesting(std::string_view text);

// `pointer` + "/" + `key` escaped as a JSON pointer token (~0, ~1).
std::string json_pointer_child(std::string_view pointer, std::string_view key);

// A grammar of any JSON object (the `json_object` response format).
grammar any_json_object(json_style style = {});

// The canonical text of a JSON value, as the compiled grammars write `enum` / `const` values:
// object keys sorted (nlohmann::json's order), integral floats below 1e18 as integers; the
// separators `style`'s (with a whitespace pattern, the canonical ones: the grammars then write
// such values token by token, with the pattern between).
std::string canonical_json(const nlohmann::json& value, json_style style = {});

}  // namespace troupe::recipe::grammar
