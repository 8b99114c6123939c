// request: the actor that owns one request from admission to its last token.
//
// Every request is one actor carrying its state machine: encode its images first when it has
// any (on a vision instance chosen by least outstanding encoder work), match its prompt
// against the cluster KV cache (the CHECK role; metadata only), route to a prefill instance
// by uncached length, prefill (cached blocks are fetched, not computed), persist the
// prompt's full blocks, hand the KV to a decode instance chosen by request count and KV
// length, decode (which persists the blocks it fills), and report its outcome. It holds the
// balancers' bookings and releases them when a phase ends, so load figures stay true. Any
// error ends it with an explicit failure reason in its outcome: it is the unit of "nothing
// lost".
#pragma once

#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/lb/decode_lb.hpp"
#include "actors/lb/prefill_lb.hpp"
#include "actors/lb/vision_lb.hpp"
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_spec& x) {
  return f(caf::meta::type_name("request_spec"), x.id, x.input_tokens, x.output_tokens,
           x.chain, x.traffic, x.images, x.image_tokens);
}

/// How a request ended. Times are on the actor clock; a failed request has `failure` set and
/// the times of the phases it reached.
struct request_outcome {
  std::uint64_t id = 0;
  bool completed = false;
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
  /// asks for any), the rest as decode reports them. Equals `output_tokens` when completed.
  std::uint64_t delivered_tokens = 0;
  std::uint64_t hit_blocks = 0;
  std::uint64_t hit_tokens = 0;
  instance_id prefill_instance = 0;
  instance_id decode_instance = 0;
  /// The vision instance that encoded its images (0 without images).
  instance_id vision_instance = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_outcome& x) {
  return f(caf::meta::type_name("request_outcome"), x.id, x.completed, x.failure, x.admitted,
           x.vision_started, x.encoded, x.prefill_started, x.first_token, x.finished,
           x.input_tokens, x.output_tokens, x.delivered_tokens, x.hit_blocks, x.hit_tokens, x.prefill_instance,
           x.decode_instance, x.vision_instance);
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
};

/// Spawns the actor of `spec`; it starts at once and exits after sending its outcome.
caf::actor spawn_request(caf::local_actor* parent, request_spec spec,
                         const request_services& services);

} // namespace troupe::actors
