// DSpark variable-length verification: how many of each sequence's drafts a decode step
// verifies.
//
// Each decoding sequence arrives at a step with up to `max_drafts` drafted tokens, each with
// the draft model's confidence: the predicted probability that the target model accepts that
// draft given that it accepted every draft before it. Verifying k drafts of a sequence puts
// 1 + k of its tokens in the step (its last accepted token and the k drafts) and yields 1 + a
// tokens, a the accepted prefix (the target's own next token always comes). So draft j adds,
// in expectation, P(drafts 1..j accepted) = c_1 · … · c_j tokens — a gain that never grows
// with j — and one token of step work. For a step of N draft tokens the best choice is
// therefore the N largest gains over all sequences (each sequence's share is a prefix of its
// drafts), and the plan is the N whose step gives the most expected tokens per second under
// the device's step-time curve (step seconds as a function of the step's tokens: the
// performance model in the simulated world, a profile of the device in the real one). Exact:
// no search over combinations is needed. Ties go to fewer tokens (the cheaper step), then to
// the lower sequence index.
//
// Pure functions: the decode engine of either world calls them with its own cost curve.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace troupe::actors {

/// Drafts a DSpark head proposes per step.
inline constexpr std::uint32_t max_drafts = 5;

/// One sequence's drafts this step: `count` (<= max_drafts) confidences in draft order, each in
/// [0, 1] (values outside are clamped).
struct draft_confidences {
  std::array<float, max_drafts> confidence{};
  std::uint32_t count = 0;
};

/// Step seconds for a step of this many tokens (> 0).
using step_cost = std::function<double(std::uint64_t tokens)>;

struct verify_plan {
  /// Drafts to verify per sequence (0..count), in input order.
  std::vector<std::uint32_t> lengths;
  /// Tokens the step runs (sequences + verified drafts).
  std::uint64_t step_tokens = 0;
  /// Expected tokens the step yields (one per sequence plus expected accepted drafts).
  double expected_tokens = 0.0;
  double step_seconds = 0.0;
  double tokens_per_second() const {
    return step_seconds > 0.0 ? expected_tokens / step_seconds : 0.0;
  }
};

/// DSpark: the verify lengths that maximise expected tokens per second of the whole step.
verify_plan choose_verify_lengths(std::span<const draft_confidences> sequences,
                                  const step_cost& cost);

/// The same step verifying min(k, count) drafts of every sequence (k = 0: no speculation;
/// k = max_drafts: fixed-length verification), for comparison.
verify_plan fixed_verify_lengths(std::span<const draft_confidences> sequences, std::uint32_t k,
                                 const step_cost& cost);

/// P(drafts 1..j accepted) for j = 1..count: the expected gain of verifying each draft.
std::vector<double> draft_gains(const draft_confidences& d);

} // namespace troupe::actors
