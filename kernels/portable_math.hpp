// The per-token and per-element math of the DeepSeek-V4.1 forward pass that both engines run:
// the CPU engine (kernels/model.cpp) calls these functions in its loops, the CUDA engine's
// kernels (kernels/cuda/) call them once per thread. One definition, so the two engines
// compute the same sequence of operations on every element, and what the CPU tests check of
// these functions holds for the device kernels' arithmetic too. What differs on the device is
// the library behind expf (a few ulps from glibc's) and FMA contraction, which the device
// build of these functions turns off (kernels/cuda/CMakeLists.txt: -fmad=false).
//
// Everything here is header-only, fp32, on plain pointers, with no allocation and no standard
// library call a kernel cannot make: comparisons are written out as std::max / std::min /
// std::clamp define them, so that the CPU results stay bitwise what they were.
#pragma once

#include <cmath>
#include <cstdint>

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

}  // namespace troupe::kernels::portable
