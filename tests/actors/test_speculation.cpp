// DSpark's verify-length choice (actors/engine/speculation.hpp) against hand-computed cases and
// an exhaustive search over every combination of lengths.
#include <doctest/doctest.h>

#include "actors/engine/speculation.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

using namespace troupe::actors;

namespace {

draft_confidences drafts(std::vector<float> c) {
  draft_confidences d;
  d.count = static_cast<std::uint32_t>(c.size());
  for (std::size_t j = 0; j < c.size(); ++j)
    d.confidence[j] = c[j];
  return d;
}

/// The best expected tokens per second over every combination of lengths, by brute force.
double exhaustive_best(const std::vector<draft_confidences>& s, const step_cost& cost) {
  std::vector<std::uint32_t> k(s.size(), 0);
  double best = 0.0;
  for (;;) {
    double expected = static_cast<double>(s.size());
    std::uint64_t tokens = s.size();
    for (std::size_t i = 0; i < s.size(); ++i) {
      double p = 1.0;
      for (std::uint32_t j = 0; j < k[i]; ++j) {
        p *= s[i].confidence[j];
        expected += p;
      }
      tokens += k[i];
    }
    best = std::max(best, expected / cost(tokens));
    std::size_t i = 0;
    while (i < s.size() && ++k[i] > s[i].count)
      k[i++] = 0;
    if (i == s.size())
      break;
  }
  return best;
}

} // namespace

TEST_CASE("speculation: the gain of each draft is the probability that it and all before it are accepted") {
  auto g = draft_gains(drafts({0.9f, 0.5f, 2.0f, -1.0f}));
  REQUIRE(g.size() == 4);
  CHECK(g[0] == doctest::Approx(0.9));
  CHECK(g[1] == doctest::Approx(0.45));
  CHECK(g[2] == doctest::Approx(0.45));  // clamped to 1
  CHECK(g[3] == 0.0);                    // clamped to 0
}

TEST_CASE("speculation: memory-bound steps verify every likely draft, compute-bound ones none") {
  const std::vector<draft_confidences> s{drafts({0.9f, 0.8f, 0.7f, 0.6f, 0.5f}),
                                         drafts({0.9f, 0.8f, 0.7f, 0.6f, 0.5f})};
  // Flat: extra tokens are free, so every draft with any chance is verified.
  auto flat = choose_verify_lengths(s, [](std::uint64_t) { return 0.010; });
  CHECK(flat.lengths == std::vector<std::uint32_t>{5, 5});
  CHECK(flat.step_tokens == 12);
  // Linear with no fixed part: a draft token costs as much as a sequence's own token and
  // yields less than one, so none is worth verifying.
  auto linear = choose_verify_lengths(s, [](std::uint64_t t) { return 0.001 * double(t); });
  CHECK(linear.lengths == std::vector<std::uint32_t>{0, 0});
  CHECK(linear.expected_tokens == 2.0);
  // Nothing likely: nothing verified even when tokens are cheap.
  const std::vector<draft_confidences> hopeless{drafts({0.0f, 0.0f})};
  CHECK(choose_verify_lengths(hopeless, [](std::uint64_t t) { return 1.0 + 0.01 * double(t); })
          .lengths == std::vector<std::uint32_t>{0});
}

TEST_CASE("speculation: a hand-computed mixed batch") {
  // Step seconds 1 + 0.25 per token. Sequence 0 gains 0.9, 0.81, 0.729; sequence 1 gains 0.3,
  // 0.09. With 2 sequences: N = 0: 2 / 1.5 = 1.333; N = 1 (+0.9): 2.9 / 1.75 = 1.657; N = 2
  // (+0.81): 3.71 / 2 = 1.855; N = 3 (+0.729): 4.439 / 2.25 = 1.973; N = 4 (+0.3): 4.739 / 2.5
  // = 1.896. Best: sequence 0 verifies 3, sequence 1 none.
  const std::vector<draft_confidences> s{drafts({0.9f, 0.9f, 0.9f}), drafts({0.3f, 0.3f})};
  auto cost = [](std::uint64_t t) { return 1.0 + 0.25 * double(t); };
  auto plan = choose_verify_lengths(s, cost);
  CHECK(plan.lengths == std::vector<std::uint32_t>{3, 0});
  CHECK(plan.step_tokens == 5);
  CHECK(plan.expected_tokens == doctest::Approx(2.0 + 0.9 + 0.81 + 0.729));
  CHECK(plan.tokens_per_second() == doctest::Approx(4.439 / 2.25));
  // Fixed-length verification of the same step: every draft, 7 tokens.
  auto fixed = fixed_verify_lengths(s, max_drafts, cost);
  CHECK(fixed.lengths == std::vector<std::uint32_t>{3, 2});
  CHECK(fixed.tokens_per_second() == doctest::Approx((2.0 + 0.9 + 0.81 + 0.729 + 0.3 + 0.09) / 2.75));
  CHECK(plan.tokens_per_second() > fixed.tokens_per_second());
  CHECK(fixed_verify_lengths(s, 0, cost).step_tokens == 2);
}

TEST_CASE("speculation: the choice is optimal against an exhaustive search") {
  std::uint32_t z = 12345;
  auto next = [&] {
    z = z * 1664525u + 1013904223u;
    return static_cast<float>(z >> 8) * 0x1p-24f;
  };
  // Step-time curves: flat then linear (a memory-bound device turning compute-bound), concave,
  // linear with a fixed part.
  const std::vector<step_cost> costs{
    [](std::uint64_t t) { return std::max(1.0, 0.2 * double(t)); },
    [](std::uint64_t t) { return 0.5 + std::sqrt(double(t)); },
    [](std::uint64_t t) { return 2.0 + 0.3 * double(t); },
  };
  for (int round = 0; round < 300; ++round) {
    std::vector<draft_confidences> s;
    const int n = 1 + round % 3;
    for (int i = 0; i < n; ++i) {
      std::vector<float> c;
      const auto count = static_cast<int>(next() * 6.0f);  // 0..5
      for (int j = 0; j < count; ++j)
        c.push_back(round % 5 == 0 ? 1.0f : next());  // some all-certain, tied gains
      s.push_back(drafts(c));
    }
    const auto& cost = costs[static_cast<std::size_t>(round) % costs.size()];
    const auto plan = choose_verify_lengths(s, cost);
    CAPTURE(round);
    CHECK(plan.tokens_per_second() == doctest::Approx(exhaustive_best(s, cost)).epsilon(1e-12));
    for (std::size_t i = 0; i < s.size(); ++i)
      CHECK(plan.lengths[i] <= s[i].count);
  }
}
