// The mHC mixing, Engram's gate, the MoE router, the experts' SwiGLU, RoPE, the caches' fp8 /
// fp4 quantisers, the CSA2 compressor's pooling and indexer's scores, and the released FP8 / FP4
// weights' dequantisation on the device (kernels/cuda/ops.hpp): each thread runs the CPU
// engine's own per-token, per-element or per-block function (kernels/portable_math.hpp). This
// file is compiled with -fmad=false, so a product and the sum it feeds round separately as on
// the CPU; what differs from the CPU is the device's expf, sinf, cosf and log1pf.
#include "kernels/cuda/block_kernels.cuh"
#include "kernels/cuda/element_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.hpp"
#include "kernels/portable_math.hpp"

#include <string>

namespace troupe::kernels::cuda {

namespace {

template <class F>
result<bool> launch_each(const char* what, std::int64_t n, F f, void* stream) {
  if (n <= 0) return true;
  const auto blocks = static_cast<unsigned>((n + block_threads - 1) / block_threads);
  TROUPE_LAUNCH(each_index<F>, blocks, block_threads, 0, stream, n, f);
  return launched(what);
}

result<bool> quant_blocks(const char* what, float* x, std::int64_t n, std::int64_t block, bool fp4,
                          bool e4m3_scales, void* stream) {
  if (block <= 0 || n % block != 0)
    return result<bool>::failure(std::string(what) + ": " + std::to_string(n) +
                                 " values are not whole blocks of " + std::to_string(block));
  return launch_each(what, n / block, quant_fn{x, block, fp4, e4m3_scales}, stream);
}

}  // namespace

result<bool> hc_mixes(const float* mixes, const float* scale, const float* base, std::int64_t T,
                      std::int64_t hc, std::int64_t sinkhorn_iters, float hc_eps, float* pre,
                      float* post, float* comb, void* stream) {
  return launch_each("hc_mixes", T,
                     mixes_fn{mixes, scale, base, hc, sinkhorn_iters, hc_eps, pre, post, comb},
                     stream);
}

result<bool> hc_collapse(const float* streams, const float* pre, std::int64_t T, std::int64_t hc,
                         std::int64_t D, float* out, void* stream) {
  return launch_each("hc_collapse", T * D, collapse_fn{streams, pre, hc, D, out}, stream);
}

result<bool> hc_expand(const float* streams, const float* x, const float* post, const float* comb,
                       std::int64_t T, std::int64_t hc, std::int64_t D, float* out, void* stream) {
  return launch_each("hc_expand", T * hc * D, expand_fn{streams, x, post, comb, hc, D, out},
                     stream);
}

result<bool> engram_gate_add(float* streams, const float* kv, const float* weight, std::int64_t T,
                             std::int64_t hc, std::int64_t D, float eps, void* stream) {
  if (T <= 0) return true;
  TROUPE_LAUNCH(engram_kernel, static_cast<unsigned>(T * hc), block_threads, 0, stream, streams,
                kv, weight, hc, D, eps);
  return launched("engram_gate_add");
}

result<bool> route_tokens(float* scores, const float* bias, std::int64_t T, std::int64_t n,
                          std::int64_t k, portable::router_scoring f, float gate_temp,
                          bool norm_topk_prob, float routed_scaling, std::int64_t* experts,
                          float* weights, void* stream) {
  if (k < 1 || k > n)
    return result<bool>::failure("route_tokens: top " + std::to_string(k) + " of " +
                                 std::to_string(n) + " experts");
  return launch_each("route_tokens", T,
                     route_fn{scores, bias, n, k, f, gate_temp, norm_topk_prob, routed_scaling,
                              experts, weights},
                     stream);
}

result<bool> compress_pool(const float* kv, const float* gate, std::int64_t groups,
                           std::int64_t ratio, std::int64_t hd, float* out, void* stream) {
  return launch_each("compress_pool", groups * hd, pool_fn{kv, gate, ratio, hd, out}, stream);
}

result<bool> index_scores(const float* head_dot, const float* w, std::int64_t queries,
                          std::int64_t nh, std::int64_t entries, float sm_scale,
                          float heads_scale, float* scores, void* stream) {
  return launch_each("index_scores", queries * entries,
                     index_fn{head_dot, w, nh, entries, sm_scale, heads_scale, scores}, stream);
}

result<bool> dequant_fp8_blocks(const std::uint8_t* w, const std::uint8_t* scales,
                                std::int64_t rows, std::int64_t cols, std::int64_t block_rows,
                                std::int64_t block_cols, float* out, void* stream) {
  if (block_rows <= 0 || block_cols <= 0)
    return result<bool>::failure("dequant_fp8_blocks: block sizes must be positive");
  return launch_each("dequant_fp8_blocks", rows * cols,
                     dequant_fn{w, scales, cols, block_rows, block_cols, out}, stream);
}

result<bool> dequant_fp4(const std::uint8_t* packed, const std::uint8_t* scales, std::int64_t rows,
                         std::int64_t cols, std::int64_t block, float* out, void* stream) {
  if (block <= 0 || cols % block != 0 || cols % 2 != 0)
    return result<bool>::failure("dequant_fp4: " + std::to_string(cols) +
                                 " columns are not whole scale blocks of " + std::to_string(block));
  return launch_each("dequant_fp4", rows * cols, dequant_fn{packed, scales, cols, block, 0, out},
                     stream);
}

result<bool> swiglu(float* g, const float* u, std::int64_t rows, std::int64_t width, float limit,
                    const float* row_scale, void* stream) {
  return launch_each("swiglu", rows * width, swiglu_fn{g, u, width, limit, row_scale}, stream);
}

result<bool> rope_rows(float* x, std::int64_t rows, std::int64_t dim, const float* inv_freq,
                       std::int64_t rope_dim, float scaling, const std::int64_t* positions,
                       std::int64_t rows_per_position, bool inverse, void* stream) {
  if (rope_dim % 2 != 0 || rope_dim > dim || rows_per_position < 1)
    return result<bool>::failure("rope_rows: rope_dim " + std::to_string(rope_dim) + " of " +
                                 std::to_string(dim) + ", " + std::to_string(rows_per_position) +
                                 " rows per position");
  return launch_each("rope_rows", rows * (rope_dim / 2),
                     rope_fn{x, dim, rope_dim, rows_per_position, inv_freq, scaling, positions,
                             inverse},
                     stream);
}

result<bool> quant_fp8_blocks(float* x, std::int64_t n, std::int64_t block, void* stream) {
  return quant_blocks("quant_fp8_blocks", x, n, block, false, false, stream);
}

result<bool> quant_fp4_blocks(float* x, std::int64_t n, std::int64_t block, bool e4m3_scales,
                              void* stream) {
  return quant_blocks("quant_fp4_blocks", x, n, block, true, e4m3_scales, stream);
}

result<bool> embed_rows(const float* table, const std::int64_t* tokens, std::int64_t T,
                        std::int64_t copies, std::int64_t D, float* out, void* stream) {
  return launch_each("embed_rows", T * copies * D, embed_fn{table, tokens, copies, D, out}, stream);
}

result<bool> copy_rows(const float* src, const std::int64_t* src_rows, float* dst,
                       const std::int64_t* dst_rows, std::int64_t rows, std::int64_t width,
                       void* stream) {
  return launch_each("copy_rows", rows * width, copy_rows_fn{src, src_rows, dst, dst_rows, width},
                     stream);
}

result<bool> paged_rows(const std::int64_t* groups, const std::int64_t* count, std::int64_t rows,
                        std::int64_t k, const std::int64_t* pages, const std::int64_t* pages_at,
                        std::int64_t page_rows, std::int64_t* out, void* stream) {
  if (page_rows < 1)
    return result<bool>::failure("paged_rows: " + std::to_string(page_rows) + " rows per page");
  return launch_each("paged_rows", rows * k,
                     paged_rows_fn{groups, count, pages, pages_at, k, page_rows, out}, stream);
}

result<bool> add_into(float* y, const float* x, std::int64_t n, void* stream) {
  return launch_each("add_into", n, add_fn{y, x}, stream);
}

result<bool> mask_scores(float* scores, std::int64_t rows, std::int64_t n,
                         const std::int64_t* reach, const std::int64_t* kept,
                         const std::int64_t* kept_n, std::int64_t kept_max, std::int64_t block,
                         void* stream) {
  return launch_each("mask_scores", rows * n,
                     mask_scores_fn{scores, n, reach, kept, kept_n, kept_max, block}, stream);
}

result<bool> block_max(const float* scores, std::int64_t rows, std::int64_t n, std::int64_t block,
                       const std::int64_t* last, float* out, void* stream) {
  if (block < 1) return result<bool>::failure("block_max: blocks of " + std::to_string(block));
  const std::int64_t blocks = (n + block - 1) / block;
  return launch_each("block_max", rows * blocks, block_max_fn{scores, n, block, blocks, last, out},
                     stream);
}

result<bool> project_rows(const float* x, std::int64_t ldx, const float* w, std::int64_t ldw,
                          float* y, std::int64_t ldy, std::int64_t m, std::int64_t n,
                          std::int64_t k, void* stream) {
  if (m <= 0 || n <= 0) return true;
  if ((m + project_tile - 1) / project_tile > 65535)
    return result<bool>::failure("project_rows: " + std::to_string(m) + " rows, more than " +
                                 std::to_string(65535 * project_tile) + " in one call");
  const dim3 grid(static_cast<unsigned>((n + project_tile - 1) / project_tile),
                  static_cast<unsigned>((m + project_tile - 1) / project_tile));
  TROUPE_LAUNCH(project_tiled_kernel, grid, block_threads, 0, stream, x, ldx, w, ldw, y, ldy, m,
                n, k);
  return launched("project_rows");
}

}  // namespace troupe::kernels::cuda
