// The weights of a loaded `model` (kernels/model.hpp) as the CPU engine holds them: every
// dense tensor fp32 (dequantised at load), the Engram tables left in the mapped checkpoint.
// model.cpp runs the forward pass over them; the CUDA engine's forward pass
// (kernels/cuda/device_model.hpp) copies them to the device. Shapes are the reference's: a
// projection's weight is [out, in].
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu_ops.hpp"
#include "kernels/model.hpp"
#include "kernels/worker_pool.hpp"

namespace troupe::kernels {

namespace loaded {

/// A loaded tensor's floats, immutable once loaded and shared by the models of this process
/// that loaded the same tensor (model_options::tensors: an EP group's ranks).
struct matrix {
  matrix() = default;
  explicit matrix(std::vector<float> values)
      : shared(std::make_shared<const std::vector<float>>(std::move(values))) {}
  const std::vector<float>& values() const {
    static const std::vector<float> none;
    return shared ? *shared : none;
  }
  const float* data() const { return values().data(); }
  std::size_t size() const { return values().size(); }
  float operator[](std::size_t i) const { return values()[i]; }

  std::shared_ptr<const std::vector<float>> shared;
};

}  // namespace loaded

/// Tensors by checkpoint name, as the first model of a process to load each read them
/// (model_options::tensors). Thread-safe.
class tensor_cache {
 public:
  /// The tensor `name` already loaded, or `load()`'s, kept for the next model when it succeeds.
  result<loaded::matrix> get(const std::string& name,
                             const std::function<result<loaded::matrix>()>& load);

 private:
  std::mutex mutex_;
  std::map<std::string, loaded::matrix> tensors_;
};

namespace loaded {

struct expert_weights {
  matrix w1, w2, w3;  // gate [I, D], down [D, I], up [I, D]
};

struct layer_weights {
  std::int64_t ratio = 0;
  bool kv_source = false;
  bool index_source = false;
  bool owns_index_keys = false;  // an index source that is also its group's KV source
  bool candidate_source = false;
  bool uses_candidates = false;
  // attention
  matrix wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  matrix c_wkv, c_wgate, c_norm;             // compressor (KV sources)
  matrix i_wq_b, i_weights, i_wk, i_k_norm;  // indexer (index sources; wk / k_norm: owners)
  // mHC
  matrix hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  matrix attn_norm, ffn_norm;
  // MoE
  matrix gate, gate_bias;
  std::vector<expert_weights> experts;
  expert_weights shared;
  // Engram
  std::int64_t engram_index = -1;
  std::optional<tensor_view> engram_table, engram_scale;
  matrix engram_wkv, engram_q, engram_k;
};

}  // namespace loaded

struct model::weights {
  model_config cfg;
  std::unique_ptr<worker_pool> workers;  // model_options::threads threads for parallel sections
  std::optional<checkpoint> ckpt;
  bool batch_invariant = false;
  float jitter = 0.0f;
  std::uint64_t jitter_seed = 0;
  bool released_names = false;
  loaded::matrix embed, norm, lm_head;
  std::vector<loaded::layer_weights> layers;
  rope_table rope_main, rope_compress;
  engram_hash_layout engram;
  std::vector<std::int64_t> token_map;  // token id -> compressed id (Engram)
  std::shared_ptr<block_pool> pool = std::make_shared<block_pool>();
  int expert_shards = 1;
  // This model's place in an EP group of this process (model_options::ep); the main layers'
  // experts it does not hold are empty matrices.
  std::optional<ep_member> ep;
  // The EP placement the main layers' MoEs run by (set_expert_placement), and the router's
  // top-k counts per routed expert.
  std::optional<expert_placement> placement;
  std::unique_ptr<std::atomic<std::uint64_t>[]> routed_counts;
  // DSpark draft layers (empty stages: the checkpoint has none).
  text_config draft_cfg;  // the text config with the draft stages' expert counts
  loaded::matrix main_proj, main_norm, draft_norm, markov_embed, markov_head, confidence;
  std::vector<loaded::layer_weights> draft_layers;

  std::string name(const std::string& hf) const {
    if (!released_names) return hf;
    if (hf == "lm_head.weight") return "head.weight";
    if (hf.rfind("model.", 0) == 0) return hf.substr(6);
    return hf;
  }

  /// A tensor of the checkpoint as fp32 (FP8 / FP4 dequantised), checked against `shape`.
  result<loaded::matrix> load(const std::string& hf, const std::vector<std::int64_t>& shape) const;
};

/// The Engram hash ids of one call's tokens, [tokens, Engram layers, columns]: sequence s owns
/// tokens [seq_begin[s], seq_begin[s + 1]) and continues from its recent compressed ids
/// `recent[s]` (oldest first); each token hashes the n-gram ending at it, padded before the
/// sequence's start (positions). The model must have its token map.
std::vector<std::int64_t> engram_hash_ids(const model::weights& W,
                                          std::span<const std::vector<std::int64_t>* const> recent,
                                          std::span<const std::int64_t> seq_begin,
                                          std::span<const std::int64_t> tokens,
                                          std::span<const std::int64_t> positions);

/// Appends a sequence's new tokens to its recent compressed ids, keeping what the next call's
/// n-grams and a rollback need.
void engram_remember(const model::weights& W, std::vector<std::int64_t>& recent,
                     std::span<const std::int64_t> tokens);

/// The table rows of Engram layer L for T tokens' hash ids (engram_hash_ids): rows
/// [T, columns, engram_head_dim] in fp32, read from the mapped checkpoint.
void engram_table_rows(const model::weights& W, const loaded::layer_weights& L,
                       std::span<const std::int64_t> hash_ids, std::int64_t T, float* rows);

}  // namespace troupe::kernels
