// generation_sink: the actor that stands for one HTTP request in the actor graph.
//
// The serving graph streams a request's output to an actor (`generation_request::sink`), but
// an HTTP connection lives on an Asio strand, not in the actor system, and must never block
// an actor. The sink bridges the two: it sends the request to the generation service, keeps
// the request actor's handle, and posts every generation message to the connection's strand
// through a `post` function. The connection talks back with one message, `cancel_atom`
// (client gone, stop string matched, shutdown), which the sink forwards to the request actor
// (at once, or as soon as the service has answered). The sink ends when the generation ends:
// after generation_end, after the service refused, when the request actor exits without an
// end, or when a cancelled request does not end within `cancel_timeout`; so no request it
// started outlives it unnoticed, and what it holds (the admission ticket) is released.
#pragma once

#include "actors/request/generation.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace troupe::actors {

/// What the connection learns from its sink. Each call runs on the connection's strand, in
/// the order the sink saw the messages; after on_end / on_rejected / on_lost nothing follows.
class generation_listener {
public:
  virtual ~generation_listener() = default;
  /// The service took the request (the request actor exists). Tokens may come before this.
  virtual void on_accepted() = 0;
  /// The service refused the request or did not answer in time; `why` is for the client.
  virtual void on_rejected(std::string why) = 0;
  /// Tokens, in order.
  virtual void on_tokens(generation_tokens tokens) = 0;
  /// The last message of the stream.
  virtual void on_end(generation_end end) = 0;
  /// The request ended without generation_end (its actor exited, or it ignored a cancel).
  virtual void on_lost(std::string why) = 0;
};

struct generation_sink_config {
  generation_service service;
  /// The request; its `sink` is set to the spawned actor.
  generation_request request;
  /// How long the service may take to answer with the request actor.
  std::chrono::milliseconds service_timeout{30000};
  /// How long a cancelled request may take to send generation_end before it is given up.
  std::chrono::milliseconds cancel_timeout{5000};
  /// Runs a function on the connection's strand; drops it once the server is gone. Called
  /// from the sink's thread; must not block beyond a short lock.
  std::function<void(std::function<void()>)> post;
  /// The connection; a listener that is gone is skipped (the sink still cancels and ends).
  std::weak_ptr<generation_listener> listener;
  /// Released when the sink exits (e.g. an admission slot).
  std::shared_ptr<void> ticket;
};

/// Spawns a sink that at once sends `cfg.request` to `cfg.service`. Returns its handle: send
/// it `cancel_atom` to end the request. Thread-safe (any thread may call it).
caf::actor spawn_generation_sink(caf::actor_system& sys, generation_sink_config cfg);

} // namespace troupe::actors
