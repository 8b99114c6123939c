#pragma once
// The DeepSeek-V4 prompt encoder: a conversation -> the prompt text and its token ids.
//
// Only the encoder emits control tokens. Every piece of text that comes from the conversation
// (system prompts, user and assistant content, reasoning, tool definitions, tool-call names and
// arguments, tool results) is tokenized in encode_mode::raw, so no string in it can become an added
// token; the encoder's own markers (BOS, EOS, role markers, <think>, </think>, ｜DSML｜) are appended
// as ids. The format follows deepseek_recipe's DeepseekV4Encoding (docs/recipe.md).

#include "recipe/tokenizer.hpp"

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace troupe::recipe {

enum class role { system, user, assistant, tool };

struct tool_call {
  std::string id;
  std::string name;
  std::string arguments;  // caller-supplied; rendered as DSML parameters when it is a JSON object
};

struct message {
  recipe::role role = role::user;
  std::string content;
  std::optional<std::string> reasoning;  // assistant: reasoning_content
  std::vector<tool_call> tool_calls;     // assistant
  std::string tool_call_id;              // tool (not rendered by V4)
  bool prefix = false;                   // assistant, last message: continue it, no new turn
  // user: byte offsets in `content` where an image stands (ascending); rendered as V4.1's
  // `<｜image｜>` control token, or as the text "[Unsupported Image]" in V4.
  std::vector<std::size_t> images;
};

struct tool_definition {
  std::string name;
  std::optional<std::string> description;
  std::string parameters_json = "null";  // JSON Schema text (key order is kept)
  // A strict tool (`strict: true`): its parameters schema as the request sent it, which the
  // constraint engine enforces on the tool's calls (docs/structured-output.md), and the request
  // field holding it, for errors ("tools[0].function.parameters"). Not rendered.
  std::optional<std::string> strict_schema;
  std::string schema_param;
};

enum class tool_choice { automatic, none, required };

// The requested answer format. json_object and json_schema add an instruction to the system part of
// the prompt (as deepseek_recipe renders it); regex and grammar add nothing to the prompt. All of
// them are carried to the constraint engine.
struct response_format {
  enum class kind { text, json_object, json_schema, regex, grammar, structural_tag };
  response_format::kind type = kind::text;
  std::string schema_json;  // json_schema: the schema as sent (key order kept)
  std::string regex;        // regex: the pattern
  std::string grammar;      // grammar: the text, GBNF (start rule `root`) or Lark (start rule `start`)
  enum class grammar_syntax { gbnf, lark };
  grammar_syntax syntax = grammar_syntax::gbnf;  // grammar: as given, or detected (lark.hpp)
  std::string structural_tag;  // structural_tag: the tag as compact JSON (grammar/structural_tag.hpp)
  bool compact = false;  // json_object, json_schema: no whitespace at all (vLLM's disable_any_whitespace)
  // json_object, json_schema: the whitespace around `{ } [ ] , :` (vLLM's whitespace_pattern, a
  // regex matching only JSON whitespace); never with `compact`
  std::optional<std::string> whitespace_pattern;
};
enum class reasoning_effort { low, high, xhigh, max };

struct conversation {
  std::vector<message> messages;  // system messages may appear anywhere; they go first, joined
  std::vector<tool_definition> tools;
  recipe::tool_choice tool_choice = tool_choice::automatic;
  bool thinking = true;
  std::optional<reasoning_effort> effort;  // thinking mode only; unset = high
  std::optional<int> effort_level;         // V4.1's continuous scale, 1-100; wins over `effort` there
  response_format format;
  // Messages' tool_choice `any`: rendered as `auto` (as the reference renders it), but the
  // answer must be a block of calls, which structured output enforces.
  bool must_call = false;
  // Chat / Responses `parallel_tool_calls: false`, Messages `disable_parallel_tool_use: true`:
  // at most one call per answer (the prompt is unchanged; structured output enforces it).
  bool one_call = false;
};

struct encoded_prompt {
  std::string text;                 // the prompt as text (control tokens spelled out)
  std::vector<token_id> ids;
  std::vector<std::size_t> control;  // positions in ids that the encoder emitted as control tokens
};

// The prompt formats: DeepSeek-V4 (DeepseekV4Encoding) and DeepSeek-V4.1 (DeepseekV41Encoding).
enum class prompt_format { v4, v41 };

// Throws std::runtime_error when the prompt needs a control token the tokenizer lacks (the
// shipped V4 tokenizer has no `<｜System｜>`, which V4.1 prompts with a system part use).
encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok, prompt_format format = prompt_format::v4);

// The first control token of `format` that `tok` lacks, if any (the shipped V4 tokenizer has every
// V4 one but not V4.1's <｜System｜> / <｜image｜>): checked once, encode_prompt cannot fail later.
std::optional<std::string> missing_control_token(const tokenizer& tok, prompt_format format);

// The prompt text alone, with the byte ranges [begin, end) of the encoder's control tokens.
struct rendered_prompt {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> control;
};
rendered_prompt render_prompt(const conversation& c, prompt_format format = prompt_format::v4);

// The prompt before tokenization, in order: runs of conversation and encoder text (tokenized in
// encode_mode::raw, each on its own) and the encoder's control tokens (`control` set; `text` is the
// spelling). encode_prompt tokenizes the runs one after the other; recipe/parallel.hpp on a pool.
struct prompt_piece {
  std::string text;
  std::optional<token_id> control;
};
// Throws std::runtime_error, as encode_prompt does, when a control token is missing.
std::vector<prompt_piece> prompt_pieces(const conversation& c, const tokenizer& tok,
                                        prompt_format format = prompt_format::v4);
// The pieces with the ids of their text runs (one vector per run without `control`, in order).
encoded_prompt assemble_prompt(std::span<const prompt_piece> pieces,
                               std::span<const std::vector<token_id>> text_ids);

}  // namespace troupe::recipe
