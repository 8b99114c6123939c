// structured_output: the entrypoint's table of structured-output constraints, one per request.
//
// A request whose response format is json_object, json_schema, regex or grammar (Chat Completions
// `response_format`, Responses `text.format`) gets its grammar compiled when the entrypoint
// parses it (recipe/grammar/, cached by format text), and a matcher registered under its id —
// the sequence id the devices sample under. The CPU device asks the table for each token's
// allowed ids and reports the id it drew (runtime::token_constraints), so the grammar code
// stays out of the ports. In thinking mode the constraint starts after the model's `</think>`:
// the reasoning is free text. docs/structured-output.md.
#pragma once

#include "recipe/api_error.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe/prompt.hpp"
#include "recipe/tokenizer.hpp"
#include "runtime/ports/token_constraints.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace troupe::actors {

class constraint_table final : public runtime::token_constraints {
public:
  /// The vocabulary is `tok`'s (its added tokens never allowed; `<｜end▁of▁sentence｜>` allowed
  /// when the output is complete).
  explicit constraint_table(const recipe::tokenizer& tok);

  /// Compiles `format` and registers it for request `id`; a text format registers nothing.
  /// `param` names the request field in errors (`response_format`, `text.format`). Errors: a
  /// schema, pattern or grammar the engine refuses (status 400, the message naming the keyword
  /// and its JSON pointer, the pattern's offset, or the grammar's line and column).
  std::optional<recipe::api_error> add(std::uint64_t id, const recipe::response_format& format, bool thinking,
                                       const std::string& param);
  /// Forgets request `id` (its generation ended); unknown ids are ignored.
  void remove(std::uint64_t id);
  std::size_t size() const;

  bool allowed(std::uint64_t sequence, std::uint64_t position, std::span<std::uint32_t> mask) override;
  void accepted(std::uint64_t sequence, std::uint64_t position, std::int32_t token) override;

private:
  struct compiled {
    std::shared_ptr<const recipe::grammar::grammar> grammar;
    std::unique_ptr<recipe::grammar::mask_computer> masks;
  };
  struct entry {
    std::shared_ptr<compiled> c;
    recipe::grammar::matcher m;
    bool in_reasoning = false;            // thinking mode, before `</think>`
    std::optional<std::uint64_t> next;    // the position of the next constrained token
  };
  void eos_only(std::span<std::uint32_t> mask) const;

  mutable std::mutex mu_;
  std::shared_ptr<const recipe::grammar::vocabulary> vocab_;
  std::optional<recipe::token_id> think_end_;
  std::map<std::string, std::shared_ptr<compiled>> cache_;  // by kind + text
  std::map<std::uint64_t, entry> entries_;
  std::vector<std::uint32_t> scratch_;
};

}  // namespace troupe::actors
