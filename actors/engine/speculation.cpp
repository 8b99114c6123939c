#include "actors/engine/speculation.hpp"

#include <algorithm>

namespace troupe::actors {

std::vector<double> draft_gains(const draft_confidences& d) {
  std::vector<double> gains;
  const auto n = std::min(d.count, max_drafts);
  gains.reserve(n);
  double p = 1.0;
  for (std::uint32_t j = 0; j < n; ++j) {
    p *= std::clamp(static_cast<double>(d.confidence[j]), 0.0, 1.0);
    gains.push_back(p);
  }
  return gains;
}

namespace {

verify_plan evaluate(std::span<const draft_confidences> sequences,
                     std::vector<std::uint32_t> lengths, const step_cost& cost) {
  verify_plan plan;
  plan.lengths = std::move(lengths);
  plan.step_tokens = sequences.size();
  plan.expected_tokens = static_cast<double>(sequences.size());
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const auto gains = draft_gains(sequences[i]);
    for (std::uint32_t j = 0; j < plan.lengths[i]; ++j)
      plan.expected_tokens += gains[j];
    plan.step_tokens += plan.lengths[i];
  }
  plan.step_seconds = plan.step_tokens > 0 ? cost(plan.step_tokens) : 0.0;
  return plan;
}

} // namespace

verify_plan choose_verify_lengths(std::span<const draft_confidences> sequences,
                                  const step_cost& cost) {
  struct candidate {
    double gain;
    std::uint32_t sequence;
    std::uint32_t draft;
  };
  std::vector<candidate> all;
  for (std::uint32_t i = 0; i < sequences.size(); ++i) {
    const auto gains = draft_gains(sequences[i]);
    for (std::uint32_t j = 0; j < gains.size(); ++j)
      all.push_back({gains[j], i, j});
  }
  // Largest gain first; a sequence's drafts in order among equal gains (its gains never grow).
  std::sort(all.begin(), all.end(), [](const candidate& a, const candidate& b) {
    if (a.gain != b.gain)
      return a.gain > b.gain;
    return a.sequence != b.sequence ? a.sequence < b.sequence : a.draft < b.draft;
  });
  const auto base = static_cast<double>(sequences.size());
  double best_rate = -1.0, expected = base;
  std::size_t best_n = 0;
  for (std::size_t n = 0; n <= all.size(); ++n) {
    if (n > 0)
      expected += all[n - 1].gain;
    const auto tokens = static_cast<std::uint64_t>(sequences.size() + n);
    if (tokens == 0)
      break;
    const double rate = expected / cost(tokens);
    if (rate > best_rate) {
      best_rate = rate;
      best_n = n;
    }
  }
  std::vector<std::uint32_t> lengths(sequences.size(), 0);
  for (std::size_t n = 0; n < best_n; ++n)
    ++lengths[all[n].sequence];
  return evaluate(sequences, std::move(lengths), cost);
}

verify_plan fixed_verify_lengths(std::span<const draft_confidences> sequences, std::uint32_t k,
                                 const step_cost& cost) {
  std::vector<std::uint32_t> lengths;
  lengths.reserve(sequences.size());
  for (const auto& s : sequences)
    lengths.push_back(std::min({k, s.count, max_drafts}));
  return evaluate(sequences, std::move(lengths), cost);
}

} // namespace troupe::actors
