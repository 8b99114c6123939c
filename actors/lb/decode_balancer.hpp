// decode_balancer: the routing policy of decode_lb (request count and KV length per
// instance; long and short requests kept apart).
//
// A decode step's time grows with both the batch (requests in compute) and the KV it attends
// over. Balancing by request count alone piles long contexts onto one instance; balancing by
// KV alone lets one instance collect hundreds of short requests. So an instance's load counts
// both, each relative to the instance's limits. Long requests also slow every request batched
// with them, so instances are split into a "long" and a "short" class: a request whose KV
// length reaches `long_threshold` goes to a long instance, others to short ones, and within
// the class to the least-loaded instance. When a class has no instance with room, the other
// class serves (counted as a spill).
//
// KV memory: an instance holds at most `max_kv_tokens` of KV (in the simulated world, its HBM
// left after weights: cluster/sim/capacity.hpp). A decode request's KV grows by one token per
// generated token, and the engine cannot preempt a request once it runs, so routing reserves
// room for the request's whole KV to the end of its output budget (`max_new_tokens`): an
// instance never holds more KV than its memory. The load score counts the KV actually held —
// the context at routing plus what the request appended since (`grow`) — so that a long
// generation weighs as much as it is long.
#pragma once

#include "actors/lb/prefill_balancer.hpp"
#include "runtime/time.hpp"

#include <cstdint>
#include <map>
#include <optional>

namespace troupe::actors {

struct decode_balancer_params {
  /// KV length (tokens) from which a request counts as long.
  std::uint64_t long_threshold = 32768;
  /// Share of instances reserved for long requests (at least one when there are two or more
  /// instances and the share is > 0).
  double long_share = 0.25;
  /// Per-instance limits: the load is requests/max_requests + kv_tokens/max_kv_tokens (KV
  /// held), and an instance takes no request beyond max_requests or whose reservation would
  /// take its reserved KV beyond max_kv_tokens.
  std::uint32_t max_requests = 4096;
  std::uint64_t max_kv_tokens = 64ull << 20;
  /// decode_lb: a request refused for want of room counts as waiting (demand the pool could
  /// not take: pool_load::waiting) until this long after its last refusal, by which its next
  /// retry is due (twice the requests' retry interval), or until it is booked.
  runtime::duration waiting_window = std::chrono::seconds(2);
};

struct decode_balancer_stats {
  std::uint64_t routed_long = 0;
  std::uint64_t routed_short = 0;
  std::uint64_t spilled = 0;
  std::uint64_t rejected = 0;
};

class decode_balancer {
public:
  explicit decode_balancer(decode_balancer_params params);

  /// Adds an idle instance; classes are re-derived (lowest ids are short). Twice: no change.
  void add_instance(instance_id id);

  /// Removes an instance (failed or draining). Unknown ids are ignored.
  void remove_instance(instance_id id);

  /// Picks an instance for a request with `kv_tokens` of KV that may generate up to
  /// `max_new_tokens` more, and books it there: one request, kv_tokens held, kv_tokens +
  /// max_new_tokens reserved. nullopt when no instance has room for the reservation.
  std::optional<instance_id> route(std::uint64_t kv_tokens, std::uint64_t max_new_tokens = 0);

  /// Adds `tokens` of KV a request booked on `id` appended while decoding to the KV `id` holds.
  void grow(instance_id id, std::uint64_t tokens);

  /// Releases one request booked on `id` with `kv_tokens` and `max_new_tokens` (as routed)
  /// that grew by `grown` tokens since.
  void complete(instance_id id, std::uint64_t kv_tokens, std::uint64_t max_new_tokens = 0,
                std::uint64_t grown = 0);

  /// Whether an instance serves long requests.
  std::optional<bool> is_long(instance_id id) const;

  /// The load score of an instance (0 for unknown ids).
  double load(instance_id id) const;

  std::uint32_t requests(instance_id id) const;
  /// KV an instance holds (booked at routing, plus growth) and reserves (to the end of its
  /// requests' output budgets).
  std::uint64_t kv_tokens(instance_id id) const;
  std::uint64_t reserved_tokens(instance_id id) const;

  const decode_balancer_stats& stats() const noexcept { return stats_; }

private:
  struct instance_state {
    bool long_class = false;
    std::uint32_t requests = 0;
    std::uint64_t kv_tokens = 0;
    std::uint64_t reserved = 0;
  };

  void assign_classes();
  double score(const instance_state& st) const;
  bool has_room(const instance_state& st, std::uint64_t reserve) const;

  decode_balancer_params params_;
  std::map<instance_id, instance_state> instances_;
  decode_balancer_stats stats_;
};

} // namespace troupe::actors
