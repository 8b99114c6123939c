// The CUDA kernels of the decode path, launched on device pointers: RMSNorm, sliding-window
// decode attention over the SWA ring, the MoE dispatch / combine permutations, the mHC
// mixing, Engram's gate, the MoE router, the experts' SwiGLU, RoPE, the caches' fp8 / fp4
// quantisers, the CSA2 compressor's pooling and indexer's scores, and the released FP8 / FP4
// weights' dequantisation, and the forward pass's embedding, row copies and sums.
//
// Each kernel mirrors a piece of the exact CPU model (kernels/model.cpp, kernels/cpu_ops.hpp)
// on the same fp32 layouts, so the CUDA backend can be checked against the CPU backend one
// kernel at a time (tests/cuda/, run by bench/gpu_check.sh on a GPU machine). Pointers are
// device pointers; `stream` is a cudaStream_t (null: the default stream). A launch returns a
// failure naming the CUDA error when the launch itself fails; errors during execution surface
// at the next synchronisation, as with any CUDA launch. None of these kernels has run on a
// GPU yet: they compile for sm_90 and sm_100 and wait for bench/gpu_check.sh.
#pragma once

#include <cstdint>

#include "kernels/portable_math.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

/// In place, each of `rows` rows of x [rows, n]: x = weight ⊙ (x / sqrt(mean(x²) + eps))
/// (weight null: unweighted), as kernels/cpu_ops.hpp's rms_norm.
result<bool> rms_norm(float* x, std::int64_t rows, std::int64_t n, const float* weight, float eps,
                      void* stream = nullptr);

/// Queries attending over their layer's window, as the CPU model's attention (K = V = the
/// window's rows, a per-head sink in the softmax's denominator, the inverse RoPE of the output
/// at the query's position). Decode (chunk null): one token per sequence b, whose ring
/// (rings + b · capacity · head_dim, row of position p at slot p mod capacity: the layout of
/// kernels/kv_cache.hpp's swa_ring) already holds its own row; its keys are positions
/// max(0, position[b] − window + 1, ring_begin[b]) .. position[b]. Prefill (chunk set): query b
/// belongs to sequence sequence[b], whose rows before chunk_start[b] are in its ring and whose
/// rows from there on are the call's chunk rows (position chunk_start[b] at chunk row
/// chunk_row[b]); its keys start at max(0, position[b] − window + 1, min(ring_begin, chunk
/// start)), as the CPU's. Then, in a CSA2 layer, the compressed entries its indexer selected
/// (n_selected[b] rows of `compressed` named by selected[b · max_selected …], in the indexer's
/// order), as the CPU model appends them after the window.
struct swa_decode_args {
  const float* q = nullptr;           // [batch, heads, head_dim], post-RoPE
  const float* rings = nullptr;       // [batch, capacity, head_dim]
  const std::int64_t* positions = nullptr;   // [batch]
  const std::int64_t* ring_begin = nullptr;  // [batch]: the oldest position each ring holds
  const float* sinks = nullptr;       // [heads]
  const float* inv_freq = nullptr;    // [rope_dim / 2]
  float* out = nullptr;               // [batch, heads, head_dim]
  std::int64_t batch = 0, heads = 0, head_dim = 0, capacity = 0, window = 0, rope_dim = 0;
  float scaling = 1.0f;       // the softmax scale, 1/sqrt(head_dim) in the model
  float rope_scaling = 1.0f;  // rope_table::scaling
  const float* compressed = nullptr;          // [*, head_dim]: the compressed KV (CSA2 layers)
  const std::int64_t* selected = nullptr;     // [batch, max_selected]: rows of `compressed`
  const std::int64_t* n_selected = nullptr;   // [batch] (null: no compressed entries)
  std::int64_t max_selected = 0;
  const float* chunk = nullptr;               // [rows, head_dim]: the call's window rows (prefill)
  const std::int64_t* sequence = nullptr;     // [batch]: each query's ring (prefill)
  const std::int64_t* chunk_start = nullptr;  // [batch]: the position the chunk's rows begin at
  const std::int64_t* chunk_row = nullptr;    // [batch]: the chunk row of that position
  /// [batch]: the position of the output's inverse RoPE where it is not positions[b] (null:
  /// positions[b]): a DSpark draft block, whose tokens all see the whole block, passes the
  /// block's last position as positions[b] and each token's own here.
  const std::int64_t* rope_positions = nullptr;
};
result<bool> swa_decode_attention(const swa_decode_args& a, void* stream = nullptr);

/// The most keys swa_decode_attention takes: ring capacity and window + max_selected (its
/// scores live in shared memory).
inline constexpr std::int64_t swa_max_keys = 1024;

/// out[i] = x[send_copy[i] / top_k] for i < rows (kernels/ep_dispatch.hpp's gather_rows):
/// x [tokens, width], out [rows, width].
result<bool> moe_gather_rows(const float* x, const std::int32_t* send_copy, std::int64_t rows,
                             std::int32_t top_k, std::int64_t width, float* out,
                             void* stream = nullptr);

