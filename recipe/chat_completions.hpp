#pragma once
// OpenAI Chat Completions request -> conversation (recipe/prompt.hpp) + the request's sampling and
// serving fields. Conversion follows deepseek_recipe 0.2.0's ChatCompletionRequest.convert for
// everything that reaches the prompt (goldens: tests/recipe/golden/chat_completions.v4.jsonl.gz);
// where ours accepts more (n > 1, the `developer` role, ...) docs/recipe.md says so.
//
// Validation errors are values: status 400, a message and the offending parameter
// (`messages[2].role`), rendered in OpenAI's error shape by api_error::to_json().

#include "recipe/api_error.hpp"
#include "recipe/prompt.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::recipe {

enum class image_policy { placeholder, reject };

struct chat_completions_config {
  bool default_thinking = true;       // a request without `thinking` / `reasoning_effort: none`
  std::vector<std::string> models;    // accepted `model` names; empty = any
  std::int64_t max_tokens_limit = 393216;
  int max_n = 128;
  image_policy images = image_policy::placeholder;  // V4 has no vision: "[Unsupported Image]"
  // Models whose requests are converted for DeepSeek-V4.1 (prompt_format::v41): images stay
  // images (`<｜image｜>`), and the V4.1 differences of Responses and Messages apply.
  std::vector<std::string> v41_models = {"DeepSeek-V4.1-Flash"};
};

// The serving fields of the request, validated; unset = not in the request.
struct sampling_params {
  std::string model;
  std::optional<std::int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  std::optional<double> temperature;       // [0, 2]
  std::optional<double> top_p;             // [0, 1]
  int n = 1;
  std::vector<std::string> stop;           // at most 4
  bool stream = false;
  bool include_usage = false;              // stream_options.include_usage
  bool logprobs = false;
  std::optional<int> top_logprobs;         // [0, 20]; Chat Completions: needs logprobs; Responses: sets it
  std::optional<int> top_k;                // Messages
  std::optional<std::int64_t> seed;
  std::optional<double> presence_penalty, frequency_penalty;  // [-2, 2]
  std::string response_format_type = "text";  // text | json_object | json_schema | regex | grammar
  std::optional<std::string> response_format_json;  // the whole response_format, compact JSON
  // A constraint given in another server's request fields (vLLM's `structured_outputs`, SGLang's
  // `regex` / `ebnf`): it constrains the output as a response format does but leaves the prompt
  // as it is (no schema in the system prompt), as those servers do. Unset when absent.
  std::optional<response_format> extra_constraint;
  std::string extra_constraint_param;  // the field it came from, e.g. "structured_outputs.choice"
  std::optional<std::string> reasoning_effort;      // as sent
  std::optional<std::string> tool_choice_function;  // tool_choice named one function
  int image_parts = 0;                              // image parts (placeholders in the prompt)
  prompt_format format = prompt_format::v4;         // the model's prompt format (config.v41_models)
};

struct chat_completions_request {
  recipe::conversation conversation;
  sampling_params params;
};

using chat_completions_result = std::variant<chat_completions_request, api_error>;

// `body` is the HTTP request body (JSON text).
chat_completions_result parse_chat_completions(std::string_view body,
                                               const chat_completions_config& config = {});

}  // namespace troupe::recipe
