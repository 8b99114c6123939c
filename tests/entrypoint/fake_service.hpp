// fake_service: a scripted generation_service for the entrypoint's tests.
//
// The HTTP entrypoint is tested against the generation interface only (actors/request/
// generation.hpp), not the real serving graph. This service answers each generation_request
// with a request actor that streams a scripted list of token ids to the request's sink, one
// message per `per_message` ids every `delay`, honouring max_tokens (finish `length`), the
// request's stop ids (finish `stop` after sending one) and cancel_atom (finish `cancelled`).
// Scripted failures: refuse the request, end with an error after some tokens, or exit without
// a generation_end. Everything it saw is recorded in a thread-safe log the tests read.
#pragma once

#include "actors/request/generation.hpp"
#include "recipe/recipe.hpp"

#include <caf/actor_system.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::test {

struct fake_script {
  std::vector<std::int32_t> tokens;
  std::chrono::milliseconds delay{1};
  std::size_t per_message = 1;
  /// Refuse the request (the service answers with an error).
  bool refuse = false;
  /// After this many tokens, end with finish_reason::error.
  std::optional<std::size_t> fail_after;
  /// After this many tokens, the request actor exits without a generation_end.
  std::optional<std::size_t> exit_after;
  /// Ignore cancel_atom (the entrypoint must give the request up by itself).
  bool ignore_cancel = false;
};

/// What the fake service saw; every member is read under `mtx`.
struct fake_log {
  mutable std::mutex mtx;
  std::vector<actors::generation_request> requests;  // as received (sink included)
  std::size_t cancels = 0;       // cancel_atom received by request actors
  std::size_t ends = 0;          // generation_end sent
  std::size_t active = 0;        // request actors alive
  std::vector<actors::finish_reason> reasons;

  std::size_t request_count() const;
  std::size_t cancel_count() const;
  std::size_t active_count() const;
  std::optional<actors::generation_request> last_request() const;
};

/// Chooses the script of each request (called from the service actor).
using script_chooser = std::function<fake_script(const actors::generation_request&)>;

/// Spawns the service; `log` records what it saw.
actors::generation_service spawn_fake_service(caf::actor_system& sys, script_chooser choose,
                                              std::shared_ptr<fake_log> log);

// -- scripts in the model's output format (ids of the shipped DeepSeek-V4 tokenizer) ---------

/// `text` then the end of sentence.
std::vector<std::int32_t> text_tokens(const recipe::codec& c, std::string_view text);
/// Reasoning, `</think>`, the answer, the end of sentence.
std::vector<std::int32_t> reasoning_tokens(const recipe::codec& c, std::string_view reasoning,
                                           std::string_view answer);
/// A DSML call of get_weather(city = `city`, days = 3) after `preface`, then the end of
/// sentence; the city is long enough to take many tokens.
std::vector<std::int32_t> tool_call_tokens(const recipe::codec& c, std::string_view preface,
                                           std::string_view city);

/// The tokenizer shipped in the repository, loaded once per process.
const recipe::codec& shipped_codec();

} // namespace troupe::test
