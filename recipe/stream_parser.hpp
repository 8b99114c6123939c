#pragma once
// The streaming output parser: generated token ids -> protocol-neutral events (text and reasoning
// deltas, DSML tool calls with the name as soon as it is known and the arguments as JSON deltas,
// the finish reason, usage), and their rendering as Chat Completions stream chunks.
//
// Control tokens are recognised by id only: `</think>` ends the reasoning, `｜DSML｜` (after a `<` or
// `</` of ordinary text) opens or closes a DSML tag, `<｜end▁of▁sentence｜>` ends the output. A model
// output that spells one of these strings with ordinary tokens is text. Text is returned as soon as
// it is confirmed: the parser holds back only a trailing `<` / `</` that a DSML id could turn into
// a tag, trailing newlines that the next tag or `</think>` would trim, the beginning of a stop
// sequence, and an incomplete UTF-8 sequence. The event semantics follow deepseek_recipe 0.2.0's stream processor (goldens:
// tests/recipe/golden/stream.v4.jsonl.gz; docs/recipe.md lists where ours differs).

#include "recipe/tokenizer.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::recipe {

// Why the backend stopped generating. The protocol finish reason also depends on the output (a
// tool call turns `stop` into `tool_calls`).
enum class backend_finish { stop, length, content_filter };
enum class finish_reason { stop, length, tool_calls, content_filter };
std::string_view to_string(finish_reason r);

struct usage_counts {
  std::uint64_t prompt_tokens = 0;
  std::uint64_t cached_prompt_tokens = 0;
  std::uint64_t completion_tokens = 0;  // every id pushed, the end-of-sentence id included
  // Ids that put at least one byte into the reasoning text (deepseek_recipe's count: leading and
  // trimmed newlines and `</think>` do not count). Set in thinking mode (every start but `content`
  // and `tool_calls`).
  std::optional<std::uint64_t> reasoning_tokens;

  bool operator==(const usage_counts&) const = default;
};

struct stream_event {
  enum class kind {
    text,         // `text`: a content delta
    reasoning,    // `text`: a reasoning delta
    tool_call,    // a tool call begins: `index`, `text` = the function name
    arguments,    // `index`, `text` = a delta of the call's arguments (JSON text)
    finish,       // `finish`; `text` = the stop sequence that ended the output, if one did
    usage,        // `usage`
  };
  kind type = kind::text;
  std::string text;
  int index = 0;
  recipe::finish_reason finish = finish_reason::stop;
  usage_counts usage;
  // `text`: the generated ids (their positions among the ids pushed, from 0) whose first byte
  // of answer text this delta carries. An id that puts no byte into the answer text (reasoning,
  // tool calls, `</think>`, the end of sentence, trimmed newlines, a stop sequence and what
  // follows it) is in no event; the ids of all text events, in order, are the answer's ids.
  std::vector<std::uint32_t> tokens;

  bool operator==(const stream_event&) const = default;
};

// Where the generated text starts, from the prompt's end (deepseek_recipe's ParsingOptions).
enum class stream_start {
  content,                 // a new answer (chat mode): leading newlines are dropped
  content_continuation,    // thinking mode, an assistant prefix past its reasoning: newlines kept
  reasoning,               // after `<think>` (thinking mode): leading newlines dropped
  reasoning_continuation,  // an assistant prefix inside reasoning: newlines kept
  tool_calls,              // inside the `<｜DSML｜tool_calls>` block the prompt opened (required)
};

struct stream_options {
  stream_start start = stream_start::content;
  bool parse_tool_calls = false;  // tools are active: parse DSML (else `｜DSML｜` is text)
  std::uint64_t prompt_tokens = 0;
  std::uint64_t cached_prompt_tokens = 0;
  // Stop sequences (the request's `stop`): the answer text ends before the first one that
  // appears, and the finish reason is `stop`. Reasoning and tool-call arguments are not checked
  // (as deepseek_recipe). A text that could still become one is held back.
  std::vector<std::string> stop;
};

class stream_parser {
 public:
  // The control ids come from `tok`; an error names a control token the tokenizer lacks.
  static std::variant<stream_parser, std::string> create(const tokenizer& tok, stream_options options);

  // Feeds generated ids; appends the events they confirm to `out` (adjacent deltas of one kind
  // merged). Ids after the end-of-sentence id, a stop sequence, or finish() are ignored.
  void push(token_id id, std::vector<stream_event>& out);
  void push(std::span<const token_id> ids, std::vector<stream_event>& out);
  // The backend has stopped: emits what is still held, then the finish and the usage event.
  void finish(backend_finish why, std::vector<stream_event>& out);

  bool finished() const { return finished_; }
  // The output has ended inside the parser: the end-of-sentence id or a stop sequence was seen,
  // so later ids are ignored (a server can cancel the generation that feeds it).
  bool ended() const { return ended_; }
  // The output ended at a stop sequence (the text before it was emitted).
  bool stopped_by_sequence() const { return stopped_; }
  const usage_counts& usage() const { return usage_; }