/// y[t] = Σ_{j ascending} weights[t·k + j] · returned[copy_row[t·k + j]], each product and sum
/// rounded separately: bit for bit kernels/ep_dispatch.hpp's combine_rows.
result<bool> moe_combine_rows(const float* returned, const std::int32_t* copy_row,
                              const float* weights, std::int64_t tokens, std::int32_t top_k,
                              std::int64_t width, float* y, void* stream = nullptr);

/// The mHC mixes of T tokens from their projections mixes [T, (2 + hc) · hc] of the normed
/// flattened streams, with the site's scale [3] and base [(2 + hc) · hc]: pre [T, hc], post
/// [T, hc] and the Sinkhorn-normalised comb [T, hc, hc] (kernels/portable_math.hpp's
/// hc_token_mixes, one thread per token).
result<bool> hc_mixes(const float* mixes, const float* scale, const float* base, std::int64_t T,
                      std::int64_t hc, std::int64_t sinkhorn_iters, float hc_eps, float* pre,
                      float* post, float* comb, void* stream = nullptr);

/// out [T, D] = Σ_j pre[t][j] · streams[t][j] (streams [T, hc, D], pre [T, hc]).
result<bool> hc_collapse(const float* streams, const float* pre, std::int64_t T, std::int64_t hc,
                         std::int64_t D, float* out, void* stream = nullptr);

/// out [T, hc, D] = the streams after a site whose output is x [T, D]:
/// post[t][k] · x[t] + Σ_j comb[t][j][k] · streams[t][j]. `out` must not overlap `streams`.
result<bool> hc_expand(const float* streams, const float* x, const float* post, const float* comb,
                       std::int64_t T, std::int64_t hc, std::int64_t D, float* out,
                       void* stream = nullptr);

/// Engram's gated add, in place on streams [T, hc, D]: kv [T, (hc + 1) · D] holds each token's
/// hc keys then its value, weight [hc, D] the per-channel key weights (engram_q ⊙ engram_k);
/// stream (t, k) += engram_gate(stream, key k) · value.
result<bool> engram_gate_add(float* streams, const float* kv, const float* weight, std::int64_t T,
                             std::int64_t hc, std::int64_t D, float eps, void* stream = nullptr);

/// MoE routing of T tokens, a thread per token (kernels/portable_math.hpp's route_token): the
/// gate logits scores [T, n] become the scoring function's values in place, and each token's
/// top k of scores + bias [n] go to experts [T, k] with their weights [T, k]. 1 ≤ k ≤ n.
result<bool> route_tokens(float* scores, const float* bias, std::int64_t T, std::int64_t n,
                          std::int64_t k, portable::router_scoring f, float gate_temp,
                          bool norm_topk_prob, float routed_scaling, std::int64_t* experts,
                          float* weights, void* stream = nullptr);

/// The CSA2 compressor's latents out [groups, hd]: group g pools its `ratio` token rows of
/// kv [groups · ratio, hd] by a per-channel softmax over their gate rows (same shape).
result<bool> compress_pool(const float* kv, const float* gate, std::int64_t groups,
                           std::int64_t ratio, std::int64_t hd, float* out,
                           void* stream = nullptr);

/// The CSA2 indexer's scores [queries, entries] from each query's heads' dot products with the
/// entries' keys, head_dot [queries, nh, entries], and its head weights w [queries, nh]:
/// Σ_h relu(dot) · sm_scale · (w_h · heads_scale).
result<bool> index_scores(const float* head_dot, const float* w, std::int64_t queries,
                          std::int64_t nh, std::int64_t entries, float sm_scale,
                          float heads_scale, float* scores, void* stream = nullptr);

/// A released FP8 weight w [rows, cols] (e4m3fn bytes) with ue8m0 block scales
/// [⌈rows / block_rows⌉, ⌈cols / block_cols⌉] dequantized into out [rows, cols] fp32 (every value
/// exact: e4m3 · 2^k), as kernels/safetensors.hpp's dequantize_fp8_blocks.
result<bool> dequant_fp8_blocks(const std::uint8_t* w, const std::uint8_t* scales,
                                std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                                std::int64_t block_cols, float* out, void* stream = nullptr);

/// A released packed FP4 expert weight [rows, cols / 2 bytes] (low nibble first) with ue8m0
/// scales [rows, cols / block] dequantized into out [rows, cols] fp32, as
/// kernels/safetensors.hpp's dequantize_fp4.
result<bool> dequant_fp4(const std::uint8_t* packed, const std::uint8_t* scales, std::int64_t rows,
                         std::int64_t cols, std::int64_t block, float* out,
                         void* stream = nullptr);

/// The experts' clamped SwiGLU in place on g [rows, width] with u [rows, width], each row times
/// row_scale[row] (null: no scaling).
result<bool> swiglu(float* g, const float* u, std::int64_t rows, std::int64_t width, float limit,
                    const float* row_scale, void* stream = nullptr);

