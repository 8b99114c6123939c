// Parity of the CPU model with the `transformers` reference: the tiny random checkpoints and
// golden logits under tests/kernels/golden/model/ (written by tools/model_golden.py, running
// the upstream deepseek_v41 modeling file on torch CPU in fp32). Each config is checked in
// full prefill (prompt + decode tokens in one call), prefill then step-by-step decode, and
// with its prompts batched together, and in chunked prefill (the reference's two chunks, and
// more); fp32, max relative error ≤ 1e-4. The Engram hash ids equal the reference's.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/model.hpp"
#include "model_fixture.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

const fs::path golden_root = fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model";
// fp32 against fp32: the two implementations differ by ~1e-6 relative (summation order); 1e-4
// leaves room for that to grow through the layers and nothing for a real difference (a wrong
// mask, rope or quantiser moves the logits by 1e-2 and more).
constexpr double tolerance = 1e-4;

struct golden_prompt {
  std::vector<std::int64_t> input, decode;
  std::vector<float> prefill, decode_logits, full, chunked;
  std::size_t chunk_split = 0;
  std::vector<std::int64_t> hash_ids;  // [S + K, engram layers, columns] when Engram
};

std::vector<std::int64_t> ids(const checkpoint& g, const std::string& name) {
  auto v = g.load_float(name);
  REQUIRE_MESSAGE(v.ok(), v.error());
  return {v->begin(), v->end()};
}

std::vector<float> floats(const checkpoint& g, const std::string& name) {
  auto v = g.load_float(name);
  REQUIRE_MESSAGE(v.ok(), v.error());
  return *v;
}

std::vector<golden_prompt> load_goldens(const fs::path& dir) {
  auto g = checkpoint::open(dir / "golden.safetensors");
  REQUIRE_MESSAGE(g.ok(), g.error());
  std::ifstream meta_file(dir / "golden.json");
  const auto meta = nlohmann::json::parse(meta_file);
  std::vector<golden_prompt> out;
  for (int p = 0; g->contains("prompt" + std::to_string(p) + ".input_ids"); ++p) {
    const std::string k = "prompt" + std::to_string(p) + ".";
    out.push_back({ids(*g, k + "input_ids"),
                   ids(*g, k + "decode_ids"),
                   floats(*g, k + "prefill_logits"),
                   floats(*g, k + "decode_logits"),
                   floats(*g, k + "full_logits"),
                   floats(*g, k + "chunked_prefill_logits"),
                   meta.at("prompts").at(std::size_t(p)).at("chunk_split").get<std::size_t>(),
                   {}});
    if (g->contains(k + "engram_hash_ids")) out.back().hash_ids = ids(*g, k + "engram_hash_ids");
  }
  REQUIRE(!out.empty());
  return out;
}

