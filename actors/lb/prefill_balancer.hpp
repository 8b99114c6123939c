// prefill_balancer: the routing policy of prefill_lb (input-length buckets, least outstanding
// compute, engine counts per bucket that follow the measured load).
//
// Prefill cost grows with the *uncached* part of a prompt, and mixing a 200K-token prefill
// with 2K-token ones on one engine makes the short ones wait behind the long one. So prefill
// instances are split into buckets by uncached input length (by default < 16K, 16K–64K,
// 64K–256K, ≥ 256K tokens); a request goes to the bucket of its uncached length and, inside
// it, to the instance with the least outstanding compute. How many instances each bucket
// owns is re-derived periodically from the compute each bucket received, moving at most a
// bounded number of instances per rebalance so that the cluster does not thrash. There is no
// prefix affinity: every instance can read every cached block from the store.
//
// The class is plain data and deterministic (ordered containers, ties broken by instance
// id); the prefill_lb actor owns one and feeds it events.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

using instance_id = std::uint32_t;

struct prefill_balancer_params {
  /// Upper bounds (exclusive, in tokens) of every bucket but the last, strictly increasing.
  std::vector<std::uint64_t> bucket_bounds{16384, 65536, 262144};
  /// At most this many instances change bucket per rebalance.
  std::uint32_t max_moves_per_rebalance = 1;
  /// Weight of the newest interval in the per-bucket load average (0 < alpha <= 1).
  double load_smoothing = 0.5;
};

/// Counters a report shows.
struct prefill_balancer_stats {
  /// Requests routed, per bucket.
  std::vector<std::uint64_t> routed;
  /// Requests that found no instance at all.
  std::uint64_t rejected = 0;
  /// Requests served by another bucket's instance because their own bucket had none.
  std::uint64_t spilled = 0;
  /// Instances moved between buckets by rebalancing.
  std::uint64_t moves = 0;
  std::uint64_t rebalances = 0;
};

class prefill_balancer {
public:
  explicit prefill_balancer(prefill_balancer_params params);

  /// The number of buckets (bounds + 1).
  std::size_t buckets() const noexcept { return params_.bucket_bounds.size() + 1; }

  /// The bucket of a request with `uncached_tokens` tokens to compute.
  std::size_t bucket_of(std::uint64_t uncached_tokens) const noexcept;

  /// Adds an instance (idle) to the bucket that currently has the fewest instances relative
  /// to its load. Adding an id twice changes nothing.
  void add_instance(instance_id id);

  /// Removes an instance (failed or draining); its outstanding work is forgotten. Unknown ids
  /// are ignored.
  void remove_instance(instance_id id);

  /// Picks the instance for a request and books `compute` (an estimate, e.g. seconds of
  /// device time) as outstanding on it. If the request's bucket has no instance, the nearest
  /// bucket with one serves it (larger buckets first). nullopt when there is no instance.
  std::optional<instance_id> route(std::uint64_t uncached_tokens, double compute);

  /// Releases `compute` booked on `id` by route (when the prefill finished or moved).
  void complete(instance_id id, double compute);

  /// Re-derives instance counts per bucket from the compute routed since the last call
  /// (smoothed), moving at most max_moves_per_rebalance instances from the most over-served
  /// bucket to the most under-served one. Returns the number of moves.
  std::uint32_t rebalance();

  /// The bucket an instance serves, if known.
  std::optional<std::size_t> bucket_of_instance(instance_id id) const;

  /// Instances per bucket.
  std::vector<std::uint32_t> instances_per_bucket() const;

  /// Outstanding compute booked on an instance (0 for unknown ids).
  double outstanding(instance_id id) const;

  const prefill_balancer_stats& stats() const noexcept { return stats_; }

  /// Human-readable bucket name, e.g. "16K-64K".
  std::string bucket_name(std::size_t bucket) const;

private:
  struct instance_state {
    std::size_t bucket = 0;
    double outstanding = 0;
  };

  std::vector<double> targets() const;

  prefill_balancer_params params_;
  std::map<instance_id, instance_state> instances_;
  /// Compute routed per bucket since the last rebalance, and its smoothed average.
  std::vector<double> interval_load_;
  std::vector<double> load_;
  prefill_balancer_stats stats_;
};

} // namespace troupe::actors
