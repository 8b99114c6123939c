// The entrypoint's metric families (see entrypoint_metrics.hpp).
#include "actors/entrypoint/entrypoint_metrics.hpp"

namespace troupe::actors {

namespace {

const std::vector<double> latency_buckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1,     2.5,  5,     10,   30,  60};
const std::vector<double> token_buckets = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08,
                                           0.16,  0.32,   0.64,  1.28, 2.56};
const std::vector<double> duration_buckets = {0.01, 0.05, 0.1, 0.5, 1,   2.5,
                                              5,    10,   30,  60,  120, 300, 600};

} // namespace

caf::expected<entrypoint_metrics> entrypoint_metrics::register_in(runtime::registry& reg) {
  entrypoint_metrics m;
  auto requests = reg.add_counter("troupe_http_requests_total",
                                  "HTTP responses by route and status.", {"route", "status"});
  if (!requests)
    return requests.error();
  m.requests = *requests;
  auto ttft = reg.add_histogram("troupe_http_time_to_first_token_seconds",
                                "Time from admission to the first generated token.",
                                latency_buckets, {"route"});
  if (!ttft)
    return ttft.error();
  m.ttft = *ttft;
  auto itl = reg.add_histogram("troupe_http_inter_token_latency_seconds",
                               "Time between generated tokens after the first.", token_buckets,
                               {"route"});
  if (!itl)
    return itl.error();
  m.inter_token = *itl;
  auto duration = reg.add_histogram("troupe_http_request_duration_seconds",
                                    "Time from admission to the end of a generation response.",
                                    duration_buckets, {"route"});
  if (!duration)
    return duration.error();
  m.duration = *duration;
  auto in_flight = reg.add_gauge("troupe_http_requests_in_flight",
                                 "Admitted generation requests not yet released.");
  if (!in_flight)
    return in_flight.error();
  m.in_flight = *(*in_flight)->with({});
  auto queued = reg.add_gauge("troupe_http_requests_queued",
                              "Admitted generation requests still waiting for a first token.");
  if (!queued)
    return queued.error();
  m.queued = *(*queued)->with({});
  auto connections = reg.add_gauge("troupe_http_connections_open", "Open client connections.");
  if (!connections)
    return connections.error();
  m.connections = *(*connections)->with({});
  auto tokens = reg.add_counter("troupe_http_generated_tokens_total",
                                "Tokens received from the serving graph.");
  if (!tokens)
    return tokens.error();
  m.tokens = *(*tokens)->with({});
  auto prompt = reg.add_counter("troupe_http_prompt_tokens_total",
                                "Prompt tokens of the generations that ended.");
  if (!prompt)
    return prompt.error();
  m.prompt_tokens = *(*prompt)->with({});
  auto cached = reg.add_counter("troupe_http_prefix_hit_tokens_total",
                                "Prompt tokens taken from the KV cache instead of computed.");
  if (!cached)
    return cached.error();
  m.cached_tokens = *(*cached)->with({});
  auto cancels = reg.add_counter("troupe_http_cancellations_total",
                                 "Requests cancelled by the entrypoint, by reason.", {"reason"});
  if (!cancels)
    return cancels.error();
  m.cancellations = *cancels;
  return m;
}

void entrypoint_metrics::count(const std::string& route, int status) const {
  if (auto c = requests->with({route, std::to_string(status)}))
    (*c)->inc();
}

void entrypoint_metrics::observe_ttft(const std::string& route, double seconds) const {
  if (auto h = ttft->with({route}))
    (*h)->observe(seconds);
}

void entrypoint_metrics::observe_inter_token(const std::string& route, double seconds) const {
  if (auto h = inter_token->with({route}))
    (*h)->observe(seconds);
}

void entrypoint_metrics::observe_duration(const std::string& route, double seconds) const {
  if (auto h = duration->with({route}))
    (*h)->observe(seconds);
}

void entrypoint_metrics::count_cancel(const std::string& reason) const {
  if (auto c = cancellations->with({reason}))
    (*c)->inc();
}

} // namespace troupe::actors
