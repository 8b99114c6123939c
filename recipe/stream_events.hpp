#pragma once
// The stream parser's protocol-neutral events rendered as the streaming events of OpenAI Responses
// (`response.created` ... `response.completed` / `response.incomplete`, with sequence numbers) and
// of Anthropic Messages (`message_start`, `content_block_start` / `_delta` / `_stop`, `ping`,
// `message_delta`, `message_stop`), in the shape deepseek_recipe 0.2.0's stream processor writes
// them (goldens: tests/recipe/golden/stream_events.v4.jsonl.gz). Each event is one JSON object
// (text); its SSE event name is its `type`. Adjacent deltas of one kind arrive merged (one delta
// event per merged delta), so sequence numbers count the events actually written.

#include "recipe/api_error.hpp"
#include "recipe/responses.hpp"
#include "recipe/stream_parser.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace troupe::recipe {

struct event_stream_options {
  std::string id;      // the response / message id (item ids and the thinking signature derive from it)
  std::string model;
  std::int64_t created = 0;  // Unix seconds
  std::uint64_t prompt_tokens = 0;  // reported before any output (message_start)
  std::uint64_t cached_prompt_tokens = 0;
  // The id of tool call `index`; default: next_tool_call_id seeded by `id`.
  std::function<std::string(int index)> tool_call_id;
  // Logprobs on: the JSON array of the entries of a text event's `tokens`. Responses: the
  // `logprobs` of its `response.output_text.delta`, and all of them, in order, those of the
  // `response.output_text.done` event and the output_text part; Chat Completions: see
  // chat_chunk_options. Messages has no logprobs.
  std::function<std::string(const stream_event&)> logprobs;
};

// OpenAI Responses streaming. Output items: a `reasoning` item (reasoning_text part), a `message`
// item (output_text part; phase `commentary` when a function call follows, else `final_answer`),
// one `function_call` item per tool call; an item is done when the next begins or at the finish
// (the last one `incomplete` when the output was cut). The response object of created /
// in_progress / completed / incomplete is results.hpp's render_response. Where the reference's
// events break the official OpenAI spec, ours follow the spec: no null `user` or `usage`,
// `cache_write_tokens` in the usage, `name` in `response.function_call_arguments.done`.
class responses_event_renderer {
 public:
  // `request` supplies the settings the response object reports (copied, its conversation left out).
  responses_event_renderer(event_stream_options options, const responses_request& request);
  responses_event_renderer(event_stream_options options, sampling_params params, responses_fields fields);
  // response.created and response.in_progress; call once, first.
  void start(std::vector<std::string>& out);
  void render(std::span<const stream_event> events, std::vector<std::string>& out);
  // An `error` event (the spec's ResponseErrorEvent: code, message, param, sequence_number).
  std::string error(const api_error& e);

 private:
  enum class item { none, reasoning, message, call };
  std::string next_id_for_call(int index);
  std::string response_object(const char* status, bool final_usage) const;
  void open(item kind, const stream_event& e, std::vector<std::string>& out);
  void close(bool complete, bool call_follows, std::vector<std::string>& out);

  event_stream_options opt_;
  responses_request echo_;  // params and fields only
  std::uint64_t seq_ = 0;
  std::uint64_t rng_;
  item cur_ = item::none;
  std::string item_id_;
  std::string text_;  // the current item's text (or arguments)
  std::vector<std::string> logprobs_;  // the current message's delta logprobs, JSON arrays
  std::string call_id_, call_name_;
  std::vector<std::string> done_items_;  // output items, JSON text
  std::optional<finish_reason> finish_;
  usage_counts usage_;
};

// Anthropic Messages streaming. Blocks: `thinking` (opened first in thinking mode, even when the
// reasoning or the whole reply is empty; closed with a `signature_delta` of the message id), `text`, `tool_use`
// (`input_json_delta` of the arguments); `ping` after the first block start; the stop reason
// (`end_turn`, `stop_sequence` with the sequence, `tool_use`, `max_tokens`, `refusal`) and the
// usage in `message_delta`, then `message_stop`.
class messages_event_renderer {
 public:
  // `thinking`: the reply starts in reasoning (thinking mode).
  messages_event_renderer(event_stream_options options, bool thinking);
  // message_start; call once, first.
  void start(std::vector<std::string>& out);
  void render(std::span<const stream_event> events, std::vector<std::string>& out);
  // An `error` event: {"type": "error", "error": {"type", "message"}}.
  static std::string error(const api_error& e);

 private:
  enum class block { none, thinking, text, tool_use };
  void open(block kind, const stream_event* e, std::vector<std::string>& out);
  void close(std::vector<std::string>& out);
  std::string usage_json(std::uint64_t output_tokens) const;

  event_stream_options opt_;
  bool thinking_;
  std::uint64_t rng_;
  block cur_ = block::none;
  int index_ = -1;  // the current block's index
  bool pinged_ = false;
  bool thinking_opened_ = false;
  std::optional<finish_reason> finish_;
  std::string stop_sequence_;
};

}  // namespace troupe::recipe
