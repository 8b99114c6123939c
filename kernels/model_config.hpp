// The DeepSeek-V4.1 model config: every field of config.json the reference implementation reads.
//
// A checkpoint directory's config.json decides the model's shape: how many layers, which of
// them pool their KV (and by how much), which publish shared KV or indexer top-k, which carry
// Engram memory, how the router scores experts, how RoPE is scaled. The forward pass must read
// exactly what the reference (`transformers`' `deepseek_v41`) reads, with the same defaults and
// the same derived values (normalised `compress_ratios`, default source schedules, `layer_types`,
// the `main` / `compress` RoPE parameters with YaRN on the compressed branch only), and a wrong
// config must be refused with a message naming the field, what was expected and what was found,
// never by crashing later in a kernel. The composite config (`model_type: deepseek_v41`, with
// `text_config` and `vision_config`) and a plain text config (`deepseek_v41_text`, or one with
// the text fields at the top level) are both accepted. Failures are values (result<T>).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels {

/// One RoPE parameter set (`rope_parameters.main` or `.compress`).
struct rope_parameters {
  std::string rope_type = "default";  // "default" or "yarn"
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;  // qk_rope_head_dim / head_dim
  // YaRN (rope_type == "yarn" only).
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::int64_t original_max_position_embeddings = 0;
  double attention_factor = 1.0;  // the reference does not apply YaRN's mscale: 1.0
};

/// How a layer's attention is laid out, from its compress ratio and the source schedules.
enum class layer_kind {
  sliding,           // compress ratio 0: the sliding window only
  compressed,        // ratio r > 1: r tokens pooled per latent (the causal encoder)
  full_resolution,   // ratio 1: the decoder's full-resolution shared KV
};

/// The text backbone (`text_config`, `deepseek_v41_text`). Defaults are the reference's.
struct text_config {
  std::string model_type = "deepseek_v41_text";
  // attention / rope
  std::int64_t vocab_size = 129280;
  std::int64_t hidden_size = 5120;
  std::int64_t num_hidden_layers = 40;
  std::int64_t num_attention_heads = 64;
  std::int64_t num_key_value_heads = 1;
  std::int64_t head_dim = 512;
  std::int64_t q_lora_rank = 1280;
  std::int64_t qk_rope_head_dim = 64;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  rope_parameters rope_main;      // sliding-window-only branch: plain rope_theta, no scaling
  rope_parameters rope_compress;  // compressed branches: compress_rope_theta + rope_scaling
  std::int64_t max_position_embeddings = 1048576;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  // sliding window + CSA2
  std::int64_t sliding_window = 128;
  // num_hidden_layers + num_nextn_predict_layers entries after normalisation (draft layers 0).
  std::vector<std::int64_t> compress_ratios;
  std::vector<std::int64_t> kv_source_layer_ids;
  std::vector<std::int64_t> index_source_layer_ids;
  std::int64_t candidate_source_layer_id = -1;  // < 0: two-level top-k disabled
  std::int64_t candidate_topk_blocks = 2048;
  std::int64_t candidate_block_size = 8;
  std::int64_t index_n_heads = 32;
  std::int64_t index_head_dim = 128;
  std::int64_t index_topk = 512;
  // grouped low-rank output projection
  std::int64_t o_groups = 8;
  std::int64_t o_lora_rank = 1024;
  // MoE
  std::int64_t moe_intermediate_size = 2304;
  std::int64_t n_routed_experts = 384;
  std::int64_t n_shared_experts = 1;
  std::int64_t num_experts_per_tok = 6;
  std::string scoring_func = "sqrtsoftplus";  // sqrtsoftplus | softmax | sigmoid
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  std::string topk_method = "noaux_tc";  // the correction bias steers selection only
  double swiglu_limit = 10.0;
  // hyper-connections (mHC)
  std::int64_t hc_mult = 4;
  std::int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  // Engram conditional memory
  std::vector<std::int64_t> engram_layer_ids;
  std::int64_t engram_vocab_size = 16000000;
  std::vector<std::int64_t> engram_num_embeddings;  // one per engram layer
  std::int64_t engram_max_ngram_size = 4;
  std::int64_t engram_n_heads = 8;
  std::int64_t engram_head_dim = 256;
  std::int64_t engram_pad_id = 2;
  std::int64_t engram_compressed_vocab_size = 99092;
  // DSpark draft layers
  std::int64_t num_nextn_predict_layers = 3;
  std::int64_t dspark_block_size = 5;
  std::int64_t dspark_noise_token_id = 128799;
  std::vector<std::int64_t> dspark_target_layer_ids;
  std::int64_t dspark_markov_rank = 256;
  std::int64_t dspark_n_routed_experts = 128;
  std::int64_t dspark_num_experts_per_tok = 3;
  // misc
  std::string hidden_act = "silu";
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-20;
  bool use_cache = true;
  bool tie_word_embeddings = false;
  std::optional<std::int64_t> pad_token_id;
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids = {1};
  // Derived: "shared_compressed_attention" for KV-source layers, else "sliding_attention".
  std::vector<std::string> layer_types;

