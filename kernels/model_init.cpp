#include "kernels/model_init.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kernels/counter_rng.hpp"
#include "kernels/portable_math.hpp"

namespace troupe::kernels {

namespace {

using json = nlohmann::ordered_json;

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ std::uint8_t(c)) * 0x100000001b3ULL;
  return h;
}

// A standard normal that depends only on (key, i): Box-Muller over two counter draws.
float normal(std::uint64_t key, std::uint64_t i) {
  const double u1 = 1.0 - counter_uniform(key, 2 * i);  // (0, 1]
  const double u2 = counter_uniform(key, 2 * i + 1);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// mean + std * N(0, 1) for the kind of tensor `name` is (the magnitudes keep every branch
// of the forward pass active: norms near 1, projections ~ 1/sqrt(fan_in), mHC mixes that do not
// saturate their sigmoids, a non-zero router correction bias).
std::pair<float, float> distribution(const weight_spec& s) {
  const std::string& n = s.name;
  const float fan_in = s.shape.size() == 2 ? float(s.shape[1]) : 1.0f;
  if (ends_with(n, "norm.weight")) return {1.0f, 0.1f};
  if (ends_with(n, "_fn")) return {0.0f, 2.0f / std::sqrt(fan_in)};
  if (ends_with(n, "_base")) return {0.0f, 0.5f};
  if (ends_with(n, "_scale") && n.find(".hc_") != std::string::npos) return {1.0f, 0.2f};
  if (ends_with(n, "attn_sink")) return {0.0f, 0.5f};
  if (ends_with(n, "gate.bias") || ends_with(n, "gate.bias_vl")) return {0.0f, 0.3f};
  if (ends_with(n, "q_weight") || ends_with(n, "k_weight")) return {1.0f, 0.3f};
  if (n == "embed.weight" || ends_with(n, "engram.embed.weight")) return {0.0f, 1.0f};
  return {0.0f, 1.0f / std::sqrt(fan_in)};
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::uint16_t float_to_bf16(float f) {  // round to nearest even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return std::uint16_t(u >> 16);
}

float bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

generated_weight generate_weight(const weight_spec& spec, std::uint64_t seed) {
  std::uint64_t n = 1;
  for (auto d : spec.shape) n *= std::uint64_t(d);
  const std::uint64_t key = splitmix64(seed ^ fnv1a(spec.name));
  const auto [mean, stddev] = distribution(spec);
  std::vector<float> raw(n);
  for (std::uint64_t i = 0; i < n; ++i) raw[i] = mean + stddev * normal(key, i);

  generated_weight g;
  const auto forms = stored_tensors(spec);
  auto put = [&](std::size_t i, std::vector<std::byte> bytes) {
    g.stored.push_back({forms[i].name, forms[i].type, forms[i].shape, std::move(bytes)});
  };
  switch (spec.format) {
    case weight_format::f32:
      g.values = raw;
      put(0, bytes_of(raw));
      break;
    case weight_format::bf16: {
      std::vector<std::uint16_t> b(n);
      g.values.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        b[i] = float_to_bf16(raw[i]);
        g.values[i] = bf16_value(b[i]);
      }
      put(0, bytes_of(b));
      break;
    }
    case weight_format::e8m0: {  // the Engram table's scales: 1.0
      std::vector<std::uint8_t> s(n, 127);
      g.values.assign(n, 1.0f);
      put(0, bytes_of(s));
      break;
    }
    case weight_format::fp8_table: {  // e4m3 values with unit scales
      std::vector<std::uint8_t> q(n);
      g.values.resize(n);
      for (std::uint64_t i = 0; i < n; ++i) {
        q[i] = portable::fp8_e4m3_code(raw[i]);
        g.values[i] = fp8_e4m3_to_float(q[i]);
      }
      put(0, bytes_of(q));
      break;
    }
    case weight_format::fp8_block: {
      const std::int64_t rows = spec.shape[0], cols = spec.shape[1];
      const std::int64_t br = spec.block_rows, bc = spec.block_cols;
      const auto& sshape = forms[1].shape;
      std::vector<std::uint8_t> q(n), s(std::size_t(sshape[0] * sshape[1]));
      g.values.resize(n);
      for (std::int64_t bi = 0; bi < sshape[0]; ++bi)
        for (std::int64_t bj = 0; bj < sshape[1]; ++bj) {
          const std::int64_t r_end = std::min(rows, (bi + 1) * br), c_end = std::min(cols, (bj + 1) * bc);
          float amax = 0;
          for (std::int64_t r = bi * br; r < r_end; ++r)
            for (std::int64_t c = bj * bc; c < c_end; ++c)
              amax = std::max(amax, std::fabs(raw[std::size_t(r * cols + c)]));
          const int k = std::clamp(portable::pow2_ceil_exponent(std::max(amax, 1e-30f) / 448.0f), -127, 127);
          s[std::size_t(bi * sshape[1] + bj)] = std::uint8_t(127 + k);
          const float scale = std::ldexp(1.0f, k);
          for (std::int64_t r = bi * br; r < r_end; ++r)
            for (std::int64_t c = bj * bc; c < c_end; ++c) {
              const std::size_t i = std::size_t(r * cols + c);
              q[i] = portable::fp8_e4m3_code(raw[i] / scale);
              g.values[i] = fp8_e4m3_to_float(q[i]) * scale;
            }
        }
      put(0, bytes_of(q));
      put(1, bytes_of(s));
      break;
    }
    case weight_format::fp4_expert: {
      const std::int64_t rows = spec.shape[0], cols = spec.shape[1];
      std::vector<std::uint8_t> packed(std::size_t(rows * cols / 2), 0), s(std::size_t(rows * cols / 32));
      g.values.resize(n);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t b = 0; b < cols / 32; ++b) {
          float amax = 0;
          for (std::int64_t c = b * 32; c < b * 32 + 32; ++c) amax = std::max(amax, std::fabs(raw[std::size_t(r * cols + c)]));
          const int k = std::clamp(portable::pow2_ceil_exponent(std::max(amax, 1e-30f) / 6.0f), -127, 127);
          s[std::size_t(r * (cols / 32) + b)] = std::uint8_t(127 + k);
          const float scale = std::ldexp(1.0f, k);
          for (std::int64_t c = b * 32; c < b * 32 + 32; ++c) {
            const std::size_t i = std::size_t(r * cols + c);
            const std::uint8_t code = portable::fp4_e2m1_code(raw[i] / scale);
            g.values[i] = fp4_e2m1_to_float(code) * scale;
            packed[i / 2] |= std::uint8_t(c % 2 == 0 ? code : code << 4);
          }
        }
      put(0, bytes_of(packed));
      put(1, bytes_of(s));
      break;
    }
  }
  return g;
}

