// gemm_nt_invariant (cpu_ops.hpp): a batch-invariant y = x · wᵀ.
//
// Each output element is one dot product over `in`, always computed the same way: eight lane
// sums over k ≡ 0..7 (mod 8) in increasing k, the lanes added in a fixed tree
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the `in` mod 8 trailing products in
// increasing k. Tiles of several weight rows × several x rows only change how many of these
// independent dot products run side by side (to read each weight row once per group of x
// rows), never the operations of one of them. This file is compiled with -ffp-contract=off so
// that the generic path never fuses a multiply and an add in one place and not in another.
#include <cmath>

#include "kernels/cpu_ops.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace troupe::kernels {

namespace {

using i64 = std::int64_t;

// The generic path: one dot product at a time.
float dot_generic(const float* x, const float* w, i64 n) {
  float lane[8] = {};
  i64 k = 0;
  for (; k + 8 <= n; k += 8)
    for (int l = 0; l < 8; ++l) lane[l] = lane[l] + x[k + l] * w[k + l];
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (; k < n; ++k) s = s + x[k] * w[k];
  return s;
}

void gemm_generic(const float* x, i64 rows, i64 in, i64 ldx, const float* w, i64 c0, i64 c1,
                  float* y, i64 ldy) {
  for (i64 c = c0; c < c1; ++c)
    for (i64 r = 0; r < rows; ++r) y[r * ldy + c] = dot_generic(x + r * ldx, w + c * in, in);
}

#if defined(__x86_64__)

__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  const __m128 s4 = _mm_add_ps(lo, hi);                      // l0+l4, l1+l5, l2+l6, l3+l7
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));   // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// y[r][c] for RW weight rows (columns c0..c0+RW) × RX rows of x.
template <int RW, int RX>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, i64 ldx, const float* w,
                                                   i64 in, float* y, i64 ldy) {
  __m256 acc[RW][RX];
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b) acc[a][b] = _mm256_setzero_ps();
  i64 k = 0;
  for (; k + 8 <= in; k += 8) {
    __m256 xv[RX];
    for (int b = 0; b < RX; ++b) xv[b] = _mm256_loadu_ps(x + b * ldx + k);
    for (int a = 0; a < RW; ++a) {
      const __m256 wv = _mm256_loadu_ps(w + a * in + k);
      for (int b = 0; b < RX; ++b) acc[a][b] = _mm256_fmadd_ps(xv[b], wv, acc[a][b]);
    }
  }
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b) {
      float s = hsum_avx2(acc[a][b]);
      const float* xr = x + b * ldx;
      const float* wr = w + a * in;
      for (i64 t = k; t < in; ++t) s = std::fma(xr[t], wr[t], s);
      y[b * ldy + a] = s;
    }
}

template <int RW>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, i64 rows, i64 in, i64 ldx,
                                                   const float* w, float* y, i64 ldy) {
  i64 r = 0;
  for (; r + 2 <= rows; r += 2) tile_avx2<RW, 2>(x + r * ldx, ldx, w, in, y + r * ldy, ldy);
  if (r < rows) tile_avx2<RW, 1>(x + r * ldx, ldx, w, in, y + r * ldy, ldy);
}

__attribute__((target("avx2,fma"))) void gemm_avx2(const float* x, i64 rows, i64 in, i64 ldx,
                                                   const float* w, i64 c0, i64 c1, float* y,
                                                   i64 ldy) {
  i64 c = c0;
  for (; c + 4 <= c1; c += 4) rows_avx2<4>(x, rows, in, ldx, w + c * in, y + c, ldy);
  for (; c < c1; ++c) rows_avx2<1>(x, rows, in, ldx, w + c * in, y + c, ldy);
}

#endif

}  // namespace

gemm_isa best_gemm_isa() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2) return gemm_isa::avx2;
#endif
  return gemm_isa::generic;
}

void gemm_nt_invariant(const float* x, i64 rows, i64 in, i64 ldx, const float* w, i64 col_begin,
                       i64 col_end, float* y, i64 ldy, gemm_isa isa) {
  if (rows <= 0 || col_end <= col_begin) return;
#if defined(__x86_64__)
  if (isa == gemm_isa::avx2 && best_gemm_isa() == gemm_isa::avx2)
    return gemm_avx2(x, rows, in, ldx, w, col_begin, col_end, y, ldy);
#endif
  gemm_generic(x, rows, in, ldx, w, col_begin, col_end, y, ldy);
}

}  // namespace troupe::kernels
