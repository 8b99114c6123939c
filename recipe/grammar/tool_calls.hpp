#pragma once
// Tool calls as a grammar: the DSML block in which DeepSeek-V4 and V4.1 write calls (the form
// recipe/prompt.cpp renders past calls in), limited to the request's tools, with a strict tool's
// parameters following its JSON Schema.
//
//   \n\n<D tool_calls>\n                                        V4.1: `<D calls>`
//   <D invoke name="NAME">\n                                    V4.1: `<D invoke`
//   <D parameter name="KEY" string="true">TEXT</D parameter>\n  a string, as it is
//   <D parameter name="KEY" string="false">JSON</D parameter>\n any value, as canonical JSON
//   </D invoke>\n                                               (more invokes, unless one_call)
//   </D tool_calls>
//
// D is the `｜DSML｜` control token: `dsml_byte` in the grammar (grammar.hpp). A strict tool
// writes its schema's properties in their order, each at most once and the required ones
// always; a value is either the raw text of one of the property's string instances
// (string="true") or the canonical JSON of any instance (string="false", json_schema.hpp). A
// tool without a schema takes any parameters. V4.1 writes an empty line before `</D invoke>`
// when a call has no parameters, as the prompt renders it.
#include <cstddef>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipe/grammar/grammar.hpp"
#include "recipe/grammar/json_schema.hpp"

namespace troupe::recipe::grammar {

struct tool_spec {
  std::string name;
  // A strict tool's parameters schema (an object schema); none: any parameters.
  std::optional<nlohmann::ordered_json> schema;
};

// What the output may be.
enum class tool_calls_mode {
  optional,  // an answer, or a block of calls (after text when there is no answer format)
  forced,    // a block of calls and nothing else (Messages' tool_choice `any`)
  opened,    // tool_choice required: the prompt opened the block; the calls and its end
};

struct tool_calls_spec {
  std::vector<tool_spec> tools;
  bool v41 = false;  // V4.1's DSML names
  tool_calls_mode mode = tool_calls_mode::optional;
  bool one_call = false;  // at most one invoke in the block (parallel calls off)
  const grammar* content = nullptr;  // optional mode: the answer's grammar (a response format); null: any text
};

struct tool_calls_error {
  std::optional<std::size_t> tool;  // index in tool_calls_spec::tools; none: the grammar as a whole
  schema_error error;               // pointers relative to that tool's schema
};

// A spec from the JSON a tools constraint key carries: {"v41", "mode" ("optional", "forced" or
// "opened"), "one_call", "tools": [{"name", "schema" (null or absent: not strict)}]}; `content` is
// left to the caller. Nothing for JSON of another shape.
std::optional<tool_calls_spec> tool_calls_spec_of(const nlohmann::ordered_json& j);

// The parameters of one call alone, as a strict tool's (`<D parameter name="KEY"
// string="true">TEXT</D parameter>\n` or string="false" with canonical JSON, in the schema's
// order): a structural tag's json_schema format with XGrammar's `deepseek_xml` style. A pruned
// grammar, or what the schema has that is refused (as for a strict tool).
std::variant<grammar, schema_error> compile_dsml_parameters(const nlohmann::ordered_json& schema, bool v41 = false,
                                                            const limits& lim = {});

// A pruned grammar of the output. Errors: a strict schema the JSON Schema compiler refuses, a
// top level that is not an object of named properties, limits exceeded.
std::variant<grammar, tool_calls_error> compile_tool_calls(const tool_calls_spec& spec, const limits& lim = {});

}  // namespace troupe::recipe::grammar
