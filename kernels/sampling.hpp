// Choosing the next token from a row of logits: greedy, temperature, top-k, top-p, min-p.
//
// Serving must be reproducible per request: a request rerouted after a fault, or replayed for
// a test, has to draw the same tokens whatever else shared its batch. So the randomness is
// not a stream that the batch consumes; each draw is a pure function of the request's seed
// and the position of the token being drawn (a counter-based generator), and each row of a
// batch is sampled on its own. The rules run in the order `transformers` applies its logits
// warpers: temperature, then top-k, top-p and min-p on the resulting distribution, then one
// draw by inverse CDF over the kept tokens in a fixed order (probability descending, token id
// ascending on ties), with the uniform counter_uniform(seed, position) (counter_rng.hpp).
// Invalid parameters and rows with NaN are errors (values), not crashes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/counter_rng.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

struct sampling_params {
  bool greedy = false;       // argmax (lowest id on ties); also when temperature == 0
  double temperature = 1.0;  // >= 0
  std::int64_t top_k = 0;    // keep the k most likely tokens; 0 = off
  double top_p = 1.0;        // keep the smallest set whose probability reaches top_p; (0, 1], 1 = off
  double min_p = 0.0;        // keep tokens with p >= min_p * p_max; [0, 1], 0 = off
  std::uint64_t seed = 0;    // the request's seed
};

/// Checks the parameters (temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1).
result<bool> validate(const sampling_params& p);

/// The token drawn from `logits` for the token at sequence `position` of a request with
/// `params`. Errors: empty or non-finite logits (a NaN, or +inf), invalid parameters.
result<std::int64_t> sample_token(std::span<const float> logits, const sampling_params& params,
                                  std::uint64_t position);

/// One token per row of `logits` ([rows, vocab] row-major): row r with params[r] at
/// positions[r]. Each row is sampled exactly as sample_token would sample it alone.
result<std::vector<std::int64_t>> sample_batch(std::span<const float> logits, std::int64_t vocab,
                                               std::span<const sampling_params> params,
                                               std::span<const std::uint64_t> positions);

/// The probabilities sample_token draws from (after temperature, top-k, top-p, min-p and
/// renormalisation), one per token id, 0 for dropped tokens; for tests and debugging.
result<std::vector<double>> sampling_distribution(std::span<const float> logits,
                                                  const sampling_params& params);

}  // namespace troupe::kernels
