#include "kernels/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace troupe::kernels {

namespace {

// argmax with the lowest id on ties; logits are finite or -inf, at least one > -inf.
std::int64_t argmax(std::span<const float> logits) {
  std::int64_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[std::size_t(best)]) best = std::int64_t(i);
  return best;
}

result<bool> check_logits(std::span<const float> logits) {
  if (logits.empty()) return result<bool>::failure("sampling: empty logits");
  bool any = false;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == INFINITY)
      return result<bool>::failure("sampling: logit " + std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "+inf"));
    any = any || v > -INFINITY;
  }
  if (!any) return result<bool>::failure("sampling: every logit is -inf");
  return true;
}

bool is_greedy(const sampling_params& p) { return p.greedy || p.temperature == 0.0; }

// Token ids with their probabilities after every rule, in draw order (probability descending,
// id ascending), renormalised. Parameters and logits already checked.
std::vector<std::pair<double, std::int64_t>> kept(std::span<const float> logits, const sampling_params& p) {
  const double inv_t = 1.0 / p.temperature;
  const float top = logits[std::size_t(argmax(logits))];
  std::vector<std::pair<double, std::int64_t>> order;
  order.reserve(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == -INFINITY) continue;
    const double w = std::exp((double(logits[i]) - double(top)) * inv_t);
    total += w;
    order.emplace_back(w, std::int64_t(i));
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (auto& [w, id] : order) w /= total;
  std::size_t n = order.size();
  if (p.top_k > 0) n = std::min(n, std::size_t(p.top_k));
  if (p.top_p < 1.0) {
    // renormalised over the top-k survivors, as a warper chain sees them
    double kept_mass = 0;
    for (std::size_t i = 0; i < n; ++i) kept_mass += order[i].first;
    double cum = 0;
    std::size_t m = 0;
    while (m < n) {
      cum += order[m].first / kept_mass;
      ++m;
      if (cum >= p.top_p) break;
    }
    n = m;
  }
  if (p.min_p > 0.0) {
    const double floor = p.min_p * order[0].first;  // the ratio does not depend on renormalisation
    std::size_t m = 1;
    while (m < n && order[m].first >= floor) ++m;
    n = m;
  }
  order.resize(n);
  double mass = 0;
  for (const auto& [w, id] : order) mass += w;
  for (auto& [w, id] : order) w /= mass;
  return order;
}

}  // namespace

result<bool> validate(const sampling_params& p) {
  if (!(p.temperature >= 0.0) || std::isinf(p.temperature))
    return result<bool>::failure("sampling: temperature must be finite and >= 0, found " + std::to_string(p.temperature));
  if (p.top_k < 0) return result<bool>::failure("sampling: top_k must be >= 0, found " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0 && p.top_p <= 1.0))
    return result<bool>::failure("sampling: top_p must be in (0, 1], found " + std::to_string(p.top_p));
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0))
    return result<bool>::failure("sampling: min_p must be in [0, 1], found " + std::to_string(p.min_p));
  return true;
}

result<std::int64_t> sample_token(std::span<const float> logits, const sampling_params& params,
                                  std::uint64_t position) {
  if (auto v = validate(params); !v) return result<std::int64_t>::failure(v.error());
  if (auto c = check_logits(logits); !c) return result<std::int64_t>::failure(c.error());
  if (is_greedy(params)) return argmax(logits);
  const auto order = kept(logits, params);
  const double u = counter_uniform(params.seed, position);
  double cum = 0;
  for (const auto& [w, id] : order) {
    cum += w;
    if (u < cum) return id;
  }
  return order.back().second;  // u within rounding of 1
}

result<std::vector<std::int64_t>> sample_batch(std::span<const float> logits, std::int64_t vocab,
                                               std::span<const sampling_params> params,
                                               std::span<const std::uint64_t> positions) {
  using R = result<std::vector<std::int64_t>>;
  if (vocab <= 0) return R::failure("sampling: vocab must be > 0");
  if (logits.size() % std::size_t(vocab) != 0)
    return R::failure("sampling: " + std::to_string(logits.size()) + " logits are not rows of " + std::to_string(vocab));
  const std::size_t rows = logits.size() / std::size_t(vocab);
  if (params.size() != rows || positions.size() != rows)
    return R::failure("sampling: " + std::to_string(rows) + " rows but " + std::to_string(params.size()) +
                      " parameter sets and " + std::to_string(positions.size()) + " positions");
  std::vector<std::int64_t> out(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    auto t = sample_token(logits.subspan(r * std::size_t(vocab), std::size_t(vocab)), params[r], positions[r]);
    if (!t) return R::failure("row " + std::to_string(r) + ": " + t.error());
    out[r] = *t;
  }
  return out;
}

result<std::vector<double>> sampling_distribution(std::span<const float> logits, const sampling_params& params) {
  using R = result<std::vector<double>>;
  if (auto v = validate(params); !v) return R::failure(v.error());
  if (auto c = check_logits(logits); !c) return R::failure(c.error());
  std::vector<double> out(logits.size(), 0.0);
  if (is_greedy(params)) {
    out[std::size_t(argmax(logits))] = 1.0;
    return out;
  }
  for (const auto& [w, id] : kept(logits, params)) out[std::size_t(id)] = w;
  return out;
}

}  // namespace troupe::kernels
