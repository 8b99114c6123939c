// entrypoint_metrics: the Prometheus metrics of the HTTP entrypoint.
//
// An operator needs to see what the API layer does: how many requests each route answered with
// which status, how long the first token took and how evenly the rest followed, how many
// requests are in flight and how many still wait for their first token. The families are
// registered once in the process registry (so /metrics also shows whatever the serving graph
// registered there); every update is an atomic or a short lock, safe from any thread.
#pragma once

#include "runtime/metrics.hpp"

#include <caf/expected.hpp>

#include <string>

namespace troupe::actors {

struct entrypoint_metrics {
  /// troupe_http_requests_total{route,status}: responses sent (streams count when they end).
  runtime::counter_family* requests = nullptr;
  /// troupe_http_time_to_first_token_seconds{route}: from admission to the first token.
  runtime::histogram_family* ttft = nullptr;
  /// troupe_http_inter_token_latency_seconds{route}: gap between tokens after the first.
  runtime::histogram_family* inter_token = nullptr;
  /// troupe_http_request_duration_seconds{route}: from admission to the end of the response.
  runtime::histogram_family* duration = nullptr;
  /// troupe_http_requests_in_flight: admitted generations not yet released.
  runtime::gauge* in_flight = nullptr;
  /// troupe_http_requests_queued: admitted generations without their first token yet.
  runtime::gauge* queued = nullptr;
  /// troupe_http_connections_open: open client connections.
  runtime::gauge* connections = nullptr;
  /// troupe_http_generated_tokens_total: tokens received from the graph.
  runtime::counter* tokens = nullptr;
  /// troupe_http_prompt_tokens_total: prompt tokens of the generations that ended, and
  /// troupe_http_prefix_hit_tokens_total: those of them taken from the KV cache (not computed).
  runtime::counter* prompt_tokens = nullptr;
  runtime::counter* cached_tokens = nullptr;
  /// troupe_http_cancellations_total{reason}: cancels sent (client_disconnect,
  /// stop_sequence, shutdown, write_stalled).
  runtime::counter_family* cancellations = nullptr;

  /// Registers the families in `reg` (or finds them: registering twice is fine). Fails with
  /// the registry's error when a name is taken by a family of another shape.
  static caf::expected<entrypoint_metrics> register_in(runtime::registry& reg);

  // Each update below creates its labelled child on first use; all are thread-safe and only
  // valid while the registry lives.
  /// Counts one response of `route` with `status`.
  void count(const std::string& route, int status) const;
  /// One time to first token of `route`, in seconds.
  void observe_ttft(const std::string& route, double seconds) const;
  /// One gap between tokens of `route`, in seconds.
  void observe_inter_token(const std::string& route, double seconds) const;
  /// One generation response of `route` from admission to its end, in seconds.
  void observe_duration(const std::string& route, double seconds) const;
  /// One cancel sent, for `reason`.
  void count_cancel(const std::string& reason) const;
};

} // namespace troupe::actors
