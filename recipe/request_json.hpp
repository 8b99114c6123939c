#pragma once
// Internal to recipe/: checked reads of a request body's JSON, shared by the protocol parsers.
// A failed check throws request_failure, which each parser's entry point turns into an api_error
// value before returning (no exception leaves the library).

#include "recipe/api_error.hpp"
#include "recipe/chat_completions.hpp"
#include "recipe/prompt.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::recipe::detail {

using ojson = nlohmann::ordered_json;

struct request_failure {
  api_error error;
};

[[noreturn]] inline void fail(std::string message, std::string param) {
  throw request_failure{api_error{400, std::move(message), "invalid_request_error", std::move(param), std::nullopt}};
}

inline std::string type_of(const ojson& j) { return j.type_name(); }

/// A message with just a role and content.
inline message make_message(role r, std::string content) {
  message m;
  m.role = r;
  m.content = std::move(content);
  return m;
}

/// The deepest nesting of arrays and objects in JSON text (brackets inside strings not counted).
/// Requests nested deeper than max_nesting are refused before parsing: the checks, the strict
/// schema rewrite and the prompt's JSON rendering recurse on the structure.
constexpr std::size_t max_nesting = 128;
std::size_t nesting_depth(std::string_view text);

/// Parses a request body and converts it with `convert(json)`: a body nested deeper than
/// max_nesting or not JSON (`bad_json` is the message) is refused before conversion, and a failed
/// check (request_failure) becomes the api_error value returned.
template <class Result, class Convert>
Result parse_body(std::string_view body, const char* bad_json, Convert&& convert) {
  if (nesting_depth(body) > max_nesting)
    return api_error{400, "The request body is nested more than " + std::to_string(max_nesting) + " levels deep.",
                     "invalid_request_error", std::nullopt, std::nullopt};
  ojson j = ojson::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) return api_error{400, bad_json, "invalid_request_error", std::nullopt, std::nullopt};
  try {
    return convert(j);
  } catch (request_failure& f) {
    if (f.error.param && f.error.param->empty()) f.error.param.reset();
    return std::move(f.error);
  }
}

/// A tool_choice that names one function: only that tool stays and a call is required. False
/// (nothing changed) when no tool has that name.
inline bool require_tool(conversation& conv, sampling_params& sp, const std::string& name) {
  auto it = std::find_if(conv.tools.begin(), conv.tools.end(), [&](const tool_definition& d) { return d.name == name; });
  if (it == conv.tools.end()) return false;
  tool_definition only = *it;
  conv.tools = {std::move(only)};
  conv.tool_choice = tool_choice::required;
  sp.tool_choice_function = name;
  return true;
}

/// The prompt format a model's requests are converted for.
inline prompt_format format_of(const std::string& model, const std::vector<std::string>& v41_models) {
  for (const auto& m : v41_models)
    if (m == model) return prompt_format::v41;
  return prompt_format::v4;
}

/// An image in text being built: its offset is recorded when `images` is given (V4.1 conversion,
/// user turns), else V4's placeholder text is written.
inline void add_image(std::string& out, std::vector<std::size_t>* images) {
  if (images) images->push_back(out.size());
  else out += "[Unsupported Image]";
}