result<std::string> preset_config_json(std::string_view preset) {
  json text;
  if (preset == "tiny") {
    text = {
        {"model_type", "deepseek_v41_text"}, {"vocab_size", 256}, {"hidden_size", 32},
        {"num_hidden_layers", 6}, {"num_attention_heads", 4}, {"num_key_value_heads", 1},
        {"head_dim", 32}, {"q_lora_rank", 32}, {"qk_rope_head_dim", 8}, {"rope_theta", 10000.0},
        {"compress_rope_theta", 160000.0},
        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}, {"beta_fast", 32}, {"beta_slow", 1},
                          {"original_max_position_embeddings", 256}}},
        {"max_position_embeddings", 1024}, {"sliding_window", 16},
        {"compress_ratios", {0, 2, 2, 1, 1, 1}}, {"kv_source_layer_ids", {1, 3}},
        {"index_source_layer_ids", {1, 3, 5}}, {"candidate_source_layer_id", 3},
        {"candidate_topk_blocks", 4}, {"candidate_block_size", 2}, {"index_n_heads", 8},
        {"index_head_dim", 32}, {"index_topk", 4}, {"o_groups", 2}, {"o_lora_rank", 16},
        {"moe_intermediate_size", 32}, {"n_routed_experts", 8}, {"num_experts_per_tok", 2},
        {"engram_layer_ids", {1}}, {"engram_vocab_size", 101}, {"engram_max_ngram_size", 3},
        {"engram_n_heads", 2}, {"engram_head_dim", 32}, {"engram_compressed_vocab_size", 256},
        {"dspark_noise_token_id", 254}, {"num_nextn_predict_layers", 2},
        {"dspark_markov_rank", 8}, {"dspark_n_routed_experts", 4},
        {"dspark_num_experts_per_tok", 2},
    };
  } else if (preset == "small") {
    std::vector<int> ratios = {0, 2, 2, 2, 1, 1, 1, 1};
    text = {
        {"model_type", "deepseek_v41_text"}, {"vocab_size", 129280}, {"hidden_size", 256},
        {"num_hidden_layers", 8}, {"num_attention_heads", 8}, {"num_key_value_heads", 1},
        {"head_dim", 128}, {"q_lora_rank", 128}, {"qk_rope_head_dim", 32}, {"rope_theta", 10000.0},
        {"compress_rope_theta", 160000.0},
        {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
                          {"original_max_position_embeddings", 65536}}},
        {"max_position_embeddings", 1048576}, {"sliding_window", 128},
        {"compress_ratios", ratios}, {"kv_source_layer_ids", {1, 4}},
        {"index_source_layer_ids", {1, 4, 6}}, {"candidate_source_layer_id", 4},
        {"candidate_topk_blocks", 16}, {"candidate_block_size", 8}, {"index_n_heads", 8},
        {"index_head_dim", 64}, {"index_topk", 64}, {"o_groups", 4}, {"o_lora_rank", 128},
        {"moe_intermediate_size", 256}, {"n_routed_experts", 16}, {"num_experts_per_tok", 4},
        {"engram_layer_ids", {1}}, {"engram_vocab_size", 5000}, {"engram_max_ngram_size", 3},
        {"engram_n_heads", 4}, {"engram_head_dim", 64}, {"engram_compressed_vocab_size", 99092},
        {"dspark_noise_token_id", 128799}, {"num_nextn_predict_layers", 1},
        {"dspark_markov_rank", 16}, {"dspark_n_routed_experts", 8},
        {"dspark_num_experts_per_tok", 2},
    };
  } else {
    return result<std::string>::failure("model init: unknown preset '" + std::string(preset) +
                                        "' (expected tiny or small)");
  }
  text["n_shared_experts"] = 1;
  text["scoring_func"] = "sqrtsoftplus";
  text["routed_scaling_factor"] = 1.5;
  text["topk_method"] = "noaux_tc";
  text["swiglu_limit"] = 10.0;
  text["hc_mult"] = 4;
  text["hc_sinkhorn_iters"] = 20;
  text["hc_eps"] = 1e-6;
  text["engram_pad_id"] = 2;
  text["hidden_act"] = "silu";
  text["rms_norm_eps"] = 1e-20;
  text["eos_token_id"] = 1;
  // Engram tables: the reference's layout (a layer's rows are the sum of its bucket primes).
  {
    text_config probe;
    probe.engram_layer_ids = text["engram_layer_ids"].get<std::vector<std::int64_t>>();
    probe.engram_vocab_size = text["engram_vocab_size"];
    probe.engram_max_ngram_size = text["engram_max_ngram_size"];
    probe.engram_n_heads = text["engram_n_heads"];
    json rows = json::array();
    for (const auto& primes : engram_primes(probe)) {
      std::int64_t total = 0;
      for (auto p : primes) total += p;
      rows.push_back(total);
    }
    text["engram_num_embeddings"] = rows;
  }
  const std::int64_t vocab = text["vocab_size"];
  json config = {
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"model_type", "deepseek_v41"},
      {"image_token_id", vocab - 1},
      {"tie_word_embeddings", false},
      // As released for V4.1: FP8 dense weights in 32 x 32 scale blocks, FP4 experts.
      {"quantization_config", {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                               {"weight_block_size", {32, 32}}, {"scale_fmt", "ue8m0"},
                               {"expert_dtype", "fp4"}}},
      {"text_config", text},
      {"vision_config", {{"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 2},
                         {"num_attention_heads", 2}, {"patch_size", 14}, {"downsample_ratio", 3},
                         {"max_image_tokens", 16}, {"min_pixels", 3136}}},
  };
  return config.dump(2) + "\n";
}

