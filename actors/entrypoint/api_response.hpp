// api_response: one generation's token stream turned into the HTTP body its API expects.
//
// The serving graph answers with token ids; the client asked in one of three protocols, either
// for one JSON object or for a stream of server-sent events. This class holds the recipe's
// stream parser and renderer for one request and produces the exact bytes to send: SSE frames
// as tokens arrive (Chat Completions `data:` lines ending with `data: [DONE]`, Responses and
// Messages `event:` / `data:` pairs) or, for a non-streaming request, the protocol's response
// object once the generation has ended. It does no I/O and holds no lock: the connection that
// owns it calls it from its strand. Protocol logic stays in the recipe; this only assembles.
#pragma once

#include "actors/request/generation.hpp"
#include "recipe/recipe.hpp"
#include "recipe/results.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace troupe::actors {

/// One SSE frame: `data: <json>\n\n` for Chat Completions; `event: <type>\ndata: <json>\n\n`
/// for Responses and Messages, the event name being the object's `type` (read from `json`).
std::string sse_frame(recipe::protocol p, std::string_view json);

class api_response {
public:
  /// `request` is the encoded request (its protocol, stream flag, stop sequences); `id` the
  /// response id the client sees; `created` Unix seconds; `stop_ids` the ids that end the
  /// generation inside the graph (an output that ends on one needs no cancel).
  api_response(const recipe::codec& codec, recipe::encoded_request request, std::string id,
               std::int64_t created, std::vector<recipe::token_id> stop_ids);

  bool streaming() const noexcept { return request_.params.stream; }
  recipe::protocol protocol() const noexcept { return request_.protocol; }
  const std::string& id() const noexcept { return id_; }

  /// Streaming only: the opening frames (role chunk / response.created + in_progress /
  /// message_start). Call once, before push(). Returns "" for a non-streaming response.
  std::string open();

  /// Feeds generated ids. Streaming: returns the SSE frames they confirm (often "", while text
  /// is held back). Non-streaming: accumulates and returns "". Ids after the output ended (end
  /// of sentence, stop sequence) are ignored.
  std::string push(std::span<const std::int32_t> tokens);

  /// Feeds the log-probabilities of the ids about to be pushed (generation_tokens::logprobs),
  /// before push(). With logprobs on (Chat Completions `logprobs: true`; Responses `include`
  /// "message.output_text.logprobs"), the ids of the answer text are reported (token text,
  /// bytes, logprob, top alternatives): Chat Completions in `choices[0].logprobs.content` of
  /// the response or of each content chunk, Responses in the output_text part's `logprobs` and
  /// its delta / done events. An id belongs to the answer text when at least one of its bytes
  /// is in it (recipe::stream_event::tokens); its entry goes with the delta carrying its first
  /// byte. Ignored otherwise.
  void push_logprobs(std::span<const runtime::sampled_token> logprobs);

  /// True when the output ended here while the graph may still be generating: a stop sequence
  /// matched, or the end-of-sentence id came but was not the last id pushed. The caller then
  /// cancels the request; finish() with the `cancelled` end still completes normally.
  bool wants_cancel() const noexcept;

  /// True once a stop sequence has cut the output.
  bool stopped_by_sequence() const noexcept { return parser_.stopped_by_sequence(); }

  /// The generation ended with `end` (reason stop or length, or cancelled after wants_cancel()).
  /// Streaming: the closing frames (held text, finish, usage, `data: [DONE]` for Chat
  /// Completions). Non-streaming: the whole response object (JSON). Usage comes from `end`'s
  /// counts (prompt, cached, completion); reasoning tokens from the parser. Call once.
  std::string finish(const generation_end& end);

  /// An error after the response started. Streaming: one SSE frame in the protocol's error
  /// shape (Chat Completions `data: {"error": ...}`, Responses / Messages `event: error`).
  /// Non-streaming: the error body (the protocol's error JSON).
  std::string error(const recipe::api_error& e);

  /// Completion tokens the parser has seen (for metrics when the graph's count is missing).
  std::uint64_t tokens_pushed() const noexcept { return pushed_; }

private:
  void accumulate(const std::vector<recipe::stream_event>& events);
  std::string frames(const std::vector<std::string>& objects) const;

  /// The answer's logprobs in a non-streaming response with logprobs on.
  std::string with_logprobs(std::string response) const;

  const recipe::codec* codec_;
  bool logprobs_on_ = false;
  /// Per generated id, in order (shared with the stream renderer's callback).
  std::shared_ptr<std::vector<runtime::sampled_token>> logprobs_;
  std::vector<std::uint32_t> answer_ids_;  // non-streaming: the ids of the answer text
  recipe::encoded_request request_;
  std::string id_;
  std::int64_t created_;
  std::vector<recipe::token_id> stop_ids_;
  recipe::stream_parser parser_;
  std::optional<recipe::stream_renderer> renderer_;  // streaming only
  recipe::generation result_;                        // non-streaming only
  std::uint64_t tool_rng_;
  std::uint64_t pushed_ = 0;
  recipe::token_id last_ = 0;
  bool finished_ = false;
};

} // namespace troupe::actors
