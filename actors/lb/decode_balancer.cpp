#include "actors/lb/decode_balancer.hpp"

#include "runtime/check.hpp"

#include <cmath>
#include <limits>

namespace troupe::actors {

decode_balancer::decode_balancer(decode_balancer_params params) : params_(params) {
  TROUPE_CHECK(params_.long_share >= 0 && params_.long_share < 1,
               "decode_balancer: long_share must be in [0, 1)");
  TROUPE_CHECK(params_.max_requests > 0 && params_.max_kv_tokens > 0,
               "decode_balancer: limits must be positive");
}

void decode_balancer::assign_classes() {
  auto n = instances_.size();
  std::size_t long_count = 0;
  if (n >= 2 && params_.long_share > 0)
    long_count = std::max<std::size_t>(
      1, static_cast<std::size_t>(std::floor(params_.long_share * static_cast<double>(n))));
  // The highest ids serve long requests; an instance keeps the requests it has either way.
  std::size_t i = 0;
  for (auto& [id, st] : instances_)
    st.long_class = i++ >= n - long_count;
}

void decode_balancer::add_instance(instance_id id) {
  if (instances_.emplace(id, instance_state{}).second)
    assign_classes();
}

void decode_balancer::remove_instance(instance_id id) {
  if (instances_.erase(id) > 0)
    assign_classes();
}

double decode_balancer::score(const instance_state& st) const {
  return static_cast<double>(st.requests) / params_.max_requests
         + static_cast<double>(st.kv_tokens) / static_cast<double>(params_.max_kv_tokens);
}

bool decode_balancer::has_room(const instance_state& st, std::uint64_t reserve) const {
  return st.requests < params_.max_requests && reserve <= params_.max_kv_tokens
         && st.reserved <= params_.max_kv_tokens - reserve;
}

std::optional<instance_id> decode_balancer::route(std::uint64_t kv_tokens,
                                                  std::uint64_t max_new_tokens) {
  const bool want_long = kv_tokens >= params_.long_threshold;
  const auto reserve = kv_tokens + max_new_tokens;
  auto least = [&](bool long_class) -> std::optional<instance_id> {
    std::optional<instance_id> best;
    double best_score = std::numeric_limits<double>::infinity();
    for (auto& [id, st] : instances_)
      if (st.long_class == long_class && has_room(st, reserve) && score(st) < best_score) {
        best = id;
        best_score = score(st);
      }
    return best;
  };
  auto pick = least(want_long);
  if (!pick) {
    pick = least(!want_long);
    if (pick)
      ++stats_.spilled;
  }
  if (!pick) {
    ++stats_.rejected;
    return std::nullopt;
  }
  auto& st = instances_[*pick];
  ++st.requests;
  st.kv_tokens += kv_tokens;
  st.reserved += reserve;
  ++(want_long ? stats_.routed_long : stats_.routed_short);
  return pick;
}

void decode_balancer::grow(instance_id id, std::uint64_t tokens) {
  auto i = instances_.find(id);
  if (i != instances_.end())
    i->second.kv_tokens += tokens;
}

void decode_balancer::complete(instance_id id, std::uint64_t kv_tokens,
                               std::uint64_t max_new_tokens, std::uint64_t grown) {
  auto i = instances_.find(id);
  if (i == instances_.end())
    return;
  auto& st = i->second;
  auto held = kv_tokens + grown;
  auto reserved = kv_tokens + max_new_tokens;
  st.requests = st.requests > 0 ? st.requests - 1 : 0;
  st.kv_tokens = st.kv_tokens > held ? st.kv_tokens - held : 0;
  st.reserved = st.reserved > reserved ? st.reserved - reserved : 0;
}

std::optional<bool> decode_balancer::is_long(instance_id id) const {
  auto i = instances_.find(id);
  if (i == instances_.end())
    return std::nullopt;
  return i->second.long_class;
}

double decode_balancer::load(instance_id id) const {
  auto i = instances_.find(id);
  return i == instances_.end() ? 0.0 : score(i->second);
}

std::uint32_t decode_balancer::requests(instance_id id) const {
  auto i = instances_.find(id);
  return i == instances_.end() ? 0 : i->second.requests;
}

std::uint64_t decode_balancer::kv_tokens(instance_id id) const {
  auto i = instances_.find(id);
  return i == instances_.end() ? 0 : i->second.kv_tokens;
}

std::uint64_t decode_balancer::reserved_tokens(instance_id id) const {
  auto i = instances_.find(id);
  return i == instances_.end() ? 0 : i->second.reserved;
}

} // namespace troupe::actors
