// The CPU building blocks of the DeepSeek-V4.1 forward pass: GEMMs through OpenBLAS, RMS norm,
// interleaved partial RoPE (plain and YaRN inverse frequencies), and the fake quantisers the
// reference applies to its caches (FP8 window KV, FP4 compressed KV and indexer keys / queries).
//
// Everything is fp32, row-major, on plain pointers so the loops stay simple and vectorisable. The
// quantisers reproduce the reference's rounding exactly (round-to-nearest-even onto the e4m3 and
// e2m1 grids, power-of-two ue8m0 scales), because their outputs feed top-k selections where a
// one-ulp difference can change which compressed entries a query attends to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/model_config.hpp"
#include "kernels/portable_math.hpp"

namespace troupe::kernels {

/// Sets how many threads the BLAS uses (the model runs its GEMMs on two by default).
void set_blas_threads(int threads);

/// The OpenBLAS kernel in use (e.g. "Haswell", "SkylakeX"): chosen from the CPU, or forced by
/// the OPENBLAS_CORETYPE environment variable. Benchmarks print it beside their figures.
std::string blas_kernel_name();

/// y[rows, out] = x[rows, in] · w[out, in]ᵀ (a torch Linear without bias). `y` is overwritten.
void linear(const float* x, std::int64_t rows, std::int64_t in, const float* w, std::int64_t out,
            float* y);

/// Runs this program on an OpenBLAS kernel that uses the CPU's vector units. OpenBLAS picks its
/// kernel from the CPU's model number when it loads, and falls back to the generic SSE3
/// "Prescott" kernel for a model it does not know: Debian 12's OpenBLAS 0.3.21 does so on CPUs
/// newer than it (Emerald Rapids, family 6 model 207), where its GEMMs then run 2-4x slower
/// than the CPU can (docs/benchmarks.md). When OpenBLAS fell back to Prescott, the CPU has
/// AVX-512 (F, CD, BW, DQ, VL) or AVX2 with FMA, and OPENBLAS_CORETYPE is not set (an operator's
/// choice is kept), this sets it to "SkylakeX" or "Haswell" and re-executes the program
/// (/proc/self/exe, `argv`, the same pid), since OpenBLAS reads the variable only when it
/// loads. Returns when there is nothing to change, or when the exec failed (the program then
/// runs on with the kernel it has).
void reexec_with_blas_kernel_upgrade(char** argv);

/// The instruction sets gemm_nt_invariant can run on: portable C++ (any CPU), or AVX2 with FMA.
enum class gemm_isa { generic, avx2 };

/// The fastest gemm_isa this CPU supports.
gemm_isa best_gemm_isa();

/// Output columns [col_begin, col_end) of y[rows, out] = x[rows, in] · w[out, in]ᵀ (x row
/// stride ldx, y row stride ldy), batch-invariant: every element is the same fixed sequence of
/// operations over its row of x and its row of w, whatever `rows` is, wherever the row sits in
/// x and however the columns are split between calls. So a row's result depends on that row
/// alone (bitwise), while the weights are read once per group of rows rather than once per
/// row as with one GEMV per row. Results differ between the two `isa`s (FMA rounds once).
void gemm_nt_invariant(const float* x, std::int64_t rows, std::int64_t in, std::int64_t ldx,
                       const float* w, std::int64_t col_begin, std::int64_t col_end, float* y,
                       std::int64_t ldy, gemm_isa isa = best_gemm_isa());

/// In place: x[i] = x[i] / sqrt(mean(x²) + eps) * weight[i] (weight may be null: unweighted).
void rms_norm(float* x, std::int64_t n, const float* weight, float eps);

/// The inverse frequencies of one RoPE parameter set over the rotated slice of a head
/// (`rope_dim` channels, rope_dim / 2 frequencies), plus the cos/sin scaling.
struct rope_table {
  std::int64_t rope_dim = 0;
  std::vector<float> inv_freq;
  float scaling = 1.0f;
};
rope_table make_rope_table(const rope_parameters& p, std::int64_t head_dim);

/// Rotates the trailing `rope_dim` channels of `v` (length `dim`) at `position`: adjacent
/// pairs (even, odd) are one complex number each. `inverse` rotates by -angle.
void apply_rope(float* v, std::int64_t dim, const rope_table& t, std::int64_t position,
                bool inverse = false);

/// x rounded to the nearest float8 e4m3fn value (ties to even; |x| ≤ 448 expected).
float round_to_e4m3(float x);

/// The reference's window-KV quantiser: per block of 32 channels a power-of-two scale
/// ≥ amax / 448, values rounded onto e4m3. A length not divisible by 32 is left as is.
void fake_quant_fp8_block32(float* x, std::int64_t n);

/// The FP4 (e2m1) quantiser: per block of `block` channels a scale — power-of-two (ue8m0) from
/// amax / 6, or, with `e4m3_scales`, amax / 6 rounded to e4m3 — and values rounded onto the
/// e2m1 grid. A length not divisible by `block` is left as is.
void fake_quant_fp4_block(float* x, std::int64_t n, std::int64_t block, bool e4m3_scales);

/// MoE routing of one token: `scores` are the gate logits [n_experts], turned in place into
/// the scoring function's values (logits / gate_temp, then sqrtsoftplus, sigmoid or softmax).
/// The top `num_experts_per_tok` of scores + `bias` are chosen (the bias steers selection only;
/// ties go to the lower expert); their weights are the unbiased scores, normalised to sum 1
/// when norm_topk_prob (and more than one is chosen), times routed_scaling_factor.
void route_token(const text_config& c, float* scores, const float* bias,
                 std::vector<std::int64_t>& experts, std::vector<float>& weights);

/// The router's scoring function named by the config's scoring_func (softmax unless
/// "sqrtsoftplus" or "sigmoid").
portable::router_scoring router_scoring_of(const text_config& c);

}  // namespace troupe::kernels