/// RoPE in place on rows of x [rows, dim]: the trailing rope_dim channels of row r rotated at
/// positions[r / rows_per_position] (a token's heads share its position) with the table's
/// inv_freq [rope_dim / 2] and scaling (kernels/cpu_ops.hpp's apply_rope); inverse: by minus
/// the angle.
result<bool> rope_rows(float* x, std::int64_t rows, std::int64_t dim, const float* inv_freq,
                       std::int64_t rope_dim, float scaling, const std::int64_t* positions,
                       std::int64_t rows_per_position, bool inverse, void* stream = nullptr);

/// The reference's window-KV quantiser over x [n] in blocks of `block` (32 in the model): per
/// block a power-of-two scale and values on the e4m3 grid (kernels/cpu_ops.hpp's
/// fake_quant_fp8_block32). n must be a multiple of block.
result<bool> quant_fp8_blocks(float* x, std::int64_t n, std::int64_t block, void* stream = nullptr);

/// The FP4 quantiser over x [n] in blocks of `block` (kernels/cpu_ops.hpp's
/// fake_quant_fp4_block). n must be a multiple of block.
result<bool> quant_fp4_blocks(float* x, std::int64_t n, std::int64_t block, bool e4m3_scales,
                              void* stream = nullptr);

/// out [T, copies, D]: each of token t's `copies` rows is row tokens[t] of table [*, D] (the
/// embedding into every mHC stream).
result<bool> embed_rows(const float* table, const std::int64_t* tokens, std::int64_t T,
                        std::int64_t copies, std::int64_t D, float* out, void* stream = nullptr);

/// For r < rows: dst row dst_rows[r] = src row src_rows[r], rows of `width` (a null index: r).
/// The destination rows must differ (the copies run at once).
result<bool> copy_rows(const float* src, const std::int64_t* src_rows, float* dst,
                       const std::int64_t* dst_rows, std::int64_t rows, std::int64_t width,
                       void* stream = nullptr);

/// The paged compressed KV's store rows of selected groups (kernels/cuda/paging.hpp): for each
/// row r < rows of groups [rows, k] and j < count[r], out[r · k + j] = the row of group
/// groups[r · k + j] in a store of `page_rows` rows per page, of the sequence whose page ids
/// start at pages + pages_at[r]. Entries from count[r] on are left as they are.
result<bool> paged_rows(const std::int64_t* groups, const std::int64_t* count, std::int64_t rows,
                        std::int64_t k, const std::int64_t* pages, const std::int64_t* pages_at,
                        std::int64_t page_rows, std::int64_t* out, void* stream = nullptr);

/// y[i] += x[i] for i < n.
result<bool> add_into(float* y, const float* x, std::int64_t n, void* stream = nullptr);

/// The CSA2 indexer's selection, a block per row of scores [rows, n]: the k best entries in
/// descending score, ties to the lower index, stopping at the first -inf (the CPU model's
/// top_finite), each index plus offset[row] (null: 0) into idx [rows, k] and how many into
/// count [rows]. Any score may be +inf (a candidate source's forced block).
result<bool> top_k_rows(const float* scores, std::int64_t rows, std::int64_t n, std::int64_t k,
                        const std::int64_t* offset, std::int64_t* idx, std::int64_t* count,
                        void* stream = nullptr);

/// In place on scores [rows, n]: -inf at every entry e >= reach[row], and, with a candidate
/// mask (kept non-null), at every entry whose block e / block is not among the row's kept_n[row]
/// blocks kept [rows, kept_max].
result<bool> mask_scores(float* scores, std::int64_t rows, std::int64_t n,
                         const std::int64_t* reach, const std::int64_t* kept,
                         const std::int64_t* kept_n, std::int64_t kept_max, std::int64_t block,
                         void* stream = nullptr);

/// out [rows, ⌈n / block⌉]: the max score of each block of `block` entries of scores [rows, n],
/// +inf at block last[row] (a candidate source's last visible block; -1: none).
result<bool> block_max(const float* scores, std::int64_t rows, std::int64_t n, std::int64_t block,
                       const std::int64_t* last, float* out, void* stream = nullptr);

/// y[m, n] (row stride ldy) = x[m, k] (stride ldx) · w[n, k]ᵀ (stride ldw), each output its k
/// products summed in ascending order, each rounded on its own: a row's result depends on that
/// row alone (batch-invariant mode). Tiles of 64 × 64 outputs through shared memory on CUDA
/// cores, FP32 without fused multiply-adds: far slower than cuBLASLt's BF16 tensor cores. At
/// most 65535 × 64 rows per call.
result<bool> project_rows(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                          float* y, std::int64_t ldy, std::int64_t m, std::int64_t n,
                          std::int64_t k, void* stream = nullptr);

}  // namespace troupe::kernels::cuda
