// request: the actor that owns one request from admission to its last token.
//
// Every request is one actor carrying its state machine: encode its images first when it has
// any (on a vision instance chosen by least outstanding encoder work), match its prompt
// against the cluster KV cache (the CHECK role; metadata only), route to a prefill instance
// by uncached length, prefill (cached blocks are fetched, not computed), persist the
// prompt's full blocks, hand the KV to a decode instance chosen by request count and KV
// length, decode (which persists the blocks it fills), and report its outcome. It holds the
// balancers' bookings and releases them when a phase ends, so load figures stay true. It is
// the unit of "nothing lost":
//
//   - it watches the engine it has a job on (engine_watch.hpp: a monitor's down message at
//     less cost); when that engine's instance goes down (a rank failed: the instance stops
//     as a whole), or the job cannot reach it, the request
//     REROUTES: it releases its booking and goes back through match → prefill_lb → prefill →
//     decode_lb → decode on instances that are up. Its persisted blocks (the prompt's, stored
//     as its first prefill ended) still hit, so a re-prefill computes only what is not
//     persisted. A request whose decode instance died resumes from prompt + the tokens
//     already delivered: decode reports progress every `progress_every` tokens
//     (decode_progress), those tokens have reached the client, and the rest are generated
//     elsewhere — none is delivered twice, and the client sees one stream;
//   - when its decode instance drains and hands it off (decode_done marked `forwarded`, with
//     the exact tokens generated there), it goes straight back to decode_lb WITH its KV: the
//     new decode job carries (prompt + tokens delivered) × kv_bytes_per_token, which crosses
//     the new instance's link; nothing is re-prefilled. A forward is not a reroute (it does
//     not count towards `max_reroutes`); `forwards` counts them;
//   - when no instance can take it (routing answers `unavailable`, e.g. while the only decode
//     instance restarts), it asks again every `retry_interval`, or at once when decode_lb
//     says room may have come (decode_room_atom: a booking ended, an instance joined);
//   - it fails with an explicit reason when it cannot be served within `deadline` of its
//     admission or after `max_reroutes` reroutes (the deadline is checked whenever it would
//     retry or reroute, not while a job runs);
//   - `cancel_atom` (generation.hpp: the client left) ends it in any phase: the engine holding
//     its job drops it and frees its KV, its balancer booking is released, and it ends as
//     failed ("cancelled").
//
// Its messages carry content: the prompt's token ids (the real world; the simulator, which
// only counts, leaves them empty), the sampling and stop ids, and the output token ids, which
// it streams to `stream` (generation_tokens, then one generation_end) as they are delivered.
// A re-prefill after a failure computes the prompt plus every token already delivered, and
// draws the next one.
#pragma once

#include "actors/history.hpp"
#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/decode_lb.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/lb/vision_lb.hpp"
#include "actors/request/engine_watch.hpp"
#include "actors/request/generation.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/token_constraints.hpp"
#include "runtime/time.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::actors {

/// What a request asks for.
struct request_spec {
  std::uint64_t id = 0;
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
  /// Keys of the prompt's full 128-token blocks (make_chain).
  std::vector<block_key> chain;
  traffic_class traffic = traffic_class::chatbot;
  /// Images attached to the prompt, and their encoder work in tokens (all images together).
  /// The image tokens are already counted in `input_tokens`.
  std::uint32_t images = 0;
  std::uint64_t image_tokens = 0;
  /// The prompt's token ids (`input_tokens` of them), or empty (the simulated world).
  std::vector<std::int32_t> prompt;
  runtime::sampling sampling;
  /// Generating one of these ends the request early (it is the last token sent).
  std::vector<std::int32_t> stop_ids;
  /// Receives generation_tokens and one generation_end (generation.hpp). May be invalid.
  caf::actor stream;
  /// Its structured-output constraint, passed on to its jobs (format empty: none).
  runtime::constraint_spec constraint;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_spec& x) {
  return f(caf::meta::type_name("request_spec"), x.id, x.input_tokens, x.output_tokens,
           x.chain, x.traffic, x.images, x.image_tokens, x.prompt, x.sampling, x.stop_ids,
           x.stream, x.constraint);
}

