#pragma once
// OpenAI Responses request -> conversation (recipe/prompt.hpp) + sampling and serving fields.
// Conversion follows deepseek_recipe 0.2.0's ResponsesRequest.convert for everything that reaches
// the prompt (goldens: tests/recipe/golden/responses.v4.jsonl.gz); docs/recipe.md lists where ours
// differs. Errors are values in OpenAI's shape (api_error::to_json).

#include "recipe/chat_completions.hpp"

#include <string_view>
#include <variant>

namespace troupe::recipe {

// What a Responses request carries beyond the sampling fields; the response object echoes it.
struct responses_fields {
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;  // carried; this layer keeps no state
  bool store = true;
  std::optional<bool> parallel_tool_calls;
  std::optional<std::string> user;
  std::optional<std::string> metadata_json;  // compact JSON object
  std::optional<std::string> text_format_json;  // the whole text.format, compact JSON
  std::optional<std::string> reasoning_summary;  // reasoning.summary as sent
  std::string tools_json = "[]";                 // the function tools as sent, in the response's shape
  std::optional<std::string> tool_choice_json;   // tool_choice as sent, compact JSON
  // `include` has "message.output_text.logprobs": the output text reports its tokens'
  // logprobs (with `top_logprobs` alternatives each).
  bool output_text_logprobs = false;
};

struct responses_request {
  recipe::conversation conversation;
  sampling_params params;  // max_tokens = max_output_tokens; reasoning_effort = reasoning.effort
  responses_fields fields;
};

using responses_result = std::variant<responses_request, api_error>;

// `body` is the HTTP request body (JSON text). Uses config.models, default_thinking,
// max_tokens_limit and images like the Chat Completions parser.
responses_result parse_responses(std::string_view body, const chat_completions_config& config = {});

}  // namespace troupe::recipe
