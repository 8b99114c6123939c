#include "kernels/model_layout.hpp"

#include <set>

namespace troupe::kernels {

const char* format_name(weight_format f) {
  switch (f) {
    case weight_format::bf16: return "bf16";
    case weight_format::f32: return "f32";
    case weight_format::fp8_block: return "fp8_block";
    case weight_format::fp4_expert: return "fp4_expert";
    case weight_format::fp8_table: return "fp8_table";
    case weight_format::e8m0: return "e8m0";
  }
  return "?";
}

namespace {

bool is_prime(std::int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (std::int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

}  // namespace

std::vector<std::vector<std::int64_t>> engram_primes(const text_config& t) {
  std::vector<std::vector<std::int64_t>> out;
  std::set<std::int64_t> seen;
  for (std::size_t layer = 0; layer < t.engram_layer_ids.size(); ++layer) {
    std::vector<std::int64_t> flat;
    for (std::int64_t n = 0; n + 1 < t.engram_max_ngram_size; ++n) {
      std::int64_t current = t.engram_vocab_size - 1;
      for (std::int64_t h = 0; h < t.engram_n_heads; ++h) {
        std::int64_t candidate = current + 1;
        while (!is_prime(candidate) || seen.count(candidate)) ++candidate;
        seen.insert(candidate);
        current = candidate;
        flat.push_back(candidate);
      }
    }
    out.push_back(std::move(flat));
  }
  return out;
}

std::vector<stored_tensor> stored_tensors(const weight_spec& spec) {
  const std::string& n = spec.name;
  const bool weight = n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0;
  const std::string scale = (weight ? n.substr(0, n.size() - 7) : n) + ".scale";
  const auto& s = spec.shape;
  switch (spec.format) {
    case weight_format::bf16: return {{n, dtype::BF16, s}};
    case weight_format::f32: return {{n, dtype::F32, s}};
    case weight_format::e8m0: return {{n, dtype::F8_E8M0, s}};
    case weight_format::fp8_table: return {{n, dtype::F8_E4M3, s}};
    case weight_format::fp8_block:
      return {{n, dtype::F8_E4M3, s},
              {scale, dtype::F8_E8M0,
               {(s[0] + spec.block_rows - 1) / spec.block_rows, (s[1] + spec.block_cols - 1) / spec.block_cols}}};
    case weight_format::fp4_expert:
      return {{n, dtype::I8, {s[0], s[1] / 2}}, {scale, dtype::F8_E8M0, {s[0], s[1] / 32}}};
  }
  return {};
}

std::vector<weight_spec> released_layout(const model_config& cfg) {
  const text_config& t = cfg.text;
  const bool fp8 = cfg.quantization && cfg.quantization->quant_method == "fp8";
  const weight_format dense = fp8 ? weight_format::fp8_block : weight_format::bf16;
  const weight_format expert = cfg.expert_dtype == "fp4" ? weight_format::fp4_expert
                               : cfg.expert_dtype == "bf16" ? weight_format::bf16
                                                            : dense;
  const std::int64_t H = t.hidden_size, hc = t.hc_mult, hd = t.head_dim;
  const std::int64_t heads = t.num_attention_heads;
  std::vector<weight_spec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, weight_format f) {
    out.push_back({std::move(name), std::move(shape), f, cfg.fp8_block_rows(), cfg.fp8_block_cols()});
  };
  add("embed.weight", {t.vocab_size, H}, weight_format::bf16);
  // One block of layer tensors under prefix p: a backbone layer i, or a DSpark draft layer
  // (sliding window only: no compressor, indexer or Engram; its own routed expert count).
  auto add_layer = [&](const std::string& p, std::int64_t i, bool draft) {
    const std::int64_t experts = draft ? t.dspark_n_routed_experts : t.n_routed_experts;
    add(p + "attn_norm.weight", {H}, weight_format::bf16);
    add(p + "ffn_norm.weight", {H}, weight_format::bf16);
    for (const char* site : {"attn", "ffn"}) {
      const std::string s = p + "hc_" + site + "_";
      add(s + "fn", {(2 + hc) * hc, hc * H}, weight_format::f32);
      add(s + "base", {(2 + hc) * hc}, weight_format::f32);
      add(s + "scale", {3}, weight_format::f32);
    }
    const std::string a = p + "attn.";
    add(a + "wq_a.weight", {t.q_lora_rank, H}, dense);
    add(a + "q_norm.weight", {t.q_lora_rank}, weight_format::bf16);
    add(a + "wq_b.weight", {heads * hd, t.q_lora_rank}, dense);
    add(a + "wkv.weight", {hd, H}, dense);
    add(a + "kv_norm.weight", {hd}, weight_format::bf16);
    add(a + "wo_a.weight", {t.o_groups * t.o_lora_rank, heads * hd / t.o_groups}, dense);
    add(a + "wo_b.weight", {H, t.o_groups * t.o_lora_rank}, dense);
    add(a + "attn_sink", {heads}, weight_format::f32);
    const bool kv_source = !draft && t.is_kv_source(i);
    if (kv_source) {
      add(a + "compressor.wkv.weight", {hd, H}, weight_format::bf16);
      if (t.compress_ratios[std::size_t(i)] > 1) add(a + "compressor.wgate.weight", {hd, H}, weight_format::bf16);
      add(a + "compressor.norm.weight", {hd}, weight_format::bf16);
    }
    if (!draft && t.is_index_source(i)) {
      add(a + "indexer.wq_b.weight", {t.index_n_heads * t.index_head_dim, t.q_lora_rank}, dense);
      add(a + "indexer.weights_proj.weight", {t.index_n_heads, H}, weight_format::bf16);
      if (kv_source) {
        add(a + "indexer.wk.weight", {t.index_head_dim, hd}, weight_format::bf16);
        add(a + "indexer.k_norm.weight", {t.index_head_dim}, weight_format::bf16);
      }
    }
    const std::string f = p + "ffn.";
    add(f + "gate.weight", {experts, H}, weight_format::bf16);
    add(f + "gate.bias", {experts}, weight_format::f32);
    add(f + "gate.bias_vl", {experts}, weight_format::f32);
    const std::int64_t I = t.moe_intermediate_size;
    for (std::int64_t e = 0; e < experts; ++e) {
      const std::string x = f + "experts." + std::to_string(e) + ".";
      add(x + "w1.weight", {I, H}, expert);
      add(x + "w2.weight", {H, I}, expert);
      add(x + "w3.weight", {I, H}, expert);
    }
    add(f + "shared_experts.w1.weight", {I, H}, dense);
    add(f + "shared_experts.w2.weight", {H, I}, dense);
    add(f + "shared_experts.w3.weight", {I, H}, dense);
    const std::int64_t ei = draft ? -1 : t.engram_index(i);
    if (ei >= 0) {
      const std::string e = p + "engram.";
      const std::int64_t rows = t.engram_num_embeddings[std::size_t(ei)];
      const std::int64_t cols = (t.engram_max_ngram_size - 1) * t.engram_n_heads;
      add(e + "embed.weight", {rows, t.engram_head_dim}, weight_format::fp8_table);
      add(e + "embed.scale", {rows, t.engram_head_dim / 32}, weight_format::e8m0);
      add(e + "wkv.weight", {H * (hc + 1), cols * t.engram_head_dim}, dense);
      add(e + "q_weight", {hc, H}, weight_format::bf16);
      add(e + "k_weight", {hc, H}, weight_format::bf16);
    }
    };
  for (std::int64_t i = 0; i < t.num_hidden_layers; ++i)
    add_layer("layers." + std::to_string(i) + ".", i, false);
  add("norm.weight", {H}, weight_format::bf16);
  add("head.weight", {t.vocab_size, H}, weight_format::bf16);
  // The DSpark draft layers as released in V4.1 (`mtp.<stage>.`; DeepSeek's inference/model.py
  // and vLLM's V4.1 loader): each stage a sliding-window layer; the first also projects the
  // target layers' features (main_proj, FP8 like every dense projection, and main_norm), the
  // last holds the final norm, the Markov head (embed [vocab, rank], head [vocab, rank]) and
  // the confidence head [1, hidden + rank]. Embedding and LM head are the backbone's (the
  // reference ties them; a checkpoint that also ships `mtp.0.embed` / `mtp.<last>.head`
  // copies loads, the copies unread). No hc_head: V4.1 collapses with the last pre-mix.
  const std::int64_t stages = t.num_nextn_predict_layers;
  for (std::int64_t i = 0; i < stages; ++i) {
    const std::string p = "mtp." + std::to_string(i) + ".";
    if (i == 0) {
      const auto n_targets = static_cast<std::int64_t>(t.dspark_target_layer_ids.size());
      add(p + "main_proj.weight", {H, n_targets * H}, dense);
      add(p + "main_norm.weight", {H}, weight_format::bf16);
    }
    add_layer(p, t.num_hidden_layers + i, true);
    if (i == stages - 1) {
      const std::int64_t rank = t.dspark_markov_rank;
      add(p + "norm.weight", {H}, weight_format::bf16);
      add(p + "markov_head.embed.weight", {t.vocab_size, rank}, weight_format::bf16);
      add(p + "markov_head.head.weight", {t.vocab_size, rank}, weight_format::bf16);
      add(p + "confidence_head.proj.weight", {1, H + rank}, weight_format::bf16);
    }
  }
  return out;
}

}  // namespace troupe::kernels
