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

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "recipe/grammar/grammar.hpp"

namespace troupe::recipe::grammar {

struct schema_error {
  std::string keyword;  // the keyword at fault ("" for the schema as a whole)
  std::string pointer;  // JSON pointer of the schema holding it ("" is the root)
  std::string message;
  std::string to_string() const;  // "<message> (keyword 'k' at '#/p')"
};

// `schema` keeps its key order: `properties` order is the members' order.
std::variant<grammar, schema_error> compile_json_schema(const nlohmann::ordered_json& schema, const limits& lim = {});
// Parses the text first (at most 128 levels deep; a parse error is a schema_error).
std::variant<grammar, schema_error> compile_json_schema(std::string_view schema_text, const limits& lim = {});

// A grammar of any JSON object (the `json_object` response format).
grammar any_json_object();

// The canonical text of a JSON value, as the compiled grammars write `enum` / `const` values:
// object keys sorted (nlohmann::json's order), integral floats below 1e18 as integers.
std::string canonical_json(const nlohmann::json& value);

}  // namespace troupe::recipe::grammar
