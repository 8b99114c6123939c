#pragma once
// Non-streaming results -> each protocol's response object: `chat.completion`, the Responses
// `response` object and the Anthropic `message`. The input is what the stream parser decided
// about the generated output (content, reasoning, tool calls, the backend's finish reason, token
// counts); the objects follow deepseek_recipe 0.2.0's accumulated responses field for field
// (goldens: tests/recipe/golden/results.v4.jsonl.gz) with the fields the official OpenAI spec
// requires or forbids put right (docs/recipe.md lists them).

#include "recipe/prompt.hpp"
#include "recipe/responses.hpp"
#include "recipe/stream_parser.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace troupe::recipe {

struct generation {
  std::string content;
  std::optional<std::string> reasoning;  // thinking mode: the reasoning (possibly empty)
  std::vector<tool_call> tool_calls;     // id, name, arguments as JSON text
  backend_finish finish = backend_finish::stop;  // with tool calls, `stop` is the tool-call reason
  std::optional<std::string> stop_sequence;  // the stop sequence that ended the output
  std::int64_t completion_tokens = 0;        // every generated token
  std::int64_t reasoning_tokens = 0;         // of them, the reasoning's
};

struct response_meta {
  std::string id;
  std::string model;
  std::int64_t created = 0;  // Unix seconds
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;  // prompt tokens served from the KV cache
};

// `chat.completion`: one choice per generation (n >= 1), usage summed over them.
std::string render_chat_completion(std::span<const generation> choices, const response_meta& meta);

// The Responses `response` object; `request` supplies the settings the object reports.
std::string render_response(const generation& g, const response_meta& meta, const responses_request& request);

// The Anthropic `message`.
std::string render_message(const generation& g, const response_meta& meta);

}  // namespace troupe::recipe
