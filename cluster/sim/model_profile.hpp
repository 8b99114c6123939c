// Model profiles: what the performance model needs to know about a model, read from its HF config.
//
// The simulated world costs a device step from the shape of the model: which attention each
// layer runs (MLA, sliding window, compressed sparse, heavily compressed, the causal
// encoder–decoder layers of V4.1), how wide the experts are and how many a token visits, which
// layers read Engram tables, and how many bytes of KV a token leaves behind. All of it is in a
// Hugging Face `config.json`; this file reads the three DeepSeek families troupe serves
// (`deepseek_v3`, `deepseek_v4`, `deepseek_v41`) into one `model_profile`, with a clear message
// for a missing or malformed field. The storage formats that a config does not state (FP4
// experts, FP4 main KV, the FP8 sliding-window layout) are fixed per family here and documented
// in docs/perf-model.md. The KV store sizes its blocks from `kv_bytes_per_block`.
#pragma once

#include "cluster/sim/result.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster::sim {

/// Tokens per persisted KV block (the store's unit).
inline constexpr std::uint32_t kv_block_tokens = 128;

/// The model families troupe reads.
enum class model_family { deepseek_v3, deepseek_v4, deepseek_v41 };

std::string to_string(model_family f);

/// What attention a layer runs.
enum class attention_kind : std::uint8_t {
  mla,         // V3 multi-head latent attention over the full context
  sliding,     // sliding window only (V4 / V4.1 layers with compress ratio 0)
  csa,         // V4 compressed sparse attention: window + top-k of ratio-4 latents
  hca,         // V4 heavily compressed attention: window + all ratio-128 latents
  ced_encoder, // V4.1 encoder layer: window + top-k of pooled (ratio > 1) latents
  ced_decoder, // V4.1 decoder layer: window + top-k of full-resolution latents
};

std::string to_string(attention_kind k);

/// One backbone layer.
struct layer_profile {
  attention_kind attention = attention_kind::mla;
  /// Tokens per compressed latent: 0 none, 1 full resolution, r > 1 pooled.
  std::uint32_t compress_ratio = 0;
  /// Owns a compressor and publishes block KV (its bytes count in kv_bytes_per_token).
  bool kv_source = false;
  /// Runs the sparse indexer (scores every visible latent and publishes top-k).
  bool index_source = false;
  /// Its indexer searches only the candidate blocks chosen by an earlier layer (V4.1).
  bool candidate_limited = false;
  /// MoE (true) or a dense FFN (false).
  bool moe = true;
  /// Reads Engram tables.
  bool engram = false;
  /// In prefill, runs only on the last `replay_tokens` of each sequence (V4.1 decoder layers:
  /// bounded replay).
  bool prefill_tail_only = false;

  friend bool operator==(const layer_profile&, const layer_profile&) = default;
};

/// Everything the performance model and the KV store need to know about a model.
struct model_profile {
  std::string name;
  model_family family = model_family::deepseek_v3;

  std::uint32_t hidden = 0;
  std::uint32_t vocab = 0;
  std::vector<layer_profile> layers;

  // Attention.
  std::uint32_t heads = 0;
  std::uint32_t qk_head_dim = 0;  // per head, nope + rope (V3: 192; V4: 512)
  std::uint32_t v_head_dim = 0;   // per head (V3: 128; V4: 512)
  std::uint32_t rope_dim = 0;
  std::uint32_t kv_latent_dim = 0; // what one cached KV entry holds (V3: 512 + 64; V4: 512)
  std::uint32_t sliding_window = 0;
  std::uint32_t index_heads = 0;
  std::uint32_t index_head_dim = 0;
  std::uint32_t index_topk = 0;
  std::uint32_t candidate_positions = 0; // V4.1: candidate blocks × block size (0: none)
  /// Projection parameters of one layer's attention (q, kv, o; without compressor / indexer).
  double attention_params = 0;
  /// Extra parameters of a KV-source layer's compressor and of an index source's indexer.
  double compressor_params = 0;
  double indexer_params = 0;

