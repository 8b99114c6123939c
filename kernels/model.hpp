// The DeepSeek-V4.1 text model on the CPU: weights loaded from a checkpoint directory and the
// exact forward pass (prefill and batched decode) of `transformers`' `deepseek_v41` reference.
//
// A `model` holds every dense weight as fp32 (dequantised at load) and keeps the checkpoint
// mapped for the Engram tables, whose rows are gathered on lookup. `forward` runs the tokens of
// one or more sequences, each continuing from its own `sequence_cache`, and returns the logits of
// every token: prefill (many tokens), chunked prefill (the rest of a prompt after an earlier
// call) and decode (a few tokens per sequence, batched) are the same call. docs/model.md
// describes what each part computes and the cache layouts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/engram_hash.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/ep_exchange.hpp"
#include "kernels/kv_cache.hpp"
#include "kernels/model_config.hpp"
#include "kernels/result.hpp"
#include "kernels/safetensors.hpp"

namespace troupe::kernels {

/// One sequence's share of a forward call: its cache (advanced by the call) and new tokens.
struct sequence_input {
  sequence_cache* cache = nullptr;
  std::span<const std::int64_t> tokens;
};

/// One sequence's DSpark draft context: per draft stage, a ring of the context KV the stage
/// attends to (projected from the target layers' features of every token the target has run),
/// window + 6 rows like the target's SWA KV so that a rollback of up to 6 rejected tokens is
/// exact. Made by model::new_draft_state; advanced by model::draft.
struct draft_state {
  const void* owner = nullptr;
  std::vector<swa_ring> rings;
  /// Tokens whose features the state holds (the next block starts at this position).
  std::int64_t length() const { return rings.empty() ? 0 : rings.front().end(); }
  /// Forgets the last k <= 6 tokens' context (after the target rejected drafts).
  void rollback(std::int64_t k);
  /// Forgets every token's context; the next features are those of `position` (a sequence
  /// whose earlier features this state never saw: one imported from another device).
  void reset(std::int64_t position);
};

/// One sequence's share of a draft call: its state, the target features of the tokens the
/// sequence kept since the last draft call ([n, targets · hidden_size], rows of forward's
/// `dspark_features`; after a verify step, the rows of the accepted tokens — or all rows and
/// a draft_state::rollback of the rejected ones later), and the anchor: the token at position
/// state.length() after those rows, i.e. the target's next token, which the block starts from.
struct draft_input {
  draft_state* state = nullptr;
  std::span<const float> features;
  std::int64_t anchor = 0;
};

/// What a draft call returns, sequences in batch order, B = dspark_block_size per sequence.
struct draft_output {
  std::vector<std::int64_t> tokens;  // [S, B]: drafts of positions length+1 .. length+B
  std::vector<float> confidences;    // [S, B]: the confidence head's probability per draft
  std::vector<float> logits;         // [S, B, vocab]: the draft logits (LM head + Markov bias)
};

class tensor_cache;  // kernels/model_weights.hpp

struct model_options {
  int threads = 2;  // BLAS and attention threads
  // Batch-invariant mode: every projection runs row by row (GEMV), so a sequence's logits are
  // bitwise identical whatever else shares its batch and however its prefill is chunked
  // (everything else is per token already). Slower in prefill.
  bool batch_invariant = false;
  // The routed experts evaluated as this many expert-parallel shards (contiguous expert ranges,
  // each summed into a partial output, the partials summed in shard order), as EP ranks hold
  // them; must divide n_routed_experts. Changes only the summation order.
  int expert_shards = 1;
  // Rank `ep->rank` of an expert-parallel group whose ranks are models of this process
  // (kernels/ep_exchange.hpp): the model loads only the routed experts of the main layers that
  // `ep->placement` puts on its rank (the rest of the model whole), and each main layer's MoE
  // computes the rows of the token copies dispatched to its rank and gathers the other ranks'
  // through `ep->exchange` before adding each token's outputs in ascending expert id: rank 0's
  // logits are bitwise those of the whole model in batch-invariant mode; the other ranks skip
  // the LM head (their forward calls return empty logits: the group's answer is rank 0's,
  // ep_group_backend.hpp), as they skip nothing else. Every rank of the group must make
  // the same forward calls on the same inputs at the same time (kernels/ep_group_backend.hpp
  // does); a failed exchange fails the call, and the rank's caches are then unusable.
  std::optional<ep_member> ep = std::nullopt;
  // Tensors other models of this process loaded from the same checkpoint: each tensor is read
  // once and shared, read-only (open_ep_group passes one cache to its ranks, which then hold
  // one copy of the dense weights, and each routed expert once). Null: the model reads its own.
  std::shared_ptr<tensor_cache> tensors = nullptr;
  // A numerical-stability probe, off by default: every projection's output element y gets
  // y += jitter · u · rms(its output row), u in [-1, 1] drawn from (jitter_seed, y's bits, its
  // column) — a stand-in for another BLAS kernel's summation order. Running a computation with
  // and without it tells whether a comparison at a given tolerance is stable: a result that
  // moves by more than the tolerance under a 1e-5 jitter sits on a rounding or top-k boundary
  // (an FP8/FP4 quantiser step, a router or indexer choice, an argmax), where two correct
  // implementations may legitimately disagree.
  double jitter = 0.0;
  std::uint64_t jitter_seed = 0;
};

class model {
 public:
  /// Loads DIR/config.json and the checkpoint in DIR (single file or sharded). Tensor names are
  /// the reference's (`model.layers.N.attn.wq_a.weight`, `lm_head.weight`) or the released
  /// checkpoint's (`layers.N.attn.wq_a.weight`, `head.weight`; kernels/model_layout lists them).
  /// Every tensor is checked against the shape the config implies; errors name the tensor,
  /// expected and found.
  static result<model> load(const std::filesystem::path& dir, model_options options = {});