  /// The kind of backbone layer `layer` (0 <= layer < num_hidden_layers + nextn).
  layer_kind kind(std::int64_t layer) const;
  bool is_kv_source(std::int64_t layer) const;
  bool is_index_source(std::int64_t layer) const;
  /// The KV-source layer whose shared compressed KV `layer` reads (the closest at or before
  /// it), or -1 for a sliding-window-only layer.
  std::int64_t kv_source_of(std::int64_t layer) const;
  /// The index-source layer whose top-k `layer` reuses (closest at or before it), or -1.
  std::int64_t index_source_of(std::int64_t layer) const;
  /// The index of `layer` in engram_layer_ids, or -1.
  std::int64_t engram_index(std::int64_t layer) const;
};

/// The vision tower (`vision_config`); parsed so the composite config loads, not used yet.
struct vision_config {
  std::string model_type = "deepseek_v41_vision";
  std::int64_t hidden_size = 1024;
  std::int64_t intermediate_size = 2816;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 16;
  std::int64_t patch_size = 14;
  std::int64_t downsample_ratio = 3;
  double rope_theta = 10000.0;
  std::int64_t max_image_tokens = 1024;
  std::int64_t min_pixels = 295936;
  std::optional<std::int64_t> max_wh_ratio;
};

/// The checkpoint's storage formats (`quantization_config`, `expert_dtype`), when given.
struct quantization_config {
  std::string quant_method;                 // "fp8" in the released checkpoints
  std::string fmt;                          // "e4m3"
  std::string scale_fmt;                    // "ue8m0"
  std::vector<std::int64_t> weight_block_size;  // [32, 32] in V4.1, [128, 128] in V4-Flash
  std::string expert_dtype;                 // where V4.1 puts it ("fp4"); see model_config
};

/// The whole config.json.
struct model_config {
  std::string model_type = "deepseek_v41";  // or "deepseek_v41_text" for a plain text config
  std::vector<std::string> architectures;
  text_config text;
  std::optional<vision_config> vision;      // absent in a plain text config
  std::int64_t image_token_id = 129264;
  bool tie_word_embeddings = false;
  std::optional<quantization_config> quantization;
  /// "fp4" when routed experts are packed FP4, else empty: the top-level `expert_dtype`
  /// (V4-Flash) or `quantization_config.expert_dtype` (V4.1); both given must agree.
  std::string expert_dtype;

  /// Rows and columns of one FP8 weight scale block: `quantization_config.weight_block_size`,
  /// [128, 128] when absent.
  std::int64_t fp8_block_rows() const;
  std::int64_t fp8_block_cols() const;
};

/// Parses config.json text. `source` names the file in error messages ("<source>: <field>:
/// expected ..., found ..."). Unknown fields are ignored (as `transformers` does).
result<model_config> parse_model_config(std::string_view json_text,
                                        std::string_view source = "config.json");

/// Reads and parses a config.json file, or DIR/config.json when given a directory.
result<model_config> load_model_config(const std::filesystem::path& path);

}  // namespace troupe::kernels
