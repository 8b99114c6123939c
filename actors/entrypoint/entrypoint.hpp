// entrypoint: the HTTP/1.1 API server (OpenAI Chat Completions and Responses, Anthropic
// Messages, models, health, readiness, metrics) in front of the serving graph.
//
// The product is a server that the official OpenAI and Anthropic SDKs talk to. This is that
// server: Boost.Beast on an Asio io_context with threads of its own (a port: sockets never run
// on CAF's scheduler threads and no actor ever blocks on one). A generation request is encoded
// with the recipe (recipe::codec), admitted against a bound on requests in flight, and handed
// to the generation service as a `generation_request` whose sink is a small actor per request
// (generation_sink.hpp) that posts the graph's messages back to the connection's strand; the
// output goes back as one JSON object or as server-sent events in the API's own format. Every
// failure a client can cause is answered in the API's own error shape with a 4xx status, and
// the server keeps serving; a client that leaves mid-stream cancels its request. `stop(grace)`
// stops accepting, lets requests in flight finish within the grace, cancels the rest and
// returns. docs/api.md describes the routes, statuses, limits and metrics.
//
//   troupe::actors::entrypoint_params p;
//   p.codec = &codec; p.service = service; p.metrics = &registry; p.models = {"DeepSeek-V4-Flash"};
//   troupe::actors::entrypoint server(system, p);
//   auto port = server.start();            // caf::expected<uint16_t>: the bound port
//   ...
//   server.stop(std::chrono::seconds(30));  // on SIGTERM
#pragma once

#include "actors/entrypoint/structured_output.hpp"
#include "actors/request/generation.hpp"
#include "recipe/recipe.hpp"
#include "runtime/metrics.hpp"

#include <caf/actor_system.hpp>
#include <caf/expected.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace troupe::actors {

struct entrypoint_params {
  /// Address to listen on (an IP literal; "0.0.0.0" / "::" for all interfaces).
  std::string address = "127.0.0.1";
  /// TCP port; 0 picks a free one (start() returns it).
  std::uint16_t port = 0;
  /// Model names listed by /v1/models; a request naming another one is refused with 404.
  /// Empty: any name is accepted (the codec's own model list still applies).
  std::vector<std::string> models;
  /// Accepted API keys (`Authorization: Bearer <key>` or `x-api-key: <key>` on /v1/ routes);
  /// empty = no authentication.
  std::set<std::string> api_keys;
  /// Largest request body accepted (413 above).
  std::size_t max_body_bytes = 16u << 20;
  /// Largest request header block accepted (431 above).
  std::size_t max_header_bytes = 32u << 10;
  /// Generation requests in flight at once (admission; 429 with Retry-After beyond).
  std::uint32_t max_in_flight = 256;
  /// Context window: a prompt of this many tokens or more is refused (400); max_tokens is
  /// lowered to what is left of it.
  std::uint32_t max_context_tokens = 131072;
  /// The grace troupe serve passes to stop() on SIGTERM (stop() takes its own argument).
  std::chrono::milliseconds grace{30000};
  /// A request's header and body must arrive within this time after the server starts
  /// waiting for it (408 when part of it came; a silent close for an idle keep-alive
  /// connection).
  std::chrono::milliseconds read_timeout{30000};
  /// A client that takes no bytes for this long while a response is written is dropped (and
  /// its request cancelled).
  std::chrono::milliseconds write_timeout{30000};
  /// The generation service must answer a request (with its request actor) within this.
  std::chrono::milliseconds service_timeout{30000};
  /// A cancelled request must send its generation_end within this, else it is given up.
  std::chrono::milliseconds cancel_timeout{5000};
  /// Value of Retry-After on 429 and 503 responses.
  std::chrono::seconds retry_after{1};
  /// Threads running the io_context (>= 1).
  unsigned io_threads = 2;
  /// KV cache TTL class of the requests' blocks.
  traffic_class traffic = traffic_class::chatbot;
  /// The recipe codec (tokenizer, request parsers, stream parser); must outlive the server.
  const recipe::codec* codec = nullptr;
  /// The serving graph's front door.
  generation_service service;
  /// The process registry /metrics serves; must outlive the server. Null: the server keeps
  /// a registry of its own.
  runtime::registry* metrics = nullptr;
  /// Structured output (structured_output.hpp), shared with the devices that sample; null: a
  /// request with a json_object / json_schema / regex format is refused (400).
  std::shared_ptr<constraint_table> constraints;
};

class entrypoint {
public:
  /// A server on `sys` (which must outlive it) with `params`; nothing runs until start().
  entrypoint(caf::actor_system& sys, entrypoint_params params);
  /// stop(0) when still running.
  ~entrypoint();

  entrypoint(const entrypoint&) = delete;
  entrypoint& operator=(const entrypoint&) = delete;

  /// Binds, listens and starts the io threads. Returns the bound port, or an error
  /// (`caf::sec::runtime_error` with a message) when the parameters are invalid (no codec, no
  /// service, no io thread, max_in_flight 0), the address does not parse, the port cannot be
  /// bound, the metric names conflict, or the server was started before (a stopped server
  /// does not start again).
  caf::expected<std::uint16_t> start();

  /// Stops accepting connections, answers new requests on open connections with 503, closes
  /// idle connections, and waits up to `grace` for the requests in flight to finish. Then it
  /// cancels those left (their clients get an error response or event), waits up to
  /// cancel_timeout for them to end, closes every connection, stops the io threads and
  /// returns. Safe to call more than once and before start() (then it does nothing). Must not
  /// be called from an io thread or an actor (it blocks).
  void stop(std::chrono::milliseconds grace);

  /// The bound port (0 before start()).
  std::uint16_t port() const noexcept;

  /// Marks the server (not) ready: /ready answers 503 while not ready. Ready by default once
  /// started; never ready again after stop() began.
  void set_ready(bool ready) noexcept;

  /// True while /ready answers 200.
  bool ready() const noexcept;

  /// Admitted generation requests not yet released (the in-flight gauge's value).
  std::size_t in_flight() const noexcept;

  /// The registry /metrics serves (params.metrics, or the server's own).
  runtime::registry& metrics() noexcept;

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::actors