  model(model&&) noexcept;
  model& operator=(model&&) noexcept;
  ~model();

  const model_config& config() const;
  const text_config& text() const;

  /// The Engram layers hash token ids mapped onto the tokenizer-normalised compressed
  /// vocabulary; this sets that map (one compressed id per token id, each below
  /// engram_compressed_vocab_size). Without it a model with Engram layers refuses to run.
  result<bool> set_engram_token_map(std::vector<std::int64_t> map);

  /// Expert-parallel evaluation by a placement (kernels/ep_dispatch.hpp), as the ranks of an EP
  /// group with redundant copies of hot experts would run it: from the next forward on, each
  /// MoE of the main layers dispatches every token copy to a home of its expert
  /// (plan_dispatch), each rank runs its local experts on the rows it received, and each
  /// token's expert outputs are summed in ascending expert id, as without a placement. In
  /// batch-invariant mode an expert's row does not depend on the rows beside it, so logits are
  /// bitwise those of the model without a placement, under any placement (tested); otherwise
  /// they may differ in the last bits. std::nullopt: back to one group. The expert-parallel
  /// load balancer switches placements between steps; not to be called during a forward.
  /// Errors: a placement of another expert count, or inconsistent (an expert without a home, a
  /// home that does not list it), together with model_options::expert_shards > 1, or on a rank
  /// of an EP group (model_options::ep: its placement is the group's).
  result<bool> set_expert_placement(std::optional<expert_placement> placement);

  /// Tokens routed to each routed expert since the model was loaded, summed over the main
  /// layers' MoEs (the router's top-k counts, which the load balancer places by; the draft
  /// layers' experts are not counted). Thread-safe.
  std::vector<std::uint64_t> expert_counts() const;

  /// A fresh cache for one sequence. Paged (the default): its compressed KV and indexer keys
  /// live in 128-token pages of the model's block pool (kv_pool), listed in block tables.
  sequence_cache new_sequence(kv_layout layout = kv_layout::paged) const;

  /// The pool every paged sequence of this model draws its Block KV pages from.
  std::shared_ptr<block_pool> kv_pool() const;

  /// Runs the tokens of every sequence in `batch` (each continuing from its cache, which is
  /// advanced) and returns the logits [total tokens, vocab_size], sequences in batch order.
  /// `layer_streams`, when given, receives every layer's output residual streams [total tokens,
  /// hc_mult, hidden_size] (what the parity tests compare layer by layer with the reference).
  /// `dspark_features`, when given, receives the DSpark draft layers' input for every token
  /// [total tokens, targets · hidden_size]: for each of dspark_target_layer_ids in order, the
  /// mean of the hc_mult residual streams that layer's attention site takes.
  result<std::vector<float>> forward(
      std::span<const sequence_input> batch,
      std::vector<std::vector<float>>* layer_streams = nullptr,
      std::vector<float>* dspark_features = nullptr) const;

  /// As forward, but only each sequence's last new token goes through the LM head: logits
  /// [sequences, vocab], row s the next-token distribution of sequence s. What serving needs
  /// (one draw per sequence), at a fraction of the LM head's cost over a prefill chunk. In
  /// batch-invariant mode the rows equal forward's bitwise; otherwise to rounding.
  result<std::vector<float>> forward_last(std::span<const sequence_input> batch) const;

  /// As forward, but only the last rows[s] (1 <= rows[s] <= its tokens) new tokens of sequence
  /// s go through the LM head: logits [sum of rows, vocab], sequences in batch order. What a
  /// speculative verify step needs (the rows of the last accepted token and of every draft).
  /// `dspark_features` as forward's (every token's). Rows equal forward's as forward_last's do.
  result<std::vector<float>> forward_tail(std::span<const sequence_input> batch,
                                          std::span<const std::int64_t> rows,
                                          std::vector<float>* dspark_features = nullptr) const;

  /// Whether the checkpoint holds the DSpark draft layers (`mtp.*`, num_nextn_predict_layers
  /// stages), which load only when present.
  bool has_draft() const;

