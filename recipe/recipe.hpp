#pragma once
// The recipe's C++ API in one header: load a tokenizer, encode an API request into the model's
// prompt and ids, tokenize / detokenize, and parse the generated ids back into stream events.
// Expected failures are values: a file that cannot be loaded is a load_error, an invalid request an
// api_error (HTTP status, message, offending parameter). docs/recipe.md has examples.
//
//   auto loaded = troupe::recipe::codec::load("recipe/data/deepseek-v4/tokenizer.json.gz");
//   if (auto* e = std::get_if<troupe::recipe::load_error>(&loaded)) { report(e->message); return; }
//   auto& codec = std::get<troupe::recipe::codec>(loaded);
//   auto req = codec.encode(troupe::recipe::protocol::chat_completions, body);
//   if (auto* e = std::get_if<troupe::recipe::api_error>(&req)) return reply(e->status, e->to_json());
//   auto& r = std::get<troupe::recipe::encoded_request>(req);   // r.prompt.ids -> the engine
//   auto parser = codec.create_stream_parser(r);                // generated ids -> events
//   troupe::recipe::stream_renderer render(r, {.id = "resp_1"});  // events -> protocol events

#include "recipe/chat_completions.hpp"
#include "recipe/messages.hpp"
#include "recipe/parallel.hpp"
#include "recipe/prompt.hpp"
#include "recipe/responses.hpp"
#include "recipe/stream_events.hpp"
#include "recipe/stream_parser.hpp"
#include "recipe/tokenizer.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::recipe {

struct load_error {
  std::string message;
};

// The request protocols: OpenAI Chat Completions and Responses, Anthropic Messages.
enum class protocol { chat_completions, responses, messages };
// "chat" / "chat_completions", "responses", "messages"; nullopt for an unknown name.
std::optional<protocol> protocol_from_name(std::string_view name);
std::string_view to_string(protocol p);  // "chat_completions", "responses", "messages"

// An error response body in `p`'s shape: OpenAI's {"error": {...}} for Chat Completions and
// Responses, Anthropic's {"type": "error", "error": {...}} for Messages.
std::string error_json(protocol p, const api_error& e);

struct codec_options {
  unsigned threads = 1;  // tokenization threads, the caller included (1 = no pool)
  parallel_options parallel;
  chat_completions_config chat;  // the request parsers' settings (all three protocols)
};

// A request, validated and encoded.
struct encoded_request {
  recipe::protocol protocol = protocol::chat_completions;
  recipe::conversation conversation;
  sampling_params params;
  encoded_prompt prompt;
  stream_options stream;  // how to parse what the model generates for this prompt
  responses_fields responses;  // Responses: what the response object reports (else defaults)
};

// The stream events of a request's protocol as JSON objects (one string per chunk / event):
// chat.completion.chunk objects, Responses events (response.created ... response.completed) or
// Messages events (message_start ... message_stop). `o.id` is the response id; the model and
// the prompt token counts (when `o` leaves them empty / 0), the thinking mode, include_usage and
// the Responses echo come from the request.
class stream_renderer {
 public:
  stream_renderer(const encoded_request& r, event_stream_options o);
  // The opening chunk / events; call once, first.
  void start(std::vector<std::string>& out);
  void render(std::span<const stream_event> events, std::vector<std::string>& out);
  // An error in the middle of a stream, in the protocol's shape: Responses' `error` event (with
  // its sequence number), Messages' `error` event, Chat Completions' {"error": {...}}.
  std::string error(const api_error& e);

 private:
  std::variant<chat_chunk_renderer, responses_event_renderer, messages_event_renderer> r_;
};

// Where the generated text starts and what is parsed, from the conversation as the prompt encoder
// renders it (deepseek_recipe's parsing options): thinking -> reasoning; tools active -> DSML tool
// calls; tool_choice required -> inside the tool-call block; a final assistant prefix ->
// a continuation (in reasoning when it has reasoning and no content yet, in thinking mode).
stream_options stream_options_for(const conversation& c, std::uint64_t prompt_tokens = 0);

class codec {
 public:
  // Loads a tokenizer.json (or .json.gz). Fails as a value when the file is missing, malformed,
  // needs an unsupported feature, or lacks a control token of the DeepSeek-V4 prompt format.
  static std::variant<codec, load_error> load(const std::filesystem::path& tokenizer_file,
                                              codec_options options = {});
  static std::variant<codec, load_error> from_json(std::string_view tokenizer_json,
                                                   codec_options options = {});

  codec(codec&&) noexcept;
  codec& operator=(codec&&) noexcept;
  ~codec();

  const recipe::tokenizer& tokenizer() const;
  // The ids that end the model's turn (`<｜end▁of▁sentence｜>`): a generation stops after
  // sending one of them. Never empty (checked at load).
  std::vector<token_id> stop_ids() const;

  // User text in plain mode by default (HF split_special_tokens); raw never matches an added token,
  // trusted matches all of them. Long raw text is tokenized on the pool.
  std::vector<token_id> tokenize(std::string_view text, encode_mode mode = encode_mode::plain) const;
  std::string detokenize(std::span<const token_id> ids, bool skip_special = false) const;

  // A request body (JSON text) of `p` -> conversation, serving parameters, prompt text and ids.
  std::variant<encoded_request, api_error> encode(protocol p, std::string_view body) const;
  // A conversation built by the caller -> the prompt (on the pool when threads > 1).
  encoded_prompt encode(const conversation& c) const;

  // The parser for what the model generates after `r`'s prompt (its stream options).
  stream_parser create_stream_parser(const encoded_request& r) const;
  stream_parser create_stream_parser(const stream_options& o) const;

 private:
  struct state;
  explicit codec(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace troupe::recipe
