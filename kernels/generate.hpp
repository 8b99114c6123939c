// One request end to end on the CPU model: prefill the prompt, then decode token by token with
// the request's sampling parameters, stopping at an end-of-sequence id or after max_new tokens.
// What `troupe generate` runs (token ids in and out; text comes with the tokenizer work).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "kernels/model.hpp"
#include "kernels/result.hpp"
#include "kernels/sampling.hpp"

namespace troupe::kernels {

struct generate_options {
  std::int64_t max_new = 32;  // tokens to generate at most (>= 0)
  sampling_params sampling;   // per request; draws depend on (seed, position) only
  bool stop_at_eos = true;    // stop after generating one of the config's eos_token_ids
  bool keep_logits = false;   // return the logits of every position
  // Called with every generated id as soon as it is drawn (e.g. to time the tokens).
  std::function<void(std::int64_t)> on_token;
};

struct generation {
  std::vector<std::int64_t> tokens;  // generated ids (an eos that stopped it included)
  // With keep_logits: [prompt + generated, vocab] row-major, row i the logits after token i
  // (the next-token distribution at every position, the last generated token's included).
  std::vector<float> logits;
};

/// Runs `prompt` (at least one token) through a fresh sequence and generates. Errors: an empty
/// prompt, a token id out of range, invalid sampling parameters, a model that cannot run.
result<generation> generate(const model& m, std::span<const std::int64_t> prompt,
                            const generate_options& options);

/// The Engram compressed-token map for `m` from `source`: "identity" (id mod
/// engram_compressed_vocab_size, for random model directories, which have no tokenizer) or a
/// JSON file holding the map as an array or as the `token_map` field of an object (the
/// goldens' engram_meta.json). The released map comes from the tokenizer's normalisation.
result<std::vector<std::int64_t>> load_engram_token_map(const model& m, const std::string& source);

}  // namespace troupe::kernels
