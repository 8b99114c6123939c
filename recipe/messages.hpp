#pragma once
// Anthropic Messages request -> conversation (recipe/prompt.hpp) + sampling and serving fields.
// Conversion follows deepseek_recipe 0.2.0's MessagesRequest.convert for everything that reaches
// the prompt (goldens: tests/recipe/golden/messages.v4.jsonl.gz); docs/recipe.md lists where ours
// differs. Errors are values rendered in Anthropic's shape by api_error::to_anthropic_json(); the
// param is the field's path in Anthropic's dotted style (`messages.1.content.0.tool_use_id`) and the
// message starts with it.

#include "recipe/chat_completions.hpp"

#include <string_view>
#include <variant>

namespace troupe::recipe {

struct messages_request {
  recipe::conversation conversation;
  sampling_params params;  // stop = stop_sequences; max_tokens lowered to config.max_tokens_limit
  std::optional<std::string> metadata_user_id;
};

using messages_result = std::variant<messages_request, api_error>;

// `body` is the HTTP request body (JSON text). Uses config.models, default_thinking,
// max_tokens_limit and images like the Chat Completions parser.
messages_result parse_messages(std::string_view body, const chat_completions_config& config = {});

}  // namespace troupe::recipe
