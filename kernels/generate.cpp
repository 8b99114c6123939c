#include "kernels/generate.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace troupe::kernels {

result<generation> generate(const model& m, std::span<const std::int64_t> prompt,
                            const generate_options& options) {
  using fail = result<generation>;
  if (prompt.empty()) return fail::failure("generate: the prompt is empty");
  if (options.max_new < 0) return fail::failure("generate: max_new is negative");
  if (auto ok = validate(options.sampling); !ok) return fail::failure("generate: " + ok.error());
  const auto vocab = m.text().vocab_size;
  const auto& eos = m.text().eos_token_ids;

  generation out;
  auto cache = m.new_sequence();
  auto run = [&](std::span<const std::int64_t> tokens) -> result<std::vector<float>> {
    sequence_input in{&cache, tokens};
    // Only the last position's logits are drawn from: the LM head runs on it alone unless
    // every position's logits are kept.
    auto logits = options.keep_logits ? m.forward(std::span(&in, 1))
                                      : m.forward_last(std::span(&in, 1));
    if (logits && options.keep_logits)
      out.logits.insert(out.logits.end(), logits->begin(), logits->end());
    return logits;
  };
  auto logits = run(prompt);
  for (std::int64_t i = 0; logits && i < options.max_new; ++i) {
    // Drawn for position cache.length: the index the new token will have in the sequence.
    auto token = sample_token(std::span(*logits).last(static_cast<std::size_t>(vocab)),
                              options.sampling, static_cast<std::uint64_t>(cache.length));
    if (!token) return fail::failure("generate: " + token.error());
    out.tokens.push_back(*token);
    if (options.on_token) options.on_token(*token);
    const bool stop = options.stop_at_eos && std::find(eos.begin(), eos.end(), *token) != eos.end();
    // The last token is run only for its logits (keep_logits).
    if (options.keep_logits || (!stop && i + 1 < options.max_new))
      logits = run(std::span(out.tokens).last(1));
    if (stop) break;
  }
  if (!logits) return fail::failure("generate: " + logits.error());
  return out;
}

result<std::vector<std::int64_t>> load_engram_token_map(const model& m, const std::string& source) {
  using fail = result<std::vector<std::int64_t>>;
  const auto& c = m.text();
  if (source == "identity") {
    std::vector<std::int64_t> map(static_cast<std::size_t>(c.vocab_size));
    for (std::size_t i = 0; i < map.size(); ++i)
      map[i] = static_cast<std::int64_t>(i) % c.engram_compressed_vocab_size;
    return map;
  }
  std::ifstream f(source);
  if (!f) return fail::failure(source + ": cannot be read");
  auto j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail::failure(source + ": not JSON");
  if (j.is_object() && j.contains("token_map")) j = j["token_map"];
  if (!j.is_array())
    return fail::failure(source + ": expected an array of ids or {\"token_map\": [...]}");
  std::vector<std::int64_t> map;
  for (const auto& v : j) {
    if (!v.is_number_integer()) return fail::failure(source + ": token_map holds a non-integer");
    map.push_back(v.get<std::int64_t>());
  }
  return map;
}

}  // namespace troupe::kernels