/// The member `key` of `obj`, or nullptr when absent or null.
inline const ojson* find(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

inline std::string need_string(const ojson& j, const std::string& param) {
  if (!j.is_string()) fail("Invalid type for '" + param + "': expected a string, got " + j.type_name() + ".", param);
  return j.get<std::string>();
}

inline bool need_bool(const ojson& j, const std::string& param) {
  if (!j.is_boolean()) fail("Invalid type for '" + param + "': expected a boolean, got " + j.type_name() + ".", param);
  return j.get<bool>();
}

inline std::int64_t need_int(const ojson& j, const std::string& param) {
  if (!j.is_number_integer())
    fail("Invalid type for '" + param + "': expected an integer, got " + j.type_name() + ".", param);
  return j.get<std::int64_t>();
}

/// A number in [lo, hi] (or (lo, hi] with `open_low`).
inline double need_number(const ojson& j, const std::string& param, double lo, double hi, bool open_low = false) {
  if (!j.is_number()) fail("Invalid type for '" + param + "': expected a number, got " + j.type_name() + ".", param);
  double v = j.get<double>();
  if (!((open_low ? v > lo : v >= lo) && v <= hi))
    fail("Invalid " + param + " value, the valid range of " + param + " is " + (open_low ? "(" : "[") + ojson(lo).dump() +
             ", " + ojson(hi).dump() + "].",
         param);
  return v;
}

/// A tool's name as deepseek_recipe checks it (and OpenAI's and Anthropic's APIs, which allow 64
/// characters where the reference allows 128): 1-128 characters of [a-zA-Z0-9_-], so that no name
/// can spell markup of the prompt's tool block. The problem in words, or nullopt.
inline std::optional<std::string> tool_name_problem(const std::string& name) {
  if (name.empty()) return "empty string. Expected a string with minimum length 1, but got an empty string instead.";
  if (name.size() > 128)
    return "string too long. Expected a string with maximum length 128, but got a string with length " +
           std::to_string(name.size()) + " instead.";
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return "string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.";
  return std::nullopt;
}
inline void check_tool_name(const std::string& name, const std::string& param) {
  if (auto problem = tool_name_problem(name)) fail("Invalid '" + param + "': " + *problem, param);
}

/// An image's `detail` (Chat Completions `image_url.detail`, Responses `input_image.detail`).
inline void check_image_detail(const ojson& detail, const std::string& param) {
  const std::string d = need_string(detail, param);
  if (d != "auto" && d != "low" && d != "high" && d != "original")
    fail("Invalid value: '" + d + "'. Supported values are: 'auto', 'low', 'high' and 'original'.", param);
}

/// The ids of a list, joined with ", " (error messages).
inline std::string joined(const std::vector<std::string>& ids) {
  std::string out;
  for (const auto& id : ids) out += (out.empty() ? "" : ", ") + id;
  return out;
}

/// A reasoning-effort name as deepseek_recipe maps it: "none" turns thinking off (`none`), minimal /
/// low -> low, medium / high -> high, xhigh, ultra / max -> max; or (ours only) an integer 1-100,
/// V4.1's continuous scale (`number`), with the V4 level 1-50 -> low, 51-99 -> high, 100 -> max.
/// Anything else fails.
struct effort_choice {
  bool none = false;
  std::optional<reasoning_effort> level;
  std::optional<int> number;
};
effort_choice parse_effort(const ojson& j, const std::string& param);

/// Thinking mode and effort into the conversation: `thinking` is the request's mode (`given`: the
/// request set it, else the default), `effort` the effort field at `param` (null when absent).
/// An effort of "none" turns thinking off unless the request set the mode; the effort applies in
/// thinking mode only; its spelling is kept in sp.reasoning_effort. Returns the mode.
inline bool set_thinking(conversation& conv, sampling_params& sp, bool thinking, bool given,
                         const ojson* effort, const std::string& param) {
  effort_choice ec;
  if (effort) {
    ec = parse_effort(*effort, param);
    sp.reasoning_effort = effort->is_string() ? effort->get<std::string>() : effort->dump();
    if (ec.none && !given) thinking = false;
  }
  conv.thinking = thinking;
  if (thinking) {
    conv.effort = ec.level;
    conv.effort_level = ec.number;
  }
  return thinking;
}

/// `thinking: {"type": "enabled" | "adaptive" | "disabled"}` -> whether thinking mode is on.
bool parse_thinking(const ojson& j, const std::string& param);

/// The request's `model`, checked against config.models (empty = any); code model_not_found.
std::string check_model(const ojson& body, const std::vector<std::string>& models);

/// deepseek_recipe's strict function schemas: the schema rewritten in the reference's typed form.
/// The top level is an object schema; each node is `type` (object, string, number, integer,
/// boolean, array, null, or a list of the scalar ones), else `anyOf`, else `$ref`; per type only the
/// keywords the reference keeps, in its order (object: type, properties, additionalProperties
/// false, required = every property, description; string: type, description, pattern, format,
/// enum; number / integer: type, description, const, default, minimum,
/// maximum, exclusiveMinimum, exclusiveMaximum, multipleOf; array: type, items, description; ...); other keywords are dropped.
/// What the reference rejects fails (param = the offending node's path).
void make_strict(ojson& schema, const std::string& param);

/// deepseek_recipe writes the results of an assistant message's tool calls in the order of the
/// calls, whatever order the request gave them in: each run of tool messages right after an
/// assistant message with calls is sorted by the position of its call (stable).
void order_tool_results(conversation& conv);

/// The structured-output fields of other servers' requests, for clients written against them:
/// vLLM's `structured_outputs` {json, regex, choice, grammar, json_object} (and its older
/// `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`), SGLang's `regex` and
/// `ebnf`. Null members are absent. At most one constraint in all, and none beside a
/// `format_param` (response_format / text.format) other than text; sets
/// sp.extra_constraint(_param). `structured_outputs.disable_any_whitespace: true` makes a JSON
/// constraint compact (response_format::compact), `whitespace_pattern` spaces it; `structural_tag`
/// (a JSON object, or its text) is a structural tag.
void parse_extra_constraint(const ojson& body, conversation& conv, const std::string& format_param,
                            sampling_params& sp);

/// A grammar format's text and syntax: `syntax` ("lark" or "gbnf", at `syntax_param`) when given
/// (`syntax` may be null), else detected (grammar::looks_like_lark).
response_format grammar_format(const std::string& text, const ojson* syntax, const std::string& syntax_param);

/// A structural tag format (grammar/structural_tag.hpp) from `v` at `param`: a JSON object, or a
/// string holding one (as vLLM's `structured_outputs.structural_tag`). Checked when compiled.
response_format structural_tag_format(const ojson& v, const std::string& param);

/// True when some message of the conversation mentions "json" in any letter case: the reference
/// requires it for the `json_object` response format.
bool mentions_json(const conversation& c);

}  // namespace troupe::recipe::detail
