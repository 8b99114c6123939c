// The tiny DeepSeek-V4.1 checkpoints written from the transformers reference
// (tools/model_golden.py, tests/kernels/golden/model/): their config.json parses, the layout
// troupe derives from the config is exactly the reference's tensor list (names, shapes, storage
// dtypes), and every tensor loads and dequantizes to the values the reference ran with (its
// sums in golden.json). The forward-pass parity tests use the same files.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/model_config.hpp"
#include "kernels/model_layout.hpp"
#include "kernels/safetensors.hpp"

using namespace troupe::kernels;
namespace fs = std::filesystem;

namespace {

const fs::path golden_root = fs::path(TROUPE_SOURCE_DIR) / "tests/kernels/golden/model";
const char* const configs[] = {"sliding", "mixed", "ratio4", "qat"};

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), p.string());
  return nlohmann::json::parse(in);
}

// The torch dtype name tools/model_golden.py records for a storage format.
std::string torch_dtype(weight_format f) {
  switch (f) {
    case weight_format::bf16: return "bfloat16";
    case weight_format::f32: return "float32";
    case weight_format::fp8_block:
    case weight_format::fp8_table: return "float8_e4m3fn";
    case weight_format::fp4_expert: return "int8";
    case weight_format::e8m0: return "float8_e8m0fnu";
  }
  return "?";
}

}  // namespace

TEST_CASE("golden checkpoints: the layout derived from config.json is the reference's tensor list") {
  for (const char* name : configs) {
    CAPTURE(name);
    const fs::path dir = golden_root / name;
    auto cfg = load_model_config(dir);
    REQUIRE_MESSAGE(cfg.ok(), cfg.error());
    const auto meta = read_json(dir / "golden.json");
    const auto& reference = meta.at("tensors");
    const auto layout = released_layout(*cfg);
    std::set<std::string> ours;
    for (const auto& w : layout) {
      CAPTURE(w.name);
      ours.insert(w.name);
      REQUIRE(reference.contains(w.name));
      CHECK(reference.at(w.name).at("shape").get<std::vector<std::int64_t>>() == w.shape);
      CHECK(reference.at(w.name).at("dtype").get<std::string>() == torch_dtype(w.format));
    }
    for (const auto& [ref_name, _] : reference.items()) {
      CAPTURE(ref_name);
      CHECK(ours.count(ref_name) == 1);
    }
    CHECK(layout.size() == reference.size());
  }
}

TEST_CASE("golden checkpoints: every tensor loads and dequantizes to the values the reference ran with") {
  for (const char* name : configs) {
    CAPTURE(name);
    const fs::path dir = golden_root / name;
    auto cfg = load_model_config(dir);
    REQUIRE(cfg.ok());
    auto ck = checkpoint::open(dir);
    REQUIRE_MESSAGE(ck.ok(), ck.error());
    CHECK(ck->file_count() == (std::string(name) == "mixed" ? 2u : 1u));
    const auto reference = read_json(dir / "golden.json").at("tensors");
    std::size_t quantized = 0;
    for (const auto& w : released_layout(*cfg)) {
      CAPTURE(w.name);
      std::vector<float> values;
      std::vector<std::int64_t> shape;
      if (w.format == weight_format::fp8_table || w.format == weight_format::e8m0) {
        // The Engram table's scales are per row and 32 channels, not the 128x128 blocks of
        // load_float; the golden tables have all scales 1.0 (checked below).
        auto t = ck->get(w.name);
        REQUIRE_MESSAGE(t.ok(), t.error());
        auto f = to_float32(*t);
        REQUIRE_MESSAGE(f.ok(), f.error());
        values = *f;
        shape = t->shape();
        if (w.format == weight_format::e8m0)
          for (float v : values) REQUIRE(v == 1.0f);
      } else {
        auto f = ck->load_float(w.name, &shape);
        REQUIRE_MESSAGE(f.ok(), f.error());
        values = *f;
      }
      if (w.format == weight_format::fp8_block || w.format == weight_format::fp4_expert) ++quantized;
      CHECK(shape == w.shape);
      double sum = 0, sum_abs = 0, sum_sq = 0, sum_pos = 0;
      for (std::size_t i = 0; i < values.size(); ++i) {
        const float v = values[i];
        sum_pos += double(v) * double(i % 251 + 1);
        sum += v;
        sum_abs += std::fabs(v);
        sum_sq += double(v) * v;
      }
      const auto& ref = reference.at(w.name);
      // The values are the same floats: only the summation order differs.
      const double tol = 1e-9 * ref.at("sum_abs").get<double>() + 1e-12;
      CHECK(std::fabs(sum - ref.at("sum").get<double>()) <= tol);
      CHECK(std::fabs(sum_abs - ref.at("sum_abs").get<double>()) <= tol);
      CHECK(std::fabs(sum_pos - ref.at("sum_pos").get<double>()) <= 251 * tol);
      CHECK(std::fabs(sum_sq - ref.at("sum_sq").get<double>()) <= 1e-9 * ref.at("sum_sq").get<double>() + 1e-12);
    }
    const bool is_quantized = cfg->quantization.has_value();
    CHECK((quantized > 0) == is_quantized);
  }
}