// The Engram hash ids of a whole sequence, as the forward pass computes them (look-back over
// the compressed ids, the compressed pad id before the start).
std::vector<std::int64_t> hash_ids(const model& m, const std::vector<std::int64_t>& token_map,
                                   const std::vector<std::int64_t>& seq) {
  const auto& c = m.text();
  const auto layout = engram_hash_layout::from_config(c);
  const auto pad = token_map[std::size_t(c.engram_pad_id)];
  std::vector<std::int64_t> out, look(std::size_t(c.engram_max_ngram_size)),
      row(std::size_t(layout.columns));
  for (std::size_t p = 0; p < seq.size(); ++p) {
    for (std::size_t k = 0; k < look.size(); ++k)
      look[k] = p < k ? pad : token_map[std::size_t(seq[p - k])];
    for (std::size_t e = 0; e < c.engram_layer_ids.size(); ++e) {
      layout.hash(std::int64_t(e), look, row.data());
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  return out;
}

model load_golden_model(const fs::path& dir, model_options options = {}) {
  auto m = model::load(dir, options);
  REQUIRE_MESSAGE(m.ok(), m.error());
  if (fs::exists(dir / "engram_meta.json")) {
    std::ifstream f(dir / "engram_meta.json");
    auto meta = nlohmann::json::parse(f);
    REQUIRE(m->set_engram_token_map(meta.at("token_map").get<std::vector<std::int64_t>>()).ok());
    // The hash layout the reference derived: multipliers (NumPy's generator), primes, offsets.
    auto layout = engram_hash_layout::from_config(m->text());
    for (std::size_t l = 0; l < layout.multipliers.size(); ++l) {
      std::vector<std::int64_t> mult;
      for (const auto& s : meta.at("multipliers").at(l))
        mult.push_back(std::stoll(s.get<std::string>()));
      CHECK(layout.multipliers[l] == mult);
      CHECK(layout.primes[l] == meta.at("primes").at(l).get<std::vector<std::int64_t>>());
      CHECK(layout.offsets[l] == meta.at("offsets").at(l).get<std::vector<std::int64_t>>());
    }
  }
  return std::move(*m);
}

std::span<const float> rows(const std::vector<float>& v, std::size_t from, std::size_t n,
                            std::size_t vocab) {
  return std::span(v).subspan(from * vocab, n * vocab);
}

void check_config(const std::string& name) {
  const fs::path dir = golden_root / name;
  auto m = load_golden_model(dir);
  const auto vocab = static_cast<std::size_t>(m.text().vocab_size);
  auto goldens = load_goldens(dir);

  // First, that the comparison means something on every BLAS kernel (model_fixture.hpp).
  for (std::size_t p = 0; p < goldens.size(); ++p) {
    CAPTURE(name);
    CAPTURE(p);
    std::vector<std::int64_t> full = goldens[p].input;
    full.insert(full.end(), goldens[p].decode.begin(), goldens[p].decode.end());
    testing::require_stable_inputs(
        {},
        [&](const model_options& o) {
          auto jm = load_golden_model(dir, o);
          auto cache = jm.new_sequence();
          return std::pair{testing::run(jm, cache, full), std::vector<std::int64_t>{}};
        },
        tolerance);
  }

  for (std::size_t p = 0; p < goldens.size(); ++p) {
    const auto& g = goldens[p];
    CAPTURE(name);
    CAPTURE(p);
    std::vector<std::int64_t> full = g.input;
    full.insert(full.end(), g.decode.begin(), g.decode.end());

    if (!g.hash_ids.empty()) {
      std::ifstream f(dir / "engram_meta.json");
      const auto map = nlohmann::json::parse(f).at("token_map").get<std::vector<std::int64_t>>();
      CHECK(hash_ids(m, map, full) == g.hash_ids);
    }

    // The prompt in the two chunks the reference used.
    {
      auto cache = m.new_sequence();
      std::vector<float> got;
      for (auto part :
           {std::span(g.input).first(g.chunk_split), std::span(g.input).subspan(g.chunk_split)}) {
        sequence_input in{&cache, part};
        auto r = m.forward(std::span(&in, 1));
        REQUIRE(r.ok());
        got.insert(got.end(), r->begin(), r->end());
      }
      CHECK(testing::relative_error(got, g.chunked) <= tolerance);
    }

    // Full prefill.
    auto cache = m.new_sequence();
    sequence_input in{&cache, full};
    auto logits = m.forward(std::span(&in, 1));
    REQUIRE_MESSAGE(logits.ok(), logits.error());
    CHECK(testing::relative_error(*logits, g.full) <= tolerance);

    // Prefill (layer by layer for the first prompt), then one token at a time.
    auto c2 = m.new_sequence();
    sequence_input pin{&c2, g.input};
    std::vector<std::vector<float>> streams;
    auto pre = m.forward(std::span(&pin, 1), &streams);
    REQUIRE(pre.ok());
    if (p == 0) {
      auto gf = checkpoint::open(dir / "golden.safetensors");
      REQUIRE(gf.ok());
      for (std::size_t l = 0; l < streams.size(); ++l) {
        CAPTURE(l);
        CHECK(testing::relative_error(streams[l], floats(*gf, "prompt0.layer" + std::to_string(l) +
                                                                  ".streams")) <= tolerance);
      }
    }
    CHECK(testing::relative_error(*pre, g.prefill) <= tolerance);
    for (std::size_t i = 0; i < g.decode.size(); ++i) {
      CAPTURE(i);
      sequence_input din{&c2, std::span(g.decode).subspan(i, 1)};
      auto step = m.forward(std::span(&din, 1));
      REQUIRE(step.ok());
      CHECK(testing::relative_error(*step, rows(g.decode_logits, i, 1, vocab)) <= tolerance);
    }
  }

  // Chunked prefill of prompt + decode tokens at several chunk sizes.
  for (std::size_t chunk : {2u, 3u, 5u}) {
    CAPTURE(chunk);
    const auto& g = goldens[0];
    std::vector<std::int64_t> full = g.input;
    full.insert(full.end(), g.decode.begin(), g.decode.end());
    auto cache = m.new_sequence();
    std::vector<float> got;
    for (std::size_t at = 0; at < full.size(); at += chunk) {
      sequence_input in{&cache, std::span(full).subspan(at, std::min(chunk, full.size() - at))};
      auto part = m.forward(std::span(&in, 1));
      REQUIRE(part.ok());
      got.insert(got.end(), part->begin(), part->end());
    }
    CHECK(testing::relative_error(got, g.full) <= tolerance);
  }

  // Batch-invariant mode is at parity too.
  {
    auto inv = load_golden_model(dir, {.threads = 2, .batch_invariant = true});
    const auto& g = goldens[0];
    std::vector<std::int64_t> full = g.input;
    full.insert(full.end(), g.decode.begin(), g.decode.end());
    auto cache = inv.new_sequence();
    sequence_input in{&cache, full};
    auto r = inv.forward(std::span(&in, 1));
    REQUIRE(r.ok());
    CHECK(testing::relative_error(*r, g.full) <= tolerance);
  }

  // Every prompt prefilled in one batch, then decoded together.
  std::vector<sequence_cache> caches;
  for (std::size_t p = 0; p < goldens.size(); ++p) caches.push_back(m.new_sequence());
  std::vector<sequence_input> batch;
  for (std::size_t p = 0; p < goldens.size(); ++p) batch.push_back({&caches[p], goldens[p].input});
  auto out = m.forward(batch);
  REQUIRE(out.ok());
  std::size_t at = 0;
  for (const auto& g : goldens) {
    CHECK(testing::relative_error(std::span(*out).subspan(at, g.prefill.size()), g.prefill) <=
          tolerance);
    at += g.prefill.size();
  }
  for (std::size_t i = 0;; ++i) {
    batch.clear();
    std::vector<std::size_t> who;
    for (std::size_t p = 0; p < goldens.size(); ++p)
      if (i < goldens[p].decode.size()) {
        batch.push_back({&caches[p], std::span(goldens[p].decode).subspan(i, 1)});
        who.push_back(p);
      }
    if (batch.empty()) break;
    auto step = m.forward(batch);
    REQUIRE(step.ok());
    for (std::size_t b = 0; b < who.size(); ++b)
      CHECK(testing::relative_error(rows(*step, b, 1, vocab),
                                    rows(goldens[who[b]].decode_logits, i, 1, vocab)) <= tolerance);
  }
}

}  // namespace

TEST_CASE("parity with the reference: sliding-window only") { check_config("sliding"); }
TEST_CASE(
    "parity with the reference: ratio-2 / ratio-1 groups, candidates, Engram, FP8 / FP4, shards") {
  check_config("mixed");
}
TEST_CASE("parity with the reference: ratio-4 group with a Reindex source, Engram") {
  check_config("ratio4");
}
TEST_CASE(
    "parity with the reference: the cache quantisers active (FP8 window, FP4 keys and latents)") {
  check_config("qat");
}
