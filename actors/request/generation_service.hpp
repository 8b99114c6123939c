// generation_service: the serving graph's front door for the API layer (generation.hpp).
//
// The entrypoint speaks in API requests turned into token ids; the graph speaks in request
// actors. This actor joins them: for each generation_request it checks what it can check
// without the model (a prompt, a positive max_tokens, a sink), makes the request's spec — the
// prompt, its block-key chain for the cluster KV cache, sampling, stop ids, the sink as the
// stream — spawns its request actor and replies with that actor's handle, through which the
// caller cancels it. The request actor then streams to the sink by itself (request.hpp).
#pragma once

#include "actors/request/generation.hpp"
#include "actors/request/request.hpp"

#include <caf/fwd.hpp>

#include <cstdint>

namespace troupe::actors {

struct generation_service_params {
  /// What every request talks to (balancers, KV CHECK role, where outcomes go).
  request_services services;
  /// Prompts longer than this (tokens) are refused with caf::sec::invalid_argument.
  std::uint64_t max_context = 1 << 20;
};

/// Spawns the service. A refused request (empty prompt, max_tokens 0, no sink, over
/// max_context) is answered with an error and spawns nothing. Ids must be unique among the
/// requests in flight (the entrypoint numbers them): a request's id names its sequence on
/// the devices.
generation_service spawn_generation_service(caf::actor_system& sys,
                                            generation_service_params params);

} // namespace troupe::actors