TEST_CASE("golden checkpoints: the goldens have the documented tensors and shapes") {
  for (const char* name : configs) {
    CAPTURE(name);
    const fs::path dir = golden_root / name;
    auto cfg = load_model_config(dir);
    REQUIRE(cfg.ok());
    const auto& t = cfg->text;
    auto g = safetensors_file::open(dir / "golden.safetensors");
    REQUIRE_MESSAGE(g.ok(), g.error());
    const auto meta = read_json(dir / "golden.json");
    const auto& prompts = meta.at("prompts");
    REQUIRE(prompts.size() == 2);
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      const std::string k = "prompt" + std::to_string(p) + ".";
      const std::int64_t S = prompts[p].at("length"), K = prompts[p].at("decode_steps");
      auto ids = g->find(k + "input_ids");
      REQUIRE(ids);
      CHECK(ids->type() == dtype::I64);
      CHECK(ids->shape() == std::vector<std::int64_t>{S});
      CHECK(g->find(k + "prefill_logits")->shape() == std::vector<std::int64_t>{S, t.vocab_size});
      CHECK(g->find(k + "decode_logits")->shape() == std::vector<std::int64_t>{K, t.vocab_size});
      CHECK(g->find(k + "full_logits")->shape() == std::vector<std::int64_t>{S + K, t.vocab_size});
      CHECK(g->find(k + "chunked_prefill_logits")->shape() == std::vector<std::int64_t>{S, t.vocab_size});
      CHECK(prompts[p].at("chunk_split").get<std::int64_t>() < S);
      CHECK(prompts[p].at("max_abs_diff_chunked_vs_prefill").get<double>() < 1e-4);
      // The reference agrees with itself (full sequence vs prefill and decode, chunked vs one
      // prefill) to 1e-4.
      CHECK(prompts[p].at("max_abs_diff_full_vs_prefill").get<double>() < 1e-4);
      CHECK(prompts[p].at("max_abs_diff_full_vs_decode").get<double>() < 1e-4);
      if (!t.engram_layer_ids.empty()) {
        auto h = g->find(k + "engram_hash_ids");
        REQUIRE(h);
        const std::int64_t cols = (t.engram_max_ngram_size - 1) * t.engram_n_heads;
        CHECK(h->shape() == std::vector<std::int64_t>{S + K, std::int64_t(t.engram_layer_ids.size()), cols});
      }
    }
    for (std::int64_t i = 0; i < t.num_hidden_layers; ++i) {
      auto s = g->find("prompt0.layer" + std::to_string(i) + ".streams");
      REQUIRE(s);
      CHECK(s->shape() == std::vector<std::int64_t>{prompts[0].at("length").get<std::int64_t>(), t.hc_mult, t.hidden_size});
    }
  }
}

TEST_CASE("golden checkpoints: engram_primes gives the reference's table sizes and bucket primes") {
  for (const char* name : {"mixed", "ratio4"}) {
    CAPTURE(name);
    const fs::path dir = golden_root / name;
    auto cfg = load_model_config(dir);
    REQUIRE(cfg.ok());
    const auto meta = read_json(dir / "engram_meta.json");
    const auto primes = engram_primes(cfg->text);
    CHECK(primes == meta.at("primes").get<std::vector<std::vector<std::int64_t>>>());
    for (std::size_t l = 0; l < primes.size(); ++l) {
      std::int64_t rows = 0;
      for (auto p : primes[l]) rows += p;
      CHECK(rows == cfg->text.engram_num_embeddings[l]);
    }
  }
}

TEST_CASE("released config: engram_primes gives the released table sizes; the compressed vocabulary matches the tokenizer") {
  auto cfg = load_model_config(fs::path(TROUPE_SOURCE_DIR) / "examples/models/DeepSeek-V4.1-Flash/config.json");
  REQUIRE_MESSAGE(cfg.ok(), cfg.error());
  const auto& t = cfg->text;
  const auto primes = engram_primes(t);
  REQUIRE(primes.size() == t.engram_layer_ids.size());
  for (std::size_t l = 0; l < primes.size(); ++l) {
    CHECK(primes[l].size() == std::size_t((t.engram_max_ngram_size - 1) * t.engram_n_heads));
    std::int64_t rows = 0;
    for (auto p : primes[l]) rows += p;
    CHECK(rows == t.engram_num_embeddings[l]);  // 384006168 and 384016682
  }
  // The reference's token map from the DeepSeek-V4 tokenizer (recipe/data/deepseek-v4)
  // collapses to exactly the compressed vocabulary the released config declares.
  const auto meta = read_json(golden_root / "engram-v41-flash.json");
  CHECK(meta.at("compressed_vocab_size").get<std::int64_t>() == t.engram_compressed_vocab_size);
  CHECK(meta.at("vocab_size").get<std::int64_t>() == t.vocab_size);
  CHECK(meta.at("engram_layer_ids").get<std::vector<std::int64_t>>() == t.engram_layer_ids);
  CHECK(meta.at("multipliers").size() == t.engram_layer_ids.size());
  for (const auto& row : meta.at("multipliers")) {
    REQUIRE(row.size() == std::size_t(t.engram_max_ngram_size));
    for (const auto& m : row) {
      const long long v = std::stoll(m.get<std::string>());
      CHECK(v % 2 == 1);  // odd
      CHECK(v <= (std::numeric_limits<std::int64_t>::max() / t.engram_compressed_vocab_size));  // no overflow in id * m
    }
  }
  for (const auto& [id, compressed] : meta.at("token_map_sample").items()) {
    CHECK(std::stoll(id) < t.vocab_size);
    CHECK(compressed.get<std::int64_t>() < t.engram_compressed_vocab_size);
  }
}