result<init_summary> write_random_model(const std::filesystem::path& dir, std::string_view preset,
                                        std::uint64_t seed, std::uint64_t shard_bytes) {
  using R = result<init_summary>;
  auto text = preset_config_json(preset);
  if (!text) return R::failure(text.error());
  auto cfg = parse_model_config(*text, std::string(preset) + " preset");
  if (!cfg) return R::failure(cfg.error());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return R::failure(dir.string() + ": " + ec.message());
  init_summary summary;
  {
    const auto path = dir / "config.json";
    std::ofstream out(path, std::ios::trunc);
    out << *text;
    if (!out) return R::failure(path.string() + ": cannot write");
    summary.files.push_back(path);
  }
  const auto layout = released_layout(*cfg);
  // Assign weights to shards in layout order, a new shard when the next weight would overflow.
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    std::uint64_t n = 1;
    for (auto d : layout[i].shape) n *= std::uint64_t(d);
    summary.parameters += n;
    const std::uint64_t est = layout[i].format == weight_format::f32 ? 4 * n
                              : layout[i].format == weight_format::bf16 ? 2 * n
                              : layout[i].format == weight_format::fp4_expert ? n / 2 + n / 32
                                                                              : n;
    if (in_shard > 0 && in_shard + est > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += est;
  }
  const bool single = shards.size() == 1;
  json weight_map = json::object();
  std::uint64_t total = 0;
  const std::string count = std::to_string(shards.size());
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::string file = "model.safetensors";
    if (!single) {
      auto pad = [](std::size_t v) {
        std::string t = std::to_string(v);
        return std::string(t.size() < 5 ? 5 - t.size() : 0, '0') + t;
      };
      file = "model-" + pad(s + 1) + "-of-" + pad(shards.size()) + ".safetensors";
    }
    std::vector<tensor_to_write> tensors;
    for (std::size_t i : shards[s]) {
      auto g = generate_weight(layout[i], seed);
      for (auto& t : g.stored) {
        weight_map[t.name] = file;
        total += t.data.size();
        tensors.push_back(std::move(t));
      }
    }
    auto written = write_safetensors(dir / file, tensors, {{"format", "pt"}});
    if (!written) return R::failure(written.error());
    summary.bytes += *written;
    summary.files.push_back(dir / file);
  }
  if (!single) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const auto path = dir / "model.safetensors.index.json";
    std::ofstream out(path, std::ios::trunc);
    out << index.dump(1) << "\n";
    if (!out) return R::failure(path.string() + ": cannot write");
    summary.files.push_back(path);
  } else {
    std::filesystem::remove(dir / "model.safetensors.index.json", ec);
  }
  return summary;
}

}  // namespace troupe::kernels