  // Experts.
  std::uint32_t routed_experts = 0;
  std::uint32_t shared_experts = 0;
  std::uint32_t experts_per_token = 0;
  std::uint32_t expert_groups = 1; // V3 node-limited routing: groups and groups per token
  std::uint32_t groups_per_token = 1;
  std::uint32_t moe_intermediate = 0;
  std::uint32_t dense_intermediate = 0;
  double expert_params = 0; // one expert (gate, up, down)

  // Engram.
  std::uint32_t engram_rows_per_token = 0; // table rows one token reads in one Engram layer
  std::uint32_t engram_head_dim = 0;
  std::uint32_t engram_row_bytes = 0;
  double engram_table_rows = 0;             // all Engram layers
  double engram_projection_params = 0;      // per Engram layer

  // Draft (MTP / DSpark) layers after the backbone.
  std::uint32_t draft_layers = 0;

  /// Bounded replay: in prefill, tail-only layers run on this many tokens per sequence.
  std::uint32_t replay_tokens = 0;

  // Storage formats, bytes.
  double expert_bytes_per_param = 1;  // FP8 (V3) or FP4 + scales (V4, V4.1)
  double dense_bytes_per_param = 1;   // FP8 attention / shared experts
  double head_bytes_per_param = 2;    // BF16 embedding and lm head
  double kv_entry_bytes = 0;          // one compressed (or MLA) KV entry
  double index_entry_bytes = 0;       // one indexer key
  double swa_entry_bytes = 0;         // one sliding-window KV entry

  /// Block-KV bytes one token leaves behind (what the store persists), summed over layers.
  double kv_bytes_per_token = 0;
  /// Parameters a token activates: in decode every layer and the lm head; in prefill the
  /// tail-only layers are skipped and the lm head runs once per sequence, so it is not counted.
  double active_params_decode = 0;
  double active_params_prefill = 0;
  double total_params = 0;

  /// KV bytes of one 128-token block.
  double kv_bytes_per_block() const { return kv_bytes_per_token * kv_block_tokens; }
  /// Bytes of one request's sliding-window rings: every layer with a window keeps its last
  /// `sliding_window` + 6 tokens (the window and the entries of a compressor block still
  /// being filled), `swa_entry_bytes` each; none for MLA (V3). Never persisted, so a decode
  /// hand-off on drain carries them with the block KV.
  double swa_ring_bytes() const;
  std::size_t moe_layer_count() const;
};

/// Reads an HF config object (`model_type` deepseek_v3, deepseek_v4 or deepseek_v41; for V4.1
/// the fields are under `text_config`). `name` becomes the profile's name. Fails with a message
/// naming the first missing or malformed field.
result<model_profile> model_from_config(const nlohmann::json& config, std::string name);

/// `model_from_config` on a `config.json` file (or a folder holding one).
result<model_profile> load_model_config(const std::filesystem::path& file);

/// The topology model names (`deepseek-v4.1-flash`, `deepseek-v4-flash`, `deepseek-v3`,
/// case-insensitive) and the folder of examples/models/ that ships each one's config.
const std::vector<std::pair<std::string_view, std::string_view>>& known_model_configs();

/// The profile of a topology model name, read from `<models_dir>/<folder>/config.json`; or, if
/// `name_or_path` is not a known name, from that path. Fails with the known names otherwise.
result<model_profile> resolve_model(std::string_view name_or_path,
                                    const std::filesystem::path& models_dir);

/// Where the shipped configs live: $TROUPE_MODELS_DIR if set; else, for a program installed
/// in <prefix>/bin, <prefix>/share/troupe/models if it exists; else examples/models of the
/// source tree troupe was built from (compiled in). A program of its own linking an installed
/// troupe should pass troupe_MODELS_DIR (set by find_package(troupe)) to resolve_model instead.
std::filesystem::path default_models_dir();

} // namespace troupe::cluster::sim
