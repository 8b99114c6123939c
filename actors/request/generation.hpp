// generation: what the API layer asks the serving graph for, and the stream it gets back.
//
// The HTTP entrypoint turns an API request (Chat Completions, Responses, Messages) into token
// ids with the recipe and hands the graph a `generation_request`: the prompt, how to sample,
// when to stop, and the actor that receives the output (the stream sink of its connection).
// The graph answers with the handle of the request actor that owns it (one per request, in
// both worlds); sending that actor `cancel_atom` ends the request wherever it is (a client
// that disconnected), freeing its KV. The sink then receives, in order:
//
//   generation_tokens*  the tokens generated so far, in order, none twice (a reroute after a
//                       failure resumes after the last token sent);
//   generation_end      exactly once: why it ended, and the usage counts.
//
// Stop *strings* are text, so the entrypoint matches them on the detokenised stream and
// cancels; stop token ids (the model's end-of-turn tokens, the request's stop ids) end a
// request inside the graph, the stop token itself being the last one sent.
#pragma once

#include "actors/kv/kv_index.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/token_constraints.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::actors {

struct generation_request {
  /// Unique among the requests in flight (the entrypoint numbers them).
  std::uint64_t id = 0;
  /// The prompt's token ids, as the recipe encoded them.
  std::vector<std::int32_t> prompt;
  runtime::sampling sampling;
  /// Generate at most this many tokens (> 0).
  std::uint32_t max_tokens = 0;
  /// The request ends after sending one of these (e.g. the end-of-turn token).
  std::vector<std::int32_t> stop_ids;
  /// The KV cache TTL class of the blocks it leaves behind.
  traffic_class traffic = traffic_class::chatbot;
  /// The structured-output constraint the entrypoint compiled and registered under `id` (its
  /// format empty: none); it travels with the request's jobs (token_constraints.hpp).
  runtime::constraint_spec constraint;
  /// Receives generation_tokens, then one generation_end.
  caf::actor sink;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_request& x) {
  return f(caf::meta::type_name("generation_request"), x.id, x.prompt, x.sampling, x.max_tokens,
           x.stop_ids, x.traffic, x.constraint, x.sink);
}

/// Tokens of request `id`, in order, continuing the ones sent before; `logprobs` has one entry
/// per token when the request's sampling asked for them (top_logprobs >= 0), else is empty.
struct generation_tokens {
  std::uint64_t id = 0;
  std::vector<std::int32_t> tokens;
  std::vector<runtime::sampled_token> logprobs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_tokens& x) {
  return f(caf::meta::type_name("generation_tokens"), x.id, x.tokens, x.logprobs);
}

enum class finish_reason : std::uint8_t {
  stop,       // a stop token was generated
  length,     // max_tokens were generated
  cancelled,  // cancel_atom (the client left, or the entrypoint matched a stop string)
  error,      // the graph could not serve it: `error` says why
};

std::string to_string(finish_reason r);

/// The last message of request `id`'s stream.
struct generation_end {
  std::uint64_t id = 0;
  finish_reason reason = finish_reason::stop;
  /// Why it failed (reason == error), for the client and the log.
  std::string error;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  /// Prompt tokens whose KV came from the cluster KV cache instead of being computed.
  std::uint32_t cached_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_end& x) {
  return f(caf::meta::type_name("generation_end"), x.id, x.reason, x.error, x.prompt_tokens,
           x.completion_tokens, x.cached_tokens);
}

/// Sent to a request actor: end the request now (its sink gets generation_end `cancelled`).
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;

/// The serving graph's front door: spawns the request actor of a generation_request and
/// replies with its handle (for cancel_atom). A request the graph cannot take at all (e.g. it
/// is shutting down) is answered with an error, and its sink gets nothing.
using generation_service = caf::typed_actor<caf::replies_to<generation_request>::with<caf::actor>>;

} // namespace troupe::actors
