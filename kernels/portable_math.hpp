// The per-token and per-element math of the DeepSeek-V4.1 forward pass that both engines run:
// the CPU engine (kernels/model.cpp) calls these functions in its loops, the CUDA engine's
// kernels (kernels/cuda/) call them once per thread. One definition, so the two engines
// compute the same sequence of operations on every element, and what the CPU tests check of
// these functions holds for the device kernels' arithmetic too. What differs on the device is
// its expf, sinf, cosf and log1pf (within a few ulps of glibc's) and FMA contraction, which
// the device build of these functions turns off (kernels/cuda/CMakeLists.txt: -fmad=false).
//
// Everything here is header-only, fp32, on plain pointers, with no allocation and no standard
// library call a kernel cannot make: comparisons are written out as std::max / std::min /
// std::clamp define them, and the fp8 / fp4 grids are computed instead of read from tables, so
// that the CPU results stay bitwise what they were.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TROUPE_HD __host__ __device__
#else
#define TROUPE_HD
#endif

namespace troupe::kernels::portable {

using i64 = std::int64_t;

TROUPE_HD inline float max_of(float a, float b) { return a < b ? b : a; }  // std::max(a, b)
TROUPE_HD inline float min_of(float a, float b) { return b < a ? b : a; }  // std::min(a, b)
TROUPE_HD inline float clamp_to(float v, float lo, float hi) {             // std::clamp
  return v < lo ? lo : (hi < v ? hi : v);
}

TROUPE_HD inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
TROUPE_HD inline float silu(float x) { return x / (1.0f + expf(-x)); }

/// Each column (or row) of cm [hc][hc] divided by its sum + eps.
TROUPE_HD inline void sinkhorn_normalise(float* cm, i64 hc, float eps, bool columns) {
  const i64 step = columns ? hc : 1, stride = columns ? 1 : hc;
  for (i64 a = 0; a < hc; ++a) {
    float* v = cm + a * stride;
    float sum = 0.0f;
    for (i64 b = 0; b < hc; ++b) sum += v[b * step];
    for (i64 b = 0; b < hc; ++b) v[b * step] /= sum + eps;
  }
}

/// The mHC residual mixing matrix from its logits `comb` [hc][hc] (in place): a softmax over
/// each row plus eps, then alternating column and row normalisations (each sum + eps) for
/// `iters` column passes in all, approximately doubly stochastic.
TROUPE_HD inline void sinkhorn(float* cm, i64 hc, i64 iters, float eps) {
  for (i64 j = 0; j < hc; ++j) {
    float* row = cm + j * hc;
    float mx = row[0];
    for (i64 k = 1; k < hc; ++k) mx = max_of(mx, row[k]);
    float sum = 0.0f;
    for (i64 k = 0; k < hc; ++k) sum += row[k] = expf(row[k] - mx);
    for (i64 k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  sinkhorn_normalise(cm, hc, eps, /*columns=*/true);
  for (i64 it = 0; it + 1 < iters; ++it) {
    sinkhorn_normalise(cm, hc, eps, /*columns=*/false);
    sinkhorn_normalise(cm, hc, eps, /*columns=*/true);
  }
}

/// One token's mHC mixes from its projection `m` [(2 + hc) · hc] of the normed flattened
/// streams, with the site's `scale` [3] and `base` [(2 + hc) · hc]: pre [hc] (the weights that
/// collapse the streams into the site's input), post [hc] (how much of the site's output each
/// stream takes) and comb [hc][hc] (the Sinkhorn-normalised residual mix).
TROUPE_HD inline void hc_token_mixes(const float* m, const float* scale, const float* base,
                                     i64 hc, i64 sinkhorn_iters, float hc_eps, float* pre,
                                     float* post, float* comb) {
  for (i64 k = 0; k < hc; ++k) {
    pre[k] = sigmoid(m[k] * scale[0] + base[k]) + hc_eps;
    post[k] = 2.0f * sigmoid(m[hc + k] * scale[1] + base[hc + k]);
  }
  for (i64 i = 0; i < hc * hc; ++i) comb[i] = m[2 * hc + i] * scale[2] + base[2 * hc + i];
  sinkhorn(comb, hc, sinkhorn_iters, hc_eps);
}

/// Element d of token t's collapsed input: Σ_j pre[t][j] · streams[t][j][d], j ascending.
/// streams [T, hc, D], pre [T, hc].
TROUPE_HD inline float hc_collapse_at(const float* streams, const float* pre, i64 hc, i64 D,
                                      i64 t, i64 d) {
  float o = 0.0f;
  for (i64 j = 0; j < hc; ++j) o += pre[t * hc + j] * streams[(t * hc + j) * D + d];
  return o;
}

/// Element d of token t's stream k after a site with output x [T, D]:
/// post[t][k] · x[t][d] + Σ_j comb[t][j][k] · streams[t][j][d], j ascending, from the streams
/// before the site (so a kernel writes the new streams elsewhere, or per token after reading).
TROUPE_HD inline float hc_expand_at(const float* streams, const float* x, const float* post,
                                    const float* comb, i64 hc, i64 D, i64 t, i64 k, i64 d) {
  const float* cm = comb + t * hc * hc;
  float o = 0.0f;
  for (i64 j = 0; j < hc; ++j) o += cm[j * hc + k] * streams[(t * hc + j) * D + d];
  return post[t * hc + k] * x[t * D + d] + o;
}

/// Engram's gate of one stream h [D] by its key [D] (weighted per channel by wk [D]): the
/// scaled dot product of the two RMS-normalised vectors, through a signed square root and a
/// sigmoid. The stream then takes gate · value.
TROUPE_HD inline float engram_gate(const float* h, const float* key, const float* wk, i64 D,
                                   float eps) {
  float hh = 0.0f, kk = 0.0f, dot = 0.0f;
  for (i64 d = 0; d < D; ++d) {
    hh += h[d] * h[d];
    kk += key[d] * key[d];
    dot += h[d] * wk[d] * key[d];
  }
  const float inv_sqrt_d = 1.0f / sqrtf(static_cast<float>(D));
  const float rstd = (1.0f / sqrtf(hh / static_cast<float>(D) + eps)) *
                     (1.0f / sqrtf(kk / static_cast<float>(D) + eps));
  const float x = dot * rstd * inv_sqrt_d;
  return sigmoid(copysignf(sqrtf(max_of(fabsf(x), 1e-6f)), x));
}

/// The clamped SwiGLU of one element: silu(min(g, limit)) · clamp(u, ±limit) (no clamp when
/// limit ≤ 0), times `scale`. `scaled` false: no multiplication at all (not even by 1).
TROUPE_HD inline float swiglu(float g, float u, float limit, bool scaled, float scale) {
  if (limit > 0) {
    u = clamp_to(u, -limit, limit);
    g = min_of(g, limit);
  }
  const float v = silu(g) * u;
  return scaled ? scale * v : v;
}

/// Rotates pair i (channels 2i, 2i + 1) of a head's RoPE slice r by angle inv_freq · position
/// (inverse: by minus that angle), scaled by `scaling`: one complex multiplication.
TROUPE_HD inline void rope_pair(float* r, i64 i, float inv_freq, float position, float scaling,
                                bool inverse) {
  const float angle = inv_freq * position;
  const float c = cosf(angle) * scaling;
  const float s = (inverse ? -sinf(angle) : sinf(angle)) * scaling;
  const float even = r[2 * i], odd = r[2 * i + 1];
  r[2 * i] = even * c - odd * s;
  r[2 * i + 1] = even * s + odd * c;
}

/// The MoE gate's scoring function (config `scoring_func`).
enum class router_scoring : int { sqrtsoftplus, sigmoid, softmax };

/// MoE routing of one token (kernels/cpu_ops.hpp's route_token): the gate logits scores [n]
/// become the scoring function's values in place (logits / gate_temp first); the top k of
/// scores + bias are chosen in that order (the bias steers selection only; ties go to the lower
/// expert) into experts [k], and their weights [k] are the unbiased scores, normalised to sum 1
/// when norm_topk_prob (and k > 1), times routed_scaling. k ≤ n.
TROUPE_HD inline void route_token(float* scores, const float* bias, i64 n, i64 k,
                                  router_scoring f, float gate_temp, bool norm_topk_prob,
                                  float routed_scaling, i64* experts, float* weights) {
  for (i64 e = 0; e < n; ++e) scores[e] = scores[e] / gate_temp;
  if (f == router_scoring::sqrtsoftplus) {
    for (i64 e = 0; e < n; ++e) {
      const float x = scores[e];
      scores[e] = sqrtf(x > 20.0f ? x : log1pf(expf(x)));
    }
  } else if (f == router_scoring::sigmoid) {
    for (i64 e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
  } else {
    float mx = scores[0];
    for (i64 e = 1; e < n; ++e) mx = max_of(mx, scores[e]);
    float sum = 0.0f;
    for (i64 e = 0; e < n; ++e) sum += scores[e] = expf(scores[e] - mx);
    for (i64 e = 0; e < n; ++e) scores[e] /= sum;
  }
  // a before b: higher score + bias, then the lower index. The i-th choice is the first, in
  // that order, of the experts after the (i − 1)-th.
  auto before = [&](i64 a, i64 b) {
    const float sa = scores[a] + bias[a], sb = scores[b] + bias[b];
    return sa != sb ? sa > sb : a < b;
  };
  for (i64 i = 0; i < k; ++i) {
    i64 best = -1;
    for (i64 e = 0; e < n; ++e)
      if ((i == 0 || before(experts[i - 1], e)) && (best < 0 || before(e, best))) best = e;
    experts[i] = best;
  }
  float total = 0.0f;
  for (i64 i = 0; i < k; ++i) total += scores[experts[i]];
  for (i64 i = 0; i < k; ++i) {
    float w = scores[experts[i]];
    if (norm_topk_prob && k > 1) w = w / (total + 1e-20f);
    weights[i] = w * routed_scaling;
  }
}

/// Channel d of CSA2 compressor group g: the group's r token rows of kv [·, hd] pooled by a
/// softmax over their gate rows gate [·, hd] in that channel (rows g·r … g·r + r − 1).
TROUPE_HD inline float compress_pool_at(const float* kv, const float* gate, i64 r, i64 hd, i64 g,
                                        i64 d) {
  const float* kr = kv + g * r * hd + d;
  const float* gr = gate + g * r * hd + d;
  float mx = -INFINITY;
  for (i64 j = 0; j < r; ++j) mx = max_of(mx, gr[j * hd]);
  float sum = 0.0f;
  for (i64 j = 0; j < r; ++j) sum += expf(gr[j * hd] - mx);
  float acc = 0.0f;
  for (i64 j = 0; j < r; ++j) acc += kr[j * hd] * (expf(gr[j * hd] - mx) / sum);
  return acc;
}

/// A query's CSA2 indexer score of one compressed entry from its nh heads' dot products with
/// the entry's key (head h's at head_dot[h · stride]) and the query's head weights w [nh]:
/// Σ_h relu(dot_h) · sm_scale · (w_h · heads_scale), h ascending.
TROUPE_HD inline float index_score(const float* head_dot, i64 stride, const float* w, i64 nh,
                                   float sm_scale, float heads_scale) {
  float acc = 0.0f;
  for (i64 h = 0; h < nh; ++h)
    acc += max_of(head_dot[h * stride], 0.0f) * sm_scale * (w[h] * heads_scale);
  return acc;
}

// ---- The e4m3fn and e2m1 grids, and the reference's fake quantisers of its caches ----

TROUPE_HD inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}

TROUPE_HD inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

/// 2^k for -126 ≤ k ≤ 128 (2^128: infinity), as ldexpf(1, k), from the bits.
TROUPE_HD inline float pow2f(int k) {
  return bits_float(static_cast<std::uint32_t>(k + 127) << 23);
}

/// The value of e4m3fn magnitude code c in [0, 126] (the codes increase with their values):
/// mant · 2^-9 when the exponent field is 0, else 1.mant · 2^(exp − 7), built from the bits.
struct e4m3_grid {
  static constexpr int codes = 127;
  TROUPE_HD float operator()(int c) const {
    const int exp = (c >> 3) & 0xf, mant = c & 7;
    return exp == 0 ? static_cast<float>(mant) * 0x1p-9f
                    : bits_float(static_cast<std::uint32_t>((exp + 120) << 23 | mant << 20));
  }
};

/// The value of e2m1 magnitude code c in [0, 7]: 0, .5, 1, 1.5, 2, 3, 4, 6.
struct e2m1_grid {
  static constexpr int codes = 8;
  TROUPE_HD float operator()(int c) const {
    const int exp = c >> 1, mant = c & 1;
    return exp == 0 ? 0.5f * static_cast<float>(mant)
                    : bits_float(static_cast<std::uint32_t>((exp + 126) << 23 | mant << 22));
  }
};

/// The grid's code nearest to a ≥ 0 (above the grid: its largest), ties to the even code; the
/// first code not below a is found as std::lower_bound finds it.
template <class Grid>
TROUPE_HD inline int nearest_code(float a, Grid grid) {
  int first = 0, count = Grid::codes;
  while (count > 0) {
    const int step = count / 2;
    if (grid(first + step) < a) {
      first += step + 1;
      count -= step + 1;
    } else {
      count = step;
    }
  }
  if (first == Grid::codes) return Grid::codes - 1;
  if (first == 0) return 0;
  const float dlo = a - grid(first - 1), dhi = grid(first) - a;
  if (dlo < dhi) return first - 1;
  if (dhi < dlo) return first;
  return (first - 1) % 2 == 0 ? first - 1 : first;
}

/// The value of a ue8m0 scale byte b < 255: 2^(b − 127) (b = 0: the subnormal 2^-127).
TROUPE_HD inline float e8m0_value(std::uint8_t b) {
  return b == 0 ? bits_float(0x00400000u) : pow2f(static_cast<int>(b) - 127);
}

/// Element (i, j) of an FP8 (e4m3fn) weight with ue8m0 block scales [⌈rows / br⌉, ⌈cols / bc⌉],
/// dequantized (codes 0x7f / 0xff, NaN in e4m3fn, are not expected in a checkpoint).
TROUPE_HD inline float fp8_block_weight(const std::uint8_t* w, const std::uint8_t* scales, i64 cols,
                                        i64 br, i64 bc, i64 i, i64 j) {
  const std::uint8_t code = w[i * cols + j];
  const float m = e4m3_grid{}(code & 0x7f);
  const i64 scale_cols = (cols + bc - 1) / bc;
  return ((code & 0x80) != 0 ? -m : m) * e8m0_value(scales[(i / br) * scale_cols + j / bc]);
}

/// Element (i, j) of a packed FP4 (e2m1) weight [rows, cols / 2 bytes] (element k's nibble: the
/// low one of byte k / 2 when k is even) with ue8m0 scales [rows, cols / block], dequantized.
TROUPE_HD inline float fp4_packed_weight(const std::uint8_t* packed, const std::uint8_t* scales,
                                         i64 cols, i64 block, i64 i, i64 j) {
  const i64 k = i * cols + j;
  const std::uint8_t nibble = (k % 2) != 0 ? packed[k / 2] >> 4 : packed[k / 2] & 0xf;
  const float m = e2m1_grid{}(nibble & 0x7);
  return ((nibble & 0x8) != 0 ? -m : m) * e8m0_value(scales[i * (cols / block) + j / block]);
}

/// Nearest e4m3fn code to x (saturating at 448), ties to the even code; the sign in bit 7.
TROUPE_HD inline std::uint8_t fp8_e4m3_code(float x) {
  const int code = nearest_code(min_of(fabsf(x), 448.0f), e4m3_grid{});
  return static_cast<std::uint8_t>((float_bits(x) >> 31) != 0 ? code | 0x80 : code);
}

/// Nearest e2m1 code to x (saturating at 6), ties to the even code; the sign in bit 3.
TROUPE_HD inline std::uint8_t fp4_e2m1_code(float x) {
  const int code = nearest_code(min_of(fabsf(x), 6.0f), e2m1_grid{});
  return static_cast<std::uint8_t>((float_bits(x) >> 31) != 0 ? code | 0x8 : code);
}

/// x rounded onto the e4m3fn grid (its code's value).
TROUPE_HD inline float round_to_e4m3(float x) {
  const std::uint8_t c = fp8_e4m3_code(x);
  const float m = e4m3_grid{}(c & 0x7f);
  return (c & 0x80) != 0 ? -m : m;
}

/// q rounded onto the e2m1 grid (its code's value).
TROUPE_HD inline float round_to_e2m1(float q) {
  const std::uint8_t c = fp4_e2m1_code(q);
  const float m = e2m1_grid{}(c & 0x7);
  return (c & 0x8) != 0 ? -m : m;
}

/// k = ceil(log2(t)) for a positive normal t, as the reference computes it from the bits.
TROUPE_HD inline int pow2_ceil_exponent(float t) {
  const std::uint32_t bits = float_bits(t);
  const int exponent = static_cast<int>((bits >> 23) & 0xff);
  return exponent - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
}

/// The reference's window-KV quantiser on one block of n values (32 in the model), in place: a
/// power-of-two scale ≥ amax / 448, values rounded onto e4m3.
TROUPE_HD inline void quant_fp8_block(float* x, i64 n) {
  float amax = 0.0f;
  for (i64 i = 0; i < n; ++i) amax = max_of(amax, fabsf(x[i]));
  amax = max_of(amax, 1e-4f);
  const float scale = pow2f(pow2_ceil_exponent(amax * (1.0f / 448.0f)));
  for (i64 i = 0; i < n; ++i) x[i] = round_to_e4m3(clamp_to(x[i] / scale, -448.0f, 448.0f)) * scale;
}

/// The FP4 (e2m1) quantiser on one block of n values, in place: a scale, power-of-two (ue8m0)
/// from amax / 6 or, with e4m3_scales, amax / 6 rounded onto e4m3, and values onto e2m1.
TROUPE_HD inline void quant_fp4_block(float* x, i64 n, bool e4m3_scales) {
  float amax = 0.0f;
  for (i64 i = 0; i < n; ++i) amax = max_of(amax, fabsf(x[i]));
  const float scale =
      e4m3_scales ? round_to_e4m3(max_of(amax, 6.0f * 0x1p-9f) / 6.0f)
                  : pow2f(pow2_ceil_exponent(max_of(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f)));
  for (i64 i = 0; i < n; ++i) x[i] = round_to_e2m1(clamp_to(x[i] / scale, -6.0f, 6.0f)) * scale;
}

}  // namespace troupe::kernels::portable
