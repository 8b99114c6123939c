#include "actors/lb/prefill_balancer.hpp"

#include "runtime/check.hpp"

#include <algorithm>
#include <limits>

namespace troupe::actors {

namespace {

std::string tokens_label(std::uint64_t n) {
  if (n % 1024 == 0)
    return std::to_string(n / 1024) + "K";
  return std::to_string(n);
}

} // namespace

prefill_balancer::prefill_balancer(prefill_balancer_params params)
  : params_(std::move(params)) {
  for (std::size_t i = 1; i < params_.bucket_bounds.size(); ++i)
    TROUPE_CHECK(params_.bucket_bounds[i - 1] < params_.bucket_bounds[i],
                 "prefill_balancer: bucket bounds must increase strictly");
  TROUPE_CHECK(params_.load_smoothing > 0 && params_.load_smoothing <= 1,
               "prefill_balancer: load_smoothing must be in (0, 1]");
  interval_load_.assign(buckets(), 0.0);
  load_.assign(buckets(), 0.0);
  stats_.routed.assign(buckets(), 0);
}

std::size_t prefill_balancer::bucket_of(std::uint64_t uncached_tokens) const noexcept {
  auto& b = params_.bucket_bounds;
  return static_cast<std::size_t>(std::upper_bound(b.begin(), b.end(), uncached_tokens)
                                  - b.begin());
}

std::string prefill_balancer::bucket_name(std::size_t bucket) const {
  auto& b = params_.bucket_bounds;
  auto lo = bucket == 0 ? std::string{"0"} : tokens_label(b[bucket - 1]);
  auto hi = bucket < b.size() ? tokens_label(b[bucket]) : std::string{"inf"};
  return lo + "-" + hi;
}

std::vector<std::uint32_t> prefill_balancer::instances_per_bucket() const {
  std::vector<std::uint32_t> counts(buckets(), 0);
  for (auto& [id, st] : instances_)
    ++counts[st.bucket];
  return counts;
}

std::vector<double> prefill_balancer::targets() const {
  auto n = static_cast<double>(instances_.size());
  std::vector<double> t(buckets(), n / static_cast<double>(buckets()));
  double total = 0;
  for (auto l : load_)
    total += l;
  if (total > 0)
    for (std::size_t b = 0; b < buckets(); ++b)
      t[b] = n * load_[b] / total;
  return t;
}

void prefill_balancer::add_instance(instance_id id) {
  if (instances_.count(id) > 0)
    return;
  auto counts = instances_per_bucket();
  // Count the new instance in the targets, then give it to the bucket furthest below its
  // target (ties: the smaller bucket, where most traffic is).
  instances_.emplace(id, instance_state{});
  auto t = targets();
  std::size_t best = 0;
  for (std::size_t b = 1; b < buckets(); ++b)
    if (t[b] - counts[b] > t[best] - counts[best])
      best = b;
  instances_[id].bucket = best;
}

void prefill_balancer::remove_instance(instance_id id) {
  instances_.erase(id);
}

std::optional<std::size_t> prefill_balancer::bucket_of_instance(instance_id id) const {
  auto i = instances_.find(id);
  if (i == instances_.end())
    return std::nullopt;
  return i->second.bucket;
}

double prefill_balancer::outstanding(instance_id id) const {
  auto i = instances_.find(id);
  return i == instances_.end() ? 0.0 : i->second.outstanding;
}

std::optional<instance_id> prefill_balancer::route(std::uint64_t uncached_tokens,
                                                    double compute) {
  auto want = bucket_of(uncached_tokens);
  auto least_in = [this](std::size_t bucket) -> std::optional<instance_id> {
    std::optional<instance_id> best;
    double best_load = std::numeric_limits<double>::infinity();
    for (auto& [id, st] : instances_)
      if (st.bucket == bucket && st.outstanding < best_load) {
        best = id;
        best_load = st.outstanding;
      }
    return best;
  };
  auto pick = least_in(want);
  if (!pick) {
    // Nearest bucket with an instance; at equal distance the larger bucket, whose instances
    // are sized for longer prompts.
    for (std::size_t d = 1; d < buckets() && !pick; ++d) {
      if (want + d < buckets())
        pick = least_in(want + d);
      if (!pick && want >= d)
        pick = least_in(want - d);
    }
    if (pick)
      ++stats_.spilled;
  }
  if (!pick) {
    ++stats_.rejected;
    return std::nullopt;
  }
  instances_[*pick].outstanding += compute;
  interval_load_[want] += compute;
  ++stats_.routed[want];
  return pick;
}

void prefill_balancer::complete(instance_id id, double compute) {
  auto i = instances_.find(id);
  if (i != instances_.end())
    i->second.outstanding = std::max(0.0, i->second.outstanding - compute);
}

std::uint32_t prefill_balancer::rebalance() {
  ++stats_.rebalances;
  auto a = params_.load_smoothing;
  for (std::size_t b = 0; b < buckets(); ++b) {
    load_[b] = a * interval_load_[b] + (1 - a) * load_[b];
    interval_load_[b] = 0;
  }
  std::uint32_t moves = 0;
  while (moves < params_.max_moves_per_rebalance) {
    auto t = targets();
    auto counts = instances_per_bucket();
    std::size_t over = 0;
    std::size_t under = 0;
    for (std::size_t b = 1; b < buckets(); ++b) {
      if (t[b] - counts[b] < t[over] - counts[over])
        over = b;
      if (t[b] - counts[b] > t[under] - counts[under])
        under = b;
    }
    auto gap = (t[under] - counts[under]) - (t[over] - counts[over]);
    // Moving one instance changes the gap by 2; only move when that narrows it.
    if (gap <= 1.0 || counts[over] == 0)
      break;
    // A bucket with load keeps at least one instance.
    if (counts[over] == 1 && load_[over] > 0)
      break;
    std::optional<instance_id> victim;
    double least = std::numeric_limits<double>::infinity();
    for (auto& [id, st] : instances_)
      if (st.bucket == over && st.outstanding < least) {
        victim = id;
        least = st.outstanding;
      }
    instances_[*victim].bucket = under;
    ++moves;
  }
  stats_.moves += moves;
  return moves;
}

} // namespace troupe::actors