 private:
  enum class state {
    content, content_tag, block, block_tag, value, value_tag, after_block, reasoning
  };
  stream_parser(const tokenizer& tok, stream_options options, token_id end_think, token_id think,
                token_id dsml, token_id eos);
  void on_byte(char b, std::vector<stream_event>& out);
  void on_dsml(std::vector<stream_event>& out);
  void emit(stream_event::kind k, std::string_view s, std::vector<stream_event>& out, int index = 0);
  void emit_text(stream_event::kind k, std::string_view bytes, std::vector<stream_event>& out);
  void emit_content(std::string_view bytes, std::vector<stream_event>& out);
  void flush_utf8(std::vector<stream_event>& out);
  void release_hold(std::vector<stream_event>& out);
  void end_tag(std::vector<stream_event>& out);
  void abort_content_tag(std::vector<stream_event>& out);
  void end_of_output(std::vector<stream_event>& out);
  // Which id each byte of answer text in flight (held newlines or `<`, the stop-sequence
  // buffer, an incomplete UTF-8 tail) came from: bytes enter with the current id, leave in
  // order as text is emitted (the ids not listed yet go to the next text event) or are dropped
  // from the newest end (trimmed, or cut by a stop sequence).
  void content_in(std::size_t n);
  void content_out(std::size_t n);
  void content_drop(std::size_t n);

  const tokenizer* tok_;
  stream_options opt_;
  token_id end_think_, think_, dsml_, eos_;
  state st_;
  bool drop_leading_ = false;   // drop newlines at the start of reasoning / content
  std::string hold_;            // held text: trailing newlines, then a `<` or `</`
  std::string tag_;             // the text of a DSML tag after `｜DSML｜`, up to `>`
  bool tag_closing_ = false;    // the tag started with `</`
  bool tag_in_quotes_ = false;
  std::string utf8_;            // incomplete UTF-8 tail of the current text stream
  stream_event::kind utf8_kind_ = stream_event::kind::text;
  int call_index_ = -1;         // the current tool call
  int calls_ = 0;
  bool call_has_args_ = false;
  bool value_is_string_ = false;
  std::string stop_buf_;        // answer text that may be the start of a stop sequence
  bool stopped_ = false;        // a stop sequence ended the output
  std::string stop_sequence_;   // ... this one
  bool ended_ = false;          // end-of-sentence or a stop sequence seen
  bool finished_ = false;
  // reasoning token accounting
  bool token_put_ = false;      // the current id put a byte into the reasoning text
  bool token_held_ = false;     // ... or only into the held newlines
  std::uint64_t held_tokens_ = 0;
  usage_counts usage_;
  // answer text ids
  std::uint32_t token_ = 0;                                     // the id being pushed
  std::deque<std::pair<std::uint32_t, std::size_t>> content_src_;  // (id, bytes), oldest first
  std::int64_t content_listed_ = -1;                            // the last id put in an event
  std::vector<std::uint32_t> content_ids_;                      // ids for the next text event
};

// Renders neutral events as OpenAI chat.completion.chunk objects (JSON text, one per chunk), in the
// shape deepseek_recipe 0.2.0 writes them: a first chunk with the assistant role, one chunk per
// delta (`content`, `reasoning_content`, `tool_calls`), the finish reason in a last chunk that also
// carries the usage. With `include_usage`, every other chunk has `"usage": null`.
struct chat_chunk_options {
  std::string id;
  std::string model;
  std::int64_t created = 0;
  bool thinking = false;       // deltas name both content and reasoning_content
  bool starts_in_reasoning = true;  // thinking mode: the role chunk opens reasoning (else content)
  bool include_usage = false;  // stream_options.include_usage
  // The id of tool call `index`; default: "call_<index as 2 digits>_<24 characters>" drawn from a
  // generator seeded by the chunk id.
  std::function<std::string(int index)> tool_call_id;
  // Logprobs on: a text delta's chunk carries `"logprobs": {"content": <this>, "refusal": null}`,
  // the JSON array of the entries of the event's `tokens` (other chunks: `"logprobs": null`).
  std::function<std::string(const stream_event&)> logprobs;
};

class chat_chunk_renderer {
 public:
  explicit chat_chunk_renderer(chat_chunk_options options);
  // The role chunk; call once, before the first render.
  std::string start();
  // The chunks for `events` (a finish event waits for the usage event that follows it).
  void render(std::span<const stream_event> events, std::vector<std::string>& out);

 private:
  std::string chunk(const std::string& delta_json, const char* finish, const std::string* usage,
                    const std::string* logprobs = nullptr) const;
  chat_chunk_options opt_;
  std::optional<recipe::finish_reason> finish_;
  std::uint64_t rng_;
};

// Helpers shared with the other protocol renderers.
// Appends `s` (valid UTF-8) JSON-escaped, without quotes: `"` `\` and control characters escaped
// (\n \r \t \b \f, others \u00XX), everything else as is.
void json_escape(std::string_view s, std::string& out);
// Default tool-call ids, as deepseek_recipe spells them: "call_<index as 2 digits>_" + 24 letters
// and digits drawn from a generator seeded by the response id.
std::uint64_t tool_call_id_seed(std::string_view response_id);
std::string next_tool_call_id(std::uint64_t& rng, int index);

}  // namespace troupe::recipe