  /// A fresh draft context for one sequence.
  draft_state new_draft_state() const;

  /// DSpark block drafting (docs/model.md; checked against the reference's layer modules glued
  /// by our reading of DSpark, not against a DSpark implementation):
  /// appends each sequence's features to its draft context, then runs the block [anchor,
  /// noise × (B - 1)] at positions length .. length+B-1 through the draft stages (every block
  /// token sees the last `sliding_window` context rows and the whole block), and drafts
  /// semi-autoregressively: draft k = argmax(LM head(norm(h_k)) + Markov bias of the previous
  /// token (the anchor for k = 0)), confidence k = sigmoid(confidence head [h_k ; Markov
  /// embedding of the previous token]). Batched over sequences; errors: no draft weights, a
  /// state of another model, features of the wrong width, a token out of range.
  result<draft_output> draft(std::span<const draft_input> batch) const;

  /// The end of draft after its stages, for a backend that runs the stages itself (the CUDA
  /// one): `hidden` [S·B, hidden_size] holds each block token's last-stage collapse h_k (before
  /// the final norm) and `logits` [S·B, vocab] the LM head over norm(h_k); adds each draft's
  /// Markov bias, takes the argmax and the confidence, semi-autoregressively from each
  /// sequence's anchor, exactly as draft does. Sizes are the caller's to get right.
  draft_output finish_draft(std::span<const std::int64_t> anchors, std::span<const float> hidden,
                            std::vector<float> logits) const;

  /// Appends the features of tokens the target ran to a draft context without drafting (a
  /// prompt's prefill chunks before its last): what draft does first. Errors: no draft
  /// weights, a state of another model, features of the wrong width.
  result<bool> extend_draft(draft_state& state, std::span<const float> features) const;

  /// Bounded replay: rebuilds a sequence from its persisted Block KV alone. `s` holds only
  /// restored Block KV blocks 0..B-1 (restore_block; no State KV, no SWA KV) and `tokens` are the
  /// sequence's P >= 128·B tokens. Instead of recomputing all P tokens, this recomputes only the
  /// last `recompute` (from a start aligned down to every compress ratio, and never after the
  /// restored blocks end): their window rings start empty at the replay's start, the compressor
  /// state and the groups after the restored blocks are rebuilt, the groups the blocks hold are
  /// kept as restored. Returns the next token's logits [vocab] (only the last recomputed token
  /// goes through the LM head), an approximation of the exact ones: the first recomputed tokens
  /// see a truncated window (docs/model.md gives the measured divergence). `recompute` 0 means
  /// the sliding window; num_hidden_layers windows rebuild the exact state (each layer's window
  /// looks one window further back), at that many times the cost.
  result<std::vector<float>> replay(sequence_cache& s, std::span<const std::int64_t> tokens,
                                    std::int64_t recompute = 0) const;

  /// The causal encoder–decoder prefill of a fresh sequence: the encoder (the layers before the
  /// first ratio-1 layer) runs on every prompt token; the decoder's first layer, its only KV
  /// source, publishes its full-resolution KV and indexer keys for every token from the
  /// encoder's output; the decoder layers run only on the last `tail` tokens (0: the sliding
  /// window), their window rings starting there. Returns the logits of those tail tokens; the
  /// cache then continues like any other. Approximates the exact prefill: the first tail tokens
  /// see a truncated window in the decoder (docs/model.md gives the measured divergence).
  /// Errors: a used cache, a config without that layout (first ratio-1 layer not a KV and
  /// index source, or a later KV source).
  result<std::vector<float>> prefill_encoder_decoder(sequence_cache& s,
                                                     std::span<const std::int64_t> tokens,
                                                     std::int64_t tail = 0) const;

  /// The loaded weights (kernels/model_weights.hpp), for an engine that runs them elsewhere
  /// (the CUDA engine's device_model copies them to the device).
  struct weights;
  const weights& tensors() const { return *w_; }

 private:
  model() = default;
  // forward, where the decoder layers (from decoder_begin) run only after the first `head`
  // tokens of the one sequence (head 0: everything everywhere); `tail` (one count per
  // sequence; empty: all): the LM head on each sequence's last tail[s] tokens only.
  result<std::vector<float>> run(std::span<const sequence_input> batch,
                                 std::vector<std::vector<float>>* layer_streams,
                                 std::int64_t decoder_begin, std::int64_t head,
                                 std::vector<float>* dspark_features = nullptr,
                                 std::span<const std::int64_t> tail = {}) const;
  // run's layers; throws ep_group_failed when an EP rank's exchange fails.
  result<std::vector<float>> run_layers(std::span<const sequence_input> batch,
                                        std::vector<std::vector<float>>* layer_streams,
                                        std::int64_t decoder_begin, std::int64_t head,
                                        std::vector<float>* dspark_features,
                                        std::span<const std::int64_t> tail) const;
  std::unique_ptr<weights> w_;
};

}  // namespace troupe::kernels