/// How a request ended. Times are on the actor clock; a failed request has `failure` set and
/// the times of the phases it reached.
struct request_outcome {
  std::uint64_t id = 0;
  std::string failure;
  runtime::time_point admitted{};
  /// When its images started encoding and were all encoded (both `admitted` without images).
  runtime::time_point vision_started{};
  runtime::time_point encoded{};
  runtime::time_point prefill_started{};
  /// The first token leaves with the end of prefill.
  runtime::time_point first_token{};
  runtime::time_point finished{};
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
  /// Output tokens the client received: the first with the end of prefill (when the request
  /// asks for any), the rest as decode reports them. Equals `output_tokens` when completed,
  /// unless a stop token ended it earlier (`stopped`).
  std::uint64_t delivered_tokens = 0;
  std::uint64_t hit_blocks = 0;
  std::uint64_t hit_tokens = 0;
  instance_id prefill_instance = 0;
  instance_id decode_instance = 0;
  /// The vision instance that encoded its images (0 without images).
  instance_id vision_instance = 0;
  /// Times its prefill or decode instance died under it and it went elsewhere.
  std::uint32_t reroutes = 0;
  /// Times its decode instance drained and handed it, with its KV, to another one.
  std::uint32_t forwards = 0;
  // (The flags sit beside the 32-bit counters: the simulator keeps one outcome per request,
  // 160 bytes each.)
  bool completed = false;
  /// Ended early by a stop token (see `delivered_tokens`).
  bool stopped = false;
  /// The delivered stream: every token id the client received, with its output position,
  /// in delivery order, folded with digest_token. In the simulated world it equals
  /// modelled_digest(0, id, input_tokens, 0, output_tokens) exactly when the client got the
  /// modelled tokens of positions 0, 1, ..., output_tokens - 1 once each, in order.
  std::uint64_t token_digest = 0;
};

/// `digest` extended by token `token` at output position `position` (order-sensitive).
std::uint64_t digest_token(std::uint64_t digest, std::uint64_t position,
                           std::int32_t token) noexcept;

/// `digest` extended by output positions [from, to) of request `request` as the simulated
/// device generates them (runtime::modelled_token at `input_tokens` + position: decoding is
/// modelled as deterministic, so a token depends only on its request and position, wherever
/// and after however many reroutes it is generated).
std::uint64_t modelled_digest(std::uint64_t digest, std::uint64_t request,
                              std::uint64_t input_tokens, std::uint64_t from,
                              std::uint64_t to) noexcept;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_outcome& x) {
  return f(caf::meta::type_name("request_outcome"), x.id, x.completed, x.failure, x.admitted,
           x.vision_started, x.encoded, x.prefill_started, x.first_token, x.finished,
           x.input_tokens, x.output_tokens, x.delivered_tokens, x.stopped, x.hit_blocks,
           x.hit_tokens, x.prefill_instance,
           x.decode_instance, x.vision_instance, x.reroutes, x.forwards, x.token_digest);
}

/// The services a request talks to, and where its outcome goes.
struct request_services {
  kv_check_actor kv;
  prefill_lb_actor prefill;
  decode_lb_actor decode;
  /// KV bytes per token of the model (for fetches and hand-offs).
  std::uint64_t kv_bytes_per_token = 890;
  /// Receives one request_outcome per request.
  caf::actor sink;
  /// The vision tier. May be invalid: a request with images then fails ("no vision tier").
  vision_lb_actor vision;
  /// A request not served within this time of its admission fails ("deadline").
  runtime::duration deadline = std::chrono::minutes(10);
  /// Reroutes after which a request gives up.
  std::uint32_t max_reroutes = 3;
  /// How long a request waits before asking a balancer again that had no instance for it.
  runtime::duration retry_interval = std::chrono::seconds(1);
  /// Decode reports delivered tokens every this many tokens (0: only at the end, so a decode
  /// failure would lose the count: do not use 0 with faults).
  std::uint64_t progress_every = 16;
  /// TEST ONLY (sim_params::test_drop_on_reroute): a planted bug — on a reroute the request
  /// drops the rest of its stream and reports itself completed.
  bool test_drop_on_reroute = false;
  /// TEST ONLY (sim_params::test_replay_on_reroute): a planted bug — after a decode failure
  /// the request forgets what it delivered and streams those positions again (the count
  /// comes out right, the stream does not).
  bool test_replay_on_reroute = false;
  /// Bytes of a request's sliding-window rings, added to the KV a drained decode instance
  /// forwards (they are never persisted, so they travel with the request).
  std::uint64_t swa_ring_bytes = 0;
  /// Real world: the parent of each prompt chain's first block (make_chain), a key naming the
  /// model, so that one model's cached blocks never match another's prompts. Decode continues
  /// a prompt shorter than a block from it.
  block_key chain_root{};
  /// Book the decode instance as the prefill begins, name it in the prefill job
  /// (prefill_job::kv_to) and have the job stream its full blocks (prefill_job::stream_kv), so
  /// that they move while the rest of the prompt computes: the KV bridges of `troupe launch`
  /// do, and the simulated world's hand-off then moves only the rest's bytes (`troupe sim
  /// --kv-stream on`). Off: decode is routed when the prefill ends (`troupe serve`, where the
  /// KV moves by handle in one process).
  bool stream_kv = false;
  /// Where the request records its admission, each token it delivers and its end
  /// (history.hpp); none when null.
  run_history_ptr history{};
  /// The watches of the requests on their jobs' engines (one registry per graph, shared by
  /// the copies of these services).
  engine_watch_ptr watch = std::make_shared<engine_watch>();
};

/// Spawns the actor of `spec`; it starts at once and exits after sending its outcome.
caf::actor spawn_request(caf::local_actor* parent, request_spec spec,
                         const request_services& services);

} // namespace troupe::actors
