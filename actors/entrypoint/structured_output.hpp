// structured_output: the entrypoint's table of structured-output constraints, one per request.
//
// A request whose response format is json_object, json_schema, regex or grammar (Chat Completions
// `response_format`, Responses `text.format`, Messages `output_config.format`), or whose tools
// are strict or required or limited to one call, gets its grammar compiled (recipe/grammar/,
// cached by its key) and a matcher registered under its id — the sequence id the devices sample
// under. With tools the grammar is the tool-call block around the answer's format
// (recipe/grammar/tool_calls.hpp). The CPU device asks the table for each token's allowed ids and
// reports the id it drew (runtime::token_constraints), so the grammar code stays out of the
// ports. In thinking mode the constraint starts after the model's `</think>`: the reasoning is
// free text. docs/structured-output.md.
//
// The compile pool: a key not compiled before is compiled on the table's own worker threads
// while the request goes on to prefill, so compiling never holds the HTTP threads, and a request
// waits for its grammar only if prefill ends first (a device asking for its first mask waits
// there, in the port). The first mask of a new grammar is built in the pool too.
#pragma once

#include "recipe/api_error.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe/prompt.hpp"
#include "recipe/tokenizer.hpp"
#include "runtime/ports/token_constraints.hpp"

#include <boost/asio/thread_pool.hpp>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>

namespace troupe::actors {

class constraint_table final : public runtime::token_constraints {
public:
  /// The vocabulary is `tok`'s (its added tokens never allowed; `<｜end▁of▁sentence｜>` allowed
  /// when the output is complete). `compile_threads` (>= 1) workers compile new keys.
  /// `warm_next`: after each accepted token, a warming thread of its own builds what the next
  /// state's mask needs when it is a state not seen before, while the device runs its forward
  /// pass, and after a small grammar's compile it builds every state's (off only to measure what
  /// it saves: bench_grammar --device-step-us).
  explicit constraint_table(const recipe::tokenizer& tok, unsigned compile_threads = 2, bool warm_next = true);
  ~constraint_table() override;

  /// A request's constraint as text: what add() and restore() compile and what a
  /// constraint_spec carries between processes. format_key: "object", "schema:<JSON>",
  /// "regex:<pattern>", "grammar:<GBNF>", "lark:<Lark>", or empty for text. tools_key: "tools:<JSON>" (the
  /// tools' names and strict schemas, the DSML spelling, whether a call is required, whether
  /// parallel calls are off, and the answer's key) when the conversation's tools are on and some
  /// are strict, a call is required (tool_choice required or a named tool; Messages' `any`),
  /// parallel calls are off or the answer has a format; else
  /// `content_key` unchanged.
  static std::string format_key(const recipe::response_format& format);
  static std::string tools_key(const recipe::conversation& c, recipe::prompt_format f,
                               const std::string& content_key);

  /// What add() says, once: no error (the grammar is compiled and the device may sample under
  /// it), or why the constraint cannot be enforced.
  using verdict = std::function<void(std::optional<recipe::api_error>)>;

  /// Registers request `id` under the constraint `key` (an empty key registers nothing) and
  /// calls `done` once: here, if the key was compiled before, else from a compile thread when
  /// its compile ends — before any device may sample under it. Until then a device asking for
  /// the request's mask waits; after an error it may only end the output (and the caller ends
  /// the request). `param` names the request field in errors (`response_format`, `text.format`,
  /// ...), `tool_params[i]` the field of tool i's schema. Errors: a schema, pattern or grammar
  /// the engine refuses (status 400, the message naming the keyword and its JSON pointer, the
  /// pattern's offset, or the grammar's line and column).
  void add(std::uint64_t id, const std::string& key, bool thinking, const std::string& param,
           std::span<const std::string> tool_params, verdict done);

  /// What restore() says when the compile ran on a compile thread: nothing, or why the
  /// constraint cannot be rebuilt.
  using restored = std::function<void(std::optional<std::string>)>;
  /// What restore() did: rebuilt the constraint, refused it (`why`), or registered the request
  /// while a compile thread compiles (the verdict goes to `later`).
  struct restore_result {
    enum { rebuilt, refused, compiling } state = rebuilt;
    std::string why;
  };
  /// Rebuilds request `id`'s constraint in this process (an instance process of `troupe
  /// launch`, whose devices sample the request): compiles the key `spec.format` (cached as add()
  /// does) and feeds the matcher the output tokens of `context` (the ids at absolute positions
  /// spec.output_start .. context.size() - 1, drawn elsewhere), so that the next position
  /// sampled here is constrained where the request's output stands. Replaces an entry of the
  /// same id. A key compiled before is rebuilt here and now (rebuilt, or refused: nothing is
  /// registered then) when the output so far is short (256 tokens); otherwise (compiling) the
  /// request is registered at once and compiled or replayed on a compile thread while its job
  /// goes on (reasoning before a `</think>` is sampled freely
  /// meanwhile; a device asking for a constrained mask waits); `later` hears the verdict there,
  /// before any device may sample under the grammar, and after an error a device may only end
  /// the output (the caller ends the job). Errors: a format that does not compile, or a context
  /// token the grammar refuses.
  restore_result restore(std::uint64_t id, const runtime::constraint_spec& spec,
                         std::vector<std::int32_t> context, restored later);
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
    std::shared_ptr<compiled> c;                  // null while compiling, or when it failed
    std::optional<recipe::grammar::matcher> m;    // set with c
    bool in_reasoning = false;                    // thinking mode, before `</think>`
    bool failed = false;                          // the compile failed: the output may only end
    std::optional<std::uint64_t> next;            // the position of the next constrained token
    std::uint64_t restore = 0;                    // the restore() that registered it (0: none)
  };
  /// An entry and the lock of its device side (m, next, in_reasoning; c, failed and restore
  /// are set with the table's lock held too): a device builds a mask holding only this one.
  struct slot {
    explicit slot(entry x) : e(std::move(x)) {}
    std::mutex mu;
    entry e;
  };
  void eos_only(std::span<std::uint32_t> mask) const;
  /// The compiled grammar of `key` (from the cache, or compiled outside the lock and kept).
  std::variant<std::shared_ptr<compiled>, recipe::api_error> compile(const std::string& key, const std::string& param,
                                                                     std::span<const std::string> tool_params);
  /// accepted() with the entry's lock held (or on an entry no other thread sees); false if the
  /// grammar refused the token.
  bool accept_locked(entry& e, std::uint64_t position, std::int32_t token);
  /// The entry of a request whose output so far is `context` (restore()), or why there is none.
  std::variant<entry, std::string> replayed(std::shared_ptr<compiled> c, const runtime::constraint_spec& spec,
                                            std::span<const std::int32_t> context);

  mutable std::mutex mu_;
  std::shared_ptr<const recipe::grammar::vocabulary> vocab_;
  std::optional<recipe::token_id> think_end_;
  bool warm_next_ = true;
  recipe::grammar::token_names tokens_;  // what structural tags' token-level formats name
  std::map<std::string, std::shared_ptr<compiled>> cache_;  // by key
  std::map<std::uint64_t, std::shared_ptr<slot>> entries_;
  std::uint64_t restores_ = 0;  // restore() calls that compile: an entry's compile fills only its own
  std::condition_variable compiled_;  // an entry's compile ended
  boost::asio::thread_pool pool_;     // last: joined before the members its jobs use go
  /// Warming masks (warm_next): a thread of its own, so that a compile never waits behind it.
  boost::asio::thread_pool warm_pool_{1};
};

}  // namespace troupe::actors
