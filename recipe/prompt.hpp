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
};

struct tool_definition {
  std::string name;
  std::optional<std::string> description;
  std::string parameters_json = "null";  // JSON Schema text (key order is kept)
};

enum class tool_choice { automatic, none, required };
enum class reasoning_effort { low, high, xhigh, max };

struct conversation {
  std::vector<message> messages;  // system messages may appear anywhere; they go first, joined
  std::vector<tool_definition> tools;
  recipe::tool_choice tool_choice = tool_choice::automatic;
  bool thinking = true;
  std::optional<reasoning_effort> effort;  // thinking mode only; unset = high
};

struct encoded_prompt {
  std::string text;                 // the prompt as text (control tokens spelled out)
  std::vector<token_id> ids;
  std::vector<std::size_t> control;  // positions in ids that the encoder emitted as control tokens
};

// Throws std::runtime_error when the tokenizer lacks one of the V4 control tokens.
encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok);

// The prompt before tokenization, in order: runs of conversation and encoder text (tokenized in
// encode_mode::raw, each on its own) and the encoder's control tokens (`control` set; `text` is the
// spelling). encode_prompt tokenizes the runs one after the other; recipe/parallel.hpp on a pool.
struct prompt_piece {
  std::string text;
  std::optional<token_id> control;
};
std::vector<prompt_piece> render_prompt(const conversation& c, const tokenizer& tok);
// The pieces with the ids of their text runs (one vector per run without `control`, in order).
encoded_prompt assemble_prompt(std::span<const prompt_piece> pieces,
                               std::span<const std::vector<token_id>> text_ids);

}  // namespace troupe::recipe
